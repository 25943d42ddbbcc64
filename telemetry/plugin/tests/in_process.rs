//! The exported tables called in-process, as NCCL calls them, with a recording profiler
//! installed through the rlib's test hook: what each version's `init` returns and writes, that
//! handles come back as parents, that many threads on two communicators get unique handles and
//! lose nothing, and that garbage (NULL or foreign values, unknown types and states, a panicking
//! sink) is dropped and counted without a crash.

use nccl_profiler_occl::{self as plugin, Backend};
use occl_telemetry::nccl::abi::{DescrV1, DescrV2, DescrV3, DescrV4, DescrV5, DescrV6, StateArgsV1, StateArgsV4};
use occl_telemetry::nccl::ApiVersion;
use occl_telemetry::{CommInfo, EventDescr, EventId, EventMask, EventType, Profiler, Sink, StateArgs};
use std::collections::HashSet;
use std::ffi::{c_int, c_void};
use std::ptr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

/// What the installed profiler received, in order.
#[derive(Clone, Debug, PartialEq)]
enum Got {
    Init(String),
    Start { comm: u64, id: u64, parent: Option<u64>, descr: String },
    State { id: u64, state: String },
    Stop { id: u64 },
    Finalize { comm: u64 },
}

#[derive(Default)]
struct Rec {
    got: Mutex<Vec<Got>>,
}

