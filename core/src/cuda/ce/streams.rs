//! The communicator's copy-engine streams and how a call runs on them: the caller's stream
//! records an event that every lane's stream waits for, each lane's steps go on its stream,
//! and the caller's stream waits for an event recorded on each of them. Under capture the event
//! brings the lanes' streams into the caller's graph and the joins return them to it, as a
//! graph requires. A call that is not captured forks from its pair's start and records its
//! pair's end after the joins (`pairs.rs`), which the watcher (`calls.rs`) and, when a sink
//! wants them, the CeColl events (`spans.rs`) read. A batch step is one driver call
//! (`cuMemcpyBatchAsync`); a call is planned with batches only where the driver has it and the
//! stream is not captured (a capture refuses it), else per peer.

use super::calls::CeCalls;
use super::clock::DeviceClock;
use super::pairs::{Pair, Pairs};
use super::plan::{plan, Lane, Step};
use super::spans::{CeOp, CeSpans};
use super::{CeArea, CeSends, Flows};
use crate::cuda::kernels::coll::MAX_RANKS;
use crate::cuda::kernels::cudarc::driver::{CudaContext, CudaStream};
use crate::cuda::kernels::memops::{has_batch_copy, side_stream, StreamOps};
use crate::cuda::kernels::staging::Mark;
use crate::cuda::kernels::Result;
use crate::sync::lock;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The pairs, and the last call not captured, whose end the next one's lanes wait for.
struct Chain {
    pairs: Pairs,
    /// `None` when that call got no pair: its end is `CeStreams::done`.
    last: Option<Arc<Pair>>,
}

/// Streams of one communicator's context, made once: one per peer for the sends (this rank's
/// own: its local part), one for the receives and, when batched, one for every send at once,
/// with the events that fork and join them.
pub(crate) struct CeStreams {
    sends: Vec<Arc<CudaStream>>,
    recv: Arc<CudaStream>,
    batch: Option<Arc<CudaStream>>,
    /// How this rank issues its sends when it can batch them (`OCCL_CE_BATCH`).
    mode: CeSends,
    /// Whether the driver has the batched copy; without it every call goes per peer.
    one_call: bool,
    /// The fork of a call without a pair: captured, or every pair in flight.
    fork: Mark,
    join: Mark,
    /// The end of a call not captured that got no pair.
    done: Mark,
    chain: Mutex<Chain>,
    /// The calls the watcher times.
    calls: Arc<CeCalls>,
    /// The device times of calls a sink wants as CeColl events.
    spans: CeSpans,
}

impl CeStreams {
    /// `timeout`: how long a call may run once started (`OCCL_TIMEOUT`).
    pub(crate) fn new(ctx: &Arc<CudaContext>, nranks: usize, timeout: Duration, mode: CeSends) -> Result<CeStreams> {
        let batched = matches!(mode, CeSends::Batch { .. });
        let one_call = batched && has_batch_copy();
        if batched && !one_call {
            static WARNED: AtomicBool = AtomicBool::new(false);
            if !WARNED.swap(true, Ordering::Relaxed) {
                tracing::info!(
                    "occl: this CUDA driver has no cuMemcpyBatchAsync (CUDA 12.8 or later): copy-engine sends go \
                     on one stream per peer"
                );
            }
        }
        let clock = DeviceClock::of(ctx);
        Ok(CeStreams {
            sends: (0..nranks).map(|_| side_stream(ctx)).collect::<Result<_>>()?,
            recv: side_stream(ctx)?,
            batch: batched.then(|| side_stream(ctx)).transpose()?,
            mode,
            one_call,
            fork: Mark::new(ctx)?,
            join: Mark::new(ctx)?,
            done: Mark::new(ctx)?,
            chain: Mutex::new(Chain { pairs: Pairs::new(ctx), last: None }),
            calls: Arc::new(CeCalls::new(timeout, clock.clone())),
            spans: CeSpans::new(clock),
        })
    }

    /// The calls the watcher looks at.
    pub(crate) fn calls(&self) -> &Arc<CeCalls> {
        &self.calls
    }

    /// The timed calls, whose CeColl events the communicator collects.
    pub(crate) fn spans(&self) -> &CeSpans {
        &self.spans
    }

