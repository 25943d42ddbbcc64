//! Tests of the conversions (kept apart so convert.rs stays short). Reading a union member is
//! `unsafe`; every read here is of the member the test just had written.

use super::*;
use crate::event::{EventId, GroupApiState, ProxyCtrlState};
use crate::nccl::abi::{DescrV1, DescrV2, DescrV3, DescrV4, DescrV5, DescrV6};
use std::ffi::{c_char, CStr};
use std::num::NonZeroU64;

fn links() -> Links {
    Links { parent: 0x11 as *mut c_void, group: 0x22 as *mut c_void }
}

fn comm() -> CommRef {
    CommRef { name: c"c0".as_ptr(), hash: 0xABC }
}

fn coll() -> EventDescr<'static> {
    EventDescr::Coll {
        rank: 3,
        seq_number: 9,
        func: "AllReduce",
        send_buff: 0x1000,
        recv_buff: 0x2000,
        count: 1024,
        root: 0,
        datatype: "ncclFloat32",
        n_channels: 2,
        n_warps: 16,
        algo: "RING",
        proto: "SIMPLE",
        parent_group: Some(EventId(NonZeroU64::MIN)),
    }
}

fn s(p: *const c_char) -> &'static str {
    // SAFETY: every string the conversions write is a static C string of `names`.
    unsafe { CStr::from_ptr(p) }.to_str().expect("utf-8")
}

#[test]
fn v1_gets_codes_and_the_comm() {
    let d = descr::<DescrV1>(&coll(), links(), comm()).expect("v1 has Coll");
    assert_eq!((d.type_, d.parent_obj as usize, d.rank), (2, 0x11, 3));
    // SAFETY: the Coll member was written.
    let c = unsafe { d.u.coll };
    assert_eq!((c.func, c.datatype, c.algo, c.proto), (4, 7, 1, 2));
    assert_eq!((c.seq_number, c.count, c.n_max_channels, c.n_warps), (9, 1024, 2, 16));
    assert_eq!((c.comm_hash, s(c.name)), (0xABC, "c0"));
    assert_eq!((c.op, c.traffic_bytes, c.is_collnet, c.is_nvls), (0, 0, 0, 0));
    assert!(descr::<DescrV1>(&EventDescr::KernelCh { channel_id: 0, p_timer: 1 }, links(), comm()).is_none());
    assert!(
        descr::<DescrV1>(&EventDescr::GroupApi { graph_captured: false, group_depth: 1 }, links(), comm()).is_none()
    );
    let net = EventDescr::NetPlugin { rank: 0, id: 0x20001, data: &[1] };
    assert!(descr::<DescrV2>(&net, links(), comm()).is_none());
    assert!(descr::<DescrV3>(&net, links(), comm()).is_some());
}

#[test]
fn descriptors_start_all_zero() {
    let d = descr::<DescrV5>(&EventDescr::ProxyStep { rank: 1, step: 7 }, links(), comm());
    let d = d.expect("v5 has ProxyStep");
    // SAFETY: `raw` spans the union; it was zeroed and then `step` (the first 4 bytes) written.
    let raw = unsafe { d.u.raw };
    assert_eq!(raw[0], 7);
    assert!(raw[1..].iter().all(|w| *w == 0));
    assert_eq!(d.type_, 0x10);
}

