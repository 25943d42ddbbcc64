//! `#[repr(C)]` mirrors of NCCL's profiler-plugin ABI, v1–v6 (reference §3, §6–§8), for LP64
//! Linux. One struct per version; sizes and the offsets that differ between versions are checked
//! at compile time.
//!
//! Conventions (reference §15): C `bool` is `u8`, C enums and results are `c_int`, and each
//! descriptor union has a `raw` member of exactly the union's size so a descriptor can be built
//! all-zero without `unsafe`; fields are then written one by one (a write to a union field is
//! safe), so padding stays zero too. The headers' padding is explicit for the same reason.

use std::ffi::{c_char, c_int, c_ulong, c_void};
use std::mem::{offset_of, size_of};

/// `ncclDebugLogger_t`: `(level, flags, file, line, fmt, ...)`; C-variadic.
pub type DebugLogger = unsafe extern "C" fn(c_int, c_ulong, *const c_char, c_int, *const c_char, ...);

/// v1–v3 `init(void** context, int* eActivationMask)`.
pub type InitV1 = unsafe extern "C" fn(*mut *mut c_void, *mut c_int) -> c_int;
/// v4 `init(context, mask, commName, commHash, nNodes, nranks, rank, logfn)`.
pub type InitV4 =
    unsafe extern "C" fn(*mut *mut c_void, *mut c_int, *const c_char, u64, c_int, c_int, c_int, DebugLogger) -> c_int;
/// v5/v6 `init(context, commId, mask, commName, nNodes, nranks, rank, logfn)`: not v4's order.
pub type InitV5 =
    unsafe extern "C" fn(*mut *mut c_void, u64, *mut c_int, *const c_char, c_int, c_int, c_int, DebugLogger) -> c_int;
/// `startEvent(context, void** eHandle, DescrVN* eDescr)`; the descriptor pointer is typed by the
/// caller, all versions pass it the same way.
pub type StartEvent = unsafe extern "C" fn(*mut c_void, *mut *mut c_void, *mut c_void) -> c_int;
/// `stopEvent(eHandle)`.
pub type StopEvent = unsafe extern "C" fn(*mut c_void) -> c_int;
/// `recordEventState(eHandle, eState, StateArgsVN* eStateArgs)`.
pub type RecordEventState = unsafe extern "C" fn(*mut c_void, c_int, *mut c_void) -> c_int;
/// `finalize(context)`.
pub type Finalize = unsafe extern "C" fn(*mut c_void) -> c_int;

/// The exported `ncclProfiler_vN` struct; `I` is the version's init type. `Option<fn>` has the
/// same layout as a C function pointer, NULL being `None`, so any bit pattern read is valid.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Table<I: Copy> {
    pub name: *const c_char,
    pub init: Option<I>,
    pub start_event: Option<StartEvent>,
    pub stop_event: Option<StopEvent>,
    pub record_event_state: Option<RecordEventState>,
    pub finalize: Option<Finalize>,
}

// ---- members shared by several versions ----

/// `proxyOp` (identical in v1–v6).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ProxyOp {
    pub pid: i32,
    pub channel_id: u8,
    pub _pad: [u8; 3],
    pub peer: c_int,
    pub n_steps: c_int,
    pub chunk_size: c_int,
    pub is_send: c_int,
}

/// `proxyStep` (identical in v1–v6).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ProxyStep {
    pub step: c_int,
}

/// `kernelCh` of v3: the channel only.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct KernelChV3 {
    pub channel_id: u8,
}

/// `kernelCh` of v4–v6: with the GPU start time.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct KernelChV4 {
    pub channel_id: u8,
    pub _pad: [u8; 7],
    pub p_timer: u64,
}

/// `netPlugin` (v3–v6).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct NetPlugin {
    pub id: i64,
    pub data: *mut c_void,
}

// ---- v1 ----

/// v1 `coll`: numeric codes for func, datatype, algo and proto.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CollV1 {
    pub name: *const c_char,
    pub comm_hash: u64,
    pub seq_number: u64,
    pub func: u8,
    pub _pad0: [u8; 7],
    pub send_buff: *const c_void,
    pub recv_buff: *mut c_void,
    pub count: usize,
    pub root: c_int,
    pub datatype: u8,
    pub _pad1: [u8; 3],
    pub op: u32,
    pub _pad2: u32,
    pub traffic_bytes: usize,
    pub n_max_channels: u8,
    pub n_warps: u8,
    pub algo: u8,
    pub proto: u8,
    pub is_collnet: c_int,
    pub is_nvls: c_int,
    pub _pad3: u32,
}

