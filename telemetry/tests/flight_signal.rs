//! SIGUSR1 dumps every live flight recorder: a real child process (this test binary, run again
//! in the child role) gets a real signal.

use occl_telemetry::flight::{self, FlightComm, FlightRecorder, OpInfo, DIR_ENV};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Set in the child's environment; the child test does nothing without it.
const CHILD_ENV: &str = "OCCL_FLIGHT_SIGNAL_TEST_CHILD";
const READY: &str = "OCCL_FLIGHT_CHILD_READY";
const HASH: u64 = 0x5eed_0000_0000_0042;

fn op(seq: u64, name: &'static str) -> OpInfo {
    OpInfo {
        seq,
        coll_seq: seq,
        op: name,
        dtype: "ncclBfloat16",
        redop: Some("ncclSum"),
        count: 1024,
        in_bytes: 2048,
        out_bytes: 2048,
        root_or_peer: None,
        algo: "RING",
        proto: "LL",
    }
}

/// The child role: one recorder with an operation in flight, the SIGUSR1 thread installed from
/// the environment, then "ready" and a bounded sleep (the parent kills it).
#[test]
fn flight_signal_child() {
    if std::env::var_os(CHILD_ENV).is_none() {
        return;
    }
    let comm = FlightComm {
        comm_hash: HASH,
        rank: 5,
        nranks: 8,
        pid: std::process::id(),
        host: "child-host".into(),
        comm_name: None,
    };
    let rec = FlightRecorder::new(comm, 16);
    let a = rec.enqueue(&op(1, "AllReduce"), 1_000);
    rec.started(a, 1_100);
    rec.completed(a, 1_500);
    let b = rec.enqueue(&op(2, "AllGather"), 2_000);
    rec.started(b, 2_100);
    let dir = flight::install_from_env().expect("install").expect("OCCL_FLIGHT_RECORDER_DIR is set");
    println!("{READY} {}", dir.display());
    std::thread::sleep(Duration::from_secs(60));
    drop(rec);
}

fn send_sigusr1(child: &Child) {
    let pid = libc::pid_t::try_from(child.id()).expect("a pid fits pid_t");
    // SAFETY: kill(2) with a pid we spawned and a valid signal number.
    let rc = unsafe { libc::kill(pid, libc::SIGUSR1) };
    assert_eq!(rc, 0, "kill: {}", std::io::Error::last_os_error());
}

fn wait_for_file(path: &Path, deadline: Instant) -> String {
    loop {
        if let Ok(text) = std::fs::read_to_string(path) {
            return text;
        }
        assert!(Instant::now() < deadline, "no dump at {}", path.display());
        std::thread::sleep(Duration::from_millis(20));
    }
}

struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn sigusr1_dumps_live_recorders() {
    if std::env::var_os(CHILD_ENV).is_some() {
        return;
    }
    let dir: PathBuf = std::env::temp_dir().join(format!("occl-flight-signal-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let exe = std::env::current_exe().unwrap();
    let child = Command::new(exe)
        .args(["--exact", "flight_signal_child", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, "1")
        .env(DIR_ENV, &dir)
        .env(occl_telemetry::flight::SIGNAL_ENV, "SIGUSR1")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut child = KillOnDrop(child);
    let pid = child.0.id();
    let stdout = child.0.stdout.take().unwrap();
    let mut lines = BufReader::new(stdout).lines();
    loop {
        let line = lines.next().expect("child exited before it was ready").unwrap();
        if line.contains(READY) {
            break;
        }
    }
    let path = dir.join(format!("occl_flight_{HASH:016x}_r5_{pid}.json"));
    assert!(!path.exists());

    send_sigusr1(&child.0);
    let text = wait_for_file(&path, Instant::now() + Duration::from_secs(30));
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["reason"], "SIGUSR1");
    assert_eq!(v["pid"], pid);
    assert_eq!(v["host"], "child-host");
    assert_eq!(v["comm"]["hash"], format!("{HASH:016x}"));
    assert_eq!((v["comm"]["rank"].as_u64(), v["comm"]["nranks"].as_u64()), (Some(5), Some(8)));
    let entries = v["entries"].as_array().unwrap();
    assert_eq!(entries.len(), 2);
    assert_eq!((&entries[0]["op"], &entries[0]["state"]), (&"AllReduce".into(), &"completed".into()));
    assert_eq!(v["in_flight"]["op"], "AllGather");
    assert_eq!(v["in_flight"]["state"], "started");
    assert_eq!(v["in_flight"]["t_started_ns"], 2_100);
    assert_eq!(v["status"]["last_completed_collective"], 1);

    // The signal no longer terminates the process, and a second one dumps again.
    let first_time = v["dump_time_ns"].as_u64().unwrap();
    assert!(child.0.try_wait().unwrap().is_none(), "SIGUSR1 killed the child");
    send_sigusr1(&child.0);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let v: serde_json::Value = serde_json::from_str(&wait_for_file(&path, deadline)).unwrap();
        if v["dump_time_ns"].as_u64().unwrap() > first_time {
            break;
        }
        assert!(Instant::now() < deadline, "second SIGUSR1 wrote no new dump");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(child.0.try_wait().unwrap().is_none());
    drop(child);
    let left: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(left.len(), 2, "only the dump (JSON and PyTorch's layout), no temporary file: {left:?}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_dump_directory_alone_leaves_sigusr1_to_the_application() {
    let dir = std::env::temp_dir().join(format!("occl-flight-nosig-{}", std::process::id()));
    let config = flight::FlightConfig { capacity: 4, dir: Some(dir.clone()), signal: false };
    assert_eq!(flight::install_config(&config).unwrap(), Some(dir));
    // SAFETY: sigaction with a null new action only reads the current one into `old`.
    let handler = unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        assert_eq!(libc::sigaction(libc::SIGUSR1, std::ptr::null(), &mut old), 0);
        old.sa_sigaction
    };
    assert_eq!(handler, libc::SIG_DFL, "SIGUSR1 keeps its default action");
}
