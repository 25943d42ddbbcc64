//! The events of one operation, in NCCL's hierarchy and order (reference §10–11):
//!
//! ```text
//! GroupApi (depth 1: the implicit group of a single call)  StartApiStop … EndApiStart
//!                            (a user's group: one GroupApi over all its calls, `group.rs`)
//! ├─ CollApi | P2pApi        the call's enqueue work (argument checks, plan)
//! └─ (parent CollApi/P2pApi, parentGroup = Group)
//!    Coll | P2p              the plan; open while the calling thread runs it
//!    └─ ProxyOp              one per peer and direction (channel 0), nSteps from the plan,
//!       │                    InProgress at its first step
//!       └─ ProxyStep         one per slice: send SendGPUWait → SendPeerWait → SendWait;
//!                            receive RecvWait → RecvFlushWait → RecvGPUWait
//!                            (or, for sinks that want only step sums, one `step_totals`
//!                            per shm ProxyOp at its end: see `Steps`)
//! ProxyCtrl                  Active/Idle markers, Append…AppendEnd(n) around the ProxyOp
//!                            starts, Sleep → Wakeup around every blocking wait
//! ```
//!
//! occl's host collectives have no proxy thread: the calling thread moves every slice (and
//! drives the tcp sockets), so it is the progress engine these events describe, and ProxyOps
//! start while their Coll is still open instead of after its stop.

use crate::transport::fifo::{RecvFifo, SendFifo};
use crate::wait::Sleeper;
use occl_events::event::{ProxyCtrlState, ProxyOpState, ProxyStepState};
use occl_events::fanout::View;
use occl_events::{
    EventDescr, EventId, EventMask, EventType, Fanout, GroupApiState, Note, OpTotals, StateArgs, StepTotals,
};
use std::cell::Cell;

/// One planned ProxyOp: a peer, a direction, and how many slices cross it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Leg {
    pub peer: usize,
    pub send: bool,
    pub steps: usize,
}

/// A started ProxyOp and the steps it has seen.
pub(crate) struct LegEv {
    peer: usize,
    send: bool,
    id: Option<EventId>,
    next_step: Cell<i32>,
    progressing: Cell<bool>,
    /// The transport to the peer ("shm", "tcp") and the bytes its steps moved, told to the sinks
    /// at the end (`Note::TransportBytes`: no event carries the transport).
    transport: &'static str,
    bytes: Cell<u64>,
    /// Its steps are summed into `totals` (handed to the sinks at the op's end) instead of sent
    /// as ProxyStep events: the sinks want only sums, and posting is delivery (shm), so a step
    /// ends on this thread. A tcp leg's steps end on the socket writer and parent its NetPlugin
    /// events: they stay events.
    sum: bool,
    totals: Cell<StepTotals>,
}

thread_local! {
    /// The leg vector of the last operation this thread ended, emptied: the next one fills it
    /// instead of allocating (a profiled 8 B call takes a few hundred ns in all).
    static SPARE_LEGS: Cell<Vec<LegEv>> = const { Cell::new(Vec::new()) };
}

/// The most legs a kept vector holds (an all-to-all of thousands of ranks allocates its own).
const SPARE_LEGS_MAX: usize = 64;

/// Where a summed step is: its state (index in `StepTotals::STATES`) since `t_ns`.
#[derive(Clone, Copy)]
struct Mark {
    state: usize,
    t_ns: u64,
}

const SEND_GPU_WAIT: usize = StepTotals::index(ProxyStepState::SendGpuWait);
const SEND_PEER_WAIT: usize = StepTotals::index(ProxyStepState::SendPeerWait);
const RECV_WAIT: usize = StepTotals::index(ProxyStepState::RecvWait);
const RECV_GPU_WAIT: usize = StepTotals::index(ProxyStepState::RecvGpuWait);

impl LegEv {
    fn new(l: &Leg, id: Option<EventId>, transport: &'static str, sum: bool) -> LegEv {
        LegEv {
            peer: l.peer,
            send: l.send,
            id,
            next_step: Cell::new(0),
            progressing: Cell::new(false),
            transport,
            bytes: Cell::new(0),
            sum,
            totals: Cell::new(StepTotals { send: l.send, ..StepTotals::default() }),
        }
    }

