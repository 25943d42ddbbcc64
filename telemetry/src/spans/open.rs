//! The collector's per-communicator tables, addressed by the event id's low bits instead of a
//! hash: the fan-out (and the plugin) issue ids as a dense sequence number under a few route or
//! communicator bits, so consecutive events land in consecutive slots and an id finds its entry
//! with an index and a compare.
//!
//! - [`OpenTable`]: events between start and stop. Each slot has its own lock (uncontended: the
//!   slot's event is the only one that touches it) and keeps its buffers for the next event, so a
//!   span costs no allocation. An id whose slot is still held by an older open event (one open
//!   across more than [`OPEN_SLOTS`] later events: a long operation, or ids that are not dense)
//!   goes to an overflow map, which costs what the old hash table did.
//! - [`RootRing`]: the trace root of every event, lock-free, so a child finds its tree without
//!   touching its parent's entry, and kept past the event's stop for late children (reference
//!   §10: ProxyOps start after their Coll stopped). An entry lasts until an event [`ROOT_SLOTS`]
//!   ids later takes its slot: at 26–60 events per operation, the last few hundred operations. A
//!   writer marks the slot before it writes, so a reader never pairs one event's id with another
//!   event's root.

use super::spin::SpinLock;
use super::{StateMark, MAX_STATES};
use crate::event::{EventDescr, EventId};
use std::collections::HashMap;
use std::sync::atomic::Ordering::{self, Acquire, Relaxed, Release};
use std::sync::atomic::{fence, AtomicU32, AtomicU64, AtomicUsize};
use std::sync::{Mutex, MutexGuard, PoisonError};

/// Open events addressed directly; a power of two. NCCL keeps at most a few hundred events of a
/// communicator open at once (channels × peers × steps in flight).
pub const OPEN_SLOTS: usize = 1024;
/// Root entries; a power of two (16 bytes each).
pub const ROOT_SLOTS: usize = 16384;

/// An event between its start and its stop.
pub(super) struct Open {
    pub parent: Option<EventId>,
    pub root: EventId,
    pub start_ns: u64,
    pub descr: EventDescr<'static>,
    /// A NetPlugin's start payload; empty for other types.
    pub payload: Vec<u8>,
    pub states: Vec<StateMark>,
    pub states_dropped: u32,
    pub steps_done: u32,
}

impl Open {
    fn empty(root: EventId) -> Open {
        Open {
            parent: None,
            root,
            start_ns: 0,
            descr: EventDescr::Group,
            payload: Vec::new(),
            states: Vec::new(),
            states_dropped: 0,
            steps_done: 0,
        }
    }

    /// Appends a state mark, counting those past [`MAX_STATES`].
    pub fn push_state(&mut self, m: StateMark) {
        if self.states.len() < MAX_STATES {
            self.states.push(m);
        } else {
            self.states_dropped = self.states_dropped.saturating_add(1);
        }
    }
}

/// What a new event's entry starts with.
pub(super) struct Start<'a> {
    pub parent: Option<EventId>,
    pub root: EventId,
    pub start_ns: u64,
    pub descr: EventDescr<'static>,
    pub payload: &'a [u8],
}

impl Start<'_> {
    /// Overwrites `o` with this start, keeping its buffers' capacity.
    fn fill(self, o: &mut Open) {
        o.parent = self.parent;
        o.root = self.root;
        o.start_ns = self.start_ns;
        o.descr = self.descr;
        o.payload.clear();
        o.payload.extend_from_slice(self.payload);
        o.states.clear();
        o.states_dropped = 0;
        o.steps_done = 0;
    }
}

