//! Bad input gets a clear error and loses nothing; a failing or dead peer turns into an error on
//! every other rank within bounds, never a hang.

mod common;

use common::{env, err_of, run_job, worker};
use occl::{Comm, Config, DataType, ErrorKind, RedOp, UniqueId};
use occl_tests::launch::{Job, Spawn};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

fn on_threads(n: usize, f: impl Fn(&Comm) + Send + Sync + 'static) {
    let f = Arc::new(f);
    let comms = Comm::init_all_with(n, Config::default()).expect("init_all");
    let hs: Vec<_> = comms
        .into_iter()
        .map(|c| {
            let f = f.clone();
            std::thread::spawn(move || {
                f(&c);
                c.destroy().expect("destroy");
            })
        })
        .collect();
    for h in hs {
        h.join().expect("rank thread panicked");
    }
}

fn kind<T: std::fmt::Debug>(r: occl::Result<T>) -> ErrorKind {
    r.expect_err("expected an error").kind()
}

#[test]
fn invalid_arguments_fail_before_communicating_and_leave_the_comm_usable() {
    on_threads(2, |c| {
        let a = [1.0f32; 4];
        let mut b = [0f32; 4];
        assert_eq!(kind(c.all_reduce(&a, &mut b[..3], RedOp::Sum)), ErrorKind::InvalidArgument);
        assert_eq!(kind(c.broadcast(&a, &mut b, 2)), ErrorKind::InvalidArgument);
        assert_eq!(kind(c.reduce(&a, &mut b, RedOp::Sum, 7)), ErrorKind::InvalidArgument);
        assert_eq!(kind(c.all_gather(&a, &mut b)), ErrorKind::InvalidArgument);
        assert_eq!(kind(c.reduce_scatter(&a, &mut b, RedOp::Sum)), ErrorKind::InvalidArgument);
        assert_eq!(kind(c.all_to_all(&a[..3], &mut b[..3])), ErrorKind::InvalidArgument);
        assert_eq!(kind(c.all_gather_in_place(&mut b[..3])), ErrorKind::InvalidArgument);
        assert_eq!(kind(c.send(&a, 9)), ErrorKind::InvalidArgument);
        assert_eq!(kind(c.send(&a, c.rank())), ErrorKind::InvalidUsage);
        let e = c.broadcast(&a, &mut b, 2).unwrap_err();
        assert!(e.to_string().contains("root 2 is out of range"), "{e}");
        // SAFETY (raw calls): the pointers are valid; occl must reject the counts and layouts
        // before touching memory.
        unsafe {
            let p = b.as_mut_ptr().cast::<u8>();
            let e = c.all_reduce_raw(p, p, usize::MAX / 2, DataType::F32, RedOp::Sum).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidArgument);
            assert!(e.to_string().contains("overflows"), "{e}");
            assert_eq!(kind(c.all_gather_raw(p, p, usize::MAX / 3, DataType::F64)), ErrorKind::InvalidArgument);
            assert_eq!(
                kind(c.all_reduce_raw(p.add(1), p.add(1), 2, DataType::F32, RedOp::Sum)),
                ErrorKind::InvalidArgument
            );
            assert_eq!(kind(c.all_reduce_raw(p, p.add(4), 2, DataType::F32, RedOp::Sum)), ErrorKind::InvalidArgument);
            assert_eq!(
                kind(c.all_reduce_raw(std::ptr::null(), p, 2, DataType::F32, RedOp::Sum)),
                ErrorKind::InvalidArgument
            );
        }
        // Nothing was lost: the next valid call works.
        c.all_reduce(&a, &mut b, RedOp::Sum).expect("valid all_reduce after rejected calls");
        assert_eq!(b, [2.0; 4]);
    });
}

#[test]
fn bad_init_arguments_and_ids() {
    let id = UniqueId::new().expect("id");
    assert_eq!(kind(Comm::init_rank(2, &id, 2, Config::default())), ErrorKind::InvalidArgument);
    assert_eq!(kind(Comm::init_rank(0, &id, 0, Config::default())), ErrorKind::InvalidArgument);
    assert_eq!(kind(Comm::init_all(0)), ErrorKind::InvalidArgument);
    assert_eq!(kind("occl1-zz@127.0.0.1:1".parse::<UniqueId>()), ErrorKind::InvalidArgument);
}

