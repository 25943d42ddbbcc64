//! Bounded waiting on a word of memory shared with a peer (another process through shared
//! memory, or the local proxy thread).
//!
//! The waiter spins briefly (the fast path: a peer that is a few hundred nanoseconds behind),
//! then yields (ranks oversubscribing the cores must let each other run), then sleeps on a futex
//! of the watched word. The other side only makes the wake-up system call when its `sleepers`
//! counter says somebody sleeps, so a busy pipeline makes no system call per chunk. Sleeping is
//! in short slices so that liveness checks and the deadline still run.

use crate::error::{Error, Result};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

const SLEEP_SLICE: Duration = Duration::from_millis(20);

/// How long a waiter keeps the CPU before it sleeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Patience {
    /// The collective's own thread: its peer is usually a few hundred nanoseconds away, and
    /// every microsecond of wake-up latency is on the critical path.
    Eager,
    /// A proxy thread: it only moves data for the collective thread, so it must not take the
    /// CPU that thread needs; it sleeps almost at once and is woken when there is work.
    Lazy,
}

impl Patience {
    fn spins(self) -> u32 {
        match self {
            Patience::Eager => 4096,
            Patience::Lazy => 64,
        }
    }

    fn yield_for(self) -> Duration {
        match self {
            Patience::Eager => Duration::from_micros(500),
            Patience::Lazy => Duration::ZERO,
        }
    }
}

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

/// Why a wait stopped early: the check callback's verdict.
pub(crate) type Check<'a> = &'a mut dyn FnMut(bool) -> Result<()>;

/// Waits until `ready()` is true.
///
/// `word` is the futex word the other side changes when `ready()` may have become true, and
/// `sleepers` the counter it reads to decide whether to wake. `check(slow)` runs now and then
/// (with `slow = true` at most every ~100 ms, for checks that cost a system call) and fails the
/// wait when the peer is gone. `deadline` bounds the wait; `what` names it in the error.
pub(crate) fn wait_until(
    mut ready: impl FnMut() -> bool,
    word: &AtomicU32,
    sleepers: &AtomicU32,
    check: Check<'_>,
    deadline: &Deadline,
    patience: Patience,
    what: &dyn Fn() -> String,
) -> Result<()> {
    for i in 0..patience.spins() {
        if ready() {
            return Ok(());
        }
        if i % 1024 == 1023 {
            check(false)?;
        }
        std::hint::spin_loop();
    }
    let yield_start = Instant::now();
    let give_up = yield_start + deadline.timeout;
    while yield_start.elapsed() < patience.yield_for() {
        for _ in 0..8 {
            if ready() {
                return Ok(());
            }
            std::thread::yield_now();
        }
        check(false)?;
    }
    let mut last_slow = Instant::now();
    check(true)?;
    loop {
        let seen = word.load(Ordering::Acquire);
        sleepers.fetch_add(1, Ordering::SeqCst);
        // Re-check after announcing ourselves: the waker either sees the count or we see its
        // write (both sides use SeqCst for this pair).
        if ready() {
            sleepers.fetch_sub(1, Ordering::SeqCst);
            return Ok(());
        }
        futex_wait(word, seen, SLEEP_SLICE);
        sleepers.fetch_sub(1, Ordering::SeqCst);
        if ready() {
            return Ok(());
        }
        let now = Instant::now();
        let slow = now.duration_since(last_slow) >= Duration::from_millis(100);
        if slow {
            last_slow = now;
        }
        check(slow)?;
        if now >= give_up {
            return Err(Error::Timeout { what: what(), secs: deadline.timeout.as_secs_f64() });
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

fn futex_wait(word: &AtomicU32, expected: u32, timeout: Duration) {
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
            Patience::Lazy,
            &|| "never".into(),
        )
        .unwrap_err();
        assert_eq!(e.kind(), crate::ErrorKind::Timeout);
        assert!(e.to_string().contains("never"));
    }
}
