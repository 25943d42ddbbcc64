//! Tests of `Fanout` (kept apart so fanout.rs stays short).

use super::*;
use crate::event::{ProxyCtrlState, ProxyStepState};
use std::collections::HashSet;
use std::sync::atomic::AtomicUsize;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Instant;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Records what it receives; its mask can be changed to exercise `reload`.
#[derive(Default)]
struct Rec {
    mask: AtomicU64,
    starts: Mutex<Vec<(u64, Option<u64>, EventType)>>,
    states: Mutex<Vec<(u64, u32)>>,
    stops: Mutex<Vec<u64>>,
    n_start: AtomicUsize,
    n_stop: AtomicUsize,
    totals: Mutex<Vec<(u64, StepTotals)>>,
}

impl Rec {
    fn new(mask: EventMask) -> Arc<Rec> {
        let r = Rec::default();
        r.mask.store(mask.0, Relaxed);
        Arc::new(r)
    }
    fn started(&self) -> Vec<(u64, Option<u64>, EventType)> {
        lock(&self.starts).clone()
    }
    fn stated(&self) -> Vec<(u64, u32)> {
        lock(&self.states).clone()
    }
    fn stopped(&self) -> Vec<u64> {
        lock(&self.stops).clone()
    }
}

impl Sink for Rec {
    fn interest(&self) -> EventMask {
        EventMask(self.mask.load(Relaxed))
    }
    fn start(&self, id: EventId, parent: Option<EventId>, ev: &EventDescr<'_>) {
        self.n_start.fetch_add(1, Relaxed);
        lock(&self.starts).push((id.get(), parent.map(EventId::get), ev.event_type()));
    }
    fn state(&self, id: EventId, st: &StateArgs<'_>) {
        lock(&self.states).push((id.get(), st.state_raw()));
    }
    fn stop(&self, id: EventId) {
        self.n_stop.fetch_add(1, Relaxed);
        lock(&self.stops).push(id.get());
    }
    fn step_totals(&self, op: EventId, t: &StepTotals) {
        lock(&self.totals).push((op.get(), *t));
    }
}

/// Counts only, so the concurrency test and the benchmark measure the fan-out, not a log.
#[derive(Default)]
struct Count {
    starts: AtomicUsize,
    stops: AtomicUsize,
}

impl Sink for Count {
    fn interest(&self) -> EventMask {
        EventMask::of(EventType::ProxyStep)
    }
    fn start(&self, _: EventId, _: Option<EventId>, _: &EventDescr<'_>) {
        self.starts.fetch_add(1, Relaxed);
    }
    fn stop(&self, _: EventId) {
        self.stops.fetch_add(1, Relaxed);
    }
}

const COLL: EventMask = EventMask::of(EventType::Coll);
const STEP: EventMask = EventMask::of(EventType::ProxyStep);
const CTRL: EventMask = EventMask::of(EventType::ProxyCtrl);

fn coll() -> EventDescr<'static> {
    EventDescr::Coll {
        rank: 1,
        seq_number: 7,
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
        parent_group: None,
    }
}

const STEP_DESCR: EventDescr<'static> = EventDescr::ProxyStep { rank: 1, step: 0 };

fn step_state(state: ProxyStepState) -> StateArgs<'static> {
    StateArgs::ProxyStep { state, trans_size: 4096 }
}

#[test]
fn interest_is_rebuilt_on_attach_detach_reload() {
    let f = Fanout::new();
    assert_eq!(f.interest(), EventMask::NONE);
    let a = Rec::new(COLL);
    let b = Rec::new(STEP | EventType::Coll);
    let ha = f.attach(a.clone()).expect("attach a");
    // Ancestors come with a type: Coll brings Group, CollApi and GroupApi.
    assert_eq!(f.interest(), COLL.with_ancestors());
    assert!(f.enabled(EventType::GroupApi) && !f.enabled(EventType::P2p));
    let hb = f.attach(b.clone()).expect("attach b");
    assert_eq!(f.interest(), (COLL | STEP).with_ancestors());
    assert!(f.enabled(EventType::ProxyStep) && f.enabled(EventType::ProxyOp) && !f.enabled(EventType::ProxyCtrl));
    assert!(f.detach(hb).is_some());
    assert_eq!(f.interest(), COLL.with_ancestors());
    // The mask is captured at attach: a change is seen only on reload.
    a.mask.store(CTRL.0, Relaxed);
    assert_eq!(f.interest(), COLL.with_ancestors());
    f.reload();
    assert_eq!(f.interest(), CTRL);
    assert!(f.detach(ha).is_some());
    assert_eq!(f.interest(), EventMask::NONE);
    assert_eq!(f.sink_count(), 0);
}

