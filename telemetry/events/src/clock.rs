//! One clock for every exporter: nanoseconds since the Unix epoch, read from the monotonic clock
//! against an anchor taken once per process, so spans never run backwards when NTP steps the
//! wall clock and all communicators of a process share one time base.
//!
//! Every start, state and stop reads it, so its cost is per event: `Instant::elapsed` is ~20 ns
//! (the vDSO's fenced TSC read, then a timespec subtraction), a bare TSC read ~8 ns. Where the
//! kernel itself keeps time with the TSC (clocksource `tsc`: it checked that every core's counter
//! is invariant and synchronised), the clock is the TSC scaled to the monotonic clock (see
//! `tsc`); elsewhere, or with `OCCL_TELEMETRY_CLOCK=monotonic`, it is `Instant::elapsed`.

use std::sync::OnceLock;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

struct Anchor {
    unix_ns: u64,
    at: Instant,
    #[cfg(target_arch = "x86_64")]
    tsc: Option<tsc::Tsc>,
}

static ANCHOR: OnceLock<Anchor> = OnceLock::new();

thread_local! {
    /// This thread's last TSC-based reading.
    static LAST: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// The wall clock against the monotonic one: the wall read between two monotonic reads, of three
/// such pairs the narrowest, placed at its midpoint. Taking the wall clock after a single
/// monotonic read would put every later time ahead of the wall clock by however long that read
/// took: the first of a process takes several times longer than later ones (150-380 ns against
/// 50 here), and a preemption milliseconds. An application's span, timed by the wall clock, would
/// then end before the operation inside it.
fn wall_at() -> (Instant, u64) {
    let pair = || {
        let a = Instant::now();
        let wall = SystemTime::now();
        let width = a.elapsed();
        (width, a + width / 2, wall)
    };
    let (_, at, wall) = (0..2).map(|_| pair()).fold(pair(), |best, p| if p.0 < best.0 { p } else { best });
    (at, wall.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64))
}

fn anchor() -> &'static Anchor {
    ANCHOR.get_or_init(|| {
        let (at, unix_ns) = wall_at();
        Anchor {
            unix_ns,
            at,
            #[cfg(target_arch = "x86_64")]
            tsc: tsc::usable().then(|| tsc::Tsc::new(at)),
        }
    })
}

/// Now, in nanoseconds since the Unix epoch.
#[inline]
pub fn unix_nanos() -> u64 {
    let a = anchor();
    #[cfg(target_arch = "x86_64")]
    if let Some(t) = &a.tsc {
        // A reading can step back by the calibration error when another thread re-anchors or
        // the thread moves to a core whose TSC lags; a thread's own readings must never run
        // backwards (a training step begun before a collective must contain it), so clamp to
        // this thread's last one.
        let now = a.unix_ns + t.since(a.at);
        return LAST.with(|l| {
            let v = now.max(l.get());
            l.set(v);
            v
        });
    }
    a.unix_ns + a.at.elapsed().as_nanos() as u64
}

/// The time since a moment, for short intervals on one thread (a wait that blocked): the start
/// reads the clock's rate once, the end reads only the counter, so what runs after the interval
/// ends pays a few instructions rather than a full reading. Its ns are the span clock's (the TSC
/// scaled by its measured rate, or `Instant` where [`unix_nanos`] uses it), without the
/// calibration's re-anchoring, which does not matter over microseconds.
#[derive(Clone, Copy, Debug)]
pub struct Stopwatch {
    start: u64,
    /// ns per TSC cycle × 2^32; 0: `start` is ns since the anchor's `Instant`.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    rate: u64,
}

impl Stopwatch {
    #[inline]
    pub fn start() -> Stopwatch {
        let a = anchor();
        #[cfg(target_arch = "x86_64")]
        if let Some(rate) = a.tsc.as_ref().and_then(tsc::Tsc::rate) {
            return Stopwatch { start: tsc::rdtsc(), rate };
        }
        Stopwatch { start: a.at.elapsed().as_nanos() as u64, rate: 0 }
    }

    /// ns since [`Stopwatch::start`] (0 if the counter reads behind it: another core's lag).
    #[inline]
    pub fn elapsed_ns(&self) -> u64 {
        #[cfg(target_arch = "x86_64")]
        if self.rate != 0 {
            return tsc::scaled(tsc::rdtsc().saturating_sub(self.start), self.rate);
        }
        (anchor().at.elapsed().as_nanos() as u64).saturating_sub(self.start)
    }
}

