//! Operations whose duration is not known at their stop. Under NCCL a Coll or P2p stops when the
//! host has enqueued it; its ProxyOp and KernelCh children run and stop later, and the operation
//! is done at the last of them (reference §10). Such an operation is parked here, its children
//! push its end out, and it is observed when its slot is needed again, when it has been idle for a
//! while (checked at each scrape), or when its communicator is finalized. Under occl the children
//! stop before the operation, so nothing is parked (see occl's `exec` and `profile`).
//!
//! A call on the copy engines has a CeColl instead, a child of the call's API event (NCCL's
//! v6 hierarchy), which the operation's own id does not find: an operation parked with its API
//! event's id gets an alias from that id ([`Pending::alias`]), through which the CeColl pushes
//! its end out ([`Pending::extend_via`]).
//!
//! Lock-free: a slot's id is FREE, BUSY (being filled or taken) or the parked event's id; fields
//! are written before the id is published (release) and read after the id is claimed (acquire).
//! An alias is a pair of words, the operation's id written before the API id that publishes it
//! and read between two reads of that API id: a torn read is seen and ignored.

use std::sync::atomic::{AtomicU64, Ordering::Acquire, Ordering::Relaxed, Ordering::Release};

const SLOTS: usize = 64;
const FREE: u64 = 0;
const BUSY: u64 = u64::MAX;

#[derive(Default)]
struct Slot {
    id: AtomicU64,
    start: AtomicU64,
    end: AtomicU64,
    /// Last push of its end (span clock): what "idle" is measured from.
    touched: AtomicU64,
    series: AtomicU64,
    bus: AtomicU64,
}

/// A parked operation, finished.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Done {
    pub start: u64,
    pub end: u64,
    /// The caller's reference to its series.
    pub series: u64,
    pub bus: u64,
}

/// API event id → the operation parked under it.
#[derive(Default)]
struct Alias {
    api: AtomicU64,
    op: AtomicU64,
}

pub(crate) struct Pending {
    slots: Box<[Slot]>,
    aliases: Box<[Alias]>,
}

fn slot_of(id: u64) -> usize {
    (id.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 58) as usize % SLOTS
}

impl Pending {
    pub(crate) fn new() -> Self {
        Pending {
            slots: (0..SLOTS).map(|_| Slot::default()).collect(),
            aliases: (0..SLOTS).map(|_| Alias::default()).collect(),
        }
    }

    /// Takes the operation out of `s` if it still holds `id`.
    fn take(s: &Slot, id: u64) -> Option<Done> {
        if id == FREE || id == BUSY || s.id.compare_exchange(id, BUSY, Acquire, Relaxed).is_err() {
            return None;
        }
        let d = Done {
            start: s.start.load(Relaxed),
            end: s.end.load(Relaxed),
            series: s.series.load(Relaxed),
            bus: s.bus.load(Relaxed),
        };
        s.id.store(FREE, Release);
        Some(d)
    }

    /// Parks operation `id`; the operation that held its slot is handed to `finish` first.
    /// Returns `false` when the slot is contended (another thread is filling or taking it): the
    /// caller then observes the operation as it is.
    pub(crate) fn park(&self, id: u64, op: Done, mut finish: impl FnMut(Done)) -> bool {
        if id == FREE || id == BUSY {
            return false;
        }
        let s = &self.slots[slot_of(id)];
        for _ in 0..2 {
            match s.id.load(Acquire) {
                FREE => {
                    if s.id.compare_exchange(FREE, BUSY, Acquire, Relaxed).is_ok() {
                        s.start.store(op.start, Relaxed);
                        s.end.store(op.end, Relaxed);
                        s.touched.store(op.end, Relaxed);
                        s.series.store(op.series, Relaxed);
                        s.bus.store(op.bus, Relaxed);
                        s.id.store(id, Release);
                        return true;
                    }
                }
                BUSY => return false,
                old => {
                    if let Some(d) = Self::take(s, old) {
                        finish(d);
                    }
                }
            }
        }
        false
    }

    /// A child of `parent` stopped at `end`: the operation, if parked, ends no earlier.
    #[inline]
    pub(crate) fn extend(&self, parent: u64, end: u64) {
        let s = &self.slots[slot_of(parent)];
        if parent != FREE && s.id.load(Acquire) == parent {
            s.end.fetch_max(end, Relaxed);
            s.touched.fetch_max(end, Relaxed);
        }
    }

