//! Helpers of the tests that load the built library from outside: where cargo put it, scratch
//! directories, free ports, and the test span log (`OCCL_PROFILER_TEST_SPANS`) read back.
#![allow(dead_code)]

use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// `target/<profile>`, from this test executable (`target/<profile>/deps/<test>-<hash>`).
pub fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    exe.parent().and_then(Path::parent).expect("target/<profile>/deps/<test>").to_path_buf()
}

/// The cdylib cargo built for this test run (the lib target is built as cdylib and rlib at once).
pub fn built_library() -> PathBuf {
    let dir = profile_dir();
    let candidates = [dir.join("deps/libnccl_profiler_occl.so"), dir.join("libnccl_profiler_occl.so")];
    candidates.iter().find(|p| p.is_file()).cloned().unwrap_or_else(|| {
        panic!("libnccl_profiler_occl.so is not in {} (cargo builds it with the crate's tests)", dir.display())
    })
}

/// The library under NCCL's name for it, `libnccl-profiler-occl.so`, in `dir`.
pub fn install_as_nccl_name(dir: &Path) -> PathBuf {
    let dst = dir.join("libnccl-profiler-occl.so");
    std::fs::copy(built_library(), &dst).expect("copy the plugin");
    dst
}

/// A fresh, empty directory for one test (`occl-plugin-<tag>-<pid>` under the temp dir).
pub fn scratch(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("occl-plugin-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("scratch dir");
    d
}

/// A loopback port nobody listens on right now.
pub fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").port()
}

/// `GET path` on loopback; the whole answer.
pub fn http_get(port: u16, path: &str) -> String {
    use std::io::{Read, Write};
    let mut c = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect to /metrics");
    c.set_read_timeout(Some(std::time::Duration::from_secs(10))).expect("timeout");
    write!(c, "GET {path} HTTP/1.1\r\nHost: test\r\n\r\n").expect("send");
    let mut s = String::new();
    c.read_to_string(&mut s).expect("read answer");
    s
}

/// The labels `/metrics` adds to every series of the process (`nccl_profiler_occl::labels`).
pub const PROCESS_LABELS: [&str; 3] = ["job", "pid", "host"];

/// The value of the sample `name{labels}` in Prometheus text, whatever [`PROCESS_LABELS`] the
/// line has besides (label values here hold no comma).
pub fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|l| {
        let (head, value) = l.rsplit_once(' ')?;
        (without_process_labels(head) == series).then(|| value.trim().parse().ok()).flatten()
    })
}

/// `name{labels}` less [`PROCESS_LABELS`].
pub fn without_process_labels(head: &str) -> String {
    let Some((name, labels)) = head.split_once('{') else { return head.to_owned() };
    let kept: Vec<&str> = labels
        .trim_end_matches('}')
        .split(',')
        .filter(|kv| !PROCESS_LABELS.iter().any(|k| kv.starts_with(&format!("{k}=\""))))
        .collect();
    if kept.iter().all(|kv| kv.is_empty()) {
        name.to_owned()
    } else {
        format!("{name}{{{}}}", kept.join(","))
    }
}

/// One finished span of the test span log.
#[derive(Clone, Debug)]
pub struct SpanRec {
    pub id: u64,
    pub parent: Option<u64>,
    pub root: u64,
    pub ty: String,
    pub comm: String,
    pub rank: i64,
    pub d: Value,
    pub payload: Vec<u8>,
    /// (state, value) in arrival order.
    pub states: Vec<(u64, u64)>,
    pub start_ns: u64,
    pub end_ns: u64,
}

impl SpanRec {
    /// The communicator slot the handle names (its bits above the sequence number).
    pub fn comm_key(&self) -> u64 {
        self.id >> 40
    }

    pub fn str(&self, k: &str) -> &str {
        self.d.get(k).and_then(Value::as_str).unwrap_or_else(|| panic!("{} has no string {k}: {}", self.ty, self.d))
    }

