use super::*;
use crate::event::{EventDescr, EventId, ProxyOpState, ProxyStepState, StateArgs};
use crate::sink::Sink;
use crate::spans::{CommMeta, Exporter, Telemetry};
use serde_json::Value;
use std::num::NonZeroU64;
use std::path::{Path, PathBuf};
use std::sync::Arc;

fn id(n: u64) -> EventId {
    EventId(NonZeroU64::new(n).expect("non-zero"))
}

/// Held by the test that writes every exporter of the process (`flush`) and by the one that
/// must be the only writer of its own exporter's files while it plants links at their names.
static WRITES_EVERY_EXPORTER: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn scratch(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("occl-trace-unit-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn meta(hash: u64, rank: i32, nranks: i32) -> CommMeta {
    CommMeta { name: None, hash, rank, nranks, n_nodes: 1 }
}

fn coll_api(func: &str, count: usize) -> EventDescr<'_> {
    EventDescr::CollApi { func, count, datatype: "ncclFloat32", root: 0, stream: 0, graph_captured: false }
}

fn coll(func: &str, count: usize, seq: u64) -> EventDescr<'_> {
    EventDescr::Coll {
        rank: 0,
        seq_number: seq,
        func,
        send_buff: 0,
        recv_buff: 0,
        count,
        root: 0,
        datatype: "ncclFloat32",
        n_channels: 1,
        n_warps: 0,
        algo: "RING",
        proto: "SIMPLE",
        parent_group: None,
    }
}

fn proxy_op(send: bool) -> EventDescr<'static> {
    EventDescr::ProxyOp { rank: 0, pid: 1, channel_id: 0, peer: 1, n_steps: 1, chunk_size: 64, is_send: send }
}

fn read(path: &Path) -> (String, Value) {
    let bytes = std::fs::read(path).expect("read trace");
    let text = if path.extension().is_some_and(|e| e == "gz") {
        let mut s = String::new();
        std::io::Read::read_to_string(&mut flate2::read::GzDecoder::new(&bytes[..]), &mut s).expect("gunzip");
        s
    } else {
        String::from_utf8(bytes).expect("utf-8")
    };
    let v = serde_json::from_str(&text).expect("valid JSON");
    (text, v)
}

fn rows<'a>(v: &'a Value, cat: &str) -> Vec<&'a Value> {
    v["traceEvents"].as_array().expect("traceEvents").iter().filter(|e| e["cat"] == cat).collect()
}

/// An occl-shaped operation: CollApi stops before the Coll starts, ProxyOps run inside the Coll.
fn occl_op(s: &dyn Sink, base: u64, func: &str, count: usize) {
    s.start(id(base), None, &EventDescr::GroupApi { graph_captured: false, group_depth: 1 });
    s.start(id(base + 1), Some(id(base)), &coll_api(func, count));
    s.stop(id(base + 1));
    s.start(id(base + 2), Some(id(base + 1)), &coll(func, count, base));
    s.start(id(base + 3), Some(id(base + 2)), &proxy_op(true));
    s.state(id(base + 3), &StateArgs::ProxyOp { state: ProxyOpState::InProgress, trans_size: 0, steps: 0 });
    s.start(id(base + 4), Some(id(base + 3)), &EventDescr::ProxyStep { rank: 0, step: 0 });
    for st in [ProxyStepState::SendGpuWait, ProxyStepState::SendPeerWait, ProxyStepState::SendWait] {
        s.state(id(base + 4), &StateArgs::ProxyStep { state: st, trans_size: 64 });
    }
    s.stop(id(base + 4));
    s.stop(id(base + 3));
    s.stop(id(base + 2));
    s.stop(id(base));
}

fn trace_files(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("dir")
        .map(|e| e.expect("entry").path())
        .filter(|p| !p.file_name().is_some_and(|n| n.to_string_lossy().starts_with('.')))
        .collect();
    v.sort();
    v
}

