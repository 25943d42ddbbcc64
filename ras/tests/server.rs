//! RAS servers of one process talking over real loopback sockets: monitor streams (NCCL's `MONITOR` and HTTP
//! server-sent events), strangers on the mesh port, and a process with the wrong job secret.

use occl_ras::mesh::PeerAddr;
use occl_ras::record::{CommId, CommRecord, RankInfo, ResultCode};
use occl_ras::server::{RasConfig, RasServer};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{IpAddr, Ipv4Addr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn config() -> RasConfig {
    let mut c = RasConfig::from_vars(|_| None, IpAddr::V4(Ipv4Addr::LOCALHOST)).expect("config");
    c.client_addr = "127.0.0.1:0".parse().expect("addr");
    c
}

/// `n` servers forming one job (one rank record each); `secrets[i]` is server i's job secret.
fn job(secrets: &[[u8; 16]]) -> (Vec<RasServer>, Vec<Arc<CommRecord>>) {
    job_with(secrets, config())
}

/// As `job`, every server with `cfg`.
fn job_with(secrets: &[[u8; 16]], cfg: RasConfig) -> (Vec<RasServer>, Vec<Arc<CommRecord>>) {
    let servers: Vec<RasServer> = secrets.iter().map(|s| RasServer::start(cfg.clone(), *s).expect("start")).collect();
    let members: Vec<(u32, PeerAddr)> = servers
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let p = PeerAddr {
                addr: s.mesh_addr().to_string(),
                host: "127.0.0.1".into(),
                pid: 1000 + i as u32,
                cuda_devs: vec![],
                nvml_devs: vec![],
            };
            (i as u32, p)
        })
        .collect();
    let n = servers.len() as u32;
    let records: Vec<Arc<CommRecord>> = (0..n)
        .map(|r| {
            let rec = Arc::new(CommRecord::new(RankInfo {
                comm: CommId { hash: 0xfeed, root_host_hash: 1, root_pid_hash: 2 },
                size: n,
                rank: r,
                pid: 1000 + r,
                host: "127.0.0.1".into(),
                cuda_dev: None,
                nvml_dev: None,
            }));
            rec.live().set_init_state(ResultCode::Success);
            rec
        })
        .collect();
    for (s, r) in servers.iter().zip(&records) {
        s.join(r, members.clone());
    }
    (servers, records)
}

