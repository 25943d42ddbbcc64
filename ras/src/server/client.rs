//! The client port: one listening socket per process with SO_REUSEPORT (so every process of the node listens on the
//! same port, as NCCL's do), connections told apart by their first bytes: HTTP goes to axum, anything else is NCCL's
//! text protocol driven through [`ClientSession`].

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use socket2::{Domain, Protocol, Socket, Type};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{oneshot, Semaphore};

use super::actor::Shared;
use super::{http, Cmd, Event, Gathered, NodeMetrics};
use crate::client::{Action, ClientSession, EventGroups, Format, Timeout};

/// NCCL's listen backlog for the client socket.
const BACKLOG: i32 = 16384;

/// Binds `addr` with SO_REUSEADDR and SO_REUSEPORT, as NCCL does, so all processes of a job on a node share it.
pub(crate) fn bind_reuseport(addr: SocketAddr) -> std::io::Result<std::net::TcpListener> {
    let s = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    s.set_reuse_address(true)?;
    s.set_reuse_port(true)?;
    s.bind(&addr.into())?;
    s.listen(BACKLOG)?;
    s.set_nonblocking(true)?;
    Ok(s.into())
}

/// Accepts clients until the runtime stops. At most `max_clients` are served at once; more are closed at once
/// rather than queued, so a flood of clients cannot hold the mesh's memory.
pub(crate) fn serve(sh: Shared, listener: std::net::TcpListener) {
    let listener = match TcpListener::from_std(listener) {
        Ok(l) => l,
        Err(e) => {
            tracing::warn!("occl-ras: client listener unusable: {e}");
            return;
        }
    };
    let slots = Arc::new(Semaphore::new(sh.cfg.max_clients));
    tokio::spawn(async move {
        loop {
            let (stream, _) = match listener.accept().await {
                Ok(x) => x,
                Err(e) => {
                    tracing::debug!("occl-ras: client accept: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let Ok(permit) = slots.clone().try_acquire_owned() else {
                tracing::debug!("occl-ras: {} clients already; refusing one", sh.cfg.max_clients);
                continue;
            };
            let sh = sh.clone();
            tokio::spawn(async move {
                handle(sh, stream).await;
                drop(permit);
            });
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

async fn handle(sh: Shared, stream: TcpStream) {
    let _ = stream.set_nodelay(true);
    // Peek until the first bytes say which protocol; a client that sends nothing waits here on its own task.
    let mut peek = [0u8; 8];
    let http = loop {
        let n = match tokio::time::timeout(sh.cfg.client_idle, stream.peek(&mut peek)).await {
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
        http::serve_connection(sh, stream).await;
    } else {
        ncclras(sh, stream).await;
    }
}

/// Gathers the job's status through the mesh task.
pub(crate) async fn gather(sh: &Shared, budget: Duration) -> Result<Gathered, String> {
    let (tx, rx) = oneshot::channel();
    sh.cmds.send(Cmd::Status { budget, reply: tx }).map_err(|_| "the RAS thread is stopping".to_string())?;
    rx.await.map_err(|_| "the gather was dropped".to_string())?
}

/// Collects the metrics of every process of this node through the mesh task, waiting at most `timeout` for each.
pub(crate) async fn node_metrics(sh: &Shared, timeout: Duration) -> Result<NodeMetrics, String> {
    let (tx, rx) = oneshot::channel();
    sh.cmds.send(Cmd::Metrics { timeout, reply: tx }).map_err(|_| "the RAS thread is stopping".to_string())?;
    rx.await.map_err(|_| "the metrics fetch was dropped".to_string())
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

async fn ncclras(sh: Shared, mut stream: TcpStream) {
    let mut session = ClientSession::new(0);
    let mut buf = [0u8; 2048];
    loop {
        let n = match tokio::time::timeout(sh.cfg.client_idle, stream.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) | Err(_) => return,
            Ok(Ok(n)) => n,
        };
        session.handle_bytes(&buf[..n]);
        while let Some(a) = session.poll_action() {
            match a {
                Action::Reply(text) => {
                    if stream.write_all(text.as_bytes()).await.is_err() {
                        return;
                    }
                }
                Action::Status { verbose, format, timeout } => {
                    let text = super::metrics::report_text(&sh, budget(&sh, timeout), verbose, format).await;
                    let _ = stream.write_all(text.as_bytes()).await;
                    let _ = stream.shutdown().await;
                    return;
                }
                Action::Monitor { groups, format } => {
                    monitor(&sh, &mut stream, groups, format).await;
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

/// Streams monitor events until the client goes away.
async fn monitor(sh: &Shared, stream: &mut TcpStream, groups: EventGroups, format: Format) {
    let mut rx = sh.events.subscribe();
    let mut sink = [0u8; 256];
    loop {
        tokio::select! {
            ev = rx.recv() => match ev {
                Ok(e) => {
                    if let Some(line) = event_line(&e, groups, format) {
                        if stream.write_all(line.as_bytes()).await.is_err() {
                            return;
                        }
                    }
                }
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                Err(_) => return,
            },
            r = stream.read(&mut sink) => match r {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            },
        }
    }
}

/// NCCL's monitor line for an event (reference §1.5), or `None` if the client did not ask for its group.
pub(crate) fn event_line(e: &Event, groups: EventGroups, format: Format) -> Option<String> {
    let (name, lifecycle, details) = super::metrics::describe_event(&e.event);
    if !(if lifecycle { groups.lifecycle } else { groups.trace }) {
        return None;
    }
    let ts = super::metrics::local_time(e.unix_ms / 1000);
    let who = match &e.peer {
        Some(p) => format!("Process {} on node {}", p.pid, p.host),
        None => "Unknown peer".to_string(),
    };
    Some(match format {
        Format::Text => format!("[{ts}] {name}: {who} {details}\n"),
        Format::Json => {
            let peer = match &e.peer {
                Some(p) => {
                    serde_json::json!({"host": p.host, "pid": p.pid, "cuda_devs": p.cuda_devs, "nvml_devs": p.nvml_devs})
                }
                None => serde_json::json!({}),
            };
            let group = if lifecycle { "LIFECYCLE" } else { "TRACE" };
            format!(
                "{}\n",
                serde_json::json!({"timestamp": ts, "group": group, "event": name, "peer": peer, "details": details})
            )
        }
    })
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