#[test]
fn mismatched_operations_fail_on_every_rank_with_the_reason() {
    for (n, how, transport) in [
        (2, "count", "shm"),
        (3, "coll", "shm"),
        (2, "dtype", "shm"),
        (3, "op", "shm"),
        (3, "count", "tcp"),
        (2, "coll", "tcp"),
    ] {
        let spawn = Spawn { env: env(&[("OCCL_TRANSPORT", transport), ("OCCL_TIMEOUT", "30")]), ..Spawn::default() };
        let start = Instant::now();
        let outs = run_job(n, &["mismatch", "1", how], spawn, Duration::from_secs(60));
        let took = start.elapsed();
        let errs: Vec<_> = outs
            .iter()
            .map(|o| err_of(o).unwrap_or_else(|| panic!("rank {} did not fail:\n{}", o.rank, o.output)))
            .collect();
        assert!(
            errs.iter().any(|(k, _, l)| k == "InvalidUsage" && l.contains("operation mismatch")),
            "{how}/{transport}: no rank named the mismatch: {errs:#?}"
        );
        for (k, _, l) in &errs {
            assert!(k == "InvalidUsage" || k == "RemoteError", "{how}/{transport}: unexpected {l}");
        }
        assert!(took < Duration::from_secs(10), "{how}/{transport}: took {took:?} (must not wait for the timeout)");
    }
}

fn now_ns() -> u128 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0)
}

fn sigkill_mid_collective(transport: &str) {
    let spawn = Spawn {
        env: env(&[("OCCL_TRANSPORT", transport), ("OCCL_TIMEOUT", "60")]),
        capture_stdout: true,
        capture_stderr: true,
        ..Spawn::default()
    };
    let job = Job::spawn(worker(), &["loop".to_string()], 4, &spawn).expect("start");
    job.wait_for_all("READY", Duration::from_secs(30)).expect("ranks ready");
    std::thread::sleep(Duration::from_millis(300));
    let killed_at = now_ns();
    job.signal(2, libc::SIGKILL).expect("kill rank 2");
    let outs = job.wait(Duration::from_secs(30)).expect("survivors exit");
    for o in outs.iter().filter(|o| o.rank != 2) {
        let (k, at, line) =
            err_of(o).unwrap_or_else(|| panic!("{transport}: rank {} did not fail:\n{}", o.rank, o.output));
        assert_eq!(k, "RemoteError", "{transport}: rank {}: {line}", o.rank);
        let after = Duration::from_nanos(at.saturating_sub(killed_at) as u64);
        assert!(after < Duration::from_secs(5), "{transport}: rank {} noticed after {after:?}: {line}", o.rank);
        eprintln!("{transport}: rank {} failed {after:?} after the kill: {line}", o.rank);
    }
}

#[test]
fn sigkill_of_a_rank_fails_every_other_rank_within_5s_shm() {
    sigkill_mid_collective("shm");
}

#[test]
fn sigkill_of_a_rank_fails_every_other_rank_within_5s_tcp() {
    sigkill_mid_collective("tcp");
}

#[test]
fn a_late_rank_makes_the_others_time_out_after_occl_timeout() {
    let spawn = Spawn { env: env(&[("OCCL_TIMEOUT", "1")]), ..Spawn::default() };
    let start_ns = now_ns();
    let outs = run_job(3, &["late", "4000"], spawn, Duration::from_secs(60));
    // Ranks 0 and 2 wait; whichever waits on rank 1 directly times out, the other may learn of
    // it first as a remote error that names the timeout. Both within OCCL_TIMEOUT + slack.
    let mut timeouts = 0;
    for r in [0, 2] {
        let (k, at, line) = err_of(&outs[r]).unwrap_or_else(|| panic!("rank {r} did not fail:\n{}", outs[r].output));
        assert!(k == "Timeout" || (k == "RemoteError" && line.contains("timed out")), "rank {r}: {line}");
        timeouts += (k == "Timeout") as usize;
        let after = Duration::from_nanos(at.saturating_sub(start_ns) as u64);
        assert!(after < Duration::from_secs(4), "rank {r} failed only after {after:?}: {line}");
    }
    assert!(timeouts >= 1, "no rank reported Timeout");
    // The late rank arrives to find its peers gone: a remote error, not a hang.
    let (k, _, line) = err_of(&outs[1]).expect("rank 1 fails");
    assert_eq!(k, "RemoteError", "{line}");
}

