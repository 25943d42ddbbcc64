//! The built `libnccl-profiler-occl.so` under an NCCL-shaped C host (tests/host/host.c, compiled
//! here once per API version with the system C compiler): dlopen'd as NCCL does, each of
//! `ncclProfiler_v6` … `v1` picked in turn, NCCL's event sequences emitted from an application,
//! a proxy, a network and a proxy-control thread on two communicators. What the plugin's
//! profiler received is read back from the test span log (`OCCL_PROFILER_TEST_SPANS`: occl's span
//! collector with a test exporter), and `/metrics` is scraped while the communicators live.

mod common;

use common::*;
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;

const VERSIONS: [u32; 6] = [6, 5, 4, 3, 2, 1];
/// The host's constants (host.c): iterations, steps per ProxyOp, ProxyCtrl rounds.
const NITER: usize = 16;
const NSTEPS: usize = 4;
const NCTRL: usize = 10;
const CHUNK: u64 = 65536;

/// Builds the host for every version once per test process.
fn hosts() -> &'static BTreeMap<u32, PathBuf> {
    static H: OnceLock<BTreeMap<u32, PathBuf>> = OnceLock::new();
    H.get_or_init(|| {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("occl-plugin-hosts-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("host build dir");
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/host/host.c");
        VERSIONS
            .iter()
            .map(|v| {
                let out = dir.join(format!("host_v{v}"));
                let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
                let res = Command::new(&cc)
                    .args(["-O1", "-std=c11", "-Wall", "-Wextra", "-Werror", &format!("-DHOST_API={v}"), "-o"])
                    .arg(&out)
                    .arg(&src)
                    .args(["-ldl", "-lpthread"])
                    .output()
                    .unwrap_or_else(|e| {
                        panic!("cannot run the C compiler `{cc}` ({e}); install gcc (scripts/test.sh does)")
                    });
                assert!(res.status.success(), "building host v{v}:\n{}", String::from_utf8_lossy(&res.stderr));
                (*v, out)
            })
            .collect()
    })
}

/// A host run: the library is put in `dir` as `libnccl-profiler-occl.so` and loaded by that bare
/// name through `LD_LIBRARY_PATH`, as NCCL ≥ 2.26 does for `NCCL_PROFILER_PLUGIN=occl`.
fn host(v: u32, dir: &Path, scenario: &str, env: &[(&str, String)]) -> Command {
    install_as_nccl_name(dir);
    let mut c = Command::new(&hosts()[&v]);
    c.arg("libnccl-profiler-occl.so").arg(scenario).env("LD_LIBRARY_PATH", dir);
    for k in ["OCCL_PROFILER_TEST_SPANS", "OCCL_PROFILER_TEST_MASK", "OCCL_METRICS_ADDR", "HOST_PAUSE"] {
        c.env_remove(k);
    }
    for k in metrics_local_rank_vars() {
        c.env_remove(k);
    }
    c.env("OCCL_METRICS_ADDR", "off");
    // Prometheus is on unless turned off: these runs name the exporters they want.
    c.env("OCCL_METRICS", "0");
    for (k, val) in env {
        c.env(k, val);
    }
    c
}

fn metrics_local_rank_vars() -> [&'static str; 3] {
    nccl_profiler_occl::metrics::LOCAL_RANK_ENV
}

fn run_ok(mut c: Command, what: &str) -> (String, String) {
    let Output { status, stdout, stderr } = c.output().expect("run host");
    let (out, err) = (String::from_utf8_lossy(&stdout).into_owned(), String::from_utf8_lossy(&stderr).into_owned());
    assert!(status.success() && out.contains("OK failures=0"), "{what}: {status}\nstdout:\n{out}\nstderr:\n{err}");
    (out, err)
}

/// The mask the plugin writes for an exporter wanting everything: the version's own types.
fn all_types(v: u32) -> i64 {
    match v {
        1 | 2 => 0x3F,
        3 | 4 => 0xFF,
        5 => 0xFFF,
        _ => 0x7FFF,
    }
}

