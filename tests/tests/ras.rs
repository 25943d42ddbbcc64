//! RAS in real jobs on loopback: every rank's process runs the RAS thread; the test talks to the job's client port
//! (`OCCL_RAS_ADDR`, a free port per job) with NCCL's text protocol and with HTTP, kills and stops processes, and
//! checks what RAS reports and how fast.

mod common;

use common::{env, worker};
use occl_tests::launch::{Job, Spawn};
use occl_tests::ras_client::{free_port, http_get, ncclras, without_job};
use serde_json::Value;
use std::time::{Duration, Instant};

fn start(nranks: usize, args: &[&str], port: u16, extra: &[(&str, &str)]) -> Job {
    start_with(nranks, args, port, extra, false)
}

/// As `start`, but each rank's process listens on a port of its own (rank 0 on `port`, the others on free ports
/// of their own, never `port + r`, which another test may have been given), so the test can ask one given
/// process: the one it did not stop or kill. With a shared port the kernel picks the process, and a connection
/// that lands on a stopped one waits for its timeout.
fn start_with(nranks: usize, args: &[&str], port: u16, extra: &[(&str, &str)], own_ports: bool) -> Job {
    let addr = format!("127.0.0.1:{port}");
    let mut vars = vec![("OCCL_RAS_ADDR", addr.as_str())];
    vars.extend_from_slice(extra);
    let rank_env = if own_ports {
        let own = |r: usize| if r == 0 { port } else { free_port() };
        (0..nranks).map(|r| env(&[("OCCL_RAS_ADDR", &format!("127.0.0.1:{}", own(r)))])).collect()
    } else {
        Vec::new()
    };
    let spawn = Spawn { env: env(&vars), rank_env, capture_stdout: true, capture_stderr: true, ..Spawn::default() };
    let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    let job = Job::spawn(worker(), &args, nranks, &spawn).expect("start job");
    job.wait_for_all("READY", Duration::from_secs(30)).expect("ranks ready");
    // Ranks report READY before their RAS links are all up; a gather then would miss some. Wait until every
    // process answers (in practice a few ms).
    let job_id = extra.iter().find(|(k, _)| *k == "OCCL_JOB_ID").map(|(_, v)| *v);
    let t = Instant::now();
    loop {
        let body = scrape_job(port, job_id, 2.0);
        if metric(&body, "occl_ras_peers{state=\"alive\"}") == Some(nranks as f64)
            && metric(&body, "occl_ras_peers{state=\"missing\"}") == Some(0.0)
        {
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(15), "the RAS mesh never saw all {nranks} processes:\n{body}");
        std::thread::sleep(Duration::from_millis(50));
    }
    job
}