    /// Adds the time from `m` to `now` to its state (and `bytes`, and a step if `done`); returns
    /// `now`.
    fn add(&self, m: Mark, now: u64, bytes: usize, done: bool) -> u64 {
        let mut t = self.totals.get();
        t.wait_ns[m.state] = t.wait_ns[m.state].saturating_add(now.saturating_sub(m.t_ns));
        t.bytes = t.bytes.saturating_add(bytes as u64);
        t.steps = t.steps.saturating_add(u32::from(done));
        self.totals.set(t);
        now
    }
}

/// What the operation is, for its descriptors.
pub(crate) struct OpDescr<'s> {
    pub func: &'s str,
    /// A point-to-point call (Send/Recv): P2pApi and P2p instead of CollApi and Coll.
    pub p2p: bool,
    pub seq_number: u64,
    pub send_buff: usize,
    pub recv_buff: usize,
    pub count: usize,
    pub root: i32,
    pub peer: i32,
    pub datatype: &'s str,
    pub algo: &'s str,
    pub proto: &'s str,
    /// Bytes per slice (the ProxyOp's chunkSize).
    pub chunk_size: usize,
    /// Channels the operation runs on (the thread blocks of a device operation; 1 on the host).
    pub n_channels: u8,
}

impl<'s> OpDescr<'s> {
    /// Its Coll or P2p descriptor.
    fn event(&self, rank: i32, parent_group: Option<EventId>) -> EventDescr<'s> {
        if self.p2p {
            EventDescr::P2p {
                rank,
                func: self.func,
                buff: self.send_buff.max(self.recv_buff),
                datatype: self.datatype,
                count: self.count,
                peer: self.peer,
                n_channels: self.n_channels,
                parent_group,
            }
        } else {
            EventDescr::Coll {
                rank,
                seq_number: self.seq_number,
                func: self.func,
                send_buff: self.send_buff,
                recv_buff: self.recv_buff,
                count: self.count,
                root: self.root,
                datatype: self.datatype,
                n_channels: self.n_channels,
                n_warps: 0,
                algo: self.algo,
                proto: self.proto,
                parent_group,
            }
        }
    }
}

/// The events of one operation in flight, with the mask it captured at its start and the sinks
/// attached then (a view: its callbacks take no lock; detaching a sink waits for the operation).
pub(crate) struct OpProf<'f> {
    f: View<'f>,
    mask: EventMask,
    rank: i32,
    /// The implicit group's GroupApi and Group events, which this operation owns and stops (a
    /// grouped operation's belong to its group).
    group_api: Option<EventId>,
    group: Option<EventId>,
    /// The Group event named in the Coll/P2p descriptor (`parentGroup`).
    parent_group: Option<EventId>,
    /// Emits the progress engine's Active/Idle markers around the operation (a group emits
    /// them once around all its operations).
    markers: bool,
    /// The call's API event (CollApi or P2pApi): the parent of its CeColl (NCCL's v6 hierarchy).
    api: Option<EventId>,
    coll: Option<EventId>,
    legs: Vec<LegEv>,
    /// The last clock reading its summed steps took (0 before the first): a step that begins
    /// right where the previous one ended starts from it (`Steps::chained`).
    last_ns: Cell<u64>,
    /// Set when every sink takes whole-operation sums and this operation can be summed: no
    /// event at all, one `op_totals` at the end.
    summed: Option<Summed>,
}

/// A summed operation: its Coll/P2p descriptor and start (span clock).
struct Summed {
    descr: EventDescr<'static>,
    start_ns: u64,
}

/// Starts and stops the call's API event (CollApi or P2pApi) under `group_api`: the enqueue
/// work of the call. Its Coll/P2p starts later, with it as parent (NCCL's v5 hierarchy).
pub(crate) fn api_event(f: &Fanout, mask: EventMask, group_api: Option<EventId>, d: &OpDescr<'_>) -> Option<EventId> {
    let descr = if d.p2p {
        EventDescr::P2pApi { func: d.func, count: d.count, datatype: d.datatype, stream: 0, graph_captured: false }
    } else {
        EventDescr::CollApi {
            func: d.func,
            count: d.count,
            datatype: d.datatype,
            root: d.root,
            stream: 0,
            graph_captured: false,
        }
    };
    if !mask.contains(descr.event_type()) {
        return None;
    }
    let id = f.start(group_api, &descr);
    if let Some(id) = id {
        f.stop(id);
    }
    id
}

