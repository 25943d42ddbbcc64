//! Element types and reduction operators, as the kernels know them. `occl` maps its own
//! `DataType`/`RedOp` onto these (this crate never depends on `occl`).

use std::fmt;

/// An element type; `name()` is the suffix of its kernels' names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Dtype {
    I8,
    U8,
    I32,
    U32,
    I64,
    U64,
    F16,
    Bf16,
    F32,
    F64,
    F8E4M3,
    F8E5M2,
}

impl Dtype {
    pub const ALL: [Dtype; 12] = [
        Dtype::I8,
        Dtype::U8,
        Dtype::I32,
        Dtype::U32,
        Dtype::I64,
        Dtype::U64,
        Dtype::F16,
        Dtype::Bf16,
        Dtype::F32,
        Dtype::F64,
        Dtype::F8E4M3,
        Dtype::F8E5M2,
    ];

    /// Bytes per element (a power of two).
    pub const fn size(self) -> usize {
        match self {
            Dtype::I8 | Dtype::U8 | Dtype::F8E4M3 | Dtype::F8E5M2 => 1,
            Dtype::F16 | Dtype::Bf16 => 2,
            Dtype::I32 | Dtype::U32 | Dtype::F32 => 4,
            Dtype::I64 | Dtype::U64 | Dtype::F64 => 8,
        }
    }

    pub const fn is_float(self) -> bool {
        matches!(self, Dtype::F16 | Dtype::Bf16 | Dtype::F32 | Dtype::F64 | Dtype::F8E4M3 | Dtype::F8E5M2)
    }

    /// The fp8 formats need the hardware conversions of sm_89 and later.
    pub const fn is_fp8(self) -> bool {
        matches!(self, Dtype::F8E4M3 | Dtype::F8E5M2)
    }

    pub const fn name(self) -> &'static str {
        match self {
            Dtype::I8 => "i8",
            Dtype::U8 => "u8",
            Dtype::I32 => "i32",
            Dtype::U32 => "u32",
            Dtype::I64 => "i64",
            Dtype::U64 => "u64",
            Dtype::F16 => "f16",
            Dtype::Bf16 => "bf16",
            Dtype::F32 => "f32",
            Dtype::F64 => "f64",
            Dtype::F8E4M3 => "f8e4m3",
            Dtype::F8E5M2 => "f8e5m2",
        }
    }

    pub(crate) fn index(self) -> usize {
        self as usize
    }
}

impl fmt::Display for Dtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

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
