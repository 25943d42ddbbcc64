//! The events that show the host when each copy-engine call started and ended: a pair per call
//! that is not captured, recorded on the caller's stream at the fork and after the joins
//! (`streams.rs`), and looked at by the watcher (`watch.rs`), which feeds what it sees to the
//! stall decision (`cuda/stall.rs`). Pairs are made as needed and reused once their call is
//! seen to end; nothing here blocks.

use crate::cuda::kernels::cudarc::driver::{CudaContext, CudaStream};
use crate::cuda::kernels::staging::Mark;
use crate::cuda::kernels::Result;
use crate::cuda::stall::{CeCall, Stalls};
use crate::cuda::watch::{Calls, Look};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

/// The most calls watched at once; a call enqueued beyond them runs unwatched (logged once).
const MAX_WATCHED: usize = 256;

/// A call's start and end events.
struct Pair {
    start: Mark,
    end: Mark,
}

struct Inner {
    pairs: Vec<Pair>,
    free: Vec<usize>,
    stalls: Stalls,
    /// Calls watched so far: the next call's `CeCall::n`.
    next: u64,
    warned: bool,
}

/// One communicator's watched copy-engine calls.
pub(crate) struct CeCalls {
    ctx: Arc<CudaContext>,
    inner: Mutex<Inner>,
}

/// A pair taken for a call being enqueued: its start is recorded, its end not yet. Dropped
/// without [`Taken::end`] (the call failed to enqueue), it goes back unwatched.
pub(super) struct Taken<'a> {
    calls: &'a CeCalls,
    i: usize,
    ended: bool,
}

impl Taken<'_> {
    /// Records the call's end on `caller` and watches it from now on (as `func` moving `bytes`
    /// per rank).
    pub(super) fn end(mut self, caller: &CudaStream, func: &'static str, bytes: u64) -> Result<()> {
        let mut g = self.calls.lock();
        g.pairs[self.i].end.record(caller)?;
        let n = g.next;
        g.next += 1;
        g.stalls.enqueued(CeCall { n, func, bytes }, self.i);
        self.ended = true;
        Ok(())
    }
}

impl Drop for Taken<'_> {
    fn drop(&mut self) {
        if !self.ended {
            self.calls.lock().free.push(self.i);
        }
    }
}

impl CeCalls {
    pub(crate) fn new(ctx: &Arc<CudaContext>, timeout: Duration) -> CeCalls {
        let inner = Inner { pairs: Vec::new(), free: Vec::new(), stalls: Stalls::new(timeout), next: 0, warned: false };
        CeCalls { ctx: ctx.clone(), inner: Mutex::new(inner) }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records a call's start on `caller`: `None` when every pair is in flight.
    pub(super) fn start(&self, caller: &CudaStream) -> Result<Option<Taken<'_>>> {
        let mut g = self.lock();
        let i = match g.free.pop() {
            Some(i) => i,
            None if g.pairs.len() < MAX_WATCHED => {
                g.pairs.push(Pair { start: Mark::new(&self.ctx)?, end: Mark::new(&self.ctx)? });
                g.pairs.len() - 1
            }
            None => {
                if !std::mem::replace(&mut g.warned, true) {
                    tracing::warn!(
                        "occl: {MAX_WATCHED} copy-engine calls in flight: later ones run without a timeout until \
                         some end"
                    );
                }
                return Ok(None);
            }
        };
        if let Err(e) = g.pairs[i].start.record(caller) {
            g.free.push(i);
            return Err(e);
        }
        Ok(Some(Taken { calls: self, i, ended: false }))
    }
}

impl Calls for CeCalls {
    fn any(&self) -> bool {
        self.lock().stalls.any()
    }

    /// Looks at every watched call's events. An event that cannot be queried (the context
    /// failed) counts as complete: the call is no longer watched.
    fn look(&self, now: u64) -> Look {
        let mut g = self.lock();
        let Inner { pairs, free, stalls, .. } = &mut *g;
        let done = |m: &Mark| {
            m.done().unwrap_or_else(|e| {
                tracing::debug!("occl: a copy-engine call's event: {e}; it is no longer watched");
                true
            })
        };
        for (n, tag, started) in stalls.pending() {
            if done(&pairs[tag].end) {
                stalls.ended(n);
                free.push(tag);
            } else if !started && done(&pairs[tag].start) {
                stalls.started(n, now);
            }
        }
        Look { live: stalls.any(), stall: stalls.poll(now) }
    }
}
