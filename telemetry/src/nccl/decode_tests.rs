//! Tests of the reverse conversion: every event and state through `convert` (occl → C) and back
//! through `decode` for each version, and what a host can pass that no conversion would write.

use super::*;
use crate::mask::EventMask;
use crate::nccl::abi::{DescrV1, DescrV2, DescrV3, DescrV4, DescrV5, DescrV6};
use crate::nccl::convert::{self, CommRef, Links};
use std::ffi::c_void;
use std::num::NonZeroU64;
use std::ptr;

const PARENT: usize = 0x1100;
const GROUP: usize = 0x2200;

fn id(n: usize) -> EventId {
    EventId(NonZeroU64::new(n as u64).expect("non-zero"))
}

/// The test's handle table: every non-zero value is a handle, its own id.
fn ids(h: usize) -> Option<EventId> {
    Some(id(h))
}

fn links() -> Links {
    Links { parent: PARENT as *mut c_void, group: GROUP as *mut c_void }
}

fn comm() -> CommRef {
    CommRef { name: c"world".as_ptr(), hash: 0xC0FFEE }
}

/// NCCL's socket payload (version 1, net type 2): 24 bytes.
static SOCK: [u8; 24] = [1, 0, 0, 0, 0, 0, 0, 0, 7, 0, 0, 0, 1, 0, 0, 0, 0, 16, 0, 0, 0, 0, 0, 0];

/// One of every event type, with every field set to something non-zero.
fn every_event() -> Vec<EventDescr<'static>> {
    vec![
        EventDescr::Group,
        EventDescr::Coll {
            rank: 3,
            seq_number: 41,
            func: "ReduceScatter",
            send_buff: 0x1000,
            recv_buff: 0x2000,
            count: 1 << 20,
            root: 2,
            datatype: "ncclBfloat16",
            n_channels: 4,
            n_warps: 16,
            algo: "RING",
            proto: "LL128",
            parent_group: Some(id(GROUP)),
        },
        EventDescr::P2p {
            rank: 1,
            func: "Send",
            buff: 0x3000,
            datatype: "ncclInt64",
            count: 77,
            peer: 5,
            n_channels: 2,
            parent_group: Some(id(GROUP)),
        },
        EventDescr::ProxyOp {
            rank: 1,
            pid: 4242,
            channel_id: 3,
            peer: 6,
            n_steps: 8,
            chunk_size: 1 << 17,
            is_send: true,
        },
        EventDescr::ProxyStep { rank: 1, step: 7 },
        EventDescr::ProxyCtrl,
        EventDescr::KernelCh { channel_id: 9, p_timer: 123_456_789 },
        EventDescr::NetPlugin { rank: 1, id: 0x2_0001, data: &SOCK },
        EventDescr::GroupApi { graph_captured: true, group_depth: 2 },
        EventDescr::CollApi {
            func: "AllReduce",
            count: 99,
            datatype: "ncclFloat32",
            root: 0,
            stream: 0x77,
            graph_captured: true,
        },
        EventDescr::P2pApi { func: "Recv", count: 12, datatype: "ncclUint8", stream: 0x78, graph_captured: false },
        EventDescr::KernelLaunch { stream: 0x79 },
        EventDescr::CeColl {
            seq_number: 5,
            func: "AllGather",
            send_buff: 0x4000,
            recv_buff: 0x5000,
            count: 64,
            root: 0,
            datatype: "ncclFloat16",
            sync_strategy: "MC",
            intra_batch_sync: true,
            batch_size: 3,
            num_batches: 4,
            ce_seq_num: 6,
            stream: 0x7a,
        },
        EventDescr::CeSync { is_complete: true, n_ranks: 8 },
        EventDescr::CeBatch { num_ops: 3, total_bytes: 4096, use_intra_sync: true },
    ]
}

