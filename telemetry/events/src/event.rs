//! The event model: NCCL's profiler event types, descriptors and states, as plain Rust types.
//!
//! Numbers (type bits, state values) are NCCL's, so a C-ABI adapter converts by value, never by
//! table. Descriptors borrow their strings and payloads: an event allocates nothing, and a sink
//! copies what it keeps (NCCL's descriptors likewise live only for the `startEvent` call).

use std::num::NonZeroU64;

/// Handle of a started event, issued by the fan-out; never zero so `Option<EventId>` is 8 bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EventId(pub NonZeroU64);

impl EventId {
    /// The raw id (never 0).
    #[inline]
    pub fn get(self) -> u64 {
        self.0.get()
    }
}

/// An event type; `bit()` is NCCL's `ncclProfile*` value (reference §4).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum EventType {
    /// `ncclProfileGroup` (v1), the legacy group of a launch plan.
    Group = 0,
    /// `ncclProfileColl` (v1).
    Coll = 1,
    /// `ncclProfileP2p` (v1).
    P2p = 2,
    /// `ncclProfileProxyOp` (v1).
    ProxyOp = 3,
    /// `ncclProfileProxyStep` (v1).
    ProxyStep = 4,
    /// `ncclProfileProxyCtrl` (v1).
    ProxyCtrl = 5,
    /// `ncclProfileKernelCh` (v3).
    KernelCh = 6,
    /// `ncclProfileNetPlugin` (v3).
    NetPlugin = 7,
    /// `ncclProfileGroupApi` (v5).
    GroupApi = 8,
    /// `ncclProfileCollApi` (v5).
    CollApi = 9,
    /// `ncclProfileP2pApi` (v5).
    P2pApi = 10,
    /// `ncclProfileKernelLaunch` (v5).
    KernelLaunch = 11,
    /// `ncclProfileCeColl` (v6).
    CeColl = 12,
    /// `ncclProfileCeSync` (v6).
    CeSync = 13,
    /// `ncclProfileCeBatch` (v6).
    CeBatch = 14,
}

impl EventType {
    /// Every type, in bit order.
    pub const ALL: [EventType; 15] = [
        Self::Group,
        Self::Coll,
        Self::P2p,
        Self::ProxyOp,
        Self::ProxyStep,
        Self::ProxyCtrl,
        Self::KernelCh,
        Self::NetPlugin,
        Self::GroupApi,
        Self::CollApi,
        Self::P2pApi,
        Self::KernelLaunch,
        Self::CeColl,
        Self::CeSync,
        Self::CeBatch,
    ];

    /// NCCL's bit for this type (`1 << index`).
    #[inline]
    pub const fn bit(self) -> u64 {
        1u64 << (self as u8)
    }

    /// The type whose bit is exactly `bit`, if any.
    pub fn from_bit(bit: u64) -> Option<EventType> {
        if !bit.is_power_of_two() {
            return None;
        }
        Self::ALL.get(bit.trailing_zeros() as usize).copied()
    }

    /// NCCL's name without the `ncclProfile` prefix.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Group => "Group",
            Self::Coll => "Coll",
            Self::P2p => "P2p",
            Self::ProxyOp => "ProxyOp",
            Self::ProxyStep => "ProxyStep",
            Self::ProxyCtrl => "ProxyCtrl",
            Self::KernelCh => "KernelCh",
            Self::NetPlugin => "NetPlugin",
            Self::GroupApi => "GroupApi",
            Self::CollApi => "CollApi",
            Self::P2pApi => "P2pApi",
            Self::KernelLaunch => "KernelLaunch",
            Self::CeColl => "CeColl",
            Self::CeSync => "CeSync",
            Self::CeBatch => "CeBatch",
        }
    }
}

