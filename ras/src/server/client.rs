//! The client port: one listening socket, held by one process of the node (see `node`: the others answer through
//! it), connections told apart by their first bytes: HTTP goes to axum, anything else is NCCL's text protocol driven
//! through [`ClientSession`].

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use socket2::{Domain, Protocol, Socket, Type};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::http;
use super::seat::{write_within, Seat, Seats, PRESSURE_LOG_EVERY};
use super::shared::Shared;
use crate::client::{Action, ClientSession, Timeout};

/// NCCL's listen backlog for the client socket.
const BACKLOG: i32 = 16384;

/// Binds `addr` with SO_REUSEADDR (a port whose owner just exited is free again at once) but not SO_REUSEPORT: a
/// port that is taken stays the owner's, so the kernel never hands a client to a random job of the node.
pub(crate) fn bind(addr: SocketAddr) -> std::io::Result<std::net::TcpListener> {
    let s = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    s.set_reuse_address(true)?;
    s.bind(&addr.into())?;
    s.listen(BACKLOG)?;
    s.set_nonblocking(true)?;
    Ok(s.into())
}

/// Accepts clients until the runtime stops. The admission table bounds how many are held (see
/// `server::admission`): a newcomer pushes out an idle connection, so a flood of silent connections costs this
/// process a bounded number of sockets and never keeps a real client out.
pub(crate) fn serve(sh: Shared, listener: std::net::TcpListener) {
    let listener = match TcpListener::from_std(listener) {
        Ok(l) => l,
        Err(e) => {
            tracing::warn!("occl-ras: client listener unusable: {e}");
            return;
        }
    };
    let seats = Seats::new(sh.cfg.max_clients);
    tokio::spawn(async move {
        let mut warned: Option<Instant> = None;
        loop {
            let (stream, peer) = match listener.accept().await {
                Ok(x) => x,
                Err(e) => {
                    // Out of file descriptors, or a connection reset before it was accepted: wait a little rather
                    // than spin on an error that repeats. The table holds at most a quarter of the process's
                    // descriptors, so running out means something else in the process holds the rest.
                    // ENFILE (23) and EMFILE (24) on Linux.
                    let out_of_fds = matches!(e.raw_os_error(), Some(23 | 24));
                    if out_of_fds && warned.is_none_or(|t| t.elapsed() >= PRESSURE_LOG_EVERY) {
                        tracing::warn!(
                            "occl-ras: cannot accept a client: {e}; the process is out of file descriptors (raise \
                             `ulimit -n`)"
                        );
                        warned = Some(Instant::now());
                    } else {
                        tracing::debug!("occl-ras: client accept: {e}");
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            // A refused connection is closed with the future that would have served it.
            seats.admit(peer.ip(), |seat| handle(sh.clone(), stream, seat));
        }
    });
}

/// Whether the bytes so far start an HTTP request line (`GET /…`), decided as soon as they can be.
fn looks_like_http(b: &[u8]) -> Option<bool> {
    // Methods are case-sensitive (RFC 9110); no ncclras command starts with one followed by a space.
    const METHODS: [&[u8]; 6] = [b"GET ", b"HEAD ", b"POST ", b"PUT ", b"DELETE ", b"OPTIONS "];
    if METHODS.iter().any(|m| b.starts_with(m)) {
        Some(true)
    } else if METHODS.iter().any(|m| m.starts_with(b)) {
        None
    } else {
        Some(false)
    }
}

async fn handle(sh: Shared, stream: TcpStream, seat: Seat) {
    let _ = stream.set_nodelay(true);
    // Peek until the first bytes say which protocol, within the request timeout.
    let deadline = tokio::time::Instant::now() + sh.cfg.client_request_timeout;
    let mut peek = [0u8; 8];
    let http = loop {
        let n = match tokio::time::timeout_at(deadline, stream.peek(&mut peek)).await {
            Ok(Ok(0)) | Ok(Err(_)) | Err(_) => return,
            Ok(Ok(n)) => n,
        };
        match looks_like_http(&peek[..n]) {
            Some(h) => break h,
            None if n < peek.len() => tokio::time::sleep(Duration::from_millis(5)).await,
            None => break false,
        }
    };
    if http {
        http::serve_connection(sh, stream, seat).await;
    } else {
        ncclras(sh, stream, seat).await;
    }
}

/// The gather budget a client's `TIMEOUT` asks for.
pub(crate) fn budget(sh: &Shared, t: Timeout) -> Duration {
    match t {
        Timeout::Default => sh.cfg.default_budget,
        // NCCL's 0 means no timeout; a day is as good and keeps every timer finite.
        Timeout::Disabled => Duration::from_secs(86_400),
        Timeout::Seconds(s) => Duration::from_secs(s.clamp(1, 86_400)),
    }
}

async fn ncclras(sh: Shared, mut stream: TcpStream, seat: Seat) {
    let mut session = ClientSession::new(0);
    let mut buf = [0u8; 2048];
    // Each command line must be complete within the request timeout of the previous one (of the connection, for
    // the first): bytes that never make a line, or blank lines, do not count.
    let mut deadline = tokio::time::Instant::now() + sh.cfg.client_request_timeout;
    let mut lines = 0;
    loop {
        let n = match tokio::time::timeout_at(deadline, stream.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) | Err(_) => return,
            Ok(Ok(n)) => n,
        };
        session.handle_bytes(&buf[..n]);
        if session.lines_handled() > lines {
            lines = session.lines_handled();
            deadline = tokio::time::Instant::now() + sh.cfg.client_request_timeout;
            seat.waiting();
        }
        while let Some(a) = session.poll_action() {
            match a {
                Action::Reply(text) => {
                    if !write_within(&mut stream, text.as_bytes()).await {
                        return;
                    }
                }
                Action::Status { verbose, format, timeout } => {
                    seat.busy();
                    let text =
                        match super::jobs::status(&sh, budget(&sh, timeout), verbose, format, session.job()).await {
                            super::jobs::Reply::Ok(t) | super::jobs::Reply::Failed(t) => t,
                            super::jobs::Reply::Unknown(e) => format!("ERROR: {e}\n"),
                        };
                    if write_within(&mut stream, text.as_bytes()).await {
                        let _ = stream.shutdown().await;
                    }
                    return;
                }
                Action::Monitor { groups, format } => {
                    if !seat.stream() {
                        // `OK` is already written: the error follows it, and the connection closes.
                        let _ = write_within(&mut stream, b"ERROR: Too many monitor clients on this process\n").await;
                        return;
                    }
                    super::jobs::monitor(&sh, &mut stream, groups, format, session.job()).await;
                    return;
                }
                Action::Close => {
                    let _ = stream.shutdown().await;
                    return;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::looks_like_http;

    #[test]
    fn http_is_told_from_ncclras_by_the_first_bytes() {
        assert_eq!(looks_like_http(b"GET /metrics HTTP/1.1"), Some(true));
        assert_eq!(looks_like_http(b"HEAD /"), Some(true));
        assert_eq!(looks_like_http(b"GE"), None);
        assert_eq!(looks_like_http(b""), None);
        assert_eq!(looks_like_http(b"CLIENT PROTOCOL 2\n"), Some(false));
        assert_eq!(looks_like_http(b"STATUS\n"), Some(false));
        assert_eq!(looks_like_http(b"get /x"), Some(false), "HTTP methods are case-sensitive");
        assert_eq!(looks_like_http(b"\x00\x01\x02"), Some(false));
    }
}
