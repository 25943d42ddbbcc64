//! Trace files of real multi-process jobs, read by Holistic Trace Analysis itself: a 4-rank job
//! with `OCCL_TRACE_DIR` set runs six `ProfilerStep`s of collectives and a send/recv ring, rank 2
//! sleeping at the start of each step; `tests/hta/check_traces.py` runs HTA's temporal breakdown,
//! comm/comp overlap, kernel breakdown and straggler analysis on the directory, and this test
//! checks what it printed against what the job did.
//!
//! HTA comes from PyPI (`scripts/test.sh` installs the pinned version into `target/hta-venv`).
//! Without it the HTA test says it was skipped, and fails under CI (`CI` set).

mod common;

use common::{assert_all_ok, env, run_job, scratch};
use occl_tests::launch::Spawn;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// The version `scripts/test.sh` installs.
const HTA_VERSION: &str = "0.5.0";

fn ci() -> bool {
    std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "0" && v != "false")
}

/// A Python that imports HTA: `OCCL_HTA_PYTHON`, the test script's venv, or `python3`.
fn hta_python() -> Result<PathBuf, String> {
    let mut tried = Vec::new();
    let mut candidates: Vec<PathBuf> = std::env::var_os("OCCL_HTA_PYTHON").map(PathBuf::from).into_iter().collect();
    candidates.push(Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/hta-venv/bin/python"));
    candidates.push("python3".into());
    for c in candidates {
        match Command::new(&c).args(["-c", "import hta.trace_analysis"]).output() {
            Ok(o) if o.status.success() => return Ok(c),
            Ok(o) => tried.push(format!(
                "{}: {}",
                c.display(),
                String::from_utf8_lossy(&o.stderr).lines().last().unwrap_or("")
            )),
            Err(e) => tried.push(format!("{}: {e}", c.display())),
        }
    }
    Err(tried.join("; "))
}

/// The trace files of a directory (temporary files excluded).
fn trace_files(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("trace dir")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("occl-trace-")))
        .collect();
    v.sort();
    v
}

/// `key=value` from a line of words.
fn field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    line.split_whitespace().find_map(|w| w.strip_prefix(key)?.strip_prefix('='))
}

/// The lines starting with `word `.
fn lines<'a>(out: &'a str, word: &str) -> Vec<&'a str> {
    out.lines().filter(|l| l.split_whitespace().next() == Some(word)).collect()
}