#[cfg(target_arch = "x86_64")]
mod tsc {
    //! The TSC as a monotonic clock. Its rate is measured against `Instant` over an ever longer
    //! baseline (the first sample of a pair taken at least [`MIN_BASELINE_NS`] ago), and the
    //! reading is re-anchored to `Instant` every [`REANCHOR`] cycles (some 10 ms), so it follows
    //! the monotonic clock (NTP slews it) within the rate's error over that interval: under a
    //! microsecond at first, nanoseconds once the baseline is seconds long. A re-anchor never
    //! moves the reading back. Until the baseline is long enough, and on a core whose counter
    //! reads behind the anchor, the reading is `Instant::elapsed` itself.
    //!
    //! The parameters (anchor cycles, anchor ns, rate) change together under a sequence counter:
    //! a reader retries or falls back to `Instant` if a writer is at work.

    use std::sync::atomic::{fence, AtomicU64, Ordering::*};
    use std::time::Instant;

    /// Cycles after an anchor at which a reader re-anchors (2^25: 8–17 ms at 2–4 GHz).
    const REANCHOR: u64 = 1 << 25;
    /// The baseline a rate is first measured over: a sample's error (tens of cycles) over 2 ms
    /// puts the first rate within ~2e-5, some 200 ns over one re-anchor interval.
    const MIN_BASELINE_NS: u64 = 2_000_000;
    /// A sample whose two TSC reads are further apart (preempted between them) is discarded.
    const MAX_SAMPLE_CYCLES: u64 = 20_000;

    #[inline]
    pub(super) fn rdtsc() -> u64 {
        // SAFETY: RDTSC exists on every x86_64 CPU and only reads the time-stamp counter.
        #[allow(unsafe_code)]
        unsafe {
            core::arch::x86_64::_rdtsc()
        }
    }

    /// Whether the kernel keeps time with the TSC (so it is invariant and synchronised across
    /// cores), and nobody asked for the plain clock.
    pub(super) fn usable() -> bool {
        if std::env::var("OCCL_TELEMETRY_CLOCK").is_ok_and(|v| v == "monotonic") {
            return false;
        }
        crate::files::read_to_string_capped(
            std::path::Path::new("/sys/devices/system/clocksource/clocksource0/current_clocksource"),
            crate::files::MAX_SYSTEM_FILE,
        )
        .is_ok_and(|s| s.trim() == "tsc")
    }

    pub(super) struct Tsc {
        /// Even: the parameters are consistent; odd: a writer is changing them.
        seq: AtomicU64,
        base_tsc: AtomicU64,
        /// ns since the anchor's `Instant` at `base_tsc`.
        base_ns: AtomicU64,
        /// ns per cycle × 2^32; 0 until measured.
        rate: AtomicU64,
        /// The first sample (cycles, ns since the anchor): one end of every rate measurement.
        first: (u64, u64),
    }

    /// (cycles, ns since `at`) read together, or `None` if preempted in between.
    fn sample(at: Instant) -> Option<(u64, u64)> {
        let t0 = rdtsc();
        let ns = at.elapsed().as_nanos() as u64;
        let t1 = rdtsc();
        let d = t1.wrapping_sub(t0);
        (d < MAX_SAMPLE_CYCLES).then_some((t0 + d / 2, ns))
    }

    #[inline]
    pub(super) fn scaled(cycles: u64, rate: u64) -> u64 {
        ((u128::from(cycles) * u128::from(rate)) >> 32) as u64
    }

    impl Tsc {
        pub(super) fn new(at: Instant) -> Tsc {
            let first = (0..8).find_map(|_| sample(at)).unwrap_or((rdtsc(), at.elapsed().as_nanos() as u64));
            Tsc {
                seq: AtomicU64::new(0),
                base_tsc: AtomicU64::new(first.0),
                base_ns: AtomicU64::new(first.1),
                rate: AtomicU64::new(0),
                first,
            }
        }

        /// (sequence, anchor cycles, anchor ns, rate), consistent; `None` while a writer stays
        /// at work (preempted mid-update).
        #[inline]
        fn params(&self) -> Option<(u64, u64, u64, u64)> {
            for _ in 0..64 {
                let s = self.seq.load(Acquire);
                let p = (self.base_tsc.load(Relaxed), self.base_ns.load(Relaxed), self.rate.load(Relaxed));
                fence(Acquire);
                if s & 1 == 0 && self.seq.load(Relaxed) == s {
                    return Some((s, p.0, p.1, p.2));
                }
                std::hint::spin_loop();
            }
            None
        }

        /// ns per cycle × 2^32, once measured (a consistent read).
        #[inline]
        pub(super) fn rate(&self) -> Option<u64> {
            self.params().map(|p| p.3).filter(|&r| r != 0)
        }

        /// ns since `at` (the anchor this was made with).
        #[inline]
        pub(super) fn since(&self, at: Instant) -> u64 {
            if let Some((_, bt, bn, rate)) = self.params() {
                let d = rdtsc().wrapping_sub(bt);
                if rate != 0 && d < REANCHOR {
                    return bn + scaled(d, rate);
                }
            }
            self.slow(at)
        }

