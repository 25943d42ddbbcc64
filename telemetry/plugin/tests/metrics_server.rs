//! The `/metrics` server over real loopback sockets: answers, errors, bounds, and clients that
//! are silent, slow or oversized while others are served; a port in use; a prompt stop.

use nccl_profiler_occl::metrics::{MetricsServer, Render, MAX_HEAD, MAX_PENDING, READ_DEADLINE};
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn server(body: &'static str) -> (MetricsServer, Arc<AtomicUsize>) {
    let calls = Arc::new(AtomicUsize::new(0));
    let c = calls.clone();
    let render: Render = Arc::new(move || {
        c.fetch_add(1, Ordering::Relaxed);
        body.to_owned()
    });
    let s = MetricsServer::start("127.0.0.1:0".parse().expect("addr"), render).expect("bind loopback");
    (s, calls)
}

/// Sends `req` and reads until the server closes (bounded by `limit`).
fn exchange(addr: SocketAddr, req: &[u8], limit: Duration) -> String {
    let mut c = TcpStream::connect(addr).expect("connect");
    c.set_read_timeout(Some(limit)).expect("timeout");
    c.write_all(req).expect("send");
    let mut out = Vec::new();
    let _ = c.read_to_end(&mut out);
    String::from_utf8_lossy(&out).into_owned()
}

fn get(addr: SocketAddr, path: &str) -> String {
    exchange(addr, format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes(), Duration::from_secs(10))
}

const BODY: &str = "# TYPE up gauge\nup 1\n";

#[test]
fn serves_metrics_and_refuses_everything_else() {
    let (s, calls) = server(BODY);
    let addr = s.local_addr();
    assert!(addr.ip().is_loopback() && addr.port() != 0);
    let r = get(addr, "/metrics");
    assert!(r.starts_with("HTTP/1.1 200 OK\r\n"), "{r}");
    assert!(r.contains("Content-Type: text/plain; version=0.0.4; charset=utf-8\r\n"), "{r}");
    assert!(r.contains(&format!("Content-Length: {}\r\n", BODY.len())), "{r}");
    assert!(r.ends_with(&format!("\r\n\r\n{BODY}")), "{r}");
    assert!(get(addr, "/metrics?name[]=up").starts_with("HTTP/1.1 200 OK"));
    let head = exchange(addr, b"HEAD /metrics HTTP/1.0\r\n\r\n", Duration::from_secs(10));
    assert!(head.starts_with("HTTP/1.1 200 OK") && head.ends_with("\r\n\r\n"), "HEAD has no body: {head}");
    assert!(get(addr, "/").starts_with("HTTP/1.1 404 Not Found"));
    assert!(get(addr, "/metrics/x").starts_with("HTTP/1.1 404 Not Found"));
    let post = exchange(addr, b"POST /metrics HTTP/1.1\r\n\r\n", Duration::from_secs(10));
    assert!(post.starts_with("HTTP/1.1 405") && post.contains("Allow: GET, HEAD\r\n"), "{post}");
    for bad in [&b"hello\r\n\r\n"[..], b"GET /metrics\r\n\r\n", b"\x00\x01\x02\n\n", b"GET /metrics HTTP/9 x\r\n\r\n"] {
        let r = exchange(addr, bad, Duration::from_secs(10));
        assert!(r.starts_with("HTTP/1.1 400 Bad Request"), "{bad:?}: {r}");
    }
    assert_eq!(calls.load(Ordering::Relaxed), 3, "rendered for the two GETs and the HEAD only");
}