/// The value of a metric line `name{labels} v` (first match), from a `/metrics` body.
fn metric(body: &str, name_and_labels: &str) -> Option<f64> {
    body.lines().find(|l| l.starts_with(name_and_labels)).and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

/// `/metrics`, retried: a connection can land on a stopped process's listener (they share the port), which then
/// never answers; a client gives up on it and connects again, as NVIDIA's `ncclras` does.
fn scrape(port: u16) -> String {
    scrape_within(port, 2.0)
}

/// As `scrape`, with a gather budget of `secs` (a gather waits that long for a silent process).
fn scrape_within(port: u16, secs: f64) -> String {
    scrape_job(port, None, secs)
}

/// As `scrape_within`, of one job of the node (`None`: all of them), without the `job` labels.
fn scrape_job(port: u16, job: Option<&str>, secs: f64) -> String {
    for _ in 0..20 {
        let path = format!("/metrics?timeout={secs}{}", job.map_or(String::new(), |j| format!("&job={j}")));
        if let Ok((200, body)) = http_get(port, &path, Duration::from_secs_f64(secs + 1.0)) {
            return without_job(&body);
        }
    }
    panic!("no /metrics answer on port {port}");
}

#[test]
fn a_healthy_job_reports_every_rank() {
    let port = free_port();
    let job = start(3, &["idle"], port, &[]);
    // Ranks report READY before their RAS links are all up: wait (briefly) until every rank answers.
    let t = Instant::now();
    let v: Value = loop {
        let (code, body) = http_get(port, "/api/v1/status", Duration::from_secs(10)).expect("status");
        assert_eq!(code, 200, "{body}");
        let v: Value = serde_json::from_str(&body).expect("the JSON report parses");
        if v["communicators"][0]["missing_ranks_count"] == 0 || t.elapsed() > Duration::from_secs(10) {
            break v;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(v["communicators_count"], 1, "{v}");
    let c = &v["communicators"][0];
    assert_eq!(
        (c["size"].as_u64(), c["ranks_count"].as_u64(), c["missing_ranks_count"].as_u64()),
        (Some(3), Some(3), Some(0))
    );
    for r in c["ranks"].as_array().expect("ranks") {
        assert_eq!(r["collective_counts"]["AllReduce"], 5, "{r}");
        // occl's totals: every operation the worker ran returned, so none is in flight.
        let ops = &r["occl_operations"];
        assert!(ops["launched"].as_u64() >= Some(5) && ops["launched"] == ops["completed"], "{r}");
        assert_eq!(r["host"], "127.0.0.1");
    }
    // NCCL's text protocol on the same port.
    let text = ncclras(port, "CLIENT PROTOCOL 2\nSTATUS\n", Duration::from_secs(10)).expect("text status");
    assert!(text.starts_with("SERVER PROTOCOL 2\n"), "{text}");
    assert!(text.contains("Job summary") && text.contains("Communicators..."), "{text}");
    // NCCL's layout: one communicator group, 1 node, 3 ranks, running, no errors, empty sections.
    let row = text.lines().find(|l| l.trim_start().starts_with("0 ")).unwrap_or_default();
    let cols: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(cols, ["0", "1", "1", "3", "3", "3", "RUNNING", "OK"], "{text}");
    assert!(text.ends_with("Errors\n======\n\nWarnings\n========\n\n"), "{text}");
    let (code, ok) = http_get(port, "/healthz", Duration::from_secs(5)).expect("healthz");
    assert_eq!((code, ok.as_str()), (200, "ok\n"));
    drop(job);
}

#[test]
fn a_destroyed_sub_communicator_reads_nocomm() {
    let port = free_port();
    let job = start(3, &["subcomm", "1"], port, &[]);
    let text = ncclras(port, "STATUS\n", Duration::from_secs(10)).expect("status");
    // Two communicators: the world one is fine; the other is NOCOMM on rank 1, whose process destroyed it.
    assert!(text.contains("NOCOMM"), "{text}");
    let warn = text.split("Warnings\n========\n\n").nth(1).unwrap_or_default();
    assert!(warn.contains("Rank 1 has status NOCOMM"), "{text}");
    drop(job);
}

#[test]
fn a_killed_process_is_dead_within_5s() {
    let port = free_port();
    // Rank 0's own port: the question goes to a survivor.
    let job = start_with(3, &["idle"], port, &[], true);
    let body = scrape(port);
    assert_eq!(metric(&body, "occl_ras_peers{state=\"alive\"}"), Some(3.0), "{body}");
    job.signal(2, libc::SIGKILL).expect("kill rank 2");
    let t = Instant::now();
    loop {
        let body = scrape(port);
        if metric(&body, "occl_ras_peers{state=\"dead\"}") == Some(1.0) {
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(5), "rank 2 not reported dead after 5 s:\n{body}");
        std::thread::sleep(Duration::from_millis(100));
    }
    eprintln!("killed process reported dead after {:?}", t.elapsed());
    // The report names it: DEAD with its pid and node, and the communicator INCOMPLETE without rank 2.
    let pid = job.children[2].id();
    let text = ncclras(port, "STATUS\n", Duration::from_secs(10)).expect("status");
    let dead = text.split("DEAD\n").nth(1).unwrap_or_default();
    assert!(dead.starts_with("  1 job process is considered dead"), "{text}");
    assert!(dead.contains(&format!("Process {pid} on node 127.0.0.1")), "{text}");
    assert!(text.contains("INCOMPLETE\n  Missing communicator data from 1 rank\n  Rank 2 "), "{text}");
}

#[test]
fn a_hung_job_names_the_lagging_rank_and_what_the_others_wait_in() {
    let port = free_port();
    // Rank 1 stops after 5 all-reduces; ranks 0 and 2 wait in the 6th.
    let job = start(3, &["hang", "1"], port, &[("OCCL_TIMEOUT", "120")]);
    std::thread::sleep(Duration::from_millis(1500));
    let text = ncclras(port, "STATUS\n", Duration::from_secs(10)).expect("status");
    let warn = text.split("Warnings\n========\n\n").nth(1).unwrap_or_default();
    assert!(warn.contains("MISMATCH"), "{text}");
    assert!(warn.contains("AllReduce"), "the per-collective count that differs: {text}");
    let stuck = text.split("Stuck operations (occl)\n").nth(1).unwrap_or_else(|| panic!("no stuck section:\n{text}"));
    for r in [0, 2] {
        let line = stuck.lines().find(|l| l.contains(&format!("Rank {r} in AllReduce operation 6 for")));
        let line = line.unwrap_or_else(|| panic!("rank {r} not listed as stuck in its 6th all-reduce:\n{text}"));
        assert!(line.contains("waiting on rank"), "{line}");
    }
    assert!(!stuck.contains("Rank 1 in"), "rank 1 is idle, not stuck: {text}");
    // The same on /metrics, for dashboards and alerts.
    let body = scrape(port);
    let spread = body.lines().find(|l| l.starts_with("occl_ras_op_count_spread") && l.contains("op=\"AllReduce\""));
    assert!(spread.is_some_and(|l| l.ends_with(" 1")), "{body}");
    assert!(body.lines().any(|l| l.starts_with("occl_ras_comm_mismatch") && l.ends_with(" 1")), "{body}");
    drop(job);
}

#[test]
fn a_stopped_process_is_unresponsive_then_rejoins_without_a_death() {
    let port = free_port();
    let job = start_with(3, &["idle"], port, &[], true);
    job.signal(2, libc::SIGSTOP).expect("stop rank 2");
    let t = Instant::now();
    let (mut missing, mut unresponsive) = (None, None);
    while t.elapsed() < Duration::from_secs(9) {
        // A short gather budget: each scrape waits that long for the stopped process, which bounds how precisely
        // the test sees the moment it turns unresponsive.
        let body = scrape_within(port, 0.5);
        assert_eq!(metric(&body, "occl_ras_peers{state=\"dead\"}"), Some(0.0), "a stopped process was called dead");
        if missing.is_none() && metric(&body, "occl_ras_peers{state=\"missing\"}") == Some(1.0) {
            missing = Some(t.elapsed());
        }
        if unresponsive.is_none() && metric(&body, "occl_ras_peers{state=\"unresponsive\"}") == Some(1.0) {
            unresponsive = Some(t.elapsed());
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let (missing, unresponsive) = (missing.expect("never missing"), unresponsive.expect("never unresponsive"));
    eprintln!("stopped process: missing from reports after {missing:?}, unresponsive after {unresponsive:?}");
    // 5 s of silence, plus up to a keep-alive and a scrape (0.5 s gather and the pause between scrapes).
    assert!(unresponsive < Duration::from_secs(7), "unresponsive only after {unresponsive:?}");
    job.signal(2, libc::SIGCONT).expect("continue rank 2");
    let t = Instant::now();
    loop {
        let body = scrape(port);
        assert_eq!(metric(&body, "occl_ras_peers{state=\"dead\"}"), Some(0.0), "called dead after resuming");
        if metric(&body, "occl_ras_peers{state=\"alive\"}") == Some(3.0)
            && metric(&body, "occl_ras_peers{state=\"unresponsive\"}") == Some(0.0)
        {
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(10), "not healthy 10 s after SIGCONT:\n{body}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn many_clients_and_a_silent_one_do_not_stop_the_job() {
    let port = free_port();
    let job = start(2, &["loop"], port, &[]);
    let silent = std::net::TcpStream::connect(("127.0.0.1", port)).expect("silent client");
    let launched = |body: &str| metric(body, "occl_operations_launched_total{comm=").unwrap_or(0.0);
    let before = scrape(port);
    // The port's owner serves every client of the node and holds at most three quarters of its
    // table (256 by default) from one address: 150 at once from loopback, all answered.
    const CLIENTS: usize = 150;
    let reports: Vec<String> = std::thread::scope(|sc| {
        let hs: Vec<_> = (0..CLIENTS)
            .map(|_| sc.spawn(move || ncclras(port, "STATUS\n", Duration::from_secs(30)).unwrap_or_default()))
            .collect();
        hs.into_iter().map(|h| h.join().unwrap_or_default()).collect()
    });
    let complete = reports.iter().filter(|r| r.contains("Warnings\n========")).count();
    let partial = reports.iter().find(|r| !r.contains("Warnings\n========"));
    assert_eq!(complete, CLIENTS, "every client got a whole report; one got:\n{}", partial.map_or("", |r| r.as_str()));
    // Malformed bytes and an over-long line get an error or a close, never a stall.
    let junk = ncclras(port, &"x".repeat(5000), Duration::from_secs(5)).unwrap_or_default();
    assert!(junk.len() < 5000, "{junk}");
    let after = scrape(port);
    let (a, b) = (launched(&before), launched(&after));
    drop(silent);
    // The all-reduce loop went on meanwhile (a Broadcast line comes first; use the AllReduce one).
    let ar = |body: &str| {
        body.lines()
            .filter(|l| l.starts_with("occl_operations_launched_total") && l.contains("op=\"AllReduce\""))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .fold(0.0, f64::max)
    };
    assert!(ar(&after) > ar(&before), "collectives stalled while clients were served ({a} → {b})");
    drop(job);
}

/// Issue 26, item 9: an operation that failed is reported as failed, with its error, and not as in flight (which
/// would show it STUCK, with a wait that grows for as long as the process lives).
#[test]
fn a_failed_operation_is_reported_failed_with_its_error_not_stuck() {
    let port = free_port();
    // Rank 1 sends another count in the 6th all-reduce: every rank's 6th fails, and every process stays up.
    let job = start(3, &["fail_idle", "1"], port, &[]);
    // Past the stuck threshold (1 s): an operation still in flight would be listed by now.
    std::thread::sleep(Duration::from_millis(1500));
    let (code, body) = http_get(port, "/api/v1/status", Duration::from_secs(10)).expect("status");
    assert_eq!(code, 200, "{body}");
    let v: Value = serde_json::from_str(&body).expect("the JSON report parses");
    let stuck = v["stuck_operations"].as_array().map_or(0, Vec::len);
    assert_eq!(stuck, 0, "a failed operation is reported in flight: {v:#}");
    let failed = v["failed_operations"].as_array().unwrap_or_else(|| panic!("no failed_operations: {v:#}"));
    for r in 0..3u64 {
        let f = failed.iter().find(|f| f["rank"] == r).unwrap_or_else(|| panic!("rank {r} not failed: {v:#}"));
        assert_eq!((f["operation"].as_str(), f["seq"].as_u64()), (Some("AllReduce"), Some(6)), "{f}");
        // The very error the rank's call returned.
        let out = job.output(r as usize);
        let msg = out.lines().find_map(|l| l.split_once(" msg=").filter(|_| l.starts_with("ERR ")).map(|x| x.1));
        let msg = msg.unwrap_or_else(|| panic!("rank {r} printed no error:\n{out}"));
        assert_eq!(f["error"].as_str(), Some(msg), "{f}");
        assert!(f["result"].as_i64().is_some_and(|c| c == 5 || c == 6), "InvalidUsage or RemoteError: {f}");
    }
    assert!(failed.iter().any(|f| f["error"].as_str().is_some_and(|e| e.contains("operation mismatch"))), "{v:#}");
    for rank in v["communicators"][0]["ranks"].as_array().expect("ranks") {
        let ops = &rank["occl_operations"];
        assert_eq!(
            (ops["launched"].as_u64(), ops["completed"].as_u64(), ops["failed"].as_u64()),
            (Some(6), Some(5), Some(1))
        );
    }
    // NCCL's text protocol: a failed section, no stuck one.
    let text = ncclras(port, "STATUS\n", Duration::from_secs(10)).expect("text status");
    assert!(!text.contains("Stuck operations"), "{text}");
    let section =
        text.split("Failed operations (occl)\n").nth(1).unwrap_or_else(|| panic!("no failed section:\n{text}"));
    for r in 0..3 {
        assert!(section.contains(&format!("Rank {r} in AllReduce operation 6 failed")), "{text}");
    }
    assert!(section.contains("operation mismatch"), "{text}");
    drop(job);
}

/// Issue 26, item 9: a job whose client port another program holds (without SO_REUSEPORT) runs on, and says so at
/// WARN (not INFO, which nobody sees): the address, the OS error, and that ncclras and /metrics cannot reach it.
#[test]
fn a_client_port_held_by_another_program_is_a_warning_naming_it() {
    let holder = std::net::TcpListener::bind("127.0.0.1:0").expect("hold a port");
    let addr = holder.local_addr().expect("held address").to_string();
    let spawn = occl_tests::launch::Spawn {
        env: env(&[("OCCL_RAS_ADDR", &addr), ("OCCL_DEBUG", "WARN")]),
        ..occl_tests::launch::Spawn::default()
    };
    let outs = common::run_job(2, &["late", "0"], spawn, Duration::from_secs(60));
    common::assert_all_ok(&outs, "a job whose RAS client port is taken");
    for o in &outs {
        let line = o.output.lines().find(|l| l.contains(&addr));
        let line = line.unwrap_or_else(|| panic!("rank {} logged nothing about {addr}:\n{}", o.rank, o.output));
        assert!(line.contains("WARN"), "not a warning: {line}");
        assert!(line.contains("Address already in use"), "the OS error: {line}");
        assert!(line.contains("ncclras") && line.contains("/metrics"), "what it means: {line}");
    }
    drop(holder);
}

/// Writes `bytes` on a fresh connection while reading the answer; returns what came back and how long the server
/// took to close (`None`: still open after `limit`).
fn flood(port: u16, bytes: &[u8], limit: Duration) -> (String, Option<Duration>) {
    use std::io::{Read, Write};
    let s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.set_read_timeout(Some(Duration::from_millis(100))).expect("read timeout");
    s.set_write_timeout(Some(limit)).expect("write timeout");
    let mut w = s.try_clone().expect("clone");
    let t = Instant::now();
    let closed = std::thread::scope(|sc| {
        // The writer stops at the first error: the server closed.
        sc.spawn(move || {
            let _ = w.write_all(bytes);
        });
        let (mut r, mut got, mut buf) = (&s, Vec::new(), vec![0u8; 64 << 10]);
        let closed = loop {
            match r.read(&mut buf) {
                Ok(0) => break Some(t.elapsed()),
                Ok(n) => got.extend_from_slice(&buf[..n]),
                Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
                Err(_) => break Some(t.elapsed()),
            }
            if t.elapsed() > limit {
                break None;
            }
        };
        // Unblocks the writer if the server never closed.
        let _ = s.shutdown(std::net::Shutdown::Both);
        (String::from_utf8_lossy(&got).into_owned(), closed)
    });
    closed
}

/// Issue 26, item 9: 1 MiB of bad lines is not answered line for line (2 MiB of errors); after a few the server
/// says why and closes, on NCCL's text protocol and on HTTP alike.
#[test]
fn a_megabyte_of_garbage_lines_gets_a_few_errors_then_a_close() {
    let port = free_port();
    let job = start(2, &["idle"], port, &[]);
    let limit = Duration::from_secs(5);
    let text = "no such command\n".repeat((1 << 20) / 16);
    let (answer, closed) = flood(port, text.as_bytes(), limit);
    let closed =
        closed.unwrap_or_else(|| panic!("ncclras protocol: still open after {limit:?}; {} bytes back", answer.len()));
    let lines: Vec<&str> = answer.lines().collect();
    assert_eq!(lines.len(), 4, "three errors and a final one: {answer}");
    assert!(lines.iter().all(|l| l.starts_with("ERROR: ")), "{answer}");
    assert!(lines.last().is_some_and(|l| l.contains("closing")), "the last error says why it closes: {answer}");
    assert!(closed < Duration::from_secs(2), "closed after {closed:?}");

    let req = "GET /no/such/page HTTP/1.1\r\nHost: x\r\n\r\n";
    let http = req.repeat((1 << 20) / req.len());
    let (answer, closed) = flood(port, http.as_bytes(), limit);
    let closed = closed.unwrap_or_else(|| panic!("http: still open after {limit:?}; {} bytes back", answer.len()));
    let responses = answer.matches("HTTP/1.1 ").count();
    assert_eq!(responses, 4, "three 404s and a final error: {}", &answer[..answer.len().min(2000)]);
    let last = answer.rsplit("HTTP/1.1 ").next().unwrap_or_default();
    assert!(last.contains("connection: close") && last.contains("bad requests on this connection"), "{answer}");
    assert!(closed < Duration::from_secs(2), "closed after {closed:?}");
    drop(job);
}

/// The columns of a text report's only communicator row.
fn row(text: &str) -> Vec<String> {
    let row = text.lines().find(|l| l.trim_start().starts_with("0 ")).unwrap_or_default();
    row.split_whitespace().map(str::to_string).collect()
}

/// This machine's host name, as the `host` label has it.
fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname").map(|s| s.trim().to_string()).unwrap_or_default()
}

/// Issue 27, item 2: two jobs on one node share its RAS port. Every answer is the job the client picked (`JOB`,
/// `?job=`) or every job's, never a random one's; `/metrics` has both jobs' series apart by `job`; when the job
/// that owns the port ends, the other takes it over.
#[test]
fn two_jobs_on_one_port_are_each_answered_and_kept_apart() {
    let port = free_port();
    let a = start(2, &["idle"], port, &[("OCCL_JOB_ID", "job-a")]);
    let b = start(3, &["idle"], port, &[("OCCL_JOB_ID", "job-b")]);
    let t = Duration::from_secs(10);
    for i in 0..10 {
        for (job, n) in [("job-a", "2"), ("job-b", "3")] {
            let text = ncclras(port, &format!("CLIENT PROTOCOL 2\nJOB {job}\nSTATUS\n"), t).expect("status");
            assert!(text.starts_with("SERVER PROTOCOL 2\nOK\n"), "{text}");
            assert_eq!(row(&text), ["0", "1", "1", n, n, n, "RUNNING", "OK"], "request {i} for {job}:\n{text}");
        }
        // Without a pick: both reports, by job name.
        let text = ncclras(port, "STATUS\n", t).expect("status of the node");
        let (first, second) =
            text.split_once("Job job-b (2 of 2 jobs on this node").unwrap_or_else(|| panic!("{text}"));
        assert!(first.starts_with("Job job-a (1 of 2 jobs on this node"), "{text}");
        assert_eq!(row(first), ["0", "1", "1", "2", "2", "2", "RUNNING", "OK"], "{text}");
        assert_eq!(row(second), ["0", "1", "1", "3", "3", "3", "RUNNING", "OK"], "{text}");
        // /metrics: both jobs, every sample labelled with its job.
        let (code, body) = http_get(port, "/metrics", t).expect("metrics");
        assert_eq!(code, 200, "{body}");
        assert!(body.contains("occl_ras_peers{job=\"job-a\",state=\"alive\"} 2\n"), "{body}");
        assert!(body.contains("occl_ras_peers{job=\"job-b\",state=\"alive\"} 3\n"), "{body}");
        let unlabelled: Vec<&str> = body.lines().filter(|l| !l.starts_with('#') && !l.contains("job=\"job-")).collect();
        assert!(unlabelled.is_empty(), "series without a job: {unlabelled:?}");
        let host = format!("host=\"{}\"", host_name());
        assert!(
            body.lines().any(|l| l.starts_with("occl_operations_launched_total{job=\"job-b\"") && l.contains(&host)),
            "the host label is the host name: {body}"
        );
    }
    let (code, body) = http_get(port, "/metrics?job=job-b", t).expect("one job's metrics");
    assert_eq!(code, 200);
    assert!(body.contains("job=\"job-b\"") && !body.contains("job=\"job-a\""), "{body}");
    let (code, body) = http_get(port, "/api/v1/status?job=job-a", t).expect("one job's status");
    assert_eq!(code, 200, "{body}");
    let v: Value = serde_json::from_str(&body).expect("json");
    assert_eq!(v["communicators"][0]["size"], 2, "{v:#}");
    let (code, body) = http_get(port, "/api/v1/status", t).expect("every job's status");
    assert_eq!(code, 200, "{body}");
    let v: Value = serde_json::from_str(&body).expect("json");
    assert_eq!(v["jobs"]["job-b"]["communicators"][0]["size"], 3, "{v:#}");
    assert_eq!(v["jobs"]["job-a"]["communicators"][0]["size"], 2, "{v:#}");
    // A job the node does not run.
    let text = ncclras(port, "JOB job-c\nSTATUS\n", t).expect("unknown job");
    assert_eq!(text, "OK\nERROR: No job job-c on this node (its jobs: job-a, job-b)\n");
    assert_eq!(http_get(port, "/metrics?job=job-c", t).expect("unknown job").0, 404);

    // Job A started first and owns the port; when it ends, job B takes the port over.
    drop(a);
    let since = Instant::now();
    loop {
        if let Ok(text) = ncclras(port, "STATUS\n", Duration::from_secs(5)) {
            if row(&text) == ["0", "1", "1", "3", "3", "3", "RUNNING", "OK"] && !text.contains("job-a") {
                break;
            }
        }
        assert!(since.elapsed() < Duration::from_secs(10), "job B never took the port over");
        std::thread::sleep(Duration::from_millis(200));
    }
    eprintln!("job B answered on the port {:?} after job A ended", since.elapsed());
    let body = scrape_job(port, Some("job-b"), 2.0);
    assert_eq!(metric(&body, "occl_ras_peers{state=\"alive\"}"), Some(3.0), "{body}");
    drop(b);
}

/// Issue 27, item 5: a healthy job looping all-reduces, asked 20 times, is never a MISMATCH (a rank that has
/// launched the next operation is ahead, not apart).
#[test]
fn a_healthy_looping_job_never_reads_mismatch() {
    let port = free_port();
    let job = start(2, &["loop"], port, &[]);
    for i in 0..20 {
        let text = ncclras(port, "STATUS\n", Duration::from_secs(10)).expect("status");
        assert!(text.contains("Communicators"), "{text}");
        assert!(!text.contains("MISMATCH"), "status {i} of a healthy job:\n{text}");
        let body = scrape(port);
        let flagged: Vec<&str> =
            body.lines().filter(|l| l.starts_with("occl_ras_comm_mismatch") && !l.ends_with(" 0")).collect();
        assert!(flagged.is_empty(), "scrape {i} of a healthy job: {flagged:?}");
        assert!(body.lines().any(|l| l.starts_with("occl_ras_comm_mismatch")), "{body}");
    }
    drop(job);
}
