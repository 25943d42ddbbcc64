//! The device times of copy-engine calls, as the profiler's CeColl events: NCCL's v6 event for
//! a collective on the copy engines, a child of the call's CollApi (occl's sends and receives
//! on the copy engines get one under their P2pApi). NCCL starts and stops it as the host
//! enqueues and leaves the device's times to the plugin; occl starts and stops it at the call's
//! device start and end, as its KernelCh events span a kernel's channels, so a trace or a
//! duration metric shows when the copies ran.
//!
//! A call that a sink wants timed gets a pair of timed stamps (`occl_kernels::stamps`) on the
//! caller's stream: at its start (before the fork onto the copy-engine streams) and its end
//! (after the joins). Once the end is complete, the pair's times on the span clock, through the
//! communicator's anchor, become one CeColl per operation of the call (a group of sends and
//! receives is one call). They are collected where KernelCh records are: at the next operation,
//! at `CudaComm::flush_events` and when the communicator goes away, with this thread's capture
//! mode relaxed, so that the queries do not break a graph it captures. Nothing on the enqueue
//! path waits for the device but the anchor's renewal: a stamp on an idle stream, about once a
//! second while calls are timed, for at most [`PATIENCE`]; the first is measured as the
//! communicator is made. A call a CUDA graph captures gets no pair (its replays run without the
//! host), and neither does one beyond [`MAX_TIMED`] in flight.

use crate::cuda::kernels::cudarc::driver::{CudaContext, CudaStream};
use crate::cuda::kernels::staging::RelaxedCapture;
use crate::cuda::kernels::stamps::{Anchor, AnchorTime, Stamp};
use crate::cuda::kernels::Result;
use occl_events::{EventDescr, EventId, Fanout};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

/// Timed calls in flight at most; later ones go untimed until some are collected.
const MAX_TIMED: usize = 256;
/// How long the anchor's first measurement, as the communicator is made, waits for its stamp.
const FIRST_PATIENCE: Duration = Duration::from_millis(20);
/// How long a later one does, on the enqueue path.
const PATIENCE: Duration = Duration::from_micros(200);

/// One operation of a call: its CeColl's parent (the API event) and descriptor.
pub(crate) type CeOp = (Option<EventId>, EventDescr<'static>);

/// The CeColl of an operation `func` of `count` elements of `datatype` from and to `(send_buff,
/// recv_buff)` (NCCL's fields; `root` is a send's or receive's peer), enqueued on `stream`. Its
/// sequence numbers are the communicator's count of timed calls, set when the call is timed.
pub(crate) fn ce_coll(
    func: &'static str,
    (send_buff, recv_buff): (usize, usize),
    count: usize,
    root: i32,
    datatype: &'static str,
    stream: usize,
) -> EventDescr<'static> {
    EventDescr::CeColl {
        seq_number: 0,
        func,
        send_buff,
        recv_buff,
        count,
        root,
        datatype,
        // occl's flags are unicast writes into each peer's memory.
        sync_strategy: "UC",
        intra_batch_sync: false,
        batch_size: 0,
        num_batches: 0,
        ce_seq_num: 0,
        stream,
    }
}

struct Pending {
    pair: usize,
    ops: Vec<CeOp>,
}

struct Inner {
    pairs: Vec<(Stamp, Stamp)>,
    free: Vec<usize>,
    pending: VecDeque<Pending>,
    /// `None` when its stream could not be made (logged): every call goes untimed.
    anchor: Option<Anchor>,
    /// Calls timed so far: the next one's sequence number.
    next: u32,
    /// Calls that wanted times and got none (every pair in flight, or no anchor yet).
    untimed: u64,
    /// The end (span clock) of the last call collected: no later call's copies start before it.
    last_end: u64,
}

/// One communicator's timed copy-engine calls.
pub(crate) struct CeSpans {
    ctx: Arc<CudaContext>,
    inner: Mutex<Inner>,
    /// `pending.len()`, read without the lock.
    outstanding: AtomicUsize,
}

/// A pair taken for a call being enqueued, its start recorded. Dropped without
/// [`Timed::end`] (the call failed to enqueue), it goes back untimed.
pub(super) struct Timed<'a> {
    spans: &'a CeSpans,
    pair: usize,
    ops: Option<Vec<CeOp>>,
}

impl Timed<'_> {
    /// Records the call's end on `caller`; its CeColl events follow once the device has run it.
    /// A failure costs the events (logged), never the call.
    pub(super) fn end(mut self, caller: &CudaStream) {
        let mut g = self.spans.lock();
        if let Err(e) = g.pairs[self.pair].1.record(caller) {
            tracing::debug!("occl: a copy-engine call's end stamp: {e}; it goes untimed");
            g.untimed += 1;
            return; // the drop frees the pair
        }
        let ops = self.ops.take().unwrap_or_default();
        g.pending.push_back(Pending { pair: self.pair, ops });
        self.spans.outstanding.store(g.pending.len(), Relaxed);
    }
}

impl Drop for Timed<'_> {
    fn drop(&mut self) {
        if self.ops.is_some() {
            self.spans.lock().free.push(self.pair);
        }
    }
}

