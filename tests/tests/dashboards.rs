//! `dashboards/`: the Grafana boards and the Prometheus configuration and alert rules, checked against the real
//! thing. `promtool` checks the committed config and rules; the boards parse as Grafana dashboards; and Debian's
//! `prometheus`, running the committed config and rules (intervals and alert thresholds scaled down, the rewrite
//! listed in [`TEST_SCALE`]), scrapes a live 4-rank job through file-based discovery while the test takes it through
//! four phases: healthy, hung (one rank stops calling collectives), one process stopped (SIGSTOP) and one killed
//! (SIGKILL). Every panel's query, every template variable and every rule is evaluated in the phase where it must have
//! data; the test lists every one that returned nothing. The alerts must fire in their phase, RankDead within scrape
//! interval + its `for` + 10 s of the kill.
//!
//! `prometheus` and `promtool` are required (scripts/test.sh installs Debian's package): without them these tests fail.

mod common;

use common::prometheus::{find, Prometheus, Sample};
use common::{env, scratch, worker};
use occl_tests::launch::{Job, Spawn};
use occl_tests::ras_client::free_port;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

const RANKS: usize = 4;
const BOARDS: [&str; 2] = ["occl-overview.json", "occl-hang-triage.json"];
/// The job's name: its `OCCL_JOB_ID`, and the `job` label the test's targets file gives its target.
const JOB: &str = "occl-dashboards-test";
/// The rank that stops calling collectives (hung), the one stopped with SIGSTOP, the one killed.
const HUNG: usize = 1;
const STOPPED: usize = 3;
const KILLED: usize = 2;

/// What the test changes in the committed files, and to what: seconds instead of minutes. Each text must occur in the
/// committed file (so this list follows the files); `for:` lines are all set to [`TEST_FOR`].
const TEST_SCALE: [(&str, &str, &str); 6] = [
    ("prometheus.yml", "scrape_interval: 15s", "scrape_interval: 1s"),
    ("prometheus.yml", "scrape_timeout: 10s", "scrape_timeout: 1s"),
    ("prometheus.yml", "evaluation_interval: 15s", "evaluation_interval: 1s"),
    // Rate windows: 4 scrapes.
    ("alerts.yml", "[5m]", "[4s]"),
    // The bandwidth baseline: the job's healthy minute.
    ("alerts.yml", "[6h]", "[1m]"),
    // CollectiveStalled's threshold.
    ("alerts.yml", "occl_operation_in_flight_age_seconds) > 300", "occl_operation_in_flight_age_seconds) > 3"),
];
const TEST_FOR: &str = "2s";
const SCRAPE_S: u64 = 1;
/// Grafana's `$__rate_interval` at a 1 s scrape interval (four scrapes), and `$__range` for the stat panels.
const RATE_INTERVAL: &str = "4s";
const RANGE: &str = "1m";

fn dashboards_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../dashboards")
}

fn required(name: &str) -> PathBuf {
    find(name).unwrap_or_else(|| {
        panic!("`{name}` is not installed (Debian: apt-get install prometheus; scripts/test.sh installs it)")
    })
}

fn board(name: &str) -> Value {
    let path = dashboards_dir().join("grafana").join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{name} is not valid JSON: {e}"))
}

/// Every panel of a board, rows' nested panels included.
fn panels(b: &Value) -> Vec<&Value> {
    let mut out = Vec::new();
    for p in b["panels"].as_array().into_iter().flatten() {
        out.push(p);
        out.extend(p["panels"].as_array().into_iter().flatten());
    }
    out
}