/// A zero-length ProxyCtrl event in state `st` (the progress engine turning active or idle).
pub(crate) fn marker(f: &Fanout, mask: EventMask, st: ProxyCtrlState) {
    if mask.contains(EventType::ProxyCtrl) {
        if let Some(id) = f.start(None, &EventDescr::ProxyCtrl) {
            f.state(id, &StateArgs::ProxyCtrl { state: st, appended_proxy_ops: 0 });
            f.stop(id);
        }
    }
}

impl<'f> OpProf<'f> {
    /// An operation with no events started yet, under the Group `parent_group`.
    fn empty(f: &'f Fanout, mask: EventMask, rank: usize, parent_group: Option<EventId>, markers: bool) -> Self {
        let (group_api, group, api, coll) = (None, None, None, None);
        OpProf {
            f: f.view(),
            mask,
            rank: rank as i32,
            group_api,
            group,
            parent_group,
            markers,
            api,
            coll,
            legs: SPARE_LEGS.take(),
            last_ns: Cell::new(0),
            summed: None,
        }
    }

    /// An operation handed to the sinks as one [`OpTotals`] at its end: its legs' steps are
    /// summed (the mask keeps only that), no event is started.
    fn summed(
        f: &'f Fanout,
        rank: usize,
        d: &OpDescr<'static>,
        legs: Vec<Leg>,
        transport: impl Fn(usize) -> &'static str,
    ) -> Self {
        let mut p = OpProf::empty(f, EventMask::STEP_TOTALS, rank, None, false);
        p.summed = Some(Summed { descr: d.event(rank as i32, None), start_ns: occl_events::unix_nanos() });
        p.legs.extend(legs.iter().map(|l| LegEv::new(l, None, transport(l.peer), true)));
        p
    }