impl CeSpans {
    pub(crate) fn new(ctx: &Arc<CudaContext>) -> CeSpans {
        let anchor = Anchor::new(ctx, &occl_events::unix_nanos, FIRST_PATIENCE)
            .inspect_err(|e| tracing::warn!("occl: no device times for copy-engine calls: {e}"))
            .ok();
        if let Some(t) = anchor.as_ref().and_then(Anchor::time) {
            tracing::debug!("occl: device event clock anchored ± {} ns", t.err_ns);
        }
        let inner = Inner {
            pairs: Vec::new(),
            free: Vec::new(),
            pending: VecDeque::new(),
            anchor,
            next: 0,
            untimed: 0,
            last_end: 0,
        };
        CeSpans { ctx: ctx.clone(), inner: Mutex::new(inner), outstanding: AtomicUsize::new(0) }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Starts timing a call of `ops` on `caller`: `None` (counted untimed) when every pair is
    /// in flight, the device clock could not be anchored yet, or a stamp failed (logged): the
    /// events are lost, never the call.
    pub(super) fn start(&self, caller: &CudaStream, ops: Vec<CeOp>) -> Option<Timed<'_>> {
        let mut g = self.lock();
        let t = self.take(&mut g, caller, ops);
        if let Err(e) = &t {
            tracing::debug!("occl: a copy-engine call's start stamp: {e}; it goes untimed");
        }
        if !matches!(t, Ok(Some(_))) {
            g.untimed += 1;
        }
        t.ok().flatten()
    }

    /// [`CeSpans::start`] under the lock.
    fn take<'s>(&'s self, g: &mut Inner, caller: &CudaStream, mut ops: Vec<CeOp>) -> Result<Option<Timed<'s>>> {
        if let Some(a) = g.anchor.as_mut().filter(|a| a.stale()) {
            // Its query must not break a graph this thread captures on another stream.
            let _relaxed = RelaxedCapture::new()?;
            if !a.renew(&occl_events::unix_nanos, PATIENCE)? {
                tracing::debug!("occl: the device event clock's anchor took over {PATIENCE:?}; kept the last one");
            }
        }
        if g.anchor.as_ref().and_then(Anchor::time).is_none() {
            return Ok(None);
        }
        let pair = match g.free.pop() {
            Some(i) => i,
            None if g.pairs.len() < MAX_TIMED => {
                g.pairs.push((Stamp::new(&self.ctx)?, Stamp::new(&self.ctx)?));
                g.pairs.len() - 1
            }
            None => return Ok(None),
        };
        if let Err(e) = g.pairs[pair].0.record(caller) {
            g.free.push(pair);
            return Err(e);
        }
        let n = g.next;
        g.next = n.wrapping_add(1);
        for (_, d) in &mut ops {
            if let EventDescr::CeColl { seq_number, ce_seq_num, .. } = d {
                (*seq_number, *ce_seq_num) = (u64::from(n), n);
            }
        }
        Ok(Some(Timed { spans: self, pair, ops: Some(ops) }))
    }

    /// The anchor's last measurement.
    pub(crate) fn anchor(&self) -> Option<AnchorTime> {
        self.lock().anchor.as_ref().and_then(Anchor::time)
    }

    /// Timed calls not collected yet, and calls that wanted times and got none.
    pub(crate) fn pending(&self) -> (usize, u64) {
        (self.outstanding.load(Relaxed), self.lock().untimed)
    }

    /// Emits the CeColl events of every timed call the device has run, at its device start and
    /// end; returns how many calls it collected. A call whose times cannot be read (a failed
    /// context) is dropped.
    pub(crate) fn collect(&self, f: &Fanout) -> usize {
        if self.outstanding.load(Relaxed) == 0 {
            return 0;
        }
        let mut done = Vec::new();
        {
            // The caller may be capturing a graph (this call may be the first it captures):
            // the queries below must not break it.
            let _relaxed = match RelaxedCapture::new() {
                Ok(r) => r,
                Err(e) => {
                    tracing::debug!("occl: cannot collect copy-engine call times now: {e}");
                    return 0;
                }
            };
            let mut g = self.lock();
            let Inner { pairs, free, pending, anchor, untimed, last_end, .. } = &mut *g;
            // The end stamps complete in the order the calls were enqueued, whatever their
            // callers' streams: each call's lanes wait for the `done` mark of the call before
            // (`streams.rs`), recorded after that call's end stamp on its stream. So the first
            // call not done ends the look, and a host far ahead of its device pays one query
            // per operation.
            while let Some(p) = pending.front() {
                let (start, end) = &pairs[p.pair];
                match end.done() {
                    Ok(false) => break,
                    Ok(true) => {}
                    Err(e) => tracing::debug!("occl: a copy-engine call's end stamp: {e}; it goes untimed"),
                }
                let times = match anchor {
                    Some(a) => a.host_ns(start).and_then(|s| Ok(s.zip(a.host_ns(end)?))),
                    None => Ok(None),
                };
                let Some(p) = pending.pop_front() else { break };
                free.push(p.pair);
                match times {
                    Ok(Some((s, e))) => {
                        // A call enqueued on another stream than the one before it is stamped
                        // as it comes up there, but its lanes wait for that call to end.
                        let s = s.max(*last_end).min(e);
                        *last_end = e;
                        done.push((s, e, p.ops));
                    }
                    Ok(None) => *untimed += 1,
                    Err(e) => {
                        tracing::debug!("occl: a copy-engine call's times: {e}; it goes untimed");
                        *untimed += 1;
                    }
                }
            }
            self.outstanding.store(pending.len(), Relaxed);
        }
        for (start, end, ops) in &done {
            for (parent, d) in ops {
                if let Some(id) = f.start_at(*parent, d, *start) {
                    f.stop_at(id, *end);
                }
            }
        }
        done.len()
    }
}
