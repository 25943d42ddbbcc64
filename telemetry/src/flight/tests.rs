use super::*;
use serde_json::Value;
use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn comm(rank: u32) -> FlightComm {
    FlightComm {
        comm_hash: 0x0123_4567_89ab_cdef,
        rank,
        nranks: 8,
        pid: std::process::id(),
        host: "node-a".into(),
        comm_name: Some("dp".into()),
    }
}

fn op(seq: u64) -> OpInfo {
    OpInfo {
        seq,
        coll_seq: seq,
        op: "AllReduce",
        dtype: "ncclFloat32",
        redop: Some("ncclSum"),
        count: seq * 2,
        in_bytes: seq * 8,
        out_bytes: seq * 8,
        root_or_peer: None,
        algo: "RING",
        proto: "SIMPLE",
    }
}

fn temp_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!(
        "occl-flight-{tag}-{}-{}",
        std::process::id(),
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos()
    ));
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn wrap_around_keeps_the_last_n_in_order() {
    let r = FlightRecorder::new(comm(0), 5);
    for s in 1..=13 {
        let slot = r.enqueue(&op(s), s * 10);
        r.completed(slot, s * 10 + 5);
    }
    let e = r.snapshot();
    assert_eq!(e.iter().map(|e| e.info.seq).collect::<Vec<_>>(), vec![9, 10, 11, 12, 13]);
    assert_eq!(e.iter().map(|e| e.record_id).collect::<Vec<_>>(), vec![8, 9, 10, 11, 12]);
    assert_eq!(r.recorded(), 13);
    assert_eq!(r.capacity(), 5);
    assert!(e.iter().all(|e| e.state == OpState::Completed && e.info == op(e.info.seq)));
    assert_eq!(e[0].t_enqueued_ns, 90);
    assert_eq!(e[0].t_ended_ns, Some(95));
}

#[test]
fn partial_ring_and_empty_ring() {
    let r = FlightRecorder::new(comm(0), 8);
    assert!(r.snapshot().is_empty());
    assert_eq!(r.last_in_flight(), None);
    r.enqueue(&op(1), 1);
    r.enqueue(&op(2), 2);
    assert_eq!(r.snapshot().len(), 2);
}

#[test]
fn state_transitions_and_timestamps() {
    let r = FlightRecorder::new(comm(1), 4);
    let s = r.enqueue(&op(1), 100);
    let e = r.get(s).unwrap();
    assert_eq!((e.state, e.t_started_ns, e.t_ended_ns, e.duration_ns()), (OpState::Enqueued, None, None, None));
    r.started(s, 150);
    let e = r.get(s).unwrap();
    assert_eq!((e.state, e.t_started_ns, e.t_ended_ns), (OpState::Started, Some(150), None));
    r.completed(s, 400);
    let e = r.get(s).unwrap();
    assert_eq!(
        (e.state, e.t_started_ns, e.t_ended_ns, e.duration_ns()),
        (OpState::Completed, Some(150), Some(400), Some(250))
    );
    // States only go forward.
    r.started(s, 999);
    r.failed(s, 999, "late");
    let e = r.get(s).unwrap();
    assert_eq!((e.state, e.t_started_ns, e.t_ended_ns, e.error), (OpState::Completed, Some(150), Some(400), None));
    // Started may be skipped.
    let s2 = r.enqueue(&op(2), 500);
    r.completed(s2, 510);
    let e = r.get(s2).unwrap();
    assert_eq!((e.state, e.t_started_ns, e.duration_ns()), (OpState::Completed, None, None));
}