#[test]
fn v5_and_v6_fill_their_members() {
    let d = descr::<DescrV5>(&coll(), links(), comm()).expect("coll");
    // SAFETY: the Coll member was written.
    let c = unsafe { d.u.coll };
    assert_eq!((s(c.func), s(c.datatype), s(c.algo), s(c.proto)), ("AllReduce", "ncclFloat32", "RING", "SIMPLE"));
    assert_eq!((d.parent_obj as usize, c.parent_group as usize), (0x11, 0x22));
    let api = EventDescr::CollApi {
        func: "Broadcast",
        count: 5,
        datatype: "ncclInt8",
        root: 2,
        stream: 0x77,
        graph_captured: true,
    };
    let d = descr::<DescrV5>(&api, links(), comm()).expect("CollApi");
    // SAFETY: the CollApi member was written.
    let a = unsafe { d.u.coll_api };
    assert_eq!((s(a.func), a.count, a.root, a.stream as usize, a.graph_captured), ("Broadcast", 5, 2, 0x77, 1));
    let ce = EventDescr::CeSync { is_complete: true, n_ranks: 4 };
    assert!(descr::<DescrV5>(&ce, links(), comm()).is_none());
    let d = descr::<DescrV6>(&ce, links(), comm()).expect("v6 has CE");
    // SAFETY: the CeSync member was written.
    let c = unsafe { d.u.ce_sync };
    assert_eq!((d.type_, c.is_complete, c.n_ranks), (0x2000, 1, 4));
    assert!(descr::<DescrV4>(&api, links(), comm()).is_none());
    let d = descr::<DescrV4>(&EventDescr::KernelCh { channel_id: 3, p_timer: 99 }, links(), comm()).expect("KernelCh");
    // SAFETY: the KernelCh member was written.
    let k = unsafe { d.u.kernel_ch };
    assert_eq!((k.channel_id, k.p_timer), (3, 99));
}

#[test]
fn states_follow_nccls_adapters() {
    let op = |state| StateArgs::ProxyOp { state, trans_size: 64, steps: 4 };
    let step = |state| StateArgs::ProxyStep { state, trans_size: 4096 };
    // v1–v3.
    let (n, a) = state_v1(&op(ProxyOpState::SendPosted)).expect("state 0");
    // SAFETY: the proxyOp member was written.
    assert_eq!((n, unsafe { a.proxy_op.trans_size }, unsafe { a.proxy_op.steps }), (0, 64, 4));
    assert!(state_v1(&op(ProxyOpState::InProgress)).is_none());
    let (n, a) = state_v1(&step(ProxyStepState::SendWait)).expect("state 9");
    // SAFETY: `raw` spans the union.
    assert_eq!((n, unsafe { a.raw }), (9, [0, 0]));
    assert!(state_v1(&step(ProxyStepState::SendPeerWait)).is_none());
    let ctrl = StateArgs::ProxyCtrl { state: ProxyCtrlState::AppendEnd, appended_proxy_ops: 3 };
    // SAFETY: the proxyCtrl member was written.
    assert_eq!(state_v1(&ctrl).map(|(n, a)| (n, unsafe { a.proxy_ctrl.appended_proxy_ops })), Some((18, 3)));
    assert!(state_v1(&StateArgs::KernelChStop { p_timer: 1 }).is_none());
    assert!(state_v1(&StateArgs::NetPluginUpdate { data: &[] }).is_none());
    // v4+.
    let v = ApiVersion::V5;
    assert!(state_v4(&op(ProxyOpState::SendPosted), v).is_none());
    let (n, a) = state_v4(&op(ProxyOpState::InProgress), v).expect("19");
    // SAFETY: `raw` spans the union.
    assert_eq!((n, a.map(|a| unsafe { a.raw })), (19, Some(0)));
    let (n, a) = state_v4(&step(ProxyStepState::SendPeerWait), v).expect("20");
    // SAFETY: transSize was written.
    assert_eq!((n, a.map(|a| unsafe { a.trans_size })), (20, Some(4096)));
    let (n, a) = state_v4(&StateArgs::KernelChStop { p_timer: 77 }, v).expect("22");
    // SAFETY: pTimer was written.
    assert_eq!((n, a.map(|a| unsafe { a.p_timer })), (22, Some(77)));
    let g = StateArgs::GroupApi { state: GroupApiState::EndApiStart };
    assert!(state_v4(&g, ApiVersion::V4).is_none());
    assert_eq!(state_v4(&g, ApiVersion::V5).map(|(n, a)| (n, a.is_none())), Some((24, true)));
    assert!(state_v4(&StateArgs::Ce { state: crate::event::CeState::CollStart }, ApiVersion::V6).is_none());
}