/// v1 `p2p`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct P2pV1 {
    pub name: *const c_char,
    pub comm_hash: u64,
    pub func: u8,
    pub _pad0: [u8; 7],
    pub buff: *mut c_void,
    pub datatype: u8,
    pub _pad1: [u8; 7],
    pub count: usize,
    pub peer: c_int,
}

#[repr(C)]
pub union UnionV1 {
    pub raw: [u64; 12],
    pub coll: CollV1,
    pub p2p: P2pV1,
    pub proxy_op: ProxyOp,
    pub proxy_step: ProxyStep,
}

/// `ncclProfilerEventDescr_v1_t` (120 bytes).
#[repr(C)]
pub struct DescrV1 {
    pub type_: u8,
    pub _pad0: [u8; 7],
    pub parent_obj: *mut c_void,
    pub rank: c_int,
    pub _pad1: u32,
    pub u: UnionV1,
}

// ---- v2 ----

/// v2 `coll`: v1 with strings, without `op`, isCollnet and isNvls.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CollV2 {
    pub name: *const c_char,
    pub comm_hash: u64,
    pub seq_number: u64,
    pub func: *const c_char,
    pub send_buff: *const c_void,
    pub recv_buff: *mut c_void,
    pub count: usize,
    pub root: c_int,
    pub _pad0: u32,
    pub datatype: *const c_char,
    pub traffic_bytes: usize,
    pub n_max_channels: u8,
    pub n_warps: u8,
    pub _pad1: [u8; 6],
    pub algo: *const c_char,
    pub proto: *const c_char,
}

/// v2/v3 `p2p`: v1 with strings.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct P2pV2 {
    pub name: *const c_char,
    pub comm_hash: u64,
    pub func: *const c_char,
    pub buff: *mut c_void,
    pub datatype: *const c_char,
    pub count: usize,
    pub peer: c_int,
}

#[repr(C)]
pub union UnionV2 {
    pub raw: [u64; 13],
    pub coll: CollV2,
    pub p2p: P2pV2,
    pub proxy_op: ProxyOp,
    pub proxy_step: ProxyStep,
}

/// `ncclProfilerEventDescr_v2_t` (128 bytes).
#[repr(C)]
pub struct DescrV2 {
    pub type_: u8,
    pub _pad0: [u8; 7],
    pub parent_obj: *mut c_void,
    pub rank: c_int,
    pub _pad1: u32,
    pub u: UnionV2,
}

// ---- v3 ----

/// v3 `coll`: v2 without `trafficBytes`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CollV3 {
    pub name: *const c_char,
    pub comm_hash: u64,
    pub seq_number: u64,
    pub func: *const c_char,
    pub send_buff: *const c_void,
    pub recv_buff: *mut c_void,
    pub count: usize,
    pub root: c_int,
    pub _pad0: u32,
    pub datatype: *const c_char,
    pub n_max_channels: u8,
    pub n_warps: u8,
    pub _pad1: [u8; 6],
    pub algo: *const c_char,
    pub proto: *const c_char,
}

#[repr(C)]
pub union UnionV3 {
    pub raw: [u64; 12],
    pub coll: CollV3,
    pub p2p: P2pV2,
    pub proxy_op: ProxyOp,
    pub proxy_step: ProxyStep,
    pub kernel_ch: KernelChV3,
    pub net_plugin: NetPlugin,
}

/// `ncclProfilerEventDescr_v3_t` (120 bytes).
#[repr(C)]
pub struct DescrV3 {
    pub type_: u8,
    pub _pad0: [u8; 7],
    pub parent_obj: *mut c_void,
    pub rank: c_int,
    pub _pad1: u32,
    pub u: UnionV3,
}

// ---- v4 ----

/// v4 `coll`: name and commHash removed.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CollV4 {
    pub seq_number: u64,
    pub func: *const c_char,
    pub send_buff: *const c_void,
    pub recv_buff: *mut c_void,
    pub count: usize,
    pub root: c_int,
    pub _pad0: u32,
    pub datatype: *const c_char,
    pub n_channels: u8,
    pub n_warps: u8,
    pub _pad1: [u8; 6],
    pub algo: *const c_char,
    pub proto: *const c_char,
}

