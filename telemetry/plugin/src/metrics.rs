//! `/metrics` on a port of the plugin's own, since a job on NCCL has no occl RAS port: a small
//! HTTP/1.1 server on one std thread.
//!
//! - Where: `OCCL_METRICS_ADDR`, default [`DEFAULT_ADDR`] (loopback); `0` or `off` disables it; a
//!   bare port means loopback. Ranks of one host would all ask for the same port, so the port is
//!   offset by the launcher's local rank (`LOCAL_RANK`, `OMPI_COMM_WORLD_LOCAL_RANK`,
//!   `SLURM_LOCALID`): local rank r listens on port + r. Port 0 picks a free port.
//! - What: `GET` (or `HEAD`) `/metrics` answers the render function's text as Prometheus text
//!   format 0.0.4; other paths are 404, other methods 405, a malformed request 400, a request head
//!   over [`MAX_HEAD`] bytes 431. One request per connection.
//! - Bounded: heads of up to [`MAX_PENDING`] connections are read at once without blocking, each
//!   within [`READ_DEADLINE`], so a silent, slow or malformed client delays nobody; an answer
//!   is written within [`WRITE_DEADLINE`], so a client that does not read holds the server at
//!   most that long.
//! - Stopping joins the thread within [`POLL`]: the plugin stops the server at the last
//!   `finalize`, before NCCL may unload the library.

use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The metrics text, built on each scrape.
pub type Render = Arc<dyn Fn() -> String + Send + Sync>;

/// The variable naming the address.
pub const ADDR_ENV: &str = "OCCL_METRICS_ADDR";
/// The default address: loopback, the port OpenTelemetry's Prometheus exporters use.
pub const DEFAULT_ADDR: &str = "127.0.0.1:9464";
/// Variables that give this process's rank on its host, first one set wins.
pub const LOCAL_RANK_ENV: [&str; 3] = ["LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID"];
/// Largest request head read.
pub const MAX_HEAD: usize = 8 * 1024;
/// Time a client has to send its request head, from its connection being taken.
pub const READ_DEADLINE: Duration = Duration::from_secs(2);
/// Time a client has to take the answer.
pub const WRITE_DEADLINE: Duration = Duration::from_secs(5);
/// How often the idle server looks for connections, data and a stop.
pub const POLL: Duration = Duration::from_millis(20);
/// Connections whose heads are read at once; a newer one pushes the oldest out.
pub const MAX_PENDING: usize = 64;

/// A value of `OCCL_METRICS_ADDR` that is not an address.
#[derive(Debug, thiserror::Error)]
#[error("{ADDR_ENV}={value:?}: {reason}")]
pub struct AddrError {
    pub value: String,
    pub reason: String,
}

/// Where to listen: `value` is the variable's value (`None` or empty: the default), `local_rank`
/// the launcher's local rank. `Ok(None)`: disabled.
pub fn parse_addr(value: Option<&str>, local_rank: Option<u16>) -> Result<Option<SocketAddr>, AddrError> {
    let v = value.map(str::trim).filter(|v| !v.is_empty()).unwrap_or(DEFAULT_ADDR);
    if v == "0" || v.eq_ignore_ascii_case("off") {
        return Ok(None);
    }
    let err = |reason: String| AddrError { value: v.to_owned(), reason };
    let addr = if let Ok(port) = v.parse::<u16>() {
        SocketAddr::from((Ipv4Addr::LOCALHOST, port))
    } else {
        let mut it = v.to_socket_addrs().map_err(|e| err(format!("not host:port ({e})")))?;
        it.next().ok_or_else(|| err("resolves to no address".to_owned()))?
    };
    match local_rank {
        Some(r) if addr.port() != 0 => {
            let port = addr.port().checked_add(r).ok_or_else(|| err(format!("port + local rank {r} > 65535")))?;
            Ok(Some(SocketAddr::new(addr.ip(), port)))
        }
        _ => Ok(Some(addr)),
    }
}

/// This process's rank on its host, from the launcher.
pub fn local_rank_from_env() -> Option<u16> {
    LOCAL_RANK_ENV.iter().find_map(|k| std::env::var(k).ok()).and_then(|v| v.trim().parse().ok())
}

/// [`parse_addr`] of the environment.
pub fn addr_from_env() -> Result<Option<SocketAddr>, AddrError> {
    parse_addr(std::env::var(ADDR_ENV).ok().as_deref(), local_rank_from_env())
}

