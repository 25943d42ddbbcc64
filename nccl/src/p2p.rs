//! Device send/recv of a group, run together at its end.
//!
//! A rank that sends to r+1 and receives from r-1 in one group (PyTorch's `batch_isend_irecv`,
//! an all-to-all of grouped p2p, nccl-tests' sendrecv) must progress both at once: a receive
//! queued behind a send that waits for the peer's receive, itself queued behind the peer's own
//! send, never runs. So the p2p calls of a group are collected on this thread and run at
//! `ncclGroupEnd` (a call outside a group is a group of one): each communicator's calls as one
//! kernel launch on its stream (`CudaComm::p2p_group_raw`: channels split between the
//! sends and receives), with no host thread involved, so thread ranks and graphs work alike.
//!
//! Communicators that occl stages through host memory (a peer on another host) run theirs
//! staged instead: each communicator's stream copies its sends to its pinned buffer, one host
//! function (`cuLaunchHostFunc`) on the first communicator's stream runs every send and receive
//! of the group as one group of occl's host send/recv, and each stream copies its receives
//! back. One host function per group, not per communicator, because the driver may run host
//! functions of different streams on one thread: two of them waiting for each other (ranks of
//! one process) would never finish. Every step is stream-ordered and captured by a graph.

use crate::error::{internal, sys, usage, Result};
use crate::gpu::{self, DevComm};
use crate::handle::NcclComm;
use occl::cuda::kernels::cudarc::driver::CudaStream;
use occl::cuda::kernels::staging;
use occl::cuda::P2p;
use occl::{DataType, Error};
use std::cell::RefCell;
use std::ffi::c_void;
use std::sync::Arc;

/// One device send or receive of the open group.
#[derive(Clone)]
pub(crate) struct Op {
    pub comm: Arc<NcclComm>,
    /// The caller's stream (address; 0: the legacy default stream).
    pub stream: usize,
    pub send: bool,
    pub dev: u64,
    pub count: usize,
    pub dt: DataType,
    pub peer: usize,
}

thread_local! {
    static PENDING: RefCell<Vec<Op>> = const { RefCell::new(Vec::new()) };
}

pub(crate) fn push(op: Op) {
    PENDING.with(|p| p.borrow_mut().push(op));
}

/// Drops the collected calls (a group that failed before running them).
pub(crate) fn discard() {
    PENDING.with(|p| p.borrow_mut().clear());
}

/// Drops the collected calls of a simulated group and returns their predicted µs.
pub(crate) fn simulate() -> Result<f64> {
    let ops = PENDING.with(|p| std::mem::take(&mut *p.borrow_mut()));
    let mut us = 0.0;
    for o in &ops {
        if let Some(d) = o.comm.device()? {
            let coll = if o.send { occl::CollType::Send } else { occl::CollType::Recv };
            us += d.cc.predicted_us(coll, o.count, o.dt)?;
        }
    }
    Ok(us)
}

/// A send or receive as the host function runs it, on pinned memory.
struct HostOp {
    /// Alive until the host function has run: `ncclCommDestroy`/`Abort` synchronise the device
    /// first. Not an `Arc`: the last reference must not drop (and free CUDA resources) inside a
    /// host function, which may make no CUDA call.
    comm: *const NcclComm,
    send: bool,
    host: *mut u8,
    count: usize,
    dt: DataType,
    peer: usize,
}

struct Batch {
    ops: Vec<HostOp>,
    /// Freed by its one run; a captured batch runs once per replay and lives with the
    /// communicator.
    once: bool,
}

// SAFETY: the pointers are pinned buffers and communicators that outlive the batch (see HostOp).
unsafe impl Send for Batch {}

impl Batch {
    fn run(&self) -> Result<()> {
        occl::group_start();
        let issued = self.ops.iter().try_for_each(|o| {
            // SAFETY: the communicator outlives the batch (see HostOp); the host pointers are
            // its pinned buffer, sized for this call when it was enqueued.
            let c = unsafe { &*o.comm }.comm()?;
            unsafe {
                if o.send {
                    c.send_raw(o.host, o.count, o.dt, o.peer)
                } else {
                    c.recv_raw(o.host, o.count, o.dt, o.peer)
                }
            }
        });
        let ran = occl::group_end();
        issued.and(ran)
    }
}

