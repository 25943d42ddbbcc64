//! The real Prometheus: Debian's `prometheus` scrapes a live 4-rank job's RAS port every second, and the test asks
//! its HTTP API for the series until they appear: every rank's operation counts and bytes exactly as the job ran
//! them. Also `promtool check metrics` on a real scrape, and scrapes on fresh connections (which the kernel hands to
//! any of the four processes sharing the port) all answer for the whole node.
//!
//! Prometheus asks for OpenMetrics (its `Accept` header prefers it) and gets it: the units it learns, and the same
//! scrape checked against OpenMetrics' rules; a plain request gets text 0.0.4.
//!
//! Needs `prometheus` and `promtool` on PATH (scripts/test.sh installs Debian's package). Without them the test says
//! it was skipped; under CI (`CI` set) it fails instead.

mod common;

use common::prometheus::{get, get_with, one_target_config, tool, Prometheus};
use common::{env, scratch, worker};
use occl::{Comm, RedOp};
use occl_telemetry::spans::{CommMeta, Exporter as _, Telemetry};
use occl_tests::launch::{Job, Spawn};
use occl_tests::ras_client::free_port;
use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const RANKS: usize = 4;

/// The `metrics` scenario of occl-test-worker, per rank: (family, op, operations, bytes).
fn expected() -> BTreeMap<(String, usize, String), (f64, f64)> {
    let mut m = BTreeMap::new();
    for r in 0..RANKS {
        let mut put = |fam: &str, op: &str, n: f64, b: f64| {
            m.insert((fam.to_string(), r, op.to_string()), (n, b));
        };
        put("collective", "AllReduce", 9.0, 7.0 * 4000.0 + 2.0 * 1048576.0);
        put("collective", "AllGather", 3.0, 3.0 * 1024.0);
        put("collective", "Broadcast", 2.0, 2.0 * 800.0);
        put("p2p", if r % 2 == 0 { "Send" } else { "Recv" }, 1.0, 300.0);
    }
    m
}

/// `sum by (rank, op)` of a family, keyed like [`expected`].
fn by_rank_op(p: &Prometheus, fam: &str, metric: &str) -> BTreeMap<(String, usize, String), f64> {
    p.query(&format!("sum by (rank, op) ({metric})"))
        .into_iter()
        .filter_map(|(l, v)| Some(((fam.to_string(), l.get("rank")?.parse().ok()?, l.get("op")?.clone()), v)))
        .collect()
}

/// A live job of `ranks` workers running `args` with `OCCL_METRICS=metrics` (empty: unset), every
/// rank's RAS on one free loopback port, once every rank printed READY: the port and the job.
fn metrics_job(args: &[&str], ranks: usize, metrics: &str) -> (u16, Job) {
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let spawn = Spawn {
        env: env(&[("OCCL_RAS_ADDR", &addr), ("OCCL_METRICS", metrics)]),
        capture_stdout: true,
        capture_stderr: true,
        ..Spawn::default()
    };
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    let job = Job::spawn(worker(), &args, ranks, &spawn).expect("start job");
    job.wait_for_all("READY", Duration::from_secs(60)).expect("ranks ran the workload");
    (port, job)
}