/// NCCL's parents by version (reference §10).
fn parent_of(v: u32) -> impl Fn(&str) -> &'static [&'static str] {
    move |t| match t {
        "Coll" | "P2p" if v < 5 => &["Group"],
        "Coll" => &["CollApi"],
        "P2p" => &["P2pApi"],
        "CollApi" | "P2pApi" | "KernelLaunch" => &["GroupApi"],
        "ProxyOp" => &["Coll", "P2p"],
        "ProxyStep" => &["ProxyOp"],
        "KernelCh" => &["Coll"],
        "NetPlugin" => &["ProxyStep"],
        "CeColl" => &["CollApi"],
        "CeSync" | "CeBatch" => &["CeColl"],
        _ => &[],
    }
}

/// Spans per communicator the host's run scenario makes in version `v`.
fn expected_counts(v: u32) -> BTreeMap<&'static str, usize> {
    let mut m = BTreeMap::from([
        ("Group", NITER),
        ("Coll", NITER),
        ("P2p", NITER),
        ("ProxyOp", 3 * NITER),
        ("ProxyStep", 3 * NSTEPS * NITER),
        ("ProxyCtrl", 2 * NCTRL),
    ]);
    if v >= 3 {
        m.insert("KernelCh", NITER);
        m.insert("NetPlugin", 3 * NSTEPS * NITER);
    }
    if v >= 5 {
        for t in ["GroupApi", "CollApi", "P2pApi", "KernelLaunch"] {
            m.insert(t, NITER);
        }
    }
    if v >= 6 {
        for t in ["CeColl", "CeSync", "CeBatch"] {
            m.insert(t, NITER);
        }
    }
    m
}

