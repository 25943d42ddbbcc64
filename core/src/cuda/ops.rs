//! The device collectives: each validates its arguments, fills one argument block and enqueues
//! one kernel on the caller's stream. Buffers are device addresses of this communicator's GPU
//! (NCCL's `void*` arguments); `count` is in elements as in NCCL.

use super::comm::CudaComm;
use super::err;
use super::kernels::coll::{CollArgs, Mode};
use super::kernels::cudarc::driver::sys as cudarc_sys;
use super::kernels::cudarc::driver::{sys::CUstreamCaptureStatus, CudaStream};
use super::kernels::p2p::{plan, Transfer};
use super::staged::HostOp;
use super::tune::DevAlgo;
use super::{kernel_dtype, kernel_op, DevOp, PreMul};
use crate::dtype::{DataType, RedOp};
use crate::error::{Error, Result};
use crate::profile::op::OpDescr;
use crate::profile::OpProf;
use crate::record::CollType;
use occl_telemetry::{EventType, Note};

/// What a launch is, for its profiler events.
#[derive(Clone, Copy)]
struct Call {
    /// NCCL's algorithm name.
    algo: &'static str,
    send: u64,
    recv: u64,
    /// Elements of `dt`, as the caller gave them (the kernel may move them as bytes).
    count: usize,
    dt: DataType,
    root: i32,
    peer: i32,
}

impl Call {
    fn new(algo: &'static str, send: u64, recv: u64, count: usize, dt: DataType) -> Call {
        Call { algo, send, recv, count, dt, root: 0, peer: -1 }
    }
}

/// NCCL's `func` of a mode, and its index among the communicator's per-function sequence
/// numbers.
pub(crate) fn func_of(mode: Mode) -> (&'static str, usize) {
    match mode {
        Mode::AllReduceOneShot | Mode::AllReduceTwoShot | Mode::AllReduceRing => ("AllReduce", 0),
        Mode::ReduceScatter | Mode::ReduceScatterRing => ("ReduceScatter", 1),
        Mode::Reduce | Mode::ReduceRing => ("Reduce", 2),
        Mode::AllGather => ("AllGather", 3),
        Mode::Broadcast | Mode::BroadcastRing => ("Broadcast", 4),
        Mode::AllToAll => ("AlltoAll", 5),
        Mode::Send => ("Send", 6),
        Mode::Recv => ("Recv", 7),
    }
}

/// The operation type RAS counts a mode under (NCCL's `ncclFunc_t`).
fn ras_type(mode: Mode) -> CollType {
    match mode {
        Mode::AllReduceOneShot | Mode::AllReduceTwoShot | Mode::AllReduceRing => CollType::AllReduce,
        Mode::ReduceScatter | Mode::ReduceScatterRing => CollType::ReduceScatter,
        Mode::Reduce | Mode::ReduceRing => CollType::Reduce,
        Mode::AllGather => CollType::AllGather,
        Mode::Broadcast | Mode::BroadcastRing => CollType::Broadcast,
        Mode::AllToAll => CollType::AllToAll,
        Mode::Send => CollType::Send,
        Mode::Recv => CollType::Recv,
    }
}

/// The algorithm name a mode's profiler events and flight records carry (NCCL's spelling).
fn algo_name(mode: Mode) -> &'static str {
    match mode {
        Mode::AllReduceOneShot => "ONE_SHOT",
        Mode::AllReduceTwoShot => "TWO_SHOT",
        Mode::AllReduceRing | Mode::BroadcastRing | Mode::ReduceScatterRing | Mode::ReduceRing => "RING",
        _ => "DIRECT",
    }
}

/// Device functions with a sequence number of their own.
pub(crate) const FUNCS: usize = 8;

/// Bytes of a block's share below which fewer blocks are used: one block for small messages.
const MIN_BLOCK_BYTES: u64 = 32 << 10;