#[test]
fn disabled_type_calls_nothing_and_returns_none() {
    let f = Fanout::new();
    assert_eq!(f.start(None, &coll()), None);
    let a = Rec::new(CTRL);
    let _h = f.attach(a.clone()).expect("attach");
    assert!(!f.enabled(EventType::Coll));
    assert_eq!(f.start(None, &coll()), None);
    assert_eq!(a.n_start.load(Relaxed), 0);
}

#[test]
fn events_reach_only_matching_sinks_with_parents() {
    let f = Fanout::new();
    let (a, b, c) = (Rec::new(COLL), Rec::new(STEP), Rec::new(COLL | STEP));
    let _h: Vec<_> = [&a, &b, &c].iter().map(|s| f.attach((*s).clone()).expect("attach")).collect();
    let p = f.start(None, &coll()).expect("coll wanted");
    let s = f.start(Some(p), &STEP_DESCR).expect("step wanted");
    assert_ne!(p, s);
    assert_eq!(f.start(None, &EventDescr::ProxyCtrl), None);
    assert_eq!(a.started(), vec![(p.get(), None, EventType::Coll)]);
    // b asked for steps only, and gets the Coll too: a step's ancestors are implied.
    assert_eq!(b.started(), vec![(p.get(), None, EventType::Coll), (s.get(), Some(p.get()), EventType::ProxyStep)]);
    assert_eq!(c.started(), vec![(p.get(), None, EventType::Coll), (s.get(), Some(p.get()), EventType::ProxyStep)]);
}

#[test]
fn states_and_stops_follow_the_start() {
    let f = Fanout::new();
    let (a, b) = (Rec::new(COLL), Rec::new(STEP));
    let _ha = f.attach(a.clone()).expect("attach a");
    let hb = f.attach(b.clone()).expect("attach b");
    let p = f.start(None, &coll()).expect("coll");
    let s = f.start(Some(p), &STEP_DESCR).expect("step");
    f.state(s, &step_state(ProxyStepState::SendGpuWait));
    f.state(s, &step_state(ProxyStepState::SendWait));
    f.stop(s);
    f.stop(p);
    assert_eq!(a.stated(), vec![]);
    assert_eq!(a.stopped(), vec![p.get()]);
    assert_eq!(b.stated(), vec![(s.get(), 8), (s.get(), 9)]);
    assert_eq!(b.stopped(), vec![s.get(), p.get()]);

    // A reload that drops the type does not orphan a live event: it still reaches its sink.
    let s2 = f.start(None, &STEP_DESCR).expect("step");
    b.mask.store(0, Relaxed);
    f.reload();
    assert!(!f.enabled(EventType::ProxyStep));
    f.stop(s2);
    assert_eq!(b.stopped(), vec![s.get(), p.get(), s2.get()]);

    // After detach the sink is never called, and a sink reusing its slot gets no foreign stops.
    b.mask.store(STEP.0, Relaxed);
    f.reload();
    let s3 = f.start(None, &STEP_DESCR).expect("step");
    assert!(f.detach(hb).is_some());
    let d = Rec::new(STEP | CTRL);
    let _hd = f.attach(d.clone()).expect("attach d");
    f.state(s3, &step_state(ProxyStepState::RecvWait));
    f.stop(s3);
    assert_eq!(b.stopped().len(), 3);
    assert!(d.stated().is_empty() && d.stopped().is_empty());

    let c = f.start(None, &EventDescr::ProxyCtrl).expect("ctrl");
    f.state(c, &StateArgs::ProxyCtrl { state: ProxyCtrlState::AppendEnd, appended_proxy_ops: 3 });
    f.stop(c);
    assert_eq!(d.stated(), vec![(c.get(), 18)]);
}

