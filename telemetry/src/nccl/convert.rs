//! [`EventDescr`] / [`StateArgs`] → the C layout of the plugin's API version, with the drops of
//! NCCL's adapters (reference §12): a type or state the version does not have yields `None`, and
//! the caller then makes no call at all.
//!
//! Descriptors start all-zero and only the member of their type is written. Pointers into the
//! emitter's data (net payloads) are valid only for the duration of the call, as NCCL's are.

use super::abi::*;
use super::names;
use super::ApiVersion;
use crate::event::{EventDescr, ProxyOpState, ProxyStepState, StateArgs};
use std::ffi::{c_char, c_int, c_void};
use std::ptr;

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

fn addr(a: usize) -> *mut c_void {
    a as *mut c_void
}

fn bytes(d: &[u8]) -> *mut c_void {
    if d.is_empty() {
        ptr::null_mut()
    } else {
        d.as_ptr().cast_mut().cast()
    }
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

fn type_bit(ev: &EventDescr<'_>) -> u64 {
    ev.event_type().bit()
}

/// `type` of v1–v4: a byte. Only types whose bit fits (0–7) reach these versions.
fn narrow_type(ev: &EventDescr<'_>) -> Option<u8> {
    u8::try_from(type_bit(ev)).ok()
}

fn proxy_op(ev: &EventDescr<'_>) -> Option<ProxyOp> {
    match *ev {
        EventDescr::ProxyOp { pid, channel_id, peer, n_steps, chunk_size, is_send, .. } => {
            Some(ProxyOp { pid, channel_id, _pad: [0; 3], peer, n_steps, chunk_size, is_send: c_int::from(is_send) })
        }
        _ => None,
    }
}

/// v1: numeric codes; name and comm hash filled as NCCL 2.23 filled them natively.
pub fn v1(ev: &EventDescr<'_>, links: Links, comm: CommRef) -> Option<DescrV1> {
    let mut d = DescrV1::new(narrow_type(ev)?, links.parent, rank(ev));
    match *ev {
        EventDescr::Group | EventDescr::ProxyCtrl => {}
        EventDescr::Coll {
            seq_number,
            func,
            send_buff,
            recv_buff,
            count,
            root,
            datatype,
            n_channels,
            n_warps,
            algo,
            proto,
            ..
        } => {
            d.u.coll.name = comm.name;
            d.u.coll.comm_hash = comm.hash;
            d.u.coll.seq_number = seq_number;
            d.u.coll.func = names::func_code(func);
            d.u.coll.send_buff = addr(send_buff);
            d.u.coll.recv_buff = addr(recv_buff);
            d.u.coll.count = count;
            d.u.coll.root = root;
            d.u.coll.datatype = names::datatype_code(datatype);
            d.u.coll.n_max_channels = n_channels;
            d.u.coll.n_warps = n_warps;
            d.u.coll.algo = names::algo_code(algo);
            d.u.coll.proto = names::proto_code(proto);
            d.u.coll.is_collnet = c_int::from(names::is_collnet(algo));
            d.u.coll.is_nvls = c_int::from(names::is_nvls(algo));
        }
        EventDescr::P2p { func, buff, datatype, count, peer, .. } => {
            d.u.p2p.name = comm.name;
            d.u.p2p.comm_hash = comm.hash;
            d.u.p2p.func = names::func_code(func);
            d.u.p2p.buff = addr(buff);
            d.u.p2p.datatype = names::datatype_code(datatype);
            d.u.p2p.count = count;
            d.u.p2p.peer = peer;
        }
        EventDescr::ProxyOp { .. } => d.u.proxy_op = proxy_op(ev)?,
        EventDescr::ProxyStep { step, .. } => d.u.proxy_step.step = step,
        _ => return None,
    }
    Some(d)
}

/// v2: strings; `trafficBytes` unknown (0).
pub fn v2(ev: &EventDescr<'_>, links: Links, comm: CommRef) -> Option<DescrV2> {
    let mut d = DescrV2::new(narrow_type(ev)?, links.parent, rank(ev));
    match *ev {
        EventDescr::Group | EventDescr::ProxyCtrl => {}
        EventDescr::Coll {
            seq_number,
            func,
            send_buff,
            recv_buff,
            count,
            root,
            datatype,
            n_channels,
            n_warps,
            algo,
            proto,
            ..
        } => {
            d.u.coll.name = comm.name;
            d.u.coll.comm_hash = comm.hash;
            d.u.coll.seq_number = seq_number;
            d.u.coll.func = names::func(func).as_ptr();
            d.u.coll.send_buff = addr(send_buff);
            d.u.coll.recv_buff = addr(recv_buff);
            d.u.coll.count = count;
            d.u.coll.root = root;
            d.u.coll.datatype = names::datatype(datatype).as_ptr();
            d.u.coll.n_max_channels = n_channels;
            d.u.coll.n_warps = n_warps;
            d.u.coll.algo = names::algo(algo).as_ptr();
            d.u.coll.proto = names::proto(proto).as_ptr();
        }
        EventDescr::P2p { func, buff, datatype, count, peer, .. } => {
            d.u.p2p.name = comm.name;
            d.u.p2p.comm_hash = comm.hash;
            d.u.p2p.func = names::func(func).as_ptr();
            d.u.p2p.buff = addr(buff);
            d.u.p2p.datatype = names::datatype(datatype).as_ptr();
            d.u.p2p.count = count;
            d.u.p2p.peer = peer;
        }
        EventDescr::ProxyOp { .. } => d.u.proxy_op = proxy_op(ev)?,
        EventDescr::ProxyStep { step, .. } => d.u.proxy_step.step = step,
        _ => return None,
    }
    Some(d)
}

/// v3: adds KernelCh (no timestamp) and NetPlugin.
pub fn v3(ev: &EventDescr<'_>, links: Links, comm: CommRef) -> Option<DescrV3> {
    let mut d = DescrV3::new(narrow_type(ev)?, links.parent, rank(ev));
    match *ev {
        EventDescr::Group | EventDescr::ProxyCtrl => {}
        EventDescr::Coll {
            seq_number,
            func,
            send_buff,
            recv_buff,
            count,
            root,
            datatype,
            n_channels,
            n_warps,
            algo,
            proto,
            ..
        } => {
            d.u.coll.name = comm.name;
            d.u.coll.comm_hash = comm.hash;
            d.u.coll.seq_number = seq_number;
            d.u.coll.func = names::func(func).as_ptr();
            d.u.coll.send_buff = addr(send_buff);
            d.u.coll.recv_buff = addr(recv_buff);
            d.u.coll.count = count;
            d.u.coll.root = root;
            d.u.coll.datatype = names::datatype(datatype).as_ptr();
            d.u.coll.n_max_channels = n_channels;
            d.u.coll.n_warps = n_warps;
            d.u.coll.algo = names::algo(algo).as_ptr();
            d.u.coll.proto = names::proto(proto).as_ptr();
        }
        EventDescr::P2p { func, buff, datatype, count, peer, .. } => {
            d.u.p2p.name = comm.name;
            d.u.p2p.comm_hash = comm.hash;
            d.u.p2p.func = names::func(func).as_ptr();
            d.u.p2p.buff = addr(buff);
            d.u.p2p.datatype = names::datatype(datatype).as_ptr();
            d.u.p2p.count = count;
            d.u.p2p.peer = peer;
        }
        EventDescr::ProxyOp { .. } => d.u.proxy_op = proxy_op(ev)?,
        EventDescr::ProxyStep { step, .. } => d.u.proxy_step.step = step,
        EventDescr::KernelCh { channel_id, .. } => d.u.kernel_ch.channel_id = channel_id,
        EventDescr::NetPlugin { id, data, .. } => {
            d.u.net_plugin.id = id;
            d.u.net_plugin.data = bytes(data);
        }
        _ => return None,
    }
    Some(d)
}

/// v4: no comm name/hash, channel counts, KernelCh timestamps; no API events.
pub fn v4(ev: &EventDescr<'_>, links: Links) -> Option<DescrV4> {
    let mut d = DescrV4::new(narrow_type(ev)?, links.parent, rank(ev));
    match *ev {
        EventDescr::Group | EventDescr::ProxyCtrl => {}
        EventDescr::Coll {
            seq_number,
            func,
            send_buff,
            recv_buff,
            count,
            root,
            datatype,
            n_channels,
            n_warps,
            algo,
            proto,
            ..
        } => {
            d.u.coll.seq_number = seq_number;
            d.u.coll.func = names::func(func).as_ptr();
            d.u.coll.send_buff = addr(send_buff);
            d.u.coll.recv_buff = addr(recv_buff);
            d.u.coll.count = count;
            d.u.coll.root = root;
            d.u.coll.datatype = names::datatype(datatype).as_ptr();
            d.u.coll.n_channels = n_channels;
            d.u.coll.n_warps = n_warps;
            d.u.coll.algo = names::algo(algo).as_ptr();
            d.u.coll.proto = names::proto(proto).as_ptr();
        }
        EventDescr::P2p { func, buff, datatype, count, peer, n_channels, .. } => {
            d.u.p2p.func = names::func(func).as_ptr();
            d.u.p2p.buff = addr(buff);
            d.u.p2p.datatype = names::datatype(datatype).as_ptr();
            d.u.p2p.count = count;
            d.u.p2p.peer = peer;
            d.u.p2p.n_channels = n_channels;
        }
        EventDescr::ProxyOp { .. } => d.u.proxy_op = proxy_op(ev)?,
        EventDescr::ProxyStep { step, .. } => d.u.proxy_step.step = step,
        EventDescr::KernelCh { channel_id, p_timer } => {
            d.u.kernel_ch.channel_id = channel_id;
            d.u.kernel_ch.p_timer = p_timer;
        }
        EventDescr::NetPlugin { id, data, .. } => {
            d.u.net_plugin.id = id;
            d.u.net_plugin.data = bytes(data);
        }
        _ => return None,
    }
    Some(d)
}

/// Writes the members v5 and v6 share; `false` for a type v5 does not have. A macro because the
/// two unions are distinct types with the same member names.
macro_rules! fill_v5_members {
    ($d:ident, $ev:expr, $links:expr) => {
        match *$ev {
            EventDescr::Group | EventDescr::ProxyCtrl => true,
            EventDescr::GroupApi { graph_captured, group_depth } => {
                $d.u.group_api.graph_captured = u8::from(graph_captured);
                $d.u.group_api.group_depth = group_depth;
                true
            }
            EventDescr::CollApi { func, count, datatype, root, stream, graph_captured } => {
                $d.u.coll_api.func = names::func(func).as_ptr();
                $d.u.coll_api.count = count;
                $d.u.coll_api.datatype = names::datatype(datatype).as_ptr();
                $d.u.coll_api.root = root;
                $d.u.coll_api.stream = addr(stream);
                $d.u.coll_api.graph_captured = u8::from(graph_captured);
                true
            }
            EventDescr::P2pApi { func, count, datatype, stream, graph_captured } => {
                $d.u.p2p_api.func = names::func(func).as_ptr();
                $d.u.p2p_api.count = count;
                $d.u.p2p_api.datatype = names::datatype(datatype).as_ptr();
                $d.u.p2p_api.stream = addr(stream);
                $d.u.p2p_api.graph_captured = u8::from(graph_captured);
                true
            }
            EventDescr::KernelLaunch { stream } => {
                $d.u.kernel_launch.stream = addr(stream);
                true
            }
            EventDescr::Coll {
                seq_number,
                func,
                send_buff,
                recv_buff,
                count,
                root,
                datatype,
                n_channels,
                n_warps,
                algo,
                proto,
                ..
            } => {
                $d.u.coll.seq_number = seq_number;
                $d.u.coll.func = names::func(func).as_ptr();
                $d.u.coll.send_buff = addr(send_buff);
                $d.u.coll.recv_buff = addr(recv_buff);
                $d.u.coll.count = count;
                $d.u.coll.root = root;
                $d.u.coll.datatype = names::datatype(datatype).as_ptr();
                $d.u.coll.n_channels = n_channels;
                $d.u.coll.n_warps = n_warps;
                $d.u.coll.algo = names::algo(algo).as_ptr();
                $d.u.coll.proto = names::proto(proto).as_ptr();
                $d.u.coll.parent_group = $links.group;
                true
            }
            EventDescr::P2p { func, buff, datatype, count, peer, n_channels, .. } => {
                $d.u.p2p.func = names::func(func).as_ptr();
                $d.u.p2p.buff = addr(buff);
                $d.u.p2p.datatype = names::datatype(datatype).as_ptr();
                $d.u.p2p.count = count;
                $d.u.p2p.peer = peer;
                $d.u.p2p.n_channels = n_channels;
                $d.u.p2p.parent_group = $links.group;
                true
            }
            EventDescr::ProxyOp { .. } => match proxy_op($ev) {
                Some(op) => {
                    $d.u.proxy_op = op;
                    true
                }
                None => false,
            },
            EventDescr::ProxyStep { step, .. } => {
                $d.u.proxy_step.step = step;
                true
            }
            EventDescr::KernelCh { channel_id, p_timer } => {
                $d.u.kernel_ch.channel_id = channel_id;
                $d.u.kernel_ch.p_timer = p_timer;
                true
            }
            EventDescr::NetPlugin { id, data, .. } => {
                $d.u.net_plugin.id = id;
                $d.u.net_plugin.data = bytes(data);
                true
            }
            EventDescr::CeColl { .. } | EventDescr::CeSync { .. } | EventDescr::CeBatch { .. } => false,
        }
    };
}

/// v5: the API events and `parentGroup`; no copy-engine events.
pub fn v5(ev: &EventDescr<'_>, links: Links) -> Option<DescrV5> {
    let mut d = DescrV5::new(type_bit(ev), links.parent, rank(ev));
    fill_v5_members!(d, ev, links).then_some(d)
}

/// v6: v5 plus the copy-engine events.
pub fn v6(ev: &EventDescr<'_>, links: Links) -> Option<DescrV6> {
    let mut d = DescrV6::new(type_bit(ev), links.parent, rank(ev));
    match *ev {
        EventDescr::CeColl {
            seq_number,
            func,
            send_buff,
            recv_buff,
            count,
            root,
            datatype,
            sync_strategy,
            intra_batch_sync,
            batch_size,
            num_batches,
            ce_seq_num,
            stream,
        } => {
            d.u.ce_coll.seq_number = seq_number;
            d.u.ce_coll.func = names::func(func).as_ptr();
            d.u.ce_coll.send_buff = addr(send_buff);
            d.u.ce_coll.recv_buff = addr(recv_buff);
            d.u.ce_coll.count = count;
            d.u.ce_coll.root = root;
            d.u.ce_coll.datatype = names::datatype(datatype).as_ptr();
            d.u.ce_coll.sync_strategy = names::sync_strategy(sync_strategy).as_ptr();
            d.u.ce_coll.intra_batch_sync = u8::from(intra_batch_sync);
            d.u.ce_coll.batch_size = batch_size;
            d.u.ce_coll.num_batches = num_batches;
            d.u.ce_coll.ce_seq_num = ce_seq_num;
            d.u.ce_coll.stream = addr(stream);
            Some(d)
        }
        EventDescr::CeSync { is_complete, n_ranks } => {
            d.u.ce_sync.is_complete = u8::from(is_complete);
            d.u.ce_sync.n_ranks = n_ranks;
            Some(d)
        }
        EventDescr::CeBatch { num_ops, total_bytes, use_intra_sync } => {
            d.u.ce_batch.num_ops = num_ops;
            d.u.ce_batch.total_bytes = total_bytes;
            d.u.ce_batch.use_intra_sync = u8::from(use_intra_sync);
            Some(d)
        }
        _ => fill_v5_members!(d, ev, links).then_some(d),
    }
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
        StateArgs::NetPluginUpdate { data } => a.net_data = bytes(data),
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
