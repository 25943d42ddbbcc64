//! Where a call runs (`Path`), and the device collectives a group holds until its end: run
//! there in call order (`run`), or dropped and priced by `ncclGroupSimulateEnd` (`discard`),
//! which must launch nothing.

use crate::abi::*;
use crate::error::Result;
use crate::gpu::{self, DevComm};
use crate::handle::NcclComm;
use occl::cuda::kernels::cudarc::driver::CudaStream;
use occl::cuda::DevOp;
use occl::{CollType, Comm};
use std::sync::Arc;

/// Where a call runs.
pub(crate) enum Path<'a> {
    Host(&'a Comm),
    /// The device communicator, the caller's stream and its address (for collected p2p), and a
    /// reduction's operator, resolved when the call was made.
    Device(&'a DevComm, Arc<CudaStream>, usize, Option<DevOp>),
}

/// A device collective as `ncclGroupSimulateEnd` prices it (its type and NCCL's count), with
/// the operator of a reduction.
#[derive(Clone, Copy)]
pub(crate) struct Cost {
    pub coll: CollType,
    pub count: usize,
    pub datatype: ncclDataType_t,
    pub op: Option<ncclRedOp_t>,
}

pub(crate) fn cost(coll: CollType, count: usize, datatype: ncclDataType_t) -> Option<Cost> {
    Some(Cost { coll, count, datatype, op: None })
}

pub(crate) fn reducing(coll: CollType, count: usize, datatype: ncclDataType_t, op: ncclRedOp_t) -> Option<Cost> {
    Some(Cost { coll, count, datatype, op: Some(op) })
}

/// A device collective called inside a group: run at the outermost `ncclGroupEnd`, in call
/// order, or dropped and priced by `ncclGroupSimulateEnd`, which must launch nothing.
pub(crate) struct Deferred {
    pub name: &'static str,
    pub comm: Arc<NcclComm>,
    pub stream: Arc<CudaStream>,
    pub stream_addr: usize,
    pub op: Option<DevOp>,
    pub cost: Cost,
    pub run: DeviceCall,
}

/// A collective's body, run on its device path.
pub(crate) type DeviceCall = Box<dyn FnOnce(&Arc<NcclComm>, Path<'_>) -> Result<()>>;

thread_local! {
    static DEFERRED: std::cell::RefCell<Vec<Deferred>> = const { std::cell::RefCell::new(Vec::new()) };
}

pub(crate) fn defer(d: Deferred) {
    DEFERRED.with(|q| q.borrow_mut().push(d));
}

fn take_deferred() -> Vec<Deferred> {
    DEFERRED.with(|q| std::mem::take(&mut *q.borrow_mut()))
}

/// Runs the group's device collectives in call order; each runs even when an earlier one
/// failed (its peers wait for it), and the first error is returned.
pub(crate) fn run() -> Result<()> {
    let calls = take_deferred();
    if calls.is_empty() {
        return Ok(());
    }
    let _restore = gpu::Restore::new();
    let mut first = Ok(());
    for d in calls {
        let r = match d.comm.device() {
            Ok(Some(dev)) => (d.run)(&d.comm, Path::Device(dev, d.stream, d.stream_addr, d.op)),
            Ok(None) => Err(crate::error::internal("a device collective on a host communicator")),
            Err(e) => Err(e),
        };
        if let Err(e) = r {
            d.comm.note(d.name, &e);
            if first.is_ok() {
                first = Err(e);
            }
        }
    }
    first
}

/// Drops the group's device collectives (a group that failed, or a simulated one) and returns
/// their predicted µs.
pub(crate) fn discard() -> Result<f64> {
    let mut us = 0.0;
    for d in take_deferred() {
        if let Some(dev) = d.comm.device()? {
            us += dev.cc.predicted_us(d.cost.coll, d.cost.count, dtype(d.cost.datatype)?)?;
        }
    }
    Ok(us)
}
