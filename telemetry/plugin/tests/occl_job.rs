//! occl itself loading our plugin: a real 2-rank occl job (occl-test-worker, started by
//! occl-tests' launcher) with `NCCL_PROFILER_PLUGIN` naming the built library. occl loads it by
//! NCCL's rules, picks `ncclProfiler_v6`, converts its events to the C ABI, and the plugin reads
//! them back and feeds occl's span collector: the whole round trip occl → C → plugin. The job also
//! runs occl's in-process recorder, so what the plugin received is compared with what occl emitted.
//! A second job stays alive while each rank's `/metrics` is scraped.
//!
//! The worker binary is built here with cargo (the same profile and target directory as this
//! test), since a test can only be handed binaries of its own package.

mod common;

use common::*;
use occl_tests::launch::{Job, Spawn};
use serde_json::Value;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

fn worker() -> &'static Path {
    static W: OnceLock<PathBuf> = OnceLock::new();
    W.get_or_init(|| {
        let profile = profile_dir();
        let target = profile.parent().expect("target dir");
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let mut cmd = Command::new(&cargo);
        cmd.args(["build", "--quiet", "-p", "occl-tests", "--bin", "occl-test-worker", "--target-dir"])
            .arg(target)
            .current_dir(env!("CARGO_MANIFEST_DIR"));
        match profile.file_name().and_then(|n| n.to_str()) {
            Some("debug") => {}
            Some("release") => {
                cmd.arg("--release");
            }
            Some(other) => {
                cmd.args(["--profile", other]);
            }
            None => panic!("odd target dir {}", profile.display()),
        }
        let out = cmd.output().unwrap_or_else(|e| panic!("running {cargo} to build occl-test-worker: {e}"));
        assert!(out.status.success(), "building occl-test-worker:\n{}", String::from_utf8_lossy(&out.stderr));
        let w = profile.join("occl-test-worker");
        assert!(w.is_file(), "{} after the build", w.display());
        w
    })
}

fn env(pairs: &[(&str, String)]) -> Vec<(String, String)> {
    pairs.iter().map(|(k, v)| (k.to_string(), v.clone())).collect()
}

/// occl's recorder file of one rank (tests/src/events.rs): each line a JSON object.
fn recorder_lines(dir: &Path, rank: usize) -> Vec<Value> {
    let f = std::fs::read_dir(dir)
        .expect("dir")
        .map(|e| e.expect("entry").path())
        .find(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with(&format!("events-{rank}-"))))
        .unwrap_or_else(|| panic!("no occl recorder file for rank {rank} in {}", dir.display()));
    std::fs::read_to_string(f).expect("read").lines().map(|l| serde_json::from_str(l).expect("json line")).collect()
}

/// NCCL's algorithm spellings (reference §7.2).
const NCCL_ALGOS: [&str; 7] = ["TREE", "RING", "COLLNET_DIRECT", "COLLNET_CHAIN", "NVLS", "NVLS_TREE", "PAT"];

/// What occl emitted, by the recorder: types of started events, Coll signatures, and the state
/// sequence of every ProxyStep.
struct Emitted {
    comm: String,
    types: BTreeMap<String, usize>,
    colls: Vec<String>,
    step_states: BTreeMap<Vec<u64>, usize>,
    /// NetPlugin events that started without a live ProxyStep parent (none, or one already
    /// stopped): the C ABI then carries a NULL parent, since a step's handle ends at its stop.
    orphan_net: usize,
}

