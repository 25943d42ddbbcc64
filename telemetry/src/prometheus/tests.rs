use super::*;
use crate::event::{ProxyStepState, StateArgs};
use crate::sink::Sink;
use crate::spans::Telemetry;
use crate::EventId;
use std::collections::{BTreeMap, BTreeSet};
use std::num::NonZeroU64;
use std::time::Duration;

fn id(n: u64) -> EventId {
    EventId(NonZeroU64::new(n).expect("non-zero"))
}

fn meta(name: Option<&str>, rank: i32) -> CommMeta {
    CommMeta { name: name.map(str::to_owned), hash: 0xfeed_beef, rank, nranks: 4, n_nodes: 1 }
}

fn coll(func: &str, count: usize) -> EventDescr<'_> {
    coll_by(func, "RING", count)
}

/// A Coll descriptor of algorithm `algo`.
fn coll_by<'a>(func: &'a str, algo: &'a str, count: usize) -> EventDescr<'a> {
    EventDescr::Coll {
        rank: 0,
        seq_number: 1,
        func,
        send_buff: 0,
        recv_buff: 0,
        count,
        root: 0,
        datatype: "ncclFloat32",
        n_channels: 1,
        n_warps: 0,
        algo,
        proto: "SIMPLE",
        parent_group: None,
    }
}

fn proxy_op(send: bool) -> EventDescr<'static> {
    EventDescr::ProxyOp { rank: 0, pid: 1, channel_id: 0, peer: 1, n_steps: 1, chunk_size: 64, is_send: send }
}

fn render(e: &Exporter) -> String {
    let mut s = String::new();
    spans::Exporter::render_metrics(e, &mut s);
    s
}

/// The value of the sample `name{labels}` (labels exactly as rendered).
fn value(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

/// Checks what a scraper relies on: HELP and TYPE once per family and before its samples, a
/// family's samples together, no series twice, histogram buckets cumulative with `+Inf` equal to
/// `_count`, and every line either a comment or `name{labels} value`.
pub(crate) fn check_exposition(text: &str) -> Result<(), String> {
    let mut typed: BTreeMap<String, String> = BTreeMap::new();
    let mut helped = BTreeSet::new();
    let mut closed = BTreeSet::new();
    let mut current = String::new();
    let mut series = BTreeSet::new();
    let mut buckets: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    let mut counts: BTreeMap<String, f64> = BTreeMap::new();
    for l in text.lines() {
        if let Some(rest) = l.strip_prefix("# HELP ") {
            let name = rest.split(' ').next().unwrap_or("");
            if !helped.insert(name.to_string()) {
                return Err(format!("second HELP for {name}"));
            }
            continue;
        }
        if let Some(rest) = l.strip_prefix("# TYPE ") {
            let mut it = rest.split(' ');
            let (name, kind) = (it.next().unwrap_or(""), it.next().unwrap_or(""));
            if typed.insert(name.to_string(), kind.to_string()).is_some() {
                return Err(format!("second TYPE for {name}"));
            }
            if !current.is_empty() {
                closed.insert(std::mem::take(&mut current));
            }
            if closed.contains(name) {
                return Err(format!("{name} appears twice"));
            }
            current = name.to_string();
            continue;
        }
        let (head, v) = l.rsplit_once(' ').ok_or(format!("not a sample: {l}"))?;
        let v: f64 = v.parse().map_err(|_| format!("bad value in {l}"))?;
        let name = head.split('{').next().unwrap_or("");
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| name.strip_suffix(s).filter(|f| typed.get(*f).is_some_and(|k| k == "histogram")))
            .unwrap_or(name);
        if family != current {
            return Err(format!("{l}: sample outside its family ({current})"));
        }
        if !head.ends_with('}') && head.contains('{') {
            return Err(format!("unterminated labels: {l}"));
        }
        if !series.insert(head.to_string()) {
            return Err(format!("series twice: {head}"));
        }
        if name.ends_with("_bucket") {
            let key = head.split(",le=").next().unwrap_or("").to_string();
            buckets.entry(key).or_default().push(v);
        } else if name.ends_with("_count") {
            counts.insert(head.replacen("_count", "_bucket", 1).trim_end_matches('}').to_string(), v);
        }
    }
    for (k, b) in &buckets {
        if b.windows(2).any(|w| w[0] > w[1]) {
            return Err(format!("{k}: buckets not cumulative"));
        }
        let plain = k.trim_end_matches('}');
        if counts.get(plain).or_else(|| counts.get(k)) != b.last() {
            return Err(format!("{k}: +Inf bucket is not the count"));
        }
    }
    Ok(())
}

