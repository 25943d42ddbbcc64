//! The plugin side of the ABI, the reverse of `convert`: a descriptor or state that NCCL hands
//! to a plugin's `startEvent` / `recordEventState`, read back into [`EventDescr`] /
//! [`StateArgs`]. `libnccl-profiler-occl.so` uses it for every version, v1 to v6.
//!
//! Nothing a host passes can make these functions misbehave, short of a dangling pointer: a NULL
//! descriptor, a type that is not one bit of the version's, or a state the version does not have
//! is an error; NULL state arguments read as zeros; a NULL, unterminated (within
//! [`MAX_NAME`] bytes) or non-UTF-8 string reads as "Unknown"; v1's numeric codes become NCCL's
//! spellings ("Unknown" out of range). Fields are read one at a time through raw pointers,
//! never by copying a union member, because NCCL's adapters for older plugins leave the bytes of
//! other members, and the padding, uninitialised (reference §12).
//!
//! Handles (`parentObj`, `parentGroup`) are the plugin's own: the caller maps them to event ids
//! with a function that returns `None` for NULL or for a value it did not issue.

use super::abi::*;
use super::names;
use super::ApiVersion;
use crate::event::{
    CeState, EventDescr, EventId, EventType, GroupApiState, ProxyCtrlState, ProxyOpState, ProxyStepState, StateArgs,
};
use std::ffi::{c_char, c_int};
use std::ptr::addr_of;

/// A string longer than this (without its NUL) is not one of NCCL's names; it reads "Unknown"
/// and nothing past it is read.
pub const MAX_NAME: usize = 256;
/// The same bound for a communicator name (`commName`, v1–v3 `coll.name`): an application's
/// string, so allowed to be longer.
pub const MAX_COMM_NAME: usize = 1024;

const UNKNOWN: &str = "Unknown";

/// What a host passed that a plugin cannot use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("NULL event descriptor")]
    NullDescriptor,
    #[error("event type {type_:#x} is not an event type of profiler API {version}")]
    UnknownType { version: ApiVersion, type_: u64 },
    #[error("state {state} is not an event state of profiler API {version}")]
    UnknownState { version: ApiVersion, state: c_int },
}

/// The communicator fields of a v1–v3 Coll or P2p descriptor (NCCL 2.23–2.26 fill them; 2.27+
/// passes NULL and 0 to these versions).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CommFields<'a> {
    pub name: Option<&'a str>,
    pub hash: u64,
}

/// One `startEvent` call, read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Decoded<'a> {
    pub descr: EventDescr<'a>,
    /// `parentObj`, if it is one of the caller's handles.
    pub parent: Option<EventId>,
    /// v1–v3 Coll/P2p only.
    pub comm: Option<CommFields<'a>>,
}

/// Reads one field through a raw pointer without touching the rest of the union.
macro_rules! rd {
    ($p:expr, $($f:tt)+) => {
        addr_of!((*$p).$($f)+).read()
    };
}

/// Bytes up to the NUL, if there is one within `max`.
///
/// # Safety
/// `p` is non-NULL and readable up to its NUL or `max` bytes, whichever comes first.
unsafe fn bounded<'a>(p: *const c_char, max: usize) -> Option<&'a [u8]> {
    let mut n = 0;
    // SAFETY: each byte read is at or before the first NUL and within `max` (caller's promise).
    while n < max && unsafe { p.add(n).read() } != 0 {
        n += 1;
    }
    // SAFETY: the `n` bytes were just read.
    (n < max).then(|| unsafe { std::slice::from_raw_parts(p.cast::<u8>(), n) })
}

/// One of NCCL's names: "Unknown" when NULL, too long or not UTF-8.
///
/// # Safety
/// `p` is NULL or a string readable up to its NUL or [`MAX_NAME`] bytes.
pub unsafe fn name<'a>(p: *const c_char) -> &'a str {
    if p.is_null() {
        return UNKNOWN;
    }
    // SAFETY: the caller's promise.
    unsafe { bounded(p, MAX_NAME) }.and_then(|b| std::str::from_utf8(b).ok()).unwrap_or(UNKNOWN)
}