fn emitted(lines: &[Value]) -> Emitted {
    let comm = lines[0]["comm"].as_str().expect("init line has the comm").to_owned();
    let mut types = BTreeMap::new();
    let mut colls = Vec::new();
    let mut ty_of: HashMap<u64, String> = HashMap::new();
    let mut states: HashMap<u64, Vec<u64>> = HashMap::new();
    let mut stopped = std::collections::HashSet::new();
    let mut orphan_net = 0;
    for l in lines {
        match l["ev"].as_str() {
            Some("stop") => {
                stopped.insert(l["id"].as_u64().expect("id"));
            }
            Some("start") => {
                let t = l["type"].as_str().expect("type").to_owned();
                if t == "NetPlugin" && l["parent"].as_u64().is_none_or(|p| stopped.contains(&p)) {
                    orphan_net += 1;
                }
                ty_of.insert(l["id"].as_u64().expect("id"), t.clone());
                if t == "Coll" {
                    let d = &l["d"];
                    // The C ABI carries NCCL's spellings only: occl's own algorithms (ONE_SHOT,
                    // DIRECT) reach any plugin as "Unknown".
                    let algo = d["algo"].as_str().expect("algo");
                    let algo = if NCCL_ALGOS.contains(&algo) { algo } else { "Unknown" };
                    colls.push(format!(
                        "{} seq={} count={} {} \"{algo}\" {}",
                        d["func"], d["seq"], d["count"], d["dtype"], d["proto"]
                    ));
                }
                *types.entry(t).or_default() += 1;
            }
            Some("state") => {
                states.entry(l["id"].as_u64().expect("id")).or_default().push(l["state"].as_u64().expect("state"))
            }
            _ => {}
        }
    }
    let mut step_states = BTreeMap::new();
    for (id, t) in &ty_of {
        if t == "ProxyStep" {
            *step_states.entry(states.remove(id).unwrap_or_default()).or_default() += 1;
        }
    }
    colls.sort();
    Emitted { comm, types, colls, step_states, orphan_net }
}