/// v4 `p2p`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct P2pV4 {
    pub func: *const c_char,
    pub buff: *mut c_void,
    pub datatype: *const c_char,
    pub count: usize,
    pub peer: c_int,
    pub n_channels: u8,
}

#[repr(C)]
pub union UnionV4 {
    pub raw: [u64; 10],
    pub coll: CollV4,
    pub p2p: P2pV4,
    pub proxy_op: ProxyOp,
    pub proxy_step: ProxyStep,
    pub kernel_ch: KernelChV4,
    pub net_plugin: NetPlugin,
}

/// `ncclProfilerEventDescr_v4_t` (104 bytes).
#[repr(C)]
pub struct DescrV4 {
    pub type_: u8,
    pub _pad0: [u8; 7],
    pub parent_obj: *mut c_void,
    pub rank: c_int,
    pub _pad1: u32,
    pub u: UnionV4,
}

// ---- v5 ----

/// v5 `groupApi`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct GroupApi {
    pub graph_captured: u8,
    pub _pad: [u8; 3],
    pub group_depth: c_int,
}

/// v5 `collApi`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CollApi {
    pub func: *const c_char,
    pub count: usize,
    pub datatype: *const c_char,
    pub root: c_int,
    pub _pad: u32,
    pub stream: *mut c_void,
    pub graph_captured: u8,
}

/// v5 `p2pApi`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct P2pApi {
    pub func: *const c_char,
    pub count: usize,
    pub datatype: *const c_char,
    pub stream: *mut c_void,
    pub graph_captured: u8,
}

/// v5 `kernelLaunch`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct KernelLaunch {
    pub stream: *mut c_void,
}

/// v5 `coll`: v4 plus the legacy Group handle.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CollV5 {
    pub seq_number: u64,
    pub func: *const c_char,
    pub send_buff: *const c_void,
    pub recv_buff: *mut c_void,
    pub count: usize,
    pub root: c_int,
    pub _pad0: u32,
    pub datatype: *const c_char,
    pub n_channels: u8,
    pub n_warps: u8,
    pub _pad1: [u8; 6],
    pub algo: *const c_char,
    pub proto: *const c_char,
    pub parent_group: *mut c_void,
}

/// v5 `p2p`: v4 plus the legacy Group handle.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct P2pV5 {
    pub func: *const c_char,
    pub buff: *mut c_void,
    pub datatype: *const c_char,
    pub count: usize,
    pub peer: c_int,
    pub n_channels: u8,
    pub _pad: [u8; 3],
    pub parent_group: *mut c_void,
}

#[repr(C)]
pub union UnionV5 {
    pub raw: [u64; 11],
    pub group_api: GroupApi,
    pub coll_api: CollApi,
    pub p2p_api: P2pApi,
    pub kernel_launch: KernelLaunch,
    pub coll: CollV5,
    pub p2p: P2pV5,
    pub proxy_op: ProxyOp,
    pub proxy_step: ProxyStep,
    pub kernel_ch: KernelChV4,
    pub net_plugin: NetPlugin,
}

/// `ncclProfilerEventDescr_v5_t` (112 bytes); `type` is 64-bit from v5 on.
#[repr(C)]
pub struct DescrV5 {
    pub type_: u64,
    pub parent_obj: *mut c_void,
    pub rank: c_int,
    pub _pad1: u32,
    pub u: UnionV5,
}

// ---- v6 ----

/// v6 `ceColl`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CeColl {
    pub seq_number: u64,
    pub func: *const c_char,
    pub send_buff: *const c_void,
    pub recv_buff: *mut c_void,
    pub count: usize,
    pub root: c_int,
    pub _pad0: u32,
    pub datatype: *const c_char,
    pub sync_strategy: *const c_char,
    pub intra_batch_sync: u8,
    pub _pad1: [u8; 3],
    pub batch_size: u32,
    pub num_batches: u32,
    pub ce_seq_num: u32,
    pub stream: *mut c_void,
}

/// v6 `ceCollSync`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CeSync {
    pub is_complete: u8,
    pub _pad: [u8; 3],
    pub n_ranks: c_int,
}

/// v6 `ceCollBatch`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CeBatch {
    pub num_ops: c_int,
    pub _pad: u32,
    pub total_bytes: usize,
    pub use_intra_sync: u8,
}