/// A communicator name: `None` when NULL, "Unknown" when too long or not UTF-8.
///
/// # Safety
/// `p` is NULL or a string readable up to its NUL or [`MAX_COMM_NAME`] bytes.
pub unsafe fn comm_name<'a>(p: *const c_char) -> Option<&'a str> {
    if p.is_null() {
        return None;
    }
    // SAFETY: the caller's promise.
    Some(unsafe { bounded(p, MAX_COMM_NAME) }.and_then(|b| std::str::from_utf8(b).ok()).unwrap_or(UNKNOWN))
}

/// Bytes of a NetPlugin payload, known from its id: version 1 of NCCL's IB (net type 1, 40
/// bytes) and socket (net type 2, 24 bytes) payloads. Any other payload's size is not in the
/// ABI, so it is not read (0).
pub fn net_payload_len(id: i64) -> usize {
    match ((id >> 16) & 0xffff, id & 0xffff) {
        (1, 1) => 40,
        (2, 1) => 24,
        _ => 0,
    }
}

fn event_type(version: ApiVersion, raw: u64) -> Result<EventType, DecodeError> {
    EventType::from_bit(raw)
        .filter(|t| version.known_types().contains(*t))
        .ok_or(DecodeError::UnknownType { version, type_: raw })
}

fn handle<F: Fn(usize) -> Option<EventId>>(h: usize, handles: &F) -> Option<EventId> {
    if h == 0 {
        None
    } else {
        handles(h)
    }
}

/// # Safety
/// `p` points to a readable `ProxyOp` member.
unsafe fn proxy_op<'a>(p: *const ProxyOp, rank: i32) -> EventDescr<'a> {
    // SAFETY: the caller's promise; plain integer fields.
    unsafe {
        EventDescr::ProxyOp {
            rank,
            pid: rd!(p, pid),
            channel_id: rd!(p, channel_id),
            peer: rd!(p, peer),
            n_steps: rd!(p, n_steps),
            chunk_size: rd!(p, chunk_size),
            is_send: rd!(p, is_send) != 0,
        }
    }
}

/// # Safety
/// `p` points to a readable `NetPlugin` member whose `data` is NULL or holds the payload its id
/// names ([`net_payload_len`]).
unsafe fn net_plugin<'a>(p: *const NetPlugin, rank: i32) -> EventDescr<'a> {
    // SAFETY: the caller's promise.
    unsafe {
        let (id, data) = (rd!(p, id), rd!(p, data));
        let len = if data.is_null() { 0 } else { net_payload_len(id) };
        let data = if len == 0 { &[][..] } else { std::slice::from_raw_parts(data.cast::<u8>(), len) };
        EventDescr::NetPlugin { rank, id, data }
    }
}

/// The header: type, rank and parent, for any version's descriptor.
macro_rules! header {
    ($d:expr, $version:expr, $handles:expr) => {{
        if $d.is_null() {
            return Err(DecodeError::NullDescriptor);
        }
        // SAFETY: non-NULL; the caller promises a readable descriptor of this version.
        let (raw, rank, parent) = unsafe { (u64::from(rd!($d, type_)), rd!($d, rank), rd!($d, parent_obj)) };
        (event_type($version, raw)?, rank, handle(parent as usize, $handles))
    }};
}

/// Coll of v2 and v3 (same fields, different offsets); used inside the caller's `unsafe`.
macro_rules! coll_v2 {
    ($c:expr, $rank:expr) => {{
        let c = $c;
        let descr = EventDescr::Coll {
            rank: $rank,
            seq_number: rd!(c, seq_number),
            func: name(rd!(c, func)),
            send_buff: rd!(c, send_buff) as usize,
            recv_buff: rd!(c, recv_buff) as usize,
            count: rd!(c, count),
            root: rd!(c, root),
            datatype: name(rd!(c, datatype)),
            n_channels: rd!(c, n_max_channels),
            n_warps: rd!(c, n_warps),
            algo: name(rd!(c, algo)),
            proto: name(rd!(c, proto)),
            parent_group: None,
        };
        (descr, Some(CommFields { name: comm_name(rd!(c, name)), hash: rd!(c, comm_hash) }))
    }};
}