    /// Emits the API, Group and Coll/P2p events and starts one ProxyOp per leg. `None` (nothing
    /// emitted) when no sink wants anything.
    /// `describe`, `legs` and `transport` (the transport's name to a peer) run only when some sink
    /// wants events: with none, this is one relaxed load and a branch. An operation that a group
    /// runs (`crate::group`) gets its Coll/P2p under the events the group emitted for it, with
    /// the mask captured when it was enqueued.
    pub(crate) fn begin(
        f: &'f Fanout,
        rank: usize,
        describe: impl FnOnce() -> OpDescr<'static>,
        legs: impl FnOnce() -> Vec<Leg>,
        transport: impl Fn(usize) -> &'static str,
    ) -> Option<OpProf<'f>> {
        let mask = f.capture();
        if mask.is_empty() {
            return None;
        }
        if let Some(g) = super::running::enclosing(f) {
            return OpProf::within(f, g.mask, rank, g.api, g.group, describe, legs, transport);
        }
        let d = &describe();
        let mut legs = Some(legs);
        let mut planned = None;
        if mask.wants_op_totals() {
            // Every sink takes operation sums; they can be had when every leg's steps end on
            // this thread (shm and threads; a tcp step ends on the socket writer).
            let l = legs.take().map_or_else(Vec::new, |f| f());
            if l.iter().all(|l| transport(l.peer) == "shm") {
                return Some(OpProf::summed(f, rank, d, l, transport));
            }
            planned = Some(l);
        }
        let legs = move || planned.or_else(|| legs.take().map(|f| f())).unwrap_or_default();
        let mut p = OpProf::empty(f, mask, rank, None, true);
        marker(f, mask, ProxyCtrlState::Active);
        p.open_alone(f, d, legs, transport);
        Some(p)
    }

    /// An operation outside any group: its own GroupApi (through the API event), Group, then
    /// `open`'s Coll/P2p and ProxyOps, in NCCL's order.
    fn open_alone(
        &mut self,
        f: &Fanout,
        d: &OpDescr<'_>,
        legs: impl FnOnce() -> Vec<Leg>,
        transport: impl Fn(usize) -> &'static str,
    ) {
        self.group_api = self.start(None, &EventDescr::GroupApi { graph_captured: false, group_depth: 1 });
        self.state(self.group_api, &StateArgs::GroupApi { state: GroupApiState::StartApiStop });
        let api = api_event(f, self.mask, self.group_api, d);
        self.state(self.group_api, &StateArgs::GroupApi { state: GroupApiState::EndApiStart });
        self.group = self.start(None, &EventDescr::Group);
        self.parent_group = self.group;
        self.open(api, d, legs, transport);
    }

    /// The host events of a device operation, in NCCL's order for a GPU collective: GroupApi,
    /// CollApi/P2pApi, Group and Coll/P2p at enqueue (stopped by [`OpProf::end`] once the launch
    /// returned), no ProxyOp (the kernel is its own progress engine); its KernelCh events come
    /// later from the device's records (`crate::cuda::events`), with [`OpProf::coll_id`] as
    /// parent. Never summed: a device operation's time is the kernel's, not the enqueue's.
    #[cfg(feature = "cuda")]
    pub(crate) fn begin_device(
        f: &'f Fanout,
        rank: usize,
        describe: impl FnOnce() -> OpDescr<'static>,
    ) -> Option<OpProf<'f>> {
        let mask = f.capture();
        if mask.is_empty() || mask.0 & !EventMask::OP_TOTALS.0 & !EventMask::STEP_TOTALS.0 == 0 {
            return None;
        }
        if let Some(g) = super::running::enclosing(f) {
            return OpProf::within(f, g.mask, rank, g.api, g.group, describe, Vec::new, |_| "cuda-p2p");
        }
        let d = &describe();
        let mut p = OpProf::empty(f, mask, rank, None, false);
        p.open_alone(f, d, Vec::new, |_| "cuda-p2p");
        Some(p)
    }

    /// The operation's Coll/P2p event, if a sink wants it.
    #[cfg(feature = "cuda")]
    pub(crate) fn coll_id(&self) -> Option<EventId> {
        self.coll
    }

    /// The parent of the operation's CeColl (its API event) when a sink wants CeColl events:
    /// `Some(None)` when the API event itself is not wanted.
    #[cfg(feature = "cuda")]
    pub(crate) fn ce_parent(&self) -> Option<Option<EventId>> {
        self.on(EventType::CeColl).then_some(self.api)
    }

    /// The mask the operation captured.
    #[cfg(feature = "cuda")]
    pub(crate) fn mask(&self) -> EventMask {
        self.mask
    }

    /// Starts the KernelLaunch event (child of the GroupApi, as in NCCL) around a launch on
    /// `stream`; stop it with [`OpProf::stop_launch`].
    #[cfg(feature = "cuda")]
    pub(crate) fn start_launch(&self, stream: usize) -> Option<EventId> {
        self.start(self.group_api, &EventDescr::KernelLaunch { stream })
    }

    #[cfg(feature = "cuda")]
    pub(crate) fn stop_launch(&self, id: Option<EventId>) {
        self.stop(id);
    }

    /// The Coll/P2p and ProxyOps of an operation that a group runs: the group emitted its
    /// GroupApi, the call's API event (`api`) and the Group (`group`), and captured `mask` when
    /// the call was enqueued.
    #[allow(clippy::too_many_arguments)] // begin's arguments and the group's three
    pub(crate) fn within<'d>(
        f: &'f Fanout,
        mask: EventMask,
        rank: usize,
        api: Option<EventId>,
        group: Option<EventId>,
        describe: impl FnOnce() -> OpDescr<'d>,
        legs: impl FnOnce() -> Vec<Leg>,
        transport: impl Fn(usize) -> &'static str,
    ) -> Option<OpProf<'f>> {
        if mask.is_empty() {
            return None;
        }
        let mut p = OpProf::empty(f, mask, rank, group, false);
        p.open(api, &describe(), legs, transport);
        Some(p)
    }

    /// Starts the Coll/P2p (child of the API event `api`) and one ProxyOp per leg.
    fn open(
        &mut self,
        api: Option<EventId>,
        d: &OpDescr<'_>,
        legs: impl FnOnce() -> Vec<Leg>,
        transport: impl Fn(usize) -> &'static str,
    ) {
        let rank = self.rank;
        let p = self;
        p.api = api;
        p.coll = p.start(api, &d.event(rank, p.parent_group));
        let legs = if p.on(EventType::ProxyOp) { legs() } else { Vec::new() };
        let sums = p.mask.wants_totals() && !p.on(EventType::ProxyStep);
        if !legs.is_empty() {
            let ctrl = p.start(None, &EventDescr::ProxyCtrl);
            p.state(ctrl, &StateArgs::ProxyCtrl { state: ProxyCtrlState::Append, appended_proxy_ops: 0 });
            let pid = std::process::id() as i32;
            for l in &legs {
                let id = p.start(
                    p.coll,
                    &EventDescr::ProxyOp {
                        rank,
                        pid,
                        channel_id: 0,
                        peer: l.peer as i32,
                        n_steps: l.steps.min(i32::MAX as usize) as i32,
                        chunk_size: d.chunk_size.min(i32::MAX as usize) as i32,
                        is_send: l.send,
                    },
                );
                let transport = transport(l.peer);
                p.legs.push(LegEv::new(l, id, transport, sums && transport == "shm"));
            }
            let n = p.legs.len() as i32;
            p.state(ctrl, &StateArgs::ProxyCtrl { state: ProxyCtrlState::AppendEnd, appended_proxy_ops: n });
            p.stop(ctrl);
        }
    }

    #[inline]
    fn on(&self, t: EventType) -> bool {
        self.mask.contains(t)
    }

    fn start(&self, parent: Option<EventId>, d: &EventDescr<'_>) -> Option<EventId> {
        if !self.on(d.event_type()) {
            return None;
        }
        self.f.start(parent, d)
    }

    fn state(&self, id: Option<EventId>, st: &StateArgs<'_>) {
        if let Some(id) = id {
            self.f.state(id, st);
        }
    }

    fn stop(&self, id: Option<EventId>) {
        if let Some(id) = id {
            self.f.stop(id);
        }
    }

    /// The ProxyOp of `peer` in direction `send`, if one was planned.
    pub(crate) fn leg(&self, peer: usize, send: bool) -> Option<&LegEv> {
        self.legs.iter().find(|l| l.peer == peer && l.send == send && (l.id.is_some() || l.sum))
    }

    /// Whether ProxyCtrl sleep/wake-up events are wanted.
    pub(crate) fn sleeper(&self) -> Option<&dyn Sleeper> {
        self.on(EventType::ProxyCtrl).then_some(self as &dyn Sleeper)
    }

    /// Step events for primitives that send to `to` and receive from `from`.
    pub(crate) fn steps(&self, to: Option<usize>, from: Option<usize>) -> Option<Steps<'_>> {
        if !self.on(EventType::ProxyStep) && !self.mask.wants_totals() {
            // ProxyOps still get InProgress when their first slice moves.
            let send = to.and_then(|p| self.leg(p, true));
            let recv = from.and_then(|p| self.leg(p, false));
            send.into_iter().chain(recv).for_each(|l| self.in_progress(l));
            return None;
        }
        Some(Steps {
            p: self,
            send: to.and_then(|p| self.leg(p, true)),
            recv: from.and_then(|p| self.leg(p, false)),
            cur_send: None,
            cur_recv: None,
            send_mark: None,
            recv_mark: None,
            chained: false,
        })
    }

    fn in_progress(&self, l: &LegEv) {
        if !l.progressing.replace(true) {
            self.state(l.id, &StateArgs::ProxyOp { state: ProxyOpState::InProgress, trans_size: 0, steps: 0 });
        }
    }

    /// Stops the ProxyOps (every slice has moved, tcp sends included), then Coll/P2p, Group and
    /// GroupApi, and tells the sinks the bytes each leg's transport moved. Runs on failure too, so
    /// no event stays open.
    pub(crate) fn end(mut self) {
        self.end_events();
        let mut legs = std::mem::take(&mut self.legs);
        if legs.capacity() <= SPARE_LEGS_MAX {
            legs.clear();
            SPARE_LEGS.set(legs);
        }
    }

    fn end_events(&self) {
        if let Some(s) = &self.summed {
            self.end_summed(s);
            return;
        }
        for l in &self.legs {
            if let (true, Some(id)) = (l.sum, l.id) {
                let t = l.totals.get();
                if t.steps > 0 {
                    self.f.step_totals(id, &t);
                }
            }
            self.stop(l.id);
        }
        for l in self.legs.iter().filter(|l| l.bytes.get() > 0) {
            self.f.note(&Note::TransportBytes { transport: l.transport, send: l.send, bytes: l.bytes.get() });
        }
        self.stop(self.coll);
        self.stop(self.group);
        self.stop(self.group_api);
        if self.markers && self.mask.contains(EventType::ProxyCtrl) {
            if let Some(id) = self.f.start(None, &EventDescr::ProxyCtrl) {
                self.f.state(id, &StateArgs::ProxyCtrl { state: ProxyCtrlState::Idle, appended_proxy_ops: 0 });
                self.f.stop(id);
            }
        }
    }
}