fn wait_for_answers(s: &RasServer, n: usize) -> usize {
    let t = Instant::now();
    loop {
        let g = s.status_blocking(Duration::from_secs(2)).expect("gather");
        if g.result.statuses.len() == n || t.elapsed() > Duration::from_secs(10) {
            return g.result.statuses.len();
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn monitor_streams_a_peer_leaving_on_both_protocols() {
    let (mut servers, _records) = job(&[[1; 16]; 3]);
    assert_eq!(wait_for_answers(&servers[0], 3), 3);
    let port = servers[0].client_addr().expect("client port").port();
    // NCCL's MONITOR on the text port.
    let mut mon = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    mon.write_all(b"MONITOR all\n").expect("send");
    mon.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    let mut lines = BufReader::new(mon.try_clone().expect("clone"));
    let mut ok = String::new();
    lines.read_line(&mut ok).expect("OK");
    assert_eq!(ok, "OK\n");
    // HTTP server-sent events on the same port.
    let mut sse = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    sse.write_all(b"GET /api/v1/events HTTP/1.1\r\nHost: x\r\n\r\n").expect("send");
    sse.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    std::thread::sleep(Duration::from_millis(200));
    // Server 2 leaves (its drop says goodbye to its peers).
    let gone = servers.pop().expect("server 2");
    drop(gone);
    let mut seen = String::new();
    let t = Instant::now();
    while !seen.contains("PEER_DEAD") && t.elapsed() < Duration::from_secs(10) {
        let mut l = String::new();
        if lines.read_line(&mut l).unwrap_or(0) == 0 {
            break;
        }
        seen.push_str(&l);
    }
    assert!(seen.contains("PEER_DEAD: Process 1002 on node 127.0.0.1"), "{seen}");
    assert!(seen.starts_with('['), "NCCL's `[date time] EVENT: ...` shape: {seen}");
    let mut buf = vec![0u8; 8192];
    let mut got = String::new();
    let t = Instant::now();
    while !got.contains("PEER_DEAD") && t.elapsed() < Duration::from_secs(10) {
        match sse.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => got.push_str(&String::from_utf8_lossy(&buf[..n])),
        }
    }
    assert!(got.starts_with("HTTP/1.1 200 OK") && got.contains("text/event-stream"), "{got}");
    let data = got.lines().find(|l| l.starts_with("data: ") && l.contains("PEER_DEAD")).expect("an SSE data line");
    let v: serde_json::Value = serde_json::from_str(&data["data: ".len()..]).expect("event JSON");
    assert_eq!(
        (v["event"].as_str(), v["group"].as_str(), v["peer"]["pid"].as_u64()),
        (Some("PEER_DEAD"), Some("LIFECYCLE"), Some(1002))
    );
}

#[test]
fn strangers_and_wrong_secrets_do_not_get_in() {
    // Server 1 has another job's secret: it never joins, and server 0 keeps working.
    let (servers, _records) = job(&[[1; 16], [2; 16], [1; 16]]);
    let mesh = servers[0].mesh_addr();
    // Garbage, an oversized frame header, and a connection that says nothing, on the mesh port.
    let mut junk = TcpStream::connect(mesh).expect("connect");
    let _ = junk.write_all(b"GET / HTTP/1.1\r\n\r\n\xff\xff\xff\xff\x01\x02garbage");
    let mut huge = TcpStream::connect(mesh).expect("connect");
    let _ = huge.write_all(&[0x7f, 0xff, 0xff, 0xff, 1, 1]);
    let _silent = TcpStream::connect(mesh).expect("connect");
    std::thread::sleep(Duration::from_millis(500));
    let g = servers[0].status_blocking(Duration::from_secs(3)).expect("gather");
    let answered: Vec<u32> = g.result.statuses.iter().map(|s| s.pid).collect();
    assert!(answered.contains(&1000) && answered.contains(&1002), "{answered:?}");
    assert!(!answered.contains(&1001), "a process with another job's secret answered: {answered:?}");
    // The stranger connections were closed by the server.
    junk.set_read_timeout(Some(Duration::from_secs(5))).expect("timeout");
    let mut b = [0u8; 16];
    assert!(matches!(junk.read(&mut b), Ok(0) | Err(_)), "garbage connection left open");
}

/// Reads until the server closes; how long that took, or `None` if it was still open after `limit`.
fn closed_within(s: &mut TcpStream, limit: Duration) -> Option<Duration> {
    let t = Instant::now();
    s.set_read_timeout(Some(Duration::from_millis(20))).expect("timeout");
    let mut b = [0u8; 4096];
    while t.elapsed() < limit {
        match s.read(&mut b) {
            Ok(0) => return Some(t.elapsed()),
            Ok(_) => {}
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
            Err(_) => return Some(t.elapsed()),
        }
    }
    None
}

/// Sends `step` every 50 ms on `s` until the server closes it (or `limit`); how long it stayed open.
fn trickle(s: &mut TcpStream, step: &[u8], limit: Duration) -> Option<Duration> {
    let t = Instant::now();
    while t.elapsed() < limit {
        if s.write_all(step).is_err() {
            return Some(t.elapsed());
        }
        if closed_within(s, Duration::from_millis(50)).is_some() {
            return Some(t.elapsed());
        }
    }
    None
}

#[test]
fn clients_that_never_complete_a_request_are_closed_after_the_request_timeout() {
    let mut cfg = config();
    cfg.client_request_timeout = Duration::from_millis(400);
    let (servers, _records) = job_with(&[[1; 16]], cfg);
    let port = servers[0].client_addr().expect("client port").port();
    // Every read is bounded, so a server that never answers fails the test instead of hanging it.
    let connect = || {
        let s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(5))).expect("timeout");
        s
    };
    let bound = Duration::from_secs(3);
    let early = Duration::from_millis(300);
    // Silent.
    let t = closed_within(&mut connect(), bound).expect("a silent client was not closed");
    assert!(t >= early, "closed after {t:?}, before the timeout");
    // A command trickled a byte at a time, and blank lines: neither completes a command.
    let t = trickle(&mut connect(), b"S", bound).expect("a trickled command was not closed");
    assert!(t >= early, "{t:?}");
    trickle(&mut connect(), b"\n", bound).expect("blank lines kept a client open");
    // Each complete command restarts the clock: four commands 300 ms apart outlive the 400 ms timeout.
    let mut s = connect();
    for _ in 0..4 {
        s.write_all(b"TIMEOUT 1\n").expect("command");
        std::thread::sleep(Duration::from_millis(300));
    }
    s.write_all(b"CLIENT PROTOCOL 2\n").expect("command");
    let mut r = BufReader::new(s);
    let mut got = String::new();
    for _ in 0..5 {
        r.read_line(&mut got).expect("reply");
    }
    assert_eq!(got, "OK\nOK\nOK\nOK\nSERVER PROTOCOL 2\n");
    // HTTP: a head trickled header by header, and a keep-alive connection after its request.
    let mut s = connect();
    s.write_all(b"GET /healthz HTTP/1.1\r\n").expect("request line");
    trickle(&mut s, b"X-A: b\r\n", bound).expect("a trickled HTTP head was not closed");
    let mut s = connect();
    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n").expect("request");
    let t = closed_within(&mut s, bound).expect("an idle keep-alive connection was not closed");
    assert!(t >= early, "{t:?}");
}