#[repr(C)]
pub union UnionV6 {
    pub raw: [u64; 11],
    pub group_api: GroupApi,
    pub coll_api: CollApi,
    pub p2p_api: P2pApi,
    pub kernel_launch: KernelLaunch,
    pub coll: CollV5,
    pub p2p: P2pV5,
    pub proxy_op: ProxyOp,
    pub proxy_step: ProxyStep,
    pub kernel_ch: KernelChV4,
    pub net_plugin: NetPlugin,
    pub ce_coll: CeColl,
    pub ce_sync: CeSync,
    pub ce_batch: CeBatch,
}

/// `ncclProfilerEventDescr_v6_t` (112 bytes).
#[repr(C)]
pub struct DescrV6 {
    pub type_: u64,
    pub parent_obj: *mut c_void,
    pub rank: c_int,
    pub _pad1: u32,
    pub u: UnionV6,
}

// ---- state arguments ----

/// v1–v3 `proxyOp` arguments.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ProxyOpArgsV1 {
    pub trans_size: usize,
    pub steps: c_int,
}

/// `proxyCtrl` arguments (all versions).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ProxyCtrlArgs {
    pub appended_proxy_ops: c_int,
}

/// `ncclProfilerEventStateArgs_v1_t` … `_v3_t` (16 bytes).
#[repr(C)]
pub union StateArgsV1 {
    pub raw: [u64; 2],
    pub proxy_op: ProxyOpArgsV1,
    pub proxy_ctrl: ProxyCtrlArgs,
}

/// `ncclProfilerEventStateArgs_v4_t` … `_v6_t` (8 bytes).
#[repr(C)]
pub union StateArgsV4 {
    pub raw: u64,
    /// `proxyStep.transSize`.
    pub trans_size: usize,
    pub proxy_ctrl: ProxyCtrlArgs,
    /// `netPlugin.data`.
    pub net_data: *mut c_void,
    /// `kernelCh.pTimer`.
    pub p_timer: u64,
}

// ---- constructors: all-zero values ----

macro_rules! zeroed_descr {
    ($t:ident, $u:ident, $n:literal, narrow) => {
        impl $t {
            /// An all-zero descriptor of type `type_`.
            pub fn new(type_: u8, parent_obj: *mut c_void, rank: c_int) -> $t {
                $t { type_, _pad0: [0; 7], parent_obj, rank, _pad1: 0, u: $u { raw: [0; $n] } }
            }
        }
    };
    ($t:ident, $u:ident, $n:literal, wide) => {
        impl $t {
            /// An all-zero descriptor of type `type_`.
            pub fn new(type_: u64, parent_obj: *mut c_void, rank: c_int) -> $t {
                $t { type_, parent_obj, rank, _pad1: 0, u: $u { raw: [0; $n] } }
            }
        }
    };
}

zeroed_descr!(DescrV1, UnionV1, 12, narrow);
zeroed_descr!(DescrV2, UnionV2, 13, narrow);
zeroed_descr!(DescrV3, UnionV3, 12, narrow);
zeroed_descr!(DescrV4, UnionV4, 10, narrow);
zeroed_descr!(DescrV5, UnionV5, 11, wide);
zeroed_descr!(DescrV6, UnionV6, 11, wide);

impl StateArgsV1 {
    pub fn zeroed() -> StateArgsV1 {
        StateArgsV1 { raw: [0; 2] }
    }
}

impl StateArgsV4 {
    pub fn zeroed() -> StateArgsV4 {
        StateArgsV4 { raw: 0 }
    }
}

// ---- layout checks (reference §7, §8, §15) ----

