//! Strangers at the bootstrap root: garbage bytes, a silent connection and a wrong secret are
//! refused, logged, and the real job still forms on the same root.

use occl::{Comm, Config, ErrorKind, RedOp, UniqueId};
use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A subscriber that keeps log lines in memory. It must be the process's dispatcher before the
/// first communicator (occl installs its own logger then if there is none), so this binary holds
/// this one test only.
fn captured_logs() -> Arc<Mutex<Vec<u8>>> {
    static LOGS: std::sync::OnceLock<Arc<Mutex<Vec<u8>>>> = std::sync::OnceLock::new();
    LOGS.get_or_init(|| {
        let buf = Arc::new(Mutex::new(Vec::new()));
        let b2 = buf.clone();
        let _ = tracing_subscriber::fmt()
            .with_writer(move || Tee(b2.clone()))
            .with_max_level(tracing::Level::WARN)
            .try_init();
        buf
    })
    .clone()
}

struct Tee(Arc<Mutex<Vec<u8>>>);

impl Write for Tee {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        if let Ok(mut v) = self.0.lock() {
            v.extend_from_slice(b);
        }
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn strangers_and_garbage_at_the_bootstrap_root_are_refused_and_logged() {
    let logs = captured_logs();
    let id = UniqueId::new().expect("id");
    // Garbage bytes, then a silent connection, then a client with the wrong secret.
    let mut s = std::net::TcpStream::connect(id.addr()).expect("connect");
    s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").expect("write");
    let _silent = std::net::TcpStream::connect(id.addr()).expect("connect");
    let text = id.to_string();
    let hex_at = "occl1-".len();
    let flipped = if &text[hex_at..hex_at + 1] == "0" { "1" } else { "0" };
    let wrong: UniqueId = format!("{}{}{}", &text[..hex_at], flipped, &text[hex_at + 1..]).parse().expect("id");
    let start = Instant::now();
    let e = Comm::init_rank(2, &wrong, 0, Config::default()).expect_err("stranger must be refused");
    assert_eq!(e.kind(), ErrorKind::InvalidUsage, "{e}");
    assert!(e.to_string().contains("secret"), "{e}");
    assert!(start.elapsed() < Duration::from_secs(5));
    // The real job still forms on the same root.
    let hs: Vec<_> = (0..2)
        .map(|r| {
            let id = id.clone();
            std::thread::spawn(move || {
                let c = Comm::init_rank(2, &id, r, Config::default()).expect("real rank joins");
                let mut v = [r as u32 + 1; 3];
                c.all_reduce_in_place(&mut v, RedOp::Sum).expect("all_reduce");
                assert_eq!(v, [3; 3]);
            })
        })
        .collect();
    for h in hs {
        h.join().expect("rank");
    }
    let text = String::from_utf8_lossy(&logs.lock().expect("logs")).into_owned();
    assert!(text.contains("refused a connection"), "root did not log the strangers:\n{text}");
}