    pub fn num(&self, k: &str) -> i64 {
        self.d.get(k).and_then(Value::as_i64).unwrap_or_else(|| panic!("{} has no number {k}: {}", self.ty, self.d))
    }

    pub fn state_numbers(&self) -> Vec<u64> {
        self.states.iter().map(|s| s.0).collect()
    }
}

/// A span log: the init/finalize lines and the spans, in file order.
#[derive(Debug, Default)]
pub struct SpanLog {
    pub inits: Vec<Value>,
    pub finalizes: Vec<Value>,
    pub spans: Vec<SpanRec>,
}

impl SpanLog {
    /// Reads every `<prefix>-<pid>.jsonl` of `dir` whose name starts with `prefix`.
    pub fn read(dir: &Path, prefix: &str) -> SpanLog {
        let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
            .expect("read dir")
            .map(|e| e.expect("entry").path())
            .filter(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with(&format!("{prefix}-"))))
            .collect();
        files.sort();
        assert!(!files.is_empty(), "no span log {prefix}-*.jsonl in {}", dir.display());
        let mut log = SpanLog::default();
        for f in files {
            let text = std::fs::read_to_string(&f).expect("span log");
            for line in text.lines() {
                let v: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{}: {e}: {line}", f.display()));
                match v["ev"].as_str() {
                    Some("init") => log.inits.push(v),
                    Some("finalize") => log.finalizes.push(v),
                    Some("span") => log.spans.push(span(&v)),
                    _ => panic!("unknown line {line}"),
                }
            }
        }
        log
    }

    /// Spans grouped by communicator (the handle's communicator slot).
    pub fn by_comm(&self) -> BTreeMap<u64, Vec<&SpanRec>> {
        let mut m: BTreeMap<u64, Vec<&SpanRec>> = BTreeMap::new();
        for s in &self.spans {
            m.entry(s.comm_key()).or_default().push(s);
        }
        m
    }

    /// Spans of one type per type name.
    pub fn counts<'a>(spans: &[&'a SpanRec]) -> BTreeMap<&'a str, usize> {
        let mut m = BTreeMap::new();
        for s in spans {
            *m.entry(s.ty.as_str()).or_default() += 1;
        }
        m
    }
}

fn span(v: &Value) -> SpanRec {
    let u = |k: &str| v[k].as_u64().unwrap_or_else(|| panic!("span without {k}: {v}"));
    SpanRec {
        id: u("id"),
        parent: v["parent"].as_u64(),
        root: u("root"),
        ty: v["type"].as_str().expect("type").to_owned(),
        comm: v["comm"].as_str().expect("comm").to_owned(),
        rank: v["rank"].as_i64().expect("rank"),
        d: v["d"].clone(),
        payload: v["payload"].as_array().expect("payload").iter().map(|b| b.as_u64().expect("byte") as u8).collect(),
        states: v["states"]
            .as_array()
            .expect("states")
            .iter()
            .map(|p| (p[0].as_u64().expect("state"), p[1].as_u64().expect("value")))
            .collect(),
        start_ns: u("start_ns"),
        end_ns: u("end_ns"),
    }
}

/// Checks that every span's parent is a span of one of the types `parent_of` allows, in the same
/// communicator; types mapped to `[]` have no parent.
pub fn check_parents(spans: &[&SpanRec], parent_of: &dyn Fn(&str) -> &'static [&'static str]) {
    let by_id: std::collections::HashMap<u64, &SpanRec> = spans.iter().map(|s| (s.id, *s)).collect();
    assert_eq!(by_id.len(), spans.len(), "span ids are unique");
    for s in spans {
        let want = parent_of(&s.ty);
        match s.parent {
            None => assert!(want.is_empty(), "{} {} has no parent; wants one of {want:?}", s.ty, s.id),
            Some(p) => {
                let pt = by_id.get(&p).map_or("(not a span of this communicator)", |x| x.ty.as_str());
                assert!(want.contains(&pt), "{} {} has a parent of type {pt}; wants one of {want:?}", s.ty, s.id);
            }
        }
    }
}