#[test]
fn an_occl_collective_is_counted_timed_and_its_steps_waits_summed() {
    let e = Arc::new(Exporter::new());
    let t = Telemetry::new(vec![e.clone()]);
    let s = t.comm_sink(meta(Some("world \"A\"\n"), 2));
    // occl's order: the ProxyOps and their steps run inside the open Coll.
    s.start(id(1), None, &coll("AllReduce", 1000));
    s.start(id(2), Some(id(1)), &proxy_op(true));
    s.start(id(3), Some(id(2)), &EventDescr::ProxyStep { rank: 2, step: 0 });
    s.state(id(3), &StateArgs::ProxyStep { state: ProxyStepState::SendGpuWait, trans_size: 0 });
    std::thread::sleep(Duration::from_millis(3));
    s.state(id(3), &StateArgs::ProxyStep { state: ProxyStepState::SendPeerWait, trans_size: 0 });
    s.state(id(3), &StateArgs::ProxyStep { state: ProxyStepState::SendWait, trans_size: 4000 });
    s.stop(id(3));
    s.start(id(4), Some(id(2)), &EventDescr::ProxyStep { rank: 2, step: 1 });
    s.state(id(4), &StateArgs::ProxyStep { state: ProxyStepState::RecvWait, trans_size: 0 });
    s.state(id(4), &StateArgs::ProxyStep { state: ProxyStepState::RecvFlushWait, trans_size: 4000 });
    s.state(id(4), &StateArgs::ProxyStep { state: ProxyStepState::RecvGpuWait, trans_size: 4000 });
    s.stop(id(4));
    s.stop(id(2));
    s.stop(id(1));
    s.note(&Note::TransportBytes { transport: "shm", send: true, bytes: 4000 });
    s.note(&Note::OpFailed { func: "AllReduce", kind: "Timeout" });

    let text = render(&e);
    check_exposition(&text).map_err(|m| format!("{m}\n{text}")).expect("valid exposition");
    let c = r#"comm="00000000feedbeef",comm_name="world \"A\"\n",rank="2""#;
    let l = format!("{c},op=\"AllReduce\",algo=\"RING\",proto=\"SIMPLE\",dtype=\"ncclFloat32\",size_class=\"0-4KiB\"");
    let v = |name: &str, extra: &str| value(&text, &format!("{name}{{{l}{extra}}}"));
    assert_eq!(v("occl_collective_operations_total", ""), Some(1.0), "{text}");
    assert_eq!(v("occl_collective_bytes_total", ""), Some(4000.0));
    assert_eq!(v("occl_collective_bus_bytes_total", ""), Some(6000.0), "2(n-1)/n of 4000 with n=4");
    assert_eq!(v("occl_collective_duration_seconds_count", ""), Some(1.0), "observed at its stop");
    let dur = v("occl_collective_duration_seconds_sum", "").expect("sum");
    assert!(dur >= 0.003, "{dur}");
    assert_eq!(v("occl_collective_message_size_bytes_bucket", ",le=\"1024\""), Some(0.0));
    assert_eq!(v("occl_collective_message_size_bytes_bucket", ",le=\"4096\""), Some(1.0));
    assert_eq!(v("occl_collective_duration_seconds_bucket", ",le=\"0.000001\""), Some(0.0));
    let d = |name: &str, extra: &str| value(&text, &format!("{name}{{{c}{extra}}}"));
    assert_eq!(d("occl_proxy_steps_total", ",direction=\"send\""), Some(1.0));
    assert_eq!(d("occl_proxy_steps_total", ",direction=\"recv\""), Some(1.0));
    assert_eq!(d("occl_proxy_step_bytes_total", ",direction=\"recv\""), Some(4000.0), "RecvFlushWait only");
    let gpu = d("occl_proxy_step_wait_seconds_total", ",state=\"SendGPUWait\"").expect("wait");
    assert!(gpu >= 0.003 && gpu <= dur, "{gpu} of {dur}");
    assert_eq!(d("occl_transport_bytes_total", ",transport=\"shm\",direction=\"send\""), Some(4000.0));
    assert_eq!(d("occl_operation_errors_total", ",op=\"AllReduce\",kind=\"Timeout\""), Some(1.0));
    assert_eq!(d("occl_communicator_info", ",nranks=\"4\",nnodes=\"1\""), Some(1.0));
    assert_eq!(value(&text, "occl_metrics_dropped_total{reason=\"series_limit\"}"), Some(0.0));
}

