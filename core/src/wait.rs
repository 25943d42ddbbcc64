//! Bounded waiting on a word of memory shared with a peer (another process through shared
//! memory, or a thread rank of this process), and on sockets for ranks with tcp peers.
//!
//! A shm waiter spins briefly (the fast path: a peer that is a few hundred nanoseconds behind),
//! then yields (ranks oversubscribing the cores must let each other run), then sleeps on a futex
//! of the watched word. The other side only makes the wake-up system call when its `sleepers`
//! counter says somebody sleeps, so a busy pipeline makes no system call per chunk. Sleeping is
//! in short slices so that liveness checks and the deadline still run.
//!
//! A rank with tcp peers has no proxy thread: every wait of it drives the sockets (`Drive`,
//! `driven`), spinning on non-blocking I/O, then blocking where the wake-up comes from: in
//! poll(2) on the sockets for a tcp FIFO, so a peer's data wakes it directly; on the futex in
//! short slices for a shm FIFO, so its shm peer still wakes it and the sockets get their turns.

use crate::error::{Error, Result};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant};

const SLEEP_SLICE: Duration = Duration::from_millis(20);

/// How long a waiter keeps the CPU before it sleeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Patience {
    /// A shm FIFO: its peer is usually a few hundred nanoseconds away, and every microsecond
    /// of wake-up latency is on the critical path.
    Eager,
    /// A shm FIFO on a host with more ranks than cores: the peer we wait for is often not
    /// running, and spinning would only keep it off the core; yield after one look.
    Share,
    /// A tcp FIFO: this thread fills and drains it itself, moving socket data in `ready()`
    /// (built by `driven`), and blocks in poll(2) on the sockets, never on the futex (no other
    /// thread would wake it).
    Drive,
}

impl Patience {
    const YIELD_FOR: Duration = Duration::from_micros(500);

    fn spins(self) -> u32 {
        match self {
            // Poll once, then yield (what Open MPI does when oversubscribed): 4-rank 8 B
            // all-reduce on 2 cores, interleaved, medians of 5: 6.3 µs with 32 spins, 5.2 with
            // 8, 4.95 with none; the spins' pauses only delay the rank we wait for.
            Patience::Share => 0,
            _ => 4096,
        }
    }
}

/// Moves data that the waiting thread is responsible for (the tcp sockets of a communicator).
pub(crate) trait Drive {
    /// Does all the I/O it can without blocking; true if anything moved.
    fn progress(&self) -> bool;
    /// Blocks until some I/O may be possible, at most `timeout`.
    fn block(&self, timeout: Duration);
    /// Data waits to be written: a peer may be starving while this thread sleeps.
    fn busy(&self) -> bool;
    /// Moves data until everything posted so far is written (bounded by `deadline`, ended by
    /// `abort`), so a peer gets it even if this rank fails before its next wait.
    fn flush_writes(&self, abort: &AtomicBool, deadline: &Deadline) -> Result<()>;
}

/// What a wait waits for. A plain closure is a condition; `driven` adds the sockets that the
/// waiting thread must keep moving meanwhile.
pub(crate) trait Ready {
    /// Whether the condition holds (a driven wait first moves what it can).
    fn ready(&mut self) -> bool;
    /// Whether the last `ready` moved any data: a wait blocks only after it sees none for a while.
    fn moved(&self) -> bool {
        false
    }
    /// A driven wait, one that moves socket data.
    fn drives(&self) -> bool {
        false
    }
    /// See `Drive::busy`.
    fn busy(&self) -> bool {
        false
    }
    /// Blocks in the driver's poll(2), at most `timeout`.
    fn block(&self, _timeout: Duration) {}
}

impl<F: FnMut() -> bool> Ready for F {
    fn ready(&mut self) -> bool {
        self()
    }
}

/// A condition whose waits progress `drive` (see `driven`).
pub(crate) struct Driven<'a, C> {
    drive: Option<&'a dyn Drive>,
    cond: C,
    moved: bool,
}

/// `cond`, waited for while progressing `drive` (the communicator's tcp sockets, if any).
pub(crate) fn driven<C: Fn() -> bool>(drive: Option<&dyn Drive>, cond: C) -> Driven<'_, C> {
    Driven { drive, cond, moved: false }
}

