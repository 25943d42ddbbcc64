//! The flight recorder in real jobs: a rank that times out dumps its last operations with the
//! one it is stuck in; a running rank dumps on SIGUSR1 and keeps running; bad settings are
//! refused with the variable named.

mod common;

use common::{env, run_job, scratch, worker};
use occl_tests::launch::{Job, Spawn};
use serde_json::Value;
use std::io::Write as _;
use std::path::Path;
use std::time::{Duration, Instant};

fn dumps(dir: &Path) -> Vec<Value> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).expect("read dir") {
        let p = e.expect("entry").path();
        if p.extension().is_some_and(|x| x == "json") {
            let text = std::fs::read_to_string(&p).expect("read dump");
            out.push(serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", p.display())));
        }
    }
    out
}

/// A 2-rank job running all-reduces in a loop with `vars` set, past its first operations.
fn looping_job(vars: &[(&str, &str)]) -> Job {
    let spawn = Spawn { env: env(vars), capture_stdout: true, capture_stderr: true, ..Spawn::default() };
    let job = Job::spawn(worker(), &["loop".to_string()], 2, &spawn).expect("start job");
    job.wait_for_all("READY", Duration::from_secs(30)).expect("ranks ready");
    std::thread::sleep(Duration::from_millis(300));
    job
}

