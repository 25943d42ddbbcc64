//! NCCL C-ABI profiler plugins loaded into real occl processes through the environment, as a
//! job on NCCL would load them: the recorder plugins of occl-telemetry's tests (our own C code,
//! one exporting only `ncclProfiler_v5`, one only `ncclProfiler_v1`) are compiled here with `cc`,
//! named in `OCCL_PROFILER_PLUGIN` / `NCCL_PROFILER_PLUGIN`, and their logs are checked.

mod common;

use common::{assert_all_ok, env, run_job, scratch};
use occl_tests::launch::Spawn;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

fn plugins_src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../telemetry/tests/plugins")
}

/// Compiles `file` into `dir/lib<name>.so` with the system C compiler.
fn build(file: &str, name: &str, dir: &Path) -> PathBuf {
    let out = dir.join(format!("lib{name}.so"));
    let st = Command::new("cc")
        .args(["-shared", "-fPIC", "-O1", "-pthread", "-o"])
        .arg(&out)
        .arg(plugins_src().join(file))
        .status()
        .unwrap_or_else(|e| panic!("running cc failed ({e}); install a C compiler (apt-get install gcc)"));
    assert!(st.success(), "cc {file} failed");
    out
}

/// One plugin log: `key=value` tokens per line after the line's kind.
struct Line {
    kind: String,
    kv: HashMap<String, String>,
}

fn parse(path: &Path) -> Vec<Line> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.lines()
        .map(|l| {
            let (head, rest) = l.split_once(" name=").map_or((l, None), |(h, n)| (h, Some(n)));
            let mut it = head.split(' ');
            let kind = it.next().unwrap_or("").to_string();
            let mut kv: HashMap<String, String> =
                it.filter_map(|t| t.split_once('=')).map(|(k, v)| (k.to_string(), v.to_string())).collect();
            if let Some(n) = rest {
                kv.insert("name".into(), n.to_string());
            }
            Line { kind, kv }
        })
        .collect()
}

fn num(l: &Line, k: &str) -> i64 {
    l.kv.get(k).and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("{} has no numeric {k}: {:?}", l.kind, l.kv))
}

/// What one rank's plugin saw, checked for tree consistency; returns (type → count, Coll
/// sequence signature).
fn check_log(lines: &[Line], parent_of: &dyn Fn(i64) -> &'static [i64]) -> (BTreeMap<i64, usize>, Vec<String>) {
    assert_eq!(lines.first().map(|l| l.kind.as_str()), Some("init"));
    let fin = lines.last().expect("lines");
    assert_eq!(fin.kind, "finalize", "the plugin's finalize ran");
    assert_eq!(num(fin, "bad_calls"), 0, "no state/stop reached a NULL or foreign handle");
    assert_eq!(num(fin, "dropped"), 0);
    let mut ty_of: HashMap<i64, i64> = HashMap::new();
    let mut stopped: HashMap<i64, usize> = HashMap::new();
    let mut steps_of: HashMap<i64, i64> = HashMap::new();
    let mut nsteps: HashMap<i64, i64> = HashMap::new();
    let mut count = BTreeMap::new();
    let mut colls = Vec::new();
    for l in lines {
        match l.kind.as_str() {
            "start" => {
                let (h, ty, parent) = (num(l, "handle"), num(l, "type"), num(l, "parent"));
                assert!(h > 0 && ty_of.insert(h, ty).is_none(), "handle {h} reused");
                *count.entry(ty).or_default() += 1;
                let want = parent_of(ty);
                if want.is_empty() {
                    assert_eq!(parent, 0, "type {ty} stands alone");
                } else {
                    let pt = ty_of.get(&parent).copied().unwrap_or(-1);
                    assert!(want.contains(&pt), "type {ty} has a parent of type {pt}");
                }
                if ty == 2 {
                    colls.push(format!("func={} seq={} count={}", l.kv["func"], l.kv["seq"], l.kv["count"]));
                }
                if ty == 8 {
                    nsteps.insert(h, num(l, "nsteps"));
                }
                if ty == 16 {
                    *steps_of.entry(parent).or_default() += 1;
                }
            }
            "stop" => *stopped.entry(num(l, "handle")).or_default() += 1,
            _ => {}
        }
    }
    for (h, ty) in &ty_of {
        assert_eq!(stopped.get(h), Some(&1), "event {h} (type {ty}) stopped once");
    }
    for (op, n) in &nsteps {
        assert_eq!(steps_of.get(op).copied().unwrap_or(0), *n, "ProxyOp {op}: steps seen = nSteps");
    }
    (count, colls)
}

fn logs(dir: &Path, prefix: &str) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("read dir")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with(prefix)))
        .collect();
    v.sort();
    v
}

