//! The plain client: what NVIDIA's `ncclras` does, byte for byte on stdout (the server's report as sent) and
//! message for message on stderr. Exit code 0 on success, 1 on any failure.

use crate::cli::Options;
use crate::conn::{self, strerror, Failed};
use std::io::{self, ErrorKind, Read, Write};
use std::net::TcpStream;

fn diag(msg: String) {
    eprintln!("{msg}");
}

fn to_stdout(bytes: &[u8]) -> io::Result<()> {
    let mut out = io::stdout().lock();
    out.write_all(bytes)?;
    out.flush()
}

/// Runs the status query or the monitor; returns the exit code.
pub fn run(o: &Options) -> u8 {
    let mut d = diag;
    let Ok(mut s) = conn::connect(o, &mut d, None) else { return 1 };
    if let Some(f) = o.format {
        if conn::command_ok(&mut s, &format!("SET FORMAT {}\n", f.as_str()), &mut d).is_err() {
            return 1;
        }
    }
    let r = match &o.monitor {
        Some(groups) => monitor(&mut s, groups.as_deref()),
        None => conn::status(&mut s, o.verbose, &mut d, &mut to_stdout),
    };
    u8::from(r.is_err())
}

fn monitor(s: &mut TcpStream, groups: Option<&str>) -> Result<(), Failed> {
    let cmd = match groups {
        Some(g) => format!("MONITOR {g}\n"),
        None => "MONITOR\n".to_string(),
    };
    if let Err(e) = s.write_all(cmd.as_bytes()) {
        diag(if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) {
            "Connection timed out".into()
        } else {
            format!("Failed to send monitor command: {}", strerror(&e))
        });
        return Err(Failed);
    }
    let first = match conn::read_reply(s) {
        Ok(r) => r,
        Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
            diag("Connection timed out".into());
            return Err(Failed);
        }
        Err(e) => {
            diag(format!("read socket: {}", strerror(&e)));
            return Err(Failed);
        }
    };
    if first.is_empty() {
        diag("Connection closed by server".into());
        return Err(Failed);
    }
    if first.len() < 3 || !first[..3].eq_ignore_ascii_case("OK\n") {
        eprint!("Monitor mode activation failed: {first}");
        return Err(Failed);
    }
    // Events arrive whenever the job has news: wait for ever.
    let _ = s.set_read_timeout(None);
    eprintln!("RAS Monitor Mode - watching for peer changes (Ctrl+C to exit)...");
    eprintln!("================================================================");
    if first.len() > 3 && to_stdout(&first.as_bytes()[3..]).is_err() {
        return Err(Failed);
    }
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => {
                eprintln!("Connection closed by the NCCL job.");
                return Ok(());
            }
            Ok(n) => {
                if let Err(e) = to_stdout(&buf[..n]) {
                    diag(format!("fwrite to stdout failed! ({})", strerror(&e)));
                    return Err(Failed);
                }
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) => {
                diag(format!("read socket: {}", strerror(&e)));
                return Err(Failed);
            }
        }
    }
}
