//! The dead-peer watcher. A kernel waiting for a peer that was killed spins until its device
//! timeout (`OCCL_TIMEOUT`, 600 s by default): the GPU cannot see a process die. The host can:
//! one thread per process checks, every [`PERIOD`], whether the peer processes of each device
//! communicator with device work outstanding still live, and when one is gone it sets that
//! communicator's device error word (the `abort_device` path), so its kernels give up at once,
//! and records which rank died for `device_error` (`ncclRemoteError` naming the rank).
//!
//! What it watches: peers on this host in another process. A rank of this process (thread
//! ranks) lives as long as the watcher itself; a staged communicator (a peer on another host)
//! runs host collectives, whose transports already notice a dead peer. A pid not visible when
//! the communicator is made (another pid namespace) is not watched: its absence later would
//! mean nothing, so those kernels keep their device timeout.
//!
//! When it runs: a launch stamps the communicator; for `OCCL_TIMEOUT` after its last launch
//! (a kernel cannot wait longer) the communicator counts as busy. A launch captured in a CUDA
//! graph replays without the host, so such a communicator counts as busy until destroyed.
//! While nothing is busy the thread sleeps on a condition variable: no CPU while idle.

use crate::error::{Error, Result};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, Weak};
use std::time::{Duration, Instant};

/// How often the peers of a busy communicator are checked: a killed peer is noticed within
/// this (plus a `kill(pid, 0)` and a `/proc/<pid>/stat` read per peer).
pub(crate) const PERIOD: Duration = Duration::from_millis(25);

/// The stamp of a communicator that launched inside a graph capture: busy until destroyed.
const ALWAYS: u64 = u64::MAX;

/// Stops a communicator's kernels (writes its device error word).
type Abort = Box<dyn Fn() -> Result<()> + Send + Sync>;

/// What the watcher knows of one device communicator.
pub(crate) struct Watched {
    rank: usize,
    /// (rank, pid) of every peer on this host in another process.
    peers: Vec<(usize, u32)>,
    /// How long after a launch its kernels may still wait for a peer (`OCCL_TIMEOUT`).
    window_ns: u64,
    /// The watcher clock (`now_ns`) of the last launch plus one; 0: none yet; [`ALWAYS`].
    last_launch: AtomicU64,
    /// The peer found dead: (rank, pid).
    dead: OnceLock<(usize, u32)>,
    abort: Abort,
}

/// What one check of a communicator found.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// No device work can be waiting (or a dead peer was already handled): nothing to do.
    Idle,
    /// Device work may be waiting and every watched peer lives.
    Busy,
    /// This peer (rank, pid) died while device work may be waiting.
    Dead(usize, u32),
}

impl Watched {
    pub(crate) fn new(rank: usize, peers: Vec<(usize, u32)>, timeout: Duration, abort: Abort) -> Watched {
        let window_ns = u64::try_from(timeout.as_nanos()).unwrap_or(u64::MAX);
        Watched { rank, peers, window_ns, last_launch: AtomicU64::new(0), dead: OnceLock::new(), abort }
    }

    /// The peer found dead, if one was.
    pub(crate) fn dead(&self) -> Option<(usize, u32)> {
        self.dead.get().copied()
    }

    /// The error a dead peer left this communicator with.
    pub(crate) fn error(&self) -> Option<Error> {
        self.dead().map(|(rank, pid)| {
            Error::remote(
                rank,
                format!(
                    "its process (pid {pid}) exited while a device collective waited for it; the kernels were \
                     stopped and this communicator cannot be used again: abort it and make a new one"
                ),
            )
        })
    }

    fn stamp(&self, now: u64, captured: bool) {
        let v = if captured { ALWAYS } else { now.saturating_add(1).min(ALWAYS - 1) };
        // fetch_max: a graph-captured stamp stays, and a racing older stamp never wins.
        self.last_launch.fetch_max(v, Ordering::SeqCst);
    }

    /// Decides, at watcher time `now`, with `alive` telling whether a pid lives.
    pub(crate) fn check(&self, now: u64, alive: &dyn Fn(u32) -> bool) -> Verdict {
        if self.dead.get().is_some() {
            return Verdict::Idle;
        }
        match self.last_launch.load(Ordering::SeqCst) {
            0 => return Verdict::Idle,
            ALWAYS => {}
            t if now.saturating_sub(t - 1) > self.window_ns => return Verdict::Idle,
            _ => {}
        }
        match self.peers.iter().find(|&&(_, pid)| !alive(pid)) {
            Some(&(rank, pid)) => Verdict::Dead(rank, pid),
            None => Verdict::Busy,
        }
    }

