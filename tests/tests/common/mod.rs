//! Helpers shared by the integration test files.
#![allow(dead_code)]

use occl_tests::launch::{Job, RankOutput, Spawn};
use std::path::Path;
use std::time::Duration;

pub fn worker() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_occl-test-worker"))
}

pub fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

/// Runs `occl-test-worker args…` as an n-rank job and returns every rank's output.
pub fn run_job(nranks: usize, args: &[&str], spawn: Spawn, limit: Duration) -> Vec<RankOutput> {
    let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    let spawn = Spawn { capture_stdout: true, capture_stderr: true, ..spawn };
    let job = Job::spawn(worker(), &args, nranks, &spawn).expect("start job");
    job.wait(limit).expect("job finishes")
}

/// Asserts every rank exited 0 and printed an OK line.
pub fn assert_all_ok(outs: &[RankOutput], what: &str) {
    for o in outs {
        assert!(
            o.status.success() && o.output.contains("OK rank="),
            "{what}: rank {} failed ({}):\n{}",
            o.rank,
            o.status,
            o.output
        );
    }
}

/// The `ERR kind=…` a rank printed, if any, with its `at_ns` timestamp.
pub fn err_of(o: &RankOutput) -> Option<(String, u128, String)> {
    let line = o.output.lines().find(|l| l.starts_with("ERR kind="))?;
    let kind = line.strip_prefix("ERR kind=")?.split_whitespace().next()?.to_string();
    let at = line.split("at_ns=").nth(1)?.split_whitespace().next()?.parse().ok()?;
    Some((kind, at, line.to_string()))
}

/// A fresh, empty directory under the temp dir for one test (`occl-<tag>-<pid>`).
pub fn scratch(tag: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("occl-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("scratch dir");
    d
}
/// The occl files in /dev/shm of processes `pids`: FIFO segments end in their sender's pid
/// (`occl-<tag>-<pid>`); files named `occl-<…>-<pid>-<n>` count too.
pub fn shm_files_of(pids: &[u32]) -> Vec<String> {
    std::fs::read_dir("/dev/shm")
        .expect("read /dev/shm")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| {
            n.starts_with("occl-")
                && pids.iter().any(|p| n.ends_with(&format!("-{p}")) || n.contains(&format!("-{p}-")))
        })
        .collect()
}

pub mod netns;
pub mod prometheus;
