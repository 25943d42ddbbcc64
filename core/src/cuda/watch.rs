//! The device watcher: dead peers and stalled copy-engine calls. A kernel waiting for a peer that was killed spins until its device
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
//! graph replays without the host, so such a communicator counts as busy until destroyed. A
//! copy-engine call keeps it busy until its end is seen (below). While nothing is busy the
//! thread sleeps on a condition variable: no CPU while idle.
//!
//! The same thread times copy-engine calls, whose stream waits have no device timeout
//! (`ce/mod.rs`): while a communicator has such calls in flight it looks at their start and end
//! events ([`Calls`], `ce/calls.rs`) every [`PERIOD`], and the stall decision (`stall.rs`) names
//! a call that started more than `OCCL_TIMEOUT` ago (by the watcher's clock, from the first
//! look that saw it start) and has not ended: a live peer stopped calling, or skipped it. That
//! call gets a dead peer's abort, `device_error` reports a `Timeout` that names it and how long
//! it ran (`ncclSystemError` through occl-nccl, the code NCCL gives its timeouts), and the
//! communicator refuses device work from then on, as after a dead peer. Every communicator with
//! copy-engine streams is watched so, thread ranks too. A call captured in a CUDA graph has no
//! events (a replay runs without the host) and is not timed.
//!
//! After a failure (a dead peer, a stall, or `abort_device`) the abort is written again every
//! period while copy-engine calls are in flight: a call queued behind the one released resets
//! the words it waits on, and must drain too, so that destroying the communicator does not hang.

use super::stall::Stall;
use crate::error::{Error, Result};
use crate::sync::lock;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

/// How often the peers of a busy communicator are checked: a killed peer is noticed within
/// this (plus a `kill(pid, 0)` and a `/proc/<pid>/stat` read per peer).
pub(crate) const PERIOD: Duration = Duration::from_millis(25);

/// The stamp of a communicator that launched inside a graph capture: busy until destroyed.
const ALWAYS: u64 = u64::MAX;

/// Stops a communicator's kernels (writes its device error word) and releases its copy-engine
/// waits.
type Abort = Box<dyn Fn() -> Result<()> + Send + Sync>;

/// A communicator's copy-engine calls as the watcher sees them (`ce/calls.rs`).
pub(crate) trait Calls: Send + Sync {
    /// Looks at the calls' events at watcher time `now` and decides (`stall.rs`).
    fn look(&self, now: u64) -> Look;
    /// Whether a call was in flight at the last look (no CUDA call).
    fn any(&self) -> bool;
}

/// What one look at a communicator's copy-engine calls found.
pub(crate) struct Look {
    /// A call is still in flight.
    pub live: bool,
    /// The call to stop (once found, at every look).
    pub stall: Option<Stall>,
}

/// Why the watcher stopped a communicator.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Failure {
    /// This peer (rank, pid) died.
    Dead(usize, u32),
    /// This copy-engine call ran past `OCCL_TIMEOUT`.
    Stalled(Stall),
    /// The communicator was aborted (`abort_device`).
    Aborted,
}

/// What the watcher knows of one device communicator.
pub(crate) struct Watched {
    rank: usize,
    /// (rank, pid) of every peer on this host in another process.
    peers: Vec<(usize, u32)>,
    /// How long after a launch its kernels may still wait for a peer (`OCCL_TIMEOUT`).
    window_ns: u64,
    /// The watcher clock (`now_ns`) of the last launch plus one; 0: none yet; [`ALWAYS`].
    last_launch: AtomicU64,
    failed: OnceLock<Failure>,
    /// The copy-engine calls, when the communicator makes them.
    ce: Option<Arc<dyn Calls>>,
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
    /// This copy-engine call ran past `OCCL_TIMEOUT`.
    Stalled(Stall),
    /// Stopped before, and copy-engine calls are still in flight: release them again.
    Release,
}

impl Watched {
    pub(crate) fn new(
        rank: usize,
        peers: Vec<(usize, u32)>,
        timeout: Duration,
        ce: Option<Arc<dyn Calls>>,
        abort: Abort,
    ) -> Watched {
        let window_ns = u64::try_from(timeout.as_nanos()).unwrap_or(u64::MAX);
        Watched { rank, peers, window_ns, last_launch: AtomicU64::new(0), failed: OnceLock::new(), ce, abort }
    }

    /// The peer found dead, if one was.
    #[cfg(test)]
    fn dead(&self) -> Option<(usize, u32)> {
        match self.failed.get() {
            Some(&Failure::Dead(rank, pid)) => Some((rank, pid)),
            _ => None,
        }
    }