/// A running server; dropping it stops it and joins its thread.
pub struct MetricsServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl MetricsServer {
    /// Binds `addr` and serves `render` on a thread of its own.
    pub fn start(addr: SocketAddr, render: Render) -> io::Result<MetricsServer> {
        let listener = TcpListener::bind(addr)?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread =
            std::thread::Builder::new().name("occl-metrics".into()).spawn(move || serve(&listener, &render, &flag))?;
        Ok(MetricsServer { addr, stop, thread: Some(thread) })
    }

    /// The address it listens on (with the port chosen, for port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops serving and joins the thread.
    pub fn stop(self) {}
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A connection whose request head is still arriving.
struct Pending {
    conn: TcpStream,
    head: Vec<u8>,
    deadline: Instant,
}

/// What reading a pending connection came to.
enum Arrived {
    Waiting,
    Head(Vec<u8>),
    TooLarge,
    Gone,
}

/// Accepts and reads heads without blocking, each connection against its own deadline, so a
/// silent client delays nobody; answers are written one at a time.
fn serve(listener: &TcpListener, render: &Render, stop: &AtomicBool) {
    let mut pending: Vec<Pending> = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        let mut busy = false;
        // Until nothing more is queued; an error (out of descriptors, a connection reset in the
        // queue) also waits for the next round.
        while let Ok((conn, _)) = listener.accept() {
            busy = true;
            if conn.set_nonblocking(true).is_err() {
                continue;
            }
            if pending.len() >= MAX_PENDING {
                // The oldest is the likeliest to be stuck.
                pending.remove(0);
            }
            pending.push(Pending { conn, head: Vec::with_capacity(512), deadline: Instant::now() + READ_DEADLINE });
        }
        let now = Instant::now();
        pending.retain_mut(|p| {
            let done = match read_some(p) {
                Arrived::Waiting => return now < p.deadline,
                Arrived::Head(h) => answer(&mut p.conn, &h, render),
                Arrived::TooLarge => {
                    respond(&mut p.conn, "431 Request Header Fields Too Large", "", "request head too large\n", false)
                }
                Arrived::Gone => Ok(()),
            };
            if let Err(e) = done {
                tracing::debug!(target: "occl_profiler", "metrics client: {e}");
            }
            busy = true;
            false
        });
        if !busy {
            std::thread::sleep(POLL);
        }
    }
}

/// Reads what has arrived, without blocking.
fn read_some(p: &mut Pending) -> Arrived {
    let mut chunk = [0u8; 2048];
    loop {
        if let Some(end) = find_end(&p.head) {
            p.head.truncate(end);
            return Arrived::Head(std::mem::take(&mut p.head));
        }
        if p.head.len() > MAX_HEAD {
            return Arrived::TooLarge;
        }
        match p.conn.read(&mut chunk) {
            Ok(0) => return Arrived::Gone,
            Ok(n) => p.head.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Arrived::Waiting,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return Arrived::Gone,
        }
    }
}

/// What the request head asked for.
#[derive(Debug, PartialEq, Eq)]
enum Ask {
    Metrics { head_only: bool },
    NotFound,
    BadMethod,
    Malformed,
}