/// What `start` describes: one variant per event type, with the fields of NCCL's descriptor union
/// (the newest layout, v5/v6, reference §7). Strings are NCCL's spellings ("AllReduce",
/// "ncclFloat32", "RING", "SIMPLE"); buffers and CUDA streams are addresses (`usize`), never
/// dereferenced here. `rank` is kept only where NCCL fills the header's rank; the parent handle
/// travels beside the descriptor (`Sink::start`), as NCCL's `parentObj` travels in the header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventDescr<'a> {
    /// Legacy group of a launch plan; no fields.
    Group,
    /// A collective of a launch plan (host side).
    Coll {
        rank: i32,
        /// Per-communicator, per-function counter; equal on all ranks.
        seq_number: u64,
        func: &'a str,
        send_buff: usize,
        recv_buff: usize,
        count: usize,
        root: i32,
        datatype: &'a str,
        n_channels: u8,
        n_warps: u8,
        algo: &'a str,
        proto: &'a str,
        /// v5 `parentGroup`: the legacy Group event (the start's parent is the CollApi event).
        parent_group: Option<EventId>,
    },
    /// A point-to-point operation of a launch plan.
    P2p {
        rank: i32,
        func: &'a str,
        buff: usize,
        datatype: &'a str,
        count: usize,
        peer: i32,
        n_channels: u8,
        /// v5 `parentGroup`, as for `Coll`.
        parent_group: Option<EventId>,
    },
    /// One proxy operation (channel, peer, direction).
    ProxyOp {
        rank: i32,
        /// Process that created the op (differs from ours under PXN).
        pid: i32,
        channel_id: u8,
        peer: i32,
        /// Network steps, rounded up to slices.
        n_steps: i32,
        /// Bytes per step.
        chunk_size: i32,
        is_send: bool,
    },
    /// One network step of a proxy op.
    ProxyStep { rank: i32, step: i32 },
    /// Proxy-thread activity; stands alone; no fields.
    ProxyCtrl,
    /// Kernel work of one channel; `p_timer` is the GPU %globaltimer start, in ns.
    KernelCh { channel_id: u8, p_timer: u64 },
    /// A network-plugin event; `id`: low 16 bits payload version, bits 16–31 net type.
    NetPlugin { rank: i32, id: i64, data: &'a [u8] },
    /// The outermost group of API calls; `group_depth` 1 = implicit group.
    GroupApi { graph_captured: bool, group_depth: i32 },
    /// A collective API call (enqueue work).
    CollApi { func: &'a str, count: usize, datatype: &'a str, root: i32, stream: usize, graph_captured: bool },
    /// A p2p API call.
    P2pApi { func: &'a str, count: usize, datatype: &'a str, stream: usize, graph_captured: bool },
    /// Around a kernel launch (or its recording into a graph).
    KernelLaunch { stream: usize },
    /// Copy-engine collective (v6).
    CeColl {
        seq_number: u64,
        func: &'a str,
        send_buff: usize,
        recv_buff: usize,
        count: usize,
        root: i32,
        datatype: &'a str,
        /// "MC" (NVLS multicast) or "UC".
        sync_strategy: &'a str,
        intra_batch_sync: bool,
        batch_size: u32,
        num_batches: u32,
        ce_seq_num: u32,
        stream: usize,
    },
    /// Copy-engine synchronisation (v6).
    CeSync { is_complete: bool, n_ranks: i32 },
    /// Copy-engine batch (v6).
    CeBatch { num_ops: i32, total_bytes: usize, use_intra_sync: bool },
}

impl EventDescr<'_> {
    /// The type this descriptor describes.
    #[inline]
    pub const fn event_type(&self) -> EventType {
        match self {
            Self::Group => EventType::Group,
            Self::Coll { .. } => EventType::Coll,
            Self::P2p { .. } => EventType::P2p,
            Self::ProxyOp { .. } => EventType::ProxyOp,
            Self::ProxyStep { .. } => EventType::ProxyStep,
            Self::ProxyCtrl => EventType::ProxyCtrl,
            Self::KernelCh { .. } => EventType::KernelCh,
            Self::NetPlugin { .. } => EventType::NetPlugin,
            Self::GroupApi { .. } => EventType::GroupApi,
            Self::CollApi { .. } => EventType::CollApi,
            Self::P2pApi { .. } => EventType::P2pApi,
            Self::KernelLaunch { .. } => EventType::KernelLaunch,
            Self::CeColl { .. } => EventType::CeColl,
            Self::CeSync { .. } => EventType::CeSync,
            Self::CeBatch { .. } => EventType::CeBatch,
        }
    }
}