    /// Lets a child of the API event `api` reach the parked operation `op`
    /// ([`Pending::extend_via`]); replaces the alias that held its slot.
    pub(crate) fn alias(&self, api: u64, op: u64) {
        if api == FREE || api == BUSY {
            return;
        }
        let a = &self.aliases[slot_of(api)];
        a.api.store(FREE, Release);
        a.op.store(op, Relaxed);
        a.api.store(api, Release);
    }

    /// A child of the API event `api` stopped at `end`: its operation, if parked under an
    /// alias from `api`, ends no earlier.
    pub(crate) fn extend_via(&self, api: u64, end: u64) {
        let a = &self.aliases[slot_of(api)];
        if api == FREE || a.api.load(Acquire) != api {
            return;
        }
        let op = a.op.load(Acquire);
        if a.api.load(Acquire) == api {
            self.extend(op, end);
        }
    }

    /// Hands every operation untouched since `before` (all, for `u64::MAX`) to `finish`.
    pub(crate) fn finish_idle(&self, before: u64, mut finish: impl FnMut(Done)) {
        for s in self.slots.iter() {
            let id = s.id.load(Acquire);
            if id != FREE && id != BUSY && s.touched.load(Relaxed) < before {
                if let Some(d) = Self::take(s, id) {
                    finish(d);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(start: u64, end: u64, series: u64) -> Done {
        Done { start, end, series, bus: 8 }
    }

    #[test]
    fn children_extend_a_parked_operation_until_it_is_finished() {
        let p = Pending::new();
        let mut out = Vec::new();
        assert!(p.park(7, op(100, 110, 1), |d| out.push(d)));
        p.extend(7, 150);
        p.extend(7, 140);
        p.extend(8, 999); // not parked: ignored
        p.finish_idle(150, |d| out.push(d));
        assert!(out.is_empty(), "touched at 150: not idle before 150");
        p.finish_idle(151, |d| out.push(d));
        assert_eq!(out, vec![op(100, 150, 1)]);
        p.extend(7, 500); // after it finished: no effect
        p.finish_idle(u64::MAX, |d| out.push(d));
        assert_eq!(out.len(), 1);
    }

    #[test]
    fn a_child_of_the_api_event_extends_its_operation_through_the_alias() {
        let p = Pending::new();
        let mut out = Vec::new();
        assert!(p.park(7, op(100, 110, 1), |d| out.push(d)));
        p.extend_via(6, 150); // no alias yet
        p.alias(6, 7);
        p.extend_via(6, 180);
        p.extend_via(5, 999); // another API event: ignored
        let other = (1..).find(|&b| b != 6 && slot_of(b) == slot_of(6)).expect("a colliding id");
        p.extend_via(other, 999); // its slot, another id: ignored
        p.finish_idle(u64::MAX, |d| out.push(d));
        assert_eq!(out, vec![op(100, 180, 1)]);
        p.alias(other, 9);
        p.extend_via(6, 999); // replaced: no longer reaches 7 (nor anything)
        assert!(p.park(7, op(1, 2, 1), |d| out.push(d)));
        p.extend_via(6, 999);
        p.finish_idle(u64::MAX, |d| out.push(d));
        assert_eq!(out[1], op(1, 2, 1));
    }

    #[test]
    fn a_slot_taken_again_finishes_its_previous_operation() {
        let p = Pending::new();
        let mut out = Vec::new();
        // Two ids with the same slot.
        let a = 1u64;
        let b = (2..).find(|&b| slot_of(b) == slot_of(a)).expect("a colliding id");
        assert!(p.park(a, op(1, 2, 10), |d| out.push(d)));
        assert!(p.park(b, op(3, 4, 20), |d| out.push(d)));
        assert_eq!(out, vec![op(1, 2, 10)]);
        p.finish_idle(u64::MAX, |d| out.push(d));
        assert_eq!(out, vec![op(1, 2, 10), op(3, 4, 20)]);
        assert!(!p.park(BUSY, op(0, 0, 0), |_| {}), "the sentinel ids are never parked");
    }
}