/// End of the head: after the blank line (CRLF CRLF, or LF LF from a lenient client).
fn find_end(b: &[u8]) -> Option<usize> {
    let crlf = b.windows(4).position(|w| w == b"\r\n\r\n").map(|i| i + 4);
    let lf = b.windows(2).position(|w| w == b"\n\n").map(|i| i + 2);
    match (crlf, lf) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

fn parse(head: &[u8]) -> Ask {
    let Some(line) = head.split(|b| *b == b'\n').next() else { return Ask::Malformed };
    let Ok(line) = std::str::from_utf8(line) else { return Ask::Malformed };
    let mut parts = line.trim_end_matches('\r').split(' ');
    let (Some(method), Some(target), Some(version), None) = (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Ask::Malformed;
    };
    if !version.starts_with("HTTP/1.") || !target.starts_with('/') {
        return Ask::Malformed;
    }
    let head_only = match method {
        "GET" => false,
        "HEAD" => true,
        m if !m.is_empty() && m.bytes().all(|b| b.is_ascii_uppercase()) => return Ask::BadMethod,
        _ => return Ask::Malformed,
    };
    let path = target.split_once('?').map_or(target, |(p, _)| p);
    if path == "/metrics" {
        Ask::Metrics { head_only }
    } else {
        Ask::NotFound
    }
}

fn answer(conn: &mut TcpStream, head: &[u8], render: &Render) -> io::Result<()> {
    match parse(head) {
        Ask::Metrics { head_only } => match catch_unwind(AssertUnwindSafe(|| render())) {
            Ok(body) => respond(conn, "200 OK", "text/plain; version=0.0.4; charset=utf-8", &body, head_only),
            Err(_) => respond(conn, "500 Internal Server Error", "", "rendering the metrics failed\n", head_only),
        },
        Ask::NotFound => respond(conn, "404 Not Found", "", "only /metrics is served here\n", false),
        Ask::BadMethod => respond(conn, "405 Method Not Allowed", "", "GET or HEAD /metrics\n", false),
        Ask::Malformed => respond(conn, "400 Bad Request", "", "malformed request\n", false),
    }
}

fn respond(conn: &mut TcpStream, status: &str, ctype: &str, body: &str, head_only: bool) -> io::Result<()> {
    let ctype = if ctype.is_empty() { "text/plain; charset=utf-8" } else { ctype };
    let mut out = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    if status.starts_with("405") {
        out.push_str("Allow: GET, HEAD\r\n");
    }
    out.push_str("\r\n");
    if !head_only {
        out.push_str(body);
    }
    // Blocking writes in chunks under one deadline: a client that reads a byte at a time cannot
    // hold the server.
    conn.set_nonblocking(false)?;
    conn.set_write_timeout(Some(Duration::from_millis(500)))?;
    let deadline = Instant::now() + WRITE_DEADLINE;
    let mut rest = out.as_bytes();
    while !rest.is_empty() {
        if Instant::now() >= deadline {
            return Err(io::Error::new(io::ErrorKind::TimedOut, "client too slow to take the answer"));
        }
        match conn.write(&rest[..rest.len().min(64 * 1024)]) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => rest = &rest[n..],
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut | io::ErrorKind::Interrupted
                ) => {}
            Err(e) => return Err(e),
        }
    }
    conn.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses() {
        let a = |s: &str| s.parse::<SocketAddr>().expect("addr");
        assert_eq!(parse_addr(None, None).expect("ok"), Some(a("127.0.0.1:9464")));
        assert_eq!(parse_addr(Some(""), Some(1)).expect("ok"), Some(a("127.0.0.1:9465")));
        assert_eq!(parse_addr(Some("off"), None).expect("ok"), None);
        assert_eq!(parse_addr(Some(" OFF "), None).expect("ok"), None);
        assert_eq!(parse_addr(Some("0"), Some(3)).expect("ok"), None);
        assert_eq!(parse_addr(Some("9500"), Some(2)).expect("ok"), Some(a("127.0.0.1:9502")));
        assert_eq!(parse_addr(Some("0.0.0.0:9100"), None).expect("ok"), Some(a("0.0.0.0:9100")));
        assert_eq!(parse_addr(Some("[::1]:9100"), Some(1)).expect("ok"), Some(a("[::1]:9101")));
        assert_eq!(parse_addr(Some("127.0.0.1:0"), Some(5)).expect("ok"), Some(a("127.0.0.1:0")), "port 0 stays 0");
        assert!(parse_addr(Some("localhost:9464"), None).expect("ok").is_some_and(|x| x.ip().is_loopback()));
        let e = parse_addr(Some("nonsense"), None).expect_err("not an address");
        assert!(e.to_string().starts_with("OCCL_METRICS_ADDR=\"nonsense\": not host:port"), "{e}");
        assert!(parse_addr(Some("127.0.0.1:65535"), Some(1)).is_err());
    }

    #[test]
    fn request_heads() {
        assert_eq!(parse(b"GET /metrics HTTP/1.1\r\nHost: x\r\n"), Ask::Metrics { head_only: false });
        assert_eq!(parse(b"HEAD /metrics?x=1 HTTP/1.0\r\n"), Ask::Metrics { head_only: true });
        assert_eq!(parse(b"GET /metricsx HTTP/1.1\r\n"), Ask::NotFound);
        assert_eq!(parse(b"GET / HTTP/1.1\r\n"), Ask::NotFound);
        assert_eq!(parse(b"POST /metrics HTTP/1.1\r\n"), Ask::BadMethod);
        assert_eq!(parse(b"GET /metrics\r\n"), Ask::Malformed);
        assert_eq!(parse(b"GET metrics HTTP/1.1\r\n"), Ask::Malformed);
        assert_eq!(parse(b"GET /metrics SPDY/3\r\n"), Ask::Malformed);
        assert_eq!(parse(b"\xff\xfe /metrics HTTP/1.1\r\n"), Ask::Malformed);
        assert_eq!(parse(b"get /metrics HTTP/1.1\r\n"), Ask::Malformed);
        assert_eq!(find_end(b"GET / HTTP/1.1\r\n\r\nrest"), Some(18));
        assert_eq!(find_end(b"GET / HTTP/1.1\n\n"), Some(16));
        assert_eq!(find_end(b"GET / HTTP/1.1\r\n"), None);
    }
}
