//! Connecting to a RAS client port as NVIDIA's `ncclras` does: resolve (any family), connect each address with a
//! 1 s send/receive timeout, `CLIENT PROTOCOL 2` handshake, optional `TIMEOUT n` and (occl's, `--job`) `JOB <id>`,
//! then a read timeout that covers
//! the server's gather. A timeout during connect or handshake means that process is not answering: say so and
//! connect again (with SO_REUSEPORT the kernel may hand the next connection to another process of the job).
//!
//! Messages are NVIDIA's, word for word; they go to `diag` as they happen (stderr for the plain client, the event
//! log for the live view). The callers print nothing more on failure: the message already said what happened.

use crate::cli::{Options, LEG_TIMEOUT_SECS};
use std::io::{self, ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::Duration;

/// The protocol version this client speaks (`NCCL_RAS_CLIENT_PROTOCOL`).
pub const CLIENT_PROTOCOL: u32 = occl_types::RAS_CLIENT_PROTOCOL;
/// `RAS_COLLECTIVE_EXTRA_TIMEOUT_SEC`: slack on top of the leg timeout.
const EXTRA_TIMEOUT_SECS: u64 = 5;
/// The short timeout that weeds out processes that do not answer.
const FIRST_TIMEOUT: Duration = Duration::from_secs(1);
/// A reply line is at most this long (NVIDIA's buffer is 1 KiB).
const MAX_LINE: usize = 4096;

/// The connection failed; the reason was given to `diag`.
#[derive(Debug)]
pub struct Failed;

/// `strerror` text of an OS error, without Rust's ` (os error N)` suffix.
pub fn strerror(e: &io::Error) -> String {
    let s = e.to_string();
    match s.find(" (os error ") {
        Some(i) => s[..i].to_string(),
        None => s,
    }
}

fn timed_out(e: &io::Error) -> bool {
    matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut)
}

/// Reads until the data read so far ends with a newline, or EOF (as NVIDIA's `rasRead`). `Ok("")` is EOF.
pub fn read_reply(s: &mut TcpStream) -> io::Result<String> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 1024];
    loop {
        let n = match s.read(&mut chunk) {
            Ok(n) => n,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
        if buf.last() == Some(&b'\n') || buf.len() >= MAX_LINE {
            break;
        }
    }
    Ok(String::from_utf8_lossy(&buf).into_owned())
}

/// How one attempt ended.
enum Attempt {
    Connected(TcpStream),
    /// A timeout: try again.
    Retry,
    Failed,
}

fn resolve(o: &Options, diag: &mut dyn FnMut(String)) -> Option<Vec<SocketAddr>> {
    // getaddrinfo takes service names; occl's ports are numbers, and a name it cannot map is reported as
    // getaddrinfo reports an unknown service.
    let Ok(port) = o.port.parse::<u16>() else {
        diag(format!("Resolving {}:{}: Servname not supported for ai_socktype", o.host, o.port));
        return None;
    };
    match (o.host.as_str(), port).to_socket_addrs() {
        Ok(a) => Some(a.collect()),
        Err(e) => {
            let msg = strerror(&e);
            let msg = msg.strip_prefix("failed to lookup address information: ").unwrap_or(&msg).to_string();
            diag(format!("Resolving {}:{}: {msg}", o.host, o.port));
            None
        }
    }
}

