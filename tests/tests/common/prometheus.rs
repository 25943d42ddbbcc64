//! Debian's real `prometheus` and `promtool` for the tests that check what a live job's RAS port serves: find them
//! (a skip that says why, a failure under CI), run a server on a free loopback port, query its HTTP API.

use occl_tests::ras_client::free_port;
use serde_json::Value;
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// `name` on PATH, or `None` after saying plainly that the test is skipped (a failure under CI).
pub fn tool(name: &str) -> Option<PathBuf> {
    let found = find(name);
    if found.is_none() {
        let why = format!("`{name}` is not installed (Debian: apt-get install prometheus; scripts/test.sh does it)");
        assert!(std::env::var_os("CI").is_none(), "CI: {why}");
        // Straight to the stream, past the test harness's capture: a skip must be seen.
        let _ = writeln!(std::io::stderr(), "SKIPPED prometheus test: {why}");
    }
    found
}

/// `name` on PATH.
pub fn find(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// A config that scrapes `127.0.0.1:target` every second.
pub fn one_target_config(target: u16) -> String {
    format!(
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n\
         scrape_configs:\n  - job_name: occl\n    static_configs:\n      - targets: ['127.0.0.1:{target}']\n"
    )
}

/// A Prometheus server for the test's lifetime.
pub struct Prometheus {
    child: Child,
    pub port: u16,
    dir: PathBuf,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One series of an instant query's answer: its labels and value.
pub type Sample = (BTreeMap<String, String>, f64);

impl Prometheus {
    /// Starts `bin` with `config` (written to `dir/prometheus.yml`; rule files it names are the caller's), listening
    /// on a free loopback port, storing in `dir`; returns once it is ready.
    pub fn start(bin: &Path, config: &str, dir: &Path) -> Prometheus {
        let file = dir.join("prometheus.yml");
        std::fs::write(&file, config).expect("write config");
        let port = free_port();
        let child = Command::new(bin)
            .arg(format!("--config.file={}", file.display()))
            .arg(format!("--storage.tsdb.path={}", dir.join("data").display()))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .arg("--log.level=warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("prometheus.log")).map_or(Stdio::null(), Stdio::from))
            .spawn()
            .expect("start prometheus");
        let p = Prometheus { child, port, dir: dir.to_path_buf() };
        let t = Instant::now();
        while get(port, "/-/ready").map(|(c, _)| c) != Some(200) {
            assert!(t.elapsed() < Duration::from_secs(30), "prometheus not ready: {}", p.log());
            std::thread::sleep(Duration::from_millis(100));
        }
        p
    }

    /// What the server logged.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("prometheus.log")).unwrap_or_default()
    }

    /// An instant query: each result's labels and value (empty when the server does not answer).
    pub fn query(&self, q: &str) -> Vec<Sample> {
        match self.try_query(q) {
            Ok(v) => v,
            Err(e) => panic!("query {q}: {e}"),
        }
    }

    /// An instant query, or why Prometheus refused it (a PromQL error, a timeout).
    pub fn try_query(&self, q: &str) -> Result<Vec<Sample>, String> {
        let (code, body) = get(self.port, &format!("/api/v1/query?query={}", percent(q))).unwrap_or_default();
        if code == 0 {
            return Ok(Vec::new()); // not answering at all: the callers poll
        }
        let v: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
        if code != 200 || v["status"] != "success" {
            return Err(format!("HTTP {code}: {body}"));
        }
        let results = match &v["data"]["result"] {
            Value::Array(a) if v["data"]["resultType"] == "vector" => a.clone(),
            // A scalar or a string: one unlabelled value.
            Value::Array(a) if !a.is_empty() => vec![serde_json::json!({ "metric": {}, "value": a })],
            _ => Vec::new(),
        };
        Ok(results
            .iter()
            .map(|r| {
                let labels = r["metric"]
                    .as_object()
                    .map(|o| o.iter().map(|(k, v)| (k.clone(), v.as_str().unwrap_or("").to_string())).collect())
                    .unwrap_or_default();
                let value = r["value"][1].as_str().and_then(|s| s.parse().ok()).unwrap_or(f64::NAN);
                (labels, value)
            })
            .collect())
    }

    /// A query's whole answer as Prometheus wrote it (a range selector's samples, for a failure message).
    pub fn raw(&self, q: &str) -> String {
        get(self.port, &format!("/api/v1/query?query={}", percent(q))).map(|(_, b)| b).unwrap_or_default()
    }

    /// `/api/v1/metadata`: each metric family's type and unit as the server learnt them from its scrapes (a unit
    /// comes only from OpenMetrics' `# UNIT`).
    pub fn metadata(&self) -> BTreeMap<String, (String, String)> {
        let (_, body) = get(self.port, "/api/v1/metadata").unwrap_or_default();
        let v: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
        v["data"]
            .as_object()
            .map(|o| {
                o.iter()
                    .filter_map(|(name, m)| {
                        let m = m.as_array()?.first()?;
                        let s = |k: &str| m[k].as_str().unwrap_or("").to_string();
                        Some((name.clone(), (s("type"), s("unit"))))
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    /// `/api/v1/alerts`: each active alert's name, state (`pending`, `firing`) and labels.
    pub fn alerts(&self) -> Vec<(String, String, BTreeMap<String, String>)> {
        let (_, body) = get(self.port, "/api/v1/alerts").unwrap_or_default();
        let v: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
        v["data"]["alerts"]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|x| {
                        let labels: BTreeMap<String, String> = x["labels"]
                            .as_object()
                            .map(|o| o.iter().map(|(k, v)| (k.clone(), v.as_str().unwrap_or("").to_string())).collect())
                            .unwrap_or_default();
                        let name = labels.get("alertname").cloned().unwrap_or_default();
                        (name, x["state"].as_str().unwrap_or("").to_string(), labels)
                    })
                    .collect()
            })
            .unwrap_or_default()
    }
}

pub fn percent(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// `GET path` on a fresh connection; the status and the body (de-chunked).
pub fn get(port: u16, path: &str) -> Option<(u16, String)> {
    get_with(port, path, "").map(|(code, _, body)| (code, body))
}

/// `GET path` with `headers` (each line ending in `\r\n`) on a fresh connection; the status, the response head
/// and the body (de-chunked).
pub fn get_with(port: u16, path: &str, headers: &str) -> Option<(u16, String, String)> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    write!(s, "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{headers}Connection: close\r\n\r\n").ok()?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).ok()?;
    let raw = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = raw.split_once("\r\n\r\n")?;
    let code = head.split_whitespace().nth(1)?.parse().ok()?;
    let head_text = head.to_string();
    if !head.to_ascii_lowercase().contains("transfer-encoding: chunked") {
        return Some((code, head_text, body.to_string()));
    }
    let mut out = String::new();
    let mut rest = body;
    while let Some((size, tail)) = rest.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).ok()?;
        if n == 0 {
            break;
        }
        out.push_str(tail.get(..n)?);
        rest = tail.get(n + 2..)?;
    }
    Some((code, head_text, out))
}
