//! Communicator lifecycle in real processes: split into two colours running at once (and
//! beside the parent), abort from a watchdog thread ending every rank's blocked call within
//! 1 s, a SIGKILLed rank shrunk away and an all-reduce on the survivors, a hung (SIGSTOPped)
//! rank shrunk away with ShrinkMode::Abort from a watchdog, non-blocking init; and bad input.

mod common;

use common::{assert_all_ok, env, err_of, run_job, scratch, worker};
use occl::{Comm, Config, ErrorKind, InitState, ShrinkMode, UniqueId, OCCL_SPLIT_NOCOLOR};
use occl_tests::launch::{Job, RankOutput, Spawn};
use std::time::{Duration, Instant};

fn spawn(transport: &str) -> Spawn {
    Spawn { env: env(&[("OCCL_TRANSPORT", transport), ("OCCL_TIMEOUT", "60")]), ..Spawn::default() }
}

fn line_with<'a>(o: &'a RankOutput, prefix: &str) -> Option<&'a str> {
    o.output.lines().find(|l| l.starts_with(prefix))
}

fn at_ns(line: &str) -> u128 {
    line.split("at_ns=").nth(1).and_then(|t| t.split_whitespace().next()).and_then(|t| t.parse().ok()).unwrap_or(0)
}

#[test]
fn split_into_two_colours_runs_them_and_the_parent_at_once() {
    for (n, transport, arg) in [(4, "shm", "-"), (5, "tcp", "nocolor")] {
        let outs = run_job(n, &["split", arg], spawn(transport), Duration::from_secs(60));
        assert_all_ok(&outs, &format!("split n={n} {transport} {arg}"));
        for o in &outs {
            let r = o.rank;
            if arg == "nocolor" && r == n - 1 {
                assert!(o.output.contains("child=none"), "{}", o.output);
                continue;
            }
            // Key = n - rank: within a colour the highest parent rank comes first.
            let members: Vec<usize> =
                (0..n).rev().filter(|q| q % 2 == r % 2 && !(arg == "nocolor" && *q == n - 1)).collect();
            let want = format!("child={}/{}", members.iter().position(|q| *q == r).unwrap_or(99), members.len());
            assert!(o.output.contains(&want), "rank {r}: expected {want}:\n{}", o.output);
        }
    }
}

#[test]
fn a_bad_split_colour_is_invalid_usage_on_every_rank() {
    let outs = run_job(3, &["split-bad", "1", "-7"], spawn("shm"), Duration::from_secs(60));
    for o in &outs {
        let (k, _, line) = err_of(o).unwrap_or_else(|| panic!("rank {} did not fail:\n{}", o.rank, o.output));
        assert_eq!(k, "InvalidUsage", "{line}");
        assert!(line.contains("rank 1 passed color -7"), "{line}");
    }
}

/// Rank 3 of 4 stays out of an all-reduce the others block in; the ranks in `aborters` call
/// `abort()` from a watchdog thread. Every blocked rank must return an error within 1 s of the
/// first abort, whether it aborted itself or waits on a rank that did (or on one that failed
/// because of it).
fn abort_case(transport: &str, aborters: &str) {
    let outs = run_job(4, &["abort", "3", aborters], spawn(transport), Duration::from_secs(60));
    let first_abort = outs
        .iter()
        .filter_map(|o| line_with(o, "ABORT rank="))
        .map(at_ns)
        .min()
        .unwrap_or_else(|| panic!("{transport}/{aborters}: nobody aborted: {outs:#?}"));
    for o in outs.iter().filter(|o| o.rank != 3) {
        let (k, at, line) =
            err_of(o).unwrap_or_else(|| panic!("{transport}/{aborters}: rank {} did not fail:\n{}", o.rank, o.output));
        let after = Duration::from_nanos(at.saturating_sub(first_abort) as u64);
        eprintln!("{transport} abort by {aborters}: rank {} returned {after:?} after the abort: {line}", o.rank);
        assert!(k == "InvalidUsage" || k == "RemoteError", "{line}");
        assert!(line.contains("abort"), "{transport}/{aborters}: rank {} failed for another reason: {line}", o.rank);
        assert!(after < Duration::from_secs(1), "{transport}/{aborters}: rank {} returned after {after:?}", o.rank);
    }
}

#[test]
fn abort_from_a_watchdog_ends_every_blocked_call_within_1s_shm() {
    // The idle rank aborts (its peers wait on it); one blocked rank aborts; every rank aborts.
    for who in ["3", "0", "all"] {
        abort_case("shm", who);
    }
}

