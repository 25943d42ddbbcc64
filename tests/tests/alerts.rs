//! A crash is an alert, not a silence: a 2-rank job with a RAS port, scraped by a real Prometheus running the
//! committed alert rules (`for:` scaled to seconds); one rank is killed, the other fails on it and exits, the port
//! closes. `JobTargetDown` must fire within scrape interval + its `for` + 10 s, naming the job and the node, and the
//! surviving rank's flight record must be in `OCCL_FLIGHT_RECORDER_DIR` with the reason, the dead peer and the
//! operation. A job that ends normally closes its port too, and must not fire it.
//!
//! `prometheus` is required (scripts/test.sh installs Debian's package): without it the test prints SKIPPED (and
//! fails under CI).

mod common;

use common::prometheus::{tool, Prometheus};
use common::{env, scratch, worker};
use occl_tests::launch::{Job, Spawn};
use occl_tests::ras_client::free_port;
use serde_json::Value;
use std::path::Path;
use std::time::{Duration, Instant};

const JOB: &str = "occl-alerts-test";
const JOB_CLEAN: &str = "occl-alerts-clean";
const SCRAPE_S: u64 = 1;
const FOR_S: u64 = 2;

/// The committed rules with every `for:` at [`FOR_S`], and a config that scrapes the job every second.
fn config(dir: &Path, port: u16) -> String {
    config_for(dir, port, JOB)
}

fn config_for(dir: &Path, port: u16, job: &str) -> String {
    let rules =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../dashboards/prometheus/alerts.yml"))
            .expect("alerts.yml");
    let rules: Vec<String> = rules
        .lines()
        .map(|l| match l.trim_start().strip_prefix("for: ") {
            Some(_) => format!("{}for: {FOR_S}s", &l[..l.len() - l.trim_start().len()]),
            None => l.to_string(),
        })
        .collect();
    std::fs::write(dir.join("alerts.yml"), rules.join("\n")).expect("write rules");
    format!(
        "global:\n  scrape_interval: {SCRAPE_S}s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n\
         rule_files:\n  - alerts.yml\n\
         scrape_configs:\n  - job_name: occl\n    static_configs:\n      - targets: ['127.0.0.1:{port}']\n        \
         labels:\n          job: {job}\n"
    )
}