/// The host function: runs the batch; a failure becomes every communicator's asynchronous
/// error (its device results are not to be trusted).
unsafe extern "C" fn run_batch(data: *mut c_void) {
    // SAFETY: a Batch that `flush` leaked for this run (or keeps for replays).
    let b = unsafe { &*(data as *const Batch) };
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| b.run()))
        .unwrap_or_else(|_| Err(internal("a staged device send/recv panicked")));
    if let Err(e) = r {
        tracing::error!("occl-nccl: staged device send/recv failed: {e}");
        for o in &b.ops {
            // SAFETY: as in run.
            unsafe { &*o.comm }.fail("ncclSend/ncclRecv (staged on the device)", &e);
        }
    }
    if b.once {
        // SAFETY: leaked by `flush` for exactly this one run.
        drop(unsafe { Box::from_raw(data as *mut Batch) });
    }
}

fn kernel_err(what: &'static str) -> impl Fn(occl::cuda::kernels::Error) -> Error {
    move |e| sys(what, e)
}

/// One communicator's part of the batch.
struct Part<'a> {
    nc: Arc<NcclComm>,
    stream: usize,
    ops: Vec<&'a Op>,
}

/// The group's calls per communicator, in call order; each communicator's on one stream.
fn by_comm(ops: &[Op]) -> Result<Vec<Part<'_>>> {
    let mut parts: Vec<Part<'_>> = Vec::new();
    for op in ops {
        match parts.iter_mut().find(|p| Arc::ptr_eq(&p.nc, &op.comm)) {
            Some(p) if p.stream != op.stream => {
                return Err(usage(
                    "the device sends and receives of one communicator in a group are on different streams; occl \
                     runs a group's p2p per communicator on one stream: pass the same stream",
                ))
            }
            Some(p) => p.ops.push(op),
            None => parts.push(Part { nc: op.comm.clone(), stream: op.stream, ops: vec![op] }),
        }
    }
    Ok(parts)
}

/// Runs the collected device sends and receives: each communicator's in one kernel launch on
/// its stream (occl's grouped p2p over the cuda-p2p regions), except on a communicator that
/// occl stages through host memory (a peer on another host), whose calls run staged (see the
/// module's comment).
pub(crate) fn flush() -> Result<()> {
    let ops = PENDING.with(|p| std::mem::take(&mut *p.borrow_mut()));
    if ops.is_empty() {
        return Ok(());
    }
    let parts = by_comm(&ops)?;
    let _restore = gpu::Restore::new();
    let mut staged = Vec::new();
    for p in &parts {
        let d = p.nc.device()?.ok_or_else(|| internal("a device p2p call on a host communicator"))?;
        if d.cc.is_staged() {
            staged.extend(p.ops.iter().map(|&o| o.clone()));
            continue;
        }
        // SAFETY: the caller's stream, checked when the call was collected.
        let s = unsafe { gpu::stream(d.cc.context(), p.stream as *mut c_void, "ncclSend/ncclRecv")? };
        let calls: Vec<P2p> =
            p.ops.iter().map(|o| P2p { send: o.send, peer: o.peer, buf: o.dev, count: o.count, dt: o.dt }).collect();
        // SAFETY: the caller's buffers of `count` elements, live until the stream has run them.
        unsafe { d.cc.p2p_group_raw(&s, &calls) }?;
    }
    drop(parts);
    if staged.is_empty() {
        return Ok(());
    }
    flush_staged(&staged)
}