#[test]
fn abort_from_a_watchdog_ends_every_blocked_call_within_1s_tcp() {
    for who in ["3", "1"] {
        abort_case("tcp", who);
    }
}

/// Kills rank 2 of 4 mid all-reduce; the survivors shrink without it and all-reduce.
fn shrink_after_kill(transport: &str, mode: &str) {
    let spawn = Spawn { capture_stdout: true, capture_stderr: true, ..spawn(transport) };
    let job = Job::spawn(worker(), &["shrink".into(), "2".into(), mode.into()], 4, &spawn).expect("start");
    job.wait_for_all("READY", Duration::from_secs(30)).expect("ranks ready");
    std::thread::sleep(Duration::from_millis(200));
    job.signal(2, libc::SIGKILL).expect("kill rank 2");
    let outs = job.wait(Duration::from_secs(60)).expect("survivors finish");
    for o in outs.iter().filter(|o| o.rank != 2) {
        let new_rank = if o.rank < 2 { o.rank } else { o.rank - 1 };
        // Survivors 0, 1, 3 contribute rank + 1: 1 + 2 + 4.
        let want = format!("OK rank={} new={new_rank}/3 sum=7", o.rank);
        assert!(
            o.status.success() && o.output.contains(&want),
            "{transport}/{mode}: rank {} ({}):\n{}",
            o.rank,
            o.status,
            o.output
        );
        eprintln!("{transport}/{mode}: {}", line_with(o, "SHRUNK").unwrap_or("no SHRUNK line"));
    }
}

#[test]
fn sigkill_one_of_4_then_shrink_and_all_reduce_on_the_3_survivors() {
    shrink_after_kill("shm", "default");
    shrink_after_kill("tcp", "abort");
}

