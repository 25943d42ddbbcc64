//! Helper threads for a rank's large registered collectives.
//!
//! With registered windows, a rank's share of an all-reduce, all-gather or reduce-scatter is
//! plain loads and stores on memory that every rank maps, so it splits into parts that need no
//! ordering between them. At 64 MiB and 2 ranks, both the registered path and the FIFO ring
//! move the least bytes any algorithm can through memory, and one core's memory parallelism
//! sets the pace of both: on one thread per rank the registered path measured 1.00-1.81× the
//! ring, with the host (bench/baselines/registered-vs-mpi.md). Spare cores of the rank's share
//! take parts; the ring cannot split that way, as each FIFO is one ordered stream.
//!
//! How many: `OCCL_REG_THREADS` when set; otherwise the rank's share of the host's cores (from
//! the peer table, every rank's affinity set) less one, at most the CPUs this rank's thread may
//! run on less one (`taskset` or a bind after init), and at most `AUTO_MAX`. Started at the first
//! operation that splits, and kept until the communicator goes.

use crate::error::{Error, Result};
use std::sync::mpsc;
use std::thread::JoinHandle;

/// A part of an operation, run on a helper thread: it owns what it needs (addresses, counts).
pub(crate) type Part = Box<dyn FnOnce() + Send>;

/// Helpers a rank starts by itself. At 2 ranks of 8 CPUs each on a 16-CPU Xeon host, the
/// registered all-reduce at 64 MiB ran faster with every helper added up to 7 (1.09×, 2.10×,
/// 2.27×, 2.32×, 2.80×, 3.19× the unregistered ring at 0, 1, 2, 3, 5 and 7), and the
/// all-gather gained most at 5 and 7 (7.11×, 5.82×; bench/baselines/registered-vs-mpi.md).
/// More was not measured; past some count the memory bus sets the pace, not the threads.
pub(crate) const AUTO_MAX: usize = 7;

/// The most helpers `OCCL_REG_THREADS` may ask for (the configuration checks it).
pub(crate) const MAX: usize = crate::config::MAX_REG_THREADS;

/// The least bytes of a part: below it, waking a helper (a futex round trip) costs more than
/// the copy it takes over.
pub(crate) const PART_MIN: usize = 1 << 20;

/// How many helpers a rank wants: `config` (`OCCL_REG_THREADS`) if set; otherwise its share of
/// the host's cores (`cores` among `local` ranks) and the CPUs its thread may run on (`mine`),
/// each less the rank's own thread, at most `AUTO_MAX`.
pub(crate) fn wanted(config: Option<usize>, local: usize, cores: usize, mine: usize) -> usize {
    match config {
        Some(n) => n.min(MAX),
        None => (cores / local.max(1)).min(mine).saturating_sub(1).min(AUTO_MAX),
    }
}

/// A rank's helper threads.
pub(crate) struct Threads {
    workers: Vec<Worker>,
}

struct Worker {
    jobs: Option<mpsc::Sender<Part>>,
    thread: Option<JoinHandle<()>>,
}

impl Threads {
    /// Starts `count` helpers for rank `rank`; those that cannot be started are left out (with
    /// a warning): the rank then runs their parts itself.
    pub(crate) fn start(count: usize, rank: usize) -> Threads {
        let mut workers = Vec::with_capacity(count);
        for i in 0..count {
            let (tx, rx) = mpsc::channel::<Part>();
            let spawned = std::thread::Builder::new().name(format!("occl-reg-r{rank}-{i}")).spawn(move || {
                while let Ok(part) = rx.recv() {
                    // A part that panics drops its "ended" sender unsent, which `run` reports;
                    // the helper stays for the next operation.
                    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(part));
                }
            });
            match spawned {
                Ok(t) => workers.push(Worker { jobs: Some(tx), thread: Some(t) }),
                Err(e) => {
                    tracing::warn!("occl: rank {rank}: could not start a registered-collective helper thread: {e}");
                    break;
                }
            }
        }
        tracing::info!("occl: rank {rank}: {} helper threads for large registered collectives", workers.len());
        Threads { workers }
    }

    /// How many helpers run.
    pub(crate) fn len(&self) -> usize {
        self.workers.len()
    }

    /// Runs part i on helper i (on this thread where there is no helper i) while this thread
    /// runs `mine`, and returns once every part has ended, or failed: a part touches buffers
    /// the caller vouches for only during the call, so none may outlive it.
    pub(crate) fn run(&self, parts: Vec<Part>, mine: impl FnOnce()) -> Result<()> {
        let (done, ended) = mpsc::channel::<()>();
        let mut sent = 0;
        let mut inline = Vec::new();
        let mut workers = self.workers.iter();
        for part in parts {
            let tx = done.clone();
            let job: Part = Box::new(move || {
                part();
                let _ = tx.send(());
            });
            match workers.next().and_then(|w| w.jobs.as_ref()) {
                Some(jobs) => match jobs.send(job) {
                    Ok(()) => sent += 1,
                    // The helper is gone: this thread runs the part.
                    Err(mpsc::SendError(job)) => inline.push(job),
                },
                None => inline.push(job),
            }
        }
        drop(done);
        let expected = sent + inline.len();
        // Should this thread's own work panic, the helpers' parts must still end before the
        // panic leaves the call (the caller may then free the buffers they write).
        let own = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            mine();
            for job in inline {
                job();
            }
        }));
        // Every part sends a word when it ends. One that panicked (or was dropped unrun) drops
        // its sender without a word, and once no part is left running the channel closes and
        // `recv` fails: either way no part runs past this loop.
        let mut words = 0;
        while words < expected && ended.recv().is_ok() {
            words += 1;
        }
        if let Err(p) = own {
            std::panic::resume_unwind(p);
        }
        if words < expected {
            return Err(Error::internal(
                "a helper thread of a registered collective failed (its panic is in the log); the output is not \
                 complete",
            ));
        }
        Ok(())
    }
}