#[test]
fn a_view_reaches_its_sinks_without_the_lock_and_detach_waits_for_it() {
    let f = Arc::new(Fanout::new());
    let (a, b) = (Rec::new(COLL | STEP), Rec::new(STEP));
    let _ha = f.attach(a.clone()).expect("attach a");
    let hb = f.attach(b.clone()).expect("attach b");
    let v = f.view();
    let p = v.start(None, &coll()).expect("coll");
    let s = v.start(Some(p), &STEP_DESCR).expect("step");
    v.state(s, &step_state(ProxyStepState::SendWait));
    // The fan-out's own calls and the view's meet on the same events.
    f.stop(s);
    // (b gets the Coll too: a step's ancestors come with it.)
    assert_eq!(b.started()[1..], [(s.get(), Some(p.get()), EventType::ProxyStep)]);
    assert_eq!((b.stated(), b.stopped()), (vec![(s.get(), 9)], vec![s.get()]));

    // A sink attached after the view was taken is not in it.
    let c = Rec::new(COLL);
    let _hc = f.attach(c.clone()).expect("attach c");
    let q = v.start(None, &coll()).expect("coll");
    v.stop(q);
    assert!(c.started().is_empty() && c.stopped().is_empty());
    assert_eq!(a.stopped(), vec![s.get(), q.get()]);
    assert_eq!(b.stopped(), vec![s.get(), q.get()]);

    // Detaching b from another thread waits until the view is dropped.
    let detached = Arc::new(AtomicUsize::new(0));
    let t = {
        let (f, detached) = (f.clone(), detached.clone());
        std::thread::spawn(move || {
            let gone = f.detach(hb).is_some();
            detached.store(1 + usize::from(gone), Relaxed);
        })
    };
    std::thread::sleep(std::time::Duration::from_millis(100));
    assert_eq!(detached.load(Relaxed), 0, "detach returned while a view held the sink");
    let s2 = v.start(None, &STEP_DESCR).expect("step");
    v.stop(s2);
    v.stop(p);
    drop(v);
    t.join().expect("detaching thread");
    assert_eq!(detached.load(Relaxed), 2);
    assert_eq!(b.stopped(), vec![s.get(), q.get(), s2.get(), p.get()]);
    // Nothing reaches b any more, through a new view or the fan-out.
    let v = f.view();
    let s3 = v.start(None, &STEP_DESCR).expect("step for a");
    v.stop(s3);
    f.stop(s3);
    assert_eq!(b.stopped().len(), 4);
    assert_eq!(a.stopped().last(), Some(&s3.get()));
}

/// Follows a shared mask cell, as an NCCL plugin follows the global `int` it got in `init`.
struct Follower(Arc<AtomicU64>);

impl Sink for Follower {
    fn interest(&self) -> EventMask {
        EventMask(self.0.load(Relaxed))
    }
    fn dynamic(&self) -> bool {
        true
    }
}

#[test]
fn dynamic_interest_is_asked_at_capture() {
    let f = Fanout::new();
    let cell = Arc::new(AtomicU64::new(0));
    let _h = f.attach(Arc::new(Follower(cell.clone()))).expect("attach");
    let r = Rec::new(CTRL);
    let _hr = f.attach(r.clone()).expect("attach rec");
    assert_eq!(f.capture(), CTRL);
    cell.store(COLL.0, Relaxed);
    // No reload: the next capture sees the plugin's store.
    assert_eq!(f.capture(), (COLL | CTRL).with_ancestors());
    assert!(f.enabled(EventType::Coll));
    let p = f.start(None, &coll()).expect("the follower wants coll now");
    f.stop(p);
    assert!(r.started().is_empty(), "the static CTRL sink saw a Coll");
    cell.store(0, Relaxed);
    assert_eq!(f.capture(), CTRL);
    assert_eq!(f.start(None, &coll()), None);
}

#[test]
fn handles_are_checked_and_slots_bounded() {
    let (f, g) = (Fanout::new(), Fanout::new());
    let h = f.attach(Rec::new(COLL)).expect("attach");
    let early = f.start(None, &coll()).expect("coll");
    assert!(g.detach(SinkHandle { slot: h.slot, serial: h.serial }).is_none());
    let stale = SinkHandle { slot: h.slot, serial: h.serial };
    assert!(f.detach(h).is_some());
    assert!(f.detach(stale).is_none());
    let recs: Vec<_> = (0..MAX_SINKS).map(|_| Rec::new(COLL)).collect();
    let hs: Vec<_> = recs.iter().map(|r| f.attach(r.clone()).expect("room")).collect();
    assert_eq!(f.attach(Rec::new(COLL)).map(|_| ()), Err(TooManySinks));
    assert_eq!(hs.len(), MAX_SINKS);
    let p = f.start(None, &coll()).expect("coll");
    f.stop(p);
    // The event started before the detach reaches none of the sinks now in the table, not even
    // the one that reuses its slot.
    f.stop(early);
    assert!(recs.iter().all(|r| r.stopped() == vec![p.get()]));
    assert_eq!(early.get() >> (64 - MAX_SINKS), 1, "routes in the id's top bits");
}