impl<C: Fn() -> bool> Ready for Driven<'_, C> {
    fn ready(&mut self) -> bool {
        self.moved = false;
        if (self.cond)() {
            return true;
        }
        let Some(d) = self.drive else { return false };
        self.moved = d.progress();
        (self.cond)()
    }

    fn moved(&self) -> bool {
        self.moved
    }

    fn drives(&self) -> bool {
        self.drive.is_some()
    }

    fn busy(&self) -> bool {
        self.drive.is_some_and(|d| d.busy())
    }

    fn block(&self, timeout: Duration) {
        if let Some(d) = self.drive {
            d.block(timeout);
        }
    }
}

/// Fruitless `ready` calls (each followed by a yield) before a driven wait blocks: some
/// 50-100 µs, as a poll(2) wake-up costs 15-40 µs here (8-byte 2-rank tcp all-reduce: 4 µs with
/// these spins, 15-48 µs with none). The yield lets a rank that shares the core run (4 ranks on
/// 2 cores: 30-40 µs instead of 200); with a core to ourselves it returns at once.
const DRIVE_SPINS: u32 = 48;
/// The longest poll(2) of a tcp wait: bounds how late it sees `abort()` and the deadline.
const POLL_SLICE: Duration = Duration::from_millis(1);
/// Futex slices of a shm wait that also drives sockets: short while data waits to be written
/// (its tcp peer may be starving), longer when the sockets only have incoming data, which the
/// kernel buffers meanwhile.
const BUSY_SLICE: Duration = Duration::from_micros(200);
const IDLE_SLICE: Duration = Duration::from_millis(2);

/// The bound on one wait (`OCCL_TIMEOUT`): a wait that sees no progress for this long fails.
/// The clock is read only when a wait stops spinning, so the fast path pays nothing for it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Deadline {
    pub timeout: Duration,
}

impl Deadline {
    pub(crate) fn after(timeout: Duration) -> Deadline {
        Deadline { timeout }
    }
}

/// Told when a wait blocks (futex or poll) and when it wakes: the progress engine's Sleep and
/// Wakeup profiler events (ProxyCtrl). The token from `sleep` comes back in `woke`.
pub(crate) trait Sleeper {
    fn sleep(&self) -> Option<occl_events::EventId>;
    fn woke(&self, token: Option<occl_events::EventId>);
}

fn slept<R>(s: Option<&dyn Sleeper>, block: impl FnOnce() -> R) -> R {
    match s {
        None => block(),
        Some(s) => {
            let t = s.sleep();
            let r = block();
            s.woke(t);
            r
        }
    }
}

/// Why a wait stopped early: the check callback's verdict.
pub(crate) type Check<'a> = &'a mut dyn FnMut(bool) -> Result<()>;

/// A failed check loses to a condition that came true meanwhile: a peer that acknowledged the
/// last slot (or published it) and then closed its end did all this wait asked of it, and its
/// state word is written after the slot, so seeing the state means seeing the slot. The caller's
/// loop returns on its next `ready()`.
fn unless_ready(checked: Result<()>, ready: &mut dyn FnMut() -> bool) -> Result<()> {
    match checked {
        Err(e) if !ready() => Err(e),
        _ => Ok(()),
    }
}

/// Waits until `ready()` is true.
///
/// `word` is the futex word the other side changes when `ready()` may have become true, and
/// `sleepers` the counter it reads to decide whether to wake. `check(slow)` runs now and then
/// (with `slow = true` at most every ~100 ms, for checks that cost a system call) and fails the
/// wait when the peer is gone. `deadline` bounds the wait; `what` names it in the error.
#[allow(clippy::too_many_arguments)] // the parts of one wait; each call site names them all
pub(crate) fn wait_until(
    mut ready: impl Ready,
    word: &AtomicU32,
    sleepers: &AtomicU32,
    check: Check<'_>,
    deadline: &Deadline,
    patience: Patience,
    what: &dyn Fn() -> String,
    sleeper: Option<&dyn Sleeper>,
) -> Result<()> {
    if patience == Patience::Drive || ready.drives() {
        return drive_wait(ready, Parts { word, sleepers, check, deadline, patience, what, sleeper });
    }
    let mut ready = || ready.ready();
    for i in 0..patience.spins() {
        if ready() {
            return Ok(());
        }
        if i % 1024 == 1023 {
            unless_ready(check(false), &mut ready)?;
        }
        std::hint::spin_loop();
    }
    let yield_start = Instant::now();
    let give_up = yield_start + deadline.timeout;
    while yield_start.elapsed() < Patience::YIELD_FOR {
        for _ in 0..8 {
            if ready() {
                return Ok(());
            }
            std::thread::yield_now();
        }
        unless_ready(check(false), &mut ready)?;
    }
    let mut slow = SlowChecks(Instant::now());
    unless_ready(check(true), &mut ready)?;
    loop {
        if nap(word, sleepers, SLEEP_SLICE, sleeper, &mut ready) || ready() {
            return Ok(());
        }
        let now = Instant::now();
        unless_ready(check(slow.due(now)), &mut ready)?;
        if now >= give_up {
            return Err(timed_out(what, deadline));
        }
    }
}