impl OpProf<'_> {
    /// The one call a summed operation makes: its legs' step sums by direction and its bytes by
    /// transport and direction.
    fn end_summed(&self, s: &Summed) {
        let mut steps = [StepTotals { send: true, ..StepTotals::default() }, StepTotals::default()];
        let mut bytes: [(&'static str, bool, u64); 4] = [("", false, 0); 4];
        let mut n = 0;
        for l in &self.legs {
            let t = l.totals.get();
            let d = &mut steps[usize::from(!l.send)];
            d.steps = d.steps.saturating_add(t.steps);
            d.bytes = d.bytes.saturating_add(t.bytes);
            for (w, x) in d.wait_ns.iter_mut().zip(t.wait_ns) {
                *w = w.saturating_add(x);
            }
            let b = l.bytes.get();
            if b == 0 {
                continue;
            }
            if let Some(e) = bytes[..n].iter_mut().find(|(tr, send, _)| *tr == l.transport && *send == l.send) {
                e.2 += b;
            } else if let Some(e) = bytes.get_mut(n) {
                *e = (l.transport, l.send, b);
                n += 1;
            }
        }
        let end_ns = occl_events::unix_nanos();
        self.f.op_totals(&OpTotals {
            descr: s.descr,
            start_ns: s.start_ns,
            end_ns,
            steps,
            transport_bytes: &bytes[..n],
        });
    }
}

impl Sleeper for OpProf<'_> {
    fn sleep(&self) -> Option<EventId> {
        let id = self.start(None, &EventDescr::ProxyCtrl);
        self.state(id, &StateArgs::ProxyCtrl { state: ProxyCtrlState::Sleep, appended_proxy_ops: 0 });
        id
    }

    fn woke(&self, id: Option<EventId>) {
        self.state(id, &StateArgs::ProxyCtrl { state: ProxyCtrlState::Wakeup, appended_proxy_ops: 0 });
        self.stop(id);
    }
}