#[test]
fn v5_plugin_sees_the_whole_tree_on_every_rank() {
    let dir = scratch("plugin-v5");
    let lib = build("recorder_v5.c", "nccl-profiler-rec5", &dir);
    let prefix = dir.join("rec5").to_string_lossy().to_string();
    let libs = lib.to_string_lossy().to_string();
    // The plugin leaves the mask alone; occl's OCCL_PROFILE_EVENT_MASK gives its start value.
    let vars = [
        ("OCCL_PROFILER_PLUGIN", libs.as_str()),
        ("OCCL_TEST_PLUGIN_LOG", prefix.as_str()),
        ("OCCL_PROFILE_EVENT_MASK", "0x7fff"),
        ("OCCL_TEST_EVENTS_DIR", libs.rsplit_once('/').map_or(".", |p| p.0)),
    ];
    let outs = run_job(3, &["events"], Spawn { env: env(&vars), ..Spawn::default() }, Duration::from_secs(120));
    assert_all_ok(&outs, "job with the v5 plugin");
    let files = logs(&dir, "rec5-");
    assert_eq!(files.len(), 3, "one log per rank: {files:?}");
    // NCCL's v5 hierarchy, by type bit.
    let parent_of = |ty: i64| -> &'static [i64] {
        match ty {
            0x200 | 0x400 => &[0x100], // CollApi, P2pApi ← GroupApi
            2 => &[0x200],             // Coll ← CollApi
            4 => &[0x400],             // P2p ← P2pApi
            8 => &[2, 4],              // ProxyOp ← Coll | P2p
            16 => &[8],                // ProxyStep ← ProxyOp
            _ => &[],
        }
    };
    let mut sigs = Vec::new();
    for f in &files {
        let lines = parse(f);
        let init = &lines[0];
        assert_eq!((num(init, "v"), num(init, "nranks"), num(init, "nnodes")), (5, 3, 1), "init args");
        assert_eq!(num(init, "mask"), 0x7fff, "the mask the plugin saw after init");
        assert_eq!(num(init, "logfn"), 1, "a logger was passed");
        let (count, colls) = check_log(&lines, &parent_of);
        assert_eq!(count.get(&2), Some(&21), "Coll events: {count:?}");
        assert_eq!(count.get(&4), Some(&6), "P2p events: {count:?}");
        assert_eq!(count.get(&0x100), Some(&27), "GroupApi events: {count:?}");
        assert!(count.get(&16).copied().unwrap_or(0) > 50, "ProxyStep events: {count:?}");
        // v5 Coll lines carry NCCL's strings.
        assert!(lines
            .iter()
            .any(|l| l.kind == "start" && l.kv.get("dtype").map(String::as_str) == Some("ncclFloat32")));
        assert!(lines.iter().any(|l| l.kv.get("proto").map(String::as_str) == Some("SIMPLE")));
        sigs.push(colls);
    }
    assert!(sigs.iter().all(|s| s == &sigs[0]), "sequence numbers agree across ranks");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn v1_plugin_gets_numeric_codes_and_the_legacy_tree() {
    let dir = scratch("plugin-v1");
    build("recorder_v1.c", "nccl-profiler-rec1", &dir);
    let prefix = dir.join("rec1").to_string_lossy().to_string();
    let libdir = dir.to_string_lossy().to_string();
    // NCCL's spelling of the variable and a bare name (libnccl-profiler-rec1.so on the library
    // path); the plugin sets the mask itself (v1 types: Group..ProxyCtrl).
    let vars = [
        ("NCCL_PROFILER_PLUGIN", "rec1"),
        ("LD_LIBRARY_PATH", libdir.as_str()),
        ("OCCL_TEST_PLUGIN_LOG", prefix.as_str()),
        ("OCCL_TEST_PLUGIN_MASK", "0x3f"),
        ("OCCL_TRANSPORT", "tcp"),
        ("OCCL_TEST_EVENTS_DIR", libdir.as_str()),
    ];
    let outs = run_job(2, &["events"], Spawn { env: env(&vars), ..Spawn::default() }, Duration::from_secs(120));
    assert_all_ok(&outs, "job with the v1 plugin");
    let files = logs(&dir, "rec1-v1-");
    assert_eq!(files.len(), 2, "one log per rank: {files:?}");
    let parent_of = |ty: i64| -> &'static [i64] {
        match ty {
            2 | 4 => &[1], // Coll, P2p ← Group (v1 has no API events)
            8 => &[2, 4],
            16 => &[8],
            _ => &[],
        }
    };
    for f in &files {
        let lines = parse(f);
        assert_eq!(num(&lines[0], "v"), 1);
        let (count, _) = check_log(&lines, &parent_of);
        assert!(count.keys().all(|t| *t <= 0x20), "only v1 types reach a v1 plugin: {count:?}");
        assert_eq!(count.get(&2), Some(&21));
        assert_eq!(count.get(&1), Some(&27), "legacy Group events");
        // Numeric codes: AllReduce is 4, float32 7.
        assert!(lines.iter().any(|l| l.kind == "start"
            && l.kv.get("func").map(String::as_str) == Some("4")
            && l.kv.get("dtype").map(String::as_str) == Some("7")));
        // v1 ProxyStep states arrive, InProgress (19) and SendPeerWait (20) do not.
        let st: Vec<i64> = lines.iter().filter(|l| l.kind == "state").map(|l| num(l, "state")).collect();
        assert!(st.contains(&8) && st.contains(&10) && !st.contains(&19) && !st.contains(&20), "{st:?}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_plugin_that_cannot_load_leaves_the_job_working() {
    let dir = scratch("plugin-bad");
    build("no_symbol.c", "nccl-profiler-nosym", &dir);
    let bad = dir.join("libnccl-profiler-nosym.so").to_string_lossy().to_string();
    for spec in [bad.as_str(), "/nonexistent/libnccl-profiler-x.so"] {
        let d = dir.to_string_lossy().to_string();
        let vars = [("OCCL_PROFILER_PLUGIN", spec), ("OCCL_LOG", "warn"), ("OCCL_TEST_EVENTS_DIR", d.as_str())];
        let outs = run_job(2, &["events"], Spawn { env: env(&vars), ..Spawn::default() }, Duration::from_secs(120));
        assert_all_ok(&outs, "job with a broken plugin");
        for o in &outs {
            assert!(o.output.contains("profiler") && o.output.contains(spec), "rank {} says why: {}", o.rank, o.output);
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}
