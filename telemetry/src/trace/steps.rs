//! Training-step marks: `ProfilerStep#N` rows, as PyTorch's profiler writes them for each
//! `prof.step()`. HTA cuts a trace into iterations by these rows (and with two or more it keeps
//! only the collectives whose call lies before the last step's start).
//!
//! Steps are per process, like PyTorch's profiler: one open step at a time, shared by every rank
//! file the process writes. They are recorded only while a trace exporter exists.

use super::threads;
use crate::spans::unix_nanos;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Mutex, PoisonError};

/// Finished steps kept; later ones are counted in the file metadata.
const MAX_STEPS: usize = 1 << 16;

/// One finished step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Step {
    pub n: u64,
    pub start_ns: u64,
    pub end_ns: u64,
    /// The thread that began it.
    pub tid: u32,
}

struct Steps {
    open: Option<(u64, u64, u32)>,
    done: Vec<Step>,
    dropped: u64,
}

static STEPS: Mutex<Steps> = Mutex::new(Steps { open: None, done: Vec::new(), dropped: 0 });
/// Whether any trace exporter was created (steps are free otherwise).
pub(crate) static RECORDING: AtomicBool = AtomicBool::new(false);

fn with<R>(f: impl FnOnce(&mut Steps) -> R) -> R {
    f(&mut STEPS.lock().unwrap_or_else(PoisonError::into_inner))
}

fn close(s: &mut Steps, end_ns: u64) {
    if let Some((n, start_ns, tid)) = s.open.take() {
        if s.done.len() < MAX_STEPS {
            s.done.push(Step { n, start_ns, end_ns: end_ns.max(start_ns), tid });
        } else {
            s.dropped += 1;
        }
    }
}

/// Ends the open step, if any, and begins step `n` (PyTorch's `prof.step()` with its number).
pub fn step_begin(n: u64) {
    if !RECORDING.load(Relaxed) {
        return;
    }
    let now = unix_nanos();
    let tid = threads::current();
    with(|s| {
        close(s, now);
        s.open = Some((n, now, tid));
    });
}

/// Ends the open step, if any.
pub fn step_end() {
    if !RECORDING.load(Relaxed) {
        return;
    }
    let now = unix_nanos();
    with(|s| close(s, now));
}

/// Marks step `n` until the guard is dropped.
///
/// ```
/// for n in 1..=3u64 {
///     let _step = occl_telemetry::trace::profiler_step(n);
///     // forward, backward, the collectives of the step …
/// }
/// ```
#[must_use = "the step ends when the guard is dropped"]
pub fn profiler_step(n: u64) -> ProfilerStep {
    step_begin(n);
    ProfilerStep { n }
}

/// The guard of [`profiler_step`].
#[derive(Debug)]
pub struct ProfilerStep {
    n: u64,
}

impl ProfilerStep {
    pub fn number(&self) -> u64 {
        self.n
    }
}

impl Drop for ProfilerStep {
    fn drop(&mut self) {
        // Only our own step: a later step_begin already closed this one.
        if !RECORDING.load(Relaxed) {
            return;
        }
        let now = unix_nanos();
        with(|s| {
            if s.open.is_some_and(|(n, ..)| n == self.n) {
                close(s, now);
            }
        });
    }
}

/// Finished steps and how many were dropped.
pub(crate) fn finished() -> (Vec<Step>, u64) {
    with(|s| (s.done.clone(), s.dropped))
}