/// Whether `stream` is capturing a CUDA graph (an error reads as not capturing: the launch
/// then fails or runs on its own).
fn capturing(stream: &CudaStream) -> bool {
    stream.capture_status().is_ok_and(|s| s == CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE)
}

/// Puts `op` into a launch's arguments; returns the operator the kernel folds with. An average
/// is a sum divided by nranks at its end; a pre-multiply sum is a sum whose kernel scales this
/// rank's input as it reads it.
fn set_op(a: &mut CollArgs, op: DevOp, nranks: usize) -> RedOp {
    match op {
        DevOp::Op(o) => {
            a.div = if o == RedOp::Avg { nranks as u32 } else { 0 };
            o
        }
        DevOp::PreMulSum(p) => {
            a.premul(p);
            RedOp::Sum
        }
    }
}

impl CudaComm {
    fn args(&self, mode: Mode, input: u64, output: u64, count: u64, stride: u64, total: u64) -> CollArgs {
        CollArgs {
            input,
            output,
            count,
            stride,
            total,
            regions: self.regions,
            ctrl_off: self.layout.ctrl_off(),
            data_off: self.layout.data_off(),
            slot_bytes: self.layout.slot_bytes,
            timeout_ns: self.timeout_ns,
            mode: mode as u32,
            rank: self.rank() as u32,
            nranks: self.nranks() as u32,
            nslots: self.layout.slots,
            ..CollArgs::default()
        }
    }

    /// Blocks for a share of `bytes`: every rank computes the same from the same call.
    fn blocks(&self, bytes: u64) -> u32 {
        let want = bytes.div_ceil(MIN_BLOCK_BYTES).max(1);
        u32::try_from(want.min(u64::from(self.layout.channels))).unwrap_or(1)
    }

    fn check_ptrs(&self, dt: DataType, ptrs: &[(&str, u64)], count: usize) -> Result<u64> {
        let bytes =
            count.checked_mul(dt.size()).ok_or_else(|| Error::arg(format!("{count} {dt} elements overflow")))?;
        for &(what, p) in ptrs {
            if count > 0 && p == 0 {
                return Err(Error::arg(format!("{what} is a null device address")));
            }
            if p % dt.size() as u64 != 0 {
                return Err(Error::arg(format!("{what} at {p:#x} is not aligned to {dt}")));
            }
        }
        Ok(bytes as u64)
    }

    fn check_root(&self, root: usize, what: &str) -> Result<()> {
        if root >= self.nranks() {
            return Err(Error::arg(format!("{what} {root} is out of range for {} ranks", self.nranks())));
        }
        Ok(())
    }

    fn check_stream(&self, stream: &CudaStream) -> Result<()> {
        if stream.context() != &self.ctx {
            return Err(Error::arg("the stream belongs to another GPU than this communicator's"));
        }
        Ok(())
    }

    /// Runs the call through host memory when the communicator is staged (a peer on another
    /// host): `input` and `output` are (device address, elements), `count` what the host
    /// collective takes. `None`: not staged, run it on the device.
    ///
    /// # Safety
    /// As for every raw call.
    #[allow(clippy::too_many_arguments)] // one staged call's whole description
    unsafe fn staged(
        &self,
        stream: &CudaStream,
        op: HostOp,
        input: Option<(u64, usize)>,
        output: Option<(u64, usize)>,
        count: usize,
        dt: DataType,
    ) -> Option<Result<()>> {
        let st = self.staged.as_ref()?;
        if let Err(e) = self.check_stream(stream) {
            return Some(Err(e));
        }
        let es = dt.size();
        let bytes = |(p, n): (u64, usize)| (p, n * es);
        // SAFETY: the caller's promise about the device buffers.
        Some(unsafe { st.enqueue(stream, op, input.map(bytes), output.map(bytes), count, dt) })
    }