    /// The error a dead peer or a stalled copy-engine call left this communicator with.
    pub(crate) fn error(&self) -> Option<Error> {
        match *self.failed.get()? {
            Failure::Dead(rank, pid) => Some(Error::remote(
                rank,
                format!(
                    "its process (pid {pid}) exited while a device collective waited for it; the kernels were \
                     stopped and this communicator cannot be used again: abort it and make a new one"
                ),
            )),
            Failure::Stalled(s) => Some(Error::Timeout {
                what: format!(
                    "the copy-engine {} of {} bytes per rank (copy-engine call {} of this communicator; stopped \
                     after {:.1} s: a rank stopped calling collectives or skipped this one; if the ranks are \
                     only slow, raise OCCL_TIMEOUT; this communicator cannot be used again: abort it and make a \
                     new one)",
                    s.call.func,
                    s.call.bytes,
                    s.call.n,
                    s.after_ns as f64 / 1e9
                ),
                secs: self.window_ns as f64 / 1e9,
            }),
            Failure::Aborted => None,
        }
    }

    /// Whether a copy-engine call was in flight at the last look.
    fn ce_live(&self) -> bool {
        self.ce.as_ref().is_some_and(|c| c.any())
    }

    /// Whether the peers are watched at `now`: some live in another process, none failed, and
    /// a launch may still be waiting.
    fn watching(&self, now: u64) -> bool {
        if self.peers.is_empty() || self.failed.get().is_some() {
            return false;
        }
        match self.last_launch.load(Ordering::SeqCst) {
            0 => false,
            ALWAYS => true,
            t => now.saturating_sub(t - 1) <= self.window_ns,
        }
    }

    /// Whether device work may be waiting at `now`, as far as known without looking (the
    /// watcher's check before it sleeps).
    fn may_wait(&self, now: u64) -> bool {
        self.watching(now) || self.ce_live()
    }

    fn stamp(&self, now: u64, captured: bool) {
        let v = if captured { ALWAYS } else { now.saturating_add(1).min(ALWAYS - 1) };
        // fetch_max: a graph-captured stamp stays, and a racing older stamp never wins.
        self.last_launch.fetch_max(v, Ordering::SeqCst);
    }

    /// Decides, at watcher time `now`, with `alive` telling whether a pid lives.
    pub(crate) fn check(&self, now: u64, alive: &dyn Fn(u32) -> bool) -> Verdict {
        let look = self.ce.as_ref().map(|c| c.look(now));
        let ce_live = look.as_ref().is_some_and(|l| l.live);
        if self.failed.get().is_some() {
            return if ce_live { Verdict::Release } else { Verdict::Idle };
        }
        if let Some(s) = look.and_then(|l| l.stall) {
            return Verdict::Stalled(s);
        }
        let watching = self.watching(now);
        if watching {
            if let Some(&(rank, pid)) = self.peers.iter().find(|&&(_, pid)| !alive(pid)) {
                return Verdict::Dead(rank, pid);
            }
        }
        if watching || ce_live {
            Verdict::Busy
        } else {
            Verdict::Idle
        }
    }

    /// Acts on a verdict: on a dead peer or a stalled call, records it and stops the kernels
    /// (once); after that, releases the copy-engine calls still in flight.
    fn act(&self, v: &Verdict) {
        let failure = match *v {
            Verdict::Dead(rank, pid) => Failure::Dead(rank, pid),
            Verdict::Stalled(s) => Failure::Stalled(s),
            Verdict::Release => {
                if let Err(e) = (self.abort)() {
                    tracing::debug!("occl: could not release the copy-engine calls again: {e}");
                }
                return;
            }
            Verdict::Idle | Verdict::Busy => return,
        };
        if self.failed.set(failure).is_err() {
            return;
        }
        match failure {
            Failure::Dead(rank, pid) => tracing::error!(
                "occl: rank {rank} (pid {pid}) exited while rank {}'s device collectives waited for it: stopping them",
                self.rank
            ),
            Failure::Stalled(s) => tracing::error!(
                "occl: rank {}'s copy-engine {} (call {}) has run {:.1} s, past OCCL_TIMEOUT: a peer stopped \
                 calling; stopping this communicator's device work",
                self.rank,
                s.call.func,
                s.call.n,
                s.after_ns as f64 / 1e9
            ),
            Failure::Aborted => {}
        }
        if let Err(e) = (self.abort)() {
            tracing::warn!("occl: could not stop rank {}'s device work: {e}", self.rank);
        }
    }
}

