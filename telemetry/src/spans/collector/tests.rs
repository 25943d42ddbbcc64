use super::*;
use crate::event::EventType;
use crate::event::{GroupApiState, ProxyCtrlState, ProxyStepState};
use crate::spans::MAX_STATES;
use std::num::NonZeroU64;
use std::sync::Mutex;

fn id(n: u64) -> EventId {
    EventId(NonZeroU64::new(n).expect("non-zero"))
}

/// What an exporter was handed, copied out.
#[derive(Debug, Clone, PartialEq)]
struct Got {
    id: u64,
    parent: Option<u64>,
    root: u64,
    ty: EventType,
    states: Vec<u32>,
    values: Vec<u64>,
    payload: Vec<u8>,
    steps_done: u32,
    dur_ok: bool,
}

struct Capture {
    mask: EventMask,
    got: Mutex<Vec<Got>>,
    finalized: Mutex<Vec<u64>>,
    totals: Mutex<Vec<StepTotals>>,
}

impl Capture {
    fn new(mask: EventMask) -> Arc<Capture> {
        Arc::new(Capture {
            mask,
            got: Mutex::new(Vec::new()),
            finalized: Mutex::new(Vec::new()),
            totals: Mutex::new(Vec::new()),
        })
    }
    fn got(&self) -> Vec<Got> {
        self.got.lock().expect("lock").clone()
    }
}

impl Exporter for Capture {
    fn name(&self) -> &str {
        "capture"
    }
    fn interest(&self) -> EventMask {
        self.mask
    }
    fn span(&self, s: &Span<'_>) {
        self.got.lock().expect("lock").push(Got {
            id: s.id.get(),
            parent: s.parent.map(EventId::get),
            root: s.root.get(),
            ty: s.event_type(),
            states: s.states.iter().map(|m| m.state).collect(),
            values: s.states.iter().map(|m| m.value).collect(),
            payload: s.payload.to_vec(),
            steps_done: s.steps_done,
            dur_ok: s.end_ns >= s.start_ns && s.states.iter().all(|m| m.t_ns >= s.start_ns && m.t_ns <= s.end_ns),
        });
    }
    fn comm_finalize(&self, comm: &Arc<CommMeta>) {
        self.finalized.lock().expect("lock").push(comm.hash);
    }
    fn step_totals(&self, _: &Arc<CommMeta>, t: &StepTotals) {
        self.totals.lock().expect("lock").push(*t);
    }
}

fn meta() -> CommMeta {
    CommMeta { name: None, hash: 0xabc, rank: 1, nranks: 2, n_nodes: 1 }
}

fn coll(func: &str) -> EventDescr<'_> {
    EventDescr::Coll {
        rank: 1,
        seq_number: 7,
        func,
        send_buff: 0,
        recv_buff: 0,
        count: 4,
        root: 0,
        datatype: "ncclFloat32",
        n_channels: 1,
        n_warps: 0,
        algo: "RING",
        proto: "SIMPLE",
        parent_group: None,
    }
}

#[test]
fn a_late_child_still_finds_its_trace_root_and_exporters_get_only_their_types() {
    let all = Capture::new(EventMask::ALL);
    let colls = Capture::new(EventMask::of(EventType::Coll));
    let t = Telemetry::new(vec![all.clone(), colls.clone()]);
    let s = t.comm_sink(meta());
    assert_eq!(s.interest(), EventMask::ALL);

    s.start(id(1), None, &EventDescr::GroupApi { graph_captured: false, group_depth: 1 });
    s.state(id(1), &StateArgs::GroupApi { state: GroupApiState::StartApiStop });
    s.start(id(2), Some(id(1)), &coll("AllReduce"));
    // NCCL order: the Coll stops before its proxy ops start.
    s.stop(id(2));
    s.stop(id(1));
    s.start(
        id(3),
        Some(id(2)),
        &EventDescr::ProxyOp { rank: 1, pid: 9, channel_id: 0, peer: 0, n_steps: 1, chunk_size: 16, is_send: true },
    );
    s.start(id(4), Some(id(3)), &EventDescr::ProxyStep { rank: 1, step: 0 });
    for st in [ProxyStepState::SendGpuWait, ProxyStepState::SendPeerWait, ProxyStepState::SendWait] {
        s.state(id(4), &StateArgs::ProxyStep { state: st, trans_size: 16 });
    }
    s.start(id(5), Some(id(4)), &EventDescr::NetPlugin { rank: 1, id: 0x10001, data: &[7u8; 100] });
    s.stop(id(5));
    s.stop(id(4));
    s.stop(id(3));
    s.start(id(6), None, &EventDescr::ProxyCtrl);
    s.state(id(6), &StateArgs::ProxyCtrl { state: ProxyCtrlState::AppendEnd, appended_proxy_ops: 2 });
    s.stop(id(6));
    // A state or stop for an id never started is ignored.
    s.state(id(99), &StateArgs::ProxyCtrl { state: ProxyCtrlState::Idle, appended_proxy_ops: 0 });
    s.stop(id(99));
    s.finalize();

    let got = all.got();
    let by = |n: u64| got.iter().find(|g| g.id == n).cloned().expect("span");
    assert_eq!(got.len(), 6);
    assert!(got.iter().all(|g| g.dur_ok));
    assert_eq!(by(2).root, 1);
    assert_eq!((by(3).parent, by(3).root), (Some(2), 1));
    assert_eq!((by(4).root, by(5).root), (1, 1));
    assert_eq!(by(4).states, vec![8, 20, 9]);
    assert_eq!(by(4).values, vec![16, 16, 16]);
    // The ProxyOp counts its finished steps (one of one); other types count none.
    assert_eq!((by(3).steps_done, by(4).steps_done, by(2).steps_done), (1, 0, 0));
    assert_eq!(by(5).payload.len(), MAX_PAYLOAD);
    assert_eq!((by(6).root, by(6).values.clone()), (6, vec![2]));
    assert_eq!(by(1).states, vec![23]);
    assert_eq!(colls.got().iter().map(|g| g.id).collect::<Vec<_>>(), vec![2]);
    assert_eq!(*all.finalized.lock().expect("lock"), vec![0xabc]);
    assert_eq!(s.open_events(), 0);
}

