//! Which copy-engine call ran too long. A copy-engine call waits for its peers with stream
//! operations, which have no timeout of their own (`ce/mod.rs`): a peer that lives but stops
//! calling would hold the call, and the caller's stream, forever. The host sees each call
//! through two events (`ce/pairs.rs`, watched in `ce/calls.rs`): one the caller's stream passes as the call starts, one
//! after its joins as it ends. This is the decision over what those events showed, on a virtual
//! clock: a call whose start was seen at `t` and whose end was not seen by `t + OCCL_TIMEOUT`
//! is stalled, and the communicator is stopped once, as for a dead peer (`watch.rs`).
//!
//! Inputs: [`Stalls::enqueued`] (a call and the tag of its events), [`Stalls::started`] and
//! [`Stalls::ended`] (its events seen complete at a time); output: [`Stalls::poll`], the call
//! to abort. No clock, thread or CUDA call here.

use std::collections::VecDeque;
use std::time::Duration;

/// One copy-engine call as the error names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct CeCall {
    /// Its place among the communicator's copy-engine calls the host watched, from 0.
    pub n: u64,
    /// NCCL's name of the collective (`AllGather`).
    pub func: &'static str,
    /// Bytes of each rank's share.
    pub bytes: u64,
}

/// A call stopped for running past the timeout: which, and how long after its start was seen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Stall {
    pub call: CeCall,
    pub after_ns: u64,
}

/// A call enqueued and not seen to end.
struct Live {
    call: CeCall,
    /// The shell's handle on its events.
    tag: usize,
    /// When its start was first seen.
    started: Option<u64>,
}

/// The calls in flight and the one stall found, if any.
pub(crate) struct Stalls {
    timeout_ns: u64,
    /// In enqueue order.
    live: VecDeque<Live>,
    stalled: Option<Stall>,
}

impl Stalls {
    pub(crate) fn new(timeout: Duration) -> Stalls {
        let timeout_ns = u64::try_from(timeout.as_nanos()).unwrap_or(u64::MAX);
        Stalls { timeout_ns, live: VecDeque::new(), stalled: None }
    }

    /// `call` was enqueued; its events are the shell's `tag`.
    pub(crate) fn enqueued(&mut self, call: CeCall, tag: usize) {
        self.live.push_back(Live { call, tag, started: None });
    }

    /// Call `n`'s start event was seen complete at `now` (only the first sighting counts).
    pub(crate) fn started(&mut self, n: u64, now: u64) {
        if let Some(l) = self.live.iter_mut().find(|l| l.call.n == n) {
            l.started.get_or_insert(now);
        }
    }

    /// Call `n`'s end event was seen complete: it is forgotten; returns its tag.
    pub(crate) fn ended(&mut self, n: u64) -> Option<usize> {
        let i = self.live.iter().position(|l| l.call.n == n)?;
        self.live.remove(i).map(|l| l.tag)
    }

    /// The calls to look at: (n, tag, whether its start was seen), in enqueue order.
    pub(crate) fn pending(&self) -> Vec<(u64, usize, bool)> {
        self.live.iter().map(|l| (l.call.n, l.tag, l.started.is_some())).collect()
    }

    /// Whether a call is in flight.
    pub(crate) fn any(&self) -> bool {
        !self.live.is_empty()
    }

    /// The call to abort at `now`: the oldest one whose start was seen more than the timeout
    /// ago and that has not ended. Once found it is the answer for good (the communicator is
    /// stopped once, for that call), whatever ends later.
    pub(crate) fn poll(&mut self, now: u64) -> Option<Stall> {
        if self.stalled.is_some() {
            return self.stalled;
        }
        let s = self.live.iter().find_map(|l| {
            let after_ns = now.saturating_sub(l.started?);
            (after_ns > self.timeout_ns).then_some(Stall { call: l.call, after_ns })
        })?;
        self.stalled = Some(s);
        Some(s)
    }

    /// When the next call can stall, if one has started.
    #[cfg(test)]
    fn deadline(&self) -> Option<u64> {
        self.live.iter().filter_map(|l| l.started).min().map(|t| t.saturating_add(self.timeout_ns))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    fn call(n: u64) -> CeCall {
        CeCall { n, func: "AllGather", bytes: 1 << 20 }
    }

    #[test]
    fn a_call_that_ends_in_time_never_stalls() {
        let mut s = Stalls::new(Duration::from_secs(5));
        s.enqueued(call(0), 7);
        assert_eq!(s.pending(), vec![(0, 7, false)]);
        assert_eq!(s.poll(100 * S), None, "not started: waiting behind the caller's earlier work");
        s.started(0, 100 * S);
        s.started(0, 103 * S); // a later sighting does not move the start
        assert_eq!(s.deadline(), Some(105 * S));
        assert_eq!(s.poll(105 * S), None, "exactly the timeout is still in time");
        assert_eq!(s.ended(0), Some(7));
        assert!(!s.any());
        assert_eq!(s.poll(1000 * S), None);
        assert_eq!(s.ended(0), None, "ended once");
    }

    #[test]
    fn the_oldest_call_past_the_timeout_is_aborted_once() {
        let mut s = Stalls::new(Duration::from_secs(5));
        for n in 0..3 {
            s.enqueued(call(n), n as usize);
        }
        s.started(0, 10 * S);
        assert_eq!(s.ended(0), Some(0));
        // Call 1 starts at 11 s and never ends; call 2 is queued behind it.
        s.started(1, 11 * S);
        s.started(2, 12 * S);
        assert_eq!(s.poll(16 * S), None);
        let got = s.poll(16 * S + 1);
        assert_eq!(got, Some(Stall { call: call(1), after_ns: 5 * S + 1 }));
        assert_eq!(got, s.poll(100 * S), "one stall, for good");
        // The abort releases its waits: both calls drain.
        assert_eq!(s.pending(), vec![(1, 1, true), (2, 2, true)]);
        assert_eq!((s.ended(2), s.ended(1)), (Some(2), Some(1)));
        assert!(!s.any());
        assert_eq!(s.poll(200 * S), got);
    }

    #[test]
    fn a_call_never_seen_to_start_is_not_timed() {
        // The caller's stream is held by its own earlier work (a kernel, a host wait): the
        // copy-engine call has not started, so its peers cannot be blamed.
        let mut s = Stalls::new(Duration::from_nanos(1));
        s.enqueued(call(4), 0);
        assert_eq!(s.poll(u64::MAX), None);
        s.started(4, u64::MAX - 5);
        assert_eq!(s.poll(u64::MAX), Some(Stall { call: call(4), after_ns: 5 }));
    }

    #[test]
    fn an_end_seen_before_its_start_forgets_the_call() {
        // One look can find both events complete; the end alone settles it.
        let mut s = Stalls::new(Duration::from_secs(1));
        s.enqueued(call(0), 3);
        assert_eq!(s.ended(0), Some(3));
        s.started(0, 5 * S); // a stale sighting of a forgotten call changes nothing
        assert!(!s.any());
        assert_eq!(s.poll(100 * S), None);
    }
}