#[test]
fn hta_reads_a_four_rank_job_and_names_the_slow_rank() {
    let python = match hta_python() {
        Ok(p) => p,
        Err(why) if ci() => {
            panic!("HolisticTraceAnalysis {HTA_VERSION} is not installed ({why}); scripts/test.sh installs it")
        }
        Err(why) => {
            eprintln!(
                "SKIPPED hta_reads_a_four_rank_job_and_names_the_slow_rank: HolisticTraceAnalysis is not installed \
                 ({why}); run scripts/test.sh or pip install HolisticTraceAnalysis=={HTA_VERSION}"
            );
            return;
        }
    };
    let (nranks, steps, slow) = (4usize, 6usize, 2usize);
    let dir = scratch("trace-hta");
    let d = dir.to_string_lossy().into_owned();
    let spawn = Spawn { env: env(&[("OCCL_TRACE_DIR", &d), ("OCCL_TRACE_GZIP", "1")]), ..Spawn::default() };
    let outs =
        run_job(nranks, &["trace", &steps.to_string(), &slow.to_string(), "40"], spawn, Duration::from_secs(120));
    assert_all_ok(&outs, "trace job");
    let ok = outs[0].output.lines().find(|l| l.starts_with("OK rank=")).expect("OK line");
    let per_step: usize = field(ok, "per_step").and_then(|v| v.parse().ok()).expect("per_step");
    let collectives: usize = field(ok, "collectives").and_then(|v| v.parse().ok()).expect("collectives");
    assert_eq!(collectives, per_step * steps);

    // One gzip file per rank, named with its rank.
    let files = trace_files(&dir);
    assert_eq!(files.len(), nranks, "{files:?}");
    for r in 0..nranks {
        assert!(
            files.iter().any(|f| {
                let n = f.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
                n.starts_with(&format!("occl-trace-rank{r}-")) && n.ends_with(".json.gz")
            }),
            "no file for rank {r}: {files:?}"
        );
    }

    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("hta/check_traces.py");
    let o = Command::new(&python).arg(&script).arg(&dir).output().expect("run python");
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "check_traces.py failed ({}):\n{out}\n{err}", o.status);
    let ctx = format!("HTA output:\n{out}");

    assert_eq!(lines(&out, "ranks"), ["ranks 0 1 2 3"], "{ctx}");
    // Temporal breakdown: every rank, all time in (communication) kernels or idle, no compute.
    let tb = lines(&out, "temporal");
    assert_eq!(tb.len(), nranks, "{ctx}");
    for l in &tb {
        assert_eq!(field(l, "compute_us"), Some("0"), "{ctx}");
        assert!(field(l, "non_compute_us").and_then(|v| v.parse::<u64>().ok()).is_some_and(|v| v > 0), "{ctx}");
    }
    // The slow rank idles while it sleeps (about 40 ms per step); the others wait inside their
    // collectives instead.
    let idle = |r: usize| {
        tb.iter()
            .find(|l| field(l, "rank") == Some(&r.to_string()))
            .and_then(|l| field(l, "idle_us")?.parse::<u64>().ok())
    };
    let slow_idle = idle(slow).expect("slow rank's idle time");
    assert!(slow_idle >= 4 * 30_000, "slow rank idle {slow_idle} us; {ctx}");
    for r in (0..nranks).filter(|&r| r != slow) {
        assert!(idle(r).is_some_and(|i| i < slow_idle / 2), "rank {r} idles as long as the slow one; {ctx}");
    }
    // Comm/comp overlap: computed for every rank (0: there are no compute kernels).
    let ov = lines(&out, "overlap");
    assert_eq!(ov.len(), nranks, "{ctx}");
    assert!(ov.iter().all(|l| field(l, "pct").is_some_and(|p| p.parse::<f64>() == Ok(0.0))), "{ctx}");
    // Kernel breakdown: all kernel time is communication, under NCCL-style names.
    let kt = lines(&out, "kernel_type");
    assert_eq!(kt.len(), 1, "{ctx}");
    assert!(kt[0].starts_with("kernel_type COMMUNICATION ") && field(kt[0], "pct") == Some("100.0"), "{ctx}");
    let names = lines(&out, "kernel_breakdown_comm_names");
    for want in [
        "ncclKernel_AllReduce_RING_SIMPLE_f32",
        "ncclKernel_AllGather_",
        "ncclKernel_Broadcast_",
        "ncclKernel_Send_f32",
        "ncclKernel_Recv_f32",
    ] {
        assert!(names.first().is_some_and(|l| l.contains(want)), "{want} missing; {ctx}");
    }
    // HTA's own rows: by default it keeps the kernels whose call lies before the last step's
    // start (the correlation rule), i.e. all steps but the last, each in its iteration.
    let ck = lines(&out, "comm_kernels");
    assert_eq!(ck.len(), nranks, "{ctx}");
    let iters: Vec<String> = (1..steps).map(|i| i.to_string()).collect();
    for l in &ck {
        assert_eq!(field(l, "count"), Some((per_step * (steps - 1)).to_string().as_str()), "{l}; {ctx}");
        assert!(l.ends_with(&format!("iterations=[{}]", iters.join(", "))), "{l}; {ctx}");
    }
    assert_eq!(lines(&out, "profiler_steps"), [format!("profiler_steps {}", iters.join(" "))], "{ctx}");
    // Straggler analysis names the rank that slept.
    assert_eq!(lines(&out, "stragglers"), [format!("stragglers {slow}")], "{ctx}");
    // With the last step included, HTA counts every collective and send/recv the job ran.
    let all = lines(&out, "comm_kernels_all");
    assert_eq!(all.len(), nranks, "{ctx}");
    for l in &all {
        assert_eq!(field(l, "count"), Some(collectives.to_string().as_str()), "{l}; {ctx}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_job_that_exits_without_destroying_its_communicator_still_writes_its_traces() {
    let dir = scratch("trace-exit");
    let d = dir.to_string_lossy().into_owned();
    let spawn = Spawn { env: env(&[("OCCL_TRACE_DIR", &d), ("OCCL_TRACE_PROXY", "steps")]), ..Spawn::default() };
    let outs = run_job(2, &["trace", "2", "9", "0", "exit"], spawn, Duration::from_secs(60));
    assert_all_ok(&outs, "trace job");
    let files = trace_files(&dir);
    assert_eq!(files.len(), 2, "{files:?}");
    let mut ranks = Vec::new();
    for f in &files {
        let v: Value = serde_json::from_str(&std::fs::read_to_string(f).expect("read")).expect("JSON");
        ranks.push(v["distributedInfo"]["rank"].as_i64().expect("rank"));
        let ev = v["traceEvents"].as_array().expect("events");
        let count = |cat: &str| ev.iter().filter(|e| e["cat"] == cat).count();
        // 2 steps × 6 operations; each with its call row.
        assert_eq!((count("kernel"), count("cuda_runtime"), count("user_annotation")), (12, 12, 2), "{}", f.display());
        assert!(count("occl_proxy") > 0 && count("occl_proxy_step") > count("occl_proxy"), "{}", f.display());
        assert_eq!(v["occl"]["events_dropped"], 0);
    }
    ranks.sort_unstable();
    assert_eq!(ranks, [0, 1]);
    let _ = std::fs::remove_dir_all(&dir);
}