/// `startEvent` of a v1 plugin (numeric codes).
///
/// # Safety
/// `d` is NULL or points to a readable v1 descriptor whose strings are NULL or readable C
/// strings; `handles` must not panic.
pub unsafe fn v1<'a, F: Fn(usize) -> Option<EventId>>(
    d: *const DescrV1,
    handles: F,
) -> Result<Decoded<'a>, DecodeError> {
    let (t, rank, parent) = header!(d, ApiVersion::V1, &handles);
    // SAFETY: `d` is readable (checked non-NULL above) and the member read is the type's.
    let (descr, comm) = unsafe {
        let u = addr_of!((*d).u);
        match t {
            EventType::Coll => {
                let c = addr_of!((*u).coll);
                let descr = EventDescr::Coll {
                    rank,
                    seq_number: rd!(c, seq_number),
                    func: names::func_of_code(rd!(c, func)),
                    send_buff: rd!(c, send_buff) as usize,
                    recv_buff: rd!(c, recv_buff) as usize,
                    count: rd!(c, count),
                    root: rd!(c, root),
                    datatype: names::datatype_of_code(rd!(c, datatype)),
                    n_channels: rd!(c, n_max_channels),
                    n_warps: rd!(c, n_warps),
                    algo: names::algo_of_code(rd!(c, algo)),
                    proto: names::proto_of_code(rd!(c, proto)),
                    parent_group: None,
                };
                (descr, Some(CommFields { name: comm_name(rd!(c, name)), hash: rd!(c, comm_hash) }))
            }
            EventType::P2p => {
                let p = addr_of!((*u).p2p);
                let descr = EventDescr::P2p {
                    rank,
                    func: names::func_of_code(rd!(p, func)),
                    buff: rd!(p, buff) as usize,
                    datatype: names::datatype_of_code(rd!(p, datatype)),
                    count: rd!(p, count),
                    peer: rd!(p, peer),
                    n_channels: 0,
                    parent_group: None,
                };
                (descr, Some(CommFields { name: comm_name(rd!(p, name)), hash: rd!(p, comm_hash) }))
            }
            _ => (common_v1(t, rank, addr_of!((*u).proxy_op), addr_of!((*u).proxy_step)), None),
        }
    };
    Ok(Decoded { descr, parent, comm })
}

/// Group, ProxyCtrl, ProxyOp and ProxyStep, alike in every version (type already checked).
///
/// # Safety
/// The pointers are to the readable members of a descriptor of type `t`.
unsafe fn common_v1<'a>(t: EventType, rank: i32, op: *const ProxyOp, step: *const ProxyStep) -> EventDescr<'a> {
    match t {
        // SAFETY: the member of the type (caller's promise).
        EventType::ProxyOp => unsafe { proxy_op(op, rank) },
        // SAFETY: as above.
        EventType::ProxyStep => EventDescr::ProxyStep { rank, step: unsafe { rd!(step, step) } },
        EventType::ProxyCtrl => EventDescr::ProxyCtrl,
        _ => EventDescr::Group,
    }
}

/// The P2p member of v2 and v3.
///
/// # Safety
/// `p` points to a readable v2 `p2p` member.
unsafe fn p2p_v2<'a>(p: *const P2pV2, rank: i32) -> (EventDescr<'a>, Option<CommFields<'a>>) {
    // SAFETY: the caller's promise.
    unsafe {
        let descr = EventDescr::P2p {
            rank,
            func: name(rd!(p, func)),
            buff: rd!(p, buff) as usize,
            datatype: name(rd!(p, datatype)),
            count: rd!(p, count),
            peer: rd!(p, peer),
            n_channels: 0,
            parent_group: None,
        };
        (descr, Some(CommFields { name: comm_name(rd!(p, name)), hash: rd!(p, comm_hash) }))
    }
}