fn attempt(o: &Options, diag: &mut dyn FnMut(String)) -> Attempt {
    let Some(addrs) = resolve(o, diag) else { return Attempt::Failed };
    let short = o.timeout != Some(0);
    let mut sock = None;
    for a in &addrs {
        let r = if short { TcpStream::connect_timeout(a, FIRST_TIMEOUT) } else { TcpStream::connect(a) };
        match r {
            Ok(s) => {
                sock = Some(s);
                break;
            }
            Err(e) => {
                // A connect cut short by SO_SNDTIMEO reports EINPROGRESS in NVIDIA's client.
                let why = if timed_out(&e) { "Operation now in progress".to_string() } else { strerror(&e) };
                diag(format!("Connecting to {}:{}: {why}", a.ip(), a.port()));
            }
        }
    }
    let Some(mut s) = sock else {
        let hint = if o.is_default_address() {
            "the RAS client was started on a node where the NCCL job is running"
        } else {
            "the host/port arguments are correct and match NCCL_RAS_ADDR"
        };
        diag(format!(
            "Failed to connect to the NCCL RAS service!\n\
             Please make sure that the NCCL job has the RAS service enabled and that\n{hint}."
        ));
        return Attempt::Failed;
    };
    if short {
        let _ = s.set_read_timeout(Some(FIRST_TIMEOUT));
        let _ = s.set_write_timeout(Some(FIRST_TIMEOUT));
    }
    macro_rules! step {
        ($e:expr, $what:literal) => {
            match $e {
                Ok(v) => v,
                Err(e) if timed_out(&e) => return Attempt::Retry,
                Err(e) => {
                    diag(format!("{}: {}", $what, strerror(&e)));
                    return Attempt::Failed;
                }
            }
        };
    }
    step!(s.write_all(format!("CLIENT PROTOCOL {CLIENT_PROTOCOL}\n").as_bytes()), "write to socket");
    let reply = step!(read_reply(&mut s), "read socket");
    if reply.is_empty() {
        diag("NCCL unexpectedly closed the connection".into());
        return Attempt::Failed;
    }
    const SP: &str = "SERVER PROTOCOL ";
    if reply.len() < SP.len() || !reply[..SP.len()].eq_ignore_ascii_case(SP) {
        diag(format!("Unexpected response from NCCL: {reply}"));
        return Attempt::Failed;
    }
    let version = &reply[SP.len()..];
    let digits: String = version.trim_start().chars().take_while(char::is_ascii_digit).collect();
    if digits.parse::<u32>().ok() != Some(CLIENT_PROTOCOL) {
        diag(format!(
            "NCCL RAS protocol version mismatch (NCCL: {version}; RAS client: {CLIENT_PROTOCOL})!\n\
             Will try to continue in spite of that..."
        ));
    }
    if let Some(t) = o.timeout {
        step!(s.write_all(format!("TIMEOUT {t}\n").as_bytes()), "write to socket");
        let reply = step!(read_reply(&mut s), "read socket");
        if reply.is_empty() {
            diag("NCCL unexpectedly closed the connection".into());
            return Attempt::Failed;
        }
        if !reply.eq_ignore_ascii_case("OK\n") {
            diag(format!("Unexpected response from NCCL: {reply}"));
            return Attempt::Failed;
        }
    }
    if let Some(job) = &o.job {
        step!(s.write_all(format!("JOB {job}\n").as_bytes()), "write to socket");
        let reply = step!(read_reply(&mut s), "read socket");
        if !reply.eq_ignore_ascii_case("OK\n") {
            diag(format!("The server does not take --job (it is not occl, or older): {}", reply.trim_end()));
            return Attempt::Failed;
        }
    }
    if short {
        let leg = o.timeout.unwrap_or(LEG_TIMEOUT_SECS);
        let _ = s.set_read_timeout(Some(FIRST_TIMEOUT + Duration::from_secs(leg + EXTRA_TIMEOUT_SECS)));
    }
    Attempt::Connected(s)
}

/// Connects and shakes hands. `max_retries` bounds the reconnects after timeouts (`None`: as NVIDIA's client, for
/// ever).
pub fn connect(o: &Options, diag: &mut dyn FnMut(String), max_retries: Option<u32>) -> Result<TcpStream, Failed> {
    let mut retries = 0u32;
    loop {
        match attempt(o, diag) {
            Attempt::Connected(s) => return Ok(s),
            Attempt::Failed => return Err(Failed),
            Attempt::Retry => {
                diag("Connection timed out; retrying...".into());
                retries += 1;
                if max_retries.is_some_and(|m| retries > m) {
                    return Err(Failed);
                }
            }
        }
    }
}

/// Sends one command and expects `OK` (`SET FORMAT`), with NVIDIA's messages for the phase after the handshake.
pub fn command_ok(s: &mut TcpStream, line: &str, diag: &mut dyn FnMut(String)) -> Result<(), Failed> {
    if let Err(e) = s.write_all(line.as_bytes()) {
        diag(if timed_out(&e) { "Connection timed out".into() } else { format!("write to socket: {}", strerror(&e)) });
        return Err(Failed);
    }
    match read_reply(s) {
        Ok(r) if r.is_empty() => diag("NCCL unexpectedly closed the connection".into()),
        Ok(r) if r.eq_ignore_ascii_case("OK\n") => return Ok(()),
        Ok(r) => diag(format!("Unexpected response from NCCL: {r}")),
        Err(e) if timed_out(&e) => diag("Connection timed out".into()),
        Err(e) => diag(format!("read socket: {}", strerror(&e))),
    }
    Err(Failed)
}

/// Sends `STATUS` (or `VERBOSE STATUS`) and hands every chunk of the report to `out` until EOF.
pub fn status(
    s: &mut TcpStream,
    verbose: bool,
    diag: &mut dyn FnMut(String),
    out: &mut dyn FnMut(&[u8]) -> io::Result<()>,
) -> Result<(), Failed> {
    let cmd = if verbose { "VERBOSE STATUS\n" } else { "STATUS\n" };
    if let Err(e) = s.write_all(cmd.as_bytes()) {
        diag(if timed_out(&e) { "Connection timed out".into() } else { format!("write to socket: {}", strerror(&e)) });
        return Err(Failed);
    }
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return Ok(()),
            Ok(n) => {
                if let Err(e) = out(&buf[..n]) {
                    diag(format!("fwrite to stdout failed! ({})", strerror(&e)));
                    return Err(Failed);
                }
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) if timed_out(&e) => {
                diag("Connection timed out".into());
                return Err(Failed);
            }
            Err(e) => {
                diag(format!("read socket: {}", strerror(&e)));
                return Err(Failed);
            }
        }
    }
}