#[test]
fn concurrent_starts_and_stops_keep_counts_exact() {
    const THREADS: usize = 4;
    const PER: usize = 20_000;
    let f = Arc::new(Fanout::new());
    let (x, y) = (Arc::new(Count::default()), Arc::new(Count::default()));
    let _hx = f.attach(x.clone()).expect("attach");
    let _hy = f.attach(y.clone()).expect("attach");
    let ids: Vec<Vec<u64>> = std::thread::scope(|sc| {
        let ts: Vec<_> = (0..THREADS)
            .map(|_| {
                let f = &f;
                sc.spawn(move || {
                    let mut ids = Vec::with_capacity(PER);
                    let mut open = Vec::new();
                    for i in 0..PER {
                        let id = f.start(None, &STEP_DESCR).expect("wanted");
                        ids.push(id.get());
                        open.push(id);
                        if i % 8 == 7 {
                            // Keep several events live at once, as a proxy op does with its steps.
                            open.drain(..).for_each(|id| f.stop(id));
                        }
                    }
                    open.into_iter().for_each(|id| f.stop(id));
                    ids
                })
            })
            .collect();
        ts.into_iter().map(|t| t.join().expect("thread")).collect()
    });
    let all: HashSet<u64> = ids.iter().flatten().copied().collect();
    assert_eq!(all.len(), THREADS * PER, "ids are unique");
    for c in [&x, &y] {
        assert_eq!(c.starts.load(Relaxed), THREADS * PER);
        assert_eq!(c.stops.load(Relaxed), THREADS * PER);
    }
}

/// `cargo test -p occl-telemetry --release -- --ignored --nocapture bench`
#[test]
#[ignore = "micro-benchmark; run by hand with --release --nocapture"]
fn bench_disabled_check_and_enabled_start_stop() {
    let f = Fanout::new();
    let _h = f.attach(Arc::new(Count::default())).expect("attach");
    const N: u32 = 50_000_000;
    let t = Instant::now();
    let mut hits = 0u32;
    for _ in 0..N {
        hits += u32::from(std::hint::black_box(&f).enabled(std::hint::black_box(EventType::ProxyCtrl)));
    }
    let disabled = t.elapsed().as_secs_f64() * 1e9 / f64::from(N);
    assert_eq!(hits, 0);

    let d = EventDescr::ProxyCtrl;
    let t = Instant::now();
    for _ in 0..N {
        assert!(std::hint::black_box(&f).start(None, std::hint::black_box(&d)).is_none());
    }
    let disabled_start = t.elapsed().as_secs_f64() * 1e9 / f64::from(N);

    const M: u32 = 2_000_000;
    let t = Instant::now();
    for _ in 0..M {
        let id = f.start(None, std::hint::black_box(&STEP_DESCR)).expect("wanted");
        f.stop(id);
    }
    let enabled = t.elapsed().as_secs_f64() * 1e9 / f64::from(M);
    println!(
        "disabled enabled(): {disabled:.2} ns; disabled start(): {disabled_start:.2} ns; \
         enabled start+stop (1 sink): {enabled:.1} ns"
    );
}

#[test]
fn notes_reach_every_attached_sink_whatever_its_mask() {
    #[derive(Default)]
    struct Notes(Mutex<Vec<Note>>);
    impl Sink for Notes {
        fn interest(&self) -> EventMask {
            EventMask(0)
        }
        fn note(&self, n: &Note) {
            lock(&self.0).push(*n);
        }
    }
    let f = Fanout::new();
    let (a, b) = (Arc::new(Notes::default()), Arc::new(Notes::default()));
    let _ha = f.attach(a.clone()).expect("attach");
    let hb = f.attach(b.clone()).expect("attach");
    let n = Note::TransportBytes { transport: "shm", send: true, bytes: 7 };
    f.note(&n);
    f.detach(hb);
    f.note(&Note::OpFailed { func: "AllReduce", kind: "Timeout" });
    assert_eq!(lock(&a.0).len(), 2);
    assert_eq!(*lock(&b.0), vec![n]);
}