#[test]
fn oversized_silent_and_slow_clients_do_not_stop_it() {
    let (s, _) = server(BODY);
    let addr = s.local_addr();
    // A head over the bound, never finished: 431, and the connection is closed.
    let mut big = b"GET /metrics HTTP/1.1\r\n".to_vec();
    while big.len() <= MAX_HEAD + 100 {
        big.extend_from_slice(b"X-Filler: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n");
    }
    let r = exchange(addr, &big, Duration::from_secs(10));
    assert!(r.starts_with("HTTP/1.1 431"), "{r}");

    // A client that connects and says nothing, and one that sends a byte every 100 ms: a normal
    // scrape behind them is answered at once, and each of them is cut off at the read deadline.
    let t0 = Instant::now();
    let silent = TcpStream::connect(addr).expect("connect");
    let slow = std::thread::spawn(move || {
        let mut c = TcpStream::connect(addr).expect("connect");
        let t = Instant::now();
        for b in b"GET /metrics HTTP/1.1\r\nHost: slow\r\n".iter().cycle() {
            if c.write_all(&[*b]).is_err() || t.elapsed() > Duration::from_secs(20) {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        t.elapsed()
    });
    std::thread::sleep(Duration::from_millis(50));
    let r = get(addr, "/metrics");
    let waited = t0.elapsed();
    assert!(r.starts_with("HTTP/1.1 200 OK"), "{r}");
    // Heads are read side by side: the silent and the slow client hold nobody up.
    assert!(waited < Duration::from_millis(500), "scrape waited {waited:?}");
    let slow_for = slow.join().expect("slow client");
    assert!(slow_for < READ_DEADLINE + Duration::from_secs(1), "the slow client was cut after {slow_for:?}");
    // The silent one was closed by the server.
    let mut silent = silent;
    silent.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    let mut buf = [0u8; 16];
    match silent.read(&mut buf) {
        Ok(0) => {}
        Err(e) if e.kind() == ErrorKind::ConnectionReset => {}
        other => panic!("the silent client is still connected: {other:?}"),
    }
    println!("scrape behind a silent and a slow client answered after {waited:?}; slow client cut after {slow_for:?}");
}

#[test]
fn a_flood_of_idle_connections_pushes_out_the_oldest() {
    let (s, _) = server(BODY);
    let addr = s.local_addr();
    let idle: Vec<TcpStream> = (0..MAX_PENDING + 8).map(|_| TcpStream::connect(addr).expect("connect")).collect();
    std::thread::sleep(Duration::from_millis(200));
    let t = Instant::now();
    let r = get(addr, "/metrics");
    assert!(r.starts_with("HTTP/1.1 200 OK"), "{r}");
    assert!(
        t.elapsed() < Duration::from_millis(500),
        "scrape behind {} idle connections took {:?}",
        idle.len(),
        t.elapsed()
    );
    // The first ones were closed to make room.
    let mut first = &idle[0];
    first.set_read_timeout(Some(Duration::from_secs(5))).expect("timeout");
    let mut b = [0u8; 1];
    let r = first.read(&mut b);
    assert!(
        matches!(&r, Ok(0)) || matches!(&r, Err(e) if e.kind() == ErrorKind::ConnectionReset),
        "the oldest idle connection was dropped: {r:?}"
    );
}

#[test]
fn a_port_in_use_is_an_error_and_stop_is_prompt() {
    let (s, _) = server(BODY);
    let addr = s.local_addr();
    let render: Render = Arc::new(String::new);
    let e = MetricsServer::start(addr, render).err().expect("the port is taken");
    assert_eq!(e.kind(), ErrorKind::AddrInUse);
    // A client in the middle of its head does not delay the stop beyond one poll.
    let mut half = TcpStream::connect(addr).expect("connect");
    half.write_all(b"GET /met").expect("send");
    std::thread::sleep(Duration::from_millis(100));
    let t = Instant::now();
    s.stop();
    let took = t.elapsed();
    assert!(took < Duration::from_millis(500), "stop took {took:?}");
    assert!(TcpStream::connect(addr).is_err(), "nothing listens after stop");
    println!("stop with a half-sent request pending took {took:?}");
}

#[test]
fn a_render_that_panics_is_a_500_and_the_server_lives() {
    let n = Arc::new(AtomicUsize::new(0));
    let m = n.clone();
    let render: Render = Arc::new(move || {
        if m.fetch_add(1, Ordering::Relaxed) == 0 {
            panic!("render failed");
        }
        BODY.to_owned()
    });
    let s = MetricsServer::start("127.0.0.1:0".parse().expect("addr"), render).expect("bind");
    let prev = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let r = get(s.local_addr(), "/metrics");
    std::panic::set_hook(prev);
    assert!(r.starts_with("HTTP/1.1 500"), "{r}");
    assert!(get(s.local_addr(), "/metrics").starts_with("HTTP/1.1 200 OK"));
}
