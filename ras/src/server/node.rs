//! The node's client port among jobs. One process of the node owns the port: the first to bind it (SO_REUSEADDR
//! only, so that a second bind fails instead of sharing it and letting the kernel hand each connection to a random
//! job). Every process also listens on a Unix socket, `<pid>-<n>.sock`, in a directory only its user can open
//! (`$XDG_RUNTIME_DIR/occl-ras/<port>` when that directory exists, else `/tmp/occl-ras-<uid>/<port>`, mode 0700,
//! checked). The owner answers for
//! its own job and asks one process of each other job through these sockets ([`Ask`]), or every process for what
//! each holds alone (its flight records); the processes that do not own
//! the port try it every second, so when the owner exits another takes it over.
//!
//! What the port answers, with several jobs on the node: `JOB <name>` (`ncclras --job`, `?job=` on HTTP) picks one;
//! without it a text report holds every job's report, one after the other by job name, `/metrics` every job's series
//! (each labelled with its `job`), and a JSON report is `{"jobs": {name: report, ...}}`. With one job the answers are
//! as they have always been.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;

use super::actor::Shared;
use crate::client::{parse_job, EventGroups, Format};

/// The longest an ask waits to connect and for its answer to begin, and between its lines.
const ASK_TIMEOUT: Duration = Duration::from_secs(2);
/// The longest a process may take to say who it is (one that is stopped is skipped after this).
const WHO_TIMEOUT: Duration = Duration::from_millis(250);
/// The longest line an ask sends.
const MAX_ASK_LINE: usize = 256;

/// This process's place in the node's directory.
#[derive(Debug, Clone)]
pub(crate) struct NodeDir {
    dir: PathBuf,
    me: PathBuf,
}

/// The directory for client port `port`, created private to this user if it is not there; an error if it (or its
/// parent) is another user's or open to others.
pub(crate) fn open(port: u16) -> std::io::Result<NodeDir> {
    let uid = std::fs::metadata("/proc/self")?.uid();
    let run = std::env::var_os("XDG_RUNTIME_DIR").map(PathBuf::from).filter(|p| p.is_absolute() && p.is_dir());
    let base = match run {
        Some(run) => run.join("occl-ras"),
        None => PathBuf::from(format!("/tmp/occl-ras-{uid}")),
    };
    let dir = base.join(port.to_string());
    for d in [&base, &dir] {
        match std::fs::DirBuilder::new().mode(0o700).create(d) {
            Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => return Err(e),
            _ => {}
        }
        let m = std::fs::symlink_metadata(d)?;
        if !m.is_dir() || m.uid() != uid || m.mode() & 0o077 != 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::PermissionDenied,
                format!("{} is not a directory private to uid {uid}", d.display()),
            ));
        }
    }
    static SERVERS: AtomicU32 = AtomicU32::new(0);
    let n = SERVERS.fetch_add(1, Ordering::Relaxed);
    let me = dir.join(format!("{}-{n}.sock", std::process::id()));
    Ok(NodeDir { dir, me })
}

impl NodeDir {
    /// Binds this process's socket (a stale one of a dead process with this pid is replaced).
    pub(crate) fn bind(&self) -> std::io::Result<std::os::unix::net::UnixListener> {
        let _ = std::fs::remove_file(&self.me);
        let l = std::os::unix::net::UnixListener::bind(&self.me)?;
        l.set_nonblocking(true)?;
        Ok(l)
    }

    /// Removes this process's socket, and the port's directory if no other is left in it.
    pub(crate) fn unlink(&self) {
        let _ = std::fs::remove_file(&self.me);
        let _ = std::fs::remove_dir(&self.dir);
    }