/// ProxyOp states (reference §5). 0–7 are emitted by NCCL 2.23–2.26 only; 2.27+ emits `InProgress`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum ProxyOpState {
    SendPosted = 0,
    SendRemFifoWait = 1,
    SendTransmitted = 2,
    SendDone = 3,
    RecvPosted = 4,
    RecvReceived = 5,
    RecvTransmitted = 6,
    RecvDone = 7,
    /// `ncclProfilerProxyOpInProgress_v4`: progress of the op began.
    InProgress = 19,
}

/// ProxyStep states: what the proxy waits for next (reference §5, §11).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum ProxyStepState {
    SendGpuWait = 8,
    SendWait = 9,
    RecvWait = 10,
    RecvFlushWait = 11,
    RecvGpuWait = 12,
    /// `ncclProfilerProxyStepSendPeerWait_v4` (v4+): waiting for the receiver's credit.
    SendPeerWait = 20,
}

/// NCCL's name of a state number (ProxyOp, ProxyStep, ProxyCtrl and KernelCh states, and the
/// group API marks; reference §5); `None` for a number NCCL does not define.
pub fn state_name(state: u32) -> Option<&'static str> {
    const NAMES: [&str; 25] = [
        "SendPosted",
        "SendRemFifoWait",
        "SendTransmitted",
        "SendDone",
        "RecvPosted",
        "RecvReceived",
        "RecvTransmitted",
        "RecvDone",
        "SendGPUWait",
        "SendWait",
        "RecvWait",
        "RecvFlushWait",
        "RecvGPUWait",
        "Idle",
        "Active",
        "Sleep",
        "Wakeup",
        "Append",
        "AppendEnd",
        "InProgress",
        "SendPeerWait",
        "NetPluginUpdate",
        "KernelChStop",
        "GroupStartApiStop",
        "GroupEndApiStart",
    ];
    NAMES.get(state as usize).copied()
}

/// One whole operation summed by its emitter, for sinks that ask for
/// [`crate::EventMask::OP_TOTALS`] (`Sink::op_totals`): what its Coll or P2p, ProxyOps, steps
/// and transport notes would have told a metrics sink, in one call. A 1 MiB all-reduce's events
/// touch dozens of cache lines that the data just evicted; this touches the sink's counters only.
#[derive(Clone, Copy, Debug)]
pub struct OpTotals<'a> {
    /// The Coll or P2p descriptor the operation's event would have carried.
    pub descr: EventDescr<'static>,
    /// Start and end on the span clock (`clock::unix_nanos`).
    pub start_ns: u64,
    pub end_ns: u64,
    /// Step sums of its send legs and of its receive legs (`steps` 0 where it had none).
    pub steps: [StepTotals; 2],
    /// Bytes it moved per transport and direction: (transport, send, bytes).
    pub transport_bytes: &'a [(&'static str, bool, u64)],
}

/// The steps of one ProxyOp, summed by its emitter instead of sent one by one: what a sink that
/// asks for [`crate::EventMask::STEP_TOTALS`] gets at the op's end (`Sink::step_totals`) for the
/// steps the emitter did not send as ProxyStep events. Metrics need only these sums, and a
/// 1 MiB all-reduce has dozens of steps per call.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StepTotals {
    /// The op's direction (its `is_send`).
    pub send: bool,
    /// Steps summed (finished, or cut short by a failure).
    pub steps: u32,
    /// `transSize` of each step: posted (send) or received (receive).
    pub bytes: u64,
    /// Time the steps spent in each state of [`StepTotals::STATES`], from its mark to the next
    /// (the last to the step's stop), in ns.
    pub wait_ns: [u64; 6],
}