/// `startEvent` of a v2 plugin (strings).
///
/// # Safety
/// As [`v1`], for a v2 descriptor.
pub unsafe fn v2<'a, F: Fn(usize) -> Option<EventId>>(
    d: *const DescrV2,
    handles: F,
) -> Result<Decoded<'a>, DecodeError> {
    let (t, rank, parent) = header!(d, ApiVersion::V2, &handles);
    // SAFETY: as in `v1`.
    let (descr, comm) = unsafe {
        let u = addr_of!((*d).u);
        match t {
            EventType::Coll => coll_v2!(addr_of!((*u).coll), rank),
            EventType::P2p => p2p_v2(addr_of!((*u).p2p), rank),
            _ => (common_v1(t, rank, addr_of!((*u).proxy_op), addr_of!((*u).proxy_step)), None),
        }
    };
    Ok(Decoded { descr, parent, comm })
}

/// `startEvent` of a v3 plugin (KernelCh without a timestamp, NetPlugin).
///
/// # Safety
/// As [`v1`], for a v3 descriptor; a NetPlugin `data` holds the payload its id names.
pub unsafe fn v3<'a, F: Fn(usize) -> Option<EventId>>(
    d: *const DescrV3,
    handles: F,
) -> Result<Decoded<'a>, DecodeError> {
    let (t, rank, parent) = header!(d, ApiVersion::V3, &handles);
    // SAFETY: as in `v1`.
    let (descr, comm) = unsafe {
        let u = addr_of!((*d).u);
        match t {
            EventType::Coll => coll_v2!(addr_of!((*u).coll), rank),
            EventType::P2p => p2p_v2(addr_of!((*u).p2p), rank),
            EventType::KernelCh => {
                (EventDescr::KernelCh { channel_id: rd!(u, kernel_ch.channel_id), p_timer: 0 }, None)
            }
            EventType::NetPlugin => (net_plugin(addr_of!((*u).net_plugin), rank), None),
            _ => (common_v1(t, rank, addr_of!((*u).proxy_op), addr_of!((*u).proxy_step)), None),
        }
    };
    Ok(Decoded { descr, parent, comm })
}

/// KernelCh and NetPlugin of v4–v6 (type already checked).
///
/// # Safety
/// The pointers are to the readable members of a descriptor of type `t`.
unsafe fn kernel_or_net<'a>(t: EventType, rank: i32, k: *const KernelChV4, n: *const NetPlugin) -> EventDescr<'a> {
    if t == EventType::KernelCh {
        // SAFETY: the member of the type (caller's promise).
        unsafe { EventDescr::KernelCh { channel_id: rd!(k, channel_id), p_timer: rd!(k, p_timer) } }
    } else {
        // SAFETY: as above.
        unsafe { net_plugin(n, rank) }
    }
}