#[test]
fn abort_and_use_after_failure_are_errors() {
    on_threads(2, |c| {
        c.abort();
        let mut v = [1u8; 4];
        let e = c.all_reduce_in_place(&mut v, RedOp::Sum).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidUsage);
        assert!(e.to_string().contains("aborted"), "{e}");
    });
}

/// The error line of every rank of `outs`, which must all have failed.
fn errors_of(outs: &[occl_tests::launch::RankOutput], what: &str) -> Vec<(String, String)> {
    outs.iter()
        .map(|o| {
            let (k, _, line) =
                err_of(o).unwrap_or_else(|| panic!("{what}: rank {} did not fail:\n{}", o.rank, o.output));
            (k, line)
        })
        .collect()
}

/// How long rank `o`'s call took, from its `TOOK rank=… ms=…` line.
fn took(o: &occl_tests::launch::RankOutput) -> Option<Duration> {
    let ms: f64 = o.output.lines().find_map(|l| l.strip_prefix("TOOK "))?.split("ms=").nth(1)?.trim().parse().ok()?;
    Some(Duration::from_secs_f64(ms / 1e3))
}

/// Issue 26, item 2: ranks that pass different roots to a broadcast or reduce disagree on who
/// sends first (both "roots" only send; both non-roots wait). Every rank must fail at once with
/// an operation mismatch that names both roots: small and 4 MiB, chain and tree, 2 and 3 ranks,
/// shm and tcp. (Without the check, the small broadcast would return Ok with different data on
/// every rank, and the rest would hang until OCCL_TIMEOUT.)
#[test]
fn different_roots_fail_every_rank_at_once_naming_both_roots() {
    let mut cases = Vec::new();
    for transport in ["shm", "tcp"] {
        for n in [2, 3] {
            for coll in ["broadcast", "reduce"] {
                for bytes in [256, 4 << 20] {
                    cases.push((transport, n, coll, bytes, None));
                }
            }
        }
    }
    for coll in ["broadcast", "reduce"] {
        for bytes in [256, 4 << 20] {
            cases.push(("shm", 3, coll, bytes, Some("tree")));
        }
    }
    for (transport, n, coll, bytes, algo) in cases {
        let what = format!("{coll} of {bytes} B, {n} ranks over {transport}, algo {}", algo.unwrap_or("auto"));
        let mut vars = vec![("OCCL_TRANSPORT", transport), ("OCCL_TIMEOUT", "5")];
        if let Some(a) = algo {
            vars.push(("OCCL_ALGO", a));
        }
        let spawn = Spawn { env: env(&vars), ..Spawn::default() };
        let outs = run_job(n, &["roots", coll, &bytes.to_string(), "1"], spawn, Duration::from_secs(60));
        for (o, (k, line)) in outs.iter().zip(errors_of(&outs, &what)) {
            assert_eq!(k, "InvalidUsage", "{what}: rank {}: {line}", o.rank);
            assert!(
                line.contains("operation mismatch") && line.contains("root 0") && line.contains("root 1"),
                "{what}: rank {} does not name both roots: {line}",
                o.rank
            );
            let t = took(o).unwrap_or_else(|| panic!("{what}: rank {} printed no time:\n{}", o.rank, o.output));
            assert!(t < Duration::from_secs(1), "{what}: rank {} took {t:?} to fail: {line}", o.rank);
        }
    }
}

/// As above, with the ranks as threads of this process.
#[test]
fn different_roots_fail_every_thread_rank_at_once_naming_both_roots() {
    for n in [2, 3] {
        for coll in ["broadcast", "reduce"] {
            for bytes in [256usize, 4 << 20] {
                let what = format!("{coll} of {bytes} B, {n} thread ranks");
                let config = Config { timeout: Duration::from_secs(5), ..Config::default() };
                let comms = Comm::init_all_with(n, config).expect("init_all");
                let hs: Vec<_> = comms
                    .into_iter()
                    .map(|c| {
                        std::thread::spawn(move || {
                            let r = c.rank();
                            let a = vec![r as f32 + 1.0; bytes / 4];
                            let mut b = vec![0f32; bytes / 4];
                            c.all_reduce_in_place(&mut [1f32], RedOp::Sum).expect("barrier");
                            let root = if r == 1 { 1 } else { 0 };
                            let t0 = Instant::now();
                            let res = match coll {
                                "reduce" => c.reduce(&a, &mut b, RedOp::Sum, root),
                                _ => c.broadcast(&a, &mut b, root),
                            };
                            let took = t0.elapsed();
                            let _ = c.destroy();
                            (r, res, took)
                        })
                    })
                    .collect();
                for h in hs {
                    let (r, res, took) = h.join().expect("rank thread panicked");
                    let e = res.expect_err(&format!("{what}: rank {r} returned Ok"));
                    assert_eq!(e.kind(), ErrorKind::InvalidUsage, "{what}: rank {r}: {e}");
                    let text = e.to_string();
                    assert!(text.contains("root 0") && text.contains("root 1"), "{what}: rank {r}: {text}");
                    assert!(took < Duration::from_secs(1), "{what}: rank {r} took {took:?}: {text}");
                }
            }
        }
    }
}