/// Everything one communicator's spans must show for version `v`.
fn check_comm(v: u32, spans: &[&SpanRec]) {
    assert_eq!(LogCounts::of(spans), expected_counts(v), "v{v}: spans by type");
    check_parents(spans, &parent_of(v));
    let by_id: BTreeMap<u64, &SpanRec> = spans.iter().map(|s| (s.id, *s)).collect();
    let of = |t: &'static str| spans.iter().filter(move |s| s.ty == t);

    // Coll: NCCL's spellings (v1 from its codes), sequence numbers 0..NITER, the count of each.
    let mut seqs: Vec<i64> = of("Coll").map(|c| c.num("seq")).collect();
    seqs.sort();
    assert_eq!(seqs, (0..NITER as i64).collect::<Vec<_>>(), "v{v}");
    for c in of("Coll") {
        assert_eq!(
            (c.str("func"), c.str("dtype"), c.str("algo"), c.str("proto")),
            ("AllReduce", "ncclFloat32", "RING", "SIMPLE")
        );
        assert_eq!(c.num("count"), 1024 * (c.num("seq") + 1), "v{v}: count of seq {}", c.num("seq"));
        assert_eq!((c.num("nch"), c.num("nwarps"), c.num("sendbuf"), c.num("recvbuf")), (2, 8, 0x1000, 0x2000));
        if v >= 5 {
            let g = c.d["pgroup"].as_u64().expect("v5+ Coll has parentGroup");
            assert_eq!(by_id[&g].ty, "Group", "parentGroup is the legacy Group");
            assert_eq!(c.root, by_id[&c.parent.expect("parent")].parent.expect("CollApi's parent"), "root = GroupApi");
        } else {
            assert!(c.d["pgroup"].is_null());
        }
    }
    for p in of("P2p") {
        assert_eq!((p.str("func"), p.str("dtype"), p.num("count")), ("Send", "ncclInt32", 256));
        assert_eq!(p.num("nch"), if v >= 4 { 1 } else { 0 }, "v{v}: P2p nChannels exists from v4");
    }
    // ProxyOps: two sends and a receive per iteration, with NCCL's states of the version.
    let pid = i64::from(std::process::id());
    let ops: Vec<_> = of("ProxyOp").collect();
    assert_eq!(ops.iter().filter(|o| o.d["send"] == true).count(), 2 * NITER);
    for o in &ops {
        assert_eq!((o.num("nsteps"), o.num("chunk")), (NSTEPS as i64, CHUNK as i64));
        assert!(o.num("pid") > 0 && o.num("pid") != pid, "the host's pid");
        let send = o.d["send"] == true;
        let want: Vec<(u64, u64)> = match (v >= 4, send) {
            (true, _) => vec![(19, 0)],
            (false, true) => vec![(0, NSTEPS as u64 * CHUNK), (3, NSTEPS as u64 * CHUNK)],
            (false, false) => vec![(4, NSTEPS as u64 * CHUNK), (7, NSTEPS as u64 * CHUNK)],
        };
        assert_eq!(o.states, want, "v{v}: ProxyOp states (send={send})");
        let steps: Vec<_> = of("ProxyStep").filter(|s| s.parent == Some(o.id)).collect();
        assert_eq!(steps.len(), NSTEPS, "v{v}: steps of a ProxyOp");
        let mut nums: Vec<i64> = steps.iter().map(|s| s.num("step")).collect();
        nums.sort();
        assert_eq!(nums, (0..NSTEPS as i64).collect::<Vec<_>>());
        // v4+ pass transSize with every step state; v1–v3 pass none.
        let size = if v >= 4 { CHUNK } else { 0 };
        let want: Vec<(u64, u64)> = match (v >= 4, send) {
            (true, true) => vec![(8, size), (20, size), (9, size)],
            (false, true) => vec![(8, 0), (9, 0)],
            (_, false) => vec![(10, size), (11, size), (12, size)],
        };
        for s in steps {
            assert_eq!(s.states, want, "v{v}: ProxyStep states (send={send})");
            assert!(s.start_ns <= s.end_ns && o.start_ns <= s.start_ns && s.end_ns <= o.end_ns, "a step inside its op");
        }
    }
    // NetPlugin: the socket payload, copied, and (v4+) its update.
    for n in of("NetPlugin") {
        assert_eq!(n.num("plugin_id"), 0x2_0001);
        assert_eq!(n.payload.len(), 24, "NCCL's socket payload");
        assert_eq!((n.payload[0], n.payload[8], n.payload[18]), (1, 7, 1), "type, fd, length 65536 (LE)");
        assert_eq!(n.state_numbers(), if v >= 4 { vec![21] } else { vec![] });
    }
    for k in of("KernelCh") {
        let ptimer = k.num("ptimer") as u64;
        if v >= 4 {
            assert!((1000..1000 + NITER as u64).contains(&ptimer), "v{v}: pTimer {ptimer}");
            assert_eq!(k.states, vec![(22, ptimer + 1000)], "KernelChStop with the GPU stop time");
        } else {
            assert_eq!((ptimer, k.states.len()), (0, 0), "v3 KernelCh has no timestamps");
        }
    }
    for c in of("ProxyCtrl") {
        let s = c.states.clone();
        assert!(s == vec![(15, 0), (16, 0), (17, 0), (18, 3)] || s == vec![(14, 0)], "v{v}: ProxyCtrl states {s:?}");
        assert!(c.parent.is_none() && c.root == c.id);
    }
    for g in of("GroupApi") {
        assert_eq!(g.state_numbers(), vec![23, 24]);
        assert_eq!((g.num("depth"), g.d["graph"].as_bool()), (1, Some(false)));
    }
    for a in of("CollApi") {
        assert_eq!((a.str("func"), a.str("dtype"), a.num("stream")), ("AllReduce", "ncclFloat32", 0xABC));
    }
    for e in of("CeColl") {
        assert_eq!((e.str("func"), e.str("dtype"), e.str("sync")), ("AllGather", "ncclBfloat16", "UC"));
        assert_eq!(e.num("ceseq"), e.num("seq"));
    }
    for s in of("CeSync") {
        assert_eq!((s.d["complete"].as_bool(), s.num("nranks")), (Some(true), 2));
    }
    for b in of("CeBatch") {
        assert_eq!((b.num("nops"), b.num("bytes")), (2, 4096));
    }
}

struct LogCounts;
impl LogCounts {
    fn of(spans: &[&SpanRec]) -> BTreeMap<&'static str, usize> {
        let mut m = BTreeMap::new();
        for s in spans {
            let t: &'static str = occl_telemetry::EventType::ALL
                .iter()
                .map(|t| t.name())
                .find(|n| *n == s.ty)
                .unwrap_or_else(|| panic!("unknown type {}", s.ty));
            *m.entry(t).or_default() += 1;
        }
        m
    }
}