/// `startEvent` of a v4 plugin (no communicator fields; KernelCh timestamps).
///
/// # Safety
/// As [`v3`], for a v4 descriptor.
pub unsafe fn v4<'a, F: Fn(usize) -> Option<EventId>>(
    d: *const DescrV4,
    handles: F,
) -> Result<Decoded<'a>, DecodeError> {
    let (t, rank, parent) = header!(d, ApiVersion::V4, &handles);
    // SAFETY: as in `v1`.
    let descr = unsafe {
        let u = addr_of!((*d).u);
        match t {
            EventType::Coll => {
                let c = addr_of!((*u).coll);
                EventDescr::Coll {
                    rank,
                    seq_number: rd!(c, seq_number),
                    func: name(rd!(c, func)),
                    send_buff: rd!(c, send_buff) as usize,
                    recv_buff: rd!(c, recv_buff) as usize,
                    count: rd!(c, count),
                    root: rd!(c, root),
                    datatype: name(rd!(c, datatype)),
                    n_channels: rd!(c, n_channels),
                    n_warps: rd!(c, n_warps),
                    algo: name(rd!(c, algo)),
                    proto: name(rd!(c, proto)),
                    parent_group: None,
                }
            }
            EventType::P2p => {
                let p = addr_of!((*u).p2p);
                EventDescr::P2p {
                    rank,
                    func: name(rd!(p, func)),
                    buff: rd!(p, buff) as usize,
                    datatype: name(rd!(p, datatype)),
                    count: rd!(p, count),
                    peer: rd!(p, peer),
                    n_channels: rd!(p, n_channels),
                    parent_group: None,
                }
            }
            EventType::KernelCh | EventType::NetPlugin => {
                kernel_or_net(t, rank, addr_of!((*u).kernel_ch), addr_of!((*u).net_plugin))
            }
            _ => common_v1(t, rank, addr_of!((*u).proxy_op), addr_of!((*u).proxy_step)),
        }
    };
    Ok(Decoded { descr, parent, comm: None })
}

/// The members v5 and v6 share. A macro because the two unions are distinct types with the same
/// member names.
macro_rules! v5_members {
    ($u:expr, $t:expr, $rank:expr, $handles:expr) => {{
        let (u, t, rank) = ($u, $t, $rank);
        match t {
            EventType::GroupApi => EventDescr::GroupApi {
                graph_captured: rd!(u, group_api.graph_captured) != 0,
                group_depth: rd!(u, group_api.group_depth),
            },
            EventType::CollApi => {
                let a = addr_of!((*u).coll_api);
                EventDescr::CollApi {
                    func: name(rd!(a, func)),
                    count: rd!(a, count),
                    datatype: name(rd!(a, datatype)),
                    root: rd!(a, root),
                    stream: rd!(a, stream) as usize,
                    graph_captured: rd!(a, graph_captured) != 0,
                }
            }
            EventType::P2pApi => {
                let a = addr_of!((*u).p2p_api);
                EventDescr::P2pApi {
                    func: name(rd!(a, func)),
                    count: rd!(a, count),
                    datatype: name(rd!(a, datatype)),
                    stream: rd!(a, stream) as usize,
                    graph_captured: rd!(a, graph_captured) != 0,
                }
            }
            EventType::KernelLaunch => EventDescr::KernelLaunch { stream: rd!(u, kernel_launch.stream) as usize },
            EventType::Coll => {
                let c = addr_of!((*u).coll);
                EventDescr::Coll {
                    rank,
                    seq_number: rd!(c, seq_number),
                    func: name(rd!(c, func)),
                    send_buff: rd!(c, send_buff) as usize,
                    recv_buff: rd!(c, recv_buff) as usize,
                    count: rd!(c, count),
                    root: rd!(c, root),
                    datatype: name(rd!(c, datatype)),
                    n_channels: rd!(c, n_channels),
                    n_warps: rd!(c, n_warps),
                    algo: name(rd!(c, algo)),
                    proto: name(rd!(c, proto)),
                    parent_group: handle(rd!(c, parent_group) as usize, $handles),
                }
            }
            EventType::P2p => {
                let p = addr_of!((*u).p2p);
                EventDescr::P2p {
                    rank,
                    func: name(rd!(p, func)),
                    buff: rd!(p, buff) as usize,
                    datatype: name(rd!(p, datatype)),
                    count: rd!(p, count),
                    peer: rd!(p, peer),
                    n_channels: rd!(p, n_channels),
                    parent_group: handle(rd!(p, parent_group) as usize, $handles),
                }
            }
            EventType::KernelCh | EventType::NetPlugin => {
                kernel_or_net(t, rank, addr_of!((*u).kernel_ch), addr_of!((*u).net_plugin))
            }
            _ => common_v1(t, rank, addr_of!((*u).proxy_op), addr_of!((*u).proxy_step)),
        }
    }};
}