/// Sleeps on `word` for up to `slice` unless `ready()` is true once this waiter has announced
/// itself in `sleepers` (the waker either sees the count or the waiter sees its write: both
/// sides use SeqCst for this pair). True when it found `ready()` instead of sleeping.
fn nap(
    word: &AtomicU32,
    sleepers: &AtomicU32,
    slice: Duration,
    sleeper: Option<&dyn Sleeper>,
    ready: &mut dyn FnMut() -> bool,
) -> bool {
    let seen = word.load(Ordering::Acquire);
    sleepers.fetch_add(1, Ordering::SeqCst);
    let found = ready();
    if !found {
        slept(sleeper, || futex_wait(word, seen, slice));
    }
    sleepers.fetch_sub(1, Ordering::SeqCst);
    found
}

/// When the checks that cost a system call are due: at most every ~100 ms.
struct SlowChecks(Instant);

impl SlowChecks {
    fn due(&mut self, now: Instant) -> bool {
        let due = now.duration_since(self.0) >= Duration::from_millis(100);
        if due {
            self.0 = now;
        }
        due
    }
}

fn timed_out(what: &dyn Fn() -> String, deadline: &Deadline) -> Error {
    Error::Timeout { what: what(), secs: deadline.timeout.as_secs_f64() }
}

/// The parts of a wait besides its condition, as `wait_until` names them.
struct Parts<'a> {
    word: &'a AtomicU32,
    sleepers: &'a AtomicU32,
    check: Check<'a>,
    deadline: &'a Deadline,
    patience: Patience,
    what: &'a dyn Fn() -> String,
    sleeper: Option<&'a dyn Sleeper>,
}

/// A wait of a rank with tcp peers: every `ready()` moves socket data; once nothing moves for
/// a while it blocks where a wake-up will come from: poll(2) on the sockets for a tcp FIFO
/// (this thread itself fills it), the futex for a shm FIFO (its peer wakes it) in slices that
/// give the sockets a turn.
fn drive_wait(mut ready: impl Ready, parts: Parts<'_>) -> Result<()> {
    let Parts { word, sleepers, check, deadline, patience, what, sleeper } = parts;
    let start = Instant::now();
    let mut slow = SlowChecks(start);
    let (mut i, mut idle) = (0u32, 0u32);
    loop {
        if ready.ready() {
            return Ok(());
        }
        if ready.moved() {
            idle = 0;
        } else {
            idle += 1;
            std::thread::yield_now();
            if idle >= DRIVE_SPINS {
                idle = 0;
                if patience == Patience::Drive {
                    slept(sleeper, || ready.block(POLL_SLICE));
                } else {
                    let slice = if ready.busy() { BUSY_SLICE } else { IDLE_SLICE };
                    nap(word, sleepers, slice, sleeper, &mut || ready.ready());
                }
            }
        }
        i = i.wrapping_add(1);
        if i % 16 == 0 {
            let now = Instant::now();
            unless_ready(check(slow.due(now)), &mut || ready.ready())?;
            if now.duration_since(start) >= deadline.timeout {
                return Err(timed_out(what, deadline));
            }
        }
    }
}

/// Wakes sleepers on `word` if `sleepers` says there are any. Call after the store that makes
/// their condition true (that store must be SeqCst, or followed by a SeqCst fence).
#[inline]
pub(crate) fn wake(word: &AtomicU32, sleepers: &AtomicU32) {
    if sleepers.load(Ordering::SeqCst) != 0 {
        futex_wake(word);
    }
}

pub(crate) fn futex_wait(word: &AtomicU32, expected: u32, timeout: Duration) {
    let ts =
        libc::timespec { tv_sec: timeout.as_secs() as libc::time_t, tv_nsec: timeout.subsec_nanos() as libc::c_long };
    // SAFETY: `word` is a live, aligned u32; shared (not private) futex so it works across
    // processes on a MAP_SHARED mapping. Spurious returns are handled by the caller's loop.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            expected,
            &ts as *const libc::timespec,
            std::ptr::null::<u32>(),
            0u32,
        );
    }
}

