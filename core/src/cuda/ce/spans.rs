//! The device times of copy-engine calls, as the profiler's CeColl events: NCCL's v6 event for
//! a collective on the copy engines, a child of the call's CollApi (occl's sends and receives
//! on the copy engines get one under their P2pApi). NCCL starts and stops it as the host
//! enqueues and leaves the device's times to the plugin; occl starts and stops it at the call's
//! device start and end, as its KernelCh events span a kernel's channels, so a trace or a
//! duration metric shows when the copies ran.
//!
//! A call that a sink wants timed gets a timed pair (`pairs.rs`): the stamps on the caller's
//! stream at its start (the fork onto the copy-engine streams) and its end (after the joins).
//! Once the end is complete, the pair's times on the span clock, through the context's device
//! clock (`clock.rs`), become one CeColl per operation of the call (a group of sends and
//! receives is one call). They are collected where KernelCh records are: at the next operation,
//! at `CudaComm::flush_events` and when the communicator goes away, with this thread's capture
//! mode relaxed, so that the queries do not break a graph it captures. Nothing on the enqueue
//! path waits for the device: the watcher renews the clock (`clock.rs`). A call a CUDA graph
//! captures is not timed (its replays run without the host), and neither is one that finds
//! every timed pair in flight.

use super::clock::{host_ns, DeviceClock};
use super::pairs::Pair;
use crate::cuda::kernels::staging::RelaxedCapture;
use crate::cuda::kernels::stamps::AnchorTime;
use crate::sync::lock;
use occl_events::{EventDescr, EventId, Fanout};
use std::cell::OnceCell;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard};

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

/// A timed call: its pair (which cannot be taken for another call while held here) and its
/// operations.
struct Pending {
    pair: Arc<Pair>,
    ops: Vec<CeOp>,
}

struct Inner {
    pending: VecDeque<Pending>,
    /// Calls timed so far: the next one's sequence number.
    next: u32,
    /// Calls that wanted times and got none (every timed pair in flight, or no anchor yet).
    untimed: u64,
    /// The end (span clock) of the last call collected: no later call's copies start before it.
    last_end: u64,
}

/// One communicator's timed copy-engine calls.
pub(crate) struct CeSpans {
    clock: Arc<DeviceClock>,
    inner: Mutex<Inner>,
    /// `pending.len()`, read without the lock.
    outstanding: AtomicUsize,
}

impl CeSpans {
    /// Timed on `clock`, the context's.
    pub(crate) fn new(clock: Arc<DeviceClock>) -> CeSpans {
        let inner = Inner { pending: VecDeque::new(), next: 0, untimed: 0, last_end: 0 };
        CeSpans { clock, inner: Mutex::new(inner), outstanding: AtomicUsize::new(0) }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        lock(&self.inner)
    }

    /// Whether a call enqueued now can be timed: the device clock is anchored. A call that
    /// wanted times and gets none is counted by [`CeSpans::timed`].
    pub(super) fn ready(&self) -> bool {
        self.clock.ready()
    }

    /// Takes a call of `ops` whose events are recorded in `pair` (`None`: it got no pair) for
    /// its CeColl events, which follow once the device has run it; a pair that is not timed
    /// (every timed pair was in flight, or the clock was not ready) leaves it untimed, counted.
    pub(super) fn timed(&self, pair: Option<&Arc<Pair>>, mut ops: Vec<CeOp>) {
        let mut g = self.lock();
        let Some(pair) = pair.filter(|p| p.stamps().is_some()) else {
            g.untimed += 1;
            return;
        };
        let n = g.next;
        g.next = n.wrapping_add(1);
        for (_, d) in &mut ops {
            if let EventDescr::CeColl { seq_number, ce_seq_num, .. } = d {
                (*seq_number, *ce_seq_num) = (u64::from(n), n);
            }
        }
        g.pending.push_back(Pending { pair: pair.clone(), ops });
        self.outstanding.store(g.pending.len(), Relaxed);
    }

    /// The anchor's last measurement.
    pub(crate) fn anchor(&self) -> Option<AnchorTime> {
        self.clock.time()
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
            // Read once a call has ended, once per collection.
            let reading = OnceCell::new();
            let mut g = self.lock();
            let Inner { pending, untimed, last_end, .. } = &mut *g;
            // The ends complete in the order the calls were enqueued, whatever their callers'
            // streams: each call's lanes wait for the end of the call before (`streams.rs`). So
            // the first call not done ends the look, and a host far ahead of its device pays one
            // query per operation.
            while let Some(p) = pending.front() {
                if !p.pair.has_ended(p.pair.call()) {
                    break;
                }
                let times = match p.pair.stamps() {
                    Some((start, end)) => host_ns(reading.get_or_init(|| self.clock.reading()).as_ref(), start, end),
                    None => Ok(None),
                };
                let Some(p) = pending.pop_front() else { break };
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
