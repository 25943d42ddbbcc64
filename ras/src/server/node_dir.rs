//! The node's directory of RAS processes: every process that serves RAS for client port `<port>` listens on a Unix
//! socket, `<pid>-<n>.sock`, in a directory only its user can open (`$XDG_RUNTIME_DIR/occl-ras/<port>` when that
//! directory exists, else `/tmp/occl-ras-<uid>/<port>`, mode 0700, checked), so no stranger is asked or believed.
//! Who is there, and which job each runs, is asked of them (`WHO`, see `ask`); `node` says what the directory is
//! for.

use std::collections::BTreeMap;
use std::io::ErrorKind;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use super::ask::{ask_within, Ask};
use crate::client::parse_job;

/// The longest a process may take to say who it is (one that is stopped is skipped after this).
const WHO_TIMEOUT: Duration = Duration::from_millis(250);

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
            Err(e) if e.kind() != ErrorKind::AlreadyExists => return Err(e),
            _ => {}
        }
        let m = std::fs::symlink_metadata(d)?;
        if !m.is_dir() || m.uid() != uid || m.mode() & 0o077 != 0 {
            return Err(std::io::Error::new(
                ErrorKind::PermissionDenied,
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
            match ask_within(&p, &Ask::Who, WHO_TIMEOUT) {
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
                Err(e) if matches!(e.kind(), ErrorKind::ConnectionRefused | ErrorKind::NotFound) => {
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

/// The node's jobs other than `me`, one process's socket each, by job name (none without a directory).
pub(crate) async fn other_jobs(dir: Option<&NodeDir>, me: &str) -> BTreeMap<String, PathBuf> {
    let Some(dir) = dir.cloned() else { return BTreeMap::new() };
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
pub(crate) async fn other_processes(dir: Option<&NodeDir>) -> Vec<(String, PathBuf)> {
    let Some(dir) = dir.cloned() else { return Vec::new() };
    let who = tokio::task::spawn_blocking(move || dir.who()).await.unwrap_or_default();
    who.into_iter().map(|(_, job, path)| (job, path)).collect()
}