#[test]
fn under_nccl_order_an_operation_ends_with_its_last_child() {
    let e = Arc::new(Exporter::new());
    let t = Telemetry::new(vec![e.clone()]);
    let s = t.comm_sink(meta(None, 0));
    // NCCL: the Coll stops at enqueue; its ProxyOp (and a KernelCh) start and stop afterwards.
    s.start(id(1), None, &coll("AllGather", 256));
    s.stop(id(1));
    s.start(id(2), Some(id(1)), &proxy_op(false));
    s.start(id(3), Some(id(1)), &EventDescr::KernelCh { channel_id: 0, p_timer: 0 });
    std::thread::sleep(Duration::from_millis(5));
    s.stop(id(2));
    s.stop(id(3));
    let l = r#"comm="00000000feedbeef",rank="0",op="AllGather",algo="RING",proto="SIMPLE",dtype="ncclFloat32",size_class="0-4KiB""#;
    let text = render(&e);
    assert_eq!(value(&text, &format!("occl_collective_operations_total{{{l}}}")), Some(1.0), "{text}");
    assert_eq!(value(&text, &format!("occl_collective_duration_seconds_count{{{l}}}")), Some(0.0), "parked");
    assert_eq!(value(&text, &format!("occl_collective_bus_bytes_total{{{l}}}")), Some(0.0));
    s.finalize();
    let text = render(&e);
    check_exposition(&text).expect("valid");
    assert_eq!(value(&text, &format!("occl_collective_duration_seconds_count{{{l}}}")), Some(1.0), "{text}");
    let sum = value(&text, &format!("occl_collective_duration_seconds_sum{{{l}}}")).expect("sum");
    assert!(sum >= 0.005, "the children's 5 ms count: {sum}");
    assert_eq!(value(&text, &format!("occl_collective_bus_bytes_total{{{l}}}")), Some(3072.0), "1024 B x (n-1)");
}

#[test]
fn a_parked_operation_idle_for_a_second_is_observed_at_a_scrape_and_p2p_is_its_own_family() {
    let e = Arc::new(Exporter::new());
    let t = Telemetry::new(vec![e.clone()]);
    let s = t.comm_sink(meta(None, 1));
    s.start(
        id(1),
        None,
        &EventDescr::P2p {
            rank: 1,
            func: "Send",
            buff: 0,
            datatype: "ncclInt8",
            count: 100,
            peer: 0,
            n_channels: 1,
            parent_group: None,
        },
    );
    s.stop(id(1));
    let l = r#"comm="00000000feedbeef",rank="1",op="Send",dtype="ncclInt8",size_class="0-4KiB""#;
    assert_eq!(value(&render(&e), &format!("occl_p2p_duration_seconds_count{{{l}}}")), Some(0.0));
    std::thread::sleep(Duration::from_millis(1100));
    let text = render(&e);
    check_exposition(&text).expect("valid");
    assert_eq!(value(&text, &format!("occl_p2p_duration_seconds_count{{{l}}}")), Some(1.0), "{text}");
    assert_eq!(value(&text, &format!("occl_p2p_bytes_total{{{l}}}")), Some(100.0));
    assert!(!text.contains("occl_collective_operations_total"), "no collective, no collective family");
}