#[test]
fn a_hung_rank_is_shrunk_away_with_abort_mode_from_a_watchdog() {
    let dir = scratch("shrink-hung");
    let go = dir.join("go");
    let spawn = Spawn { capture_stdout: true, capture_stderr: true, ..spawn("shm") };
    let args = ["shrink-hung".to_string(), "1".into(), go.display().to_string()];
    let job = Job::spawn(worker(), &args, 4, &spawn).expect("start");
    job.wait_for_all("READY", Duration::from_secs(30)).expect("ranks ready");
    std::thread::sleep(Duration::from_millis(100));
    job.signal(1, libc::SIGSTOP).expect("stop rank 1");
    // The survivors now block in an all-reduce that rank 1 never joins.
    std::thread::sleep(Duration::from_millis(300));
    let start = Instant::now();
    std::fs::write(&go, b"go").expect("go file");
    let limit = Duration::from_secs(30);
    while !(0..4).filter(|&r| r != 1).all(|r| job.output(r).contains("OK rank=")) {
        assert!(
            start.elapsed() < limit,
            "survivors did not finish:\n{}",
            (0..4).map(|r| job.output(r)).collect::<String>()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let took = start.elapsed();
    job.signal(1, libc::SIGKILL).expect("kill rank 1");
    let outs = job.wait(Duration::from_secs(30)).expect("job ends");
    for o in outs.iter().filter(|o| o.rank != 1) {
        let new_rank = if o.rank == 0 { 0 } else { o.rank - 1 };
        let want = format!("OK rank={} new={new_rank}/3 sum=8", o.rank); // 1 + 3 + 4
        assert!(o.output.contains(&want), "rank {}:\n{}", o.rank, o.output);
        let failed = line_with(o, "FAILED")
            .unwrap_or_else(|| panic!("rank {}: the blocked call never returned:\n{}", o.rank, o.output));
        assert!(failed.contains("abort"), "rank {}: {failed}", o.rank);
    }
    eprintln!("hung rank shrunk away: survivors done {took:?} after the go");
    assert!(took < Duration::from_secs(5), "took {took:?}");
}

#[test]
fn non_blocking_init_reports_in_progress_then_ready() {
    let outs = run_job(3, &["nbinit", "400"], spawn("shm"), Duration::from_secs(60));
    assert_all_ok(&outs, "nbinit");
    // Rank 0 started 400 ms before rank 1, polling every ~1 ms meanwhile.
    let polls = |o: &RankOutput| -> usize {
        o.output
            .split("in_progress_polls=")
            .nth(1)
            .and_then(|t| t.split_whitespace().next())
            .and_then(|t| t.parse().ok())
            .unwrap_or(0)
    };
    assert!(polls(&outs[0]) >= 50, "rank 0 saw InProgress only {} times:\n{}", polls(&outs[0]), outs[0].output);
}

#[test]
fn non_blocking_init_errors_arrive_through_the_handle() {
    let id = UniqueId::new().expect("id");
    // Bad arguments fail at once.
    assert_eq!(
        Comm::init_rank_nonblocking(2, &id, 5, Config::default()).expect_err("rank 5").kind(),
        ErrorKind::InvalidArgument
    );
    // A stranger's secret fails in the background; poll and wait say why.
    let text = id.to_string();
    let i = "occl1-".len();
    let wrong: UniqueId =
        format!("{}{}{}", &text[..i], if &text[i..=i] == "0" { "1" } else { "0" }, &text[i + 1..]).parse().expect("id");
    let mut p = Comm::init_rank_nonblocking(2, &wrong, 0, Config::default()).expect("started");
    let start = Instant::now();
    let e = loop {
        match p.poll() {
            Ok(InitState::InProgress) => std::thread::sleep(Duration::from_millis(1)),
            Ok(InitState::Ready) => panic!("a stranger joined"),
            Err(e) => break e,
        }
        assert!(start.elapsed() < Duration::from_secs(10), "no verdict");
    };
    assert_eq!(e.kind(), ErrorKind::InvalidUsage, "{e}");
    assert_eq!(p.poll().expect_err("sticky").kind(), ErrorKind::InvalidUsage);
    assert_eq!(p.wait().expect_err("wait says it too").kind(), ErrorKind::InvalidUsage);
    // Two ranks in threads: one waits with a timeout while the other has not started.
    let mut a = Comm::init_rank_nonblocking(2, &id, 0, Config::default()).expect("rank 0");
    assert!(a.wait_timeout(Duration::from_millis(50)).expect("no error yet").is_none());
    let b = Comm::init_rank_nonblocking(2, &id, 1, Config::default()).expect("rank 1");
    let (ca, cb) = (a.wait().expect("rank 0 ready"), b.wait().expect("rank 1 ready"));
    std::thread::scope(|s| {
        for c in [&ca, &cb] {
            s.spawn(move || {
                let mut v = [c.rank() as i32 + 1; 8];
                c.all_reduce_in_place(&mut v, occl::RedOp::Sum).expect("all_reduce");
                assert_eq!(v, [3; 8]);
            });
        }
    });
}

#[test]
fn bad_shrink_and_split_input_is_invalid_usage() {
    let comms = Comm::init_all_with(3, Config::default()).expect("init_all");
    for c in &comms {
        let kind = |r: occl::Result<Comm>| r.expect_err("expected an error").kind();
        let e = c.shrink(&[7], ShrinkMode::Default).expect_err("out of range");
        assert_eq!(e.kind(), ErrorKind::InvalidUsage);
        assert!(e.to_string().contains("out of range"), "{e}");
        let e = c.shrink(&[c.rank()], ShrinkMode::Abort).expect_err("self");
        assert_eq!(e.kind(), ErrorKind::InvalidUsage);
        assert!(e.to_string().contains("excludes itself"), "{e}");
        let other = (c.rank() + 1) % 3;
        assert_eq!(kind(c.shrink(&[other, other], ShrinkMode::Default)), ErrorKind::InvalidUsage);
    }
    // The rejected calls (Abort mode among them: it validates before it aborts) left the
    // communicator usable: split all three (one with no colour), then use the parent.
    std::thread::scope(|s| {
        for c in &comms {
            s.spawn(move || {
                let color = if c.rank() == 2 { OCCL_SPLIT_NOCOLOR } else { 5 };
                let child = c.split(color, 0).expect("split");
                assert_eq!(child.is_some(), c.rank() != 2);
                if let Some(child) = child {
                    assert_eq!((child.rank(), child.nranks()), (c.rank(), 2));
                    let mut v = [1u32; 4];
                    child.all_reduce_in_place(&mut v, occl::RedOp::Sum).expect("child all_reduce");
                    assert_eq!(v, [2; 4]);
                }
                let mut v = [1u32; 4];
                c.all_reduce_in_place(&mut v, occl::RedOp::Sum).expect("parent all_reduce after split");
                assert_eq!(v, [3; 4]);
            });
        }
    });
}
