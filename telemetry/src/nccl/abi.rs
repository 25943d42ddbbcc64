//! `#[repr(C)]` mirrors of NCCL's profiler-plugin ABI, v1–v6 (reference §3, §6–§8), for LP64
//! Linux. The event descriptors of all six versions come from one field table below: a row per
//! C field, with its type in each version and the codec that carries it to and from occl's
//! event; `table.rs` expands it into a module per version (`v1::Descr`, `v1::Coll` …, with
//! [`Layout`] to write and read them). Sizes and offsets are checked at compile time against
//! the reference.
//!
//! Conventions (reference §15): C `bool` is `u8`, C enums and results are `c_int`, and each
//! descriptor union has a `raw` member of exactly the union's size so a descriptor can be built
//! all-zero without `unsafe`; fields are then written one by one (a write to a union field is
//! safe), so padding stays zero too. The header's padding is explicit, as it is built by value.

use super::table::abi_table;
use std::ffi::{c_char, c_int, c_ulong, c_void};
use std::mem::{offset_of, size_of};

pub use super::codec::{GetCx, PutCx};
pub use super::table::Layout;

/// `ncclDebugLogger_t`: `(level, flags, file, line, fmt, ...)`; C-variadic.
pub type DebugLogger = unsafe extern "C" fn(c_int, c_ulong, *const c_char, c_int, *const c_char, ...);

/// v1–v3 `init(void** context, int* eActivationMask)`.
pub type InitV1 = unsafe extern "C" fn(*mut *mut c_void, *mut c_int) -> c_int;
/// v4 `init(context, mask, commName, commHash, nNodes, nranks, rank, logfn)`; the logger is an
/// `Option` so that a NULL one is a value a plugin can receive, not undefined behaviour.
pub type InitV4 = unsafe extern "C" fn(
    *mut *mut c_void,
    *mut c_int,
    *const c_char,
    u64,
    c_int,
    c_int,
    c_int,
    Option<DebugLogger>,
) -> c_int;
/// v5/v6 `init(context, commId, mask, commName, nNodes, nranks, rank, logfn)`: not v4's order.
pub type InitV5 = unsafe extern "C" fn(
    *mut *mut c_void,
    u64,
    *mut c_int,
    *const c_char,
    c_int,
    c_int,
    c_int,
    Option<DebugLogger>,
) -> c_int;
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

// ---- the field table ----

/// A C string (`const char*`).
pub type Str = *const c_char;
/// `void*`.
pub type Ptr = *mut c_void;
/// `const void*`.
pub type CPtr = *const c_void;

