//! The collector's per-communicator tables, addressed by the event id's low bits instead of a
//! hash: the fan-out (and the plugin) issue ids as a dense sequence number under a few route or
//! communicator bits, so consecutive events land in consecutive slots and an id finds its entry
//! with an index and a compare.
//!
//! - [`OpenTable`]: events between start and stop. Each slot has its own lock (uncontended: the
//!   slot's event is the only one that touches it) and keeps its buffers for the next event, so a
//!   span costs no allocation. An id whose slot is still held by an older open event (one open
//!   across more than [`OPEN_SLOTS`] later events: a long operation, or ids that are not dense)
//!   goes to an overflow map (a hash lookup per callback).
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
use std::sync::atomic::{fence, AtomicBool, AtomicU32, AtomicU64, AtomicUsize};
use std::sync::{Mutex, MutexGuard, PoisonError};

/// Open events addressed directly; a power of two. NCCL keeps at most a few hundred events of a
/// communicator open at once (channels × peers × steps in flight).
pub const OPEN_SLOTS: usize = 1024;
/// Root entries; a power of two (16 bytes each).
pub const ROOT_SLOTS: usize = 16384;
/// State marks a slot keeps in atomics, written without its lock: every state of a ProxyStep
/// (three) or a ProxyOp; later ones go under the lock.
pub const INLINE_MARKS: usize = 4;

/// An event between its start and its stop.
pub(super) struct Open {
    /// Only counted (a ProxyStep no exporter keeps): no marks, no span at the stop.
    pub light: bool,
    pub parent: Option<EventId>,
    pub root: EventId,
    pub start_ns: u64,
    pub descr: EventDescr<'static>,
    /// A NetPlugin's start payload; empty for other types.
    pub payload: Vec<u8>,
    /// State marks: in a slot, those after its inline ones; in the overflow map, all.
    states: Vec<StateMark>,
    pub states_dropped: u32,
    steps_done: u32,
    /// The stop's buffer for a slot's inline and later marks together (kept for its capacity).
    all: Vec<StateMark>,
}

impl Open {
    fn empty(root: EventId) -> Open {
        Open {
            light: false,
            parent: None,
            root,
            start_ns: 0,
            descr: EventDescr::Group,
            payload: Vec::new(),
            states: Vec::new(),
            states_dropped: 0,
            steps_done: 0,
            all: Vec::new(),
        }
    }

    /// Appends a state mark while fewer than `max` are kept here, else counts it as dropped.
    fn push_state(&mut self, m: StateMark, max: usize) {
        if self.states.len() < max {
            self.states.push(m);
        } else {
            self.states_dropped = self.states_dropped.saturating_add(1);
        }
    }
}

/// What a new event's entry starts with.
pub(super) struct Start<'a> {
    /// See [`Open::light`].
    pub light: bool,
    pub parent: Option<EventId>,
    pub root: EventId,
    pub start_ns: u64,
    pub descr: EventDescr<'static>,
    pub payload: &'a [u8],
}

impl Start<'_> {
    /// Overwrites `o` with this start, keeping its buffers' capacity.
    fn fill(self, o: &mut Open) {
        o.light = self.light;
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
    /// The held event's finished ProxySteps: counted by its steps' stops (or their sums) without its lock.
    steps: AtomicU32,
    /// The first [`INLINE_MARKS`] state marks (time, state, value), and how many are written:
    /// the event's own states, which its emitter orders, write them without the lock.
    marks: [[AtomicU64; 3]; INLINE_MARKS],
    n_marks: AtomicU32,
    /// The held event's [`Open::light`], readable without the lock once `id` is.
    light: AtomicBool,
    open: SpinLock<Open>,
}

impl Slot {
    fn new(open: Open) -> Slot {
        Slot {
            id: AtomicU64::new(0),
            steps: AtomicU32::new(0),
            marks: std::array::from_fn(|_| std::array::from_fn(|_| AtomicU64::new(0))),
            n_marks: AtomicU32::new(0),
            light: AtomicBool::new(false),
            open: SpinLock::new(open),
        }
    }
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
            slots: (0..OPEN_SLOTS).map(|_| Slot::new(Open::empty(placeholder))).collect(),
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
                slot.light.store(s.light, Relaxed);
                s.fill(&mut o);
                slot.steps.store(0, Relaxed);
                slot.n_marks.store(0, Relaxed);
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

    /// Records a state of the open event `id`; `mark` (which reads the clock) runs only if the
    /// event is here. The first [`INLINE_MARKS`] take no lock: only the event's own calls write
    /// them, in the order its emitter makes them.
    pub fn state(&self, id: EventId, mark: impl FnOnce() -> StateMark) {
        let key = id.get();
        let slot = self.slot(key);
        if slot.id.load(Acquire) == key {
            if slot.light.load(Relaxed) {
                return;
            }
            let n = slot.n_marks.load(Relaxed) as usize;
            if let Some(w) = slot.marks.get(n) {
                let m = mark();
                w[0].store(m.t_ns, Relaxed);
                w[1].store(u64::from(m.state), Relaxed);
                w[2].store(m.value, Relaxed);
                slot.n_marks.store(n as u32 + 1, Release);
                return;
            }
            let mut o = slot.open.lock();
            if slot.id.load(Relaxed) == key {
                o.push_state(mark(), MAX_STATES - INLINE_MARKS);
            }
            return;
        }
        if self.spilled.load(Relaxed) != 0 {
            if let Some(o) = lock(&self.overflow).get_mut(&key).filter(|o| !o.light) {
                o.push_state(mark(), MAX_STATES);
            }
        }
    }