impl Drop for Threads {
    fn drop(&mut self) {
        for w in &mut self.workers {
            w.jobs = None; // closes the channel: the helper's loop ends
        }
        for w in &mut self.workers {
            if let Some(t) = w.thread.take() {
                let _ = t.join();
            }
        }
    }
}

/// Splits `[lo, hi)` into at most `ways` parts of at least `PART_MIN` bytes, cut at multiples
/// of 4 KiB from `lo` (whole elements of every type, whole lines for streaming stores).
pub(crate) fn split(lo: usize, hi: usize, ways: usize) -> Vec<(usize, usize)> {
    let len = hi.saturating_sub(lo);
    let k = ways.min(len / PART_MIN).max(1);
    let cut = |i: usize| if i == k { hi } else { lo + (len / k * i) / 4096 * 4096 };
    (0..k).map(|i| (cut(i), cut(i + 1))).filter(|(a, b)| a < b).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    /// A part that takes 50 ms and then sets `done` to 1.
    fn slow_part(done: &Arc<AtomicUsize>) -> Part {
        let d = done.clone();
        Box::new(move || {
            std::thread::sleep(std::time::Duration::from_millis(50));
            d.store(1, Ordering::SeqCst);
        })
    }

    #[test]
    fn split_covers_the_range_in_aligned_parts_of_at_least_the_minimum() {
        assert_eq!(split(0, 100, 4), vec![(0, 100)], "too small to split");
        assert_eq!(split(8, 8, 4), vec![], "nothing to do");
        let (lo, hi) = (24, 24 + 10 * PART_MIN + 12);
        for ways in [1, 2, 3, 4, 7, 64] {
            let p = split(lo, hi, ways);
            assert_eq!(p.len(), ways.min(10));
            assert_eq!((p[0].0, p[p.len() - 1].1), (lo, hi));
            for w in p.windows(2) {
                assert_eq!(w[0].1, w[1].0, "contiguous");
                assert_eq!((w[0].1 - lo) % 4096, 0, "cut at 4 KiB from lo");
            }
            assert!(p.iter().all(|(a, b)| b - a >= PART_MIN - 4096));
        }
    }

    #[test]
    fn wanted_follows_the_share_the_affinity_and_the_override() {
        assert_eq!(wanted(None, 2, 16, 16), 7, "8 cores each");
        assert_eq!(wanted(None, 1, 64, 64), AUTO_MAX, "capped");
        assert_eq!(wanted(None, 4, 8, 8), 1, "2 cores each");
        assert_eq!(wanted(None, 2, 2, 2), 0, "a core each: none");
        assert_eq!(wanted(None, 4, 2, 2), 0, "oversubscribed: none");
        assert_eq!(wanted(None, 2, 16, 1), 0, "bound to one CPU after init");
        assert_eq!(wanted(Some(2), 2, 2, 1), 2, "the override is taken as it is");
        assert_eq!(wanted(Some(99), 1, 1, 1), MAX);
    }

    #[test]
    fn every_part_runs_once_before_run_returns_with_or_without_helpers() {
        for helpers in [0, 1, 3] {
            let t = Threads::start(helpers, 0);
            assert_eq!(t.len(), helpers);
            let sum = Arc::new(AtomicUsize::new(0));
            let parts: Vec<Part> = (1..=5)
                .map(|i| {
                    let s = sum.clone();
                    Box::new(move || {
                        std::thread::sleep(std::time::Duration::from_millis(5));
                        s.fetch_add(i, Ordering::SeqCst);
                    }) as Part
                })
                .collect();
            let s = sum.clone();
            t.run(parts, move || {
                s.fetch_add(100, Ordering::SeqCst);
            })
            .expect("no part fails");
            assert_eq!(sum.load(Ordering::SeqCst), 115, "{helpers} helpers");
        }
    }

    #[test]
    fn a_panic_in_the_callers_own_part_leaves_only_after_the_helpers_parts_end() {
        let t = Threads::start(1, 0);
        let slow = Arc::new(AtomicUsize::new(0));
        let parts: Vec<Part> = vec![slow_part(&slow)];
        let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            // Without the panic hook, whose backtrace could outlast the helper's part.
            let _ = t.run(parts, || std::panic::resume_unwind(Box::new("the caller's part fails")));
        }));
        assert!(caught.is_err(), "the caller's panic goes on");
        assert_eq!(slow.load(Ordering::SeqCst), 1, "but only after the helper's part ended");
    }

    #[test]
    fn a_part_that_panics_is_an_error_after_the_others_end_and_the_next_operation_runs() {
        let t = Threads::start(2, 0);
        let slow = Arc::new(AtomicUsize::new(0));
        let parts: Vec<Part> = vec![Box::new(|| panic!("a part fails (expected in this test)")), slow_part(&slow)];
        let e = t.run(parts, || {}).expect_err("the panic is reported");
        assert!(e.to_string().contains("helper thread"), "{e}");
        assert_eq!(slow.load(Ordering::SeqCst), 1, "run returned only after the slow part ended");
        // Both helpers are still there for the next operation.
        let ran = Arc::new(AtomicUsize::new(0));
        let parts: Vec<Part> = (0..2)
            .map(|_| {
                let r = ran.clone();
                Box::new(move || {
                    r.fetch_add(1, Ordering::SeqCst);
                }) as Part
            })
            .collect();
        t.run(parts, || {}).expect("the survivors and the caller run it");
        assert_eq!(ran.load(Ordering::SeqCst), 2);
    }
}
