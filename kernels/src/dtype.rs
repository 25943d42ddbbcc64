//! Element types and reduction operators, as the kernels know them: the element type is occl's
//! vocabulary type (its `short_name` is the suffix of a kernel's name); the operator is a binary
//! one, onto which `occl` maps its own `RedOp` (this crate never depends on `occl`).

use std::fmt;

pub use occl_types::DataType;

/// A binary reduction operator, numbered as the same operator in `ncclRedOp_t`. The average is not
/// one: it is a sum finished by a division by nranks or started by a premultiplication by
/// 1/nranks (see [`crate::Reduce`]), as NCCL does it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum RedOp {
    Sum = 0,
    Prod = 1,
    Max = 2,
    Min = 3,
}

impl RedOp {
    pub const ALL: [RedOp; 4] = [RedOp::Sum, RedOp::Prod, RedOp::Max, RedOp::Min];

    /// The vocabulary operator of the same number.
    pub const fn vocabulary(self) -> occl_types::RedOp {
        occl_types::RedOp::ALL[self as usize]
    }

    /// The vocabulary's name (`sum`, `prod`, `max`, `min`): the suffix of a kernel's name.
    pub const fn name(self) -> &'static str {
        self.vocabulary().name()
    }

    pub(crate) fn index(self) -> usize {
        self as usize
    }
}

impl fmt::Display for RedOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::RedOp;

    #[test]
    fn every_operator_is_the_vocabulary_operator_of_its_number() {
        for op in RedOp::ALL {
            assert_eq!(op.vocabulary() as usize, op.index());
            assert_eq!(format!("{op:?}"), format!("{:?}", op.vocabulary()));
        }
    }
}