/// Runs device sends and receives of staged communicators through pinned host memory.
fn flush_staged(ops: &[Op]) -> Result<()> {
    let parts = by_comm(ops)?;
    let mut streams: Vec<(Arc<CudaStream>, &DevComm)> = Vec::new();
    let mut host = Vec::new();
    let mut capture = false;
    for p in &parts {
        let d = p.nc.device()?.ok_or_else(|| internal("a device p2p call on a host communicator"))?;
        // SAFETY: the caller's stream, checked when the call was collected.
        let s = unsafe { gpu::stream(d.cc.context(), p.stream as *mut c_void, "ncclSend/ncclRecv")? };
        let capturing = staging::capturing(&s).map_err(kernel_err("query the stream's capture"))?;
        capture |= capturing;
        let mut at = Vec::with_capacity(p.ops.len());
        let mut total = 0usize;
        for o in &p.ops {
            at.push(total);
            let bytes = o.count.checked_mul(o.dt.size()).ok_or_else(|| usage("count overflows"))?;
            total = total.checked_add(bytes.next_multiple_of(256)).ok_or_else(|| usage("p2p bytes overflow"))?;
        }
        let mut b = d.staging.lock();
        let base = d.staging.buffer(&mut b, total.max(1), capturing)?;
        if !capturing && b.last_stream != 0 && b.last_stream != p.stream {
            d.staging.order.wait_on(&s).map_err(kernel_err("order staged calls across streams"))?;
        }
        for (o, &off) in p.ops.iter().zip(&at) {
            let h = base.wrapping_add(off);
            if o.send && o.count > 0 {
                // SAFETY: the pinned buffer holds `total` bytes; the device buffer is the caller's.
                unsafe { staging::copy_to_host(&s, h, o.dev, o.count * o.dt.size()) }
                    .map_err(kernel_err("stage a send to the host"))?;
            }
            let comm = Arc::as_ptr(&p.nc);
            host.push((o.send, o.dev, HostOp { comm, send: o.send, host: h, count: o.count, dt: o.dt, peer: o.peer }));
        }
        if !capturing {
            b.last_stream = p.stream;
        }
        drop(b);
        streams.push((s, d));
    }
    let (s0, d0) = (&streams[0].0, streams[0].1);
    // The other communicators' copies in before the host function, its end before their copies out.
    for (s, d) in &streams[1..] {
        d.staging.ready.record(s).map_err(kernel_err("mark the staged sends"))?;
        d.staging.ready.wait_on(s0).map_err(kernel_err("join the group's streams"))?;
    }
    let outs: Vec<(bool, u64, *mut u8, usize, *const NcclComm)> =
        host.iter().map(|(s, dev, h)| (*s, *dev, h.host, h.count * h.dt.size(), h.comm)).collect();
    let batch = Box::new(Batch { ops: host.into_iter().map(|(_, _, h)| h).collect(), once: !capture });
    // SAFETY: the batch lives until its run (or with the communicator when captured).
    unsafe {
        if capture {
            let p = &*batch as *const Batch as *mut c_void;
            staging::host_function(s0, run_batch, p).map_err(kernel_err("enqueue the staged send/recv"))?;
            d0.staging.lock().kept_data.push(batch);
        } else {
            let p = Box::into_raw(batch);
            if let Err(e) = staging::host_function(s0, run_batch, p.cast()) {
                drop(Box::from_raw(p));
                return Err(kernel_err("enqueue the staged send/recv")(e));
            }
        }
    }
    if streams.len() > 1 {
        d0.staging.done.record(s0).map_err(kernel_err("mark the staged send/recv"))?;
    }
    for (i, (s, d)) in streams.iter().enumerate() {
        if i > 0 {
            d0.staging.done.wait_on(s).map_err(kernel_err("join the group's streams"))?;
        }
        let mine = Arc::as_ptr(&parts[i].nc);
        for &(send, dev, h, bytes, _) in outs.iter().filter(|o| o.4 == mine) {
            if !send && bytes > 0 {
                // SAFETY: as the copies in.
                unsafe { staging::copy_to_device(s, dev, h, bytes) }
                    .map_err(kernel_err("copy a receive to the device"))?;
            }
        }
        if !capture {
            d.staging.order.record(s).map_err(kernel_err("mark the staged call"))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_group_without_device_p2p_runs_nothing_and_touches_no_driver() {
        // Host-only processes reach flush at every ncclGroupEnd: it must not need CUDA.
        discard();
        assert!(flush().is_ok());
        assert!(PENDING.with(|p| p.borrow().is_empty()));
    }
}