        /// Re-anchors (or measures the rate first) when due and no other thread is at it;
        /// returns the exact reading, or more if readers with the current parameters are ahead.
        #[cold]
        fn slow(&self, at: Instant) -> u64 {
            let exact = || at.elapsed().as_nanos() as u64;
            if self.rate.load(Relaxed) == 0 {
                // Until the first baseline is long enough the reading is `Instant` itself: one read,
                // not a sample's three (a short-lived process spends its whole life here).
                let ns = exact();
                if ns.saturating_sub(self.first.1) < MIN_BASELINE_NS {
                    return ns;
                }
            }
            let (Some((t, ns)), Some((s, bt, bn, rate))) = (sample(at), self.params()) else { return exact() };
            if t < bt {
                // This core's counter reads behind the anchor (by a few cycles): no bound to keep.
                return ns;
            }
            let reading = if rate == 0 { ns } else { ns.max(bn + scaled(t - bt, rate)) };
            let (span_t, span_ns) = (t.wrapping_sub(self.first.0), ns.saturating_sub(self.first.1));
            if t < self.first.0 || span_ns < MIN_BASELINE_NS || span_t == 0 {
                return reading;
            }
            let measured = ((u128::from(span_ns) << 32) / u128::from(span_t)).min(u128::from(u64::MAX >> 1)) as u64;
            // Ahead of the monotonic clock: run slower until the next re-anchor to meet it again.
            let ahead = ((u128::from(reading - ns) << 32) / u128::from(REANCHOR)).min(u128::from(measured / 2)) as u64;
            if self.seq.compare_exchange(s, s + 1, Acquire, Relaxed).is_err() {
                return reading;
            }
            fence(Release);
            self.base_tsc.store(t, Relaxed);
            self.base_ns.store(reading, Relaxed);
            self.rate.store((measured - ahead).max(1), Relaxed);
            self.seq.store(s + 2, Release);
            reading
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_stopwatch_measures_what_the_span_clock_does() {
        // Past the rate's first baseline, so both read the TSC where the kernel uses it.
        let _ = unix_nanos();
        std::thread::sleep(Duration::from_millis(5));
        let _ = unix_nanos();
        // The span clock's readings bracket the stopwatch's, so a preemption between two reads
        // widens the bracket instead of failing the test.
        let outer0 = unix_nanos();
        let w = Stopwatch::start();
        let inner0 = unix_nanos();
        std::thread::sleep(Duration::from_millis(20));
        let inner1 = unix_nanos();
        let ns = w.elapsed_ns();
        let outer1 = unix_nanos();
        let (lo, hi) = (inner1 - inner0, outer1 - outer0);
        assert!(ns >= 20_000_000, "{ns} ns");
        // The stopwatch scales by the rate alone, the span clock also by its re-anchoring.
        assert!(ns + lo / 50 >= lo && ns <= hi + hi / 50, "stopwatch {ns} ns, span clock {lo}..{hi} ns");
    }

    #[test]
    fn monotonic_and_near_the_wall_clock() {
        let a = unix_nanos();
        let b = unix_nanos();
        assert!(b >= a);
        let wall = SystemTime::now().duration_since(UNIX_EPOCH).expect("after 1970").as_nanos() as u64;
        assert!(wall.abs_diff(b) < 1_000_000_000, "wall {wall} vs span clock {b}");
    }

    /// Over a few re-anchors, on several threads: never backwards on a thread, and within a few
    /// microseconds of `Instant` (the TSC clock where it is in use, else `Instant` itself).
    #[test]
    fn follows_the_monotonic_clock_on_every_thread() {
        let a = anchor();
        #[cfg(target_arch = "x86_64")]
        if a.tsc.is_none() {
            eprintln!("clock test: the TSC clock is not in use here (clocksource is not tsc); checking Instant");
        }
        let threads: Vec<_> = (0..3)
            .map(|_| {
                std::thread::spawn(|| {
                    let end = Instant::now() + Duration::from_millis(150);
                    let (mut last, mut reads, mut worst) = (0u64, 0u64, 0u64);
                    while Instant::now() < end {
                        let a = anchor();
                        let before = a.at.elapsed().as_nanos() as u64;
                        let t = unix_nanos() - a.unix_ns;
                        let after = a.at.elapsed().as_nanos() as u64;
                        assert!(t >= last, "went back from {last} to {t}");
                        last = t;
                        // Outside [before, after] by how much.
                        worst = worst.max(before.saturating_sub(t)).max(t.saturating_sub(after));
                        reads += 1;
                        if reads % 1024 == 0 {
                            std::thread::sleep(Duration::from_micros(300));
                        }
                    }
                    (reads, worst)
                })
            })
            .collect();
        for h in threads {
            let (reads, worst) = h.join().expect("reader thread");
            assert!(reads > 1000, "{reads} reads");
            assert!(worst < 20_000, "the span clock strayed {worst} ns from the monotonic clock");
        }
    }
}