#[test]
fn the_boards_are_grafana_dashboards_with_the_datasource_and_template_variables() {
    for name in BOARDS {
        let b = board(name);
        assert!(b["schemaVersion"].as_u64().is_some_and(|v| v >= 39), "{name}: schemaVersion {}", b["schemaVersion"]);
        assert!(b["uid"].as_str().is_some_and(|u| !u.is_empty() && u.len() <= 40), "{name}: uid");
        assert!(b["title"].as_str().is_some_and(|t| !t.is_empty()), "{name}: title");
        let vars: BTreeMap<&str, &Value> = b["templating"]["list"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|v| Some((v["name"].as_str()?, v)))
            .collect();
        assert_eq!(vars.get("datasource").map(|v| &v["type"]), Some(&Value::from("datasource")), "{name}");
        assert_eq!(vars["datasource"]["query"], "prometheus", "{name}");
        for v in ["job", "host", "comm", "rank"] {
            let var = vars.get(v).unwrap_or_else(|| panic!("{name}: no template variable {v}"));
            assert_eq!(var["type"], "query", "{name}: {v}");
            assert_eq!(var["datasource"]["uid"], "${datasource}", "{name}: {v}'s datasource");
            assert!(variable_query(var).is_some(), "{name}: {v} is not label_values(selector, label): {var}");
        }
        let all = panels(&b);
        let mut ids = BTreeSet::new();
        for p in &all {
            let id = p["id"].as_u64().unwrap_or_else(|| panic!("{name}: a panel without an id: {}", p["title"]));
            assert!(ids.insert(id), "{name}: panel id {id} is used twice");
            let g = &p["gridPos"];
            let (x, w) = (g["x"].as_u64().unwrap_or(99), g["w"].as_u64().unwrap_or(99));
            assert!(x + w <= 24 && g["h"].as_u64().is_some_and(|h| h > 0), "{name}: {}: gridPos {g}", p["title"]);
            if p["type"] == "row" {
                continue;
            }
            assert_eq!(p["datasource"]["uid"], "${datasource}", "{name}: {}: datasource", p["title"]);
            assert_eq!(p["datasource"]["type"], "prometheus", "{name}: {}: datasource type", p["title"]);
            let targets = p["targets"].as_array().cloned().unwrap_or_default();
            assert!(!targets.is_empty(), "{name}: {} has no query", p["title"]);
            for t in &targets {
                assert_eq!(t["datasource"]["uid"], "${datasource}", "{name}: {}: a target's datasource", p["title"]);
                assert!(t["expr"].as_str().is_some_and(|e| !e.trim().is_empty()), "{name}: {}: empty expr", p["title"]);
            }
        }
        assert!(all.iter().filter(|p| p["type"] != "row").count() >= 10, "{name}: too few panels");
    }
}

#[test]
fn promtool_passes_the_committed_config_and_rules() {
    let promtool = required("promtool");
    let dir = dashboards_dir().join("prometheus");
    for args in [["check", "config", "prometheus.yml"], ["check", "rules", "alerts.yml"]] {
        let out = Command::new(&promtool).args(args).current_dir(&dir).output().expect("run promtool");
        let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success(), "promtool {}: {said}", args.join(" "));
        assert!(!said.contains("WARNING"), "promtool {}: {said}", args.join(" "));
        eprintln!("promtool {}:\n{said}", args.join(" "));
    }
}

/// `label_values(selector, label)` → `(selector, label)`.
fn variable_query(var: &Value) -> Option<(String, String)> {
    let q = var["query"]["query"].as_str().or(var["definition"].as_str())?.trim();
    let inner = q.strip_prefix("label_values(")?.strip_suffix(')')?;
    let (sel, label) = inner.rsplit_once(',')?;
    Some((sel.trim().to_string(), label.trim().to_string()))
}

/// A query to evaluate: where it comes from, and its PromQL (Grafana variables still in it).
#[derive(Clone, Debug)]
struct Check {
    what: String,
    expr: String,
}

/// Every panel query of both boards, keyed by panel title.
fn panel_checks() -> Vec<(String, Check)> {
    let mut out = Vec::new();
    for name in BOARDS {
        let b = board(name);
        for p in panels(&b) {
            let title = p["title"].as_str().unwrap_or("").to_string();
            for t in p["targets"].as_array().into_iter().flatten() {
                let expr = t["expr"].as_str().unwrap_or("").to_string();
                let what = format!("{name} / {title} / {}", t["refId"].as_str().unwrap_or("?"));
                out.push((title.clone(), Check { what, expr }));
            }
        }
    }
    out
}

