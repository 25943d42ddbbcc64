//! [`EventDescr`] / [`StateArgs`] → the C layout of the plugin's API version, with the drops of
//! NCCL's adapters (reference §12): a type or state the version does not have yields `None`, and
//! the caller then makes no call at all.
//!
//! Descriptors start all-zero and only the member of their type is written, field by field as the
//! field table (`abi.rs`) says. Pointers into the emitter's data (net payloads) are valid only for
//! the duration of the call, as NCCL's are.

use super::abi::{Layout, StateArgsV1, StateArgsV4};
use super::codec::{payload_ptr, PutCx};
use super::ApiVersion;
use crate::event::{EventDescr, ProxyOpState, ProxyStepState, StateArgs};
use std::ffi::{c_char, c_int, c_void};

/// Plugin handles of an event's relatives, already looked up (NULL when unknown).
#[derive(Clone, Copy, Debug)]
pub struct Links {
    /// The header's `parentObj`.
    pub parent: *mut c_void,
    /// v5+ `coll.parentGroup` / `p2p.parentGroup`.
    pub group: *mut c_void,
}

/// What v1–v3 Coll/P2p descriptors carry about the communicator.
#[derive(Clone, Copy, Debug)]
pub struct CommRef {
    pub name: *const c_char,
    pub hash: u64,
}

/// The header's `rank`: NCCL fills it for Coll, P2p, ProxyOp, ProxyStep and NetPlugin only.
fn rank(ev: &EventDescr<'_>) -> c_int {
    match *ev {
        EventDescr::Coll { rank, .. }
        | EventDescr::P2p { rank, .. }
        | EventDescr::ProxyOp { rank, .. }
        | EventDescr::ProxyStep { rank, .. }
        | EventDescr::NetPlugin { rank, .. } => rank,
        _ => 0,
    }
}

/// `ev` as a descriptor of version `D`, or `None` when the version has no such type (v1 Coll
/// carries codes, v1–v3 Coll/P2p the communicator as NCCL 2.23–2.26 filled it, v5+ the legacy
/// Group's handle).
pub fn descr<D: Layout>(ev: &EventDescr<'_>, links: Links, comm: CommRef) -> Option<D> {
    let mut d = D::header(ev.event_type().bit(), links.parent, rank(ev))?;
    let cx = PutCx { comm_name: comm.name, comm_hash: comm.hash, group: links.group };
    d.put(ev, &cx).then_some(d)
}

/// A state for v1–v3 (16-byte arguments), or `None` where their adapters drop it: ProxyOp
/// InProgress, ProxyStep SendPeerWait, NetPluginUpdate, KernelChStop, GroupApi and CE states.
/// ProxyStep arguments are zero (v1–v3 had no step arguments); ProxyOp states 0–7 carry
/// transSize and steps as in NCCL 2.23–2.26.
pub fn state_v1(st: &StateArgs<'_>) -> Option<(c_int, StateArgsV1)> {
    let mut a = StateArgsV1::zeroed();
    match *st {
        StateArgs::ProxyOp { state: ProxyOpState::InProgress, .. } => return None,
        StateArgs::ProxyOp { trans_size, steps, .. } => {
            a.proxy_op.trans_size = trans_size;
            a.proxy_op.steps = steps;
        }
        StateArgs::ProxyStep { state: ProxyStepState::SendPeerWait, .. } => return None,
        StateArgs::ProxyStep { .. } => {}
        StateArgs::ProxyCtrl { appended_proxy_ops, .. } => a.proxy_ctrl.appended_proxy_ops = appended_proxy_ops,
        StateArgs::NetPluginUpdate { .. }
        | StateArgs::KernelChStop { .. }
        | StateArgs::GroupApi { .. }
        | StateArgs::Ce { .. } => return None,
    }
    Some((state_number(st), a))
}

/// A state for v4–v6 (8-byte arguments; `None` inside means a NULL argument pointer, as NCCL
/// passes for GroupApi states), or `None` where the version has no such state: ProxyOp states
/// 0–7 (deprecated in v4, never emitted by 2.27+), GroupApi states before v5, CE states always
/// (NCCL declares them but never emits them).
pub fn state_v4(st: &StateArgs<'_>, version: ApiVersion) -> Option<(c_int, Option<StateArgsV4>)> {
    let mut a = StateArgsV4::zeroed();
    match *st {
        StateArgs::ProxyOp { state: ProxyOpState::InProgress, .. } => {}
        StateArgs::ProxyOp { .. } => return None,
        StateArgs::ProxyStep { trans_size, .. } => a.trans_size = trans_size,
        StateArgs::ProxyCtrl { appended_proxy_ops, .. } => a.proxy_ctrl.appended_proxy_ops = appended_proxy_ops,
        StateArgs::NetPluginUpdate { data } => a.net_data = payload_ptr(data),
        StateArgs::KernelChStop { p_timer } => a.p_timer = p_timer,
        StateArgs::GroupApi { .. } if version >= ApiVersion::V5 => return Some((state_number(st), None)),
        StateArgs::GroupApi { .. } | StateArgs::Ce { .. } => return None,
    }
    Some((state_number(st), Some(a)))
}

fn state_number(st: &StateArgs<'_>) -> c_int {
    // NCCL's state numbers are 0–30, so the cast never truncates.
    st.state_raw() as c_int
}

#[cfg(test)]
#[path = "convert_tests.rs"]
mod tests;