#[test]
fn prometheus_scrapes_every_rank_of_a_live_job_with_exact_counts_and_bytes() {
    let (Some(prometheus), Some(promtool)) = (tool("prometheus"), tool("promtool")) else { return };
    let dir = scratch("prometheus");
    let (port, job) = metrics_job(&["metrics"], RANKS, "1");

    // The process that owns the port answers for the whole node: on fresh connections, every
    // scrape (once RAS has seen every process) has every rank's series.
    let t = Instant::now();
    let mut good = 0;
    let mut first = None;
    while good < 8 {
        let (code, body) = get(port, "/metrics").unwrap_or_default();
        let body = occl_tests::ras_client::without_job(&body);
        let ranks: BTreeSet<String> = body
            .lines()
            .filter(|l| l.starts_with("occl_communicator_info{"))
            .filter_map(|l| Some(l.split("rank=\"").nth(1)?.split('"').next()?.to_string()))
            .collect();
        if code == 200
            && ranks.len() == RANKS
            && body.contains("occl_ras_node_metrics_processes{result=\"answered\"} 4")
        {
            good += 1;
            first.get_or_insert(body);
        } else {
            assert!(good == 0, "a scrape after a complete one lacked ranks (HTTP {code}): {ranks:?}\n{body}");
            assert!(t.elapsed() < Duration::from_secs(20), "no scrape had all {RANKS} ranks: {ranks:?}\n{body}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    // promtool reads a real scrape and reports nothing.
    let body = first.unwrap_or_default();
    let mut check = Command::new(&promtool)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run promtool");
    check.stdin.take().expect("stdin").write_all(body.as_bytes()).expect("feed promtool");
    let out = check.wait_with_output().expect("promtool");
    let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success() && said.trim().is_empty(), "promtool check metrics: {said}\n--- scrape:\n{body}");

    // Prometheus scrapes the port every second; the series appear with the job's exact numbers.
    let p = Prometheus::start(&prometheus, &one_target_config(port), &dir);
    let want = expected();
    let t = Instant::now();
    let (mut ops, mut bytes, mut durs);
    loop {
        ops = by_rank_op(&p, "collective", "occl_collective_operations_total");
        ops.extend(by_rank_op(&p, "p2p", "occl_p2p_operations_total"));
        bytes = by_rank_op(&p, "collective", "occl_collective_bytes_total");
        bytes.extend(by_rank_op(&p, "p2p", "occl_p2p_bytes_total"));
        durs = by_rank_op(&p, "collective", "occl_collective_duration_seconds_count");
        durs.extend(by_rank_op(&p, "p2p", "occl_p2p_duration_seconds_count"));
        if ops.len() == want.len() && bytes.len() == want.len() && durs.len() == want.len() {
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(30), "series did not appear in Prometheus: {ops:?}\n{}", p.log());
        std::thread::sleep(Duration::from_millis(250));
    }
    for (k, (n, b)) in &want {
        assert_eq!(ops.get(k), Some(n), "operations of {k:?}: {ops:?}");
        assert_eq!(bytes.get(k), Some(b), "bytes of {k:?}: {bytes:?}");
        assert_eq!(durs.get(k), Some(n), "every operation is timed, {k:?}: {durs:?}");
    }
    let one = |q: &str| p.query(q).first().map(|(_, v)| *v);
    assert_eq!(one("count(count by (pid) (occl_communicator_info))"), Some(RANKS as f64), "one pid per rank");
    assert_eq!(one("up{job=\"occl\"}"), Some(1.0));
    assert_eq!(one("min(occl_ras_node_metrics_processes{result=\"answered\"})"), Some(RANKS as f64));
    // Time-weighted bus bandwidth of the big all-reduces is a finite positive number.
    let busbw = one("sum(occl_collective_bus_bytes_total{op=\"AllReduce\",rank=\"0\"}) / sum(occl_collective_duration_seconds_sum{op=\"AllReduce\",rank=\"0\"})");
    assert!(busbw.is_some_and(|b| b.is_finite() && b > 0.0), "{busbw:?}");

    // Bytes by transport (told by the core) are the bytes the proxy steps moved: all shm on one host.
    let tr = p.query("sum by (rank) (occl_transport_bytes_total{transport=\"shm\",direction=\"send\"})");
    let steps = p.query("sum by (rank) (occl_proxy_step_bytes_total{direction=\"send\"})");
    assert_eq!(tr.len(), RANKS, "{tr:?}");
    assert_eq!(tr, steps, "transport bytes vs step bytes");
    assert!(tr.iter().all(|(_, v)| *v >= 2.0 * 1048576.0), "{tr:?}");

    // Prometheus asks for OpenMetrics and gets it: the families' units (only OpenMetrics has them) are in its
    // metadata, and the same scrape with its Accept header is OpenMetrics by an independent check.
    let t = Instant::now();
    let meta = loop {
        let m = p.metadata();
        if m.contains_key("occl_collective_bytes") || t.elapsed() > Duration::from_secs(10) {
            break m;
        }
        std::thread::sleep(Duration::from_millis(250));
    };
    let unit = |name: &str| meta.get(name).cloned().unwrap_or_default();
    assert_eq!(unit("occl_collective_bytes"), ("counter".into(), "bytes".into()), "{meta:?}");
    assert_eq!(unit("occl_collective_duration_seconds"), ("histogram".into(), "seconds".into()), "{meta:?}");
    assert_eq!(unit("occl_operations_launched"), ("counter".into(), String::new()), "RAS's own: {meta:?}");
    let prometheus_accept = "Accept: application/openmetrics-text;version=1.0.0,application/openmetrics-text;\
                             version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1\r\n";
    let (code, head, om) = get_with(port, "/metrics", prometheus_accept).unwrap_or_default();
    assert_eq!(code, 200, "{head}");
    assert!(head.to_ascii_lowercase().contains("content-type: application/openmetrics-text; version=1.0.0"), "{head}");
    occl_tests::openmetrics::check(&om).map_err(|e| format!("{e}\n{om}")).expect("OpenMetrics");
    assert!(om.contains("# TYPE occl_collective_operations counter\n"), "{om}");
    assert!(om.contains("# TYPE occl_ras_peers gauge\n"), "{om}");
    // Plain requests and curl still get text 0.0.4.
    let (_, head, text) = get_with(port, "/metrics", "Accept: */*\r\n").unwrap_or_default();
    assert!(head.to_ascii_lowercase().contains("content-type: text/plain; version=0.0.4"), "{head}");
    assert!(!text.contains("# EOF") && text.contains("# TYPE occl_collective_operations_total counter\n"));

    // Several scrapes later every series is still there in every scrape (none flips in and out).
    std::thread::sleep(Duration::from_secs(3));
    let present = p.query("count_over_time(occl_communicator_info[3s])");
    assert_eq!(present.len(), RANKS, "{present:?}");
    assert!(present.iter().all(|(_, n)| *n >= 2.0), "series missing from some scrapes: {present:?}");
    drop(job);
}

/// The core tells the exporter what no event carries: a failed operation's error kind (here the mismatch of two ranks
/// calling different sizes) and the bytes each transport moved. In process, two ranks on two threads.
/// Attaches collector `t`'s sink to each of two ranks.
fn attach(comms: &[Comm], t: &Telemetry) -> Vec<occl_telemetry::SinkHandle> {
    comms
        .iter()
        .map(|c| {
            let meta = CommMeta { name: None, hash: c.id(), rank: c.rank() as i32, nranks: 2, n_nodes: 1 };
            c.attach_sink(t.comm_sink(meta)).expect("attach")
        })
        .collect()
}

#[test]
fn the_core_reports_errors_by_kind_and_bytes_by_transport() {
    let comms = Comm::init_all(2).expect("two ranks");
    let prom = std::sync::Arc::new(occl_telemetry::prometheus::Exporter::new());
    let how = std::sync::Arc::new(HowOpsArrive::default());
    let t = Telemetry::new(vec![prom.clone(), how.clone()]);
    let handles = attach(&comms, &t);
    std::thread::scope(|s| {
        for c in &comms {
            s.spawn(move || {
                let n = 4096;
                let (a, mut b) = (vec![1.0f32; n], vec![0f32; n]);
                c.all_reduce(&a, &mut b, RedOp::Sum).expect("a matching all-reduce");
                // Rank 1 calls a different size: both fail.
                let m = if c.rank() == 0 { 1000 } else { 1500 };
                assert!(c.all_reduce(&a[..m], &mut b[..m], RedOp::Sum).is_err());
            });
        }
    });
    for (c, h) in comms.iter().zip(handles) {
        c.detach_sink(h);
    }
    let mut text = String::new();
    prom.render_metrics(&mut text);
    for r in 0..2 {
        let l = format!("comm=\"{:016x}\",rank=\"{r}\"", comms[0].id());
        let v = |name: &str| -> f64 {
            text.lines()
                .filter(|x| x.starts_with(name) && x.contains(&l))
                .filter_map(|x| x.rsplit(' ').next()?.parse::<f64>().ok())
                .sum()
        };
        assert_eq!(v("occl_operation_errors_total{"), 1.0, "rank {r}:\n{text}");
        let shm = v("occl_transport_bytes_total{");
        assert!(shm >= 2.0 * 4096.0 * 4.0 / 2.0, "rank {r} moved {shm} bytes over shm:\n{text}");
        assert!(text.contains(&format!("occl_transport_bytes_total{{{l},transport=\"shm\",direction=\"send\"}}")));
    }
    // The rank that sees the other's different size names the mismatch; the other may learn it as a remote failure.
    assert!(text.contains("op=\"AllReduce\",kind=\"InvalidUsage\"} 1"), "{text}");
    for c in comms {
        let _ = c.destroy();
    }
}

/// Counts what a sink asking for step sums receives: ProxySteps sent as events, and `step_totals` calls.
#[derive(Default)]
struct SumWatch {
    step_starts: std::sync::atomic::AtomicU64,
    sums: std::sync::atomic::AtomicU64,
}

impl occl_telemetry::Sink for SumWatch {
    fn interest(&self) -> occl_telemetry::EventMask {
        occl_telemetry::EventMask::STEP_TOTALS
    }
    fn start(
        &self,
        _: occl_telemetry::EventId,
        _: Option<occl_telemetry::EventId>,
        ev: &occl_telemetry::EventDescr<'_>,
    ) {
        if ev.event_type() == occl_telemetry::EventType::ProxyStep {
            self.step_starts.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }
    fn step_totals(&self, _: occl_telemetry::EventId, _: &occl_telemetry::StepTotals) {
        self.sums.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
}

/// An exporter beside Prometheus in the same collector that takes operation sums too, and counts how its
/// operations arrived: as sums, or as Coll spans.
#[derive(Default)]
struct HowOpsArrive {
    sums: std::sync::atomic::AtomicU64,
    spans: std::sync::atomic::AtomicU64,
}

impl occl_telemetry::spans::Exporter for HowOpsArrive {
    fn name(&self) -> &str {
        "how-ops-arrive"
    }
    fn interest(&self) -> occl_telemetry::EventMask {
        occl_telemetry::EventMask::OP_TOTALS | occl_telemetry::EventType::Coll
    }
    fn span(&self, s: &occl_telemetry::spans::Span<'_>) {
        if s.descr.event_type() == occl_telemetry::EventType::Coll {
            self.spans.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }
    fn op_totals(&self, _: &std::sync::Arc<CommMeta>, _: &occl_telemetry::OpTotals<'_>) {
        self.sums.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
}

/// A ProxyStep sink beside the exporter: then every step is an event.
struct WantSteps;

impl occl_telemetry::Sink for WantSteps {
    fn interest(&self) -> occl_telemetry::EventMask {
        occl_telemetry::EventMask::of(occl_telemetry::EventType::ProxyStep)
    }
}

/// Per rank: steps and step bytes by direction, and transport bytes sent; and what a `SumWatch` saw (step events,
/// sums).
/// `watch`: a `SumWatch` beside the exporter (without it the exporter is alone and takes whole-operation sums over
/// shm); `with_step_sink`: a ProxyStep sink too.
fn step_metrics(
    transport: occl::TransportKind,
    watch_sums: bool,
    with_step_sink: bool,
) -> (Vec<[f64; 8]>, u64, u64, [u64; 2]) {
    let cfg = occl::Config { transport: Some(transport), ..occl::Config::default() };
    let comms = Comm::init_all_with(2, cfg).expect("two ranks");
    let prom = std::sync::Arc::new(occl_telemetry::prometheus::Exporter::new());
    let how = std::sync::Arc::new(HowOpsArrive::default());
    let t = Telemetry::new(vec![prom.clone(), how.clone()]);
    let watch = std::sync::Arc::new(SumWatch::default());
    let mut handles = Vec::new();
    for c in &comms {
        let meta = CommMeta { name: None, hash: c.id(), rank: c.rank() as i32, nranks: 2, n_nodes: 1 };
        handles.push(c.attach_sink(t.comm_sink(meta)).expect("attach"));
        if watch_sums {
            handles.push(c.attach_sink(watch.clone()).expect("attach"));
        }
        if with_step_sink {
            handles.push(c.attach_sink(std::sync::Arc::new(WantSteps)).expect("attach"));
        }
    }
    std::thread::scope(|s| {
        for c in &comms {
            s.spawn(move || {
                // Several slices per ring step, and one of a single slice.
                for n in [300_000usize, 300_000, 10] {
                    let (a, mut b) = (vec![1.0f32; n], vec![0f32; n]);
                    c.all_reduce(&a, &mut b, RedOp::Sum).expect("all-reduce");
                }
            });
        }
    });
    let per_comm = 1 + usize::from(watch_sums) + usize::from(with_step_sink);
    for (i, h) in handles.into_iter().enumerate() {
        comms[i / per_comm].detach_sink(h);
    }
    let mut text = String::new();
    prom.render_metrics(&mut text);
    let per_rank = (0..2)
        .map(|r| {
            let l = format!("comm=\"{:016x}\",rank=\"{r}\"", comms[0].id());
            let v = |name: &str, dir: &str| -> f64 {
                text.lines()
                    .filter(|x| x.starts_with(name) && x.contains(&l))
                    .filter(|x| dir.is_empty() || x.contains(&format!("direction=\"{dir}\"")))
                    .filter_map(|x| x.rsplit(' ').next()?.parse::<f64>().ok())
                    .sum()
            };
            [
                v("occl_proxy_steps_total{", "send"),
                v("occl_proxy_steps_total{", "recv"),
                v("occl_proxy_step_bytes_total{", "send"),
                v("occl_proxy_step_bytes_total{", "recv"),
                v("occl_transport_bytes_total{", "send"),
                v("occl_collective_operations_total{", ""),
                v("occl_collective_bytes_total{", ""),
                v("occl_collective_duration_seconds_count{", ""),
            ]
        })
        .collect();
    for c in comms {
        let _ = c.destroy();
    }
    let r = std::sync::atomic::Ordering::Relaxed;
    (per_rank, watch.step_starts.load(r), watch.sums.load(r), [how.sums.load(r), how.spans.load(r)])
}

/// Prometheus asks for step sums: over shm the core sums each ProxyOp's steps (no ProxyStep event at all), over tcp
/// the steps stay events (the socket writer ends them) and the collector sums them; either way the step counts and
/// bytes are those of per-step events (a ProxyStep sink attached beside it), and the bytes are the transport's. Alone,
/// it takes whole-operation sums over shm (one call per operation, no event) and counts the same.
#[test]
fn step_sums_count_what_step_events_count_over_shm_and_tcp() {
    for tr in [occl::TransportKind::Shm, occl::TransportKind::Tcp] {
        let (sums, step_events, sum_calls, how) = step_metrics(tr, true, false);
        let (events, _, sum_calls_with_steps, _) = step_metrics(tr, true, true);
        // The collector alone: over shm every all-reduce reaches it as one operation sum, no event.
        let (alone, _, _, how_alone) = step_metrics(tr, false, false);
        assert_eq!(sums, events, "{tr:?}: summed vs per-step events");
        assert_eq!(alone, events, "{tr:?}: operation sums vs events");
        assert_eq!(how, [0, 6], "{tr:?}: a sink without operation sums beside: every operation is events");
        match tr {
            occl::TransportKind::Tcp => assert_eq!(how_alone, [0, 6], "tcp operations stay events"),
            _ => assert_eq!(how_alone, [6, 0], "shm operations are summed whole"),
        }
        for r in &sums {
            assert!(r[0] > 0.0 && r[1] > 0.0, "{tr:?}: steps {r:?}");
            assert_eq!(r[2], r[4], "{tr:?}: step bytes sent vs transport bytes {r:?}");
            assert_eq!(r[2], r[3], "{tr:?}: a 2-rank ring sends what it receives {r:?}");
            assert_eq!(
                r[5..],
                [3.0, 2_400_040.0, 3.0],
                "{tr:?}: three all-reduces of 300,000, 300,000 and 10 f32 {r:?}"
            );
        }
        assert_eq!(sum_calls_with_steps, 0, "{tr:?}: with a ProxyStep sink every step is an event");
        match tr {
            occl::TransportKind::Tcp => assert_eq!((step_events > 0, sum_calls), (true, 0), "tcp steps stay events"),
            _ => assert_eq!((step_events, sum_calls > 0), (0, true), "shm steps are summed"),
        }
    }
}

/// Scrapes the RAS port until every rank of the job has answered (`occl_ras_node_metrics_processes`), and returns that
/// scrape without the job label.
fn scrape_whole_node(port: u16, ranks: usize) -> String {
    let t = Instant::now();
    loop {
        let (code, body) = get(port, "/metrics").unwrap_or_default();
        let body = occl_tests::ras_client::without_job(&body);
        if code == 200 && body.contains(&format!("occl_ras_node_metrics_processes{{result=\"answered\"}} {ranks}")) {
            return body;
        }
        assert!(t.elapsed() < Duration::from_secs(20), "no scrape with all {ranks} processes (HTTP {code}):\n{body}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The sum of the samples of `series` (a name and the start of its labels) on `rank` whose `state` label is `state`
/// (any state: "").
fn sum_of(text: &str, series: &str, rank: usize, state: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(series) && l.contains(&format!("rank=\"{rank}\"")))
        .filter(|l| state.is_empty() || l.contains(&format!("state=\"{state}\"")))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Metrics are on without `OCCL_METRICS`: a live 4-rank job (every peer over shm: the direct route) serves every rank's
/// exact operation counts, bytes and timings; `OCCL_METRICS=0` turns them off (RAS's own series stay).
#[test]
fn metrics_are_on_by_default_and_off_with_zero() {
    // Empty is "unset" (the default) in case this test's own environment sets the variable.
    for (value, on) in [("", true), ("0", false)] {
        let (port, job) = metrics_job(&["metrics"], RANKS, value);
        let body = scrape_whole_node(port, RANKS);
        assert!(body.contains("occl_ras_"), "OCCL_METRICS={value:?}: RAS's own series are served:\n{body}");
        if !on {
            assert!(!body.contains("occl_communicator_info"), "OCCL_METRICS=0 serves no occl series:\n{body}");
            assert!(!body.contains("occl_collective_"), "OCCL_METRICS=0 serves no occl series:\n{body}");
            continue;
        }
        for ((fam, rank, op), (n, b)) in expected() {
            let of_op = |metric: &str| -> f64 {
                body.lines()
                    .filter(|l| l.starts_with(&format!("occl_{fam}_{metric}{{")))
                    .filter(|l| l.contains(&format!("rank=\"{rank}\"")) && l.contains(&format!("op=\"{op}\"")))
                    .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                    .sum()
            };
            assert_eq!((of_op("operations_total"), of_op("bytes_total")), (n, b), "{fam} rank {rank} {op}:\n{body}");
        }
        for r in 0..RANKS {
            let timed = sum_of(&body, "occl_collective_duration_seconds_count{", r, "");
            assert_eq!(timed, 14.0, "rank {r}: every collective is timed:\n{body}");
            let moved = sum_of(&body, "occl_transport_bytes_total{", r, "");
            assert!(moved >= 2.0 * 1048576.0, "rank {r} moved {moved} bytes:\n{body}");
        }
        drop(job);
    }
}

/// Step waits on the direct route (every peer over shm): in a live 2-rank job whose rank 1 enters an all-reduce and
/// then a grouped send/receive 200 ms late each time, rank 0's scrape shows it waited for data (RecvWait) about that
/// long, twice; the late rank, whose data was always there, waited far less.
#[test]
fn the_direct_route_times_the_waits_of_a_rank_whose_peer_is_late() {
    let (port, _job) = metrics_job(&["metrics-late", "200"], 2, "");
    let body = scrape_whole_node(port, 2);
    let wait = |rank: usize, state: &str| sum_of(&body, "occl_proxy_step_wait_seconds_total{", rank, state);
    let (early, late) = (wait(0, "RecvWait"), wait(1, "RecvWait"));
    // Two waits of close to 200 ms each (less only by how much later than rank 1's sleep rank 0 entered: ranks leave
    // init within microseconds of each other; one wait alone measured 0.199 s here).
    assert!(early >= 0.35, "rank 0 waited {early} s for data:\n{body}");
    assert!(late < 0.1 && late < early / 4.0, "rank 1 waited {late} s for data (rank 0: {early} s):\n{body}");
    // Steps were counted as usual beside the waits.
    assert!(sum_of(&body, "occl_proxy_steps_total{", 0, "") >= 4.0, "{body}");
}

/// The route a rank takes changes nothing a scrape shows: on two thread ranks whose series the core bumps directly,
/// an exporter attached beside them through the span collector counts the same operations, bytes, bus bytes, size
/// histograms, proxy steps and transport bytes, grouped sends and receives included (only times differ).
#[test]
fn the_direct_route_counts_what_the_span_route_counts() {
    let Some(process) = occl_telemetry::prometheus::process() else {
        let _ = writeln!(std::io::stderr(), "SKIPPED direct-route test: OCCL_METRICS turns metrics off here");
        return;
    };
    let comms = Comm::init_all(2).expect("two ranks");
    assert!(comms.iter().all(Comm::direct_metrics), "thread ranks over shm take the direct route");
    let by_spans = std::sync::Arc::new(occl_telemetry::prometheus::Exporter::new());
    let t = Telemetry::new(vec![by_spans.clone()]);
    let handles = attach(&comms, &t);
    std::thread::scope(|s| {
        for c in &comms {
            s.spawn(move || {
                // Rank 0 waits for rank 1's data in the first all-reduce (step waits on both routes).
                if c.rank() == 1 {
                    std::thread::sleep(Duration::from_millis(50));
                }
                for n in [2usize, 1000, 300_000, 2, 70_000] {
                    let (a, mut b) = (vec![1.0f32; n], vec![0f32; n]);
                    c.all_reduce(&a, &mut b, RedOp::Sum).expect("all-reduce");
                }
                let (a, mut b) = (vec![3i32; 500], vec![0i32; 1000]);
                c.all_gather(&a, &mut b).expect("all-gather");
                let mut x = vec![0f64; 40_000];
                c.broadcast_in_place(&mut x, 1).expect("broadcast");
                let peer = 1 - c.rank();
                let (p, mut q) = (vec![7u8; 5000], vec![0u8; 5000]);
                if c.rank() == 0 {
                    c.send(&p, peer).expect("send");
                } else {
                    c.recv(&mut q, peer).expect("recv");
                }
                // A group of a send and a receive each way.
                occl::group(|g| {
                    g.send(c, &p, peer)?;
                    g.recv(c, &mut q, peer)
                })
                .expect("group");
            });
        }
    });
    for (c, h) in comms.iter().zip(handles) {
        c.detach_sink(h);
    }
    let (mut direct, mut spans) = (String::new(), String::new());
    occl_telemetry::spans::Exporter::render_metrics(&**process, &mut direct);
    by_spans.render_metrics(&mut spans);
    let comm = format!("comm=\"{:016x}\"", comms[0].id());
    // Times are each route's own clock readings: durations, and step waits (the span route times each step from mark
    // to mark, the direct route only the waits that blocked).
    let waits = "occl_proxy_step_wait_seconds_total";
    let timeless = |text: &str| -> Vec<String> {
        text.lines()
            .filter(|l| l.contains(&comm))
            .filter(|l| !l.contains("_duration_seconds") && !l.starts_with(waits))
            .map(str::to_string)
            .collect()
    };
    let (d, s) = (timeless(&direct), timeless(&spans));
    assert!(d.iter().any(|l| l.starts_with("occl_p2p_operations_total")), "{direct}");
    assert!(d.iter().any(|l| l.starts_with("occl_proxy_steps_total")), "{direct}");
    assert_eq!(d, s, "direct route vs span route");
    // The same step wait series on both, and the forced wait on both: rank 0 waited at least 50 ms for data.
    let series = |text: &str| -> Vec<String> {
        text.lines()
            .filter(|l| l.contains(&comm) && l.starts_with(waits))
            .filter_map(|l| Some(l.rsplit_once(' ')?.0.to_string()))
            .collect()
    };
    assert_eq!(series(&direct), series(&spans), "the same step wait series");
    let of_comm = |text: &str| text.lines().filter(|l| l.contains(&comm)).collect::<Vec<_>>().join("\n");
    for (route, text) in [("direct", &direct), ("span", &spans)] {
        let recv_wait = sum_of(&of_comm(text), waits, 0, "RecvWait");
        assert!(recv_wait >= 0.045, "{route} route: rank 0 waited {recv_wait} s for data:\n{text}");
    }
    let timed =
        |text: &str| text.lines().filter(|l| l.contains(&comm) && l.contains("_duration_seconds_count")).count();
    assert_eq!(timed(&direct), timed(&spans), "the same duration series");
    for c in comms {
        let _ = c.destroy();
    }
}