#[test]
fn each_size_class_is_its_own_series() {
    let e = Arc::new(Exporter::new());
    let t = Telemetry::new(vec![e.clone()]);
    let s = t.comm_sink(meta(None, 0));
    // f32 counts: 1023 elements = 4092 B, 1024 = 4 KiB, 2^18 = 1 MiB (twice).
    for (i, count) in [1023usize, 1024, 1 << 18, 1 << 18].into_iter().enumerate() {
        let i = i as u64 + 1;
        s.start(id(i), None, &coll("AllReduce", count));
        s.stop(id(i));
    }
    let text = render(&e);
    check_exposition(&text).expect("valid");
    let l = r#"comm="00000000feedbeef",rank="0",op="AllReduce",algo="RING",proto="SIMPLE",dtype="ncclFloat32""#;
    let ops = |class: &str| value(&text, &format!("occl_collective_operations_total{{{l},size_class=\"{class}\"}}"));
    assert_eq!(ops("0-4KiB"), Some(1.0), "{text}");
    assert_eq!(ops("4KiB-64KiB"), Some(1.0));
    assert_eq!(ops("1MiB-16MiB"), Some(2.0));
    assert_eq!(ops("64KiB-1MiB"), None, "no series for a class nothing fell in");
    assert_eq!(text.matches("occl_collective_bytes_total{").count(), 3, "{text}");
}

#[test]
fn series_beyond_the_limit_are_counted_as_dropped_not_made() {
    let e = Arc::new(Exporter::new());
    let t = Telemetry::new(vec![e.clone()]);
    let s = t.comm_sink(meta(None, 0));
    let names: Vec<String> = (0..comm::MAX_SERIES + 3).map(|i| format!("Op{i}")).collect();
    for (i, n) in names.iter().enumerate() {
        let i = i as u64 + 1;
        s.start(id(i), None, &coll(n, 1));
        s.stop(id(i));
    }
    let text = render(&e);
    check_exposition(&text).expect("valid");
    assert_eq!(value(&text, "occl_metrics_dropped_total{reason=\"series_limit\"}"), Some(3.0));
    let series = text.lines().filter(|l| l.starts_with("occl_collective_operations_total{")).count();
    assert_eq!(series, comm::MAX_SERIES);
}

#[test]
fn every_family_is_in_the_docs_table_and_has_help() {
    let docs = include_str!("mod.rs");
    for f in snapshot::families() {
        let kind = f.kind.name();
        assert!(docs.contains(&format!("| `{}` | {kind} |", f.name)), "{} missing from the table", f.name);
        assert!(f.help.len() > 20 && !f.help.contains('\n'), "{}", f.name);
        assert!(f.name.starts_with("occl_"));
        assert_eq!(kind == "counter", f.name.ends_with("_total"), "{}", f.name);
        // The unit is the name's suffix (before `_total`), as OpenMetrics requires.
        let unit = f.unit.name();
        assert_eq!(!unit.is_empty(), f.family_name().ends_with(&format!("_{unit}")), "{}", f.name);
        let suffixed = f.family_name().ends_with("_seconds") || f.family_name().ends_with("_bytes");
        assert_eq!(suffixed, !unit.is_empty(), "{}: a unit suffix without its unit", f.name);
    }
}

#[test]
fn the_switch() {
    let v = |x: &'static str| move |_: &str| Some(x.to_string());
    assert!(enabled(v("1")) && enabled(v("on")) && enabled(v(" true ")));
    assert!(!enabled(v("0")) && !enabled(v("off")) && !enabled(v(" false ")));
    // On by default: unset, empty or unreadable leaves it on.
    assert!(enabled(|_| None) && enabled(v("")) && enabled(v("maybe")));
}