impl Rec {
    fn push(&self, g: Got) {
        self.got.lock().unwrap_or_else(PoisonError::into_inner).push(g);
    }
    fn take(&self) -> Vec<Got> {
        std::mem::take(&mut *self.got.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

struct RecProfiler {
    rec: Arc<Rec>,
    interest: EventMask,
}

struct RecSink {
    rec: Arc<Rec>,
    comm: u64,
    interest: EventMask,
}

impl Profiler for RecProfiler {
    fn name(&self) -> &str {
        "rec"
    }
    fn init(&self, c: &CommInfo<'_>) -> Option<Arc<dyn Sink>> {
        self.rec.push(Got::Init(format!("{c:?}")));
        Some(Arc::new(RecSink { rec: self.rec.clone(), comm: c.comm_hash, interest: self.interest }))
    }
}

impl Sink for RecSink {
    fn interest(&self) -> EventMask {
        self.interest
    }
    fn start(&self, id: EventId, parent: Option<EventId>, ev: &EventDescr<'_>) {
        if let EventDescr::Coll { seq_number: 666, .. } = ev {
            panic!("a sink that panics");
        }
        self.rec.push(Got::Start {
            comm: self.comm,
            id: id.get(),
            parent: parent.map(EventId::get),
            descr: format!("{ev:?}"),
        });
    }
    fn state(&self, id: EventId, st: &StateArgs<'_>) {
        self.rec.push(Got::State { id: id.get(), state: format!("{st:?}") });
    }
    fn stop(&self, id: EventId) {
        self.rec.push(Got::Stop { id: id.get() });
    }
    fn finalize(&self) {
        self.rec.push(Got::Finalize { comm: self.comm });
    }
}

/// Tests share the plugin's process-wide state (the installed backend, the mask).
fn lock() -> MutexGuard<'static, ()> {
    static L: Mutex<()> = Mutex::new(());
    let g = L.lock().unwrap_or_else(PoisonError::into_inner);
    std::env::set_var("OCCL_METRICS_ADDR", "off");
    // No exporter from the environment (Prometheus is on unless turned off): tests install theirs.
    std::env::set_var("OCCL_METRICS", "0");
    g
}

fn install(interest: EventMask) -> Arc<Rec> {
    let rec = Arc::new(Rec::default());
    let p: Arc<dyn Profiler> = Arc::new(RecProfiler { rec: rec.clone(), interest });
    plugin::install(Some(Backend::new(p)));
    rec
}

/// The function table of one version, with its init made uniform: (context, mask) for a comm.
struct Host {
    version: ApiVersion,
}

impl Host {
    fn init(&self, hash: u64, rank: c_int) -> (*mut c_void, c_int) {
        let (mut ctx, mut mask): (*mut c_void, c_int) = (ptr::dangling_mut::<c_void>(), -1);
        let name = c"in-process";
        // SAFETY: the plugin's tables, called with valid out-pointers and a live name; no
        // logger is passed (a NULL one must be accepted).
        let rc = unsafe {
            match self.version {
                ApiVersion::V1 => plugin::ncclProfiler_v1.0.init.expect("init")(&mut ctx, &mut mask),
                ApiVersion::V2 => plugin::ncclProfiler_v2.0.init.expect("init")(&mut ctx, &mut mask),
                ApiVersion::V3 => plugin::ncclProfiler_v3.0.init.expect("init")(&mut ctx, &mut mask),
                ApiVersion::V4 => plugin::ncclProfiler_v4.0.init.expect("init")(
                    &mut ctx,
                    &mut mask,
                    name.as_ptr(),
                    hash,
                    1,
                    4,
                    rank,
                    None,
                ),
                ApiVersion::V5 => plugin::ncclProfiler_v5.0.init.expect("init")(
                    &mut ctx,
                    hash,
                    &mut mask,
                    name.as_ptr(),
                    1,
                    4,
                    rank,
                    None,
                ),
                ApiVersion::V6 => plugin::ncclProfiler_v6.0.init.expect("init")(
                    &mut ctx,
                    hash,
                    &mut mask,
                    name.as_ptr(),
                    1,
                    4,
                    rank,
                    None,
                ),
            }
        };
        assert_eq!(rc, 0, "init never fails");
        (ctx, mask)
    }

    fn table_fns(&self) -> (StartFn, StopFn, RecordFn, FinalizeFn) {
        macro_rules! fns {
            ($t:expr) => {
                (
                    $t.0.start_event.expect("start"),
                    $t.0.stop_event.expect("stop"),
                    $t.0.record_event_state.expect("record"),
                    $t.0.finalize.expect("finalize"),
                )
            };
        }
        match self.version {
            ApiVersion::V1 => fns!(plugin::ncclProfiler_v1),
            ApiVersion::V2 => fns!(plugin::ncclProfiler_v2),
            ApiVersion::V3 => fns!(plugin::ncclProfiler_v3),
            ApiVersion::V4 => fns!(plugin::ncclProfiler_v4),
            ApiVersion::V5 => fns!(plugin::ncclProfiler_v5),
            ApiVersion::V6 => fns!(plugin::ncclProfiler_v6),
        }
    }

    /// `startEvent` with a descriptor of the version; returns the handle.
    fn start<D>(&self, ctx: *mut c_void, d: &mut D) -> *mut c_void {
        let mut h: *mut c_void = ptr::dangling_mut::<c_void>();
        // SAFETY: a descriptor of this version that lives for the call, a valid out-pointer.
        let rc = unsafe { self.table_fns().0(ctx, &mut h, ptr::from_mut(d).cast()) };
        assert_eq!(rc, 0);
        h
    }

    fn stop(&self, h: *mut c_void) {
        // SAFETY: any value is allowed; the plugin never dereferences handles.
        assert_eq!(unsafe { self.table_fns().1(h) }, 0);
    }

    fn record<A>(&self, h: *mut c_void, state: c_int, args: *mut A) {
        // SAFETY: NULL or arguments of this version that live for the call.
        assert_eq!(unsafe { self.table_fns().2(h, state, args.cast()) }, 0);
    }

    fn finalize(&self, ctx: *mut c_void) {
        // SAFETY: any value is allowed; the plugin never dereferences contexts.
        assert_eq!(unsafe { self.table_fns().3(ctx) }, 0);
    }
}

type StartFn = unsafe extern "C" fn(*mut c_void, *mut *mut c_void, *mut c_void) -> c_int;
type StopFn = unsafe extern "C" fn(*mut c_void) -> c_int;
type RecordFn = unsafe extern "C" fn(*mut c_void, c_int, *mut c_void) -> c_int;
type FinalizeFn = unsafe extern "C" fn(*mut c_void) -> c_int;

/// A Coll → ProxyOp → ProxyStep chain in version `v`'s layout, with its states.
fn chain(host: &Host, ctx: *mut c_void) -> [*mut c_void; 3] {
    let pid = std::process::id() as i32;
    macro_rules! descrs {
        ($D:ident, $t:ty) => {{
            let mut c = $D::new(EventType::Coll.bit() as $t, ptr::null_mut(), 1);
            let h_coll = {
                // v1 codes for AllReduce / float32 / RING / SIMPLE, strings otherwise.
                set_coll(&mut c);
                host.start(ctx, &mut c)
            };
            let mut op = $D::new(EventType::ProxyOp.bit() as $t, h_coll, 1);
            op.u.proxy_op.pid = pid;
            op.u.proxy_op.channel_id = 2;
            op.u.proxy_op.peer = 3;
            op.u.proxy_op.n_steps = 1;
            op.u.proxy_op.chunk_size = 4096;
            op.u.proxy_op.is_send = 1;
            let h_op = host.start(ctx, &mut op);
            let mut st = $D::new(EventType::ProxyStep.bit() as $t, h_op, 1);
            st.u.proxy_step.step = 0;
            let h_step = host.start(ctx, &mut st);
            [h_coll, h_op, h_step]
        }};
    }
    match host.version {
        ApiVersion::V1 => descrs!(DescrV1, u8),
        ApiVersion::V2 => descrs!(DescrV2, u8),
        ApiVersion::V3 => descrs!(DescrV3, u8),
        ApiVersion::V4 => descrs!(DescrV4, u8),
        ApiVersion::V5 => descrs!(DescrV5, u64),
        ApiVersion::V6 => descrs!(DescrV6, u64),
    }
}

trait SetColl {
    fn set(&mut self);
}
impl SetColl for DescrV1 {
    fn set(&mut self) {
        self.u.coll.seq_number = 7;
        self.u.coll.func = 4;
        self.u.coll.datatype = 7;
        self.u.coll.algo = 1;
        self.u.coll.proto = 2;
        self.u.coll.count = 1024;
    }
}
macro_rules! set_coll_strings {
    ($D:ty) => {
        impl SetColl for $D {
            fn set(&mut self) {
                self.u.coll.seq_number = 7;
                self.u.coll.func = c"AllReduce".as_ptr();
                self.u.coll.datatype = c"ncclFloat32".as_ptr();
                self.u.coll.algo = c"RING".as_ptr();
                self.u.coll.proto = c"SIMPLE".as_ptr();
                self.u.coll.count = 1024;
            }
        }
    };
}
set_coll_strings!(DescrV2);
set_coll_strings!(DescrV3);
set_coll_strings!(DescrV4);
set_coll_strings!(DescrV5);
set_coll_strings!(DescrV6);

fn set_coll<D: SetColl>(d: &mut D) {
    d.set();
}

#[test]
fn every_version_inits_hands_out_handles_and_gets_them_back_as_parents() {
    let _g = lock();
    for version in ApiVersion::NEWEST_FIRST {
        // The sink wants ProxyStep and KernelCh; the mask is that, in the version's types.
        let rec = install(EventMask::of(EventType::ProxyStep).with(EventType::KernelCh));
        let host = Host { version };
        let (ctx, mask) = host.init(0xABCD_0000 + version.number() as u64, 1);
        assert!(!ctx.is_null(), "{version}: a context");
        let want = if version >= ApiVersion::V3 { 0x50 } else { 0x10 };
        assert_eq!(mask, want, "{version}: *eActivationMask = the sink's interest in the version's types");
        let [h_coll, h_op, h_step] = chain(&host, ctx);
        let handles: HashSet<usize> = [h_coll, h_op, h_step].iter().map(|h| *h as usize).collect();
        assert_eq!(handles.len(), 3, "{version}: distinct handles");
        assert!(!handles.contains(&0) && !handles.contains(&(ctx as usize)));
        if version >= ApiVersion::V4 {
            let mut a = StateArgsV4 { raw: 4096 };
            host.record(h_step, 9, &mut a);
            host.record(h_op, 19, ptr::null_mut::<StateArgsV4>());
        } else {
            let mut a = StateArgsV1::zeroed();
            a.proxy_op.trans_size = 512;
            a.proxy_op.steps = 1;
            host.record(h_op, 0, &mut a);
            host.record(h_step, 9, ptr::null_mut::<StateArgsV1>());
        }
        for h in [h_step, h_op, h_coll] {
            host.stop(h);
        }
        host.finalize(ctx);

        let got = rec.take();
        let Got::Init(info) = &got[0] else { panic!("{got:?}") };
        if version >= ApiVersion::V4 {
            let hash = 0xABCD_0000 + version.number() as u64;
            let want = format!(
                "CommInfo {{ comm_name: Some(\"in-process\"), comm_hash: {hash}, n_nodes: 1, nranks: 4, rank: 1 }}"
            );
            assert_eq!(info, &want, "{version}");
        } else {
            assert!(
                info.contains("comm_hash: 0") && info.contains("rank: 0"),
                "{version}: v1–v3 init has no comm: {info}"
            );
        }
        let starts: Vec<_> = got
            .iter()
            .filter_map(|g| if let Got::Start { id, parent, .. } = g { Some((*id, *parent)) } else { None })
            .collect();
        assert_eq!(
            starts,
            vec![(h_coll as u64, None), (h_op as u64, Some(h_coll as u64)), (h_step as u64, Some(h_op as u64))],
            "{version}: the sink's ids are the handles NCCL got, and parents come back"
        );
        let Got::Start { descr, .. } = &got[1] else { panic!() };
        assert!(
            descr.contains("seq_number: 7, func: \"AllReduce\"")
                && descr.contains("count: 1024")
                && descr.contains("datatype: \"ncclFloat32\"")
                && descr.contains("algo: \"RING\", proto: \"SIMPLE\""),
            "{version}: {descr}"
        );
        let Got::Start { descr, .. } = &got[2] else { panic!() };
        assert!(descr.starts_with("ProxyOp { rank: 1,") && descr.contains("is_send: true"), "{version}: {descr}");
        let states: Vec<_> = got
            .iter()
            .filter_map(|g| if let Got::State { state, .. } = g { Some(state.as_str()) } else { None })
            .collect();
        if version >= ApiVersion::V4 {
            assert_eq!(
                states,
                [
                    "ProxyStep { state: SendWait, trans_size: 4096 }",
                    "ProxyOp { state: InProgress, trans_size: 0, steps: 0 }"
                ],
                "{version}"
            );
        } else {
            assert_eq!(
                states,
                [
                    "ProxyOp { state: SendPosted, trans_size: 512, steps: 1 }",
                    "ProxyStep { state: SendWait, trans_size: 0 }"
                ],
                "{version}"
            );
        }
        assert_eq!(got.iter().filter(|g| matches!(g, Got::Stop { .. })).count(), 3);
        assert!(matches!(got.last(), Some(Got::Finalize { .. })), "{version}: {got:?}");
        // After finalize the context and its handles are dead.
        host.stop(h_op);
        host.record(h_step, 9, ptr::null_mut::<StateArgsV4>());
        assert!(rec.take().is_empty(), "{version}: nothing reaches a finalized communicator");
    }
    plugin::install(None);
}

#[test]
fn threads_on_two_communicators_get_unique_handles_and_lose_nothing() {
    let _g = lock();
    let rec = install(EventMask::ALL);
    let host = Host { version: ApiVersion::V6 };
    let (a, _) = host.init(1, 0);
    let (b, mask) = host.init(2, 1);
    assert_eq!(mask, 0x7FFF);
    const THREADS: usize = 8;
    const STEPS: usize = 2000;
    let all: Vec<Vec<usize>> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..THREADS)
            .map(|t| {
                let ctx = if t % 2 == 0 { a as usize } else { b as usize };
                let host = &host;
                s.spawn(move || {
                    let ctx = ctx as *mut c_void;
                    let mut op = DescrV6::new(EventType::ProxyOp.bit(), ptr::null_mut(), 0);
                    op.u.proxy_op.pid = std::process::id() as i32;
                    let h_op = host.start(ctx, &mut op);
                    let mut mine = vec![h_op as usize];
                    for i in 0..STEPS {
                        let mut st = DescrV6::new(EventType::ProxyStep.bit(), h_op, 0);
                        st.u.proxy_step.step = i as c_int;
                        let h = host.start(ctx, &mut st);
                        let mut args = StateArgsV4 { raw: i as u64 };
                        host.record(h, 10, &mut args);
                        host.stop(h);
                        mine.push(h as usize);
                    }
                    host.stop(h_op);
                    mine
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().expect("worker")).collect()
    });
    host.finalize(a);
    host.finalize(b);
    let handles: HashSet<usize> = all.iter().flatten().copied().collect();
    assert_eq!(handles.len(), THREADS * (STEPS + 1), "every handle distinct across threads and communicators");
    assert!(!handles.contains(&0));
    let got = rec.take();
    let count = |f: fn(&Got) -> bool| got.iter().filter(|g| f(g)).count();
    assert_eq!(count(|g| matches!(g, Got::Start { .. })), THREADS * (STEPS + 1));
    assert_eq!(count(|g| matches!(g, Got::State { .. })), THREADS * STEPS);
    assert_eq!(count(|g| matches!(g, Got::Stop { .. })), THREADS * (STEPS + 1));
    assert_eq!(count(|g| matches!(g, Got::Finalize { .. })), 2);
    // Each step's parent is its own thread's ProxyOp, on its own communicator.
    for mine in &all {
        let op = mine[0] as u64;
        let (comm_of_op, parents) = got.iter().fold((None, 0), |(c, n), g| match g {
            Got::Start { id, comm, .. } if *id == op => (Some(*comm), n),
            Got::Start { parent: Some(p), .. } if *p == op => (c, n + 1),
            _ => (c, n),
        });
        assert_eq!(parents, STEPS);
        assert!(comm_of_op.is_some());
    }
    plugin::install(None);
}

#[test]
fn garbage_is_dropped_and_counted_never_a_crash() {
    let _g = lock();
    let rec = install(EventMask::ALL);
    let before = plugin::dropped_calls();
    let host = Host { version: ApiVersion::V5 };
    let (ctx, _) = host.init(9, 0);
    let foreign = 0xdead_beef_usize as *mut c_void;

    // NULL descriptor, unknown type, two types at once: NULL handles.
    let h = {
        let mut hh: *mut c_void = ptr::dangling_mut::<c_void>();
        // SAFETY: a NULL descriptor is what this checks.
        unsafe { plugin::ncclProfiler_v5.0.start_event.expect("start")(ctx, &mut hh, ptr::null_mut()) };
        hh
    };
    assert!(h.is_null());
    assert!(host.start(ctx, &mut DescrV5::new(0x4000, ptr::null_mut(), 0)).is_null(), "CE type under v5");
    assert!(host.start(ctx, &mut DescrV5::new(3, ptr::null_mut(), 0)).is_null());
    // A NULL out-pointer for the handle.
    // SAFETY: NULL is what this checks.
    unsafe {
        let mut d = DescrV5::new(EventType::Group.bit(), ptr::null_mut(), 0);
        plugin::ncclProfiler_v5.0.start_event.expect("start")(ctx, ptr::null_mut(), ptr::from_mut(&mut d).cast());
    }
    // A foreign or garbage context: NULL handle; a NULL context: NULL handle, not counted.
    assert!(host.start(foreign, &mut DescrV5::new(EventType::Group.bit(), ptr::null_mut(), 0)).is_null());
    assert!(host.start(ptr::null_mut(), &mut DescrV5::new(EventType::Group.bit(), ptr::null_mut(), 0)).is_null());
    // Strings NULL, a foreign parent: delivered with "Unknown" and no parent.
    let mut c = DescrV5::new(EventType::Coll.bit(), foreign, 0);
    c.u.coll.parent_group = foreign;
    let hc = host.start(ctx, &mut c);
    assert!(!hc.is_null());
    // A ProxyOp of another process (PXN): dropped.
    let mut op = DescrV5::new(EventType::ProxyOp.bit(), hc, 0);
    op.u.proxy_op.pid = std::process::id() as i32 + 1;
    assert!(host.start(ctx, &mut op).is_null());
    // Unknown state, NULL args, foreign and NULL handles on stop and record.
    host.record(hc, 99, ptr::null_mut::<StateArgsV4>());
    host.record(hc, 9, ptr::null_mut::<StateArgsV4>());
    host.record(foreign, 9, ptr::null_mut::<StateArgsV4>());
    host.record(ptr::null_mut(), 9, ptr::null_mut::<StateArgsV4>());
    host.stop(foreign);
    host.stop(ptr::null_mut());
    host.stop(ctx); // a context is not a handle
                    // A sink that panics: caught, counted, NULL-free handle still returned to NCCL.
    let mut boom = DescrV5::new(EventType::Coll.bit(), ptr::null_mut(), 0);
    boom.u.coll.seq_number = 666;
    let prev_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let hb = host.start(ctx, &mut boom);
    std::panic::set_hook(prev_hook);
    assert!(hb.is_null(), "the handle stays NULL when the start panicked");
    host.stop(hc);
    host.stop(hc); // twice
    host.finalize(foreign);
    host.finalize(ptr::null_mut());
    host.finalize(ctx);
    host.finalize(ctx); // twice

    let got = rec.take();
    let starts: Vec<&str> =
        got.iter().filter_map(|g| if let Got::Start { descr, .. } = g { Some(descr.as_str()) } else { None }).collect();
    assert_eq!(starts.len(), 1, "only the Coll got through: {starts:?}");
    assert!(starts[0].contains("func: \"Unknown\"") && starts[0].contains("parent_group: None"), "{}", starts[0]);
    assert!(got.iter().any(|g| matches!(g, Got::Start { parent: None, .. })));
    assert_eq!(got.iter().filter(|g| matches!(g, Got::State { .. })).count(), 1, "state 9 only");
    assert_eq!(got.iter().filter(|g| matches!(g, Got::Finalize { .. })).count(), 1);

    let after = plugin::dropped_calls();
    let delta: Vec<(&str, u64)> = after.iter().zip(before).map(|(a, b)| (a.0, a.1 - b.1)).collect();
    assert_eq!(
        delta,
        [("bad_descriptor", 3), ("bad_state", 1), ("unknown_handle", 6), ("foreign_process", 1), ("panic", 1)],
        "unknown_handle: the foreign context's start, record and stop with a foreign handle, the context used \
         as a handle, the foreign and the second finalize (a second stop of a live communicator's event \
         reaches its sink, which ignores it)"
    );
    plugin::install(None);
}

#[test]
fn without_a_backend_init_succeeds_with_a_null_context() {
    let _g = lock();
    plugin::install(None);
    // This test process enables no exporter, so the environment's backend is none.
    let host = Host { version: ApiVersion::V6 };
    let (ctx, mask) = host.init(5, 0);
    assert!(ctx.is_null());
    assert_eq!(mask, 0, "no live communicator wants anything");
    let mut g = DescrV6::new(EventType::GroupApi.bit(), ptr::null_mut(), 0);
    assert!(host.start(ctx, &mut g).is_null());
    host.finalize(ctx);
}

/// An exporter that only counts: the collector's and the plugin's cost, not an exporter's.
struct CountSpans(std::sync::atomic::AtomicU64);

impl occl_telemetry::spans::Exporter for CountSpans {
    fn name(&self) -> &str {
        "count"
    }
    fn interest(&self) -> EventMask {
        EventMask::ALL
    }
    fn span(&self, _: &occl_telemetry::spans::Span<'_>) {
        self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
}

/// A profiler whose sinks do nothing: what the plugin alone costs.
struct Noop;
struct NoopSink;
impl Profiler for Noop {
    fn name(&self) -> &str {
        "noop"
    }
    fn init(&self, _: &CommInfo<'_>) -> Option<Arc<dyn Sink>> {
        Some(Arc::new(NoopSink))
    }
}
impl Sink for NoopSink {
    fn interest(&self) -> EventMask {
        EventMask::ALL
    }
}

/// This thread's CPU time: a bound on it holds on a loaded machine, where wall time does not.
fn thread_cpu() -> std::time::Duration {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: a valid out-pointer; CLOCK_THREAD_CPUTIME_ID exists on Linux.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime");
    std::time::Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// (wall, CPU of one thread) ns per ProxyStep (start, two states, stop) under its ProxyOp, on
/// `threads` threads at once.
fn step_cost(host: &Host, ctx: *mut c_void, threads: usize, steps: usize) -> (f64, f64) {
    let t0 = std::time::Instant::now();
    let cpu: Vec<std::time::Duration> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                let ctx = ctx as usize;
                s.spawn(move || {
                    let c0 = thread_cpu();
                    let ctx = ctx as *mut c_void;
                    let mut op = DescrV6::new(EventType::ProxyOp.bit(), ptr::null_mut(), 0);
                    op.u.proxy_op.pid = std::process::id() as i32;
                    let h_op = host.start(ctx, &mut op);
                    for i in 0..steps {
                        let mut st = DescrV6::new(EventType::ProxyStep.bit(), h_op, 0);
                        st.u.proxy_step.step = i as c_int;
                        let h = host.start(ctx, &mut st);
                        let mut a = StateArgsV4 { raw: 65536 };
                        host.record(h, 8, &mut a);
                        host.record(h, 9, &mut a);
                        host.stop(h);
                    }
                    host.stop(h_op);
                    thread_cpu() - c0
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().expect("worker")).collect()
    });
    let wall = t0.elapsed().as_nanos() as f64 / (threads * steps) as f64;
    let cpu = cpu.iter().map(|d| d.as_nanos() as f64).sum::<f64>() / (threads * steps) as f64;
    (wall, cpu)
}

#[test]
fn what_a_proxy_step_costs_through_the_plugin() {
    let _g = lock();
    const STEPS: usize = 100_000;
    let host = Host { version: ApiVersion::V6 };
    let mut cpu_costs = Vec::new();
    for collector in [false, true] {
        let counter = Arc::new(CountSpans(Default::default()));
        let backend = if collector {
            Backend::telemetry(Arc::new(occl_telemetry::spans::Telemetry::new(vec![counter.clone()])))
        } else {
            Backend::new(Arc::new(Noop))
        };
        plugin::install(Some(backend));
        let (ctx, _) = host.init(77, 0);
        for threads in [1usize, 4] {
            let (wall, cpu) = step_cost(&host, ctx, threads, STEPS);
            let what = if collector { "into occl's span collector" } else { "into a sink that does nothing" };
            println!(
                "ProxyStep start + 2 states + stop through ncclProfiler_v6 {what}, {threads} thread(s): \
                 {cpu:.0} ns CPU, {wall:.0} ns wall per step"
            );
            cpu_costs.push(cpu);
        }
        host.finalize(ctx);
        if collector {
            let spans = counter.0.load(std::sync::atomic::Ordering::Relaxed) as usize;
            assert_eq!(spans, 5 * (STEPS + 1), "every step and op became a span");
        }
    }
    plugin::install(None);
    // Generous bounds on CPU time: they catch a lock or an allocation storm on the plugin's path,
    // not a few percent.
    assert!(cpu_costs[0] < 5_000.0, "{:.0} ns CPU per step in the plugin alone", cpu_costs[0]);
    assert!(cpu_costs[2] < 20_000.0, "{:.0} ns CPU per step with the collector", cpu_costs[2]);
}