/// ProxyStep events of one primitive's slices: at most one open step per direction. A leg whose
/// steps are summed (`LegEv::sum`) gets no events: each state change reads the clock once and
/// adds the time in the state it leaves to the leg's sums.
pub(crate) struct Steps<'a> {
    p: &'a OpProf<'a>,
    send: Option<&'a LegEv>,
    recv: Option<&'a LegEv>,
    cur_send: Option<EventId>,
    cur_recv: Option<EventId>,
    send_mark: Option<Mark>,
    recv_mark: Option<Mark>,
    /// Its first summed mark takes the operation's last reading instead of the clock's.
    chained: bool,
}

impl Steps<'_> {
    fn begin(&self, l: &LegEv, first: ProxyStepState) -> Option<EventId> {
        self.p.in_progress(l);
        let step = l.next_step.get();
        l.next_step.set(step + 1);
        // Not `p.start`: a tcp leg's steps go to sinks that want only sums too (the route bits).
        let id = l.id.and_then(|op| self.p.f.start(Some(op), &EventDescr::ProxyStep { rank: self.p.rank, step }));
        self.p.state(id, &StateArgs::ProxyStep { state: first, trans_size: 0 });
        id
    }

    /// Steps that begin where the operation's previous summed step ended, with nothing but
    /// bookkeeping in between (the one-step all-reduce's next peer): the first mark reuses that
    /// step's last clock reading instead of taking one (a read is 10-30 ns; a profiled 8 B
    /// all-reduce over 4 ranks took 14). With no step before it, the mark reads the clock.
    pub(crate) fn chained(mut self) -> Self {
        self.chained = true;
        self
    }

    /// The span clock, read and kept as the operation's last reading.
    fn now(&self) -> u64 {
        let t = occl_events::unix_nanos();
        self.p.last_ns.set(t);
        t
    }

    /// A summed step of `l` begins in state `state`.
    fn mark(&mut self, l: &LegEv, state: usize) -> Option<Mark> {
        self.p.in_progress(l);
        let last = self.p.last_ns.get();
        let t_ns = if std::mem::take(&mut self.chained) && last != 0 { last } else { self.now() };
        Some(Mark { state, t_ns })
    }

    /// A slice to send begins: its data is not produced yet (SendGPUWait).
    pub(crate) fn send_begin(&mut self) {
        if self.cur_send.is_some() || self.send_mark.is_some() {
            return;
        }
        match self.send {
            Some(l) if l.sum => self.send_mark = self.mark(l, SEND_GPU_WAIT),
            Some(l) => self.cur_send = self.begin(l, ProxyStepState::SendGpuWait),
            None => {}
        }
    }

    /// The slice's data is ready; waiting for the receiver's credit (a free slot).
    pub(crate) fn send_peer_wait(&mut self) {
        if let Some(l) = self.send.filter(|l| l.sum) {
            // Summed: a step that begins here had its data ready (no SendGPUWait), so one clock
            // read starts it in SendPeerWait.
            self.send_mark = match self.send_mark {
                Some(m) => Some(Mark { state: SEND_PEER_WAIT, t_ns: l.add(m, self.now(), 0, false) }),
                None => self.mark(l, SEND_PEER_WAIT),
            };
            return;
        }
        self.send_begin();
        self.p.state(self.cur_send, &StateArgs::ProxyStep { state: ProxyStepState::SendPeerWait, trans_size: 0 });
    }

    /// The slice was posted (`n` bytes). Over shm that is delivery: the step ends (summed, its
    /// SendWait is 0). Over tcp the socket writer (driven by this thread before the operation
    /// returns) ends it once the frame is on the wire.
    pub(crate) fn send_posted(&mut self, n: usize, fifo: &SendFifo) {
        if let Some(l) = self.send {
            l.bytes.set(l.bytes.get() + n as u64);
            if let Some(m) = self.send_mark.take() {
                l.add(m, self.now(), n, true);
                return;
            }
        }
        let id = self.cur_send.take();
        self.p.state(id, &StateArgs::ProxyStep { state: ProxyStepState::SendWait, trans_size: n });
        if let Some(id) = id {
            if !fifo.hand_step(id.get()) {
                self.p.f.stop(id);
            }
        }
    }

    /// A slice to receive is expected (RecvWait); a tcp reader learns which step waits.
    pub(crate) fn recv_begin(&mut self, fifo: &RecvFifo) {
        if self.cur_recv.is_some() || self.recv_mark.is_some() {
            return;
        }
        match self.recv {
            Some(l) if l.sum => self.recv_mark = self.mark(l, RECV_WAIT),
            Some(l) => {
                self.cur_recv = self.begin(l, ProxyStepState::RecvWait);
                if let Some(id) = self.cur_recv {
                    fifo.waiting_step(id.get());
                }
            }
            None => {}
        }
    }

    /// `n` bytes arrived (RecvFlushWait with the size: host memory needs no flush) and go to the
    /// consumer (RecvGPUWait: the reduction or copy that reads them).
    pub(crate) fn recv_arrived(&mut self, n: usize) {
        if let Some(l) = self.recv {
            l.bytes.set(l.bytes.get() + n as u64);
            // Summed: RecvWait ends, RecvFlushWait takes no time, RecvGPUWait begins.
            if let Some(m) = self.recv_mark {
                self.recv_mark = Some(Mark { state: RECV_GPU_WAIT, t_ns: l.add(m, self.now(), n, false) });
                return;
            }
        }
        self.p.state(self.cur_recv, &StateArgs::ProxyStep { state: ProxyStepState::RecvFlushWait, trans_size: n });
        self.p.state(self.cur_recv, &StateArgs::ProxyStep { state: ProxyStepState::RecvGpuWait, trans_size: n });
    }

    /// The slice was consumed and its slot released.
    pub(crate) fn recv_done(&mut self) {
        if let (Some(l), Some(m)) = (self.recv, self.recv_mark.take()) {
            l.add(m, self.now(), 0, true);
        }
        self.p.stop(self.cur_recv.take());
    }
}

impl Drop for Steps<'_> {
    /// A primitive that fails leaves no step open (a summed one counts, as a stopped event
    /// would).
    fn drop(&mut self) {
        self.p.stop(self.cur_send.take());
        self.p.stop(self.cur_recv.take());
        for (l, m) in [(self.send, self.send_mark.take()), (self.recv, self.recv_mark.take())] {
            if let (Some(l), Some(m)) = (l, m) {
                l.add(m, self.now(), 0, true);
            }
        }
    }
}

#[cfg(test)]
#[path = "op_tests.rs"]
mod tests;