fn futex_wake(word: &AtomicU32) {
    // SAFETY: as above; waking has no memory effects beyond the syscall.
    unsafe {
        libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE, i32::MAX, std::ptr::null::<u8>(), 0, 0);
    }
}

/// poll(2) on `fds` for at most `timeout`. An interrupted or failed call returns early with no
/// events, which every caller's loop treats as nothing ready yet.
pub(crate) fn poll(fds: &mut [libc::pollfd], timeout: Duration) {
    let ts =
        libc::timespec { tv_sec: timeout.as_secs() as libc::time_t, tv_nsec: timeout.subsec_nanos() as libc::c_long };
    // SAFETY: `fds` is a valid array of pollfd; no signal mask change.
    unsafe { libc::ppoll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, &ts, std::ptr::null()) };
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn wakes_a_sleeper_and_times_out() {
        let word = Arc::new(AtomicU32::new(0));
        let sleepers = Arc::new(AtomicU32::new(0));
        let (w2, s2) = (word.clone(), sleepers.clone());
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            w2.store(1, Ordering::SeqCst);
            wake(&w2, &s2);
        });
        let start = Instant::now();
        wait_until(
            || word.load(Ordering::Acquire) == 1,
            &word,
            &sleepers,
            &mut |_| Ok(()),
            &Deadline::after(Duration::from_secs(5)),
            Patience::Eager,
            &|| "test".into(),
            None,
        )
        .unwrap();
        assert!(start.elapsed() < Duration::from_secs(1));
        t.join().unwrap();
        let e = wait_until(
            || false,
            &word,
            &sleepers,
            &mut |_| Ok(()),
            &Deadline::after(Duration::from_millis(100)),
            Patience::Drive,
            &|| "never".into(),
            None,
        )
        .unwrap_err();
        assert_eq!(e.kind(), crate::ErrorKind::Timeout);
        assert!(e.to_string().contains("never"));
    }

    /// The peer acknowledges the last slot and closes its end between this side's look at the
    /// slot and its look at the peer's state (the check): the wait succeeds, in every patience.
    /// Without the re-look, a 3-rank job's last send failed with "destroyed its communicator".
    #[test]
    fn a_peer_that_finished_then_closed_is_not_an_error() {
        for patience in [Patience::Eager, Patience::Share, Patience::Drive] {
            let word = AtomicU32::new(0);
            let done = std::cell::Cell::new(false);
            wait_until(
                || done.get(),
                &word,
                &word,
                &mut |_| {
                    done.set(true);
                    Err(Error::remote(1, "closed"))
                },
                &Deadline::after(Duration::from_secs(5)),
                patience,
                &|| "the last slot".into(),
                None,
            )
            .unwrap_or_else(|e| panic!("{patience:?}: {e}"));
            // A check that fails while the condition stays false still ends the wait.
            let e = wait_until(
                || false,
                &word,
                &word,
                &mut |_| Err(Error::remote(1, "closed")),
                &Deadline::after(Duration::from_secs(5)),
                patience,
                &|| "never".into(),
                None,
            )
            .unwrap_err();
            assert_eq!(e.kind(), crate::ErrorKind::RemoteError, "{patience:?}");
        }
    }

    /// A driver whose I/O completes on the 100th progress call; blocks are counted.
    struct Fake {
        calls: std::cell::Cell<u32>,
        blocks: std::cell::Cell<u32>,
    }

    impl Drive for Fake {
        fn progress(&self) -> bool {
            self.calls.set(self.calls.get() + 1);
            self.calls.get() == 100
        }
        fn block(&self, _: Duration) {
            self.blocks.set(self.blocks.get() + 1);
        }
        fn busy(&self) -> bool {
            false
        }
        fn flush_writes(&self, _: &AtomicBool, _: &Deadline) -> Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_driven_wait_progresses_then_blocks_when_idle() {
        let f = Fake { calls: 0.into(), blocks: 0.into() };
        let word = AtomicU32::new(0);
        wait_until(
            driven(Some(&f), || f.calls.get() >= 100),
            &word,
            &word,
            &mut |_| Ok(()),
            &Deadline::after(Duration::from_secs(5)),
            Patience::Drive,
            &|| "driven".into(),
            None,
        )
        .unwrap();
        assert!(f.calls.get() >= 100);
        assert_eq!(f.blocks.get(), 99 / DRIVE_SPINS, "blocks only after {DRIVE_SPINS} idle calls");
    }
}