struct Slot {
    /// The id of the event held (0: free); changed only under `open`'s lock, read without it
    /// by `count_step`.
    id: AtomicU64,
    /// The held event's finished ProxySteps: counted by its steps' stops without its lock.
    steps: AtomicU32,
    open: SpinLock<Open>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Nothing panics under these locks but an exporter; the data stays consistent.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The open events of one communicator's sink.
pub(super) struct OpenTable {
    slots: Box<[Slot]>,
    overflow: Mutex<HashMap<u64, Open>>,
    /// Entries in `overflow`: while 0, a miss in the slots is final and takes no lock.
    spilled: AtomicUsize,
}

impl Default for OpenTable {
    fn default() -> Self {
        let placeholder = EventId(std::num::NonZeroU64::MIN);
        OpenTable {
            slots: (0..OPEN_SLOTS)
                .map(|_| Slot { id: AtomicU64::new(0), steps: AtomicU32::new(0), open: SpinLock::new(Open::empty(placeholder)) })
                .collect(),
            overflow: Mutex::new(HashMap::new()),
            spilled: AtomicUsize::new(0),
        }
    }
}

impl OpenTable {
    fn slot(&self, id: u64) -> &Slot {
        &self.slots[id as usize & (OPEN_SLOTS - 1)]
    }

    /// Records a started event (ids are unique among open events).
    pub fn start(&self, id: EventId, s: Start<'_>) {
        let key = id.get();
        let slot = self.slot(key);
        {
            let mut o = slot.open.lock();
            if slot.id.load(Relaxed) == 0 {
                s.fill(&mut o);
                slot.steps.store(0, Relaxed);
                slot.id.store(key, Release);
                return;
            }
        }
        let mut o = Open::empty(s.root);
        s.fill(&mut o);
        let mut m = lock(&self.overflow);
        if m.insert(key, o).is_none() {
            self.spilled.fetch_add(1, Relaxed);
        }
    }

    /// Runs `f` on the open event `id`, if there is one.
    pub fn with<R>(&self, id: EventId, f: impl FnOnce(&mut Open) -> R) -> Option<R> {
        let key = id.get();
        let slot = self.slot(key);
        if slot.id.load(Relaxed) == key {
            let mut o = slot.open.lock();
            // Checked again under the lock: the event may have stopped meanwhile.
            if slot.id.load(Relaxed) == key {
                return Some(f(&mut o));
            }
        }
        if self.spilled.load(Relaxed) == 0 {
            return None;
        }
        lock(&self.overflow).get_mut(&key).map(f)
    }

    /// One more finished ProxyStep for the open event `id` (its ProxyOp).
    pub fn count_step(&self, id: EventId) {
        let key = id.get();
        let slot = self.slot(key);
        if slot.id.load(Acquire) == key {
            slot.steps.fetch_add(1, Relaxed);
        } else if self.spilled.load(Relaxed) != 0 {
            if let Some(o) = lock(&self.overflow).get_mut(&key) {
                o.steps_done = o.steps_done.saturating_add(1);
            }
        }
    }

    /// Ends the event `id`: runs `f` on its entry (with its finished steps), which is then
    /// forgotten. `f` runs under the entry's lock and must not reach this table.
    pub fn stop<R>(&self, id: EventId, f: impl FnOnce(&Open, u32) -> R) -> Option<R> {
        let key = id.get();
        let slot = self.slot(key);
        if slot.id.load(Relaxed) == key {
            let o = slot.open.lock();
            if slot.id.load(Relaxed) == key {
                let r = f(&o, slot.steps.load(Relaxed));
                slot.id.store(0, Relaxed);
                return Some(r);
            }
        }
        if self.spilled.load(Relaxed) == 0 {
            return None;
        }
        let o = lock(&self.overflow).remove(&key)?;
        self.spilled.fetch_sub(1, Relaxed);
        Some(f(&o, o.steps_done))
    }

    /// Events started and not yet stopped.
    pub fn len(&self) -> usize {
        self.slots.iter().filter(|s| s.id.load(Relaxed) != 0).count() + lock(&self.overflow).len()
    }
}

/// The id of a [`RootRing`] entry being written (an event with this id gets no entry).
const WRITING: u64 = u64::MAX;

/// Trace roots of events, kept past their stop (see the module doc).
pub(super) struct RootRing {
    /// (id, root) pairs; an id of 0 is an empty entry, [`WRITING`] one being written.
    slots: Box<[(AtomicU64, AtomicU64)]>,
}

impl Default for RootRing {
    fn default() -> Self {
        RootRing { slots: (0..ROOT_SLOTS).map(|_| (AtomicU64::new(0), AtomicU64::new(0))).collect() }
    }
}

impl RootRing {
    fn entry(&self, id: u64) -> &(AtomicU64, AtomicU64) {
        &self.slots[id as usize & (ROOT_SLOTS - 1)]
    }

