//! GPU support (feature `cuda`): collectives on device buffers between the GPUs of one host,
//! one process (or thread) per GPU, through the `cuda-p2p` transport: CUDA IPC regions that
//! every rank maps, written over NVLink (or PCIe) with system-scope flags. Every operation is
//! stream-ordered: it enqueues one kernel on the caller's stream and returns, so it can be
//! captured in a CUDA graph (the sequence numbers live on the device).
//!
//! Profiler events follow NCCL's model of a GPU collective: the host events (GroupApi, CollApi or
//! P2pApi, Group, Coll or P2p, KernelLaunch) at enqueue, and, when a sink wants KernelCh, one
//! KernelCh per thread block with the kernel's own `%globaltimer` start and stop mapped to the
//! host clock, reported once the kernel has run (`events.rs`; not for launches a graph captures).
//!
//! ```no_run
//! # fn main() -> occl::Result<()> {
//! use occl::cuda::{kernels::cudarc::driver::CudaContext, CudaComm};
//! let comm = occl::Comm::from_env()?;
//! let dev = comm.rank(); // one GPU per rank on this host
//! let cc = CudaComm::new(comm, dev)?;
//! let stream = cc.context().default_stream();
//! # let _ = stream; Ok(()) }
//! ```

pub use occl_kernels as kernels;

mod budget;
mod ce;
mod comm;
mod events;
mod group;
mod names;
mod ops;
mod phases;
mod staged;
mod stall;
pub(crate) mod tune;
mod watch;
mod windows;

pub use budget::{CtaBudget, CtaPolicy, Launch, EFFICIENT_SMS};
pub use ce::{CeGeometry, CeSends, MAX_AREA_BYTES as CE_MAX_AREA_BYTES};
pub use comm::{CudaComm, DeviceSettings};
pub use group::P2p;
pub use kernels::coll::PreMul;
pub use kernels::timer::ClockMap;
pub use phases::VAR as KERNEL_PHASES_VAR;
pub use tune::DevAlgo;
pub use windows::WindowId;

use crate::dtype::RedOp;
use crate::error::Error;

/// What a device reduction computes: one of occl's operators, or a pre-multiply sum (NCCL's
/// `ncclRedOpCreatePreMulSum`: each rank's input times that rank's scalar, then summed). The
/// kernel applies the scalar as it reads the input, so the operation makes no extra pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DevOp {
    Op(RedOp),
    PreMulSum(PreMul),
}

impl From<RedOp> for DevOp {
    fn from(op: RedOp) -> DevOp {
        DevOp::Op(op)
    }
}

impl DevOp {
    /// The operator a host collective runs once the input is pre-multiplied.
    pub(crate) fn host_op(self) -> RedOp {
        match self {
            DevOp::Op(op) => op,
            DevOp::PreMulSum(_) => RedOp::Sum,
        }
    }

    pub(crate) fn premul(self) -> Option<PreMul> {
        match self {
            DevOp::Op(_) => None,
            DevOp::PreMulSum(p) => Some(p),
        }
    }
}

/// A kernel-crate error as occl's: bad arguments stay arguments, the rest are system errors
/// that name the CUDA call.
pub(crate) fn err(context: &'static str) -> impl FnOnce(kernels::Error) -> Error {
    move |e| match e {
        kernels::Error::InvalidArgument(m) => Error::arg(format!("{context}: {m}")),
        e => Error::sys(context, std::io::Error::other(e.to_string())),
    }
}

/// A size in bytes from a variable: `123`, `256K`, `4M`, `1G` (binary).
pub(crate) fn parse_size(v: &str) -> Option<u64> {
    let v = v.trim();
    let (num, shift) = match v.chars().last()?.to_ascii_uppercase() {
        'K' => (&v[..v.len() - 1], 10),
        'M' => (&v[..v.len() - 1], 20),
        'G' => (&v[..v.len() - 1], 30),
        _ => (v, 0),
    };
    num.parse::<u64>().ok()?.checked_mul(1 << shift)
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
    fn a_pre_multiply_sum_is_a_sum_with_a_scalar() {
        let p = DevOp::PreMulSum(PreMul::Device(0x100));
        assert_eq!((p.host_op(), p.premul()), (RedOp::Sum, Some(PreMul::Device(0x100))));
        let m = DevOp::from(RedOp::Max);
        assert_eq!((m.host_op(), m.premul()), (RedOp::Max, None));
    }

    #[test]
    fn the_average_reduces_as_a_sum() {
        assert_eq!(kernel_op(RedOp::Avg), kernels::RedOp::Sum);
        for op in [RedOp::Sum, RedOp::Prod, RedOp::Max, RedOp::Min] {
            assert_eq!(kernel_op(op).name(), op.name());
        }
    }
}
