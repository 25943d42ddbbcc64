//! The live view's data: a poller thread that fetches a report every interval (or at once when asked), and a
//! monitor thread that holds a `MONITOR` stream where the server has one (occl, NCCL ≥ 2.29) and turns each event
//! into a log line and a refresh. Both speak through one channel of [`Msg`]s; neither touches the terminal.

use super::state::Msg;
use crate::cli::Options;
use crate::conn;
use crate::model;
use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender};
use std::time::Duration;

/// A report larger than this is refused (a real one is kilobytes; a huge job's a few MiB).
const MAX_REPORT: usize = 64 << 20;
/// Reconnects after timeouts before a refresh counts as failed (the next one tries again).
const RETRIES: u32 = 2;

/// Whether to ask for JSON: unknown until the server answers `SET FORMAT json`.
#[derive(Clone, Copy, PartialEq)]
enum Json {
    Try,
    No,
}

fn fetch(o: &Options, json: &mut Json) -> Result<model::Snapshot, String> {
    let mut why = Vec::new();
    let mut diag = |m: String| why.push(m);
    let mut s = conn::connect(o, &mut diag, Some(RETRIES)).map_err(|_| why.join("; "))?;
    let mut why = Vec::new();
    let mut diag = |m: String| why.push(m);
    if *json == Json::Try {
        // NCCL before 2.28.7 answers `ERROR: Unknown command …` and keeps the connection: fall back to text.
        s.write_all(b"SET FORMAT json\n").map_err(|e| format!("write to socket: {}", conn::strerror(&e)))?;
        match conn::read_reply(&mut s) {
            Ok(r) if r.eq_ignore_ascii_case("OK\n") => {}
            Ok(r) if r.starts_with("ERROR") => *json = Json::No,
            Ok(r) if r.is_empty() => return Err("NCCL unexpectedly closed the connection".into()),
            Ok(r) => return Err(format!("Unexpected response from NCCL: {}", r.trim_end())),
            Err(e) => return Err(format!("read socket: {}", conn::strerror(&e))),
        }
    }
    let mut body = Vec::new();
    let mut sink = |b: &[u8]| {
        if body.len() + b.len() > MAX_REPORT {
            return Err(std::io::Error::new(ErrorKind::InvalidData, "report larger than 64 MiB"));
        }
        body.extend_from_slice(b);
        Ok(())
    };
    conn::status(&mut s, o.verbose, &mut diag, &mut sink).map_err(|_| why.join("; "))?;
    model::parse(&String::from_utf8_lossy(&body))
}

/// Fetches a report every `o.interval` seconds, or when `wake` says so; ends when the view hangs up.
pub fn poll(o: Options, tx: Sender<Msg>, wake: Receiver<()>) {
    let mut json = if o.format == Some(crate::cli::Format::Text) { Json::No } else { Json::Try };
    let every = Duration::from_secs_f64(o.interval);
    loop {
        let msg = match fetch(&o, &mut json) {
            Ok(s) => Msg::Snapshot(Box::new(s)),
            Err(e) => Msg::FetchFailed(e),
        };
        if tx.send(msg).is_err() {
            return;
        }
        match wake.recv_timeout(every) {
            Ok(()) => while wake.try_recv().is_ok() {},
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => return,
        }
    }
}

/// Holds a MONITOR stream; reconnects after a break, gives up for good on a server without MONITOR.
pub fn monitor(o: Options, tx: Sender<Msg>) {
    let pause = Duration::from_secs_f64(o.interval.max(1.0));
    loop {
        let mut quiet = |_: String| {};
        let state = match conn::connect(&o, &mut quiet, Some(RETRIES)) {
            Ok(s) => stream(s, &tx),
            Err(_) => Ok("reconnecting"),
        };
        match state {
            Ok(s) if tx.send(Msg::Monitor(s.into())).is_ok() => {}
            Ok(_) => return,
            Err(s) => {
                let _ = tx.send(Msg::Monitor(s.into()));
                return;
            }
        }
        std::thread::sleep(pause);
    }
}

/// Runs one MONITOR stream until it ends: `Ok(state)` to retry, `Err(state)` to stop.
fn stream(mut s: TcpStream, tx: &Sender<Msg>) -> Result<&'static str, &'static str> {
    if s.write_all(b"MONITOR all\n").is_err() {
        return Ok("reconnecting");
    }
    match conn::read_reply(&mut s) {
        Ok(r) if r.len() >= 3 && r[..3].eq_ignore_ascii_case("OK\n") => {}
        Ok(r) if r.starts_with("ERROR") => return Err("unsupported by this server"),
        _ => return Ok("reconnecting"),
    }
    if tx.send(Msg::Monitor("on".into())).is_err() {
        return Err("off");
    }
    let _ = s.set_read_timeout(None);
    let mut pending = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let n = match s.read(&mut buf) {
            Ok(0) | Err(_) => return Ok("reconnecting"),
            Ok(n) => n,
        };
        pending.extend_from_slice(&buf[..n]);
        while let Some(i) = pending.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = pending.drain(..=i).collect();
            let text = String::from_utf8_lossy(&line).trim_end().to_string();
            if !text.is_empty() && tx.send(Msg::Event(text)).is_err() {
                return Err("off");
            }
        }
        // A line without end that keeps growing is not a monitor stream.
        if pending.len() > 64 << 10 {
            return Ok("reconnecting");
        }
    }
}