/// Replaces Grafana's variables: template variables with every value they have (Grafana's multi-value regex
/// form, dots escaped), and the built-in intervals with the test's.
fn substitute(expr: &str, vars: &BTreeMap<String, Vec<String>>) -> String {
    let mut e = expr.replace("$__rate_interval", RATE_INTERVAL).replace("$__range", RANGE).replace("$__interval", "1s");
    // Longest names first, so that no name is replaced inside another.
    let mut names: Vec<&String> = vars.keys().collect();
    names.sort_by_key(|n| std::cmp::Reverse(n.len()));
    for n in names {
        let alt = format!("({})", vars[n].iter().map(|v| v.replace('.', "\\\\.")).collect::<Vec<_>>().join("|"));
        e = e.replace(&format!("${{{n}}}"), &alt).replace(&format!("${n}"), &alt);
    }
    e
}

/// The test's copies of the committed config and rules, scaled per [`TEST_SCALE`], and a targets file naming `job`'s
/// `ports` on loopback.
fn test_config(dir: &Path, ports: &[u16], job: &str) -> String {
    let src = dashboards_dir().join("prometheus");
    let mut files: BTreeMap<&str, String> = BTreeMap::new();
    for f in ["prometheus.yml", "alerts.yml"] {
        files.insert(f, std::fs::read_to_string(src.join(f)).unwrap_or_else(|e| panic!("{f}: {e}")));
    }
    for (f, from, to) in TEST_SCALE {
        let text = files.get_mut(f).expect("a file of the list");
        assert!(text.contains(from), "{f} no longer has `{from}`: update TEST_SCALE");
        *text = text.replace(from, to);
    }
    let alerts = files.get_mut("alerts.yml").expect("rules");
    let mut fors = 0;
    *alerts = alerts
        .lines()
        .map(|l| match l.trim_start().strip_prefix("for: ") {
            Some(_) => {
                fors += 1;
                format!("{}for: {TEST_FOR}", &l[..l.len() - l.trim_start().len()])
            }
            None => l.to_string(),
        })
        .collect::<Vec<_>>()
        .join("\n");
    assert_eq!(fors, 6, "every alert has a `for:`");
    std::fs::write(dir.join("alerts.yml"), &files["alerts.yml"]).expect("write rules");
    std::fs::create_dir_all(dir.join("targets")).expect("targets dir");
    // The committed example's shape, pointing at this job.
    let example = std::fs::read_to_string(src.join("targets/example-job.yml")).expect("example targets file");
    assert!(example.contains("    job: "), "the example targets file labels its job");
    std::fs::write(
        dir.join("targets/test-job.yml"),
        format!(
            "- targets:\n{}  labels:\n    job: {job}\n",
            ports.iter().map(|p| format!("    - 127.0.0.1:{p}\n")).collect::<String>()
        ),
    )
    .expect("write targets");
    files["prometheus.yml"].clone()
}

/// The test's view of the running Prometheus: queries with the variables filled in, and what failed.
struct Checker<'a> {
    p: &'a Prometheus,
    vars: BTreeMap<String, Vec<String>>,
    failures: Vec<String>,
}