#[test]
fn a_job_whose_ranks_all_exit_after_a_crash_fires_job_target_down() {
    let Some(prometheus) = tool("prometheus") else { return };
    let dir = scratch("alerts");
    let flight = dir.join("flight");
    std::fs::create_dir_all(&flight).expect("flight dir");
    let port = free_port();
    let spawn = Spawn {
        env: env(&[
            ("OCCL_RAS_ADDR", &format!("127.0.0.1:{port}")),
            ("OCCL_METRICS", "1"),
            ("OCCL_FLIGHT_RECORDER_DIR", &flight.display().to_string()),
        ]),
        capture_stdout: true,
        capture_stderr: true,
        ..Spawn::default()
    };
    let job = Job::spawn(worker(), &["loop".to_string()], 2, &spawn).expect("start job");
    job.wait_for_all("READY", Duration::from_secs(60)).expect("ranks run");
    let p = Prometheus::start(&prometheus, &config(&dir, port), &dir);
    let t = Instant::now();
    while p.query(&format!("up{{job=\"{JOB}\"}} == 1")).is_empty() {
        assert!(t.elapsed() < Duration::from_secs(30), "the job was never scraped: {}", p.log());
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(p.alerts().iter().all(|(n, ..)| n != "JobTargetDown"), "JobTargetDown while the job runs");

    // Rank 0 dies; rank 1 fails on it and exits: nothing answers on the port any more.
    job.signal(0, libc::SIGKILL).expect("kill rank 0");
    let killed = Instant::now();
    let outs = job.wait(Duration::from_secs(60)).expect("the survivor exits");
    assert!(outs[1].output.contains("ERR kind=RemoteError"), "rank 1 failed on rank 0:\n{}", outs[1].output);
    let bound = Duration::from_secs(SCRAPE_S + FOR_S + 10);
    let fired = loop {
        let firing = p.alerts().into_iter().find(|(n, s, _)| n == "JobTargetDown" && s == "firing");
        if let Some((_, _, labels)) = firing {
            break labels;
        }
        assert!(killed.elapsed() < bound, "JobTargetDown did not fire within {bound:?} of the kill: {}", p.log());
        std::thread::sleep(Duration::from_millis(200));
    };
    eprintln!("JobTargetDown fired {:?} after SIGKILL (bound {bound:?}): {fired:?}", killed.elapsed());
    assert_eq!(fired.get("job").map(String::as_str), Some(JOB));
    assert_eq!(fired.get("node").map(String::as_str), Some("127.0.0.1"));
    assert_eq!(fired.get("instance"), Some(&format!("127.0.0.1:{port}")));
    // What the job said last is still in Prometheus.
    let last = p.query(&format!("last_over_time(occl_collective_operations_total{{job=\"{JOB}\"}}[1h])"));
    assert!(!last.is_empty(), "the job's last series are kept");

    // The survivor's flight record: why (naming rank 0), and the operation it was in.
    let dumps: Vec<Value> = std::fs::read_dir(&flight)
        .expect("flight dir")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .map(|p| serde_json::from_str(&std::fs::read_to_string(&p).expect("read")).expect("JSON"))
        .collect();
    let r1 = dumps.iter().find(|d| d["comm"]["rank"] == 1).unwrap_or_else(|| panic!("no dump of rank 1: {dumps:?}"));
    let reason = r1["reason"].as_str().unwrap_or_default();
    assert!(reason.starts_with("error: ") && reason.contains("rank 0"), "the reason names the dead peer: {reason}");
    let last = r1["entries"].as_array().and_then(|e| e.last()).expect("an entry");
    assert_eq!((last["op"].as_str(), last["state"].as_str()), (Some("AllReduce"), Some("failed")), "{last}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A job that ends normally (its communicators destroyed, its processes exit 0) closes its port as a crash does, but
/// its last scrape said `occl_ras_job_running` 0 (the port's owner waited at exit for it): `JobTargetDown` stays
/// quiet past the bound within which a crash fires it.
#[test]
fn a_job_that_ends_normally_does_not_fire_job_target_down() {
    let Some(prometheus) = tool("prometheus") else { return };
    let dir = scratch("alerts-clean");
    let port = free_port();
    let p = Prometheus::start(&prometheus, &config_for(&dir, port, JOB_CLEAN), &dir);
    let spawn = Spawn {
        env: env(&[
            ("OCCL_RAS_ADDR", &format!("127.0.0.1:{port}")),
            ("OCCL_RAS_EXIT_WAIT", "10"),
            // The RAS side's account of its scrapes and its exit, shown if the test fails.
            ("OCCL_LOG", "occl::ras=debug,occl_ras=debug,warn"),
        ]),
        capture_stdout: true,
        capture_stderr: true,
        ..Spawn::default()
    };
    // Prometheus runs (it has tried the target) before the job starts, so that the job is scraped while it runs.
    let t = Instant::now();
    while p.query(&format!("up{{job=\"{JOB_CLEAN}\"}}")).is_empty() {
        assert!(t.elapsed() < Duration::from_secs(30), "Prometheus never tried the target: {}", p.log());
        std::thread::sleep(Duration::from_millis(200));
    }
    let job = Job::spawn(worker(), &["for_ms".to_string(), "6000".to_string()], 2, &spawn).expect("start job");
    let t = Instant::now();
    while p.query(&format!("occl_ras_job_running{{job=\"{JOB_CLEAN}\"}} == 1")).is_empty() {
        let seen = p.query(&format!("{{job=\"{JOB_CLEAN}\"}}"));
        assert!(t.elapsed() < Duration::from_secs(30), "the running job was never scraped: {seen:?} {}", p.log());
        std::thread::sleep(Duration::from_millis(200));
    }
    let outs = job.wait(Duration::from_secs(60)).expect("the job ends");
    let ended = Instant::now();
    for o in &outs {
        assert!(o.status.success() && o.output.contains("OK rank="), "rank {} ended normally:\n{}", o.rank, o.output);
    }
    let last = format!("last_over_time(occl_ras_job_running{{job=\"{JOB_CLEAN}\"}}[1h])");
    let t = Instant::now();
    while p.query(&format!("up{{job=\"{JOB_CLEAN}\"}} == 0")).is_empty() {
        assert!(t.elapsed() < Duration::from_secs(10), "the port did not close: {}", p.log());
        std::thread::sleep(Duration::from_millis(200));
    }
    let values: Vec<f64> = p.query(&last).into_iter().map(|(_, v)| v).collect();
    let samples = |m: &str| p.raw(&format!("{m}{{job=\"{JOB_CLEAN}\"}}[1m]"));
    let outputs: Vec<String> = outs.iter().map(|o| format!("rank {}:\n{}", o.rank, o.output)).collect();
    assert_eq!(
        values,
        [0.0],
        "the last scrape of a normal end says the job no longer runs; its samples: {}\nup: {}\nscrape durations: \
         {}\nthe ranks' output:\n{}",
        samples("occl_ras_job_running"),
        samples("up"),
        samples("scrape_duration_seconds"),
        outputs.join("\n"),
    );
    let bound = Duration::from_secs(SCRAPE_S + FOR_S + 10);
    while ended.elapsed() < bound {
        let fired: Vec<_> = p.alerts().into_iter().filter(|(n, ..)| n == "JobTargetDown").collect();
        assert!(fired.is_empty(), "JobTargetDown after a normal end: {fired:?}");
        std::thread::sleep(Duration::from_millis(500));
    }
    let _ = std::fs::remove_dir_all(&dir);
}