#[test]
fn occl_loads_the_plugin_and_every_event_round_trips() {
    let dir = scratch("occl-job");
    let lib = install_as_nccl_name(&dir);
    let prefix = dir.join("spans").to_string_lossy().into_owned();
    let vars = env(&[
        ("NCCL_PROFILER_PLUGIN", lib.to_string_lossy().into_owned()),
        ("OCCL_PROFILER_TEST_SPANS", prefix),
        ("OCCL_TEST_EVENTS_DIR", dir.to_string_lossy().into_owned()),
        ("OCCL_METRICS_ADDR", "off".into()),
        // tcp, so NetPlugin events (NCCL's socket payload) are part of the trip too.
        ("OCCL_TRANSPORT", "tcp".into()),
        ("OCCL_LOG", "warn,occl_telemetry=info".into()),
    ]);
    let spawn = Spawn { env: vars, capture_stdout: true, capture_stderr: true, ..Spawn::default() };
    let job = Job::spawn(worker(), &["events".to_string()], 2, &spawn).expect("start the job");
    let outs = job.wait(Duration::from_secs(180)).expect("the job finishes");
    for o in &outs {
        assert!(o.status.success() && o.output.contains("OK rank="), "rank {}: {}\n{}", o.rank, o.status, o.output);
        assert!(
            o.output.contains("profiler plugin \"occl\" loaded from") && o.output.contains("(ncclProfiler_v6)"),
            "rank {}: occl says which plugin and version it loaded:\n{}",
            o.rank,
            o.output
        );
    }

    let log = SpanLog::read(&dir, "spans");
    assert_eq!((log.inits.len(), log.finalizes.len()), (2, 2), "one communicator per rank, finalized");
    for rank in 0..2usize {
        let want = emitted(&recorder_lines(&dir, rank));
        let spans: Vec<&SpanRec> = log.spans.iter().filter(|s| s.rank == rank as i64).collect();
        let init = log.inits.iter().find(|i| i["rank"] == rank as i64).expect("init line of the rank");
        assert_eq!((init["nranks"].as_i64(), init["nnodes"].as_i64()), (Some(2), Some(1)));
        assert_eq!(init["comm"].as_str(), Some(want.comm.as_str()), "the plugin got occl's communicator id");
        assert!(spans.iter().all(|s| s.comm == want.comm));

        // Every event occl emitted reached the plugin, as a finished span, by type.
        let got: BTreeMap<String, usize> =
            SpanLog::counts(&spans).into_iter().map(|(k, v)| (k.to_owned(), v)).collect();
        assert_eq!(got, want.types, "rank {rank}: spans by type = events occl emitted");
        for t in ["GroupApi", "CollApi", "Coll", "P2p", "ProxyOp", "ProxyStep", "ProxyCtrl", "NetPlugin"] {
            assert!(got.get(t).copied().unwrap_or(0) > 0, "rank {rank}: no {t} in {got:?}");
        }
        // The same collectives, field for field.
        let mut colls: Vec<String> = spans
            .iter()
            .filter(|s| s.ty == "Coll")
            .map(|s| {
                let d = &s.d;
                format!(
                    "{} seq={} count={} {} {} {}",
                    d["func"], d["seq"], d["count"], d["dtype"], d["algo"], d["proto"]
                )
            })
            .collect();
        colls.sort();
        assert_eq!(colls, want.colls, "rank {rank}");
        // The same state sequences on every ProxyStep.
        let mut steps: BTreeMap<Vec<u64>, usize> = BTreeMap::new();
        for s in spans.iter().filter(|s| s.ty == "ProxyStep") {
            *steps.entry(s.state_numbers()).or_default() += 1;
        }
        assert_eq!(steps, want.step_states, "rank {rank}: ProxyStep state sequences");
        // NCCL's v6 tree, rebuilt by the plugin from its own handles. occl starts some NetPlugin
        // events without a live step (see `Emitted::orphan_net`); exactly those have none here.
        let orphans = spans.iter().filter(|s| s.ty == "NetPlugin" && s.parent.is_none()).count();
        assert_eq!(orphans, want.orphan_net, "rank {rank}: NetPlugin events without a parent");
        let parented: Vec<&SpanRec> =
            spans.iter().copied().filter(|s| !(s.ty == "NetPlugin" && s.parent.is_none())).collect();
        check_parents(&parented, &|t| match t {
            "CollApi" | "P2pApi" | "KernelLaunch" => &["GroupApi"],
            "Coll" => &["CollApi"],
            "P2p" => &["P2pApi"],
            "ProxyOp" => &["Coll", "P2p"],
            "ProxyStep" => &["ProxyOp"],
            "NetPlugin" => &["ProxyStep"],
            "KernelCh" => &["Coll", "P2p"],
            _ => &[],
        });
        for n in spans.iter().filter(|s| s.ty == "NetPlugin") {
            assert_eq!((n.num("plugin_id"), n.payload.len()), (0x2_0001, 24), "NCCL's socket payload, copied");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Two loopback ports in a row that are free now.
fn two_free_ports() -> u16 {
    for _ in 0..100 {
        let p = free_port();
        if p < u16::MAX && std::net::TcpListener::bind(("127.0.0.1", p + 1)).is_ok() {
            return p;
        }
    }
    panic!("no two free consecutive ports");
}

#[test]
fn each_rank_serves_metrics_while_the_job_lives() {
    let dir = scratch("occl-metrics");
    let lib = install_as_nccl_name(&dir);
    let base = two_free_ports();
    let prefix = dir.join("spans").to_string_lossy().into_owned();
    let vars = env(&[
        ("NCCL_PROFILER_PLUGIN", lib.to_string_lossy().into_owned()),
        ("OCCL_PROFILER_TEST_SPANS", prefix),
        ("OCCL_METRICS_ADDR", format!("127.0.0.1:{base}")),
    ]);
    // The launcher's local rank moves each rank to a port of its own.
    let rank_env = (0..2).map(|r| vec![("LOCAL_RANK".to_string(), r.to_string())]).collect();
    let spawn = Spawn { env: vars, rank_env, capture_stdout: true, capture_stderr: true, ..Spawn::default() };
    let job = Job::spawn(worker(), &["idle".to_string()], 2, &spawn).expect("start the job");
    job.wait_for_all("READY", Duration::from_secs(120)).expect("the job is up");
    for r in 0..2u16 {
        let answer = http_get(base + r, "/metrics");
        assert!(answer.starts_with("HTTP/1.1 200 OK"), "rank {r}: {answer}");
        let body = answer.split_once("\r\n\r\n").map_or("", |x| x.1);
        // "idle" runs five all-reduces, each one CollApi and one Coll.
        assert_eq!(sample(body, "occl_test_spans_total{type=\"CollApi\"}"), Some(5.0), "rank {r}:\n{body}");
        assert_eq!(sample(body, "occl_test_spans_total{type=\"Coll\"}"), Some(5.0), "rank {r}");
        assert_eq!(sample(body, "occl_profiler_plugin_communicators{api=\"v6\"}"), Some(1.0), "rank {r}");
        for reason in ["bad_descriptor", "bad_state", "unknown_handle", "foreign_process", "panic"] {
            let series = format!("occl_profiler_plugin_dropped_total{{reason=\"{reason}\"}}");
            assert_eq!(sample(body, &series), Some(0.0), "rank {r}: {series}");
        }
    }
    drop(job);
    let _ = std::fs::remove_dir_all(&dir);
}