    /// Enqueues the launch with its host events (API, Group, Coll/P2p, KernelLaunch) and, when
    /// a sink wants KernelCh, a timer slot for its blocks (`events.rs`).
    ///
    /// # Safety
    /// As for every raw call: the addresses are this GPU's memory, valid for what the operation
    /// reads and writes until the stream has run it.
    unsafe fn go(
        &self,
        stream: &CudaStream,
        mut a: CollArgs,
        (dt, op): (DataType, RedOp),
        blocks: u32,
        call: Call,
    ) -> Result<()> {
        self.check_stream(stream)?;
        let f = self.comm.fanout();
        if let Some(ev) = &self.events {
            ev.collect(f);
        }
        let mode = Mode::of_code(a.mode).ok_or_else(|| Error::internal(format!("device mode {}", a.mode)))?;
        let (func, fi) = func_of(mode);
        let prof = OpProf::begin_device(f, self.rank(), || OpDescr {
            func,
            p2p: matches!(mode, Mode::Send | Mode::Recv),
            seq_number: self.seqs[fi].fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            send_buff: call.send as usize,
            recv_buff: call.recv as usize,
            count: call.count,
            root: call.root,
            peer: call.peer,
            datatype: call.dt.nccl_name(),
            algo: call.algo,
            proto: "SIMPLE",
            chunk_size: self.layout.slot_bytes as usize,
            n_channels: u8::try_from(blocks).unwrap_or(u8::MAX),
        });
        let parent = prof.as_ref().filter(|p| p.mask().contains(EventType::KernelCh)).and_then(OpProf::coll_id);
        // A captured launch replays without the host: it gets no slot (see events.rs).
        let slot = match (&self.events, parent) {
            (Some(ev), Some(_)) if !capturing(stream) => {
                ev.recalibrate_if_due();
                ev.reserve(blocks)
            }
            _ => None,
        };
        if let Some((_, dev)) = slot {
            a.timers = dev;
        }
        let launch = prof.as_ref().and_then(|p| p.start_launch(stream.cu_stream() as usize));
        // SAFETY: the caller's promise about the buffers; the regions are this communicator's,
        // the timer slot is this launch's alone until its records are collected.
        let r = unsafe { self.kernels.launch(stream, &a, kernel_dtype(dt), kernel_op(op), blocks) }
            .map_err(err("launch a device collective"));
        if let (Ok(()), Some(w)) = (&r, &self.watch) {
            w.launched(capturing(stream));
        }
        if let Some(p) = &prof {
            p.stop_launch(launch);
        }
        if let (Some(ev), Some((s, _))) = (&self.events, slot) {
            match (&r, parent) {
                (Ok(()), Some(parent)) => ev.launched(s, blocks, parent),
                _ => ev.release(s),
            }
        }
        // RAS counts a device operation once it is enqueued (as NCCL's RAS does): the host
        // never learns when the kernel ends.
        let coll = ras_type(mode);
        self.comm.record().launch(coll, call.count.saturating_mul(call.dt.size()) as u64, crate::record::now_ns());
        match &r {
            Ok(()) => self.comm.record().complete(coll),
            Err(e) => f.note(&Note::OpFailed { func, kind: e.kind().name() }),
        }
        if let Some(p) = prof {
            p.end();
        }
        r
    }

    /// A device scalar must be a readable element of `dt`, as a buffer must.
    fn check_op(&self, dt: DataType, op: DevOp) -> Result<()> {
        if let DevOp::PreMulSum(PreMul::Device(p)) = op {
            self.check_ptrs(dt, &[("the pre-multiply scalar", p)], 1)?;
        }
        Ok(())
    }

    /// The algorithm an all-reduce of `count` elements of `dt` runs with.
    pub fn all_reduce_algorithm(&self, count: usize, dt: DataType) -> DevAlgo {
        match self.forced.load(std::sync::atomic::Ordering::Relaxed) {
            0 => self.tuner.choose(count.saturating_mul(dt.size())),
            i => DevAlgo::ALL[usize::from(i - 1).min(2)],
        }
    }

    /// The mode a broadcast of `count` elements of `dt` runs in.
    fn broadcast_mode(&self, count: usize, dt: DataType) -> Result<Mode> {
        let ring = self.tuner.broadcast_ring(count.saturating_mul(dt.size()))?;
        Ok(if ring { Mode::BroadcastRing } else { Mode::Broadcast })
    }