#[test]
fn failed_keeps_a_bounded_reason() {
    let r = FlightRecorder::new(comm(2), 4);
    let s = r.enqueue(&op(1), 1);
    r.started(s, 2);
    r.failed(s, 3, "peer 5 timed out after 30 s");
    let e = r.get(s).unwrap();
    assert_eq!(e.state, OpState::Failed);
    assert_eq!(e.t_ended_ns, Some(3));
    assert_eq!(e.error.as_deref(), Some("peer 5 timed out after 30 s"));
    r.completed(s, 4);
    assert_eq!(r.get(s).unwrap().state, OpState::Failed);
    assert_eq!(r.snapshot()[0].error.as_deref(), Some("peer 5 timed out after 30 s"));

    // Long reasons are cut at a character boundary.
    let long = "é".repeat(MAX_REASON_BYTES);
    let s = r.enqueue(&op(2), 5);
    r.failed(s, 6, &long);
    let got = r.get(s).unwrap().error.unwrap();
    assert!(got.len() <= MAX_REASON_BYTES && got.len() > MAX_REASON_BYTES - 2);
    assert!(got.chars().all(|c| c == 'é'));

    // The reason table is bounded.
    let r = FlightRecorder::new(comm(2), 4 * MAX_ERRORS);
    for i in 0..(2 * MAX_ERRORS as u64) {
        let s = r.enqueue(&op(i), i);
        r.failed(s, i, &format!("e{i}"));
    }
    let e = r.snapshot();
    assert_eq!(e.iter().filter(|e| e.error.is_some()).count(), MAX_ERRORS);
    assert_eq!(e.last().unwrap().error.as_deref(), Some(format!("e{}", 2 * MAX_ERRORS - 1).as_str()));
}

#[test]
fn stale_slot_updates_are_dropped() {
    let r = FlightRecorder::new(comm(0), 2);
    let old = r.enqueue(&op(1), 1);
    r.enqueue(&op(2), 2);
    r.enqueue(&op(3), 3); // overwrites op 1
    r.completed(old, 4);
    r.failed(old, 4, "x");
    assert_eq!(r.get(old), None);
    assert!(r.snapshot().iter().all(|e| e.state == OpState::Enqueued));
}

#[test]
fn last_in_flight_is_the_oldest_unfinished() {
    let r = FlightRecorder::new(comm(0), 8);
    let a = r.enqueue(&op(1), 1);
    let b = r.enqueue(&op(2), 2);
    let c = r.enqueue(&op(3), 3);
    r.completed(a, 4);
    r.started(c, 5);
    assert_eq!(r.last_in_flight().unwrap().info.seq, 2);
    r.failed(b, 6, "boom");
    let e = r.last_in_flight().unwrap();
    assert_eq!((e.info.seq, e.state, e.t_started_ns), (3, OpState::Started, Some(5)));
    r.completed(c, 7);
    assert_eq!(r.last_in_flight(), None);
}

#[test]
fn root_peer_and_missing_redop_round_trip() {
    let r = FlightRecorder::new(comm(0), 4);
    let mut o = op(1);
    o.op = "Send";
    o.redop = None;
    o.root_or_peer = Some(RootOrPeer::Peer(u32::MAX));
    let s = r.enqueue(&o, 1);
    assert_eq!(r.get(s).unwrap().info, o);
    o.op = "Broadcast";
    o.root_or_peer = Some(RootOrPeer::Root(3));
    let s = r.enqueue(&o, 1);
    assert_eq!(r.get(s).unwrap().info, o);
}

#[test]
fn capacity_zero_is_disabled() {
    let r = FlightRecorder::new(comm(0), 0);
    assert!(!r.is_enabled());
    let s = r.enqueue(&op(1), 1);
    assert_eq!(s, Slot::DISABLED);
    assert_eq!(s.record_id(), None);
    r.started(s, 2);
    r.completed(s, 3);
    r.failed(s, 3, "x");
    assert!(r.snapshot().is_empty());
    assert_eq!(r.last_in_flight(), None);
    assert_eq!(r.recorded(), 0);
    assert!(!live_recorders().iter().any(|l| Arc::ptr_eq(l, &r)));
    let v = r.to_json("test");
    assert_eq!(v["entries"].as_array().unwrap().len(), 0);
    let mut out = Vec::new();
    r.write_json_at(&mut out, "test", 5).unwrap();
    assert_eq!(serde_json::from_slice::<Value>(&out).unwrap(), r.to_json_at("test", 5));
}