/// `startEvent` of a v5 plugin (API events, `parentGroup`).
///
/// # Safety
/// As [`v3`], for a v5 descriptor.
pub unsafe fn v5<'a, F: Fn(usize) -> Option<EventId>>(
    d: *const DescrV5,
    handles: F,
) -> Result<Decoded<'a>, DecodeError> {
    let (t, rank, parent) = header!(d, ApiVersion::V5, &handles);
    // SAFETY: as in `v1`.
    let descr = unsafe { v5_members!(addr_of!((*d).u), t, rank, &handles) };
    Ok(Decoded { descr, parent, comm: None })
}

/// `startEvent` of a v6 plugin (v5 plus the copy-engine events).
///
/// # Safety
/// As [`v3`], for a v6 descriptor.
pub unsafe fn v6<'a, F: Fn(usize) -> Option<EventId>>(
    d: *const DescrV6,
    handles: F,
) -> Result<Decoded<'a>, DecodeError> {
    let (t, rank, parent) = header!(d, ApiVersion::V6, &handles);
    // SAFETY: as in `v1`.
    let descr = unsafe {
        let u = addr_of!((*d).u);
        match t {
            EventType::CeColl => {
                let c = addr_of!((*u).ce_coll);
                EventDescr::CeColl {
                    seq_number: rd!(c, seq_number),
                    func: name(rd!(c, func)),
                    send_buff: rd!(c, send_buff) as usize,
                    recv_buff: rd!(c, recv_buff) as usize,
                    count: rd!(c, count),
                    root: rd!(c, root),
                    datatype: name(rd!(c, datatype)),
                    sync_strategy: name(rd!(c, sync_strategy)),
                    intra_batch_sync: rd!(c, intra_batch_sync) != 0,
                    batch_size: rd!(c, batch_size),
                    num_batches: rd!(c, num_batches),
                    ce_seq_num: rd!(c, ce_seq_num),
                    stream: rd!(c, stream) as usize,
                }
            }
            EventType::CeSync => {
                EventDescr::CeSync { is_complete: rd!(u, ce_sync.is_complete) != 0, n_ranks: rd!(u, ce_sync.n_ranks) }
            }
            EventType::CeBatch => EventDescr::CeBatch {
                num_ops: rd!(u, ce_batch.num_ops),
                total_bytes: rd!(u, ce_batch.total_bytes),
                use_intra_sync: rd!(u, ce_batch.use_intra_sync) != 0,
            },
            _ => v5_members!(u, t, rank, &handles),
        }
    };
    Ok(Decoded { descr, parent, comm: None })
}

fn proxy_op_state(n: c_int) -> Option<ProxyOpState> {
    use ProxyOpState as S;
    Some(match n {
        0 => S::SendPosted,
        1 => S::SendRemFifoWait,
        2 => S::SendTransmitted,
        3 => S::SendDone,
        4 => S::RecvPosted,
        5 => S::RecvReceived,
        6 => S::RecvTransmitted,
        7 => S::RecvDone,
        19 => S::InProgress,
        _ => return None,
    })
}

fn proxy_step_state(n: c_int) -> Option<ProxyStepState> {
    use ProxyStepState as S;
    Some(match n {
        8 => S::SendGpuWait,
        9 => S::SendWait,
        10 => S::RecvWait,
        11 => S::RecvFlushWait,
        12 => S::RecvGpuWait,
        20 => S::SendPeerWait,
        _ => return None,
    })
}

fn proxy_ctrl_state(n: c_int) -> Option<ProxyCtrlState> {
    use ProxyCtrlState as S;
    Some(match n {
        13 => S::Idle,
        14 => S::Active,
        15 => S::Sleep,
        16 => S::Wakeup,
        17 => S::Append,
        18 => S::AppendEnd,
        _ => return None,
    })
}