impl Checker<'_> {
    /// Evaluates `b`'s template variables in order (each one's values fill the later ones' queries) into `vars`;
    /// records a variable without values.
    fn fill_variables(&mut self, phase: &str, b: &Value) {
        self.vars.clear();
        for var in b["templating"]["list"].as_array().into_iter().flatten() {
            let Some((sel, label)) = variable_query(var) else { continue };
            let name = var["name"].as_str().unwrap_or("").to_string();
            let q = substitute(&format!("group by ({label}) ({sel})"), &self.vars);
            let values: Vec<String> = self
                .p
                .query(&q)
                .into_iter()
                .filter_map(|(l, _)| l.get(&label).cloned())
                .collect::<BTreeSet<_>>()
                .into_iter()
                .collect();
            eprintln!("{phase}: {} variable {name} = {values:?}", b["title"]);
            if values.is_empty() {
                self.failures.push(format!("{phase}: {}: template variable {name} has no values: {q}", b["title"]));
            }
            self.vars.insert(name, values);
        }
    }

    fn eval(&self, c: &Check) -> Result<Vec<Sample>, String> {
        self.p.try_query(&substitute(&c.expr, &self.vars))
    }

    /// Polls until every check returns data or `limit` passes; records the ones that never did (and PromQL errors).
    fn all_have_data(&mut self, phase: &str, checks: &[Check], limit: Duration) {
        let t = Instant::now();
        let mut pending: Vec<&Check> = checks.iter().collect();
        let mut errors = BTreeMap::new();
        while !pending.is_empty() && t.elapsed() < limit {
            pending.retain(|c| match self.eval(c) {
                Ok(v) => v.is_empty(),
                Err(e) => {
                    errors.insert(c.what.clone(), e);
                    false
                }
            });
            if !pending.is_empty() {
                std::thread::sleep(Duration::from_millis(250));
            }
        }
        eprintln!(
            "{phase}: {} of {} queries returned data in {:?}",
            checks.len() - pending.len(),
            checks.len(),
            t.elapsed()
        );
        for c in pending {
            self.failures.push(format!("{phase}: no data from {}:\n    {}", c.what, substitute(&c.expr, &self.vars)));
        }
        for (what, e) in errors {
            self.failures.push(format!("{phase}: {what} failed: {e}"));
        }
    }

    /// Records every check that has data now (it must not, in this phase).
    fn none_have_data(&mut self, phase: &str, checks: &[Check]) {
        for c in checks {
            match self.eval(c) {
                Ok(v) if v.is_empty() => {}
                Ok(v) => self.failures.push(format!("{phase}: {} has data when it must not: {v:?}", c.what)),
                Err(e) => self.failures.push(format!("{phase}: {} failed: {e}", c.what)),
            }
        }
    }

    /// Waits until alert `name` fires (with labels including `want`); returns when it did, or records the failure.
    fn fires(&mut self, phase: &str, name: &str, want: &[(&str, String)], limit: Duration) -> Option<Duration> {
        let t = Instant::now();
        loop {
            let active = self.p.alerts();
            let hit = active.iter().any(|(n, state, labels)| {
                n == name && state == "firing" && want.iter().all(|(k, v)| labels.get(*k) == Some(v))
            });
            if hit {
                eprintln!("{phase}: {name} fired after {:?}", t.elapsed());
                return Some(t.elapsed());
            }
            if t.elapsed() > limit {
                self.failures
                    .push(format!("{phase}: {name} {want:?} did not fire within {limit:?}; active: {active:?}"));
                return None;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

/// Fails with every recorded failure and Prometheus's log, if there are any.
fn no_failures(failures: &[String], p: &Prometheus) {
    assert!(
        failures.is_empty(),
        "{} failures:\n{}\n--- prometheus log:\n{}",
        failures.len(),
        failures.join("\n"),
        p.log()
    );
}

/// Waits until `q` returns something for which `ok` holds.
fn wait_for(p: &Prometheus, q: &str, limit: Duration, ok: impl Fn(&[Sample]) -> bool) -> Result<Vec<Sample>, String> {
    let t = Instant::now();
    loop {
        let v = p.try_query(q)?;
        if ok(&v) {
            return Ok(v);
        }
        if t.elapsed() > limit {
            return Err(format!("{q}: not as expected within {limit:?}: {v:?}"));
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

#[test]
fn every_panel_and_rule_has_data_from_a_live_job_and_the_alerts_fire_in_their_phase() {
    let prometheus = required("prometheus");
    let started = Instant::now();
    let dir = scratch("dashboards");
    let (port, own_port) = (free_port(), free_port());
    let addr = format!("127.0.0.1:{port}");
    let pause_dir = dir.join("pause");
    std::fs::create_dir_all(&pause_dir).expect("pause dir");
    // The stopped rank listens on a port of its own, so that the scrapes (which the kernel would otherwise hand to
    // any process sharing the port) never wait on it; the others still fetch its metrics over the mesh.
    let mut rank_env = vec![Vec::new(); RANKS];
    rank_env[STOPPED] = env(&[("OCCL_RAS_ADDR", &format!("127.0.0.1:{own_port}"))]);
    let spawn = Spawn {
        env: env(&[
            ("OCCL_RAS_ADDR", &addr),
            ("OCCL_JOB_ID", JOB),
            ("OCCL_METRICS", "1"),
            ("OCCL_TIMEOUT", "60"),
            ("OCCL_TEST_PAUSE_DIR", &pause_dir.display().to_string()),
        ]),
        rank_env,
        capture_stdout: true,
        capture_stderr: true,
        ..Spawn::default()
    };
    let job = Job::spawn(worker(), &["dashboards".to_string()], RANKS, &spawn).expect("start job");
    job.wait_for_all("READY", Duration::from_secs(60)).expect("ranks run");

    let config = test_config(&dir, &[port], JOB);
    let p = Prometheus::start(&prometheus, &config, &dir);
    // The rules as Prometheus loaded them: every alert and recording rule is a check.
    let (_, rules) = common::prometheus::get(p.port, "/api/v1/rules").unwrap_or_default();
    let rules: Value = serde_json::from_str(&rules).unwrap_or(Value::Null);
    let mut rule_checks: BTreeMap<String, Check> = BTreeMap::new();
    for g in rules["data"]["groups"].as_array().into_iter().flatten() {
        for r in g["rules"].as_array().into_iter().flatten() {
            let name = r["name"].as_str().unwrap_or("").to_string();
            let expr = r["query"].as_str().unwrap_or("").to_string();
            rule_checks.insert(name.clone(), Check { what: format!("alerts.yml / {name}"), expr });
        }
    }
    let alert_names =
        ["RankDead", "RankUnresponsive", "CollectiveStalled", "OpCountDivergence", "BusBandwidthDrop", "JobTargetDown"];
    for a in alert_names {
        assert!(rule_checks.contains_key(a), "Prometheus did not load alert {a}: {rules}\n{}", p.log());
    }
    assert_eq!(rule_checks.len(), 8, "{rule_checks:?}");

    // Which phase each query needs; the rest must have data in a healthy job.
    let phase_of = |key: &str| match key {
        "CollectiveStalled" | "OpCountDivergence" => "hung",
        "BusBandwidthDrop" => "resumed",
        "RankUnresponsive" | "Absent ranks" | "Absent ranks by state" => "stopped",
        "RankDead" | "Failed operations by collective and error kind" => "killed",
        // This job's survivors keep its port; tests/tests/alerts.rs ends a whole job.
        "JobTargetDown" => "ended",
        _ => "healthy",
    };
    let mut by_phase: BTreeMap<&str, Vec<Check>> = BTreeMap::new();
    let panel_list = panel_checks();
    let titles: BTreeSet<&str> = panel_list.iter().map(|(t, _)| t.as_str()).collect();
    for t in ["Absent ranks", "Absent ranks by state", "Failed operations by collective and error kind"] {
        assert!(titles.contains(t), "no panel titled {t:?} any more: update the phase list");
    }
    for (title, c) in &panel_list {
        by_phase.entry(phase_of(title)).or_default().push(c.clone());
    }
    for (name, c) in &rule_checks {
        by_phase.entry(phase_of(name)).or_default().push(c.clone());
    }

    // Healthy: the template variables first (their values fill every other query), once a few scrapes are in.
    let mut ck = Checker { p: &p, vars: BTreeMap::new(), failures: Vec::new() };
    wait_for(&p, "count_over_time(occl_collective_operations_total[10s])", Duration::from_secs(30), |v| {
        v.iter().all(|(_, n)| *n >= 6.0) && !v.is_empty()
    })
    .unwrap_or_else(|e| panic!("scrapes: {e}\n{}", p.log()));
    ck.fill_variables("healthy", &board(BOARDS[0]));
    assert_eq!(ck.vars.get("job"), Some(&vec![JOB.to_string()]), "the job's own label names the job");
    assert_eq!(ck.vars.get("host"), Some(&vec![host_name()]), "RAS's host label: the host name");
    assert_eq!(ck.vars.get("rank").map(Vec::len), Some(RANKS), "{:?}", ck.vars);
    let healthy = by_phase.remove("healthy").unwrap_or_default();
    ck.all_have_data("healthy", &healthy, Duration::from_secs(30));
    let failure_only: Vec<Check> = by_phase
        .iter()
        .filter(|(ph, _)| **ph != "hung" && **ph != "resumed")
        .flat_map(|(_, v)| v.iter().cloned())
        .chain(["CollectiveStalled"].iter().map(|n| rule_checks[*n].clone()))
        .collect();
    ck.none_have_data("healthy", &failure_only);
    for (name, state, labels) in p.alerts() {
        if ["RankDead", "RankUnresponsive", "CollectiveStalled"].contains(&name.as_str()) {
            ck.failures.push(format!("healthy: {name} is {state}: {labels:?}"));
        }
    }

    // Hung: one rank stops calling collectives; the others wait in their next all-reduce.
    std::fs::write(pause_dir.join(format!("pause-{HUNG}")), b"").expect("pause");
    let hung = by_phase.remove("hung").unwrap_or_default();
    for r in (0..RANKS).filter(|r| *r != HUNG) {
        ck.fires("hung", "CollectiveStalled", &[("rank", r.to_string()), ("job", JOB.into())], Duration::from_secs(30));
    }
    ck.fires("hung", "OpCountDivergence", &[("op", "AllReduce".into())], Duration::from_secs(20));
    ck.all_have_data("hung", &hung, Duration::from_secs(5));
    let stuck = p.query(&format!("occl_operation_in_flight_age_seconds{{rank=\"{HUNG}\"}} > 1"));
    if !stuck.is_empty() {
        ck.failures.push(format!("hung: the rank that stopped calling collectives is in one: {stuck:?}"));
    }

    // Resumed: the stalled all-reduce ends with a duration of seconds; the bandwidth falls below the baseline.
    std::fs::remove_file(pause_dir.join(format!("pause-{HUNG}"))).expect("resume");
    let resumed = by_phase.remove("resumed").unwrap_or_default();
    ck.all_have_data("resumed", &resumed, Duration::from_secs(15));
    // Not noise: the drop is in the all-reduce the others waited in (at this test's short windows a busy 2-core
    // machine can halve another collective's bandwidth for a moment, so that is not checked while healthy).
    let bw_drop = &rule_checks["BusBandwidthDrop"].expr;
    if let Err(e) = wait_for(&p, bw_drop, Duration::from_secs(15), |v| {
        v.iter().any(|(l, _)| l.get("op").map(String::as_str) == Some("AllReduce"))
    }) {
        ck.failures.push(format!("resumed: no AllReduce bandwidth drop: {e}"));
    }

    // Stopped: RAS calls the process unresponsive; its ranks are named absent.
    job.signal(STOPPED, libc::SIGSTOP).expect("stop");
    let stopped_pid = job.children[STOPPED].id().to_string();
    ck.fires(
        "stopped",
        "RankUnresponsive",
        &[("rank", STOPPED.to_string()), ("pid", stopped_pid), ("host", host_name())],
        Duration::from_secs(25),
    );
    let stopped = by_phase.remove("stopped").unwrap_or_default();
    ck.all_have_data("stopped", &stopped, Duration::from_secs(5));
    job.signal(STOPPED, libc::SIGCONT).expect("continue");
    if let Err(e) = wait_for(&p, "count(occl_ras_rank_missing)", Duration::from_secs(20), |v| v.is_empty()) {
        ck.failures.push(format!("continued: the process did not rejoin: {e}"));
    }

    // Killed: RankDead fires within a scrape interval, its `for` and 10 s, naming the rank, its process and node.
    let killed_pid = job.children[KILLED].id().to_string();
    job.signal(KILLED, libc::SIGKILL).expect("kill");
    let bound = Duration::from_secs(SCRAPE_S + TEST_FOR.trim_end_matches('s').parse::<u64>().unwrap_or(0) + 10);
    let want = [("rank", KILLED.to_string()), ("pid", killed_pid), ("host", host_name()), ("job", JOB.into())];
    if let Some(after) = ck.fires("killed", "RankDead", &want, bound) {
        eprintln!("RankDead fired {after:?} after SIGKILL (bound {bound:?})");
    }
    let killed = by_phase.remove("killed").unwrap_or_default();
    ck.all_have_data("killed", &killed, Duration::from_secs(15));
    by_phase.remove("ended");
    assert!(by_phase.is_empty(), "phases never run: {by_phase:?}");

    eprintln!("the whole check took {:?}", started.elapsed());
    let failures = std::mem::take(&mut ck.failures);
    drop(job);
    no_failures(&failures, &p);
}

/// This machine's host name, as the `host` label has it.
fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname").map(|s| s.trim().to_string()).unwrap_or_default()
}

/// The job on NCCL's route: the plugin's name for its `OCCL_JOB_ID`.
const PLUGIN_JOB: &str = "occl-dashboards-plugin-test";
/// Processes of the plugin job on this host (launcher local ranks 0 and 1: the plugin's port + local rank).
const PLUGIN_PROCESSES: u16 = 2;
/// The panels a job on NCCL's profiler plugin fills: the overview's built on the exporter's series (the others are
/// RAS's, occl's transport notes, or failure-only) and the hang-triage board's in-flight ages.
const PLUGIN_PANELS: [&str; 17] = [
    "Ranks reporting",
    "Collectives per second",
    "Bus bandwidth",
    "Failed operations (time range)",
    "Bus bandwidth by collective and size class",
    "Latency p50 and p99 by collective and size class",
    "Message sizes",
    "Average message size by collective",
    "Operations per second by collective",
    "Point-to-point latency p99",
    "Proxy step wait time by state",
    "Mean collective time per rank",
    "Share of time in collectives per rank",
    "Bus bandwidth per rank",
    "Oldest operation in flight",
    "Oldest in-flight operation age per rank",
    "Longest-running operations now",
];

/// The plugin cargo built beside this test (`target/<profile>/deps`, as a dependency of this crate).
fn plugin_library() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable");
    let lib = exe.parent().expect("deps dir").join("libnccl_profiler_occl.so");
    assert!(lib.is_file(), "{} is missing: cargo builds it with occl-tests' tests", lib.display());
    lib
}

/// The plugin's NCCL-shaped C host (telemetry/plugin/tests/host/host.c) for profiler API v6, built in `dir`.
fn nccl_host(dir: &Path) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../telemetry/plugin/tests/host/host.c");
    let out = dir.join("nccl_host_v6");
    let res = Command::new("cc")
        .args(["-O1", "-std=c11", "-Wall", "-Wextra", "-Werror", "-DHOST_API=6", "-o"])
        .arg(&out)
        .arg(&src)
        .args(["-ldl", "-lpthread"])
        .output()
        .unwrap_or_else(|e| panic!("cannot run the C compiler `cc` ({e}); install gcc (scripts/test.sh does)"));
    assert!(res.status.success(), "building the host:\n{}", String::from_utf8_lossy(&res.stderr));
    out
}

/// A loopback port `p` such that `p .. p + n` are all free now.
fn free_ports(n: u16) -> u16 {
    (0..100)
        .find_map(|_| {
            let p = free_port();
            let held: Vec<_> =
                (1..n).filter_map(|i| std::net::TcpListener::bind(("127.0.0.1", p.checked_add(i)?)).ok()).collect();
            (held.len() == usize::from(n) - 1).then_some(p)
        })
        .expect("a run of free ports")
}

/// Child processes killed (and reaped) when the test ends, passed or not.
struct Children(Vec<std::process::Child>);

impl Drop for Children {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

#[test]
fn a_job_on_nccls_profiler_plugin_fills_the_board_variables_and_main_panels() {
    let prometheus = required("prometheus");
    let dir = scratch("dashboards-plugin");
    std::fs::copy(plugin_library(), dir.join("libnccl-profiler-occl.so")).expect("copy the plugin");
    let host = nccl_host(&dir);
    let base = free_ports(PLUGIN_PROCESSES);
    // Two processes of one job on this host, as a launcher starts them: each loads the plugin by NCCL's name for it,
    // with Prometheus metrics on, and serves /metrics on the default address's scheme, port + local rank. Each emits
    // NCCL's events of two communicators from its application, proxy, network and proxy-control threads, a round of
    // 16 iterations every 200 ms.
    let mut children = Children(Vec::new());
    for r in 0..PLUGIN_PROCESSES {
        let mut c = Command::new(&host);
        c.arg("libnccl-profiler-occl.so").arg("run").current_dir(&dir).env("LD_LIBRARY_PATH", &dir);
        for k in ["OCCL_PROFILER_TEST_SPANS", "OCCL_PROFILER_TEST_MASK", "HOST_PAUSE", "HOST_METRICS_PORT"]
            .into_iter()
            .chain(["OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "OTEL_EXPORTER_OTLP_ENDPOINT", "OCCL_TRACE_FILE"])
        {
            c.env_remove(k);
        }
        c.envs([
            ("OCCL_METRICS", "1".to_string()),
            ("OCCL_METRICS_ADDR", format!("127.0.0.1:{base}")),
            ("LOCAL_RANK", r.to_string()),
            ("OCCL_JOB_ID", PLUGIN_JOB.to_string()),
            ("HOST_ROUNDS", "1000".to_string()),
            ("HOST_ROUND_MS", "200".to_string()),
        ]);
        c.stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(dir.join(format!("host-{r}.err"))).expect("log"));
        children.0.push(c.spawn().expect("start the host"));
    }
    let ports: Vec<u16> = (0..PLUGIN_PROCESSES).map(|r| base + r).collect();
    let t = Instant::now();
    for &port in &ports {
        loop {
            let body = common::prometheus::get(port, "/metrics").map(|(_, b)| b).unwrap_or_default();
            if body.contains("occl_communicator_info{") {
                break;
            }
            assert!(t.elapsed() < Duration::from_secs(30), "no /metrics on port {port}:\n{body}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    let config = test_config(&dir, &ports, PLUGIN_JOB);
    let p = Prometheus::start(&prometheus, &config, &dir);
    wait_for(&p, "count_over_time(occl_collective_operations_total[10s])", Duration::from_secs(30), |v| {
        v.iter().all(|(_, n)| *n >= 6.0) && !v.is_empty()
    })
    .unwrap_or_else(|e| panic!("scrapes: {e}\n{}", p.log()));

    let mut ck = Checker { p: &p, vars: BTreeMap::new(), failures: Vec::new() };
    for name in BOARDS {
        ck.fill_variables("plugin", &board(name));
        let v = |n: &str| ck.vars.get(n).cloned().unwrap_or_default();
        assert_eq!(v("job"), [PLUGIN_JOB], "{name}: the job's own label names the job");
        assert_eq!(v("host"), [host_name()], "{name}: the plugin's host label: the host name");
        assert_eq!(v("comm"), ["0000000000001000", "0000000000001001"], "{name}: the host's two communicators");
        assert_eq!(v("rank"), ["0", "1"], "{name}");
    }
    // Every series carries the label set of a job on occl, from both processes.
    let pids: BTreeSet<String> =
        p.query("occl_communicator_info").into_iter().filter_map(|(l, _)| l.get("pid").cloned()).collect();
    let want: BTreeSet<String> = children.0.iter().map(|c| c.id().to_string()).collect();
    assert_eq!(pids, want, "a pid label per process");

    ck.fill_variables("plugin", &board(BOARDS[0]));
    let main: Vec<Check> = panel_checks()
        .into_iter()
        .filter(|(title, _)| PLUGIN_PANELS.contains(&title.as_str()))
        .map(|(_, c)| c)
        .collect();
    let all = panel_checks();
    let titles: BTreeSet<&str> = all.iter().map(|(t, _)| t.as_str()).collect();
    for t in PLUGIN_PANELS {
        assert!(titles.contains(t), "no panel titled {t:?} any more: update PLUGIN_PANELS");
    }
    ck.all_have_data("plugin", &main, Duration::from_secs(30));
    // Not only present: the job is running collectives.
    let rate = &main.iter().find(|c| c.what.contains("/ Collectives per second /")).expect("panel").expr;
    if let Err(e) =
        wait_for(&p, &substitute(rate, &ck.vars), Duration::from_secs(10), |v| v.iter().any(|(_, x)| *x > 0.0))
    {
        ck.failures.push(format!("plugin: collectives per second: {e}"));
    }
    // One in-flight series per communicator rank of each process.
    let ages = p.query(&format!("occl_operation_in_flight_age_seconds{{job=\"{PLUGIN_JOB}\"}}"));
    if ages.len() != 2 * usize::from(PLUGIN_PROCESSES) || ages.iter().any(|(_, a)| !(0.0..5.0).contains(a)) {
        ck.failures.push(format!("plugin: in-flight ages: {ages:?}"));
    }
    let failures = std::mem::take(&mut ck.failures);
    drop(children);
    no_failures(&failures, &p);
}