    /// `n` more finished ProxySteps for the open event `id` (its ProxyOp).
    pub fn count_steps(&self, id: EventId, n: u32) {
        let key = id.get();
        let slot = self.slot(key);
        if slot.id.load(Acquire) == key {
            slot.steps.fetch_add(n, Relaxed);
        } else if self.spilled.load(Relaxed) != 0 {
            if let Some(o) = lock(&self.overflow).get_mut(&key) {
                o.steps_done = o.steps_done.saturating_add(n);
            }
        }
    }

    /// Ends the event `id`: runs `f` on its entry, its state marks in order and its finished
    /// steps (none of either for a light entry); the entry is then forgotten. `f` runs under the entry's lock and must not reach
    /// this table.
    pub fn stop<R>(&self, id: EventId, f: impl FnOnce(&Open, &[StateMark], u32) -> R) -> Option<R> {
        let key = id.get();
        let slot = self.slot(key);
        if slot.id.load(Relaxed) == key {
            let mut o = slot.open.lock();
            if slot.id.load(Relaxed) == key {
                if o.light {
                    let r = f(&o, &[], 0);
                    slot.id.store(0, Relaxed);
                    return Some(r);
                }
                let n = (slot.n_marks.load(Acquire) as usize).min(INLINE_MARKS);
                let mut all = std::mem::take(&mut o.all);
                all.clear();
                all.extend(slot.marks[..n].iter().map(|w| StateMark {
                    t_ns: w[0].load(Relaxed),
                    state: w[1].load(Relaxed) as u32,
                    value: w[2].load(Relaxed),
                }));
                all.extend_from_slice(&o.states);
                let r = f(&o, &all, slot.steps.load(Relaxed));
                o.all = all;
                slot.id.store(0, Relaxed);
                return Some(r);
            }
        }
        if self.spilled.load(Relaxed) == 0 {
            return None;
        }
        let o = lock(&self.overflow).remove(&key)?;
        self.spilled.fetch_sub(1, Relaxed);
        Some(f(&o, &o.states, o.steps_done))
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
        Start { light: false, parent: None, root: id(root), start_ns: 1, descr: EventDescr::ProxyCtrl, payload: &[] }
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
        assert_eq!(t.stop(a, |o, _, _| o.root), Some(id(1)));
        assert_eq!(t.stop(a, |o, _, _| o.root), None);
        assert_eq!(t.with(b, |o| o.root), Some(id(2)));
        t.count_steps(b, 1);
        t.count_steps(a, 1);
        assert_eq!(t.stop(b, |o, _, steps| (o.root, steps)), Some((id(2), 1)));
        assert_eq!((t.len(), t.spilled.load(Ordering::Relaxed)), (0, 0));
        assert_eq!(t.with(id(7), |o| o.root), None);
    }

    #[test]
    fn a_reused_slot_starts_clean_and_marks_keep_their_order() {
        let t = OpenTable::default();
        let mark = |i: usize| StateMark { t_ns: i as u64, state: i as u32, value: 10 * i as u64 };
        for key in [3, 3 + OPEN_SLOTS as u64] {
            // In a slot (inline marks, then the rest) and in the overflow map (all in one list).
            t.start(id(key), Start { payload: &[1, 2, 3], ..start(3) });
        }
        for key in [3, 3 + OPEN_SLOTS as u64] {
            for i in 0..MAX_STATES + 2 {
                t.state(id(key), || mark(i));
            }
            t.count_steps(id(key), 1);
            let got = t.stop(id(key), |o, marks, steps| (marks.to_vec(), o.states_dropped, o.payload.len(), steps));
            let want: Vec<StateMark> = (0..MAX_STATES).map(mark).collect();
            assert_eq!(got, Some((want, 2, 3, 1)), "event {key}");
        }
        let again = id(3 + 2 * OPEN_SLOTS as u64);
        t.start(again, start(9));
        t.state(again, || mark(7));
        assert_eq!(
            t.stop(again, |o, marks, steps| (marks.to_vec(), o.states_dropped, o.payload.len(), o.root, steps)),
            Some((vec![mark(7)], 0, 0, id(9), 0))
        );
        assert_eq!(t.len(), 0);
        // A state for an event that is not open reads no clock.
        t.state(again, || unreachable!("mark made for a stopped event"));
    }

    #[test]
    fn a_light_entry_takes_no_marks_and_a_reused_slot_is_full_again() {
        let t = OpenTable::default();
        let mark = || StateMark { t_ns: 1, state: 2, value: 3 };
        for key in [4, 4 + OPEN_SLOTS as u64] {
            // In a slot, then (the slot still held) in the overflow map.
            t.start(id(key), Start { light: true, parent: Some(id(1)), ..start(1) });
            t.state(id(key), || unreachable!("a light entry reads no clock"));
        }
        for key in [4, 4 + OPEN_SLOTS as u64] {
            assert_eq!(t.stop(id(key), |o, marks, _| (o.light, o.parent, marks.len())), Some((true, Some(id(1)), 0)));
        }
        let again = id(4 + 2 * OPEN_SLOTS as u64);
        t.start(again, start(2));
        t.state(again, mark);
        assert_eq!(t.stop(again, |o, marks, _| (o.light, marks.to_vec())), Some((false, vec![mark()])));
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