    /// Records the root of `id`, replacing the entry of an older event in its slot. Plain
    /// stores: two writers of one slot at once would be two events [`ROOT_SLOTS`] ids apart
    /// starting in the same instant, which one communicator's emitters never are.
    pub fn insert(&self, id: EventId, root: EventId) {
        let (k, v) = self.entry(id.get());
        if id.get() == WRITING {
            return;
        }
        k.store(WRITING, Relaxed);
        // A reader that sees the new root also sees WRITING (or the new id) on its second look.
        fence(Release);
        v.store(root.get(), Relaxed);
        k.store(id.get(), Release);
    }

    /// The root of `id`, if its entry is still there.
    pub fn get(&self, id: EventId) -> Option<EventId> {
        let (k, v) = self.entry(id.get());
        if k.load(Ordering::Acquire) != id.get() {
            return None;
        }
        let root = v.load(Ordering::Relaxed);
        fence(Ordering::Acquire);
        // Rewritten meanwhile: the root read may be the newer event's.
        if k.load(Ordering::Relaxed) != id.get() {
            return None;
        }
        std::num::NonZeroU64::new(root).map(EventId)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::num::NonZeroU64;

    fn id(n: u64) -> EventId {
        EventId(NonZeroU64::new(n).expect("non-zero"))
    }

    fn start(root: u64) -> Start<'static> {
        Start { parent: None, root: id(root), start_ns: 1, descr: EventDescr::ProxyCtrl, payload: &[] }
    }

    #[test]
    fn ids_sharing_a_slot_both_stay_open_and_stop_once() {
        let t = OpenTable::default();
        let a = id(5);
        let b = id(5 + OPEN_SLOTS as u64);
        t.start(a, start(1));
        t.start(b, start(2));
        assert_eq!(t.len(), 2);
        assert_eq!(t.with(b, |o| o.root), Some(id(2)));
        assert_eq!(t.with(a, |o| o.root), Some(id(1)));
        assert_eq!(t.stop(a, |o, _| o.root), Some(id(1)));
        assert_eq!(t.stop(a, |o, _| o.root), None);
        assert_eq!(t.with(b, |o| o.root), Some(id(2)));
        t.count_step(b);
        t.count_step(a);
        assert_eq!(t.stop(b, |o, steps| (o.root, steps)), Some((id(2), 1)));
        assert_eq!((t.len(), t.spilled.load(Ordering::Relaxed)), (0, 0));
        assert_eq!(t.with(id(7), |o| o.root), None);
    }

    #[test]
    fn a_reused_slot_starts_clean_and_keeps_its_buffers() {
        let t = OpenTable::default();
        t.start(id(3), Start { payload: &[1, 2, 3], ..start(3) });
        t.with(id(3), |o| {
            for i in 0..MAX_STATES + 2 {
                o.push_state(StateMark { t_ns: i as u64, state: 1, value: 0 });
            }
        });
        t.count_step(id(3));
        assert_eq!(
            t.stop(id(3), |o, steps| (o.states.len(), o.states_dropped, o.payload.len(), steps)),
            Some((MAX_STATES, 2, 3, 1))
        );
        let again = id(3 + OPEN_SLOTS as u64);
        t.start(again, start(9));
        let cap = t.with(again, |o| {
            assert_eq!((o.states.len(), o.states_dropped, o.payload.len(), o.root), (0, 0, 0, id(9)));
            o.states.capacity()
        });
        assert!(cap >= Some(MAX_STATES));
        assert_eq!(t.stop(again, |_, steps| steps), Some(0));
    }

    #[test]
    fn roots_stay_until_their_slot_is_reused() {
        let r = RootRing::default();
        r.insert(id(10), id(1));
        r.insert(id(11), id(10));
        assert_eq!((r.get(id(10)), r.get(id(11)), r.get(id(12))), (Some(id(1)), Some(id(10)), None));
        r.insert(id(10 + ROOT_SLOTS as u64), id(7));
        assert_eq!(r.get(id(10)), None);
        assert_eq!(r.get(id(10 + ROOT_SLOTS as u64)), Some(id(7)));
        assert_eq!(r.get(id(11)), Some(id(10)));
    }
}