const _: () = {
    assert!(size_of::<Table<InitV1>>() == 48);
    assert!(size_of::<Table<InitV4>>() == 48);
    assert!(size_of::<Table<InitV5>>() == 48);

    assert!(size_of::<DescrV1>() == 120);
    assert!(size_of::<DescrV2>() == 128);
    assert!(size_of::<DescrV3>() == 120);
    assert!(size_of::<DescrV4>() == 104);
    assert!(size_of::<DescrV5>() == 112);
    assert!(size_of::<DescrV6>() == 112);
    // Each `raw` covers its whole union, so `new` zeroes every byte.
    assert!(size_of::<UnionV1>() == 12 * 8);
    assert!(size_of::<UnionV2>() == 13 * 8);
    assert!(size_of::<UnionV3>() == 12 * 8);
    assert!(size_of::<UnionV4>() == 10 * 8);
    assert!(size_of::<UnionV5>() == 11 * 8);
    assert!(size_of::<UnionV6>() == 11 * 8);

    assert!(size_of::<StateArgsV1>() == 16);
    assert!(size_of::<StateArgsV4>() == 8);

    // Header: the union starts at 24 in every version.
    assert!(offset_of!(DescrV1, parent_obj) == 8 && offset_of!(DescrV1, rank) == 16 && offset_of!(DescrV1, u) == 24);
    assert!(offset_of!(DescrV4, u) == 24);
    assert!(offset_of!(DescrV5, parent_obj) == 8 && offset_of!(DescrV5, rank) == 16 && offset_of!(DescrV5, u) == 24);
    assert!(offset_of!(DescrV6, u) == 24);

    // Offsets below are relative to the union (descriptor offset − 24).
    // v1 coll/p2p (§7.1).
    assert!(offset_of!(CollV1, func) == 24 && offset_of!(CollV1, send_buff) == 32);
    assert!(offset_of!(CollV1, root) == 56 && offset_of!(CollV1, datatype) == 60 && offset_of!(CollV1, op) == 64);
    assert!(offset_of!(CollV1, traffic_bytes) == 72 && offset_of!(CollV1, n_max_channels) == 80);
    assert!(offset_of!(CollV1, algo) == 82 && offset_of!(CollV1, proto) == 83);
    assert!(offset_of!(CollV1, is_collnet) == 84 && offset_of!(CollV1, is_nvls) == 88);
    assert!(offset_of!(P2pV1, func) == 16 && offset_of!(P2pV1, buff) == 24 && offset_of!(P2pV1, datatype) == 32);
    assert!(offset_of!(P2pV1, count) == 40 && offset_of!(P2pV1, peer) == 48);
    // proxyOp / proxyStep (all versions).
    assert!(offset_of!(ProxyOp, channel_id) == 4 && offset_of!(ProxyOp, peer) == 8);
    assert!(offset_of!(ProxyOp, n_steps) == 12 && offset_of!(ProxyOp, chunk_size) == 16);
    assert!(offset_of!(ProxyOp, is_send) == 20);
    // v2 (§7.2).
    assert!(offset_of!(CollV2, datatype) == 64 && offset_of!(CollV2, traffic_bytes) == 72);
    assert!(offset_of!(CollV2, n_max_channels) == 80 && offset_of!(CollV2, algo) == 88);
    assert!(offset_of!(CollV2, proto) == 96);
    assert!(offset_of!(P2pV2, func) == 16 && offset_of!(P2pV2, datatype) == 32 && offset_of!(P2pV2, peer) == 48);
    // v3 (§7.3).
    assert!(offset_of!(CollV3, datatype) == 64 && offset_of!(CollV3, n_max_channels) == 72);
    assert!(offset_of!(CollV3, algo) == 80 && offset_of!(CollV3, proto) == 88);
    assert!(offset_of!(NetPlugin, data) == 8);
    // v4 (§7.4).
    assert!(offset_of!(CollV4, func) == 8 && offset_of!(CollV4, root) == 40);
    assert!(offset_of!(CollV4, datatype) == 48 && offset_of!(CollV4, n_channels) == 56);
    assert!(offset_of!(CollV4, algo) == 64 && offset_of!(CollV4, proto) == 72);
    assert!(offset_of!(P2pV4, peer) == 32 && offset_of!(P2pV4, n_channels) == 36);
    assert!(offset_of!(KernelChV4, p_timer) == 8);
    // v5 (§7.5).
    assert!(offset_of!(GroupApi, group_depth) == 4);
    assert!(offset_of!(CollApi, root) == 24 && offset_of!(CollApi, stream) == 32);
    assert!(offset_of!(CollApi, graph_captured) == 40);
    assert!(offset_of!(P2pApi, stream) == 24 && offset_of!(P2pApi, graph_captured) == 32);
    assert!(offset_of!(CollV5, parent_group) == 80 && offset_of!(P2pV5, parent_group) == 40);
    // v6 (§7.6).
    assert!(offset_of!(CeColl, sync_strategy) == 56 && offset_of!(CeColl, intra_batch_sync) == 64);
    assert!(offset_of!(CeColl, batch_size) == 68 && offset_of!(CeColl, ce_seq_num) == 76);
    assert!(offset_of!(CeColl, stream) == 80);
    assert!(offset_of!(CeSync, n_ranks) == 4);
    assert!(offset_of!(CeBatch, total_bytes) == 8 && offset_of!(CeBatch, use_intra_sync) == 16);
    // v1–v3 state args.
    assert!(offset_of!(ProxyOpArgsV1, steps) == 8);
};