#[test]
fn capacity_is_capped() {
    assert_eq!(FlightRecorder::new(comm(0), MAX_CAPACITY + 5).capacity(), MAX_CAPACITY);
}

fn lookup(vars: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<OsString> {
    move |k| vars.iter().find(|(n, _)| *n == k).map(|(_, v)| OsString::from(v))
}

#[test]
fn env_parsing() {
    let c = FlightConfig::from_lookup(lookup(&[])).unwrap();
    assert_eq!(c, FlightConfig { capacity: 2048, dir: None, signal: false });
    assert_eq!(c, FlightConfig::default());
    let c = FlightConfig::from_lookup(lookup(&[(SIZE_ENV, " 16 "), (DIR_ENV, "/tmp/fr")])).unwrap();
    assert_eq!(c, FlightConfig { capacity: 16, dir: Some("/tmp/fr".into()), signal: false });
    let c = FlightConfig::from_lookup(lookup(&[(DIR_ENV, "/tmp/fr"), (SIGNAL_ENV, "sigusr1")])).unwrap();
    assert!(c.signal);
    let e = FlightConfig::from_lookup(lookup(&[(SIGNAL_ENV, "SIGUSR1")])).unwrap_err();
    assert!(e.to_string().contains("OCCL_FLIGHT_RECORDER_DIR"), "SIGUSR1 without a directory: {e}");
    let e = FlightConfig::from_lookup(lookup(&[(DIR_ENV, "/tmp/fr"), (SIGNAL_ENV, "TERM")])).unwrap_err();
    assert_eq!(e.var, SIGNAL_ENV);
    assert_eq!(FlightConfig::from_lookup(lookup(&[(SIZE_ENV, "0")])).unwrap().capacity, 0);
    assert_eq!(FlightConfig::from_lookup(lookup(&[(SIZE_ENV, "1048576")])).unwrap().capacity, MAX_CAPACITY);
    for bad in ["abc", "", "-1", "+5", "12k", "0x10", "1048577", "99999999999999999999999", "1e12", "NaN", "inf"] {
        let vars: &'static [(&'static str, &'static str)] = Box::leak(Box::new([(SIZE_ENV, bad)]));
        let e = FlightConfig::from_lookup(lookup(vars)).unwrap_err();
        assert_eq!(e.var, SIZE_ENV);
        let msg = e.to_string();
        assert!(msg.starts_with("OCCL_FLIGHT_RECORDER_SIZE="), "{msg}");
        assert!(msg.contains(&format!("{bad:?}")), "{msg}");
    }
    let e = FlightConfig::from_lookup(lookup(&[(SIZE_ENV, "1048577")])).unwrap_err();
    assert!(e.to_string().contains("at most 1048576"), "{e}");
    let e = FlightConfig::from_lookup(lookup(&[(DIR_ENV, "")])).unwrap_err();
    assert!(e.to_string().starts_with("OCCL_FLIGHT_RECORDER_DIR="), "{e}");
    // The real environment of this test process has no such variable, or a valid one.
    if std::env::var_os(SIZE_ENV).is_none() {
        assert_eq!(FlightRecorder::capacity_from_env().unwrap(), DEFAULT_CAPACITY);
    }
}

#[test]
fn json_document_fields() {
    let r = FlightRecorder::new(comm(3), 4);
    let a = r.enqueue(&op(1), 1_000);
    r.started(a, 1_100);
    r.completed(a, 1_600);
    let mut p = op(2);
    p.op = "Recv";
    p.redop = None;
    p.root_or_peer = Some(RootOrPeer::Peer(5));
    let b = r.enqueue(&p, 2_000);
    r.started(b, 2_100);
    let c = r.enqueue(&op(3), 3_000);
    r.failed(c, 3_500, "aborted");
    let v = r.to_json_at(&"x".repeat(2000), 10_000);
    assert_eq!(v["format"], "occl-flight-recorder");
    assert_eq!(v["version"], 1);
    assert_eq!(v["reason"].as_str().unwrap().len(), MAX_REASON_BYTES);
    assert_eq!(v["dump_time_ns"], 10_000);
    assert_eq!(v["pid"], std::process::id());
    assert_eq!(v["host"], "node-a");
    assert_eq!(v["comm"]["hash"], "0123456789abcdef");
    assert_eq!(v["comm"]["name"], "dp");
    assert_eq!((v["comm"]["rank"].as_u64(), v["comm"]["nranks"].as_u64()), (Some(3), Some(8)));
    assert_eq!((v["capacity"].as_u64(), v["recorded"].as_u64()), (Some(4), Some(3)));
    assert_eq!(v["status"]["last_enqueued_collective"], 3);
    assert_eq!(v["status"]["last_started_collective"], 2, "op 3 failed before it started");
    assert_eq!(v["status"]["last_completed_collective"], 1);
    let e = v["entries"].as_array().unwrap();
    assert_eq!(e.len(), 3);
    let e0 = &e[0];
    for (k, want) in [
        ("record_id", Value::from(0)),
        ("seq", 1.into()),
        ("coll_seq", 1.into()),
        ("op", "AllReduce".into()),
        ("dtype", "ncclFloat32".into()),
        ("redop", "ncclSum".into()),
        ("count", 2.into()),
        ("in_bytes", 8.into()),
        ("out_bytes", 8.into()),
        ("root", Value::Null),
        ("peer", Value::Null),
        ("is_p2p", false.into()),
        ("algo", "RING".into()),
        ("proto", "SIMPLE".into()),
        ("state", "completed".into()),
        ("t_enqueued_ns", 1_000.into()),
        ("t_started_ns", 1_100.into()),
        ("t_completed_ns", 1_600.into()),
        ("t_failed_ns", Value::Null),
        ("duration_ns", 500.into()),
        ("error", Value::Null),
    ] {
        assert_eq!(e0[k], want, "{k}");
    }
    assert_eq!(e0.as_object().unwrap().len(), 21);
    assert_eq!((&e[1]["peer"], &e[1]["redop"], &e[1]["is_p2p"]), (&Value::from(5), &Value::Null, &Value::from(true)));
    assert_eq!(
        (&e[1]["state"], &e[1]["t_completed_ns"], &e[1]["duration_ns"]),
        (&"started".into(), &Value::Null, &Value::Null)
    );
    assert_eq!(
        (&e[2]["state"], &e[2]["t_failed_ns"], &e[2]["error"]),
        (&"failed".into(), &3_500.into(), &"aborted".into())
    );
    assert_eq!(&e[2]["t_completed_ns"], &Value::Null);
    let f = &v["in_flight"];
    assert_eq!((&f["seq"], &f["state"], &f["age_ns"]), (&2.into(), &"started".into(), &7_900.into()));
}

#[test]
fn dump_to_dir_writes_parseable_json_atomically() {
    let dir = temp_dir("dump");
    let r = FlightRecorder::new(comm(4), 64);
    for s in 0..100 {
        let slot = r.enqueue(&op(s), s);
        r.completed(slot, s + 1);
    }
    r.enqueue(&op(100), 100);
    let path = r.dump_to_dir(&dir.join("sub"), "timeout").unwrap();
    assert_eq!(
        path.file_name().unwrap().to_str().unwrap(),
        format!("occl_flight_0123456789abcdef_r4_{}.json", std::process::id())
    );
    let text = std::fs::read_to_string(&path).unwrap();
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["reason"], "timeout");
    assert_eq!(v["entries"].as_array().unwrap().len(), 64);
    assert_eq!(v["in_flight"]["seq"], 100);
    // The streamed file holds what to_json builds, one entry per line.
    assert_eq!(v, r.to_json_at("timeout", v["dump_time_ns"].as_u64().unwrap()));
    assert_eq!(text.lines().filter(|l| l.starts_with("    {\"record_id\":")).count(), 64);
    assert!(text.lines().any(|l| l.starts_with("  \"in_flight\": {")));

    // Dumps racing a reader: the reader only ever sees a whole document.
    let stop = Arc::new(AtomicBool::new(false));
    let reader = {
        let (path, stop) = (path.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut n = 0;
            while !stop.load(Ordering::Relaxed) {
                let text = std::fs::read_to_string(&path).unwrap();
                let v: Value = serde_json::from_str(&text).unwrap();
                assert!(v["entries"].is_array());
                n += 1;
            }
            n
        })
    };
    let writers: Vec<_> = (0..2)
        .map(|_| {
            let (r, dir) = (r.clone(), dir.join("sub"));
            std::thread::spawn(move || {
                for _ in 0..20 {
                    r.dump_to_dir(&dir, "SIGUSR1").unwrap();
                }
            })
        })
        .collect();
    for w in writers {
        w.join().unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    assert!(reader.join().unwrap() > 0);
    let names: Vec<_> = std::fs::read_dir(dir.join("sub")).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(names.len(), 2, "the JSON and the PyTorch dump, no temporary file left: {names:?}");
    assert!(names.contains(&r.torch_file_name().into()), "{names:?}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Another user who can write the dump directory (a shared /tmp) knows every part of a dump's
/// temporary name from RAS and plants symlinks there and at the final name: the dump must
/// follow neither, and come out owner-only.
#[test]
fn a_dump_follows_no_symlink_planted_in_its_directory() {
    use std::os::unix::fs::{symlink, PermissionsExt};
    let dir = temp_dir("symlink");
    let mut c = comm(5);
    c.comm_hash = 0x5e1f_11a4_0000_0005;
    let r = FlightRecorder::new(c, 8);
    r.completed(r.enqueue(&op(1), 1), 2);
    let name = r.file_name();
    let (victim, victim_final) = (dir.join("victim"), dir.join("victim-final"));
    std::fs::write(&victim, "root-owned").unwrap();
    std::fs::write(&victim_final, "root-owned too").unwrap();
    // The names `.<name>.<pid>.<n>.tmp` that dumps used, n counting the process's dumps.
    let pid = std::process::id();
    for n in 0..1024 {
        symlink(&victim, dir.join(format!(".{name}.{pid}.{n}.tmp"))).unwrap();
    }
    symlink(&victim_final, dir.join(&name)).unwrap();
    let path = r.dump_to_dir(&dir, "SIGUSR1").unwrap();
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "root-owned", "the dump wrote through a planted symlink");
    assert_eq!(std::fs::read_to_string(&victim_final).unwrap(), "root-owned too");
    let meta = std::fs::symlink_metadata(&path).unwrap();
    assert!(meta.file_type().is_file(), "the dump is a file of its own, not a link");
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    assert_eq!(v["reason"], "SIGUSR1");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn dump_all_to_dumps_live_recorders_only() {
    let dir = temp_dir("all");
    let mut c = comm(6);
    c.comm_hash = 0xfeed_0000_0000_0006;
    let live = FlightRecorder::new(c.clone(), 4);
    c.rank = 7;
    let gone = FlightRecorder::new(c, 4);
    drop(gone);
    let paths: Vec<_> = dump_all_to(&dir, "test").into_iter().map(Result::unwrap).collect();
    assert!(paths.contains(&dir.join(live.file_name())));
    assert!(paths.iter().all(|p| !p.to_string_lossy().contains("feed000000000006_r7")));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn dump_to_unwritable_dir_is_an_error_naming_the_path() {
    let dir = temp_dir("bad");
    let file = dir.join("not-a-dir");
    std::fs::write(&file, b"x").unwrap();
    let r = FlightRecorder::new(comm(0), 1);
    assert!(r.dump_to_dir(&file, "x").is_err());
    std::fs::remove_dir_all(&dir).unwrap();
}

/// One writer runs millions of operations (state encoded in every field) while a reader takes
/// snapshots: every entry must be internally consistent, and entries in order.
#[test]
fn concurrent_snapshots_see_consistent_entries() {
    const OPS: u64 = 2_000_000;
    const CAP: usize = 61;
    let r = FlightRecorder::new(comm(0), CAP);
    let done = Arc::new(AtomicBool::new(false));
    let ops = ["AllReduce", "Broadcast", "AllGather"];
    let dtypes = ["ncclFloat32", "ncclInt8"];
    let writer = {
        let (r, done) = (r.clone(), done.clone());
        std::thread::spawn(move || {
            for i in 0..OPS {
                let o = OpInfo {
                    seq: i,
                    coll_seq: i ^ 0x5555,
                    op: ops[(i % 3) as usize],
                    dtype: dtypes[(i % 2) as usize],
                    redop: (!i.is_multiple_of(5)).then_some("ncclSum"),
                    count: i * 3,
                    in_bytes: i * 7 + 1,
                    out_bytes: i * 11 + 2,
                    root_or_peer: Some(RootOrPeer::Root(i as u32)),
                    algo: if i.is_multiple_of(4) { "TREE" } else { "RING" },
                    proto: if i.is_multiple_of(6) { "LL" } else { "SIMPLE" },
                };
                let s = r.enqueue(&o, i * 10);
                if i % 3 != 2 {
                    r.started(s, i * 10 + 1);
                }
                if i % 100_000 == 99_999 {
                    r.failed(s, i * 10 + 3, &format!("f{i}"));
                } else if i % 7 != 6 {
                    r.completed(s, i * 10 + 2);
                }
            }
            done.store(true, Ordering::Release);
        })
    };
    let check = |e: &Entry| {
        let i = e.info.seq;
        assert_eq!(e.record_id, i);
        assert_eq!(e.info.coll_seq, i ^ 0x5555);
        assert_eq!(e.info.op, ops[(i % 3) as usize]);
        assert_eq!(e.info.dtype, dtypes[(i % 2) as usize]);
        assert_eq!(e.info.redop, (!i.is_multiple_of(5)).then_some("ncclSum"));
        assert_eq!((e.info.count, e.info.in_bytes, e.info.out_bytes), (i * 3, i * 7 + 1, i * 11 + 2));
        assert_eq!(e.info.root_or_peer, Some(RootOrPeer::Root(i as u32)));
        assert_eq!(e.info.algo, if i.is_multiple_of(4) { "TREE" } else { "RING" });
        assert_eq!(e.info.proto, if i.is_multiple_of(6) { "LL" } else { "SIMPLE" });
        assert_eq!(e.t_enqueued_ns, i * 10);
        match e.state {
            OpState::Enqueued => assert_eq!((e.t_started_ns, e.t_ended_ns), (None, None)),
            OpState::Started => assert_eq!((e.t_started_ns, e.t_ended_ns), (Some(i * 10 + 1), None)),
            OpState::Completed => {
                assert_eq!(e.t_ended_ns, Some(i * 10 + 2));
                assert_eq!(e.t_started_ns, (i % 3 != 2).then_some(i * 10 + 1));
            }
            OpState::Failed => {
                assert_eq!(e.t_ended_ns, Some(i * 10 + 3));
                assert_eq!(e.error, Some(format!("f{i}")));
            }
        }
    };
    let (mut snapshots, mut entries) = (0u64, 0u64);
    let deadline = Instant::now() + Duration::from_secs(120);
    while !done.load(Ordering::Acquire) && Instant::now() < deadline {
        let s = r.snapshot();
        assert!(s.len() <= CAP);
        assert!(s.windows(2).all(|w| w[0].record_id < w[1].record_id), "in order");
        s.iter().for_each(check);
        if let Some(e) = r.last_in_flight() {
            check(&e);
            assert!(e.state.in_flight());
        }
        snapshots += 1;
        entries += s.len() as u64;
    }
    writer.join().unwrap();
    let s = r.snapshot();
    assert_eq!(s.len(), CAP);
    assert_eq!(s.last().unwrap().info.seq, OPS - 1);
    s.iter().for_each(check);
    assert!(snapshots > 10, "the reader ran {snapshots} snapshots");
    eprintln!("{snapshots} snapshots, {entries} entries checked");
}

/// `cargo test -p occl-telemetry --release -- --ignored --nocapture bench_record`
#[test]
#[ignore]
fn bench_record() {
    let o = op(1);
    let n: u64 = 20_000_000;
    for capacity in [DEFAULT_CAPACITY, 64] {
        let r = FlightRecorder::new(comm(0), capacity);
        for round in 0..3 {
            let t = Instant::now();
            for i in 0..n {
                let mut o = std::hint::black_box(o);
                o.seq = i;
                let s = r.enqueue(&o, i);
                r.started(s, i + 1);
                r.completed(s, i + 2);
            }
            let ns = t.elapsed().as_nanos() as f64 / n as f64;
            eprintln!("capacity {capacity}, round {round}: {ns:.2} ns per enqueue+started+completed");
        }
    }
    // A training step's mix: the names change from one operation to the next.
    let mix = [
        op(1),
        OpInfo { op: "AllGather", redop: None, dtype: "ncclBfloat16", ..op(1) },
        OpInfo { op: "ReduceScatter", algo: "PAT", ..op(1) },
    ];
    let r = FlightRecorder::new(comm(0), DEFAULT_CAPACITY);
    let t = Instant::now();
    for i in 0..n {
        let mut o = std::hint::black_box(mix[(i % 3) as usize]);
        o.seq = i;
        let s = r.enqueue(&o, i);
        r.started(s, i + 1);
        r.completed(s, i + 2);
    }
    eprintln!("alternating names: {:.2} ns per enqueue+started+completed", t.elapsed().as_nanos() as f64 / n as f64);
    let d = FlightRecorder::new(comm(0), 0);
    let t = Instant::now();
    for i in 0..n {
        let s = d.enqueue(std::hint::black_box(&o), i);
        d.started(s, i + 1);
        d.completed(s, i + 2);
    }
    eprintln!("disabled: {:.2} ns per op", t.elapsed().as_nanos() as f64 / n as f64);
}

/// The PyTorch-layout dump: per-kind sequence numbers (a send does not move the collective
/// count), the analyzer's operation names and sizes, and a pickle that holds them.
#[test]
fn torch_dump_numbers_collectives_and_sends_apart() {
    let r = FlightRecorder::new(comm(1), 8);
    let a = r.enqueue(&op(1), 1_000);
    r.started(a, 1_100);
    r.completed(a, 1_600);
    let mut p = op(2);
    p.op = "Send";
    p.redop = None;
    p.in_bytes = 12;
    p.out_bytes = 0;
    p.root_or_peer = Some(RootOrPeer::Peer(0));
    r.completed(r.enqueue(&p, 2_000), 2_100);
    let c = r.enqueue(&op(3), 3_000);
    r.failed(c, 3_500, "peer 0 died");
    let s = r.snapshot();
    let seqs: Vec<(u64, u64)> = s.iter().map(|e| (e.collective_seq_id, e.p2p_seq_id)).collect();
    assert_eq!(seqs, [(1, 0), (1, 1), (2, 1)]);
    let mut out = Vec::new();
    r.write_torch_pickle(&mut out).unwrap();
    assert_eq!(&out[..2], b"\x80\x02");
    assert_eq!(out.last(), Some(&b'.'));
    let has = |needle: &str| out.windows(needle.len()).any(|w| w == needle.as_bytes());
    for needle in ["nccl:all_reduce", "nccl:send 1->0", "0123456789abcdef", "[0, 1, 2, 3, 4, 5, 6, 7]", "peer 0 died"] {
        assert!(has(needle), "{needle} in the pickle");
    }
    assert_eq!(r.torch_file_name(), "occl_fr_0123456789abcdef_rank_1");
}
