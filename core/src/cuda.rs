//! GPU support (feature `cuda`): occl's element types and operators as `occl-kernels` knows
//! them. The device collectives are built on this.

pub use occl_kernels as kernels;

use crate::dtype::{DataType, RedOp};

/// The kernels' element type for `dt`.
pub fn kernel_dtype(dt: DataType) -> kernels::Dtype {
    use kernels::Dtype as K;
    match dt {
        DataType::I8 => K::I8,
        DataType::U8 => K::U8,
        DataType::I32 => K::I32,
        DataType::U32 => K::U32,
        DataType::I64 => K::I64,
        DataType::U64 => K::U64,
        DataType::F16 => K::F16,
        DataType::F32 => K::F32,
        DataType::F64 => K::F64,
        DataType::Bf16 => K::Bf16,
        DataType::F8E4M3 => K::F8E4M3,
        DataType::F8E5M2 => K::F8E5M2,
    }
}

/// The reduction `op` performs at every step; the average is a sum whose last step divides by
/// nranks (`kernels::Reduce::avg_postdiv`), as occl's host path does.
pub fn kernel_op(op: RedOp) -> kernels::RedOp {
    match op {
        RedOp::Sum | RedOp::Avg => kernels::RedOp::Sum,
        RedOp::Prod => kernels::RedOp::Prod,
        RedOp::Max => kernels::RedOp::Max,
        RedOp::Min => kernels::RedOp::Min,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_type_maps_to_the_kernel_type_of_its_size_and_kind() {
        for dt in DataType::ALL {
            let k = kernel_dtype(dt);
            assert_eq!(k.size(), dt.size(), "{dt}");
            assert_eq!(k.is_float(), dt.is_float(), "{dt}");
        }
        let seen: std::collections::HashSet<_> = DataType::ALL.iter().map(|&d| kernel_dtype(d)).collect();
        assert_eq!(seen.len(), kernels::Dtype::ALL.len(), "one to one");
    }

    #[test]
    fn the_average_reduces_as_a_sum() {
        assert_eq!(kernel_op(RedOp::Avg), kernels::RedOp::Sum);
        for op in [RedOp::Sum, RedOp::Prod, RedOp::Max, RedOp::Min] {
            assert_eq!(kernel_op(op).name(), op.name());
        }
    }
}
