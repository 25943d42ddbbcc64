//! The device collectives: each is one `Op`, checked as the host path checks it
//! (`Op::check`), then staged through host memory or turned into one argument block and one
//! kernel on the caller's stream. Buffers are device addresses of this communicator's GPU
//! (NCCL's `void*` arguments); `count` is in elements as in NCCL.

use super::budget::{CtaBudget, CtaPolicy, Launch};
use super::ce::{ce_coll, CeOp, Flows, Route, Share};
use super::comm::CudaComm;
use super::err;
use super::events::{Owner, Slots};
use super::kernels::coll::{CollArgs, Mode, MAX_RANKS};
use super::kernels::cudarc::driver::{sys::CUstreamCaptureStatus, CudaStream};
use super::kernels::memops::Piece;
use super::names::{algo_name, func_of, ras_type};
use super::tune::DevAlgo;
use super::watch::Watch;
use super::windows::{InWindow, Windows};
use super::{kernel_op, DevOp, PreMul};
use crate::dtype::{DataType, RedOp};
use crate::error::{Error, Result};
use crate::op::{check_ptr, Op};
use crate::profile::op::OpDescr;
use crate::profile::OpProf;
use crate::record::CollType;
use occl_telemetry::{EventType, Note};

/// Whether `stream` is capturing a CUDA graph (an error reads as not capturing: the launch
/// then fails or runs on its own).
pub(super) fn capturing(stream: &CudaStream) -> bool {
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

/// The collectives of the device interface: each takes the stream, NCCL's `send`, `recv`,
/// `count` and `dt`, then `op` if it reduces (an operator or a pre-multiply sum) and its other
/// arguments, which name the `Op` builder methods that record them.
macro_rules! device_collectives {
    ($($(#[$attr:meta])* $name:ident => $coll:ident $([$op:ident])? ($($arg:ident: $ty:ty),*);)*) => {$(
        $(#[$attr])*
        #[allow(clippy::too_many_arguments)] // NCCL's argument list
        pub unsafe fn $name(
            &self,
            stream: &CudaStream,
            send: u64,
            recv: u64,
            count: usize,
            dt: DataType,
            $($op: impl Into<DevOp>,)?
            $($arg: $ty),*
        ) -> Result<()> {
            // A reduction's host operator rides on the `Op` (what a staged call runs), the
            // device operator beside it.
            let op: Option<DevOp> = None$(.or(Some($op.into())))?;
            let call = Op::new(CollType::$coll, count, dt, send as usize, recv as usize)$(.$arg($arg))*;
            let call = match op {
                Some(o) => call.op(o.host_op()),
                None => call,
            };
            // SAFETY: the caller's promise.
            unsafe { self.run(stream, call, op) }
        }
    )*};
}

impl CudaComm {
    pub(super) fn args(&self, mode: Mode, input: u64, output: u64, count: u64, stride: u64, total: u64) -> CollArgs {
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

    /// Channels for a call whose per-rank share is `bytes` launched as `launch` (windowed: an
    /// all-gather, out-of-place all-to-all or direct broadcast whose output lies in a symmetric
    /// window): every rank picks the same.
    pub fn channels_for(&self, bytes: u64, launch: Launch) -> u32 {
        self.channels.pick(bytes, launch)
    }

    /// The budget this communicator's calls follow: its settings' one, kept off the copy engines
    /// when two ranks of one process share a GPU (no [`CtaBudget::ce_share`], `CTAPolicy` zero
    /// as efficiency).
    pub fn budget(&self) -> CtaBudget {
        self.channels.budget
    }

    /// The channels and SMs (thread blocks) of this communicator's latest call, as launched:
    /// (0, 0) when it ran on the copy engines ([`CudaComm::on_copy_engines`], or a large
    /// windowed call under the other policies: [`CtaBudget::ce_share`]).
    pub fn last_launch(&self) -> (u32, u32) {
        let c = self.last_channels.load(std::sync::atomic::Ordering::Relaxed);
        (c, self.channels.sms(c))
    }

    /// Whether every call of `coll` runs on the copy engines (`ce/`): all-gather, all-to-all,
    /// broadcast, and sends and receives, lone or grouped (`group.rs`; so gather and scatter,
    /// which NCCL's interface builds of them), under `CTAPolicy` zero, with a peer. Under the
    /// other policies only a large windowed all-gather or all-to-all does
    /// ([`CtaBudget::ce_share`]); [`CudaComm::last_launch`] tells.
    pub fn on_copy_engines(&self, coll: CollType) -> bool {
        self.channels.budget.policy == CtaPolicy::Zero
            && self.nranks() > 1
            && self.channels.budget.on_copy_engines(coll, 0, false)
    }

    pub(super) fn check_stream(&self, stream: &CudaStream) -> Result<()> {
        if stream.context() != &self.ctx {
            return Err(Error::arg("the stream belongs to another GPU than this communicator's"));
        }
        Ok(())
    }

    /// Refuses device work once the watcher stopped this communicator (a dead peer, a stalled
    /// copy-engine call): its error again.
    pub(super) fn check_usable(&self) -> Result<()> {
        match self.watch.as_ref().and_then(Watch::error) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// A device scalar must be a readable element of `dt`, as a buffer must.
    fn check_op(&self, dt: DataType, op: DevOp) -> Result<()> {
        if let DevOp::PreMulSum(PreMul::Device(p)) = op {
            check_ptr("the pre-multiply scalar", p as usize, dt.size(), dt)?;
        }
        Ok(())
    }

    /// Runs one device call (`op`: a reduction's device operator): checked as on the host,
    /// then staged through host memory when a peer is on another host, else one kernel.
    ///
    /// # Safety
    /// As for every raw call: the addresses are this GPU's memory, valid for what the operation
    /// reads and writes until the stream has run it.
    unsafe fn run(&self, stream: &CudaStream, call: Op, op: Option<DevOp>) -> Result<()> {
        if call.is_p2p() && call.peer == Some(self.rank()) {
            return Err(Error::arg("a device send/recv to this rank itself (group it with p2p_group_raw)"));
        }
        let touched = call.check(self.rank(), self.nranks())?;
        if let Some(op) = op {
            self.check_op(call.dt, op)?;
        }
        if call.count == 0 {
            return self.check_stream(stream);
        }
        if let Some(st) = &self.staged {
            self.check_stream(stream)?;
            // SAFETY: the caller's promise about the device buffers.
            return unsafe { st.enqueue(stream, call, op.and_then(DevOp::premul), touched) };
        }
        let mut a = self.kernel_args(&call)?;
        let kop = match op {
            Some(op) => (call.dt, set_op(&mut a, op, self.nranks())),
            // Collectives that only move data move bytes.
            None => (DataType::U8, RedOp::Sum),
        };
        let flows = self.ce_flows(&call, &a);
        let folds = Mode::of_code(a.mode).filter(|m| m.reduces());
        let blocks = if flows.is_some() {
            0
        } else {
            if let Some(win) = kernel_windows(call.coll, &a, self.rank(), self.nranks(), &self.windows) {
                a.win = win;
            }
            // The predicate that picks the windowed kernel picks its channel ceiling; a folding
            // call's is its own.
            let launch = match folds {
                _ if a.windowed() => Launch::Window,
                Some(_) => Launch::Fold,
                None => Launch::Slots,
            };
            self.channels_for((call.count * call.dt.size()) as u64, launch)
        };
        // A reducing launch's share per channel and peer picks how many slots a step takes.
        if let Some(mode) = folds.filter(|_| blocks > 0) {
            let share = a.count.saturating_mul(call.dt.size() as u64) / u64::from(blocks);
            (a.nslots, a.slot_bytes) = self.layout.steps(mode, share);
        }
        // SAFETY: the caller's promise.
        unsafe { self.go(stream, a, kop, blocks, flows.as_ref(), &call) }
    }

    /// The copies of a call that runs on the copy engines (`a`: its kernel arguments, whose
    /// addresses and byte counts it takes): every call that moves bytes under `CTAPolicy` zero,
    /// a large windowed all-gather or all-to-all under the others (`CtaBudget::on_copy_engines`).
    fn ce_flows(&self, call: &Op, a: &CollArgs) -> Option<Flows> {
        self.ce_streams.as_ref()?;
        chosen_flows(&self.channels.budget, call.coll, a, self.rank(), self.nranks(), &self.windows)
    }

    /// The kernel's arguments for `call`: its mode (the tuner's choice), the addresses it
    /// reads and writes on this rank, and the units it moves (elements for a reduction, bytes
    /// otherwise).
    fn kernel_args(&self, call: &Op) -> Result<CollArgs> {
        let (n, es, c) = (self.nranks() as u64, call.dt.size() as u64, call.count as u64);
        let (send, recv, bytes) = (call.send as u64, call.recv as u64, c * es);
        let at_root = call.root == Some(self.rank());
        let mut a = match call.coll {
            CollType::AllReduce => {
                let (mode, unit) = match self.all_reduce_algorithm(call.count, call.dt) {
                    DevAlgo::OneShot => (Mode::AllReduceOneShot, c),
                    DevAlgo::TwoShot => (Mode::AllReduceTwoShot, c.div_ceil(n).next_multiple_of(16 / es)),
                    DevAlgo::Ring => (Mode::AllReduceRing, c.div_ceil(n).next_multiple_of(16 / es)),
                };
                self.args(mode, send, recv, unit, unit, c)
            }
            // The ring clips each block to `total`: all n blocks are whole.
            CollType::ReduceScatter => {
                self.args(self.reduce_scatter_mode(call.count, call.dt)?, send, recv, c, c, c * n)
            }
            CollType::Reduce => {
                self.args(self.reduce_mode(call.count, call.dt)?, send, if at_root { recv } else { send }, c, 0, 0)
            }
            CollType::Broadcast => {
                let mode = self.broadcast_mode(call.count, call.dt)?;
                self.args(mode, if at_root { send } else { recv }, recv, bytes, bytes, 0)
            }
            CollType::AllGather => self.args(Mode::AllGather, send, recv, bytes, bytes, 0),
            CollType::AllToAll => self.args(Mode::AllToAll, send, recv, bytes, bytes, 0),
            CollType::Send => self.args(Mode::Send, send, send, bytes, bytes, 0),
            CollType::Recv => self.args(Mode::Recv, recv, recv, bytes, bytes, 0),
        };
        a.root = call.root.or(call.peer).unwrap_or(0) as u32;
        Ok(a)
    }

    /// Enqueues the launch with its host events (API, Group, Coll/P2p, KernelLaunch) and, when
    /// a sink wants KernelCh, a timer slot for its blocks (`events.rs`); a call on the copy
    /// engines (`flows`), when a sink wants CeColl, is timed instead (`ce/spans.rs`). The events
    /// carry the kernel's addresses and the caller's count and type.
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
        flows: Option<&Flows>,
        call: &Op,
    ) -> Result<()> {
        self.check_stream(stream)?;
        self.check_usable()?;
        self.last_channels.store(blocks, std::sync::atomic::Ordering::Relaxed);
        let f = self.comm.fanout();
        self.flush_events();
        let mode = Mode::of_code(a.mode).ok_or_else(|| Error::internal(format!("device mode {}", a.mode)))?;
        let (func, fi) = func_of(mode);
        let prof = OpProf::begin_device(f, self.rank(), || OpDescr {
            func,
            p2p: matches!(mode, Mode::Send | Mode::Recv),
            seq_number: self.seqs[fi].fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            send_buff: a.input as usize,
            recv_buff: a.output as usize,
            count: call.count,
            root: call.root.unwrap_or(0) as i32,
            peer: call.peer.map_or(-1, |p| p as i32),
            datatype: call.dt.nccl_name(),
            algo: if flows.is_some() { "CE" } else { algo_name(mode) },
            proto: "SIMPLE",
            chunk_size: if flows.is_some() { self.ce.geo.slot_bytes } else { a.slot_bytes } as usize,
            n_channels: u8::try_from(blocks).unwrap_or(u8::MAX),
        });
        let parent = prof.as_ref().filter(|p| p.mask().contains(EventType::KernelCh)).and_then(OpProf::coll_id);
        // Asked of the driver once, and only by what needs it.
        let captured = std::cell::OnceCell::new();
        let captured = || *captured.get_or_init(|| capturing(stream));
        let slot = self.timer_slot(parent.is_some() && flows.is_none(), blocks, captured);
        if let Some(s) = slot {
            a.timers = s.dev;
        }
        if let Some(p) = self.phases.as_ref().filter(|_| flows.is_none() && !captured()) {
            if let Some(dev) = p.take(blocks) {
                a.phases = dev;
            }
        }
        let launch = prof.as_ref().and_then(|p| p.start_launch(stream.cu_stream() as usize));
        // SAFETY: the caller's promise about the buffers; the regions are this communicator's,
        // the timer slot is this launch's alone until its records are collected.
        let r = match flows {
            // SAFETY: as for the kernel; the flows' addresses are the call's.
            Some(f) => {
                // Its CeColl, when a sink wants it (a captured call's is never timed).
                let parent = prof.as_ref().and_then(OpProf::ce_parent).filter(|_| !captured());
                let ops = parent.map(|p| {
                    let (bufs, dt) = ((a.input as usize, a.output as usize), call.dt.nccl_name());
                    let d = ce_coll(func, bufs, call.count, a.root as i32, dt, stream.cu_stream() as usize);
                    vec![(p, d)]
                });
                unsafe { self.enqueue_ce(stream, f, captured(), func, ops.unwrap_or_default()) }
            }
            None => unsafe { self.kernels.launch(stream, &a, dt, kernel_op(op), blocks) }
                .map_err(err("launch a device collective")),
        };
        if let (Ok(()), Some(w)) = (&r, &self.watch) {
            w.launched(captured());
        }
        if let Some(p) = &prof {
            p.stop_launch(launch);
        }
        self.timed(slot, r.is_ok(), || vec![Owner { parent, channels: blocks }]);
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

    /// Enqueues a call's copies on the copy engines (`ce/streams.rs`), watched as `func` and
    /// timed as the CeColl events `ops` (none: untimed).
    ///
    /// # Safety
    /// The addresses in `f` are this GPU's memory, valid until `stream` has run the call.
    pub(super) unsafe fn enqueue_ce(
        &self,
        stream: &CudaStream,
        f: &Flows,
        captured: bool,
        func: &'static str,
        ops: Vec<CeOp>,
    ) -> Result<()> {
        let Some(ce) = &self.ce_streams else {
            return Err(Error::internal("a copy-engine call on a communicator without copy-engine streams"));
        };
        // SAFETY: the caller's promise; the regions are this communicator's.
        unsafe { ce.enqueue(stream, &self.regions, self.rank(), &self.ce, f, captured, func, ops) }
            .map_err(err("enqueue a copy-engine call"))
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

    device_collectives! {
        /// All-reduce of `count` elements from `send` into `recv` (equal: in place). `op` is an
        /// operator or a pre-multiply sum ([`DevOp`]).
        ///
        /// # Safety
        /// `send` and `recv` are device addresses on this GPU of `count` elements each, live until
        /// the stream has run the operation (so is a device scalar of `op`); every rank makes the
        /// same call in the same order.
        all_reduce_raw => AllReduce[op]();
        /// Reduce-scatter: `send` holds nranks blocks of `count`, `recv` gets block `rank` reduced.
        ///
        /// # Safety
        /// As [`CudaComm::all_reduce_raw`], with `send` of nranks × `count` elements.
        reduce_scatter_raw => ReduceScatter[op]();
        /// Reduce into `recv` on `root` (other ranks' `recv` is untouched).
        ///
        /// # Safety
        /// As [`CudaComm::all_reduce_raw`].
        reduce_raw => Reduce[op](root: usize);
        /// All-gather: every rank's `count` elements into `recv` (nranks × `count`, in rank order).
        ///
        /// # Safety
        /// As [`CudaComm::all_reduce_raw`], with `recv` of nranks × `count` elements.
        all_gather_raw => AllGather();
        /// Broadcast `count` elements from `root`'s `send` into every rank's `recv`.
        ///
        /// # Safety
        /// As [`CudaComm::all_reduce_raw`] (`send` is read on the root only).
        broadcast_raw => Broadcast(root: usize);
        /// All-to-all: block p (`count` elements) of `send` goes to rank p, block q of `recv`
        /// comes from rank q.
        ///
        /// # Safety
        /// As [`CudaComm::all_reduce_raw`], with both buffers nranks × `count` elements.
        all_to_all_raw => AllToAll();
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
        // SAFETY: the caller's promise.
        unsafe { self.run(stream, Op::new(CollType::Send, count, dt, send as usize, 0).peer(peer), None) }
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
        // SAFETY: the caller's promise.
        unsafe { self.run(stream, Op::new(CollType::Recv, count, dt, 0, recv as usize).peer(peer), None) }
    }

    /// Timer slots for a launch that writes `records` KernelCh records (one per channel, or per
    /// operation and channel) when someone wants them (`wanted`), and recalibrates the clock map
    /// when it is due. A captured launch replays without the host: it gets none (see events.rs).
    pub(super) fn timer_slot(&self, wanted: bool, records: u32, captured: impl FnOnce() -> bool) -> Option<Slots> {
        let ev = self.events.as_ref().filter(|_| wanted && records > 0)?;
        if captured() {
            return None;
        }
        ev.recalibrate_if_due();
        ev.reserve(records)
    }

    /// Hands a launch's slots to the pending records with their `owners` if the launch was
    /// enqueued, else frees them.
    pub(super) fn timed(&self, slot: Option<Slots>, launched: bool, owners: impl FnOnce() -> Vec<Owner>) {
        if let (Some(ev), Some(s)) = (&self.events, slot) {
            match launched {
                true => ev.launched(s, owners()),
                false => ev.release(s),
            }
        }
    }
}

/// The copies of a call of `coll` (`a`: its kernel arguments) on rank `r` of `n` when `budget`
/// puts it on the copy engines (`CtaBudget::on_copy_engines`: by `CTAPolicy` zero, or as a large
/// windowed all-gather or all-to-all), else `None`: the kernels run it.
fn chosen_flows(
    budget: &CtaBudget,
    coll: CollType,
    a: &CollArgs,
    r: usize,
    n: usize,
    windows: &Windows,
) -> Option<Flows> {
    // The checks that cost nothing first: most calls are not for the copy engines.
    if n < 2 || !budget.on_copy_engines(coll, a.count, true) {
        return None;
    }
    let f = ce_flows(coll, a, r, n, windows)?;
    let windowed = matches!(f.route, Route::Direct(_));
    budget.on_copy_engines(coll, a.count, windowed).then_some(f)
}

/// The copies of `coll` on the copy engines for rank `r` of `n` (`a`: its kernel arguments,
/// whose addresses and byte counts it takes); `None` for a collective they do not run.
///
/// When the output lies wholly in a symmetric window (`windows.rs`), the sends go straight
/// to the same place of each peer's buffer: this rank's block of an all-gather or
/// all-to-all output, a broadcast's whole output. Every rank decides alike as long as every
/// rank's output lies at the same offset of its window, the promise of
/// `NCCL_WIN_COLL_SYMMETRIC` (`ce/mod.rs`). An in-place all-to-all keeps the slots: the
/// block from peer `p` lands where the block for `p` is read, so each side could write
/// only once the other had sent, and each would wait for the other's send.
fn ce_flows(coll: CollType, a: &CollArgs, r: usize, n: usize, windows: &Windows) -> Option<Flows> {
    let peers = || (1..n).map(move |k| (r + k) % n);
    let share = |peer: usize, at: u64| Share { peer, at, bytes: a.count };
    let at = |base: u64, q: usize| base + q as u64 * a.stride;
    let own = |dst: u64, src: u64| Some(Piece { dst, src, n: a.count });
    let slots = |sends, recvs, local| Flows { sends, recvs, local, route: Route::Slots };
    let root = a.root as usize;
    let mut f = match coll {
        CollType::AllGather => slots(
            peers().map(|p| share(p, a.input)).collect(),
            peers().map(|q| share(q, at(a.output, q))).collect(),
            own(at(a.output, r), a.input),
        ),
        CollType::AllToAll => slots(
            peers().map(|p| share(p, at(a.input, p))).collect(),
            peers().map(|q| share(q, at(a.output, q))).collect(),
            own(at(a.output, r), at(a.input, r)),
        ),
        CollType::Broadcast => match r == root {
            true => slots(peers().map(|p| share(p, a.input)).collect(), Vec::new(), own(a.output, a.input)),
            false => slots(Vec::new(), vec![share(root, a.output)], None),
        },
        // A lone send or receive: the peer is the kernel arguments' root.
        CollType::Send => slots(vec![share(root, a.input)], Vec::new(), None),
        CollType::Recv => slots(Vec::new(), vec![share(root, a.output)], None),
        _ => return None,
    };
    if let Some((w, mine)) = in_window(coll, a, r, n, windows) {
        f.route = Route::Direct(f.sends.iter().map(|s| w.at(s.peer, mine)).collect());
    }
    Some(f)
}

/// The symmetric window that holds the whole output of `coll` on rank `r` of `n` (`a`: its
/// kernel arguments), and where this rank's own data lands in that output: the rule by which
/// the copy engines ([`ce_flows`]) and the kernels ([`kernel_windows`]) write straight into the
/// peers' outputs. `None` for other collectives and for an all-to-all whose input overlaps its
/// output (see [`ce_flows`]).
fn in_window(coll: CollType, a: &CollArgs, r: usize, n: usize, windows: &Windows) -> Option<(InWindow, u64)> {
    let blocks = n as u64 * a.stride;
    let (span, mine) = match coll {
        CollType::Broadcast => (a.count, a.output),
        CollType::AllGather | CollType::AllToAll => (blocks, a.output + r as u64 * a.stride),
        _ => return None,
    };
    let overlap = a.input < a.output.saturating_add(blocks) && a.output < a.input.saturating_add(blocks);
    if coll == CollType::AllToAll && overlap {
        return None;
    }
    windows.find(a.output, span).map(|w| (w, mine))
}

/// The windowed kernel mode's addresses ([`CollArgs::win`]) of a kernel call (`a`, the tuner's
/// mode in it) of `coll` on rank `r` of `n`: every rank's place for this rank's share, exactly
/// when [`in_window`] finds the output in a symmetric window, so every rank chooses alike. The
/// kernels have the mode for all-gather, all-to-all and the direct broadcast; the ring
/// broadcast keeps its slots.
fn kernel_windows(coll: CollType, a: &CollArgs, r: usize, n: usize, windows: &Windows) -> Option<[u64; MAX_RANKS]> {
    if !matches!(Mode::of_code(a.mode)?, Mode::AllGather | Mode::AllToAll | Mode::Broadcast) || n > MAX_RANKS {
        return None;
    }
    let (w, mine) = in_window(coll, a, r, n, windows)?;
    let mut win = [0; MAX_RANKS];
    for (p, x) in win.iter_mut().enumerate().take(n) {
        *x = w.at(p, mine);
    }
    Some(win)
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

    /// Rank `r`'s kernel arguments moving `bytes` per block from `input` to `output`.
    fn args(input: u64, output: u64, bytes: u64, root: u32) -> CollArgs {
        CollArgs { input, output, count: bytes, stride: bytes, root, ..CollArgs::default() }
    }

    /// Rank r's window base in [`window_of_three`].
    fn base(q: u64) -> u64 {
        (q + 1) << 30
    }

    /// Rank 1 of 3 with one symmetric window of 1 MiB on every rank, rank q's at `base(q)`:
    /// (n, r, block bytes, windows, the window, an output 8 KiB into this rank's window).
    fn window_of_three() -> (usize, usize, u64, Windows, crate::cuda::WindowId, u64) {
        let w = Windows::default();
        let id = w.add(1, &[base(0), base(1), base(2)], 1 << 20).unwrap();
        (3, 1, 4096, w, id, base(1) + 8192)
    }

    #[test]
    fn a_call_whose_output_lies_in_a_symmetric_window_writes_straight_into_the_peers() {
        let (n, r, blk, w, id, out) = window_of_three();
        // All-gather: this rank's block of every peer's output, at the same offset.
        let f = ce_flows(CollType::AllGather, &args(0x10, out, blk, 0), r, n, &w).unwrap();
        assert_eq!(f.sends.iter().map(|s| s.peer).collect::<Vec<_>>(), [2, 0]);
        assert_eq!(f.route, Route::Direct(vec![base(2) + 8192 + blk, base(0) + 8192 + blk]));
        // In place: still direct.
        let f = ce_flows(CollType::AllGather, &args(out + blk, out, blk, 0), r, n, &w).unwrap();
        assert!(matches!(f.route, Route::Direct(_)));
        // All-to-all out of place: direct; in place, or overlapping, through the slots.
        let f = ce_flows(CollType::AllToAll, &args(0x10, out, blk, 0), r, n, &w).unwrap();
        assert_eq!(f.route, Route::Direct(vec![base(2) + 8192 + blk, base(0) + 8192 + blk]));
        for input in [out, out + blk, out - blk] {
            let f = ce_flows(CollType::AllToAll, &args(input, out, blk, 0), r, n, &w).unwrap();
            assert_eq!(f.route, Route::Slots, "input {input:#x}");
        }
        // Broadcast: the root sends its input to every peer's output; a leaf only receives.
        let f = ce_flows(CollType::Broadcast, &args(0x10, out, blk, 1), r, n, &w).unwrap();
        assert_eq!(f.route, Route::Direct(vec![base(2) + 8192, base(0) + 8192]));
        let f = ce_flows(CollType::Broadcast, &args(out, out, blk, 0), r, n, &w).unwrap();
        assert_eq!(
            (f.recvs.clone(), f.route),
            (vec![Share { peer: 0, at: out, bytes: blk }], Route::Direct(Vec::new()))
        );
        // An output reaching past the window, outside it, or a window removed: the slots.
        let f = ce_flows(CollType::AllGather, &args(0x10, base(1) + (1 << 20) - blk, blk, 0), r, n, &w).unwrap();
        assert_eq!(f.route, Route::Slots);
        let f = ce_flows(CollType::AllGather, &args(0x10, 0x5000, blk, 0), r, n, &w).unwrap();
        assert_eq!(f.route, Route::Slots);
        assert!(w.remove(id));
        let f = ce_flows(CollType::AllToAll, &args(0x10, out, blk, 0), r, n, &w).unwrap();
        assert_eq!(f.route, Route::Slots);
        assert!(ce_flows(CollType::AllReduce, &args(0x10, out, blk, 0), r, n, &w).is_none());
    }

    /// By default the copy engines take an all-gather or all-to-all into a window from
    /// `ce_share` bytes a peer, straight into the peers' windows; every other call, and any call
    /// under a `minCTAs`, runs the kernels. Under `CTAPolicy` zero every call that moves bytes
    /// takes them, windowed or not.
    #[test]
    fn the_budget_puts_large_windowed_gathers_on_the_copy_engines() {
        let (n, r, _, w, _, out) = window_of_three();
        let default = CtaBudget { ce_share: 64 << 10, ..CtaBudget::default() };
        let choose =
            |b: &CtaBudget, coll, input, output, bytes| chosen_flows(b, coll, &args(input, output, bytes, 1), r, n, &w);
        for coll in [CollType::AllGather, CollType::AllToAll] {
            // 64 KiB blocks: three of them lie in the window from `out`.
            let f = choose(&default, coll, 0x10, out, 64 << 10).expect("on the copy engines");
            assert!(matches!(f.route, Route::Direct(_)), "{coll:?}");
            assert!(choose(&default, coll, 0x10, out, (64 << 10) - 16).is_none(), "{coll:?}: below the share");
            assert!(choose(&default, coll, 0x10, 0x5000, 1 << 20).is_none(), "{coll:?}: outside a window");
            let floor = CtaBudget { min_ctas: 1, ..default };
            assert!(choose(&floor, coll, 0x10, out, 64 << 10).is_none(), "{coll:?}: minCTAs");
            let off = CtaBudget { ce_share: 0, ..default };
            assert!(choose(&off, coll, 0x10, out, 64 << 10).is_none(), "{coll:?}: OCCL_CE_MIN_SHARE=0");
        }
        // An in-place all-to-all in the window goes through the slots, so the kernels take it.
        assert!(choose(&default, CollType::AllToAll, out, out, 64 << 10).is_none());
        for coll in [CollType::Broadcast, CollType::AllReduce, CollType::ReduceScatter, CollType::Send] {
            assert!(choose(&default, coll, 0x10, out, 64 << 10).is_none(), "{coll:?}");
        }
        // CTAPolicy zero: every call that moves bytes, through the slots where no window holds it.
        let zero = CtaBudget { policy: CtaPolicy::Zero, ..default };
        let f = choose(&zero, CollType::AllToAll, out, out, 16).expect("zero");
        assert_eq!(f.route, Route::Slots);
        assert!(choose(&zero, CollType::Broadcast, 0x10, 0x5000, 16).is_some());
        assert!(choose(&zero, CollType::AllReduce, 0x10, out, 1 << 20).is_none());
        // One rank alone has no peer to copy to.
        assert!(chosen_flows(&zero, CollType::AllGather, &args(0x10, out, 16, 0), 0, 1, &w).is_none());
    }

    #[test]
    fn a_kernel_call_takes_the_windowed_mode_exactly_when_the_copy_engines_would_go_direct() {
        // The kernels' addresses are the copy engines' direct route with this rank's own part at
        // its index.
        let (n, r, blk, w, id, out) = window_of_three();
        let kargs = |mode: Mode, input: u64, output: u64, root: u32| CollArgs {
            mode: mode as u32,
            ..args(input, output, blk, root)
        };
        let mine = |q: u64| base(q) + 8192 + blk;
        let mut three = [0; MAX_RANKS];
        three[..3].copy_from_slice(&[mine(0), mine(1), mine(2)]);
        let win = |coll, a: &CollArgs| kernel_windows(coll, a, r, n, &w);
        // All-gather out of place and in place (the input is this rank's block of the output).
        assert_eq!(win(CollType::AllGather, &kargs(Mode::AllGather, 0x10, out, 0)), Some(three));
        assert_eq!(win(CollType::AllGather, &kargs(Mode::AllGather, out + blk, out, 0)), Some(three));
        // All-to-all out of place; in place or overlapping keeps the slots.
        assert_eq!(win(CollType::AllToAll, &kargs(Mode::AllToAll, 0x10, out, 0)), Some(three));
        for input in [out, out + blk, out - blk] {
            assert_eq!(win(CollType::AllToAll, &kargs(Mode::AllToAll, input, out, 0)), None, "input {input:#x}");
        }
        // Broadcast: the whole output at the same offset everywhere, on the root and on a leaf;
        // the ring broadcast keeps its slots.
        let mut whole = [0; MAX_RANKS];
        whole[..3].copy_from_slice(&[base(0) + 8192, base(1) + 8192, base(2) + 8192]);
        assert_eq!(win(CollType::Broadcast, &kargs(Mode::Broadcast, 0x10, out, 1)), Some(whole));
        assert_eq!(win(CollType::Broadcast, &kargs(Mode::Broadcast, out, out, 0)), Some(whole));
        assert_eq!(win(CollType::Broadcast, &kargs(Mode::BroadcastRing, 0x10, out, 1)), None);
        // The same rule as the copy engines' direct route, call for call.
        for (coll, mode, input) in [
            (CollType::AllGather, Mode::AllGather, 0x10),
            (CollType::AllToAll, Mode::AllToAll, 0x10),
            (CollType::AllToAll, Mode::AllToAll, out),
            (CollType::Broadcast, Mode::Broadcast, 0x10),
        ] {
            for output in [out, base(1) + (1 << 20) - blk, 0x5000] {
                let a = kargs(mode, input, output, 1);
                let ce = ce_flows(coll, &a, r, n, &w).unwrap();
                let direct = matches!(ce.route, Route::Direct(_));
                assert_eq!(win(coll, &a).is_some(), direct, "{coll:?} {input:#x} -> {output:#x}");
                if let (Route::Direct(to), Some(k)) = (&ce.route, win(coll, &a)) {
                    assert!(ce.sends.iter().zip(to).all(|(s, &at)| k[s.peer] == at), "{coll:?}");
                }
            }
        }
        // Outside a window, past its end, a reduction, or the window removed: the slots.
        assert_eq!(win(CollType::AllGather, &kargs(Mode::AllGather, 0x10, 0x5000, 0)), None);
        assert_eq!(win(CollType::AllGather, &kargs(Mode::AllGather, 0x10, base(1) + (1 << 20) - blk, 0)), None);
        assert_eq!(win(CollType::AllReduce, &kargs(Mode::AllReduceOneShot, 0x10, out, 0)), None);
        assert_eq!(win(CollType::ReduceScatter, &kargs(Mode::ReduceScatter, 0x10, out, 0)), None);
        assert!(w.remove(id));
        assert_eq!(win(CollType::AllGather, &kargs(Mode::AllGather, 0x10, out, 0)), None);
    }
}