#[test]
fn a_rank_file_is_what_hta_needs() {
    let dir = scratch("shape");
    let cfg = TraceConfig { proxy: ProxyDetail::Steps, ..TraceConfig::new(&dir) };
    let ex = Arc::new(TraceExporter::new(cfg));
    let t = Telemetry::new(vec![ex.clone()]);
    let world = t.comm_sink(meta(0xaa, 2, 4));
    let sub = t.comm_sink(CommMeta { name: Some("tp".into()), ..meta(0xbb, 1, 2) });
    occl_op(&*world, 10, "AllReduce", 256);
    occl_op(&*sub, 10, "AllGather", 8);
    world.finalize();
    let files = trace_files(&dir);
    assert_eq!(files.len(), 1, "one file per rank: {files:?}");
    let name = files[0].file_name().expect("name").to_string_lossy().into_owned();
    assert!(
        name.starts_with("occl-trace-rank2-") && name.ends_with(&format!("-{}.json", std::process::id())),
        "{name}"
    );
    let (text, v) = read(&files[0]);

    // HTA's rank regex needs whitespace after the colon, on the first "rank" of the file, and
    // traceEvents comes last.
    let first = text.find("\"rank\":").expect("a rank");
    assert!(text[first..].starts_with("\"rank\": 2,"), "{}", &text[first..first + 20]);
    assert!(text.find("\"distributedInfo\"") < Some(first));
    assert!(text.rfind("\"traceEvents\"") > text.rfind("\"occl\""));
    let di = &v["distributedInfo"];
    assert_eq!(
        (di["rank"].as_i64(), di["world_size"].as_i64(), di["backend"].as_str()),
        (Some(2), Some(4), Some("occl"))
    );
    let pgs = di["pg_config"].as_array().expect("pg_config");
    assert_eq!(pgs.len(), 2);
    assert_eq!(pgs[0]["ranks"], serde_json::json!([0, 1, 2, 3]));
    assert_eq!((pgs[1]["pg_desc"].as_str(), pgs[1]["pg_size"].as_i64()), (Some("tp"), Some(2)));
    assert!(pgs[1].get("ranks").is_none(), "a sub-communicator's global ranks are unknown");

    let kernels = rows(&v, "kernel");
    let calls = rows(&v, "cuda_runtime");
    assert_eq!((kernels.len(), calls.len()), (2, 2));
    let k = kernels.iter().find(|k| k["args"]["Collective name"] == "allreduce").expect("all-reduce row");
    assert_eq!(k["name"], "ncclKernel_AllReduce_RING_SIMPLE_f32");
    let a = &k["args"];
    assert!(a["stream"].as_i64().expect("stream") > 0, "HTA takes stream 0 for a CPU op");
    assert_eq!(k["tid"], a["stream"]);
    assert_eq!(
        (a["In msg nelems"].as_i64(), a["Out msg nelems"].as_i64(), a["Group size"].as_i64()),
        (Some(256), Some(256), Some(4))
    );
    assert_eq!((a["dtype"].as_str(), a["Process Group Name"].as_str()), (Some("Float"), Some("00000000000000aa")));
    assert_eq!((a["Process Group Ranks"].as_str(), a["In split size"].as_str()), (Some("[0, 1, 2, 3]"), Some("[]")));
    let g = kernels.iter().find(|k| k["args"]["Collective name"] == "all_gather").expect("all-gather row");
    assert_eq!((g["args"]["In msg nelems"].as_i64(), g["args"]["Out msg nelems"].as_i64()), (Some(8), Some(16)));
    assert_ne!(g["args"]["stream"], a["stream"], "a stream per communicator");
    assert!(g["args"].get("Process Group Ranks").is_none());

    // Each kernel has exactly one call row with its correlation, on a CPU thread (no stream),
    // starting before it.
    for k in &kernels {
        let c = &k["args"]["correlation"];
        let call: Vec<_> = calls.iter().filter(|r| &r["args"]["correlation"] == c).collect();
        assert_eq!(call.len(), 1, "{k}");
        assert!(call[0]["args"].get("stream").is_none());
        assert!(call[0]["ts"].as_f64() <= k["ts"].as_f64());
        assert_ne!(call[0]["pid"], k["pid"]);
    }
    assert_eq!(calls.iter().filter(|c| c["name"] == "ncclAllReduce").count(), 1);

    // Proxy rows: CPU rows HTA ignores, one lane per peer and direction.
    let ops = rows(&v, "occl_proxy");
    let steps = rows(&v, "occl_proxy_step");
    assert_eq!((ops.len(), steps.len()), (2, 2));
    assert!(ops.iter().all(|o| o["args"].get("stream").is_none() && o["args"].get("correlation").is_none()));
    assert_eq!(ops[0]["args"]["states"].as_str().map(|s| s.starts_with("InProgress +")), Some(true));
    let st = steps[0]["args"]["states"].as_str().expect("states");
    assert!(st.starts_with("SendGPUWait +") && st.contains("SendPeerWait +") && st.contains("SendWait +"), "{st}");
    assert_eq!((steps[0]["name"].as_str(), steps[0]["args"]["size"].as_i64()), (Some("SendStep"), Some(64)));
    assert_eq!(v["occl"]["events_dropped"].as_i64(), Some(0));
    // Flow arrows call → kernel for Perfetto, two per collective.
    let flows = v["traceEvents"].as_array().expect("events").iter().filter(|e| e["cat"] == "ac2g").count();
    assert_eq!(flows, 4);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn nccl_order_stretches_the_kernel_over_its_proxy_ops_and_a_missing_call_is_made_up() {
    let dir = scratch("nccl");
    let ex = Arc::new(TraceExporter::new(TraceConfig::new(&dir)));
    let t = Telemetry::new(vec![ex.clone()]);
    let s = t.comm_sink(meta(0xcc, 0, 2));
    // v5 order: the Coll stops at enqueue; its ProxyOps start later.
    s.start(id(1), None, &coll_api("AllReduce", 4));
    s.stop(id(1));
    s.start(id(2), Some(id(1)), &coll("AllReduce", 4, 1));
    s.stop(id(2));
    std::thread::sleep(std::time::Duration::from_millis(2));
    s.start(id(3), Some(id(2)), &proxy_op(true));
    std::thread::sleep(std::time::Duration::from_millis(2));
    s.stop(id(3));
    // v1–v4: a Coll without an API call.
    s.start(id(4), None, &coll("Broadcast", 4, 1));
    s.stop(id(4));
    ex.flush();
    let (_, v) = read(&trace_files(&dir)[0]);
    let kernels = rows(&v, "kernel");
    let calls = rows(&v, "cuda_runtime");
    let op = rows(&v, "occl_proxy")[0].clone();
    let ar = kernels.iter().find(|k| k["args"]["Collective name"] == "allreduce").expect("all-reduce");
    assert_eq!(ar["ts"], op["ts"], "starts with its first ProxyOp");
    assert_eq!(ar["dur"], op["dur"], "ends with its last");
    assert!(ar["dur"].as_f64().expect("dur") >= 2000.0);
    let bc = kernels.iter().find(|k| k["args"]["Collective name"] == "broadcast").expect("broadcast");
    let made = calls.iter().find(|c| c["args"]["correlation"] == bc["args"]["correlation"]).expect("a call row");
    assert_eq!(made["args"]["synthesized"], true);
    assert_eq!(made["name"], "ncclBroadcast");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bounded_with_drops_in_the_metadata_gzip_and_one_file_per_rank_of_a_process() {
    let dir = scratch("bound");
    let cfg = TraceConfig { gzip: true, max_events: 5, proxy: ProxyDetail::None, ..TraceConfig::new(&dir) };
    let ex = Arc::new(TraceExporter::new(cfg));
    assert!(!ex.interest().contains(crate::event::EventType::ProxyOp));
    let t = Telemetry::new(vec![ex.clone()]);
    // Two ranks of one communicator in this process (threads mode): two files.
    let r0 = t.comm_sink(meta(0xdd, 0, 2));
    let r1 = t.comm_sink(meta(0xdd, 1, 2));
    for i in 0..4 {
        occl_op(&*r0, 100 + 10 * i, "AllReduce", 1);
    }
    occl_op(&*r1, 10, "AllReduce", 1);
    let paths: Vec<PathBuf> = ex.write_all().into_iter().map(|r| r.expect("written")).collect();
    assert_eq!(paths.len(), 2);
    let (_, v0) = read(&paths[0]);
    let (_, v1) = read(&paths[1]);
    assert!(paths[0].to_string_lossy().ends_with(".json.gz"));
    assert_eq!((v0["distributedInfo"]["rank"].as_i64(), v1["distributedInfo"]["rank"].as_i64()), (Some(0), Some(1)));
    // 4 operations × 2 kept events (call and collective); 5 fit.
    assert_eq!((v0["occl"]["events_recorded"].as_i64(), v0["occl"]["events_dropped"].as_i64()), (Some(5), Some(3)));
    assert_eq!(v0["occl"]["max_events"].as_i64(), Some(5));
    assert_eq!(v1["occl"]["events_dropped"].as_i64(), Some(0));
    assert!(rows(&v0, "occl_proxy").is_empty());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn steps_become_profiler_step_rows_and_flush_writes_every_exporter() {
    let dir = scratch("steps");
    let ex = Arc::new(TraceExporter::new(TraceConfig::new(&dir)));
    let t = Telemetry::new(vec![ex.clone()]);
    let s = t.comm_sink(meta(0xee, 0, 1));
    // Steps of 50 µs, each holding one call.
    let last = || std::thread::sleep(std::time::Duration::from_micros(50));
    step_begin(7001);
    occl_op(&*s, 10, "AllReduce", 1);
    last();
    step_begin(7002); // ends 7001
    occl_op(&*s, 20, "AllReduce", 1);
    last();
    step_end();
    {
        let g = profiler_step(7003);
        assert_eq!(g.number(), 7003);
        step_begin(7004); // a later step closes 7003; the guard's drop leaves 7004 open
    }
    step_end();
    let flushed = {
        let _only = WRITES_EVERY_EXPORTER.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        flush()
    };
    let written: Vec<PathBuf> = flushed.into_iter().filter_map(Result::ok).filter(|p| p.starts_with(&dir)).collect();
    assert_eq!(written.len(), 1);
    let (_, v) = read(&written[0]);
    let ann = rows(&v, "user_annotation");
    let step = |n: u64| ann.iter().find(|r| r["name"] == format!("ProfilerStep#{n}").as_str()).copied();
    let (s1, s2) = (step(7001).expect("step 1"), step(7002).expect("step 2"));
    assert!(step(7003).is_some() && step(7004).is_some());
    let end = |r: &Value| r["ts"].as_f64().unwrap_or(0.0) + r["dur"].as_f64().unwrap_or(0.0);
    // Step 1 ends where step 2 begins, to the microsecond the rows are written in.
    assert!((end(s1) - s2["ts"].as_f64().unwrap_or(0.0)).abs() < 1.0, "{s1} then {s2}");
    // Each call lies inside its step on the same thread (HTA assigns iterations by that).
    let calls = rows(&v, "cuda_runtime");
    assert_eq!(calls.len(), 2);
    for (call, st) in calls.iter().zip([s1, s2]) {
        let ts = call["ts"].as_f64().unwrap_or(0.0);
        assert!(st["ts"].as_f64().unwrap_or(f64::MAX) <= ts && ts < end(st), "{call} in {st}");
        assert_eq!(call["tid"], st["tid"]);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn config_from_variables() {
    let env = |pairs: &'static [(&'static str, &'static str)]| {
        move |k: &str| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string())
    };
    assert_eq!(TraceConfig::from_lookup(env(&[])), Ok(None));
    assert_eq!(TraceConfig::from_lookup(env(&[(DIR_ENV, " ")])), Ok(None));
    let c = TraceConfig::from_lookup(env(&[
        (DIR_ENV, "/tmp/t"),
        (GZIP_ENV, "1"),
        (MAX_EVENTS_ENV, "10"),
        (PROXY_ENV, "steps"),
    ]))
    .expect("valid")
    .expect("on");
    assert_eq!(c, TraceConfig { dir: "/tmp/t".into(), gzip: true, max_events: 10, proxy: ProxyDetail::Steps });
    let d = TraceConfig::from_lookup(env(&[(DIR_ENV, "/tmp/t")])).expect("valid").expect("on");
    assert_eq!((d.gzip, d.max_events, d.proxy), (false, DEFAULT_MAX_EVENTS, ProxyDetail::Ops));
    for (var, bad) in [
        (GZIP_ENV, "maybe"),
        (MAX_EVENTS_ENV, "0"),
        (MAX_EVENTS_ENV, "-3"),
        // Once a whole-file table of 2^64 / 4096 chunk slots: an allocation failure, an abort.
        (MAX_EVENTS_ENV, "18446744073709551615"),
        (MAX_EVENTS_ENV, "10000001"),
        (MAX_EVENTS_ENV, "1e9"),
        (MAX_EVENTS_ENV, "NaN"),
        (PROXY_ENV, "all"),
    ] {
        let e = TraceConfig::from_lookup(|k| match k {
            DIR_ENV => Some("/tmp/t".into()),
            k if k == var => Some(bad.into()),
            _ => None,
        })
        .expect_err("invalid");
        assert_eq!(e.var, var);
        assert!(e.to_string().contains(bad), "{e}");
    }
}

#[test]
fn kernel_channels_at_device_times_place_the_kernel_row() {
    let dir = scratch("kernelch");
    let ex = Arc::new(TraceExporter::new(TraceConfig::new(&dir)));
    let t = Telemetry::new(vec![ex.clone()]);
    let s = t.comm_sink(meta(0xcc, 0, 2));
    // NCCL's order for a GPU collective: the Coll stops at enqueue, its KernelCh events are
    // reported later with the device's times.
    s.start(id(1), None, &coll_api("AllReduce", 2));
    s.stop(id(1));
    s.start(id(2), Some(id(1)), &coll("AllReduce", 2, 0));
    s.stop(id(2));
    let base = crate::spans::unix_nanos() + 1_000_000;
    for (ch, a, b) in [(0u8, 1_500u64, 9_000u64), (1, 1_234, 8_765)] {
        let k = id(3 + u64::from(ch));
        s.start_at(k, Some(id(2)), &EventDescr::KernelCh { channel_id: ch, p_timer: a }, base + a);
        s.state(k, &StateArgs::KernelChStop { p_timer: b });
        s.stop_at(k, base + b);
    }
    s.finalize();
    let files = trace_files(&dir);
    assert_eq!(files.len(), 1, "{files:?}");
    let (_, v) = read(&files[0]);
    let kernels = rows(&v, "kernel");
    assert_eq!(kernels.len(), 1);
    let k = kernels[0];
    let ts = k["ts"].as_f64().expect("ts");
    let dur = k["dur"].as_f64().expect("dur");
    let want = (base + 1_234) as f64 / 1000.0;
    assert!((ts - want).abs() < 0.01, "the row starts at the first channel's device start: {ts} vs {want}");
    assert!((dur - 7.766).abs() < 0.01, "and ends at the last channel's stop: {dur}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_copy_engine_call_places_its_kernel_row_at_its_device_times() {
    let dir = scratch("cecoll");
    let ex = Arc::new(TraceExporter::new(TraceConfig::new(&dir)));
    let t = Telemetry::new(vec![ex.clone()]);
    let s = t.comm_sink(meta(0xce, 0, 2));
    // occl's order for a call on the copy engines: CollApi and Coll at enqueue, then the
    // CeColl, a child of the CollApi, at the device's times once the call has run.
    s.start(id(1), None, &coll_api("AllGather", 64));
    s.stop(id(1));
    s.start(id(2), Some(id(1)), &coll("AllGather", 64, 0));
    s.stop(id(2));
    let base = crate::spans::unix_nanos() + 1_000_000;
    let ce = crate::test_descr::ce_coll("AllGather", 64, 0);
    s.start_at(id(3), Some(id(1)), &ce, base + 2_000);
    s.stop_at(id(3), base + 52_500);
    s.finalize();
    let files = trace_files(&dir);
    let (_, v) = read(&files[0]);
    let kernels = rows(&v, "kernel");
    assert_eq!(kernels.len(), 1, "the CeColl widens its operation's row and has none of its own");
    let (ts, dur) = (kernels[0]["ts"].as_f64().expect("ts"), kernels[0]["dur"].as_f64().expect("dur"));
    let want = (base + 2_000) as f64 / 1000.0;
    assert!((ts - want).abs() < 0.01, "the row starts at the call's device start: {ts} vs {want}");
    assert!((dur - 50.5).abs() < 0.01, "and ends at its device end: {dur}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Symlinks planted by another user at the trace file's temporary names (pid and a counter) and
/// at its final name: a flush follows none of them and leaves an owner-only file.
#[test]
fn a_flush_follows_no_symlink_planted_in_the_trace_dir() {
    use std::os::unix::fs::{symlink, PermissionsExt};
    let _only = WRITES_EVERY_EXPORTER.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let dir = scratch("symlink");
    let ex = Arc::new(TraceExporter::new(TraceConfig::new(&dir)));
    let t = Telemetry::new(vec![ex.clone()]);
    let world = t.comm_sink(meta(0x5e1f, 3, 4));
    occl_op(&*world, 10, "AllReduce", 256);
    let first = ex.write_all().remove(0).expect("first write");
    let name = first.file_name().expect("name").to_string_lossy().into_owned();
    std::fs::remove_file(&first).expect("remove");
    let (victim, victim_final) = (dir.join("victim"), dir.join("victim-final"));
    std::fs::write(&victim, "root-owned").expect("victim");
    std::fs::write(&victim_final, "root-owned too").expect("victim");
    let pid = std::process::id();
    for n in 0..1024 {
        symlink(&victim, dir.join(format!(".{name}.{pid}.{n}.tmp"))).expect("plant");
    }
    symlink(&victim_final, &first).expect("plant final");
    let path = ex.write_all().remove(0).expect("second write");
    assert_eq!(std::fs::read_to_string(&victim).expect("victim"), "root-owned", "wrote through a planted symlink");
    assert_eq!(std::fs::read_to_string(&victim_final).expect("victim"), "root-owned too");
    let meta = std::fs::symlink_metadata(&path).expect("trace file");
    assert!(meta.file_type().is_file(), "the trace is a file of its own, not a link");
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    let (_, v) = read(&path);
    assert_eq!(v["distributedInfo"]["rank"], 3);
    world.finalize();
    let _ = std::fs::remove_dir_all(&dir);
}