// Each version: its module, `ApiVersion`, the C type of `type` and the descriptor's size. Each
// member: its union field, the `EventDescr` variant it carries (`(rank)` when the variant's rank
// is the header's), the variant's other fields, and a row per C field in C order: the field's
// type in v1 … v6 (`-`: absent), the codec (`codec.rs`) and the event field it carries, if any.
abi_table! {
    versions {
        /// NCCL 2.23: numeric codes for names.
        v1 = V1, u8, 120;
        /// NCCL 2.24, 2.25: strings instead of codes.
        v2 = V2, u8, 128;
        /// NCCL 2.26: KernelCh and NetPlugin events.
        v3 = V3, u8, 120;
        /// NCCL 2.27: no communicator fields in Coll/P2p; KernelCh timestamps.
        v4 = V4, u8, 104;
        /// NCCL 2.28: 64-bit `type`; the API events; Coll/P2p under them, with `parentGroup`.
        v5 = V5, u64, 112;
        /// NCCL 2.29, 2.30: the copy-engine events.
        v6 = V6, u64, 112;
    }

    /// `coll`: a collective of a launch plan.
    coll: Coll(rank) {
        seq_number, func, send_buff, recv_buff, count, root, datatype, n_channels, n_warps, algo, proto, parent_group,
    } {
        //               v1     v2     v3     v4     v5     v6
        name           [Str    Str    Str    -      -      -    ] CommName,
        comm_hash      [u64    u64    u64    -      -      -    ] CommHash,
        seq_number     [u64    u64    u64    u64    u64    u64  ] Int = seq_number,
        func           [u8     Str    Str    Str    Str    Str  ] Func = func,
        send_buff      [CPtr   CPtr   CPtr   CPtr   CPtr   CPtr ] Addr = send_buff,
        recv_buff      [Ptr    Ptr    Ptr    Ptr    Ptr    Ptr  ] Addr = recv_buff,
        count          [usize  usize  usize  usize  usize  usize] Int = count,
        root           [c_int  c_int  c_int  c_int  c_int  c_int] Int = root,
        datatype       [u8     Str    Str    Str    Str    Str  ] Datatype = datatype,
        op             [u32    -      -      -      -      -    ] Zero,
        traffic_bytes  [usize  usize  -      -      -      -    ] Zero,
        n_max_channels [u8     u8     u8     -      -      -    ] Int = n_channels,
        n_channels     [-      -      -      u8     u8     u8   ] Int = n_channels,
        n_warps        [u8     u8     u8     u8     u8     u8   ] Int = n_warps,
        algo           [u8     Str    Str    Str    Str    Str  ] Algo = algo,
        proto          [u8     Str    Str    Str    Str    Str  ] Proto = proto,
        is_collnet     [c_int  -      -      -      -      -    ] IsCollnet = algo,
        is_nvls        [c_int  -      -      -      -      -    ] IsNvls = algo,
        parent_group   [-      -      -      -      Ptr    Ptr  ] Handle = parent_group,
    }

    /// `p2p`: a point-to-point operation of a launch plan.
    p2p: P2p(rank) { func, buff, datatype, count, peer, n_channels, parent_group } {
        //               v1     v2     v3     v4     v5     v6
        name           [Str    Str    Str    -      -      -    ] CommName,
        comm_hash      [u64    u64    u64    -      -      -    ] CommHash,
        func           [u8     Str    Str    Str    Str    Str  ] Func = func,
        buff           [Ptr    Ptr    Ptr    Ptr    Ptr    Ptr  ] Addr = buff,
        datatype       [u8     Str    Str    Str    Str    Str  ] Datatype = datatype,
        count          [usize  usize  usize  usize  usize  usize] Int = count,
        peer           [c_int  c_int  c_int  c_int  c_int  c_int] Int = peer,
        n_channels     [-      -      -      u8     u8     u8   ] Int = n_channels,
        parent_group   [-      -      -      -      Ptr    Ptr  ] Handle = parent_group,
    }

    /// `proxyOp`: one proxy operation (channel, peer, direction).
    proxy_op: ProxyOp(rank) { pid, channel_id, peer, n_steps, chunk_size, is_send } {
        //               v1     v2     v3     v4     v5     v6
        pid            [i32    i32    i32    i32    i32    i32  ] Int = pid,
        channel_id     [u8     u8     u8     u8     u8     u8   ] Int = channel_id,
        peer           [c_int  c_int  c_int  c_int  c_int  c_int] Int = peer,
        n_steps        [c_int  c_int  c_int  c_int  c_int  c_int] Int = n_steps,
        chunk_size     [c_int  c_int  c_int  c_int  c_int  c_int] Int = chunk_size,
        is_send        [c_int  c_int  c_int  c_int  c_int  c_int] Flag = is_send,
    }

    /// `proxyStep`: one network step of a proxy operation.
    proxy_step: ProxyStep(rank) { step } {
        //               v1     v2     v3     v4     v5     v6
        step           [c_int  c_int  c_int  c_int  c_int  c_int] Int = step,
    }

    /// `kernelCh`: kernel work of one channel; the GPU start time from v4.
    kernel_ch: KernelCh { channel_id, p_timer } {
        //               v1     v2     v3     v4     v5     v6
        channel_id     [-      -      u8     u8     u8     u8   ] Int = channel_id,
        p_timer        [-      -      -      u64    u64    u64  ] Int = p_timer,
    }

    /// `netPlugin`: a network-plugin event and its payload.
    net_plugin: NetPlugin(rank) { id, data } {
        //               v1     v2     v3     v4     v5     v6
        id             [-      -      i64    i64    i64    i64  ] NetId = id,
        data           [-      -      Ptr    Ptr    Ptr    Ptr  ] Payload = data,
    }

    /// `groupApi`: the outermost group of API calls.
    group_api: GroupApi { graph_captured, group_depth } {
        //               v1     v2     v3     v4     v5     v6
        graph_captured [-      -      -      -      u8     u8   ] Flag = graph_captured,
        group_depth    [-      -      -      -      c_int  c_int] Int = group_depth,
    }

    /// `collApi`: a collective API call.
    coll_api: CollApi { func, count, datatype, root, stream, graph_captured } {
        //               v1     v2     v3     v4     v5     v6
        func           [-      -      -      -      Str    Str  ] Func = func,
        count          [-      -      -      -      usize  usize] Int = count,
        datatype       [-      -      -      -      Str    Str  ] Datatype = datatype,
        root           [-      -      -      -      c_int  c_int] Int = root,
        stream         [-      -      -      -      Ptr    Ptr  ] Addr = stream,
        graph_captured [-      -      -      -      u8     u8   ] Flag = graph_captured,
    }

    /// `p2pApi`: a point-to-point API call.
    p2p_api: P2pApi { func, count, datatype, stream, graph_captured } {
        //               v1     v2     v3     v4     v5     v6
        func           [-      -      -      -      Str    Str  ] Func = func,
        count          [-      -      -      -      usize  usize] Int = count,
        datatype       [-      -      -      -      Str    Str  ] Datatype = datatype,
        stream         [-      -      -      -      Ptr    Ptr  ] Addr = stream,
        graph_captured [-      -      -      -      u8     u8   ] Flag = graph_captured,
    }

    /// `kernelLaunch`: around a kernel launch.
    kernel_launch: KernelLaunch { stream } {
        //               v1     v2     v3     v4     v5     v6
        stream         [-      -      -      -      Ptr    Ptr  ] Addr = stream,
    }

    /// `ceColl`: a copy-engine collective.
    ce_coll: CeColl {
        seq_number, func, send_buff, recv_buff, count, root, datatype, sync_strategy, intra_batch_sync, batch_size,
        num_batches, ce_seq_num, stream,
    } {
        //                 v1   v2   v3   v4   v5   v6
        seq_number       [-    -    -    -    -    u64  ] Int = seq_number,
        func             [-    -    -    -    -    Str  ] Func = func,
        send_buff        [-    -    -    -    -    CPtr ] Addr = send_buff,
        recv_buff        [-    -    -    -    -    Ptr  ] Addr = recv_buff,
        count            [-    -    -    -    -    usize] Int = count,
        root             [-    -    -    -    -    c_int] Int = root,
        datatype         [-    -    -    -    -    Str  ] Datatype = datatype,
        sync_strategy    [-    -    -    -    -    Str  ] SyncStrategy = sync_strategy,
        intra_batch_sync [-    -    -    -    -    u8   ] Flag = intra_batch_sync,
        batch_size       [-    -    -    -    -    u32  ] Int = batch_size,
        num_batches      [-    -    -    -    -    u32  ] Int = num_batches,
        ce_seq_num       [-    -    -    -    -    u32  ] Int = ce_seq_num,
        stream           [-    -    -    -    -    Ptr  ] Addr = stream,
    }

    /// `ceCollSync`: a copy-engine synchronisation.
    ce_sync: CeSync { is_complete, n_ranks } {
        //                 v1   v2   v3   v4   v5   v6
        is_complete      [-    -    -    -    -    u8   ] Flag = is_complete,
        n_ranks          [-    -    -    -    -    c_int] Int = n_ranks,
    }

    /// `ceCollBatch`: a copy-engine batch.
    ce_batch: CeBatch { num_ops, total_bytes, use_intra_sync } {
        //                 v1   v2   v3   v4   v5   v6
        num_ops          [-    -    -    -    -    c_int] Int = num_ops,
        total_bytes      [-    -    -    -    -    usize] Int = total_bytes,
        use_intra_sync   [-    -    -    -    -    u8   ] Flag = use_intra_sync,
    }
}