    /// The other processes' sockets, by name.
    fn others(&self) -> Vec<PathBuf> {
        let Ok(rd) = std::fs::read_dir(&self.dir) else { return Vec::new() };
        let mut v: Vec<PathBuf> = rd
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "sock") && *p != self.me)
            .collect();
        v.sort();
        v
    }

    /// Every other process's answer to `WHO`: (owns the port, job, socket), until `stop` says enough. A socket
    /// nobody listens on any more is removed; a process that does not answer within [`WHO_TIMEOUT`] (stopped, say)
    /// is skipped.
    fn who_until(&self, mut stop: impl FnMut(bool, &str) -> bool) -> Vec<(bool, String, PathBuf)> {
        let mut out = Vec::new();
        for p in self.others() {
            let answer = connect(&p, &Ask::Who, WHO_TIMEOUT).and_then(|mut s| {
                let mut text = String::new();
                s.read_to_string(&mut text).map(|_| text)
            });
            match answer {
                Ok(text) => {
                    let mut it = text.split_whitespace();
                    let owner = it.next() == Some("1");
                    if let Some(job) = it.next().and_then(|j| parse_job(j).ok()) {
                        let done = stop(owner, &job);
                        out.push((owner, job, p));
                        if done {
                            break;
                        }
                    }
                }
                Err(e) if matches!(e.kind(), std::io::ErrorKind::ConnectionRefused | std::io::ErrorKind::NotFound) => {
                    let _ = std::fs::remove_file(&p);
                }
                Err(e) => tracing::debug!("occl-ras: {}: {e}", p.display()),
            }
        }
        out
    }

    /// Every other process's answer to `WHO`.
    pub(crate) fn who(&self) -> Vec<(bool, String, PathBuf)> {
        self.who_until(|_, _| false)
    }

    /// Whether another process of the node says it owns the port, asked for up to `wait` (one that has just bound
    /// it binds its socket a moment later).
    pub(crate) fn owner_elsewhere(&self, wait: Duration) -> bool {
        let t = Instant::now();
        loop {
            if self.who_until(|owner, _| owner).iter().any(|(owner, _, _)| *owner) {
                return true;
            }
            if t.elapsed() >= wait {
                return false;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// What the port's owner asks another process of the node, one line, answered until EOF.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Ask {
    /// `1 <job>` or `0 <job>`: whether it owns the port, and its job.
    Who,
    /// Its job's report, as `STATUS` gives it.
    Status { verbose: bool, format: Format, budget_ms: u64 },
    /// Its job's `/metrics`, every series labelled with the job.
    Metrics { budget_ms: u64 },
    /// Its job's monitor events, as `MONITOR` streams them.
    Monitor { groups: EventGroups, format: Format },
    /// Its flight records (`/api/v1/flight-recorder` of that process alone).
    Flight,
}

fn format_name(f: Format) -> &'static str {
    match f {
        Format::Text => "text",
        Format::Json => "json",
    }
}

impl Ask {
    pub(crate) fn line(&self) -> String {
        match self {
            Ask::Who => "WHO\n".into(),
            Ask::Status { verbose, format, budget_ms } => {
                format!("STATUS {} {} {budget_ms}\n", u8::from(*verbose), format_name(*format))
            }
            Ask::Metrics { budget_ms } => format!("METRICS {budget_ms}\n"),
            Ask::Monitor { groups, format } => {
                format!("MONITOR {} {} {}\n", u8::from(groups.lifecycle), u8::from(groups.trace), format_name(*format))
            }
            Ask::Flight => "FLIGHT\n".into(),
        }
    }

    pub(crate) fn parse(line: &str) -> Option<Ask> {
        let w: Vec<&str> = line.split_whitespace().collect();
        let flag = |s: &str| match s {
            "0" => Some(false),
            "1" => Some(true),
            _ => None,
        };
        let format = |s: &str| match s {
            "text" => Some(Format::Text),
            "json" => Some(Format::Json),
            _ => None,
        };
        match w.as_slice() {
            ["WHO"] => Some(Ask::Who),
            ["FLIGHT"] => Some(Ask::Flight),
            ["STATUS", v, f, ms] => {
                Some(Ask::Status { verbose: flag(v)?, format: format(f)?, budget_ms: ms.parse().ok()? })
            }
            ["METRICS", ms] => Some(Ask::Metrics { budget_ms: ms.parse().ok()? }),
            ["MONITOR", l, t, f] => {
                Some(Ask::Monitor { groups: EventGroups { lifecycle: flag(l)?, trace: flag(t)? }, format: format(f)? })
            }
            _ => None,
        }
    }
}

fn connect(path: &Path, a: &Ask, limit: Duration) -> std::io::Result<UnixStream> {
    let mut s = UnixStream::connect(path)?;
    s.set_write_timeout(Some(ASK_TIMEOUT))?;
    s.set_read_timeout(Some(limit))?;
    s.write_all(a.line().as_bytes())?;
    Ok(s)
}

/// Asks the process at `path` and reads the whole answer (blocking; at most [`ASK_TIMEOUT`] between reads).
pub(crate) fn ask(path: &Path, a: &Ask) -> std::io::Result<String> {
    let budget = match a {
        Ask::Status { budget_ms, .. } | Ask::Metrics { budget_ms } => Duration::from_millis(*budget_ms),
        _ => Duration::ZERO,
    };
    let mut s = connect(path, a, budget + ASK_TIMEOUT)?;
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    Ok(out)
}

/// The other jobs of the node, one process's socket each, by job name.
pub(crate) async fn other_jobs(sh: &Shared) -> BTreeMap<String, PathBuf> {
    let Some(dir) = sh.node.clone() else { return BTreeMap::new() };
    let me = sh.job.to_string();
    let who = tokio::task::spawn_blocking(move || dir.who()).await.unwrap_or_default();
    let mut jobs = BTreeMap::new();
    for (_, job, path) in who {
        if job != me {
            jobs.entry(job).or_insert(path);
        }
    }
    jobs
}

/// Every other process of the node, with its job and socket (`WHO`), off the runtime's thread.
pub(crate) async fn other_processes(sh: &Shared) -> Vec<(String, PathBuf)> {
    let Some(dir) = sh.node.clone() else { return Vec::new() };
    let who = tokio::task::spawn_blocking(move || dir.who()).await.unwrap_or_default();
    who.into_iter().map(|(_, job, path)| (job, path)).collect()
}

/// [`ask`] off the runtime's thread.
pub(crate) async fn ask_async(path: PathBuf, a: Ask) -> std::io::Result<String> {
    tokio::task::spawn_blocking(move || ask(&path, &a))
        .await
        .unwrap_or_else(|e| Err(std::io::Error::other(e.to_string())))
}

/// Streams the monitor lines of the process at `path` into `tx` until either side stops.
pub(crate) fn monitor_lines(path: PathBuf, groups: EventGroups, format: Format, tx: mpsc::Sender<String>) {
    std::thread::spawn(move || {
        let a = Ask::Monitor { groups, format };
        let Ok(s) = connect(&path, &a, Duration::from_secs(3600)) else { return };
        for line in BufReader::new(s).lines() {
            let Ok(line) = line else { return };
            if tx.blocking_send(line + "\n").is_err() {
                return;
            }
        }
    });
}

/// Answers the asks that arrive on this process's socket until the runtime stops.
pub(crate) fn serve(sh: Shared, listener: std::os::unix::net::UnixListener) {
    let listener = match tokio::net::UnixListener::from_std(listener) {
        Ok(l) => l,
        Err(e) => {
            tracing::warn!("occl-ras: node socket unusable: {e}; the port's owner cannot ask this process");
            return;
        }
    };
    tokio::spawn(async move {
        loop {
            match listener.accept().await {
                Ok((s, _)) => _ = tokio::spawn(answer(sh.clone(), s)),
                Err(e) => {
                    tracing::debug!("occl-ras: node socket accept: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    });
}

async fn answer(sh: Shared, stream: tokio::net::UnixStream) {
    let (r, mut w) = stream.into_split();
    let mut line = String::new();
    let mut r = tokio::io::BufReader::new(r.take(MAX_ASK_LINE as u64));
    match tokio::time::timeout(ASK_TIMEOUT, r.read_line(&mut line)).await {
        Ok(Ok(n)) if n > 0 => {}
        _ => return,
    }
    let Some(a) = Ask::parse(&line) else { return };
    let text = match a {
        Ask::Who => format!("{} {}\n", u8::from(sh.owner.load(Ordering::Relaxed)), sh.job),
        Ask::Status { verbose, format, budget_ms } => {
            super::metrics::report_text(&sh, Duration::from_millis(budget_ms), verbose, format).await
        }
        Ask::Metrics { budget_ms } => {
            super::http::job_metrics(&sh, Duration::from_millis(budget_ms)).await.unwrap_or_default()
        }
        Ask::Flight => super::flight::render().await.unwrap_or_default(),
        Ask::Monitor { groups, format } => {
            let mut rx = sh.events.subscribe();
            loop {
                match rx.recv().await {
                    Ok(e) => {
                        if let Some(l) = super::client::event_line(&e, groups, format) {
                            if w.write_all(l.as_bytes()).await.is_err() {
                                return;
                            }
                        }
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                    Err(_) => return,
                }
            }
        }
    };
    let _ = w.write_all(text.as_bytes()).await;
    let _ = w.shutdown().await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn asks_read_back_as_sent() {
        let asks = [
            Ask::Who,
            Ask::Status { verbose: true, format: Format::Json, budget_ms: 5000 },
            Ask::Status { verbose: false, format: Format::Text, budget_ms: 0 },
            Ask::Metrics { budget_ms: 1500 },
            Ask::Monitor { groups: EventGroups::ALL, format: Format::Text },
            Ask::Monitor { groups: EventGroups::DEFAULT, format: Format::Json },
            Ask::Flight,
        ];
        for a in asks {
            assert_eq!(Ask::parse(&a.line()), Some(a.clone()), "{}", a.line());
        }
        for bad in ["", "WHO x", "FLIGHT 1", "STATUS 2 text 1", "METRICS -1", "MONITOR 1 1 xml", "STATUS 1 text"] {
            assert_eq!(Ask::parse(bad), None, "{bad:?}");
        }
    }
}
