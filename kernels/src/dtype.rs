//! Element types and reduction operators, as the kernels know them: the element type is occl's
//! vocabulary type (its `short_name` is the suffix of a kernel's name); the operator is a binary
//! one, onto which `occl` maps its own `RedOp` (this crate never depends on `occl`).

use std::fmt;

pub use occl_types::DataType;

/// A binary reduction operator. The average is not one: it is a sum finished by a division by
/// nranks or started by a premultiplication by 1/nranks (see [`crate::Reduce`]), as NCCL does it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RedOp {
    Sum,
    Prod,
    Max,
    Min,
}

impl RedOp {
    pub const ALL: [RedOp; 4] = [RedOp::Sum, RedOp::Prod, RedOp::Max, RedOp::Min];

    pub const fn name(self) -> &'static str {
        match self {
            RedOp::Sum => "sum",
            RedOp::Prod => "prod",
            RedOp::Max => "max",
            RedOp::Min => "min",
        }
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