#[test]
fn step_sums_go_to_sinks_that_want_them_and_steps_still_reach_them() {
    let f = Fanout::new();
    let sums = Rec::new(EventMask::STEP_TOTALS);
    let steps = Rec::new(STEP);
    let ops = Rec::new(EventMask::of(EventType::ProxyOp));
    let _h: Vec<_> = [&sums, &steps, &ops].iter().map(|s| f.attach((*s).clone()).expect("attach")).collect();
    assert!(f.capture().wants_totals() && f.capture().contains(EventType::ProxyOp));
    let v = f.view();
    let op = v
        .start(
            None,
            &EventDescr::ProxyOp { rank: 1, pid: 1, channel_id: 0, peer: 0, n_steps: 2, chunk_size: 8, is_send: true },
        )
        .expect("op wanted");
    // A step an emitter could not sum (tcp) reaches the sum sink as an event.
    let s = v.start(Some(op), &STEP_DESCR).expect("step wanted");
    v.stop(s);
    let t = StepTotals { send: true, steps: 2, bytes: 16, wait_ns: [1, 2, 0, 0, 0, 0] };
    v.step_totals(op, &t);
    v.stop(op);
    assert_eq!(lock(&sums.totals).clone(), vec![(op.get(), t)]);
    assert!(lock(&steps.totals).is_empty() && lock(&ops.totals).is_empty(), "only sinks that asked get sums");
    assert!(sums.started().contains(&(s.get(), Some(op.get()), EventType::ProxyStep)));
    assert!(!ops.started().iter().any(|x| x.2 == EventType::ProxyStep));
    // Without a sum or step sink no step is issued.
    drop(v);
    let g = Fanout::new();
    let _h = g.attach(ops.clone()).expect("attach");
    assert_eq!(g.start(None, &STEP_DESCR), None);
    assert!(!g.enabled(EventType::ProxyStep));
}

/// Takes operation sums (and Coll events for the operations its emitter cannot sum); counts sums.
#[derive(Default)]
struct Sums(AtomicUsize);

impl Sink for Sums {
    fn interest(&self) -> EventMask {
        EventMask::OP_TOTALS | EventType::Coll
    }
    fn op_totals(&self, _: &OpTotals<'_>) {
        self.0.fetch_add(1, Relaxed);
    }
}

#[test]
fn operation_sums_only_while_every_sink_takes_them() {
    let f = Fanout::new();
    assert!(!f.capture().wants_op_totals(), "no sink, no sums");
    let a = Arc::new(Sums::default());
    let ha = f.attach(a.clone()).expect("attach");
    assert!(f.capture().wants_op_totals());
    let b = f.attach(Arc::new(Count::default())).expect("attach");
    assert!(!f.capture().wants_op_totals(), "a sink without sums turns them off");
    assert!(f.capture().contains(EventType::Coll), "the events stay");
    f.detach(b);
    assert!(f.capture().wants_op_totals(), "and back on when it goes");
    let totals = OpTotals { descr: coll(), start_ns: 1, end_ns: 2, steps: Default::default(), transport_bytes: &[] };
    f.view().op_totals(&totals);
    assert_eq!(a.0.load(Relaxed), 1);
    f.detach(ha);
    assert!(f.capture().is_empty());
}

/// Keeps the explicit times it is given.
#[derive(Default)]
struct Timed(Mutex<Vec<(&'static str, u64, u64)>>);

impl Sink for Timed {
    fn interest(&self) -> EventMask {
        EventMask::of(EventType::KernelCh)
    }
    fn start_at(&self, id: EventId, _: Option<EventId>, _: &EventDescr<'_>, t_ns: u64) {
        lock(&self.0).push(("start", id.get(), t_ns));
    }
    fn stop_at(&self, id: EventId, t_ns: u64) {
        lock(&self.0).push(("stop", id.get(), t_ns));
    }
}

#[test]
fn explicit_times_reach_the_sinks_and_default_to_start_and_stop() {
    let f = Fanout::new();
    let timed = Arc::new(Timed::default());
    let plain = Rec::new(EventMask::of(EventType::KernelCh));
    let _a = f.attach(timed.clone()).expect("attach");
    let _b = f.attach(plain.clone()).expect("attach");
    let ch = EventDescr::KernelCh { channel_id: 3, p_timer: 7 };
    let a = f.start_at(None, &ch, 1_000).expect("wanted");
    f.stop_at(a, 2_000);
    let v = f.view();
    let b = v.start_at(Some(a), &ch, 3_000).expect("wanted");
    v.stop_at(b, 4_000);
    drop(v);
    let got = lock(&timed.0).clone();
    assert_eq!(
        got,
        vec![("start", a.get(), 1_000), ("stop", a.get(), 2_000), ("start", b.get(), 3_000), ("stop", b.get(), 4_000)]
    );
    // A sink that keeps no times gets plain starts and stops, with the parent.
    assert_eq!(
        plain.started(),
        vec![(a.get(), None, EventType::KernelCh), (b.get(), Some(a.get()), EventType::KernelCh)]
    );
    assert_eq!(plain.stopped(), vec![a.get(), b.get()]);
    // No sink wants the type: nothing is issued.
    assert_eq!(f.start_at(None, &EventDescr::ProxyCtrl, 5), None);
}
