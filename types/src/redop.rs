//! Reduction operators.

use std::fmt;
use std::str::FromStr;

/// A reduction operator, numbered as NCCL's `ncclRedOp_t`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum RedOp {
    Sum = 0,
    Prod = 1,
    Max = 2,
    Min = 3,
    Avg = 4,
}

impl RedOp {
    /// Every operator, in numeric order (index `i` holds the operator numbered `i`).
    pub const ALL: [RedOp; 5] = [RedOp::Sum, RedOp::Prod, RedOp::Max, RedOp::Min, RedOp::Avg];

    pub const fn name(self) -> &'static str {
        match self {
            RedOp::Sum => "sum",
            RedOp::Prod => "prod",
            RedOp::Max => "max",
            RedOp::Min => "min",
            RedOp::Avg => "avg",
        }
    }

    /// The operator numbered `v` in `ncclRedOp_t` (the built-in ones; NCCL's user-created
    /// operators are numbered above them).
    pub fn from_u8(v: u8) -> Option<RedOp> {
        RedOp::ALL.get(usize::from(v)).copied()
    }
}

impl fmt::Display for RedOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for RedOp {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s.to_ascii_lowercase().as_str() {
            "sum" => RedOp::Sum,
            "prod" => RedOp::Prod,
            "max" => RedOp::Max,
            "min" => RedOp::Min,
            "avg" => RedOp::Avg,
            _ => return Err(format!("unknown reduction '{s}'; expected one of sum prod max min avg")),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::RedOp;

    #[test]
    fn numbers_are_nccl_redop_t_and_every_name_parses_back() {
        for (i, op) in RedOp::ALL.iter().enumerate() {
            assert_eq!(*op as usize, i);
            assert_eq!(RedOp::from_u8(i as u8), Some(*op));
            assert_eq!(op.name().parse::<RedOp>(), Ok(*op));
        }
        assert_eq!(RedOp::from_u8(5), None);
        assert!("xor".parse::<RedOp>().is_err());
    }
}