/// Issue 26, item 3: settings that shape the connections must be alike on every rank. Ranks
/// that differ all fail at init, at once, with an error that names the variable and both values
/// (before: they waited for each other's connections until OCCL_TIMEOUT, and the timeout named
/// neither and said "within 0.0 s").
#[test]
fn settings_that_differ_between_ranks_fail_init_on_every_rank_naming_both_values() {
    for (var, v0, v1, transport) in [
        ("OCCL_TRANSPORT", "shm", "tcp", None),
        ("OCCL_NSOCKS", "2", "4", Some("tcp")),
        ("OCCL_FIFO_SLOTS", "8", "4", None),
        ("OCCL_SHM_SLOT_SIZE", "65536", "131072", None),
        ("OCCL_TCP_SLOT_SIZE", "65536", "131072", Some("tcp")),
        ("OCCL_RUNTIME_CONNECT", "1", "0", None),
    ] {
        let mut vars = vec![("OCCL_TIMEOUT", "10")];
        if let Some(t) = transport {
            vars.push(("OCCL_TRANSPORT", t));
        }
        let spawn = Spawn { env: env(&vars), rank_env: vec![env(&[(var, v0)]), env(&[(var, v1)])], ..Spawn::default() };
        let start = Instant::now();
        let outs = run_job(2, &["late", "0"], spawn, Duration::from_secs(60));
        let elapsed = start.elapsed();
        let want = format!("{var} differs: rank 0 has {v0}, rank 1 has {v1}");
        for (o, (k, line)) in outs.iter().zip(errors_of(&outs, var)) {
            assert_eq!(k, "InvalidUsage", "{var}: rank {}: {line}", o.rank);
            assert!(line.contains(&want), "{var}: rank {} does not say {want:?}: {line}", o.rank);
        }
        assert!(elapsed < Duration::from_secs(5), "{var}: the job took {elapsed:?} (must not wait for OCCL_TIMEOUT)");
    }
}

/// Issue 26, item 9: when rank 3 dies, the ranks that learn of it only from a neighbour's
/// failure name rank 3 too, not the neighbour (before: "peer rank 2: failed or was aborted").
fn a_dead_rank_is_named_by_every_survivor(transport: &str) {
    let spawn = Spawn {
        env: env(&[("OCCL_TRANSPORT", transport), ("OCCL_TIMEOUT", "60")]),
        capture_stdout: true,
        capture_stderr: true,
        ..Spawn::default()
    };
    // Rank 3 stops after 5 all-reduces; the others wait in the 6th.
    let job = Job::spawn(worker(), &["hang".to_string(), "3".to_string()], 4, &spawn).expect("start");
    job.wait_for_all("READY", Duration::from_secs(30)).expect("ranks ready");
    std::thread::sleep(Duration::from_millis(300));
    job.signal(3, libc::SIGKILL).expect("kill rank 3");
    let outs = job.wait(Duration::from_secs(30)).expect("survivors exit");
    for o in outs.iter().filter(|o| o.rank != 3) {
        let (k, _, line) =
            err_of(o).unwrap_or_else(|| panic!("{transport}: rank {} did not fail:\n{}", o.rank, o.output));
        assert_eq!(k, "RemoteError", "{transport}: rank {}: {line}", o.rank);
        assert!(line.contains("peer rank 3:"), "{transport}: rank {} does not name rank 3: {line}", o.rank);
        eprintln!("{transport}: rank {}: {line}", o.rank);
    }
}

#[test]
fn a_dead_rank_is_named_by_every_survivor_shm() {
    a_dead_rank_is_named_by_every_survivor("shm");
}

#[test]
fn a_dead_rank_is_named_by_every_survivor_tcp() {
    a_dead_rank_is_named_by_every_survivor("tcp");
}
