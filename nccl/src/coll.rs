//! Collectives and point-to-point: on the device, or on host buffers.
//!
//! On a device communicator (created with a current CUDA context) a call with a stream or a
//! device buffer is enqueued on the caller's stream (NULL: the legacy default stream) through
//! occl's `CudaComm` and returns; sends and receives are collected and run staged (`p2p`).
//! Otherwise a call with a NULL stream runs occl's raw host collective at once (or, inside a
//! group, is collected by occl until `ncclGroupEnd`) and has completed when that returns.

use crate::abi::*;
use crate::deferred::{cost, defer, reducing, Cost, Deferred, Path};
use crate::error::{arg, guard, usage, Result};
use crate::gpu::{self, DevComm};
use crate::group;
use crate::handle::{ncclComm_t, NcclComm, PreMul, Scalar};
use crate::p2p;
use occl::cuda::DevOp;
use occl::{CollType, Comm, DataType, RedOp};
use std::ffi::c_void;
use std::sync::Arc;

/// `cudaStream_t`.
pub type cudaStream_t = *mut c_void;

/// Picks the call's path and runs `f` on it, recording a failure on the communicator for
/// `ncclCommGetAsyncError`/`ncclGetLastError`.
///
/// # Safety
/// `comm` is NULL or a live handle; `stream` NULL or a live stream.
unsafe fn call(
    name: &'static str,
    comm: ncclComm_t,
    stream: cudaStream_t,
    bufs: &[*const c_void],
    cost: Option<Cost>,
    f: impl FnOnce(&Arc<NcclComm>, Path<'_>) -> Result<()> + 'static,
) -> Result<ncclResult_t> {
    // SAFETY: the caller's contract.
    let c = unsafe { NcclComm::from_handle(comm)? };
    c.check_live(name)?;
    let inner = c.comm()?;
    let device = c.device()?;
    let path = match device {
        Some(d) if !stream.is_null() || bufs.iter().any(|p| crate::device::is_device(*p)) => {
            let _restore = gpu::Restore::new();
            // SAFETY: the caller's contract.
            let s = unsafe { gpu::stream(d.cc.context(), stream, name)? };
            // Resolved now, as NCCL does at enqueue: a group may run after the operator is destroyed.
            let op = match cost.and_then(|k| k.op.map(|o| (o, k.datatype))) {
                Some((o, dt)) => Some(device_op(&c, o, dtype(dt)?).inspect_err(|e| c.note(name, e))?),
                None => None,
            };
            if let (Some(cost), true) = (cost, group::is_open()) {
                let stream_addr = stream as usize;
                defer(Deferred { name, comm: c.clone(), stream: s, stream_addr, op, cost, run: Box::new(f) });
                return Ok(ncclSuccess);
            }
            return f(&c, Path::Device(d, s, stream as usize, op))
                .inspect_err(|e| c.note(name, e))
                .map(|()| ncclSuccess);
        }
        _ => Path::Host(inner),
    };
    if !stream.is_null() {
        return Err(usage(format!(
            "{name} was given a CUDA stream, but this communicator was created without a current CUDA context, so \
             it runs host buffers only: call cudaSetDevice before ncclCommInitRank, or pass a NULL stream and host \
             memory"
        )));
    }
    if let Some(p) = bufs.iter().find(|p| crate::device::is_device(**p)) {
        return Err(usage(format!(
            "{name}: buffer {p:p} is GPU memory, but this communicator was created without a current CUDA context, \
             so it runs host buffers only: call cudaSetDevice before ncclCommInitRank, or pass host memory"
        )));
    }
    f(&c, path).inspect_err(|e| c.note(name, e))?;
    Ok(ncclSuccess)
}

/// A device call's operator: a built-in one, or a pre-multiply sum whose kernel multiplies the
/// input as it reads it. The scalar is resolved now, as NCCL does at enqueue (the operator may be
/// destroyed before a group runs): an immediate's bytes, or the device address the kernel reads
/// when it runs.
fn device_op(c: &NcclComm, op: ncclRedOp_t, dt: DataType) -> Result<DevOp> {
    Ok(match reduction(c, op, dt)? {
        Reduction::Builtin(o) => DevOp::Op(o),
        Reduction::PreMul(pm) => DevOp::PreMulSum(match pm.scalar {
            Scalar::Immediate(b) => occl::cuda::PreMul::immediate(&b)
                .map_err(|e| occl::Error::InternalError(format!("operator {op}'s scalar: {e}")))?,
            Scalar::Pointer(p) => occl::cuda::PreMul::Device(p as u64),
        }),
    })
}

/// Collects a device send or receive, checked now as the device communicator checks it; outside
/// a group it runs at once (a group of one).
#[allow(clippy::too_many_arguments)] // the call and where it runs
fn device_p2p(
    c: &Arc<NcclComm>,
    d: &DevComm,
    stream: usize,
    send: bool,
    dev: u64,
    count: usize,
    dt: DataType,
    peer: usize,
) -> Result<()> {
    d.cc.check_p2p(&occl::cuda::P2p { send, peer, buf: dev, count, dt })?;
    p2p::push(p2p::Op { comm: c.clone(), stream, send, dev, count, dt, peer });
    if group::is_open() {
        return Ok(());
    }
    p2p::flush()
}

fn root_of(root: i32) -> Result<usize> {
    usize::try_from(root).map_err(|_| arg(format!("root {root} is negative")))
}

/// A reduction: occl's own operator, or a pre-multiply sum to apply to the input first.
enum Reduction {
    Builtin(RedOp),
    PreMul(PreMul),
}

fn reduction(c: &NcclComm, op: ncclRedOp_t, dt: DataType) -> Result<Reduction> {
    if let Some(o) = builtin_op(op) {
        return Ok(Reduction::Builtin(o));
    }
    let pm = c.op(op)?;
    if pm.dt != dt {
        return Err(arg(format!(
            "operator {op} was created for {} but the call's datatype is {}; ncclRedOpCreatePreMulSum operators \
             serve one datatype",
            pm.dt.nccl_name(),
            dt.nccl_name()
        )));
    }
    Ok(Reduction::PreMul(pm))
}

/// `count` elements of `send` times the operator's scalar, in an 8-byte-aligned buffer.
///
/// # Safety
/// `send` readable for `count` elements of `pm.dt`; a `Scalar::Pointer` readable for one.
unsafe fn premultiply(send: *const u8, count: usize, pm: &PreMul) -> Result<Vec<u64>> {
    let size = pm.dt.size();
    let bytes = count.checked_mul(size).ok_or_else(|| arg(format!("count {count} overflows")))?;
    if send.is_null() && bytes > 0 {
        return Err(arg("sendbuff is NULL"));
    }
    let scalar: Vec<u8> = match &pm.scalar {
        Scalar::Immediate(b) => b.clone(),
        Scalar::Pointer(p) if crate::device::is_device(*p as *const c_void) => {
            return Err(usage(format!(
                "the operator's scalar at {p:#x} is GPU memory (ncclScalarDevice), but this call runs on host \
                 buffers, where the CPU reads it: pass device buffers, or a host scalar"
            )))
        }
        // SAFETY: the scalar's memory outlives the operator (NCCL's contract for ncclScalarDevice).
        Scalar::Pointer(p) => unsafe { std::slice::from_raw_parts(*p as *const u8, size) }.to_vec(),
    };
    let mut out = vec![0u64; bytes.div_ceil(8)];
    // SAFETY: `out` has at least `bytes` bytes.
    let dst = unsafe { std::slice::from_raw_parts_mut(out.as_mut_ptr().cast::<u8>(), bytes) };
    if bytes > 0 {
        // SAFETY: send is readable for `bytes` (the caller's contract).
        dst.copy_from_slice(unsafe { std::slice::from_raw_parts(send, bytes) });
    }
    occl::dtype::premultiply(pm.dt, dst, &scalar)?;
    Ok(out)
}

/// Runs a reduction with `run(send, op)`: a built-in operator directly, a pre-multiply sum as
/// a sum over the scaled copy of `send` (kept until the group runs when one is open).
///
/// # Safety
/// As `premultiply`.
unsafe fn reduce_with(
    c: &NcclComm,
    op: ncclRedOp_t,
    dt: DataType,
    send: *const u8,
    count: usize,
    run: impl FnOnce(*const u8, RedOp) -> Result<()>,
) -> Result<()> {
    match reduction(c, op, dt)? {
        Reduction::Builtin(o) => run(send, o),
        Reduction::PreMul(pm) => {
            // SAFETY: the caller's contract.
            let scaled = unsafe { premultiply(send, count, &pm)? };
            let p = scaled.as_ptr().cast::<u8>();
            let r = run(p, RedOp::Sum);
            if group::is_open() {
                group::hold_scratch(scaled);
            }
            r
        }
    }
}

/// One collective call as NCCL's entry points pass it: `op` for a reduction, `root` for a
/// rooted collective.
#[derive(Clone, Copy)]
struct Coll {
    coll: CollType,
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    datatype: ncclDataType_t,
    op: Option<ncclRedOp_t>,
    root: Option<i32>,
}

impl Coll {
    fn new(coll: CollType, send: *const c_void, recv: *mut c_void, count: usize, datatype: ncclDataType_t) -> Coll {
        Coll { coll, send, recv, count, datatype, op: None, root: None }
    }

    fn op(self, op: ncclRedOp_t) -> Coll {
        Coll { op: Some(op), ..self }
    }

    fn root(self, root: i32) -> Coll {
        Coll { root: Some(root), ..self }
    }

    /// The C entry point of every collective: `name` is the C function's.
    ///
    /// # Safety
    /// As the C function: `comm` NULL or a live handle, `stream` NULL or a live stream, the
    /// buffers valid as NCCL documents for the collective.
    unsafe fn call(self, name: &'static str, comm: ncclComm_t, stream: cudaStream_t) -> ncclResult_t {
        let priced = match self.op {
            Some(op) => reducing(self.coll, self.count, self.datatype, op),
            None => cost(self.coll, self.count, self.datatype),
        };
        let bufs = [self.send, self.recv.cast_const()];
        // SAFETY: the caller's contract; the body runs with the buffers the caller vouched for.
        guard(name, || unsafe { call(name, comm, stream, &bufs, priced, move |c, path| self.run(c, path)) })
    }

    /// Runs the call on its path: on the host a pre-multiply sum runs as a sum over a scaled
    /// copy of the input; on the device its operator was resolved when the call was made.
    ///
    /// # Safety
    /// As `call`.
    unsafe fn run(self, c: &Arc<NcclComm>, path: Path<'_>) -> Result<()> {
        let dt = dtype(self.datatype)?;
        let root = self.root.map(root_of).transpose()?.unwrap_or(0);
        let (n, send, recv) = (self.count, self.send, self.recv);
        match path {
            Path::Host(inner) => {
                let Some(op) = self.op else {
                    // SAFETY: the caller's contract.
                    return unsafe { self.host(inner, send.cast(), dt, RedOp::Sum, root) };
                };
                let input = match self.coll {
                    CollType::ReduceScatter => {
                        n.checked_mul(inner.nranks()).ok_or_else(|| arg(format!("recvcount {n} × nranks overflows")))?
                    }
                    _ => n,
                };
                // SAFETY: the caller's contract.
                unsafe { reduce_with(c, op, dt, send.cast(), input, |s, o| self.host(inner, s, dt, o, root)) }
            }
            Path::Device(d, s, _, pre) => {
                let op = || pre.ok_or_else(|| crate::error::internal("a reduction without its operator"));
                let (sp, rp, cc) = (send as u64, recv as u64, &d.cc);
                // SAFETY: the caller's contract.
                unsafe {
                    match self.coll {
                        CollType::AllReduce => cc.all_reduce_raw(&s, sp, rp, n, dt, op()?),
                        CollType::Broadcast => cc.broadcast_raw(&s, sp, rp, n, dt, root),
                        CollType::Reduce => cc.reduce_raw(&s, sp, rp, n, dt, op()?, root),
                        CollType::AllGather => cc.all_gather_raw(&s, sp, rp, n, dt),
                        CollType::ReduceScatter => cc.reduce_scatter_raw(&s, sp, rp, n, dt, op()?),
                        CollType::AllToAll => cc.all_to_all_raw(&s, sp, rp, n, dt),
                        CollType::Send | CollType::Recv => Err(crate::error::internal("send/recv as a collective")),
                    }
                }
            }
        }
    }

    /// The host collective with input `send` (the caller's, or its scaled copy) and `op`.
    ///
    /// # Safety
    /// As `call`.
    unsafe fn host(&self, inner: &Comm, send: *const u8, dt: DataType, op: RedOp, root: usize) -> Result<()> {
        let (recv, n) = (self.recv.cast::<u8>(), self.count);
        // SAFETY: the caller's contract.
        unsafe {
            match self.coll {
                CollType::AllReduce => inner.all_reduce_raw(send, recv, n, dt, op),
                CollType::Broadcast => inner.broadcast_raw(send, recv, n, dt, root),
                CollType::Reduce => inner.reduce_raw(send, recv, n, dt, op, root),
                CollType::AllGather => inner.all_gather_raw(send, recv, n, dt),
                CollType::ReduceScatter => inner.reduce_scatter_raw(send, recv, n, dt, op),
                CollType::AllToAll => inner.all_to_all_raw(send, recv, n, dt),
                CollType::Send | CollType::Recv => Err(crate::error::internal("send/recv as a collective")),
            }
        }
    }
}

/// A collective's C entry point and its profiling alias: NCCL's arguments before the
/// communicator and stream, and the `Coll` they make.
macro_rules! collective {
    ($(#[$m:meta])* $name:ident / $alias:ident ($($arg:ident: $ty:ty),* $(,)?) => $coll:expr) => {
        export! {
            $(#[$m])*
            fn $name / $alias($($arg: $ty,)* comm: ncclComm_t, stream: cudaStream_t) -> ncclResult_t {
                // SAFETY: the caller's contract.
                unsafe { $coll.call(stringify!($name), comm, stream) }
            }
        }
    };
}

collective! {
    /// Sum (or another operator) of every rank's `sendbuff` into every rank's `recvbuff`.
    ncclAllReduce / pncclAllReduce(
        sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: ncclDataType_t, op: ncclRedOp_t,
    ) => Coll::new(CollType::AllReduce, sendbuff, recvbuff, count, datatype).op(op)
}

collective! {
    /// The root's `sendbuff` into every rank's `recvbuff`.
    ncclBroadcast / pncclBroadcast(
        sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: ncclDataType_t, root: i32,
    ) => Coll::new(CollType::Broadcast, sendbuff, recvbuff, count, datatype).root(root)
}

collective! {
    /// In-place broadcast (NCCL's older form).
    ncclBcast / pncclBcast(buff: *mut c_void, count: usize, datatype: ncclDataType_t, root: i32)
        => Coll::new(CollType::Broadcast, buff.cast_const(), buff, count, datatype).root(root)
}

collective! {
    /// Reduction of every rank's `sendbuff` into the root's `recvbuff` (ignored elsewhere).
    ncclReduce / pncclReduce(
        sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: ncclDataType_t, op: ncclRedOp_t,
        root: i32,
    ) => Coll::new(CollType::Reduce, sendbuff, recvbuff, count, datatype).op(op).root(root)
}

collective! {
    /// Every rank's `sendcount` elements, in rank order, into every rank's `recvbuff`.
    ncclAllGather / pncclAllGather(
        sendbuff: *const c_void, recvbuff: *mut c_void, sendcount: usize, datatype: ncclDataType_t,
    ) => Coll::new(CollType::AllGather, sendbuff, recvbuff, sendcount, datatype)
}

collective! {
    /// Block `rank` of the reduction of every rank's `sendbuff` into `recvbuff`.
    ncclReduceScatter / pncclReduceScatter(
        sendbuff: *const c_void, recvbuff: *mut c_void, recvcount: usize, datatype: ncclDataType_t, op: ncclRedOp_t,
    ) => Coll::new(CollType::ReduceScatter, sendbuff, recvbuff, recvcount, datatype).op(op)
}

collective! {
    /// Block `j` of rank `i`'s `sendbuff` into block `i` of rank `j`'s `recvbuff`.
    ncclAlltoAll / pncclAlltoAll(
        sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: ncclDataType_t,
    ) => Coll::new(CollType::AllToAll, sendbuff, recvbuff, count, datatype)
}

/// Runs `calls` as one group of sends and receives (nested in the caller's group when one is
/// open), closing the group even when a call is refused: occl's group for host calls, this
/// library's collected device p2p (`p2p`) for device calls.
fn grouped(device: bool, calls: impl FnOnce() -> Result<()>) -> Result<()> {
    occl::group_start();
    let issued = calls();
    let outermost = occl::group_depth() == 1;
    let ran = occl::group_end();
    if device && outermost {
        if issued.is_err() || ran.is_err() {
            p2p::discard();
        } else {
            return p2p::flush();
        }
    }
    issued.and(ran)
}

/// Copies this rank's own block (memmove: in place, the blocks may be the same memory).
///
/// # Safety
/// Both readable/writable for `bytes`.
unsafe fn own_block(from: *const u8, to: *mut u8, bytes: usize) -> Result<()> {
    if bytes == 0 || std::ptr::eq(from, to) {
        return Ok(());
    }
    if from.is_null() || to.is_null() {
        return Err(arg("a buffer is NULL"));
    }
    // SAFETY: the caller's contract.
    unsafe { std::ptr::copy(from, to, bytes) };
    Ok(())
}

/// Gather and scatter as sends and receives on either path.
struct Ends<'a, 'b> {
    c: &'a Arc<NcclComm>,
    path: &'a Path<'b>,
    dt: DataType,
    count: usize,
}

impl Ends<'_, '_> {
    fn is_device(&self) -> bool {
        matches!(self.path, Path::Device(..))
    }

    /// # Safety
    /// `p` holds `count` elements, live until the call has run.
    unsafe fn send(&self, p: *const u8, peer: usize) -> Result<()> {
        match self.path {
            // SAFETY: the caller's promise.
            Path::Host(inner) => unsafe { inner.send_raw(p, self.count, self.dt, peer) },
            Path::Device(d, _, s, _) => device_p2p(self.c, d, *s, true, p as u64, self.count, self.dt, peer),
        }
    }

    /// # Safety
    /// As `send`.
    unsafe fn recv(&self, p: *mut u8, peer: usize) -> Result<()> {
        match self.path {
            // SAFETY: the caller's promise.
            Path::Host(inner) => unsafe { inner.recv_raw(p, self.count, self.dt, peer) },
            Path::Device(d, _, s, _) => device_p2p(self.c, d, *s, false, p as u64, self.count, self.dt, peer),
        }
    }

    /// # Safety
    /// As `own_block`, on the path's memory.
    unsafe fn own(&self, from: *const u8, to: *mut u8) -> Result<()> {
        let bytes = self.count * self.dt.size();
        match self.path {
            // SAFETY: the caller's promise.
            Path::Host(_) => unsafe { own_block(from, to, bytes) },
            // SAFETY: the caller's promise; enqueued before the group's staged p2p.
            Path::Device(_, s, _, _) => unsafe { gpu::copy_on(s, to as u64, from as u64, bytes) },
        }
    }
}

/// What a gather or scatter needs to know of its call: the datatype, the root, the ranks, this
/// rank, and the bytes of one rank's block.
struct Rooted {
    dt: DataType,
    root: usize,
    n: usize,
    me: usize,
    bytes: usize,
}

/// A gather's or scatter's arguments checked against `comm`; `None` when there is nothing to move.
fn rooted(comm: &Comm, datatype: ncclDataType_t, root: i32, count: usize) -> Result<Option<Rooted>> {
    let (dt, root) = (dtype(datatype)?, root_of(root)?);
    let (n, me) = (comm.nranks(), comm.rank());
    if root >= n {
        return Err(arg(format!("root {root} is out of range for nranks={n}")));
    }
    let bytes = count.checked_mul(dt.size()).ok_or_else(|| arg("count overflows"))?;
    Ok((count > 0).then_some(Rooted { dt, root, n, me, bytes }))
}

/// A gather (every rank's block into the root's `recv`, in rank order) or a scatter (block
/// `i` of the root's `send` into rank `i`'s `recv`): point-to-point moves in one group, the
/// root's own block copied.
///
/// # Safety
/// NCCL's contract for `ncclGather`/`ncclScatter`.
#[allow(clippy::too_many_arguments)] // NCCL's argument list and which of the two
unsafe fn gather_or_scatter(
    gather: bool,
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: ncclDataType_t,
    root: i32,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    let name = if gather { "ncclGather" } else { "ncclScatter" };
    guard(name, || unsafe {
        call(name, comm, stream, &[sendbuff, recvbuff.cast_const()], None, move |c, path| {
            let Some(Rooted { dt, root, n, me, bytes }) = rooted(c.comm()?, datatype, root, count)? else {
                return Ok(());
            };
            let (send, recv) = (sendbuff.cast::<u8>(), recvbuff.cast::<u8>());
            let e = Ends { c, path: &path, dt, count };
            grouped(e.is_device(), || match (gather, me == root) {
                (true, false) => e.send(send, root),
                (false, false) => e.recv(recv, root),
                (true, true) if recv.is_null() => Err(arg("recvbuff is NULL at the root")),
                (false, true) if send.is_null() => Err(arg("sendbuff is NULL at the root")),
                (true, true) => {
                    e.own(send, recv.wrapping_add(me * bytes))?;
                    (0..n).filter(|&r| r != me).try_for_each(|r| e.recv(recv.wrapping_add(r * bytes), r))
                }
                (false, true) => {
                    e.own(send.wrapping_add(me * bytes), recv)?;
                    (0..n).filter(|&r| r != me).try_for_each(|r| e.send(send.wrapping_add(r * bytes), r))
                }
            })
        })
    })
}

export! {
    /// Every rank's `count` elements into the root's `recvbuff`, in rank order.
    fn ncclGather / pncclGather(
        sendbuff: *const c_void,
        recvbuff: *mut c_void,
        count: usize,
        datatype: ncclDataType_t,
        root: i32,
        comm: ncclComm_t,
        stream: cudaStream_t,
    ) -> ncclResult_t {
        // SAFETY: NCCL's contract, passed on.
        unsafe { gather_or_scatter(true, sendbuff, recvbuff, count, datatype, root, comm, stream) }
    }
}

export! {
    /// Block `i` of the root's `sendbuff` into rank `i`'s `recvbuff`.
    fn ncclScatter / pncclScatter(
        sendbuff: *const c_void,
        recvbuff: *mut c_void,
        count: usize,
        datatype: ncclDataType_t,
        root: i32,
        comm: ncclComm_t,
        stream: cudaStream_t,
    ) -> ncclResult_t {
        // SAFETY: NCCL's contract, passed on.
        unsafe { gather_or_scatter(false, sendbuff, recvbuff, count, datatype, root, comm, stream) }
    }
}

/// The C entry point of a send (`send`) or a receive of `count` elements at `buf`.
///
/// # Safety
/// As `ncclSend` and `ncclRecv`.
#[allow(clippy::too_many_arguments)] // the C call's arguments and which of the two it is
unsafe fn point_to_point(
    name: &'static str,
    send: bool,
    buf: *const c_void,
    count: usize,
    datatype: ncclDataType_t,
    peer: i32,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    guard(name, || unsafe {
        call(name, comm, stream, &[buf], None, move |c, path| {
            let peer = usize::try_from(peer).map_err(|_| arg(format!("peer {peer} is negative")))?;
            let dt = dtype(datatype)?;
            match path {
                Path::Host(inner) if send => inner.send_raw(buf.cast(), count, dt, peer),
                Path::Host(inner) => inner.recv_raw(buf.cast_mut().cast(), count, dt, peer),
                Path::Device(d, _, s, _) => device_p2p(c, d, s, send, buf as u64, count, dt, peer),
            }
        })
    })
}

export! {
    /// `count` elements to `peer`, matched by its `ncclRecv`.
    fn ncclSend / pncclSend(
        sendbuff: *const c_void, count: usize, datatype: ncclDataType_t, peer: i32, comm: ncclComm_t,
        stream: cudaStream_t,
    ) -> ncclResult_t {
        // SAFETY: the caller's contract.
        unsafe { point_to_point("ncclSend", true, sendbuff, count, datatype, peer, comm, stream) }
    }
}

export! {
    /// `count` elements from `peer`, matched by its `ncclSend`.
    fn ncclRecv / pncclRecv(
        recvbuff: *mut c_void, count: usize, datatype: ncclDataType_t, peer: i32, comm: ncclComm_t,
        stream: cudaStream_t,
    ) -> ncclResult_t {
        // SAFETY: the caller's contract.
        unsafe { point_to_point("ncclRecv", false, recvbuff.cast_const(), count, datatype, peer, comm, stream) }
    }
}

export! {
    /// An operator that multiplies each rank's input by `*scalar` before summing (for
    /// `datatype` and this communicator only).
    fn ncclRedOpCreatePreMulSum / pncclRedOpCreatePreMulSum(
        op: *mut ncclRedOp_t,
        scalar: *mut c_void,
        datatype: ncclDataType_t,
        residence: i32,
        comm: ncclComm_t,
    ) -> ncclResult_t {
        guard("ncclRedOpCreatePreMulSum", || {
            // SAFETY: the caller's contract.
            let c = unsafe { NcclComm::from_handle(comm)? };
            let dt = dtype(datatype)?;
            if op.is_null() || scalar.is_null() {
                return Err(arg("op and scalar must not be NULL"));
            }
            let scalar = match residence {
                // SAFETY: scalar is readable for one element (the caller's contract).
                1 => Scalar::Immediate(unsafe { std::slice::from_raw_parts(scalar.cast::<u8>(), dt.size()) }.to_vec()),
                0 => Scalar::Pointer(scalar as usize),
                r => {
                    return Err(arg(format!(
                        "residence {r}: use ncclScalarDevice (0) or ncclScalarHostImmediate (1)"
                    )))
                }
            };
            let v = c.add_op(PreMul { dt, scalar })?;
            // SAFETY: non-NULL and writable.
            unsafe { op.write(v) };
            Ok(ncclSuccess)
        })
    }
}

export! {
    /// Frees an operator of `ncclRedOpCreatePreMulSum`.
    fn ncclRedOpDestroy / pncclRedOpDestroy(op: ncclRedOp_t, comm: ncclComm_t) -> ncclResult_t {
        guard("ncclRedOpDestroy", || {
            // SAFETY: the caller's contract.
            let c = unsafe { NcclComm::from_handle(comm)? };
            if builtin_op(op).is_some() {
                return Err(arg(format!("operator {op} is built in; only ncclRedOpCreatePreMulSum's can be destroyed")));
            }
            c.remove_op(op)?;
            Ok(ncclSuccess)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::handle::Scalar;
    use occl::cuda::PreMul as DevScalar;

    /// A communicator handle whose operator table works without a created communicator.
    fn comm() -> Arc<NcclComm> {
        let (_tx, rx) = std::sync::mpsc::channel();
        NcclComm::background(rx, Options::default())
    }

    #[test]
    fn every_datatype_runs_a_pre_multiply_sum_on_the_device() {
        let c = comm();
        for dt in DataType::ALL {
            let bytes: Vec<u8> = (1..=dt.size() as u8).collect();
            let imm = c.add_op(PreMul { dt, scalar: Scalar::Immediate(bytes.clone()) }).unwrap();
            let mut want = [0u8; 8];
            want[..bytes.len()].copy_from_slice(&bytes);
            let got = device_op(&c, imm, dt).unwrap();
            assert_eq!(got, DevOp::PreMulSum(DevScalar::Immediate(u64::from_ne_bytes(want))), "{dt}");
            let dev = c.add_op(PreMul { dt, scalar: Scalar::Pointer(0x7f00_0000_0000) }).unwrap();
            assert_eq!(device_op(&c, dev, dt).unwrap(), DevOp::PreMulSum(DevScalar::Device(0x7f00_0000_0000)));
        }
        for o in RedOp::ALL {
            assert_eq!(device_op(&c, o as ncclRedOp_t, DataType::I8).unwrap(), DevOp::Op(o));
        }
    }

    #[test]
    fn a_pre_multiply_operator_serves_its_datatype_while_it_lives() {
        let c = comm();
        let op =
            c.add_op(PreMul { dt: DataType::F32, scalar: Scalar::Immediate(2f32.to_ne_bytes().to_vec()) }).unwrap();
        assert_eq!(op, NUM_OPS);
        let e = device_op(&c, op, DataType::Bf16).unwrap_err();
        assert_eq!(e.kind(), occl::ErrorKind::InvalidArgument);
        assert!(
            e.to_string().contains("operator 5 was created for ncclFloat32 but the call's datatype is ncclBfloat16"),
            "{e}"
        );
        c.remove_op(op).unwrap();
        let e = device_op(&c, op, DataType::F32).unwrap_err();
        assert_eq!(e.kind(), occl::ErrorKind::InvalidArgument);
        assert!(e.to_string().contains("nor a live operator of this communicator"), "{e}");
        assert!(device_op(&c, -1, DataType::F32).is_err());
    }

    #[test]
    fn a_host_pre_multiply_scales_a_copy_of_the_input() {
        let send: Vec<u8> = [1i32, -2, 3].iter().flat_map(|x| x.to_ne_bytes()).collect();
        let s = 3i32;
        let pm = PreMul { dt: DataType::I32, scalar: Scalar::Pointer(&raw const s as usize) };
        // SAFETY: 3 readable elements and a readable scalar.
        let out = unsafe { premultiply(send.as_ptr(), 3, &pm) }.unwrap();
        let got: Vec<i32> = out.iter().flat_map(|w| w.to_ne_bytes()).collect::<Vec<u8>>()[..12]
            .chunks_exact(4)
            .map(|b| i32::from_ne_bytes(b.try_into().unwrap()))
            .collect();
        assert_eq!(got, [3, -6, 9]);
        assert_eq!(i32::from_ne_bytes(send[..4].try_into().unwrap()), 1, "the input is left alone");
        // SAFETY: nothing is read for 0 elements.
        assert!(unsafe { premultiply(std::ptr::null(), 0, &pm) }.unwrap().is_empty());
        // SAFETY: a NULL buffer of 3 elements is refused before it is read.
        assert!(unsafe { premultiply(std::ptr::null(), 3, &pm) }.is_err());
    }
}