#[test]
fn a_timeout_dumps_the_operation_each_rank_is_stuck_in() {
    let dir = scratch("flight-timeout");
    let d = dir.to_string_lossy().to_string();
    let spawn = Spawn { env: env(&[("OCCL_TIMEOUT", "1"), ("OCCL_FLIGHT_RECORDER_DIR", &d)]), ..Spawn::default() };
    // Rank 1 comes 4 s late to the all-reduce: ranks 0 and 2 fail (timeout, or the remote
    // error that names it) and dump.
    let _ = run_job(3, &["late", "4000"], spawn, Duration::from_secs(60));
    let docs = dumps(&dir);
    let waiting: Vec<&Value> = docs.iter().filter(|v| v["comm"]["rank"] != 1).collect();
    assert!(waiting.len() >= 2, "ranks 0 and 2 dumped: {docs:?}");
    for v in &waiting {
        let reason = v["reason"].as_str().unwrap_or_default();
        assert!(reason.starts_with("timeout: ") || reason.starts_with("error: "), "{reason}");
        assert_eq!(v["comm"]["nranks"], 3);
        let last = v["entries"].as_array().and_then(|e| e.last()).expect("an entry");
        assert_eq!(last["op"], "AllReduce");
        assert_eq!(last["state"], "failed", "{last}");
        assert!(last["error"].as_str().is_some_and(|e| !e.is_empty()));
        assert_eq!(last["count"], 1 << 16);
        assert_eq!(last["dtype"], "ncclFloat32");
        assert!(last["duration_ns"].as_u64().unwrap_or(0) >= 900_000_000, "waited about OCCL_TIMEOUT: {last}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn sigusr1_dumps_a_running_job_without_stopping_it() {
    let dir = scratch("flight-usr1");
    let d = dir.to_string_lossy().to_string();
    let job = looping_job(&[
        ("OCCL_FLIGHT_RECORDER_DIR", &d),
        ("OCCL_FLIGHT_RECORDER_SIZE", "64"),
        ("OCCL_FLIGHT_RECORDER_SIGNAL", "SIGUSR1"),
    ]);
    job.signal(1, libc::SIGUSR1).expect("signal rank 1");
    let t = Instant::now();
    let doc = loop {
        if let Some(v) = dumps(&dir).into_iter().next() {
            break v;
        }
        assert!(t.elapsed() < Duration::from_secs(10), "no dump 10 s after SIGUSR1");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(doc["reason"], "SIGUSR1");
    assert_eq!(doc["comm"]["rank"], 1);
    assert_eq!(doc["capacity"], 64);
    let entries = doc["entries"].as_array().expect("entries");
    assert_eq!(entries.len(), 64, "a full ring of the last 64 operations");
    assert!(doc["recorded"].as_u64().unwrap_or(0) > 64);
    // Consecutive sequence numbers, the same operation, completed (the newest may be running).
    for w in entries.windows(2) {
        assert_eq!(w[1]["seq"].as_u64(), w[0]["seq"].as_u64().map(|s| s + 1));
    }
    assert!(entries.iter().all(|e| e["op"] == "AllReduce"));
    assert!(entries[..62].iter().all(|e| e["state"] == "completed"));
    // Both ranks are still running: SIGUSR1 did not terminate anyone.
    std::thread::sleep(Duration::from_millis(200));
    job.signal(0, libc::SIGKILL).expect("kill rank 0");
    let outs = job.wait(Duration::from_secs(30)).expect("job ends");
    assert!(
        outs[1].output.contains("ERR kind=RemoteError"),
        "rank 1 kept running until rank 0 died:\n{}",
        outs[1].output
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bad_flight_recorder_settings_are_refused_by_name() {
    for (var, val) in [("OCCL_FLIGHT_RECORDER_SIZE", "12k"), ("OCCL_FLIGHT_RECORDER_SIZE", "99999999")] {
        let spawn = Spawn { env: env(&[(var, val)]), ..Spawn::default() };
        let outs = run_job(2, &["matrix", "sizes=8"], spawn, Duration::from_secs(30));
        for o in &outs {
            assert!(!o.status.success(), "rank {} started with {var}={val}", o.rank);
            assert!(o.output.contains(var) && o.output.contains("InvalidArgument"), "rank {}: {}", o.rank, o.output);
        }
    }
}

/// The reported attack: another user who can write a shared dump directory learns a rank's comm
/// hash, rank and pid (RAS publishes them), plants symlinks at every temporary name the next
/// SIGUSR1 dump could use and at the dump's final name, each pointing at a file of the victim's.
/// The dump must follow none of them and come out as an owner-only file of its own.
#[test]
fn a_sigusr1_dump_follows_no_planted_symlink() {
    use std::os::unix::fs::{symlink, PermissionsExt};
    let dir = scratch("flight-symlink");
    let d = dir.to_string_lossy().to_string();
    let spawn = Spawn {
        env: env(&[
            ("OCCL_FLIGHT_RECORDER_DIR", &d),
            ("OCCL_FLIGHT_RECORDER_SIZE", "16"),
            ("OCCL_FLIGHT_RECORDER_SIGNAL", "SIGUSR1"),
        ]),
        capture_stdout: true,
        capture_stderr: true,
        ..Spawn::default()
    };
    let job = Job::spawn(worker(), &["idle".to_string()], 2, &spawn).expect("start job");
    job.wait_for_all("READY", Duration::from_secs(30)).expect("ranks ready");
    let pid = job.children[1].id();
    // A first dump shows the name (the comm hash); the attacker then owns the directory's names.
    job.signal(1, libc::SIGUSR1).expect("signal rank 1");
    let wait_for = |what: &str, done: &dyn Fn() -> bool| {
        let t = Instant::now();
        while !done() {
            assert!(t.elapsed() < Duration::from_secs(10), "{what}: not within 10 s");
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    let first = || {
        std::fs::read_dir(&dir)
            .expect("dir")
            .filter_map(|e| e.ok().map(|e| e.path()))
            .find(|p| p.extension().is_some_and(|x| x == "json"))
    };
    wait_for("the first dump", &|| first().is_some());
    let path = first().expect("first dump");
    let name = path.file_name().expect("name").to_string_lossy().into_owned();
    assert!(name.ends_with(&format!("_r1_{pid}.json")), "{name}");
    let (victim, victim_final) = (dir.join("victim"), dir.join("victim-final"));
    std::fs::write(&victim, "root-owned").expect("victim");
    std::fs::write(&victim_final, "root-owned too").expect("victim");
    for n in 0..256 {
        symlink(&victim, dir.join(format!(".{name}.{pid}.{n}.tmp"))).expect("plant");
    }
    std::fs::remove_file(&path).expect("remove the first dump");
    symlink(&victim_final, &path).expect("plant at the final name");
    job.signal(1, libc::SIGUSR1).expect("signal rank 1 again");
    let untouched = |p: &Path, text: &str| std::fs::read_to_string(p).is_ok_and(|t| t == text);
    wait_for("the second dump", &|| {
        std::fs::symlink_metadata(&path).is_ok_and(|m| m.file_type().is_file())
            || !untouched(&victim, "root-owned")
            || !untouched(&victim_final, "root-owned too")
    });
    assert!(untouched(&victim, "root-owned"), "the dump wrote through a symlink at its temporary name");
    assert!(untouched(&victim_final, "root-owned too"), "the dump wrote through a symlink at its final name");
    let meta = std::fs::symlink_metadata(&path).expect("dump");
    assert_eq!(meta.permissions().mode() & 0o777, 0o600, "the dump is readable by its owner only");
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(&path).expect("read")).expect("JSON");
    assert_eq!((doc["reason"].as_str(), doc["comm"]["rank"].as_u64()), (Some("SIGUSR1"), Some(1)));
    for r in 0..2 {
        job.signal(r, libc::SIGKILL).expect("kill");
    }
    let _ = job.wait(Duration::from_secs(30));
    let _ = std::fs::remove_dir_all(&dir);
}

/// `GET /api/v1/flight-recorder` on the RAS port: the record of every rank of the node, each in its own process
/// (the port's owner asks the other over its node socket), read without a signal or a dump directory; `?job=` picks
/// the job. Operations have nanosecond times, so a sub-millisecond all-reduce has a duration. SIGUSR1 is not taken
/// without `OCCL_FLIGHT_RECORDER_SIGNAL`: it ends the rank as the signal's default does.
#[test]
fn the_ras_port_serves_every_local_ranks_flight_record_and_sigusr1_stays_the_applications() {
    let port = occl_tests::ras_client::free_port();
    let job = looping_job(&[
        ("OCCL_RAS_ADDR", &format!("127.0.0.1:{port}")),
        ("OCCL_FLIGHT_RECORDER_SIZE", "32"),
        ("OCCL_JOB_ID", "fr-node"),
    ]);
    let mut pids: Vec<u64> = job.children.iter().map(|c| u64::from(c.id())).collect();
    pids.sort_unstable();
    // The job loops from its start; read until both rings of 32 have filled (bounded).
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let doc: Value = loop {
        let (code, body) = common::prometheus::get(port, "/api/v1/flight-recorder?job=fr-node").unwrap_or_default();
        assert_eq!(code, 200, "{body}");
        let doc: Value = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"));
        let procs = doc["processes"].as_array().cloned().unwrap_or_default();
        let filled = procs.len() == 2
            && procs.iter().all(|p| p["records"][0]["entries"].as_array().is_some_and(|e| e.len() == 32));
        if filled || std::time::Instant::now() > deadline {
            break doc;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let procs = doc["processes"].as_array().expect("processes");
    let got: Vec<u64> = procs.iter().filter_map(|p| p["pid"].as_u64()).collect();
    assert_eq!(got, pids, "both processes of the job, by pid: {doc}");
    let mut ranks = Vec::new();
    for p in procs {
        assert_eq!(p["job"], "fr-node");
        let records = p["records"].as_array().unwrap_or_else(|| panic!("records: {p}"));
        assert_eq!(records.len(), 1, "one communicator rank in each process");
        let rec = &records[0];
        assert_eq!((&rec["reason"], &rec["pid"]), (&Value::from("http"), &p["pid"]));
        assert_eq!(rec["comm"]["nranks"], 2);
        ranks.push(rec["comm"]["rank"].as_u64().expect("rank"));
        let entries = rec["entries"].as_array().expect("entries");
        assert_eq!(entries.len(), 32, "a full ring");
        let done: Vec<u64> =
            entries.iter().filter(|e| e["state"] == "completed").filter_map(|e| e["duration_ns"].as_u64()).collect();
        assert!(done.len() >= 30, "{entries:?}");
        assert!(done.iter().all(|d| *d > 0), "nanosecond times: no completed operation lasts 0 ns: {done:?}");
        assert!(done.iter().any(|d| d % 1_000_000 != 0), "times finer than a millisecond: {done:?}");
    }
    ranks.sort_unstable();
    assert_eq!(ranks, [0, 1], "every local rank's record");
    let (code, all) = common::prometheus::get(port, "/api/v1/flight-recorder").unwrap_or_default();
    assert_eq!(code, 200, "{all}");
    let all: Value = serde_json::from_str(&all).expect("JSON");
    assert_eq!(all["processes"].as_array().map(Vec::len), Some(2), "without ?job=, every job's: {all}");
    let (code, body) = common::prometheus::get(port, "/api/v1/flight-recorder?job=nope").unwrap_or_default();
    assert_eq!(code, 404, "{body}");
    assert!(body.contains("No job nope") && body.contains("fr-node"), "{body}");

    // No dump directory and no OCCL_FLIGHT_RECORDER_SIGNAL: SIGUSR1 keeps its default action.
    job.signal(1, libc::SIGUSR1).expect("signal rank 1");
    let outs = job.wait(Duration::from_secs(30)).expect("job ends");
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(outs[1].status.signal(), Some(libc::SIGUSR1), "rank 1 ended by SIGUSR1: {}", outs[1].output);
}

/// Two jobs share the node's RAS port: the flight-recorder route lists all four ranks' processes by job, and
/// `?job=` gives one job's two, whichever process owns the port.
#[test]
fn two_jobs_on_one_port_each_get_their_own_flight_records() {
    let port = occl_tests::ras_client::free_port();
    let addr = format!("127.0.0.1:{port}");
    let a = looping_job(&[("OCCL_RAS_ADDR", &addr), ("OCCL_FLIGHT_RECORDER_SIZE", "8"), ("OCCL_JOB_ID", "fr-a")]);
    let b = looping_job(&[("OCCL_RAS_ADDR", &addr), ("OCCL_FLIGHT_RECORDER_SIZE", "8"), ("OCCL_JOB_ID", "fr-b")]);
    let pids = |j: &Job| {
        let mut v: Vec<u64> = j.children.iter().map(|c| u64::from(c.id())).collect();
        v.sort_unstable();
        v
    };
    let get = |path: &str| -> Value {
        let (code, body) = common::prometheus::get(port, path).unwrap_or_default();
        assert_eq!(code, 200, "{path}: {body}");
        serde_json::from_str(&body).unwrap_or_else(|e| panic!("{path}: {e}: {body}"))
    };
    let by_job = |doc: &Value, job: &str| -> Vec<u64> {
        let procs = doc["processes"].as_array().cloned().unwrap_or_default();
        procs.iter().filter(|p| p["job"] == job).filter_map(|p| p["pid"].as_u64()).collect()
    };
    // Both jobs' processes register with the port's owner as they start (bounded).
    let deadline = Instant::now() + Duration::from_secs(30);
    let all = loop {
        let all = get("/api/v1/flight-recorder");
        if (by_job(&all, "fr-a").len(), by_job(&all, "fr-b").len()) == (2, 2) || Instant::now() > deadline {
            break all;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!((by_job(&all, "fr-a"), by_job(&all, "fr-b")), (pids(&a), pids(&b)), "every process by job: {all}");
    for p in all["processes"].as_array().expect("processes") {
        let rec = &p["records"][0];
        assert_eq!((&rec["pid"], &rec["comm"]["nranks"]), (&p["pid"], &Value::from(2)), "{p}");
    }
    for (job, want) in [("fr-a", pids(&a)), ("fr-b", pids(&b))] {
        let one = get(&format!("/api/v1/flight-recorder?job={job}"));
        let procs = one["processes"].as_array().expect("processes");
        assert!(procs.iter().all(|p| p["job"] == job), "?job={job} gives that job only: {one}");
        assert_eq!(by_job(&one, job), want);
    }
    for j in [a, b] {
        for r in 0..2 {
            j.signal(r, libc::SIGKILL).expect("kill");
        }
        let _ = j.wait(Duration::from_secs(30));
    }
}

fn ci() -> bool {
    std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "0" && v != "false")
}

/// The directory that holds PyTorch's `torch/distributed/flight_recorder` package (from PyPI's torch 2.11.0
/// wheel, which `scripts/test.sh` unpacks into `target/torch-fr` and names in `OCCL_TORCHFR_PATH`), if any.
fn torch_analyzer() -> Option<std::path::PathBuf> {
    let candidates = std::env::var_os("OCCL_TORCHFR_PATH")
        .map(std::path::PathBuf::from)
        .into_iter()
        .chain([Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/torch-fr")]);
    candidates.into_iter().find(|d| d.join("torch/distributed/flight_recorder/fr_trace.py").is_file())
}

/// `torchfrtrace DIR`: PyTorch's own analyzer (`torch.distributed.flight_recorder.fr_trace:main`, the console
/// script's target), run from the unpacked package; its stdout and stderr together.
fn torchfrtrace(pkg: &Path, dir: &Path) -> String {
    let out = std::process::Command::new("python3")
        .args(["-c", "import sys; from torch.distributed.flight_recorder.fr_trace import main; sys.exit(main())"])
        .arg(dir)
        .env("PYTHONPATH", pkg)
        .output()
        .expect("run python3");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "torchfrtrace failed ({}):\n{text}", out.status);
    text
}

/// Waits (bounded) until `dir` holds `name`.
fn wait_for_file(dir: &Path, name: &str, within: Duration) {
    let t = Instant::now();
    while !dir.join(name).is_file() {
        let have: Vec<_> =
            std::fs::read_dir(dir).map(|d| d.flatten().map(|e| e.file_name()).collect()).unwrap_or_default();
        assert!(t.elapsed() < within, "{name} not in {} within {within:?}: {have:?}", dir.display());
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A hung 3-rank job: rank 1 stops after 5 all-reduces, ranks 0 and 2 wait in the 6th, time out and dump; rank
/// 1 dumps on request (SIGUSR1). PyTorch's Flight Recorder analyzer, run for real on the directory, reads the
/// three ranks' PyTorch-layout dumps and names rank 1 as the one missing from collective 6.
#[test]
fn torchfrtrace_names_the_rank_missing_from_a_collective() {
    let Some(pkg) = torch_analyzer() else {
        let why = "PyTorch's flight_recorder package is not unpacked (scripts/test.sh fetches torch 2.11.0 from PyPI \
                   into target/torch-fr; the download failed or the script was not run)";
        assert!(!ci(), "{why}");
        // Straight to the stream, past the test harness's capture: a skip must be seen.
        let _ = writeln!(std::io::stderr(), "SKIPPED torchfrtrace_names_the_rank_missing_from_a_collective: {why}");
        return;
    };
    let dir = scratch("flight-torch");
    let d = dir.to_string_lossy().to_string();
    let spawn = Spawn {
        env: env(&[
            ("OCCL_TIMEOUT", "2"),
            ("OCCL_FLIGHT_RECORDER_DIR", &d),
            ("OCCL_FLIGHT_RECORDER_SIGNAL", "SIGUSR1"),
        ]),
        capture_stdout: true,
        capture_stderr: true,
        ..Spawn::default()
    };
    let job = Job::spawn(worker(), &["hang".to_string(), "1".to_string()], 3, &spawn).expect("start job");
    job.wait_for_all("READY", Duration::from_secs(30)).expect("ranks ready");
    // The communicator's hash names the files; the failing ranks' JSON dumps carry it.
    let t = Instant::now();
    let hash = loop {
        if let Some(h) = dumps(&dir).iter().find_map(|v| v["comm"]["hash"].as_str().map(str::to_owned)) {
            break h;
        }
        assert!(t.elapsed() < Duration::from_secs(30), "no rank dumped within 30 s of the hang");
        std::thread::sleep(Duration::from_millis(50));
    };
    for r in [0, 2] {
        wait_for_file(&dir, &format!("occl_fr_{hash}_rank_{r}"), Duration::from_secs(30));
    }
    job.signal(1, libc::SIGUSR1).expect("signal rank 1");
    wait_for_file(&dir, &format!("occl_fr_{hash}_rank_1"), Duration::from_secs(10));
    job.signal(1, libc::SIGKILL).expect("end rank 1");
    let _ = job.wait(Duration::from_secs(30));

    let out = torchfrtrace(&pkg, &dir);
    println!("{out}");
    assert!(out.contains("Not all ranks joining collective, sequence number: 6"), "{out}");
    assert!(out.contains("missing ranks: {1}"), "{out}");
    assert!(out.contains("collective: nccl:all_reduce"), "{out}");
    assert!(out.contains(&format!("group info: {hash}")), "{out}");
    let _ = std::fs::remove_dir_all(&dir);
}