/// What `ev` looks like after a trip through version `v`: the fields that version lacks read as
/// zero, `parentGroup` exists from v5 on.
fn through(v: ApiVersion, mut ev: EventDescr<'static>) -> EventDescr<'static> {
    match &mut ev {
        EventDescr::Coll { parent_group, .. } if v < ApiVersion::V5 => *parent_group = None,
        EventDescr::P2p { n_channels, parent_group, .. } => {
            if v < ApiVersion::V4 {
                *n_channels = 0;
            }
            if v < ApiVersion::V5 {
                *parent_group = None;
            }
        }
        EventDescr::KernelCh { p_timer, .. } if v < ApiVersion::V4 => *p_timer = 0,
        _ => {}
    }
    ev
}

/// Converts with `convert` for version `v` and decodes the C descriptor again.
fn round_trip(v: ApiVersion, ev: &EventDescr<'_>) -> Option<Decoded<'static>> {
    // SAFETY (all arms): the descriptor was just written by `convert` and lives for the call;
    // its strings are `names`' statics and its payload is `SOCK`, both 'static.
    let r = unsafe {
        match v {
            ApiVersion::V1 => convert::descr::<DescrV1>(ev, links(), comm()).map(|d| descr(&d, ids)),
            ApiVersion::V2 => convert::descr::<DescrV2>(ev, links(), comm()).map(|d| descr(&d, ids)),
            ApiVersion::V3 => convert::descr::<DescrV3>(ev, links(), comm()).map(|d| descr(&d, ids)),
            ApiVersion::V4 => convert::descr::<DescrV4>(ev, links(), comm()).map(|d| descr(&d, ids)),
            ApiVersion::V5 => convert::descr::<DescrV5>(ev, links(), comm()).map(|d| descr(&d, ids)),
            ApiVersion::V6 => convert::descr::<DescrV6>(ev, links(), comm()).map(|d| descr(&d, ids)),
        }
    };
    r.map(|r| r.unwrap_or_else(|e| panic!("{v}: {ev:?} converted but does not decode: {e}")))
}

#[test]
fn every_event_survives_the_round_trip_of_every_version() {
    for v in ApiVersion::NEWEST_FIRST {
        let mut carried = EventMask::NONE;
        for ev in every_event() {
            let Some(back) = round_trip(v, &ev) else { continue };
            carried = carried.with(ev.event_type());
            assert_eq!(back.descr, through(v, ev), "{v}");
            assert_eq!(back.parent, Some(id(PARENT)), "{v} {:?}", ev.event_type());
            let comm_fields = matches!(ev, EventDescr::Coll { .. } | EventDescr::P2p { .. }) && v < ApiVersion::V4;
            let want = comm_fields.then_some(CommFields { name: Some("world"), hash: 0xC0FFEE });
            assert_eq!(back.comm, want, "{v} {:?}", ev.event_type());
        }
        assert_eq!(carried, v.known_types(), "{v}: the types both directions carry");
    }
}

#[test]
fn v1_codes_come_back_as_spellings_and_unknown_ones_as_unknown() {
    let ev = EventDescr::Coll {
        rank: 0,
        seq_number: 1,
        func: "AlltoAll", // v1 has no code of its own: Send's (6)
        send_buff: 0,
        recv_buff: 0,
        count: 1,
        root: 0,
        datatype: "ncclFloat8e4m3", // v1 falls back to Float64 (8)
        n_channels: 1,
        n_warps: 1,
        algo: "Bogus", // PAT (6)
        proto: "SIMPLE",
        parent_group: None,
    };
    let back = round_trip(ApiVersion::V1, &ev).expect("v1 has Coll");
    let EventDescr::Coll { func, datatype, algo, proto, .. } = back.descr else { panic!("{back:?}") };
    assert_eq!((func, datatype, algo, proto), ("Send", "ncclFloat64", "PAT", "SIMPLE"));
    let mut d = convert::descr::<DescrV1>(&ev, links(), comm()).expect("v1");
    d.u.coll.func = 200;
    d.u.coll.datatype = 10;
    d.u.coll.algo = 7;
    d.u.coll.proto = 3;
    // SAFETY: a descriptor of this test, with the comm name a static C string.
    let back = unsafe { descr(&d, ids) }.expect("decodes");
    let EventDescr::Coll { func, datatype, algo, proto, .. } = back.descr else { panic!("{back:?}") };
    assert_eq!([func, datatype, algo, proto], ["Unknown"; 4]);
}

/// One of every state, with non-zero arguments.
fn every_state() -> Vec<StateArgs<'static>> {
    let mut v = Vec::new();
    for s in [0, 1, 2, 3, 4, 5, 6, 7, 19] {
        v.push(StateArgs::ProxyOp { state: proxy_op_state(s).expect("op"), trans_size: 4096, steps: 4 });
    }
    for s in [8, 9, 10, 11, 12, 20] {
        v.push(StateArgs::ProxyStep { state: proxy_step_state(s).expect("step"), trans_size: 65536 });
    }
    for s in 13..=18 {
        v.push(StateArgs::ProxyCtrl { state: proxy_ctrl_state(s).expect("ctrl"), appended_proxy_ops: 3 });
    }
    v.push(StateArgs::NetPluginUpdate { data: &SOCK });
    v.push(StateArgs::KernelChStop { p_timer: 987_654_321 });
    v.push(StateArgs::GroupApi { state: GroupApiState::StartApiStop });
    v.push(StateArgs::GroupApi { state: GroupApiState::EndApiStart });
    for s in 25..=30 {
        v.push(StateArgs::Ce { state: ce_state(s).expect("ce") });
    }
    v
}

/// What a state looks like after a trip through version `v`.
fn state_through(v: ApiVersion, st: StateArgs<'static>) -> StateArgs<'static> {
    match st {
        StateArgs::ProxyStep { state, .. } if v < ApiVersion::V4 => StateArgs::ProxyStep { state, trans_size: 0 },
        // v4+ arguments have no ProxyOp member (InProgress gets zeroed arguments).
        StateArgs::ProxyOp { state, .. } if v >= ApiVersion::V4 => {
            StateArgs::ProxyOp { state, trans_size: 0, steps: 0 }
        }
        StateArgs::NetPluginUpdate { .. } => StateArgs::NetPluginUpdate { data: &[] },
        other => other,
    }
}

#[test]
fn every_state_survives_the_round_trip_of_every_version() {
    for v in ApiVersion::NEWEST_FIRST {
        let mut carried = 0;
        for st in every_state() {
            let back = if v < ApiVersion::V4 {
                convert::state_v1(&st).map(|(n, a)| {
                    // SAFETY: arguments written by `convert`, alive for the call.
                    unsafe { state_v1(v, n, &a) }
                })
            } else {
                convert::state_v4(&st, v).map(|(n, a)| {
                    let p = a.as_ref().map_or(ptr::null(), ptr::from_ref);
                    // SAFETY: as above, or NULL.
                    unsafe { state_v4(v, n, p) }
                })
            };
            let Some(back) = back else { continue };
            carried += 1;
            assert_eq!(back, Ok(state_through(v, st)), "{v}");
        }
        // v1–v3: ProxyOp 0–7, ProxyStep 8–12, ProxyCtrl 13–18. v4: ProxyOp InProgress only,
        // ProxyStep 8–12 and 20, ProxyCtrl, NetPluginUpdate, KernelChStop; v5 adds the GroupApi
        // states. `convert` never emits CE states (NCCL declares them but never emits them).
        let want = match v {
            ApiVersion::V1 | ApiVersion::V2 | ApiVersion::V3 => 8 + 5 + 6,
            ApiVersion::V4 => 1 + 6 + 6 + 2,
            ApiVersion::V5 | ApiVersion::V6 => 1 + 6 + 6 + 2 + 2,
        };
        assert_eq!(carried, want, "{v}");
    }
}

#[test]
fn states_a_version_lacks_are_errors_and_null_arguments_read_as_zero() {
    // SAFETY (every call): NULL arguments, or arguments of this test.
    unsafe {
        assert_eq!(
            state_v1(ApiVersion::V2, 99, ptr::null()),
            Err(DecodeError::UnknownState { version: ApiVersion::V2, state: 99 })
        );
        assert!(state_v1(ApiVersion::V3, 19, ptr::null()).is_err(), "InProgress is v4's");
        assert!(state_v1(ApiVersion::V3, 22, ptr::null()).is_err());
        assert!(state_v1(ApiVersion::V1, -1, ptr::null()).is_err());
        assert_eq!(
            state_v1(ApiVersion::V1, 3, ptr::null()),
            Ok(StateArgs::ProxyOp { state: ProxyOpState::SendDone, trans_size: 0, steps: 0 })
        );
        assert_eq!(
            state_v1(ApiVersion::V1, 18, ptr::null()),
            Ok(StateArgs::ProxyCtrl { state: ProxyCtrlState::AppendEnd, appended_proxy_ops: 0 })
        );
        assert!(state_v4(ApiVersion::V4, 23, ptr::null()).is_err(), "GroupApi states are v5's");
        assert!(state_v4(ApiVersion::V5, 25, ptr::null()).is_err(), "CE states are v6's");
        assert_eq!(state_v4(ApiVersion::V6, 30, ptr::null()), Ok(StateArgs::Ce { state: CeState::BatchComplete }));
        assert!(state_v4(ApiVersion::V6, 31, ptr::null()).is_err());
        assert!(state_v4(ApiVersion::V6, c_int::MIN, ptr::null()).is_err());
        assert_eq!(
            state_v4(ApiVersion::V5, 9, ptr::null()),
            Ok(StateArgs::ProxyStep { state: ProxyStepState::SendWait, trans_size: 0 })
        );
        assert_eq!(state_v4(ApiVersion::V4, 22, ptr::null()), Ok(StateArgs::KernelChStop { p_timer: 0 }));
        // The argument word is read whole for a size, as its low 4 bytes for a count.
        let a = StateArgsV4 { raw: 0x0000_0001_0000_0005 };
        assert_eq!(
            state_v4(ApiVersion::V5, 18, &a),
            Ok(StateArgs::ProxyCtrl { state: ProxyCtrlState::AppendEnd, appended_proxy_ops: 5 })
        );
        assert_eq!(
            state_v4(ApiVersion::V5, 11, &a),
            Ok(StateArgs::ProxyStep { state: ProxyStepState::RecvFlushWait, trans_size: 0x1_0000_0005 })
        );
    }
}

#[test]
fn null_descriptors_and_foreign_types_are_errors() {
    // SAFETY (every call): NULL, or descriptors of this test.
    unsafe {
        assert_eq!(descr::<DescrV1>(ptr::null(), ids), Err(DecodeError::NullDescriptor));
        assert_eq!(descr::<DescrV6>(ptr::null(), ids), Err(DecodeError::NullDescriptor));
        let bad = DescrV1::new(0x40, ptr::null_mut(), 0);
        assert_eq!(descr(&bad, ids), Err(DecodeError::UnknownType { version: ApiVersion::V1, type_: 0x40 }));
        assert!(descr(&DescrV3::new(0, ptr::null_mut(), 0), ids).is_err(), "no type");
        assert!(descr(&DescrV3::new(3, ptr::null_mut(), 0), ids).is_err(), "two types");
        assert!(descr(&DescrV4::new(0x80, ptr::null_mut(), 0), ids).is_ok());
        assert!(descr(&DescrV5::new(0x1000, ptr::null_mut(), 0), ids).is_err(), "CE is v6's");
        assert!(descr(&DescrV5::new(1 << 40, ptr::null_mut(), 0), ids).is_err());
        assert!(descr(&DescrV6::new(0x8000, ptr::null_mut(), 0), ids).is_err());
        assert!(descr(&DescrV6::new(u64::MAX, ptr::null_mut(), 0), ids).is_err());
    }
}

#[test]
fn bad_strings_read_unknown_and_bad_parents_read_none() {
    static NOT_UTF8: [u8; 4] = [b'A', 0xFF, 0xFE, 0];
    // Longer than MAX_NAME before its NUL.
    static LONG: [u8; MAX_NAME + 8] = {
        let mut b = [b'x'; MAX_NAME + 8];
        b[MAX_NAME + 7] = 0;
        b
    };
    let mut d = DescrV5::new(EventType::Coll.bit(), 0xBAD as *mut c_void, 0);
    d.u.coll.func = ptr::null();
    d.u.coll.datatype = NOT_UTF8.as_ptr().cast();
    d.u.coll.algo = LONG.as_ptr().cast();
    d.u.coll.proto = c"".as_ptr();
    d.u.coll.parent_group = 0x5 as *mut c_void;
    // Only 0x5 is "ours": the parent (0xBAD) is foreign.
    let only5 = |h: usize| (h == 5).then(|| id(5));
    // SAFETY: a descriptor of this test; its strings are statics.
    let back = unsafe { descr(&d, only5) }.expect("decodes");
    assert_eq!(back.parent, None);
    let EventDescr::Coll { func, datatype, algo, proto, parent_group, .. } = back.descr else { panic!("{back:?}") };
    assert_eq!((func, datatype, algo, proto), ("Unknown", "Unknown", "Unknown", ""));
    assert_eq!(parent_group, Some(id(5)));

    // SAFETY: NULL and static strings.
    unsafe {
        assert_eq!(comm_name(ptr::null()), None);
        assert_eq!(comm_name(c"job-7".as_ptr()), Some("job-7"));
        assert_eq!(comm_name(NOT_UTF8.as_ptr().cast()), Some("Unknown"));
        assert_eq!(comm_name(LONG.as_ptr().cast()), Some(std::str::from_utf8(&LONG[..MAX_NAME + 7]).expect("ascii")));
    }
}

#[test]
fn net_payloads_are_read_only_when_their_size_is_known() {
    assert_eq!((net_payload_len(0x1_0001), net_payload_len(0x2_0001)), (40, 24));
    assert_eq!((net_payload_len(0x2_0002), net_payload_len(0x3_0001), net_payload_len(-1)), (0, 0, 0));
    let ev = EventDescr::NetPlugin { rank: 0, id: 0x9_0001, data: &SOCK };
    let back = round_trip(ApiVersion::V6, &ev).expect("v6 has NetPlugin");
    assert_eq!(back.descr, EventDescr::NetPlugin { rank: 0, id: 0x9_0001, data: &[] });
    let mut d = DescrV4::new(EventType::NetPlugin.bit() as u8, ptr::null_mut(), 2);
    d.u.net_plugin.id = 0x1_0001;
    // SAFETY: NULL data is never read.
    let back = unsafe { descr(&d, ids) }.expect("decodes");
    assert_eq!(back.descr, EventDescr::NetPlugin { rank: 2, id: 0x1_0001, data: &[] });
}