    /// The mode a reduce-scatter of `count` elements of `dt` per rank runs in (priced on its
    /// input, nranks × `count`).
    fn reduce_scatter_mode(&self, count: usize, dt: DataType) -> Result<Mode> {
        let ring = self.tuner.reduce_scatter_ring(count.saturating_mul(dt.size()).saturating_mul(self.nranks()))?;
        Ok(if ring { Mode::ReduceScatterRing } else { Mode::ReduceScatter })
    }

    /// The mode a reduce of `count` elements of `dt` runs in.
    fn reduce_mode(&self, count: usize, dt: DataType) -> Result<Mode> {
        let ring = self.tuner.reduce_ring(count.saturating_mul(dt.size()))?;
        Ok(if ring { Mode::ReduceRing } else { Mode::Reduce })
    }

    /// The algorithm a reduce of `count` elements of `dt` runs with: `direct` or `ring`.
    pub fn reduce_algorithm(&self, count: usize, dt: DataType) -> Result<&'static str> {
        Ok(if self.reduce_mode(count, dt)? == Mode::ReduceRing { "ring" } else { "direct" })
    }

    /// The algorithm a broadcast of `count` elements of `dt` runs with: `direct` or `ring`.
    pub fn broadcast_algorithm(&self, count: usize, dt: DataType) -> Result<&'static str> {
        Ok(if self.broadcast_mode(count, dt)? == Mode::BroadcastRing { "ring" } else { "direct" })
    }

    /// The algorithm a reduce-scatter of `count` elements of `dt` per rank runs with.
    pub fn reduce_scatter_algorithm(&self, count: usize, dt: DataType) -> Result<&'static str> {
        Ok(if self.reduce_scatter_mode(count, dt)? == Mode::ReduceScatterRing { "ring" } else { "direct" })
    }

    /// The device tuner's predicted µs for `coll` of `count` elements of `dt` per rank (per
    /// block for all-gather, reduce-scatter and all-to-all): what `ncclGroupSimulateEnd` reports.
    pub fn predicted_us(&self, coll: CollType, count: usize, dt: DataType) -> Result<f64> {
        self.tuner.predict(coll, count.saturating_mul(dt.size()))
    }

    /// Runs every later all-reduce with `algo` (`None`: the tuner's choice again), as a
    /// per-communicator `OCCL_ALGO`; every rank must set the same. Ring needs 2 ranks or more.
    pub fn force_all_reduce(&self, algo: Option<DevAlgo>) -> Result<()> {
        let v = match algo {
            None => 0,
            Some(DevAlgo::OneShot) => 1,
            Some(a) if self.nranks() < 2 => return Err(Error::usage(format!("{} needs 2 ranks or more", a.name()))),
            Some(DevAlgo::TwoShot) => 2,
            Some(DevAlgo::Ring) => 3,
        };
        self.forced.store(v, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }

    /// All-reduce of `count` elements from `send` into `recv` (equal: in place). `op` is an
    /// operator or a pre-multiply sum ([`DevOp`]).
    ///
    /// # Safety
    /// `send` and `recv` are device addresses on this GPU of `count` elements each, live until
    /// the stream has run the operation (so is a device scalar of `op`); every rank makes the
    /// same call in the same order.
    pub unsafe fn all_reduce_raw(
        &self,
        stream: &CudaStream,
        send: u64,
        recv: u64,
        count: usize,
        dt: DataType,
        op: impl Into<DevOp>,
    ) -> Result<()> {
        let op = op.into();
        let bytes = self.check_ptrs(dt, &[("send", send), ("recv", recv)], count)?;
        self.check_op(dt, op)?;
        if count == 0 {
            return self.check_stream(stream);
        }
        // SAFETY: the caller's promise.
        if let Some(r) =
            unsafe { self.staged(stream, HostOp::AllReduce(op), Some((send, count)), Some((recv, count)), count, dt) }
        {
            return r;
        }
        let algo = self.all_reduce_algorithm(count, dt);
        let (n, es, c) = (self.nranks() as u64, dt.size() as u64, count as u64);
        let (mode, unit) = match algo {
            DevAlgo::OneShot => (Mode::AllReduceOneShot, c),
            DevAlgo::TwoShot => (Mode::AllReduceTwoShot, c.div_ceil(n).next_multiple_of(16 / es)),
            DevAlgo::Ring => (Mode::AllReduceRing, c.div_ceil(n).next_multiple_of(16 / es)),
        };
        let mut a = self.args(mode, send, recv, unit, unit, c);
        let kop = set_op(&mut a, op, self.nranks());
        // Every algorithm spreads the whole message over the grid: sized by a shard, two-shot
        // ran 1 MiB on 4 ranks over 8 blocks, 1.2× one-shot's time on 32.
        let blocks = self.blocks(bytes);
        // SAFETY: the caller's promise.
        unsafe { self.go(stream, a, (dt, kop), blocks, Call::new(algo_name(mode), send, recv, count, dt)) }
    }

    /// Reduce-scatter: `send` holds nranks blocks of `count`, `recv` gets block `rank` reduced.
    ///
    /// # Safety
    /// As [`CudaComm::all_reduce_raw`], with `send` of nranks × `count` elements.
    pub unsafe fn reduce_scatter_raw(
        &self,
        stream: &CudaStream,
        send: u64,
        recv: u64,
        count: usize,
        dt: DataType,
        op: impl Into<DevOp>,
    ) -> Result<()> {
        let op = op.into();
        let bytes = self.check_ptrs(dt, &[("send", send), ("recv", recv)], count)?;
        self.check_op(dt, op)?;
        if count == 0 {
            return self.check_stream(stream);
        }
        let n = self.nranks();
        let (input, output) = (Some((send, count * n)), Some((recv, count)));
        // SAFETY: the caller's promise.
        if let Some(r) = unsafe { self.staged(stream, HostOp::ReduceScatter(op), input, output, count, dt) } {
            return r;
        }
        let mode = self.reduce_scatter_mode(count, dt)?;
        // The ring clips each block to `total`: all n blocks are whole.
        let mut a = self.args(mode, send, recv, count as u64, count as u64, (count * n) as u64);
        let kop = set_op(&mut a, op, self.nranks());
        let call = Call::new(algo_name(mode), send, recv, count, dt);
        // SAFETY: the caller's promise.
        unsafe { self.go(stream, a, (dt, kop), self.blocks(bytes), call) }
    }

    /// Reduce into `recv` on `root` (other ranks' `recv` is untouched).
    ///
    /// # Safety
    /// As [`CudaComm::all_reduce_raw`].
    #[allow(clippy::too_many_arguments)] // NCCL's argument list
    pub unsafe fn reduce_raw(
        &self,
        stream: &CudaStream,
        send: u64,
        recv: u64,
        count: usize,
        dt: DataType,
        op: impl Into<DevOp>,
        root: usize,
    ) -> Result<()> {
        let op = op.into();
        self.check_root(root, "root")?;
        let recv_p = if self.rank() == root { recv } else { send };
        let bytes = self.check_ptrs(dt, &[("send", send), ("recv", recv_p)], count)?;
        self.check_op(dt, op)?;
        if count == 0 {
            return self.check_stream(stream);
        }
        let output = (self.rank() == root).then_some((recv, count));
        // SAFETY: the caller's promise.
        if let Some(r) =
            unsafe { self.staged(stream, HostOp::Reduce(op, root), Some((send, count)), output, count, dt) }
        {
            return r;
        }
        let mode = self.reduce_mode(count, dt)?;
        let mut a = self.args(mode, send, recv_p, count as u64, 0, 0);
        a.root = root as u32;
        let kop = set_op(&mut a, op, self.nranks());
        let call = Call { root: root as i32, ..Call::new(algo_name(mode), send, recv_p, count, dt) };
        // SAFETY: the caller's promise.
        unsafe { self.go(stream, a, (dt, kop), self.blocks(bytes), call) }
    }

    /// Byte-moving collectives share this: `count` elements become bytes.
    /// `host`: the same call staged (the host collective, and the elements copied in and out).
    #[allow(clippy::too_many_arguments)] // the device call and its staged twin
    unsafe fn copy_op(
        &self,
        stream: &CudaStream,
        mode: Mode,
        (send, recv): (u64, u64),
        count: usize,
        dt: DataType,
        root: u32,
        host: (HostOp, Option<usize>, Option<usize>),
    ) -> Result<()> {
        let bytes = self.check_ptrs(dt, &[("send", send), ("recv", recv)], count)?;
        if count == 0 {
            return self.check_stream(stream);
        }
        let (op, input, output) = host;
        // SAFETY: the caller's promise.
        if let Some(r) =
            unsafe { self.staged(stream, op, input.map(|n| (send, n)), output.map(|n| (recv, n)), count, dt) }
        {
            return r;
        }
        let mut a = self.args(mode, send, recv, bytes, bytes, 0);
        a.root = root;
        let mut call = Call::new(algo_name(mode), send, recv, count, dt);
        match mode {
            Mode::Send | Mode::Recv => call.peer = root as i32,
            Mode::Broadcast | Mode::BroadcastRing => call.root = root as i32,
            _ => {}
        }
        // SAFETY: the caller's promise.
        unsafe { self.go(stream, a, (DataType::U8, RedOp::Sum), self.blocks(bytes), call) }
    }

    /// All-gather: every rank's `count` elements into `recv` (nranks × `count`, in rank order).
    ///
    /// # Safety
    /// As [`CudaComm::all_reduce_raw`], with `recv` of nranks × `count` elements.
    pub unsafe fn all_gather_raw(
        &self,
        stream: &CudaStream,
        send: u64,
        recv: u64,
        count: usize,
        dt: DataType,
    ) -> Result<()> {
        let host = (HostOp::AllGather, Some(count), Some(count * self.nranks()));
        // SAFETY: the caller's promise.
        unsafe { self.copy_op(stream, Mode::AllGather, (send, recv), count, dt, 0, host) }
    }

    /// Broadcast `count` elements from `root`'s `send` into every rank's `recv`.
    ///
    /// # Safety
    /// As [`CudaComm::all_reduce_raw`] (`send` is read on the root only).
    pub unsafe fn broadcast_raw(
        &self,
        stream: &CudaStream,
        send: u64,
        recv: u64,
        count: usize,
        dt: DataType,
        root: usize,
    ) -> Result<()> {
        self.check_root(root, "root")?;
        let send = if self.rank() == root { send } else { recv };
        let host = (HostOp::Broadcast(root), (self.rank() == root).then_some(count), Some(count));
        let mode = self.broadcast_mode(count, dt)?;
        // SAFETY: the caller's promise.
        unsafe { self.copy_op(stream, mode, (send, recv), count, dt, root as u32, host) }
    }

    /// All-to-all: block p (`count` elements) of `send` goes to rank p, block q of `recv`
    /// comes from rank q.
    ///
    /// # Safety
    /// As [`CudaComm::all_reduce_raw`], with both buffers nranks × `count` elements.
    pub unsafe fn all_to_all_raw(
        &self,
        stream: &CudaStream,
        send: u64,
        recv: u64,
        count: usize,
        dt: DataType,
    ) -> Result<()> {
        let n = self.nranks();
        // SAFETY: the caller's promise.
        unsafe {
            self.copy_op(
                stream,
                Mode::AllToAll,
                (send, recv),
                count,
                dt,
                0,
                (HostOp::AllToAll, Some(count * n), Some(count * n)),
            )
        }
    }

    fn check_peer(&self, peer: usize) -> Result<u32> {
        self.check_root(peer, "peer")?;
        if peer == self.rank() {
            return Err(Error::arg("a device send/recv to this rank itself"));
        }
        Ok(peer as u32)
    }

    /// Sends `count` elements to `peer`, which makes the matching `recv_raw`.
    ///
    /// # Safety
    /// As [`CudaComm::all_reduce_raw`].
    pub unsafe fn send_raw(
        &self,
        stream: &CudaStream,
        send: u64,
        count: usize,
        dt: DataType,
        peer: usize,
    ) -> Result<()> {
        let p = self.check_peer(peer)?;
        // SAFETY: the caller's promise.
        unsafe { self.copy_op(stream, Mode::Send, (send, send), count, dt, p, (HostOp::Send(peer), Some(count), None)) }
    }

    /// Receives `count` elements from `peer` into `recv`.
    ///
    /// # Safety
    /// As [`CudaComm::all_reduce_raw`].
    pub unsafe fn recv_raw(
        &self,
        stream: &CudaStream,
        recv: u64,
        count: usize,
        dt: DataType,
        peer: usize,
    ) -> Result<()> {
        let p = self.check_peer(peer)?;
        // SAFETY: the caller's promise.
        unsafe { self.copy_op(stream, Mode::Recv, (recv, recv), count, dt, p, (HostOp::Recv(peer), None, Some(count))) }
    }

    /// Runs a group's sends and receives on this communicator together, in one launch on
    /// `stream` (NCCL's ncclGroupStart, ncclSend/ncclRecv..., ncclGroupEnd): every peer makes
    /// the matching calls, to each peer in the same order with the same byte counts. A send to
    /// this rank itself is matched, in order, with a receive from it and runs as a device copy.
    /// Stream-ordered and capturable; not for a staged communicator (peers on another host).
    ///
    /// # Safety
    /// As [`CudaComm::all_reduce_raw`], for every operation's buffer and count.
    pub unsafe fn p2p_group_raw(&self, stream: &CudaStream, ops: &[P2p]) -> Result<()> {
        self.check_stream(stream)?;
        if self.staged.is_some() {
            return Err(Error::usage(
                "grouped device send/recv on a communicator with peers on another host: it is staged through host \
                 memory, so run its sends and receives through the host path",
            ));
        }
        let mut transfers = Vec::with_capacity(ops.len());
        let (mut to_me, mut from_me) = (Vec::new(), Vec::new());
        for o in ops {
            self.check_root(o.peer, "peer")?;
            let bytes = self.check_ptrs(o.dt, &[(if o.send { "send" } else { "recv" }, o.buf)], o.count)?;
            if o.peer == self.rank() {
                if o.send { &mut from_me } else { &mut to_me }.push((o.buf, bytes));
                continue;
            }
            transfers.push(Transfer { send: o.send, peer: o.peer as u32, buf: o.buf, bytes });
        }
        if to_me.len() != from_me.len() || to_me.iter().zip(&from_me).any(|(r, s)| r.1 != s.1) {
            return Err(Error::usage(format!(
                "rank {}: {} sends to itself and {} receives from itself in this group, matched in order with \
                 equal byte counts only: make each send to self match a receive of the same size",
                self.rank(),
                from_me.len(),
                to_me.len()
            )));
        }
        let base = self.args(Mode::Send, 0, 0, 0, 0, 0);
        let planned = plan(base, &transfers, self.layout.channels).map_err(err("group sends and receives"))?;
        if !from_me.is_empty() {
            self.ctx
                .bind_to_thread()
                .map_err(|e| Error::sys("cuCtxSetCurrent", std::io::Error::other(format!("{e:?}"))))?;
        }
        for ((dst, bytes), (src, _)) in to_me.iter().zip(&from_me) {
            if *bytes == 0 || dst == src {
                continue;
            }
            // SAFETY: both are device buffers of `bytes` (the caller's promise), on this stream.
            let r = unsafe { cudarc_sys::cuMemcpyDtoDAsync_v2(*dst, *src, *bytes as usize, stream.cu_stream()) };
            if r != cudarc_sys::CUresult::CUDA_SUCCESS {
                return Err(Error::sys(
                    "cuMemcpyDtoDAsync (a send to this rank)",
                    std::io::Error::other(format!("{r:?}")),
                ));
            }
        }
        let Some((args, blocks)) = planned else { return Ok(()) };
        let f = self.comm.fanout();
        // NCCL's RAS counts operations as they are enqueued: so does this.
        let t0 = crate::record::now_ns();
        let profs: Vec<_> = ops
            .iter()
            .filter(|o| o.peer != self.rank())
            .filter_map(|o| {
                let mode = if o.send { Mode::Send } else { Mode::Recv };
                let (func, fi) = func_of(mode);
                let coll = if o.send { CollType::Send } else { CollType::Recv };
                let bytes = (o.count * o.dt.size()) as u64;
                self.comm.record().launch(coll, bytes, t0);
                OpProf::begin_device(f, self.rank(), || OpDescr {
                    func,
                    p2p: true,
                    seq_number: self.seqs[fi].fetch_add(1, std::sync::atomic::Ordering::Relaxed),
                    send_buff: if o.send { o.buf as usize } else { 0 },
                    recv_buff: if o.send { 0 } else { o.buf as usize },
                    count: o.count,
                    root: 0,
                    peer: o.peer as i32,
                    datatype: o.dt.nccl_name(),
                    algo: "DIRECT",
                    proto: "SIMPLE",
                    chunk_size: self.layout.slot_bytes as usize,
                    n_channels: u8::try_from(blocks).unwrap_or(u8::MAX),
                })
            })
            .collect();
        let launch = profs.first().and_then(|p| p.start_launch(stream.cu_stream() as usize));
        // SAFETY: the caller's promise about the buffers; the regions are this communicator's.
        let r = unsafe { self.kernels.launch_p2p(stream, &args, blocks) }.map_err(err("launch grouped send/recv"));
        if let (Ok(()), Some(w)) = (&r, &self.watch) {
            w.launched(capturing(stream));
        }
        if let Some(p) = profs.first() {
            p.stop_launch(launch);
        }
        for o in ops.iter().filter(|o| o.peer != self.rank()) {
            let coll = if o.send { CollType::Send } else { CollType::Recv };
            match &r {
                Ok(()) => self.comm.record().complete(coll),
                Err(e) => f.note(&Note::OpFailed {
                    func: func_of(if o.send { Mode::Send } else { Mode::Recv }).0,
                    kind: e.kind().name(),
                }),
            }
        }
        for p in profs {
            p.end();
        }
        r
    }
}