pub use v1::Descr as DescrV1;
pub use v2::Descr as DescrV2;
pub use v3::Descr as DescrV3;
pub use v4::Descr as DescrV4;
pub use v5::Descr as DescrV5;
pub use v6::Descr as DescrV6;

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
    assert!(size_of::<v1::Union>() == 12 * 8);
    assert!(size_of::<v2::Union>() == 13 * 8);
    assert!(size_of::<v3::Union>() == 12 * 8);
    assert!(size_of::<v4::Union>() == 10 * 8);
    assert!(size_of::<v5::Union>() == 11 * 8);
    assert!(size_of::<v6::Union>() == 11 * 8);

    assert!(size_of::<StateArgsV1>() == 16);
    assert!(size_of::<StateArgsV4>() == 8);

    // Header: the union starts at 24 in every version.
    assert!(offset_of!(DescrV1, parent_obj) == 8 && offset_of!(DescrV1, rank) == 16 && offset_of!(DescrV1, u) == 24);
    assert!(offset_of!(DescrV2, u) == 24 && offset_of!(DescrV3, u) == 24 && offset_of!(DescrV4, u) == 24);
    assert!(offset_of!(DescrV5, parent_obj) == 8 && offset_of!(DescrV5, rank) == 16 && offset_of!(DescrV5, u) == 24);
    assert!(offset_of!(DescrV6, u) == 24);

    // Offsets below are relative to the union (descriptor offset − 24).
    // v1 coll/p2p (§7.1).
    assert!(offset_of!(v1::Coll, func) == 24 && offset_of!(v1::Coll, send_buff) == 32);
    assert!(offset_of!(v1::Coll, root) == 56 && offset_of!(v1::Coll, datatype) == 60 && offset_of!(v1::Coll, op) == 64);
    assert!(offset_of!(v1::Coll, traffic_bytes) == 72 && offset_of!(v1::Coll, n_max_channels) == 80);
    assert!(offset_of!(v1::Coll, algo) == 82 && offset_of!(v1::Coll, proto) == 83);
    assert!(offset_of!(v1::Coll, is_collnet) == 84 && offset_of!(v1::Coll, is_nvls) == 88);
    assert!(size_of::<v1::Coll>() == 96);
    assert!(offset_of!(v1::P2p, func) == 16 && offset_of!(v1::P2p, buff) == 24 && offset_of!(v1::P2p, datatype) == 32);
    assert!(offset_of!(v1::P2p, count) == 40 && offset_of!(v1::P2p, peer) == 48);
    // proxyOp / proxyStep (all versions).
    assert!(offset_of!(v1::ProxyOp, channel_id) == 4 && offset_of!(v1::ProxyOp, peer) == 8);
    assert!(offset_of!(v1::ProxyOp, n_steps) == 12 && offset_of!(v1::ProxyOp, chunk_size) == 16);
    assert!(offset_of!(v1::ProxyOp, is_send) == 20 && size_of::<v6::ProxyOp>() == 24);
    assert!(size_of::<v1::ProxyStep>() == 4 && size_of::<v6::ProxyStep>() == 4);
    // v2 (§7.2).
    assert!(offset_of!(v2::Coll, datatype) == 64 && offset_of!(v2::Coll, traffic_bytes) == 72);
    assert!(offset_of!(v2::Coll, n_max_channels) == 80 && offset_of!(v2::Coll, algo) == 88);
    assert!(offset_of!(v2::Coll, proto) == 96 && size_of::<v2::Coll>() == 104);
    assert!(offset_of!(v2::P2p, func) == 16 && offset_of!(v2::P2p, datatype) == 32 && offset_of!(v2::P2p, peer) == 48);
    // v3 (§7.3).
    assert!(offset_of!(v3::Coll, datatype) == 64 && offset_of!(v3::Coll, n_max_channels) == 72);
    assert!(offset_of!(v3::Coll, algo) == 80 && offset_of!(v3::Coll, proto) == 88);
    assert!(size_of::<v3::KernelCh>() == 1);
    assert!(offset_of!(v3::NetPlugin, data) == 8 && size_of::<v6::NetPlugin>() == 16);
    // v4 (§7.4).
    assert!(offset_of!(v4::Coll, func) == 8 && offset_of!(v4::Coll, root) == 40);
    assert!(offset_of!(v4::Coll, datatype) == 48 && offset_of!(v4::Coll, n_channels) == 56);
    assert!(offset_of!(v4::Coll, algo) == 64 && offset_of!(v4::Coll, proto) == 72);
    assert!(offset_of!(v4::P2p, peer) == 32 && offset_of!(v4::P2p, n_channels) == 36);
    assert!(offset_of!(v4::KernelCh, p_timer) == 8 && size_of::<v6::KernelCh>() == 16);
    // v5 (§7.5).
    assert!(offset_of!(v5::GroupApi, group_depth) == 4);
    assert!(offset_of!(v5::CollApi, root) == 24 && offset_of!(v5::CollApi, stream) == 32);
    assert!(offset_of!(v5::CollApi, graph_captured) == 40);
    assert!(offset_of!(v5::P2pApi, stream) == 24 && offset_of!(v5::P2pApi, graph_captured) == 32);
    assert!(offset_of!(v5::Coll, parent_group) == 80 && offset_of!(v5::P2p, parent_group) == 40);
    assert!(offset_of!(v6::Coll, parent_group) == 80 && offset_of!(v6::P2p, parent_group) == 40);
    // v6 (§7.6).
    assert!(offset_of!(v6::CeColl, sync_strategy) == 56 && offset_of!(v6::CeColl, intra_batch_sync) == 64);
    assert!(offset_of!(v6::CeColl, batch_size) == 68 && offset_of!(v6::CeColl, ce_seq_num) == 76);
    assert!(offset_of!(v6::CeColl, stream) == 80);
    assert!(offset_of!(v6::CeSync, n_ranks) == 4);
    assert!(offset_of!(v6::CeBatch, total_bytes) == 8 && offset_of!(v6::CeBatch, use_intra_sync) == 16);
    // v1–v3 state args.
    assert!(offset_of!(ProxyOpArgsV1, steps) == 8);
};