/// The cost of one small collective's span tree (occl's order: 8 spans, 26 events), through the
/// collector to this exporter and to an idle one; run with `--ignored --nocapture`.
#[test]
#[ignore]
fn cost_of_one_span_tree() {
    struct Idle(EventMask);
    impl spans::Exporter for Idle {
        fn name(&self) -> &str {
            "idle"
        }
        fn interest(&self) -> EventMask {
            self.0
        }
        fn span(&self, _: &Span<'_>) {}
    }
    use crate::event::{GroupApiState, ProxyOpState};
    let prom = Arc::new(Exporter::new());
    let interest = spans::Exporter::interest(&*prom);
    for (name, t) in
        [("idle", Telemetry::new(vec![Arc::new(Idle(interest))])), ("prometheus", Telemetry::new(vec![prom.clone()]))]
    {
        let s = t.comm_sink(meta(None, 0));
        let n = 200_000u64;
        let start = std::time::Instant::now();
        let mut next = 1u64;
        let mut new_id = || {
            next += 1;
            id(next)
        };
        for _ in 0..n {
            let g = new_id();
            s.start(g, None, &EventDescr::GroupApi { graph_captured: false, group_depth: 1 });
            s.state(g, &StateArgs::GroupApi { state: GroupApiState::StartApiStop });
            let api = new_id();
            s.start(
                api,
                Some(g),
                &EventDescr::CollApi {
                    func: "AllReduce",
                    count: 2,
                    datatype: "ncclFloat32",
                    root: 0,
                    stream: 0,
                    graph_captured: false,
                },
            );
            s.stop(api);
            s.state(g, &StateArgs::GroupApi { state: GroupApiState::EndApiStart });
            let grp = new_id();
            s.start(grp, None, &EventDescr::Group);
            let c = new_id();
            s.start(c, Some(api), &coll("AllReduce", 2));
            let ops: Vec<EventId> = [true, false]
                .iter()
                .map(|&send| {
                    let o = new_id();
                    s.start(o, Some(c), &proxy_op(send));
                    o
                })
                .collect();
            for (k, &o) in ops.iter().enumerate() {
                s.state(o, &StateArgs::ProxyOp { state: ProxyOpState::InProgress, trans_size: 0, steps: 0 });
                let st = new_id();
                s.start(st, Some(o), &EventDescr::ProxyStep { rank: 0, step: 0 });
                let states = if k == 0 {
                    [ProxyStepState::SendGpuWait, ProxyStepState::SendPeerWait, ProxyStepState::SendWait]
                } else {
                    [ProxyStepState::RecvWait, ProxyStepState::RecvFlushWait, ProxyStepState::RecvGpuWait]
                };
                for x in states {
                    s.state(st, &StateArgs::ProxyStep { state: x, trans_size: 8 });
                }
                s.stop(st);
            }
            for o in ops {
                s.stop(o);
            }
            s.stop(c);
            s.stop(grp);
            s.stop(g);
        }
        let per = start.elapsed().as_nanos() as f64 / n as f64;
        println!("{name}: {per:.0} ns per span tree ({:.0} ns per event)", per / 26.0);
    }
}

#[test]
fn a_gpu_operation_is_timed_by_its_kernel_channels_device_times() {
    let e = Arc::new(Exporter::new());
    let t = Telemetry::new(vec![e.clone()]);
    let s = t.comm_sink(meta(None, 0));
    // The Coll stops at enqueue; its two channels ran 2 ms later for 3 and 4 ms (device times).
    let t0 = crate::spans::unix_nanos();
    s.start_at(id(1), None, &coll("AllGather", 256), t0);
    s.stop_at(id(1), t0 + 10_000);
    let ms = 1_000_000;
    s.start_at(id(2), Some(id(1)), &EventDescr::KernelCh { channel_id: 0, p_timer: 0 }, t0 + 2 * ms);
    s.start_at(id(3), Some(id(1)), &EventDescr::KernelCh { channel_id: 1, p_timer: 0 }, t0 + 2 * ms);
    s.stop_at(id(2), t0 + 5 * ms);
    s.stop_at(id(3), t0 + 6 * ms);
    s.finalize();
    let l = r#"comm="00000000feedbeef",rank="0",op="AllGather",algo="RING",proto="SIMPLE",dtype="ncclFloat32",size_class="0-4KiB""#;
    let text = render(&e);
    assert_eq!(value(&text, &format!("occl_collective_duration_seconds_count{{{l}}}")), Some(1.0), "{text}");
    let sum = value(&text, &format!("occl_collective_duration_seconds_sum{{{l}}}")).expect("sum");
    assert!((sum - 0.006).abs() < 1e-6, "from the Coll's start to the last channel's device stop: {sum}");
}

#[test]
fn a_copy_engine_call_is_timed_by_its_ce_coll_under_the_api_event() {
    let e = Arc::new(Exporter::new());
    let t = Telemetry::new(vec![e.clone()]);
    let s = t.comm_sink(meta(None, 0));
    // occl's order: CollApi, then the Coll under it stops at enqueue; the CeColl, also under
    // the CollApi, ran 2 ms later for 7 ms (device times).
    let t0 = crate::spans::unix_nanos();
    let api = EventDescr::CollApi {
        func: "AllGather",
        count: 256,
        datatype: "ncclFloat32",
        root: 0,
        stream: 0,
        graph_captured: false,
    };
    s.start_at(id(1), None, &api, t0);
    s.stop_at(id(1), t0 + 5_000);
    s.start_at(id(2), Some(id(1)), &coll("AllGather", 256), t0 + 5_000);
    s.stop_at(id(2), t0 + 10_000);
    let ms = 1_000_000;
    let ce = crate::test_descr::ce_coll("AllGather", 256, 0);
    s.start_at(id(3), Some(id(1)), &ce, t0 + 2 * ms);
    s.stop_at(id(3), t0 + 9 * ms);
    s.finalize();
    let l = r#"comm="00000000feedbeef",rank="0",op="AllGather",algo="RING",proto="SIMPLE",dtype="ncclFloat32",size_class="0-4KiB""#;
    let text = render(&e);
    assert_eq!(value(&text, &format!("occl_collective_duration_seconds_count{{{l}}}")), Some(1.0), "{text}");
    let sum = value(&text, &format!("occl_collective_duration_seconds_sum{{{l}}}")).expect("sum");
    assert!((sum - 0.008995).abs() < 1e-6, "from the Coll's start to the call's device end: {sum}");
}

/// The direct route (the core bumping a rank's series) renders exactly what the span route
/// renders for the same operations: series, labels and values. A direct rank's spans are
/// declined, and a rank has one direct route at a time.
#[test]
fn the_direct_route_renders_what_the_span_route_renders() {
    let (by_spans, direct) = (Exporter::new(), Exporter::new());
    let m = Arc::new(meta(Some("tp"), 1));
    spans::Exporter::comm_init(&by_spans, &m);
    assert!(spans::Exporter::takes(&direct, &m));
    let mut r = direct.rank(&m).expect("room");
    assert!(!spans::Exporter::takes(&direct, &m), "a direct rank's spans are declined");
    assert!(direct.rank(&m).is_none(), "one direct route per rank");
    // (op number, op, algo, count of f32, duration): algorithms alternating within one size
    // class, and every size class.
    let ops: [(u8, &'static str, &'static str, usize, u64); 9] = [
        (2, "AllReduce", "RING", 2, 700),
        (2, "AllReduce", "TREE", 3, 1_800),
        (2, "AllReduce", "RING", 2, 2_600),
        (2, "AllReduce", "RING", 5_000, 40_000),
        (2, "AllReduce", "RING", 300_000, 900_000),
        (2, "AllReduce", "RING", 80_000_000, 3_000_000_000),
        (3, "AllGather", "RING", 10, 1_000),
        (4, "ReduceScatter", "RING", 10, 1_000),
        (1, "Broadcast", "TREE", 100, 20_000_000),
    ];
    for (n, op, algo, count, dur) in ops {
        let bytes = count as u64 * 4;
        let descr = coll_by(op, algo, count);
        // Waits on peers: a free slot on the send side, data on the receive side (none for
        // some operations).
        let (peer_wait, data_wait) = if count % 2 == 0 { (dur / 10, dur / 5) } else { (0, 0) };
        let mut wait_ns = [0; 6];
        wait_ns[StepTotals::index(ProxyStepState::SendPeerWait)] = peer_wait;
        wait_ns[StepTotals::index(ProxyStepState::RecvWait)] = data_wait;
        let steps = [
            StepTotals { send: true, steps: 2, bytes, wait_ns: [0, peer_wait, 0, 0, 0, 0] },
            StepTotals { steps: 3, bytes, wait_ns: [0, 0, 0, data_wait, 0, 0], ..Default::default() },
        ];
        let moved = [("shm", true, bytes), ("shm", false, bytes)];
        let t = OpTotals { descr, start_ns: 1_000, end_ns: 1_000 + dur, steps, transport_bytes: &moved };
        spans::Exporter::op_totals(&by_spans, &m, &t);
        let labels = || OpLabels { p2p: false, op, algo, proto: "SIMPLE", dtype: "ncclFloat32" };
        r.op(OpSlot { op: n, dtype: 7, choice: u8::from(algo == "TREE") }, labels, bytes, dur);
        r.moved("shm", &Moved { steps: [2, 3], bytes: [bytes, bytes] });
        if wait_ns != [0; 6] {
            r.waited(&wait_ns);
        }
    }
    // Point-to-point, and a datatype number beyond the slot array (counted the slow way).
    for (dtype, n) in [("ncclFloat32", 7u8), ("ncclInt8", 200)] {
        let descr = EventDescr::P2p {
            rank: 1,
            func: "Send",
            buff: 0,
            datatype: dtype,
            count: 300,
            peer: 0,
            n_channels: 1,
            parent_group: None,
        };
        let bytes = 300 * elem_size(dtype);
        let t = OpTotals { descr, start_ns: 5, end_ns: 905, steps: Default::default(), transport_bytes: &[] };
        spans::Exporter::op_totals(&by_spans, &m, &t);
        let labels = || OpLabels { p2p: true, op: "Send", algo: "x", proto: "y", dtype };
        r.op(OpSlot { op: 6, dtype: n, choice: 0 }, labels, bytes, 900);
    }
    spans::Exporter::note(&by_spans, &m, &Note::OpFailed { func: "AllReduce", kind: "InvalidUsage" });
    r.failed("AllReduce", "InvalidUsage");
    let (a, b) = (render(&by_spans), render(&direct));
    let only = |x: &str, y: &str| x.lines().filter(|l| !y.lines().any(|m| m == *l)).collect::<Vec<_>>().join("\n");
    assert!(a == b, "span route only:\n{}\ndirect route only:\n{}", only(&a, &b), only(&b, &a));
    check_exposition(&b).expect("valid exposition");
    assert!(b.contains("size_class=\"256MiB+\""), "{b}");
    let waited = |state: &str| {
        b.lines()
            .filter(|l| {
                l.starts_with("occl_proxy_step_wait_seconds_total{") && l.contains(&format!("state=\"{state}\""))
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>()
    };
    assert!(waited("RecvWait") > 0.6 && waited("SendPeerWait") > 0.3, "{b}");
    // Dropped, the rank goes back to the span route with its counts.
    drop(r);
    assert!(spans::Exporter::takes(&direct, &m));
    assert_eq!(render(&direct), b);
}

/// The cost of the direct route for one small operation (an 8 B all-reduce's series and its two
/// steps); run with `--ignored --nocapture`.
#[test]
#[ignore]
fn cost_of_one_direct_operation() {
    let e = Exporter::new();
    let mut r = e.rank(&meta(None, 0)).expect("room");
    let labels = || OpLabels { p2p: false, op: "AllReduce", algo: "ONE_SHOT", proto: "LL", dtype: "ncclFloat32" };
    let moved = Moved { steps: [1, 1], bytes: [8, 8] };
    let n = 20_000_000u64;
    let t = std::time::Instant::now();
    for i in 0..n {
        r.op(OpSlot { op: 2, dtype: 7, choice: 9 }, labels, std::hint::black_box(8), 250 + (i & 63));
        r.moved("shm", std::hint::black_box(&moved));
    }
    let ns = t.elapsed().as_nanos() as f64 / n as f64;
    println!("direct route: {ns:.1} ns per operation");
    assert!(render(&e).contains(&format!(
        "op=\"AllReduce\",algo=\"ONE_SHOT\",proto=\"LL\",dtype=\"ncclFloat32\",size_class=\"0-4KiB\"}} {n}"
    )));
}
