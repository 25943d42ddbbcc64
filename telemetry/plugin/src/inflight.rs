//! Operations in flight on one communicator rank, from NCCL's events, for
//! `occl_operation_in_flight_age_seconds` (the series RAS writes for a job on occl).
//!
//! Under NCCL a Coll or P2p span covers the host's enqueue; its ProxyOp and KernelCh children run
//! later, on the proxy thread, and the operation ends at the last of them (reference §10). So an
//! operation is in flight from its own start while its own span or any child is open. A child may
//! start after its parent stopped: the last [`RECENT`] operations that looked done are kept, and a
//! child of one of them takes it back into flight with its first start. Work NCCL reports no child
//! for (intra-node without KernelCh events) is in flight only while the host enqueues it.

use std::collections::{HashMap, VecDeque};
use std::sync::{Mutex, PoisonError};
use std::time::Instant;

/// Operations that looked done kept for a late child.
pub const RECENT: usize = 256;

#[derive(Clone, Copy, Debug)]
struct Op {
    start: Instant,
    own_open: bool,
    children: u32,
}

#[derive(Default)]
struct Ops {
    open: HashMap<u64, Op>,
    /// Each open child's operation.
    parent_of: HashMap<u64, u64>,
    recent: VecDeque<(u64, Instant)>,
}

impl Ops {
    fn settle(&mut self, op: u64) {
        if let Some(o) = self.open.get(&op).filter(|o| !o.own_open && o.children == 0).copied() {
            self.open.remove(&op);
            if self.recent.len() >= RECENT {
                self.recent.pop_front();
            }
            self.recent.push_back((op, o.start));
        }
    }
}

/// One communicator rank's operations in flight.
#[derive(Default)]
pub struct InFlight {
    ops: Mutex<Ops>,
}

impl InFlight {
    fn ops(&self) -> std::sync::MutexGuard<'_, Ops> {
        self.ops.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A Coll or P2p started.
    pub fn op_started(&self, id: u64, at: Instant) {
        self.ops().open.insert(id, Op { start: at, own_open: true, children: 0 });
    }

    /// A ProxyOp or KernelCh of operation `parent` started.
    pub fn child_started(&self, id: u64, parent: u64) {
        let mut o = self.ops();
        if let Some(op) = o.open.get_mut(&parent) {
            op.children += 1;
        } else if let Some(i) = o.recent.iter().position(|(p, _)| *p == parent) {
            let (_, start) = o.recent.remove(i).unwrap_or((parent, Instant::now()));
            o.open.insert(parent, Op { start, own_open: false, children: 1 });
        } else {
            return;
        }
        o.parent_of.insert(id, parent);
    }

    /// Any event stopped (those that are neither an operation nor its child are not found).
    pub fn stopped(&self, id: u64) {
        let mut o = self.ops();
        if let Some(op) = o.open.get_mut(&id) {
            op.own_open = false;
            o.settle(id);
        } else if let Some(parent) = o.parent_of.remove(&id) {
            if let Some(op) = o.open.get_mut(&parent) {
                op.children = op.children.saturating_sub(1);
            }
            o.settle(parent);
        }
    }

    /// How long the oldest operation in flight has run at `now` (0 when none is).
    pub fn oldest_age_s(&self, now: Instant) -> f64 {
        let o = self.ops();
        o.open.values().map(|op| now.saturating_duration_since(op.start).as_secs_f64()).fold(0.0, f64::max)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn an_operation_is_in_flight_until_its_last_child_stops() {
        let f = InFlight::default();
        let t0 = Instant::now();
        let s = |x: u64| t0 + Duration::from_secs(x);
        assert_eq!(f.oldest_age_s(s(1)), 0.0, "idle");
        f.op_started(1, t0);
        assert_eq!(f.oldest_age_s(s(2)), 2.0, "enqueueing");
        f.stopped(1);
        assert_eq!(f.oldest_age_s(s(2)), 0.0, "enqueued, no child yet");
        // Its ProxyOps start after its stop: it is in flight again, from its own start.
        f.child_started(10, 1);
        f.child_started(11, 1);
        assert_eq!(f.oldest_age_s(s(5)), 5.0);
        f.stopped(99); // a ProxyStep: not an operation or a child
        f.stopped(10);
        assert_eq!(f.oldest_age_s(s(5)), 5.0, "one child still runs");
        f.op_started(2, s(4));
        f.child_started(12, 2);
        f.stopped(2);
        f.stopped(11);
        assert_eq!(f.oldest_age_s(s(6)), 2.0, "the next operation is the oldest");
        f.stopped(12);
        assert_eq!(f.oldest_age_s(s(6)), 0.0);
        f.child_started(13, 777);
        f.stopped(13);
        assert_eq!(f.oldest_age_s(s(6)), 0.0, "a child of an unknown operation is not tracked");
    }
}