#[test]
fn every_version_gets_nccls_sequences_from_several_threads() {
    for v in VERSIONS {
        let dir = scratch(&format!("run-v{v}"));
        let prefix = dir.join("spans").to_string_lossy().into_owned();
        let (out, err) = run_ok(host(v, &dir, "run", &[("OCCL_PROFILER_TEST_SPANS", prefix)]), &format!("v{v} run"));
        assert!(out.contains("symbols=6"), "v{v}: all six tables exported:\n{out}");
        let mask = all_types(v);
        assert!(out.contains(&format!("init comm=0 mask={mask} ctx_null=0")), "v{v}:\n{out}");
        assert!(out.contains(&format!("init comm=1 mask={mask} ctx_null=0")), "v{v}:\n{out}");
        let per_comm: usize = expected_counts(v).values().sum();
        assert!(out.contains(&format!("handles={} nulls=0 duplicates=0", 2 * per_comm)), "v{v}:\n{out}");
        if v >= 4 {
            assert!(
                err.contains(&format!(
                    "NCCL-LOG 3 occl profiler plugin (API v{v}): communicator 0x0000000000001001 rank 1/2"
                )),
                "v{v}: the plugin logs through NCCL's logger:\n{err}"
            );
        }

        let log = SpanLog::read(&dir, "spans");
        assert_eq!((log.inits.len(), log.finalizes.len()), (2, 2), "v{v}: two communicators");
        if v >= 4 {
            let mut ranks = Vec::new();
            for init in &log.inits {
                let r = init["rank"].as_i64().expect("rank");
                ranks.push(r);
                assert_eq!(init["comm"], format!("{:016x}", 0x1000 + r), "v{v}: NCCL's comm hash");
                let name = format!("harness-{r}");
                assert_eq!(
                    (init["name"].as_str(), init["nranks"].as_i64(), init["nnodes"].as_i64()),
                    (Some(name.as_str()), Some(2), Some(1))
                );
            }
            ranks.sort();
            assert_eq!(ranks, [0, 1]);
        } else {
            // v1–v3 init carries no communicator information.
            assert!(
                log.inits.iter().all(|i| i["comm"] == "0000000000000000" && i["name"].is_null()),
                "{:?}",
                log.inits
            );
        }
        let comms = log.by_comm();
        assert_eq!(comms.len(), 2, "v{v}: spans of two communicators");
        for spans in comms.values() {
            check_comm(v, spans);
            if v >= 4 {
                let hash = &spans[0].comm;
                assert!(spans.iter().all(|s| &s.comm == hash), "one communicator's spans carry its hash");
            }
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}

#[test]
fn the_mask_is_what_the_exporters_want() {
    // Coll and ProxyStep only: NCCL would still emit the ancestors (Group, CollApi, ProxyOp…),
    // which the collector keeps for the tree but does not export.
    for (v, want) in [(5, 0x12), (1, 0x12), (6, 0x12)] {
        let dir = scratch(&format!("mask-v{v}"));
        let prefix = dir.join("spans").to_string_lossy().into_owned();
        let env = [("OCCL_PROFILER_TEST_SPANS", prefix), ("OCCL_PROFILER_TEST_MASK", "0x12".into())];
        let (out, _) = run_ok(host(v, &dir, "run", &env), "mask run");
        assert!(out.contains(&format!("init comm=0 mask={want} ")), "v{v}:\n{out}");
        let log = SpanLog::read(&dir, "spans");
        for spans in log.by_comm().values() {
            let counts = LogCounts::of(spans);
            assert_eq!(counts, BTreeMap::from([("Coll", NITER), ("ProxyStep", 3 * NSTEPS * NITER)]), "v{v}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}

#[test]
fn metrics_are_served_while_communicators_live() {
    for v in [5, 1] {
        let dir = scratch(&format!("metrics-v{v}"));
        let port = free_port();
        let prefix = dir.join("spans").to_string_lossy().into_owned();
        let env = [
            ("OCCL_PROFILER_TEST_SPANS", prefix),
            ("OCCL_METRICS_ADDR", format!("127.0.0.1:{port}")),
            ("HOST_PAUSE", "1".into()),
            ("HOST_METRICS_PORT", port.to_string()),
        ];
        let mut child = host(v, &dir, "run", &env)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn host");
        let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
        let mut seen = String::new();
        loop {
            let mut line = String::new();
            if stdout.read_line(&mut line).expect("read") == 0 {
                panic!("host ended before pausing:\n{seen}");
            }
            seen.push_str(&line);
            if line.trim() == "PAUSED" {
                break;
            }
        }
        let answer = http_get(port, "/metrics");
        assert!(answer.starts_with("HTTP/1.1 200 OK"), "{answer}");
        let body = answer.split_once("\r\n\r\n").map(|x| x.1).unwrap_or("");
        assert_eq!(sample(body, "occl_test_spans_total{type=\"Coll\"}"), Some(2.0 * NITER as f64), "{body}");
        assert_eq!(sample(body, "occl_test_spans_total{type=\"ProxyStep\"}"), Some((2 * 3 * NSTEPS * NITER) as f64));
        assert_eq!(sample(body, &format!("occl_profiler_plugin_communicators{{api=\"v{v}\"}}")), Some(2.0), "{body}");
        assert_eq!(sample(body, "occl_profiler_plugin_dropped_total{reason=\"bad_descriptor\"}"), Some(0.0));
        assert!(http_get(port, "/other").starts_with("HTTP/1.1 404"));
        // Every series carries the process's labels, as RAS gives a job on occl.
        let own = format!("pid=\"{}\",host=\"", child.id());
        for l in body.lines().filter(|l| !l.starts_with('#') && !l.is_empty()) {
            assert!(l.contains(&own), "v{v}: a series without the process labels: {l}");
        }
        child.stdin.take().expect("stdin").write_all(b"go\n").expect("resume host");
        let out = child.wait_with_output().expect("host");
        let mut rest = String::new();
        stdout.read_to_string_lossy(&mut rest);
        seen.push_str(&rest);
        assert!(
            out.status.success() && seen.contains("OK failures=0"),
            "v{v}:\n{seen}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(seen.contains("metrics_after_finalize=refused"), "the last finalize stops the server:\n{seen}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}

trait ReadRest {
    fn read_to_string_lossy(&mut self, s: &mut String);
}
impl<R: std::io::Read> ReadRest for BufReader<R> {
    fn read_to_string_lossy(&mut self, s: &mut String) {
        let mut b = Vec::new();
        let _ = std::io::Read::read_to_end(self, &mut b);
        s.push_str(&String::from_utf8_lossy(&b));
    }
}

#[test]
fn a_metrics_port_in_use_is_logged_and_events_still_flow() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = taken.local_addr().expect("addr").port();
    let dir = scratch("port-taken");
    let prefix = dir.join("spans").to_string_lossy().into_owned();
    let env = [("OCCL_PROFILER_TEST_SPANS", prefix), ("OCCL_METRICS_ADDR", format!("127.0.0.1:{port}"))];
    let (_, err) = run_ok(host(5, &dir, "run", &env), "port taken");
    assert!(
        err.contains(&format!("NCCL-LOG 2 occl profiler plugin: cannot listen on 127.0.0.1:{port} for /metrics")),
        "a warning through NCCL's logger:\n{err}"
    );
    let log = SpanLog::read(&dir, "spans");
    assert_eq!(log.spans.len(), 2 * expected_counts(5).values().sum::<usize>());
    drop(taken);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn without_an_exporter_init_succeeds_logs_once_and_drops_events() {
    let dir = scratch("no-exporter");
    let (out, err) = run_ok(host(5, &dir, "run", &[]), "no exporter");
    assert!(out.contains("init comm=0 mask=0 ctx_null=1") && out.contains("init comm=1 mask=0 ctx_null=1"), "{out}");
    assert!(out.contains("handles=0 nulls="), "every handle NULL:\n{out}");
    let warns: Vec<_> = err.lines().filter(|l| l.starts_with("NCCL-LOG 2 ")).collect();
    assert_eq!(warns.len(), 1, "one warning for two communicators:\n{err}");
    assert!(warns[0].contains("no exporter is enabled"), "{}", warns[0]);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn garbage_from_the_host_never_crashes() {
    for v in VERSIONS {
        let dir = scratch(&format!("garbage-v{v}"));
        let prefix = dir.join("spans").to_string_lossy().into_owned();
        let (out, _) =
            run_ok(host(v, &dir, "garbage", &[("OCCL_PROFILER_TEST_SPANS", prefix)]), &format!("v{v} garbage"));
        assert!(out.contains("garbage bad=0"), "v{v}:\n{out}");
        let log = SpanLog::read(&dir, "spans");
        let types: Vec<&str> = log.spans.iter().map(|s| s.ty.as_str()).collect();
        assert_eq!(types, ["ProxyStep", "Coll"], "v{v}: only the odd Coll and the orphan step got through");
        let (step, coll) = (&log.spans[0], &log.spans[1]);
        assert_eq!((coll.parent, coll.num("seq")), (None, 99), "v{v}: a foreign parent reads as none");
        if v == 1 {
            assert_eq!([coll.str("func"), coll.str("dtype"), coll.str("algo"), coll.str("proto")], ["Unknown"; 4]);
        } else {
            assert_eq!(
                [coll.str("func"), coll.str("dtype"), coll.str("algo"), coll.str("proto")],
                ["Unknown", "Unknown", "Unknown", "SIMPLE"]
            );
        }
        assert_eq!(step.parent, None);
        // 9 (NULL args: 0), 99 and -5 dropped, 23 only where GroupApi states exist, 10 with
        // arguments of all ones (v4+ read them as the transfer size; v1–v3 steps have none).
        let ones = if v >= 4 { u64::MAX } else { 0 };
        let want: Vec<(u64, u64)> = if v >= 5 { vec![(9, 0), (23, 0), (10, ones)] } else { vec![(9, 0), (10, ones)] };
        assert_eq!(step.states, want, "v{v}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}

#[test]
fn the_library_unloads_and_loads_again() {
    for (v, metrics) in [(6, false), (1, false), (6, true), (4, true)] {
        let dir = scratch(&format!("reload-v{v}-{metrics}"));
        let prefix = dir.join("spans").to_string_lossy().into_owned();
        let addr = if metrics { format!("127.0.0.1:{}", free_port()) } else { "off".into() };
        let env = [("OCCL_PROFILER_TEST_SPANS", prefix), ("OCCL_METRICS_ADDR", addr)];
        let (out, _) = run_ok(host(v, &dir, "reload", &env), &format!("v{v} reload"));
        assert!(out.contains("round=0 closed") && out.contains("round=1 closed"), "v{v}:\n{out}");
        if !metrics {
            // Nothing of ours pins the library: dlclose unmaps it.
            assert!(out.contains("round=0 closed unloaded=1"), "v{v}:\n{out}");
        } else {
            // Spawning the server thread registers a thread-local destructor in the thread that
            // called init, so the dynamic linker keeps the library until that thread exits; it
            // is then simply reused. Either way no thread of ours runs after the last finalize.
            println!(
                "v{v} with /metrics: {}",
                out.lines().filter(|l| l.starts_with("round=")).collect::<Vec<_>>().join("; ")
            );
        }
        let log = SpanLog::read(&dir, "spans");
        assert_eq!((log.inits.len(), log.finalizes.len(), log.spans.len()), (2, 2, 2), "v{v}: both loads worked");
        let _ = std::fs::remove_dir_all(&dir);
    }
}

#[test]
fn step_marks_from_c_reach_the_trace_file() {
    let dir = scratch("steps");
    let traces = dir.join("traces");
    let (out, _) = run_ok(
        host(5, &dir, "steps", &[("OCCL_TRACE_DIR", traces.display().to_string())]),
        "steps through occlProfilerStepBegin/End",
    );
    assert!(out.contains("steps done"), "{out}");
    let files: Vec<PathBuf> = std::fs::read_dir(&traces)
        .unwrap_or_else(|e| panic!("no trace directory {}: {e}\n{out}", traces.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    assert_eq!(files.len(), 1, "one trace file for the one rank: {files:?}");
    let text = std::fs::read_to_string(&files[0]).expect("trace text");
    let doc: serde_json::Value = serde_json::from_str(&text).expect("the trace is JSON");
    let steps: Vec<(String, f64)> = doc["traceEvents"]
        .as_array()
        .expect("traceEvents")
        .iter()
        .filter_map(|e| {
            let name = e["name"].as_str()?;
            name.starts_with("ProfilerStep#").then(|| (name.to_string(), e["dur"].as_f64().unwrap_or(-1.0)))
        })
        .collect();
    let names: Vec<&str> = steps.iter().map(|s| s.0.as_str()).collect();
    assert_eq!(names, ["ProfilerStep#1", "ProfilerStep#2", "ProfilerStep#3"], "{text}");
    assert!(steps.iter().all(|s| s.1 >= 0.0), "every step closed with a duration: {steps:?}");
    let _ = std::fs::remove_dir_all(&dir);
}