#[test]
fn names_are_kept_past_the_start_call_and_states_are_bounded() {
    struct Names(Mutex<Vec<(String, String, usize, u32)>>);
    impl Exporter for Names {
        fn name(&self) -> &str {
            "names"
        }
        fn interest(&self) -> EventMask {
            EventMask::of(EventType::Coll)
        }
        fn span(&self, s: &Span<'_>) {
            if let EventDescr::Coll { func, algo, .. } = s.descr {
                self.0.lock().expect("lock").push((func.into(), algo.into(), s.states.len(), s.states_dropped));
            }
        }
    }
    let n = Arc::new(Names(Mutex::new(Vec::new())));
    let t = Telemetry::new(vec![n.clone()]);
    let s = t.comm_sink(meta());
    {
        let func = String::from("AllGather");
        s.start(id(1), None, &coll(&func));
    }
    for _ in 0..MAX_STATES + 5 {
        s.state(id(1), &StateArgs::ProxyCtrl { state: ProxyCtrlState::Idle, appended_proxy_ops: 0 });
    }
    s.stop(id(1));
    let got = n.0.lock().expect("lock").clone();
    assert_eq!(got, vec![("AllGather".into(), "RING".into(), MAX_STATES, 5)]);
}

#[test]
fn the_profiler_gives_every_communicator_its_own_table() {
    let all = Capture::new(EventMask::of(EventType::Coll));
    let t = Telemetry::new(vec![all.clone()]);
    let info = CommInfo { comm_name: Some("x"), comm_hash: 5, n_nodes: 1, nranks: 2, rank: 0 };
    let a = t.init(&info).expect("sink");
    let b = t.init(&CommInfo { rank: 1, ..info }).expect("sink");
    // The same id on two communicators is two events.
    a.start(id(1), None, &coll("AllReduce"));
    b.start(id(1), None, &coll("Broadcast"));
    b.stop(id(1));
    a.stop(id(1));
    assert_eq!(all.got().len(), 2);
}

#[test]
fn step_sums_reach_sum_exporters_and_steps_become_sums_for_them() {
    let sums = Capture::new(EventMask::of(EventType::ProxyOp) | EventMask::STEP_TOTALS);
    let steps = Capture::new(EventMask::of(EventType::ProxyStep));
    let t = Telemetry::new(vec![sums.clone(), steps.clone()]);
    let s = t.comm_sink(meta());
    let op = EventDescr::ProxyOp { rank: 1, pid: 1, channel_id: 0, peer: 0, n_steps: 3, chunk_size: 8, is_send: false };
    s.start(id(1), None, &op);
    // One step as an event (NCCL, or a tcp leg): summed for `sums`, a span for `steps`.
    s.start(id(2), Some(id(1)), &EventDescr::ProxyStep { rank: 1, step: 0 });
    for (state, n) in
        [(ProxyStepState::RecvWait, 0), (ProxyStepState::RecvFlushWait, 40), (ProxyStepState::RecvGpuWait, 40)]
    {
        s.state(id(2), &StateArgs::ProxyStep { state, trans_size: n });
    }
    s.stop(id(2));
    // Two steps summed by the emitter.
    let two = StepTotals { send: false, steps: 2, bytes: 80, wait_ns: [0, 0, 0, 5, 0, 7] };
    s.step_totals(id(1), &two);
    s.stop(id(1));
    let got = sums.totals.lock().expect("lock").clone();
    assert_eq!(got.len(), 2);
    assert_eq!((got[0].send, got[0].steps, got[0].bytes), (false, 1, 40), "RecvFlushWait's size, once");
    assert_eq!(got[1], two);
    assert!(steps.totals.lock().expect("lock").is_empty());
    assert_eq!(steps.got().iter().map(|g| g.ty).collect::<Vec<_>>(), vec![EventType::ProxyStep]);
    let op_span = sums.got().into_iter().find(|g| g.ty == EventType::ProxyOp).expect("op span");
    assert_eq!(op_span.steps_done, 3, "steps as events and in sums");
}