impl StepTotals {
    /// The states of `wait_ns`, in order: the send side's, then the receive side's.
    pub const STATES: [ProxyStepState; 6] = [
        ProxyStepState::SendGpuWait,
        ProxyStepState::SendPeerWait,
        ProxyStepState::SendWait,
        ProxyStepState::RecvWait,
        ProxyStepState::RecvFlushWait,
        ProxyStepState::RecvGpuWait,
    ];

    /// The index of `state` in [`StepTotals::STATES`] (and so in `wait_ns`).
    #[inline]
    pub const fn index(state: ProxyStepState) -> usize {
        match state {
            ProxyStepState::SendGpuWait => 0,
            ProxyStepState::SendPeerWait => 1,
            ProxyStepState::SendWait => 2,
            ProxyStepState::RecvWait => 3,
            ProxyStepState::RecvFlushWait => 4,
            ProxyStepState::RecvGpuWait => 5,
        }
    }

    /// The index of NCCL's ProxyStep state `raw` in [`StepTotals::STATES`].
    #[inline]
    pub fn index_of(raw: u32) -> Option<usize> {
        Self::STATES.iter().position(|s| *s as u32 == raw)
    }
}

const _: () = {
    let mut i = 0;
    while i < StepTotals::STATES.len() {
        assert!(StepTotals::index(StepTotals::STATES[i]) == i);
        i += 1;
    }
};

/// ProxyCtrl states.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum ProxyCtrlState {
    Idle = 13,
    Active = 14,
    Sleep = 15,
    Wakeup = 16,
    Append = 17,
    AppendEnd = 18,
}

/// GroupApi states (v5+).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum GroupApiState {
    /// `ncclProfilerGroupStartApiStop`.
    StartApiStop = 23,
    /// `ncclProfilerGroupEndApiStart`.
    EndApiStart = 24,
}

/// Copy-engine states (v6); declared by NCCL but never emitted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum CeState {
    CollStart = 25,
    CollComplete = 26,
    SyncStart = 27,
    SyncComplete = 28,
    BatchStart = 29,
    BatchComplete = 30,
}

/// `NetPluginUpdate`, NCCL's state 21.
pub const NET_PLUGIN_UPDATE: u32 = 21;
/// `KernelChStop`, NCCL's state 22.
pub const KERNEL_CH_STOP: u32 = 22;

/// A state change with the arguments NCCL passes for it (reference §8): the state and its
/// `eStateArgs` member together, so a sink cannot read the wrong member.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StateArgs<'a> {
    /// `trans_size`/`steps` are filled for states 0–7; zero for `InProgress`.
    ProxyOp { state: ProxyOpState, trans_size: usize, steps: i32 },
    /// `trans_size` is meaningful at `SendWait` (posted) and `RecvFlushWait` (received).
    ProxyStep { state: ProxyStepState, trans_size: usize },
    /// `appended_proxy_ops` is set at `AppendEnd`, 0 otherwise.
    ProxyCtrl { state: ProxyCtrlState, appended_proxy_ops: i32 },
    /// State 21 with the plugin's payload.
    NetPluginUpdate { data: &'a [u8] },
    /// State 22 with the GPU stop time (%globaltimer ns).
    KernelChStop { p_timer: u64 },
    /// GroupApi marker; no arguments.
    GroupApi { state: GroupApiState },
    /// Copy-engine state; no arguments.
    Ce { state: CeState },
}