#[test]
fn a_flood_of_idle_clients_leaves_room_for_requests_and_streams_are_bounded() {
    let mut cfg = config();
    cfg.max_clients = 16;
    let (servers, _records) = job_with(&[[1; 16]], cfg);
    assert_eq!(wait_for_answers(&servers[0], 1), 1);
    let port = servers[0].client_addr().expect("client port").port();
    // Every read is bounded, so a server that never answers fails the test instead of hanging it.
    let connect = || {
        let s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(5))).expect("timeout");
        s
    };
    let flood: Vec<TcpStream> = (0..200).map(|_| connect()).collect();
    for what in ["STATUS\n", "GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"] {
        let t = Instant::now();
        let mut s = connect();
        s.write_all(what.as_bytes()).expect("request");
        let mut answer = String::new();
        let _ = s.read_to_string(&mut answer);
        assert!(
            answer.contains("Job summary") || answer.ends_with("\r\n\r\nok\n"),
            "{what:?} behind a flood: {answer:?}"
        );
        assert!(t.elapsed() < Duration::from_secs(1), "{what:?} took {:?}", t.elapsed());
    }
    drop(flood);
    // Streams: half the table. The next MONITOR gets its OK, then an error, and is closed; the next SSE a 503.
    let monitors: Vec<BufReader<TcpStream>> = (0..8)
        .map(|_| {
            let mut s = connect();
            s.write_all(b"MONITOR\n").expect("monitor");
            let mut r = BufReader::new(s);
            let mut ok = String::new();
            r.read_line(&mut ok).expect("OK");
            assert_eq!(ok, "OK\n");
            r
        })
        .collect();
    let mut s = connect();
    s.write_all(b"MONITOR\n").expect("monitor");
    let mut answer = String::new();
    let _ = s.read_to_string(&mut answer);
    assert_eq!(answer, "OK\nERROR: Too many monitor clients on this process\n");
    let mut s = connect();
    s.write_all(b"GET /api/v1/events HTTP/1.1\r\nHost: x\r\n\r\n").expect("sse");
    let mut answer = String::new();
    let _ = s.read_to_string(&mut answer);
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    // A status still gets in while the streams are open.
    let mut s = connect();
    s.write_all(b"STATUS\n").expect("status");
    let mut answer = String::new();
    let _ = s.read_to_string(&mut answer);
    assert!(answer.contains("Job summary"), "{answer}");
    drop(monitors);
}

/// `GET /metrics` on `port`, as Prometheus asks (with its timeout header) or as a person does; `close` asks the
/// server to close after the answer. Returns the answer's head and body, read to the connection's end, and how long
/// the server took to close it.
fn scrape(port: u16, prometheus: bool, close: bool) -> (String, Duration) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(5))).expect("timeout");
    let mut req = String::from("GET /metrics HTTP/1.1\r\nHost: x\r\n");
    if prometheus {
        req.push_str("X-Prometheus-Scrape-Timeout-Seconds: 2\r\n");
    }
    if close {
        req.push_str("Connection: close\r\n");
    }
    req.push_str("\r\n");
    let t = Instant::now();
    s.write_all(req.as_bytes()).expect("request");
    let mut got = Vec::new();
    s.read_to_end(&mut got).expect("the server closes the connection");
    (String::from_utf8_lossy(&got).into_owned(), t.elapsed())
}

/// The value of `occl_ras_job_running` in a scrape's answer.
fn job_running(answer: &str) -> Option<&str> {
    answer
        .lines()
        .find(|l| l.starts_with("occl_ras_job_running{") || l.starts_with("occl_ras_job_running "))?
        .rsplit(' ')
        .next()
}

/// A clean end on the node's port: after the last communicator left, Prometheus's scrape says
/// `occl_ras_job_running 0`, closes its connection, and ends the exit wait; neither a person's request that says 0
/// nor Prometheus's scrapes from before the end do.
#[test]
fn the_exit_wait_ends_on_the_prometheus_scrape_that_saw_the_end() {
    let mut cfg = config();
    cfg.exit_wait = Duration::from_secs(10);
    let (servers, _records) = job_with(&[[1; 16]], cfg);
    let s = &servers[0];
    let port = s.client_addr().expect("client port").port();
    // Two scrapes 100 ms apart while the job runs: the wait is bounded by two of those intervals plus a second.
    for _ in 0..2 {
        let (answer, _) = scrape(port, true, true);
        assert_eq!(job_running(&answer), Some("1"), "{answer}");
        std::thread::sleep(Duration::from_millis(100));
    }
    s.leave(Duration::from_secs(2));
    let (answer, _) = scrape(port, false, true);
    assert_eq!(job_running(&answer), Some("0"), "{answer}");
    std::thread::scope(|scope| {
        let t = Instant::now();
        let waiting = scope.spawn(|| s.exit_wait());
        std::thread::sleep(Duration::from_millis(300));
        assert!(!waiting.is_finished(), "the exit wait ended before Prometheus saw the end");
        // Prometheus's next scrape, on a keep-alive connection: the server closes it after the answer.
        let (answer, closed) = scrape(port, true, false);
        let head = answer.split("\r\n\r\n").next().unwrap_or_default().to_ascii_lowercase();
        assert!(head.contains("connection: close"), "{head}");
        assert_eq!(job_running(&answer), Some("0"), "{answer}");
        assert!(closed < Duration::from_secs(2), "the connection closed after {closed:?}");
        let waited = waiting.join().expect("exit wait");
        assert!(waited < Duration::from_millis(1100), "waited {waited:?}, past the scrape that saw the end");
        assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    });
}