/// One send or receive of [`CudaComm::p2p_group_raw`]: `count` elements of `dt` at device
/// address `buf`, to (`send`) or from `peer`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct P2p {
    pub send: bool,
    pub peer: usize,
    pub buf: u64,
    pub count: usize,
    pub dt: DataType,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_average_divides_and_a_pre_multiply_sum_carries_its_scalar() {
        let mut a = CollArgs::default();
        assert_eq!(set_op(&mut a, RedOp::Avg.into(), 4), RedOp::Avg);
        assert_eq!((a.div, a.pre), (4, 0));
        let mut a = CollArgs::default();
        assert_eq!(set_op(&mut a, RedOp::Min.into(), 4), RedOp::Min);
        assert_eq!((a.div, a.pre), (0, 0));
        let mut a = CollArgs::default();
        assert_eq!(set_op(&mut a, DevOp::PreMulSum(PreMul::Device(0x2000)), 4), RedOp::Sum);
        assert_eq!((a.div, a.pre, a.scalar), (0, 2, 0x2000));
        let mut a = CollArgs::default();
        assert_eq!(set_op(&mut a, DevOp::PreMulSum(PreMul::Immediate(9)), 2), RedOp::Sum);
        assert_eq!((a.div, a.pre, a.scalar), (0, 1, 9));
    }
}