impl StateArgs<'_> {
    /// NCCL's numeric state.
    #[inline]
    pub const fn state_raw(&self) -> u32 {
        match self {
            Self::ProxyOp { state, .. } => *state as u32,
            Self::ProxyStep { state, .. } => *state as u32,
            Self::ProxyCtrl { state, .. } => *state as u32,
            Self::NetPluginUpdate { .. } => NET_PLUGIN_UPDATE,
            Self::KernelChStop { .. } => KERNEL_CH_STOP,
            Self::GroupApi { state } => *state as u32,
            Self::Ce { state } => *state as u32,
        }
    }

    /// The event type these states belong to (`Ce` reports `CeColl`; NCCL never emits CE states).
    pub const fn event_type(&self) -> EventType {
        match self {
            Self::ProxyOp { .. } => EventType::ProxyOp,
            Self::ProxyStep { .. } => EventType::ProxyStep,
            Self::ProxyCtrl { .. } => EventType::ProxyCtrl,
            Self::NetPluginUpdate { .. } => EventType::NetPlugin,
            Self::KernelChStop { .. } => EventType::KernelCh,
            Self::GroupApi { .. } => EventType::GroupApi,
            Self::Ce { .. } => EventType::CeColl,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn type_bits_are_nccls() {
        let want = [1, 2, 4, 8, 0x10, 0x20, 0x40, 0x80, 0x100, 0x200, 0x400, 0x800, 0x1000, 0x2000, 0x4000];
        for (t, w) in EventType::ALL.iter().zip(want) {
            assert_eq!(t.bit(), w, "{}", t.name());
            assert_eq!(EventType::from_bit(w), Some(*t));
        }
        assert_eq!(EventType::ALL.iter().fold(0, |m, t| m | t.bit()), 0x7FFF);
        assert_eq!(EventType::from_bit(0), None);
        assert_eq!(EventType::from_bit(3), None);
        assert_eq!(EventType::from_bit(0x8000), None);
    }

    #[test]
    fn state_numbers_are_nccls() {
        let s = |a: StateArgs<'_>| a.state_raw();
        assert_eq!(s(StateArgs::ProxyOp { state: ProxyOpState::SendPosted, trans_size: 0, steps: 0 }), 0);
        assert_eq!(s(StateArgs::ProxyOp { state: ProxyOpState::RecvDone, trans_size: 0, steps: 0 }), 7);
        assert_eq!(s(StateArgs::ProxyOp { state: ProxyOpState::InProgress, trans_size: 0, steps: 0 }), 19);
        assert_eq!(s(StateArgs::ProxyStep { state: ProxyStepState::SendGpuWait, trans_size: 0 }), 8);
        assert_eq!(s(StateArgs::ProxyStep { state: ProxyStepState::RecvGpuWait, trans_size: 0 }), 12);
        assert_eq!(s(StateArgs::ProxyStep { state: ProxyStepState::SendPeerWait, trans_size: 0 }), 20);
        assert_eq!(s(StateArgs::ProxyCtrl { state: ProxyCtrlState::Idle, appended_proxy_ops: 0 }), 13);
        assert_eq!(s(StateArgs::ProxyCtrl { state: ProxyCtrlState::AppendEnd, appended_proxy_ops: 3 }), 18);
        assert_eq!(s(StateArgs::NetPluginUpdate { data: &[] }), 21);
        assert_eq!(s(StateArgs::KernelChStop { p_timer: 5 }), 22);
        assert_eq!(s(StateArgs::GroupApi { state: GroupApiState::StartApiStop }), 23);
        assert_eq!(s(StateArgs::GroupApi { state: GroupApiState::EndApiStart }), 24);
        assert_eq!(s(StateArgs::Ce { state: CeState::CollStart }), 25);
        assert_eq!(s(StateArgs::Ce { state: CeState::BatchComplete }), 30);
        assert_eq!(StateArgs::KernelChStop { p_timer: 0 }.event_type(), EventType::KernelCh);
    }

    #[test]
    fn descr_reports_its_type() {
        assert_eq!(EventDescr::ProxyStep { rank: 0, step: 3 }.event_type(), EventType::ProxyStep);
        assert_eq!(EventDescr::KernelLaunch { stream: 0 }.event_type(), EventType::KernelLaunch);
        assert_eq!(EventDescr::Group.event_type(), EventType::Group);
        assert_eq!(std::mem::size_of::<Option<EventId>>(), 8);
    }
}