fn ce_state(n: c_int) -> Option<CeState> {
    use CeState as S;
    Some(match n {
        25 => S::CollStart,
        26 => S::CollComplete,
        27 => S::SyncStart,
        28 => S::SyncComplete,
        29 => S::BatchStart,
        30 => S::BatchComplete,
        _ => return None,
    })
}

/// `recordEventState` of a v1–v3 plugin: ProxyOp states 0–7 (with transSize and steps), ProxyStep
/// 8–12 (no arguments in these versions), ProxyCtrl 13–18.
///
/// # Safety
/// `args` is NULL or points to readable 16-byte v1–v3 state arguments.
pub unsafe fn state_v1<'a>(
    version: ApiVersion,
    state: c_int,
    args: *const StateArgsV1,
) -> Result<StateArgs<'a>, DecodeError> {
    let has = !args.is_null();
    let st = if let Some(s) = proxy_op_state(state).filter(|s| *s != ProxyOpState::InProgress) {
        // SAFETY: non-NULL arguments are readable (caller's promise); integer fields.
        let (trans_size, steps) =
            if has { unsafe { (rd!(args, proxy_op.trans_size), rd!(args, proxy_op.steps)) } } else { (0, 0) };
        StateArgs::ProxyOp { state: s, trans_size, steps }
    } else if let Some(s) = proxy_step_state(state).filter(|s| *s != ProxyStepState::SendPeerWait) {
        StateArgs::ProxyStep { state: s, trans_size: 0 }
    } else if let Some(s) = proxy_ctrl_state(state) {
        // SAFETY: as above.
        let appended_proxy_ops = if has { unsafe { rd!(args, proxy_ctrl.appended_proxy_ops) } } else { 0 };
        StateArgs::ProxyCtrl { state: s, appended_proxy_ops }
    } else {
        return Err(DecodeError::UnknownState { version, state });
    };
    Ok(st)
}

/// `recordEventState` of a v4–v6 plugin. ProxyOp states 0–7 (deprecated in v4, never emitted by
/// NCCL 2.27+) carry no arguments in these versions; NetPluginUpdate's payload has no size in
/// the call, so it is not read (`data` is empty); GroupApi states exist from v5, CE states in v6.
///
/// # Safety
/// `args` is NULL or points to readable 8-byte v4–v6 state arguments.
pub unsafe fn state_v4<'a>(
    version: ApiVersion,
    state: c_int,
    args: *const StateArgsV4,
) -> Result<StateArgs<'a>, DecodeError> {
    let has = !args.is_null();
    // SAFETY: non-NULL arguments are readable (caller's promise); each is a plain 8- or 4-byte
    // integer at offset 0.
    let word = || if has { unsafe { rd!(args, raw) } } else { 0 };
    // SAFETY: as above.
    let int = || if has { unsafe { rd!(args, proxy_ctrl.appended_proxy_ops) } } else { 0 };
    let st = if let Some(s) = proxy_op_state(state) {
        StateArgs::ProxyOp { state: s, trans_size: 0, steps: 0 }
    } else if let Some(s) = proxy_step_state(state) {
        StateArgs::ProxyStep { state: s, trans_size: word() as usize }
    } else if let Some(s) = proxy_ctrl_state(state) {
        StateArgs::ProxyCtrl { state: s, appended_proxy_ops: int() }
    } else if state == 21 {
        StateArgs::NetPluginUpdate { data: &[] }
    } else if state == 22 {
        StateArgs::KernelChStop { p_timer: word() }
    } else if version >= ApiVersion::V5 && (state == 23 || state == 24) {
        let s = if state == 23 { GroupApiState::StartApiStop } else { GroupApiState::EndApiStart };
        StateArgs::GroupApi { state: s }
    } else if let Some(s) = ce_state(state).filter(|_| version >= ApiVersion::V6) {
        StateArgs::Ce { state: s }
    } else {
        return Err(DecodeError::UnknownState { version, state });
    };
    Ok(st)
}

#[cfg(test)]
#[path = "decode_tests.rs"]
mod tests;