    /// A lane's stream; the batch lane falls back on the receives' stream when there is no
    /// batch stream (never, as plans with a batch lane come only from a batched `mode`).
    fn stream(&self, l: Lane) -> &CudaStream {
        match l {
            Lane::Send(p) => &self.sends[p],
            Lane::Recv => &self.recv,
            Lane::Batch => self.batch.as_deref().unwrap_or(&self.recv),
        }
    }

    /// Enqueues `f` for rank `me` whose peers' regions are mapped at `regions`: after the work
    /// on `caller` so far, and before its later work.
    ///
    /// A call follows the communicator's last one whatever stream each comes from: each lane's
    /// stream holds its steps in call order, which is all the flags need (`ce/mod.rs`), and a
    /// call that is not `capturing` also makes its lanes wait for the end of the last such call
    /// (an event recorded on that call's stream after its joins), so none of its steps starts
    /// before every step of that call is done. A graph is ordered by the stream it is launched
    /// on, as any captured work is (a capture cannot wait for work outside it). The
    /// communicator's calls are made one at a time (it is not used from two threads at once).
    /// A call that is not captured is watched as `func` (`calls.rs`) and, when `events` (its
    /// operations' CeColl events) is not empty, timed (`spans.rs`).
    ///
    /// # Safety
    /// The addresses in `f` are device memory of this context valid for `bytes` until `caller`
    /// has run the call; `regions` are the communicator's mapped regions, each with `area`.
    #[allow(clippy::too_many_arguments)] // the call, the communicator's layout, how it is watched
    pub(crate) unsafe fn enqueue(
        &self,
        caller: &CudaStream,
        regions: &[u64; MAX_RANKS],
        me: usize,
        area: &CeArea,
        f: &Flows,
        capturing: bool,
        func: &'static str,
        events: Vec<CeOp>,
    ) -> Result<()> {
        // A capture refuses the batched copy, and a batch issued piece by piece would put
        // every peer's copy on one stream: such a call goes per peer. A peer cannot tell.
        let sends = if self.one_call && !capturing { self.mode } else { CeSends::Lanes };
        let steps = plan(regions, me, area, f, sends);
        let mut lanes: Vec<Lane> = steps.iter().map(|s| s.0).collect();
        lanes.sort_unstable();
        lanes.dedup();
        let ops = lanes.iter().map(|&l| Ok((l, StreamOps::new(self.stream(l))?))).collect::<Result<Vec<_>>>()?;
        let mut chain = lock(&self.chain);
        let wants_times = !capturing && !events.is_empty();
        let pair = if capturing { None } else { chain.pairs.take(wants_times && self.spans.ready())? };
        let fork = pair.as_ref().map_or(&self.fork, |p| p.start());
        fork.record(caller)?;
        let last_end = chain.last.as_ref().map_or(&self.done, |p| p.end());
        for &l in &lanes {
            fork.wait_on(self.stream(l))?;
            if !capturing {
                last_end.wait_on(self.stream(l))?;
            }
        }
        let issued = steps.into_iter().try_for_each(|(l, s)| {
            let Some((_, o)) = ops.iter().find(|o| o.0 == l) else { return Ok(()) };
            // SAFETY: the caller's promise about `f`'s addresses; the words and slots lie inside
            // the regions, each `area.end()` bytes long.
            unsafe {
                match s {
                    Step::Copy { dst, src, n } => o.copy(dst, src, n),
                    Step::Batch(pieces) => o.copy_batch(&pieces),
                    Step::Wait { at, ge } => o.wait_ge(at, ge),
                    Step::Write { at, v } => o.write(at, v),
                }
            }
        });
        // Joined even after a failure: a capture must get every forked stream back.
        let joined = lanes.iter().try_for_each(|&l| {
            self.join.record(self.stream(l))?;
            self.join.wait_on(caller)
        });
        issued.and(joined)?;
        if capturing {
            return Ok(());
        }
        // The end, which the next call's lanes wait for: so the calls' ends complete in call
        // order (`spans.rs` relies on it).
        pair.as_ref().map_or(&self.done, |p| p.end()).record(caller)?;
        self.calls.watch(pair.as_ref(), func, f.largest());
        if wants_times {
            self.spans.timed(pair.as_ref(), events);
        }
        chain.last = pair;
        Ok(())
    }
}