/// Checks every communicator once and acts on what it finds; returns whether any is still
/// busy (the watcher keeps polling) or all are idle (it may sleep).
pub(crate) fn sweep(list: &[Arc<Watched>], now: u64, alive: &dyn Fn(u32) -> bool) -> bool {
    let mut busy = false;
    for w in list {
        let v = w.check(now, alive);
        w.act(&v);
        busy |= match v {
            Verdict::Idle => false,
            Verdict::Busy | Verdict::Release => true,
            Verdict::Dead(..) | Verdict::Stalled(_) => w.ce_live(),
        };
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
        // A capture in global mode on another thread would refuse this thread's event queries
        // and writes, and fail.
        if crate::cuda::kernels::device::driver_available() {
            if let Err(e) = crate::cuda::kernels::staging::capture_mode_thread_local() {
                tracing::debug!("occl: the watcher keeps the global capture mode: {e}");
            }
        }
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
            let busy = g.iter().filter_map(Weak::upgrade).any(|w| w.may_wait(now));
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
    /// Starts watching `peers` (rank, pid) of rank `rank` (those of another process that are
    /// visible now) and the copy-engine calls `ce`. `None` when there is nothing to watch (or
    /// no watcher thread).
    pub(crate) fn start(
        rank: usize,
        peers: &[(usize, u32)],
        timeout: Duration,
        ce: Option<Arc<dyn Calls>>,
        abort: Abort,
    ) -> Option<Watch> {
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
        if peers.is_empty() && ce.is_none() {
            return None;
        }
        let watcher = watcher()?;
        let watched = Arc::new(Watched::new(rank, peers, timeout, ce, abort));
        lock(&watcher.list).push(Arc::downgrade(&watched));
        Some(Watch { watched, watcher })
    }

    /// A launch was enqueued (`captured`: into a CUDA graph, which replays later).
    pub(crate) fn launched(&self, captured: bool) {
        self.watched.stamp(now_ns(), captured);
        self.watcher.poke();
    }

    /// The error the watcher stopped this communicator with (a dead peer, a stalled call).
    pub(crate) fn error(&self) -> Option<Error> {
        self.watched.error()
    }

    /// The communicator was aborted: copy-engine calls still in flight are released until
    /// they have drained.
    pub(crate) fn aborted(&self) {
        if self.watched.failed.set(Failure::Aborted).is_ok() {
            self.watcher.poke();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cuda::stall::{CeCall, Stalls};
    use std::sync::atomic::AtomicUsize;

    const S: u64 = 1_000_000_000;

    fn watched(aborts: &Arc<AtomicUsize>) -> Arc<Watched> {
        let a = aborts.clone();
        let abort: Abort = Box::new(move || {
            a.fetch_add(1, Ordering::SeqCst);
            Ok(())
        });
        Arc::new(Watched::new(0, vec![(1, 101), (2, 102)], Duration::from_secs(10), None, abort))
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

    /// Copy-engine calls whose events complete as a script says: each call starts when first
    /// looked at, and ends once `drained` (what the abort's release does to a stalled call).
    struct Script {
        stalls: Mutex<Stalls>,
        drained: AtomicBool,
    }

    impl Script {
        fn new(timeout: Duration, calls: u64) -> Arc<Script> {
            let mut stalls = Stalls::new(timeout);
            for n in 0..calls {
                stalls.enqueued(CeCall { n, func: "AllGather", bytes: 64 << 20 }, n as usize);
            }
            Arc::new(Script { stalls: Mutex::new(stalls), drained: AtomicBool::new(false) })
        }
    }

    impl Calls for Script {
        fn look(&self, now: u64) -> Look {
            let mut s = lock(&self.stalls);
            for (n, _, started) in s.pending() {
                if self.drained.load(Ordering::SeqCst) {
                    s.ended(n);
                } else if !started {
                    s.started(n, now);
                }
            }
            Look { live: s.any(), stall: s.poll(now) }
        }

        fn any(&self) -> bool {
            lock(&self.stalls).any()
        }
    }

    fn counting(aborts: &Arc<AtomicUsize>) -> Abort {
        let a = aborts.clone();
        Box::new(move || {
            a.fetch_add(1, Ordering::SeqCst);
            Ok(())
        })
    }

    /// Rank 0 with `peers`, `OCCL_TIMEOUT` of `secs` and the copy-engine `calls`.
    fn with_calls(peers: Vec<(usize, u32)>, secs: u64, calls: &Arc<Script>, aborts: &Arc<AtomicUsize>) -> Arc<Watched> {
        Arc::new(Watched::new(0, peers, Duration::from_secs(secs), Some(calls.clone()), counting(aborts)))
    }

    #[test]
    fn a_copy_engine_call_past_the_timeout_is_stopped_and_named() {
        let aborts = Arc::new(AtomicUsize::new(0));
        let calls = Script::new(Duration::from_secs(5), 2);
        // Thread ranks: no peer process to watch, only the calls.
        let w = with_calls(vec![], 5, &calls, &aborts);
        let list = [w.clone()];
        let never = |_: u32| -> bool { unreachable!("no peer to look at") };
        assert!(sweep(&list, S, &never), "the calls start");
        assert!(sweep(&list, 6 * S, &never), "exactly OCCL_TIMEOUT: still in time");
        assert!(w.error().is_none());
        assert_eq!(aborts.load(Ordering::SeqCst), 0);
        assert_eq!(
            w.check(6 * S + 1, &never),
            Verdict::Stalled(Stall { call: CeCall { n: 0, func: "AllGather", bytes: 64 << 20 }, after_ns: 5 * S + 1 })
        );
        assert!(sweep(&list, 6 * S + 2, &never), "stopped, and its calls are still draining");
        assert_eq!(aborts.load(Ordering::SeqCst), 1);
        let e = w.error().expect("the stalled call's error");
        assert_eq!(e.kind(), crate::ErrorKind::Timeout);
        let text = e.to_string();
        assert!(text.contains("copy-engine AllGather") && text.contains("call 0"), "{text}");
        assert!(text.contains("after 5.0 s") && text.contains("raise OCCL_TIMEOUT"), "{text}");
        // Until they drain, the release is written again every period (a queued call resets
        // its words); then the communicator is idle and the watcher may sleep.
        assert!(sweep(&list, 7 * S, &never));
        assert_eq!(aborts.load(Ordering::SeqCst), 2);
        assert!(w.may_wait(7 * S));
        calls.drained.store(true, Ordering::SeqCst);
        assert!(!sweep(&list, 8 * S, &never));
        assert!(!w.may_wait(8 * S));
        assert_eq!(aborts.load(Ordering::SeqCst), 2, "no release once they ended");
        assert!(matches!(w.error(), Some(Error::Timeout { .. })), "the error stays");
    }

    #[test]
    fn after_an_abort_calls_in_flight_are_released_until_they_drain() {
        let aborts = Arc::new(AtomicUsize::new(0));
        let calls = Script::new(Duration::from_secs(600), 1);
        let w = with_calls(vec![], 600, &calls, &aborts);
        let list = [w.clone()];
        assert!(sweep(&list, S, &|_| true));
        assert!(w.failed.set(Failure::Aborted).is_ok());
        assert!(sweep(&list, 2 * S, &|_| true));
        assert_eq!(aborts.load(Ordering::SeqCst), 1);
        assert!(w.error().is_none(), "an abort is the caller's, not the watcher's, to report");
        calls.drained.store(true, Ordering::SeqCst);
        assert!(!sweep(&list, 3 * S, &|_| true));
    }

    #[test]
    fn a_dead_peer_beside_copy_engine_calls_is_reported_as_dead() {
        let aborts = Arc::new(AtomicUsize::new(0));
        let calls = Script::new(Duration::from_secs(5), 1);
        let w = with_calls(vec![(1, 101)], 5, &calls, &aborts);
        w.stamp(S, false);
        let list = [w.clone()];
        assert!(sweep(&list, S, &|_| true));
        // Dead at 2 s: the calls are released at once, and keep being while they run; the
        // timeout later changes nothing.
        assert!(sweep(&list, 2 * S, &|_| false));
        assert_eq!(w.dead(), Some((1, 101)));
        assert!(sweep(&list, 100 * S, &|_| false));
        assert!(matches!(w.error(), Some(Error::RemoteError { peer: 1, .. })));
        assert_eq!(aborts.load(Ordering::SeqCst), 2);
    }

    #[test]
    fn the_watcher_thread_stops_a_stalled_copy_engine_call_after_the_timeout() {
        let aborts = Arc::new(AtomicUsize::new(0));
        let timeout = Duration::from_millis(300);
        let calls = Script::new(timeout, 1);
        let w = Watch::start(0, &[], timeout, Some(calls.clone()), counting(&aborts)).expect("calls to watch");
        let t0 = Instant::now();
        w.launched(false);
        let deadline = t0 + Duration::from_secs(10);
        while w.error().is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        let took = t0.elapsed();
        assert!(matches!(w.error(), Some(Error::Timeout { .. })), "{:?}", w.error());
        assert!(took >= timeout && took < timeout + Duration::from_secs(1), "stopped after {took:?}");
        calls.drained.store(true, Ordering::SeqCst);
        let deadline = Instant::now() + Duration::from_secs(10);
        while calls.any() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(!calls.any(), "the watcher saw the calls drain");
        assert!(aborts.load(Ordering::SeqCst) >= 1);
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
        assert!(Watch::start(0, &[(0, me), (1, me)], Duration::from_secs(1), None, none()).is_none());
        // A pid that does not exist here (another pid namespace): not watched.
        assert!(Watch::start(0, &[(0, me), (1, u32::MAX / 2)], Duration::from_secs(1), None, none()).is_none());
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
        let w = Watch::start(0, &[(1, child.id())], Duration::from_secs(60), None, abort).expect("a peer to watch");
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