    /// Acts on a verdict: on a dead peer, records it and stops the kernels (once).
    fn act(&self, v: &Verdict) {
        if let Verdict::Dead(rank, pid) = *v {
            if self.dead.set((rank, pid)).is_err() {
                return;
            }
            tracing::error!(
                "occl: rank {rank} (pid {pid}) exited while rank {}'s device collectives waited for it: stopping them",
                self.rank
            );
            if let Err(e) = (self.abort)() {
                tracing::warn!("occl: could not stop the device kernels after rank {rank} died: {e}");
            }
        }
    }
}

/// Checks every communicator once and acts on what it finds; returns whether any is still
/// busy (the watcher keeps polling) or all are idle (it may sleep).
pub(crate) fn sweep(list: &[Arc<Watched>], now: u64, alive: &dyn Fn(u32) -> bool) -> bool {
    let mut busy = false;
    for w in list {
        let v = w.check(now, alive);
        busy |= v == Verdict::Busy;
        w.act(&v);
    }
    busy
}

/// The process's watcher: the communicators it watches and the thread's sleep.
struct Watcher {
    list: Mutex<Vec<Weak<Watched>>>,
    wake: Condvar,
    asleep: AtomicBool,
}

static WATCHER: Watcher =
    Watcher { list: Mutex::new(Vec::new()), wake: Condvar::new(), asleep: AtomicBool::new(false) };
/// Whether the watcher's thread runs (started at the first communicator to watch).
static STARTED: OnceLock<bool> = OnceLock::new();
static EPOCH: OnceLock<Instant> = OnceLock::new();

fn now_ns() -> u64 {
    u64::try_from(EPOCH.get_or_init(Instant::now).elapsed().as_nanos()).unwrap_or(u64::MAX)
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The watcher, its thread started at the first call; `None` if the thread could not start
/// (logged once: kernels then keep their device timeout).
fn watcher() -> Option<&'static Watcher> {
    let started = STARTED.get_or_init(|| {
        match std::thread::Builder::new().name("occl-cuda-watch".into()).spawn(|| WATCHER.run()) {
            Ok(_) => true,
            Err(e) => {
                tracing::warn!(
                    "occl: no dead-peer watcher thread ({e}): a device collective waiting for a killed peer gives \
                     up only after OCCL_TIMEOUT"
                );
                false
            }
        }
    });
    started.then_some(&WATCHER)
}

impl Watcher {
    fn run(&self) {
        let alive = |pid: u32| crate::transport::fifo::pid_alive(pid);
        loop {
            let list: Vec<Arc<Watched>> = {
                let mut g = lock(&self.list);
                g.retain(|w| w.strong_count() > 0);
                g.iter().filter_map(Weak::upgrade).collect()
            };
            if sweep(&list, now_ns(), &alive) {
                drop(list);
                std::thread::sleep(PERIOD);
                continue;
            }
            drop(list);
            // Sleep until a launch: `asleep` is set before the re-check, and a launch stamps
            // before it reads `asleep`, so either the re-check sees the stamp or the launch
            // sees `asleep` and notifies (under the lock, so not before the wait).
            let mut g = lock(&self.list);
            self.asleep.store(true, Ordering::SeqCst);
            let now = now_ns();
            let busy = g.iter().filter_map(Weak::upgrade).any(|w| w.check(now, &|_| true) == Verdict::Busy);
            if busy {
                self.asleep.store(false, Ordering::SeqCst);
                continue;
            }
            while self.asleep.load(Ordering::SeqCst) {
                g = self.wake.wait(g).unwrap_or_else(|p| p.into_inner());
            }
        }
    }

    fn poke(&self) {
        if self.asleep.swap(false, Ordering::SeqCst) {
            let _g = lock(&self.list);
            self.wake.notify_one();
        }
    }
}

/// A device communicator's handle on the watcher; dropping it stops the watching.
pub(crate) struct Watch {
    watched: Arc<Watched>,
    watcher: &'static Watcher,
}

impl Watch {
    /// Starts watching `peers` (rank, pid) of rank `rank`: those of another process that are
    /// visible now. `None` when there is none to watch (or no watcher thread).
    pub(crate) fn start(rank: usize, peers: &[(usize, u32)], timeout: Duration, abort: Abort) -> Option<Watch> {
        let me = std::process::id();
        let peers: Vec<_> = peers
            .iter()
            .copied()
            .filter(|&(r, pid)| r != rank && pid != me)
            .filter(|&(r, pid)| {
                let seen = crate::transport::fifo::pid_alive(pid);
                if !seen {
                    tracing::debug!("occl: rank {r}'s pid {pid} is not visible here: its death is not watched");
                }
                seen
            })
            .collect();
        if peers.is_empty() {
            return None;
        }
        let watcher = watcher()?;
        let watched = Arc::new(Watched::new(rank, peers, timeout, abort));
        lock(&watcher.list).push(Arc::downgrade(&watched));
        Some(Watch { watched, watcher })
    }

    /// A launch was enqueued (`captured`: into a CUDA graph, which replays later).
    pub(crate) fn launched(&self, captured: bool) {
        self.watched.stamp(now_ns(), captured);
        self.watcher.poke();
    }

