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

use super::abi::{Layout, StateArgsV1, StateArgsV4};
use super::codec::{handle, GetCx};
use super::ApiVersion;
use crate::event::{
    CeState, EventDescr, EventId, EventType, GroupApiState, ProxyCtrlState, ProxyOpState, ProxyStepState, StateArgs,
};
use std::ffi::{c_int, c_void};
use std::ptr::addr_of;

pub use super::codec::{comm_name, name, net_payload_len, CommFields, MAX_COMM_NAME, MAX_NAME};

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

fn event_type(version: ApiVersion, raw: u64) -> Result<EventType, DecodeError> {
    EventType::from_bit(raw)
        .filter(|t| version.known_types().contains(*t))
        .ok_or(DecodeError::UnknownType { version, type_: raw })
}

/// `startEvent` of a plugin of version `D` (`DescrV1` … `DescrV6`): the descriptor, read.
///
/// # Safety
/// `d` is NULL or points to a readable descriptor of version `D` whose strings are NULL or
/// readable C strings and whose NetPlugin `data` is NULL or holds the payload its id names;
/// `handles` must not panic.
pub unsafe fn descr<'a, D: Layout>(
    d: *const D,
    handles: impl Fn(usize) -> Option<EventId>,
) -> Result<Decoded<'a>, DecodeError> {
    if d.is_null() {
        return Err(DecodeError::NullDescriptor);
    }
    // SAFETY: non-NULL; the caller promises a readable descriptor of this version.
    let (raw, rank, parent) = unsafe { D::read_header(d) };
    let t = event_type(D::VERSION, raw)?;
    let mut cx = GetCx::new(&handles);
    // SAFETY: `t` is one of the version's types and the member read is the type's (the caller's
    // promise).
    let descr =
        unsafe { D::get(d, t, rank, &mut cx) }.ok_or(DecodeError::UnknownType { version: D::VERSION, type_: raw })?;
    Ok(Decoded { descr, parent: handle(parent as usize, &handles), comm: cx.comm })
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

/// `recordEventState` of a plugin of `version`: v1–v3 arguments ([`state_v1`]) or v4–v6 ones
/// ([`state_v4`]).
///
/// # Safety
/// `args` is NULL or points to readable state arguments of `version`.
pub unsafe fn state<'a>(version: ApiVersion, state: c_int, args: *const c_void) -> Result<StateArgs<'a>, DecodeError> {
    if version < ApiVersion::V4 {
        // SAFETY: v1–v3 arguments (the caller's promise).
        unsafe { state_v1(version, state, args.cast()) }
    } else {
        // SAFETY: v4–v6 arguments (the caller's promise).
        unsafe { state_v4(version, state, args.cast()) }
    }
}

#[cfg(test)]
#[path = "decode_tests.rs"]
mod tests;
