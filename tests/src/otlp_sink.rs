//! A minimal OTLP/HTTP collector stand-in for the benchmark: accepts POSTs on loopback, reads
//! and discards each body, answers 200 with an empty `ExportTraceServiceResponse`. It costs what
//! a local collector agent's socket reads cost, without decoding (the tests' receiver decodes).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

/// Largest request body accepted (a batch of 512 spans is ~200 KB).
const MAX_BODY: usize = 64 << 20;

/// Requests and body bytes received.
#[derive(Default)]
pub struct SinkStats {
    pub requests: AtomicU64,
    pub bytes: AtomicU64,
}

/// Starts the sink on 127.0.0.1 (an ephemeral port) on threads of its own; they live as long as
/// the process.
pub fn start() -> std::io::Result<(SocketAddr, Arc<SinkStats>)> {
    let l = TcpListener::bind("127.0.0.1:0")?;
    let addr = l.local_addr()?;
    let stats = Arc::new(SinkStats::default());
    let st = stats.clone();
    std::thread::Builder::new().name("otlp-sink".into()).spawn(move || {
        for c in l.incoming().flatten() {
            let st = st.clone();
            let _ = std::thread::Builder::new().name("otlp-sink-conn".into()).spawn(move || serve(c, &st));
        }
    })?;
    Ok((addr, stats))
}

fn serve(c: TcpStream, st: &SinkStats) {
    let Ok(mut w) = c.try_clone() else { return };
    let mut r = BufReader::new(c);
    loop {
        let mut len = 0usize;
        let mut line = String::new();
        let mut head = 0usize;
        loop {
            line.clear();
            match r.read_line(&mut line) {
                Ok(0) | Err(_) => return,
                Ok(n) => head += n,
            }
            if head > 64 << 10 {
                return;
            }
            let l = line.trim_end();
            if l.is_empty() {
                break;
            }
            if let Some((k, v)) = l.split_once(':') {
                if k.eq_ignore_ascii_case("content-length") {
                    len = v.trim().parse().unwrap_or(0);
                }
            }
        }
        if len > MAX_BODY {
            return;
        }
        let mut body = vec![0u8; len];
        if r.read_exact(&mut body).is_err() {
            return;
        }
        st.requests.fetch_add(1, Relaxed);
        st.bytes.fetch_add(len as u64, Relaxed);
        if w.write_all(b"HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\ncontent-length: 0\r\n\r\n").is_err()
        {
            return;
        }
    }
}