    pub(crate) fn error(&self) -> Option<Error> {
        self.watched.error()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    const S: u64 = 1_000_000_000;

    fn watched(aborts: &Arc<AtomicUsize>) -> Arc<Watched> {
        let a = aborts.clone();
        let abort: Abort = Box::new(move || {
            a.fetch_add(1, Ordering::SeqCst);
            Ok(())
        });
        Arc::new(Watched::new(0, vec![(1, 101), (2, 102)], Duration::from_secs(10), abort))
    }

    #[test]
    fn a_dead_peer_stops_the_kernels_only_while_device_work_may_wait() {
        let aborts = Arc::new(AtomicUsize::new(0));
        let w = watched(&aborts);
        let list = [w.clone()];
        let all = |_: u32| true;
        let two_dead = |pid: u32| pid != 102;
        // Never launched: idle even with a dead peer (a host-only phase costs nothing).
        assert_eq!(w.check(5 * S, &two_dead), Verdict::Idle);
        assert!(!sweep(&list, 5 * S, &two_dead));
        assert_eq!(aborts.load(Ordering::SeqCst), 0);
        // Launched at 5 s: busy while every peer lives, up to OCCL_TIMEOUT later.
        w.stamp(5 * S, false);
        assert!(sweep(&list, 6 * S, &all));
        assert!(sweep(&list, 15 * S, &all));
        // Past the window no kernel can still wait: idle, and a death then is not acted on.
        assert!(!sweep(&list, 15 * S + 1, &two_dead));
        assert_eq!(aborts.load(Ordering::SeqCst), 0);
        assert!(w.error().is_none());
        // A new launch; rank 2 dies: one abort, the rank and pid recorded, then idle.
        w.stamp(20 * S, false);
        assert_eq!(w.check(20 * S + PERIOD.as_nanos() as u64, &two_dead), Verdict::Dead(2, 102));
        assert!(!sweep(&list, 20 * S + 1, &two_dead));
        assert_eq!(aborts.load(Ordering::SeqCst), 1);
        assert_eq!(w.dead(), Some((2, 102)));
        let e = w.error().expect("the dead peer's error");
        assert!(matches!(&e, Error::RemoteError { peer: 2, what } if what.contains("102")), "{e}");
        assert_eq!(e.kind(), crate::ErrorKind::RemoteError);
        w.stamp(21 * S, false);
        assert!(!sweep(&list, 21 * S, &two_dead), "handled once");
        assert_eq!(aborts.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn a_graph_captured_launch_is_watched_until_the_communicator_goes() {
        let aborts = Arc::new(AtomicUsize::new(0));
        let w = watched(&aborts);
        w.stamp(S, true);
        w.stamp(2 * S, false); // a later plain launch does not shorten it
        assert_eq!(w.check(1_000 * S, &|_| true), Verdict::Busy);
        assert!(!sweep(std::slice::from_ref(&w), 1_000 * S, &|pid| pid != 101));
        assert_eq!(w.dead(), Some((1, 101)));
        assert_eq!(aborts.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn only_visible_peers_of_other_processes_are_watched() {
        let me = std::process::id();
        let none: fn() -> Abort = || Box::new(|| Ok(()));
        // Thread ranks of this process: nothing to watch, no watcher.
        assert!(Watch::start(0, &[(0, me), (1, me)], Duration::from_secs(1), none()).is_none());
        // A pid that does not exist here (another pid namespace): not watched.
        assert!(Watch::start(0, &[(0, me), (1, u32::MAX / 2)], Duration::from_secs(1), none()).is_none());
    }

    #[test]
    fn the_watcher_thread_stops_kernels_when_a_real_peer_process_is_killed() {
        let mut child = std::process::Command::new("sleep").arg("30").spawn().expect("spawn sleep");
        let aborts = Arc::new(AtomicUsize::new(0));
        let a = aborts.clone();
        let abort: Abort = Box::new(move || {
            a.fetch_add(1, Ordering::SeqCst);
            Ok(())
        });
        let w = Watch::start(0, &[(1, child.id())], Duration::from_secs(60), abort).expect("a peer to watch");
        w.launched(false);
        std::thread::sleep(PERIOD * 4);
        assert!(w.error().is_none(), "the peer lives");
        let t0 = Instant::now();
        child.kill().expect("kill the peer");
        // Unreaped on purpose: a zombie must count as dead.
        let deadline = t0 + Duration::from_secs(10);
        while w.error().is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        let took = t0.elapsed();
        let _ = child.wait();
        assert!(matches!(w.error(), Some(Error::RemoteError { peer: 1, .. })), "{:?}", w.error());
        assert_eq!(aborts.load(Ordering::SeqCst), 1);
        assert!(took < Duration::from_secs(2), "noticed after {took:?}");
    }
}
