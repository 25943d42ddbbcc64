//! In-process fan-out: one emitter, several sinks, each called only for the types it asked for.
//!
//! Cost model (STYLE.md §1): a disabled type costs one relaxed load and an AND (`enabled`). The OR
//! of the sinks' masks, each widened by NCCL's implied ancestors, is rebuilt only on attach, detach
//! and reload; sinks whose interest is `dynamic` (NCCL plugins writing the global mask) are asked
//! again when an operation captures its mask (`capture`), never per event.
//!
//! An enabled event keeps no state here: its id carries the set of sinks that saw its start
//! (one bit per slot in the top bits) above a sequence number, so `state` and `stop` go straight
//! to those sinks under the read lock. A slot remembers the first sequence number issued after
//! its sink was attached, so a sink that reuses a detached sink's slot never receives states or
//! stops of events it did not start.
//!
//! The slot table is an immutable snapshot (`Arc`) that attach, detach and reload replace. An
//! operation's emitter takes a [`View`] (one clone of the snapshot) when it starts and sends all
//! the operation's events through it: no lock per callback, which costs two atomic
//! read-modify-writes each. `detach` waits until no view holds the sink any more, so the promise
//! stays: once `detach` returns, the sink is never called again.

use crate::event::{EventDescr, EventId, EventType, OpTotals, StateArgs, StepTotals};
use crate::mask::EventMask;
use crate::sink::{Note, Sink};
use std::cell::Cell;
use std::fmt;
use std::num::NonZeroU64;
use std::sync::atomic::{fence, AtomicU64, Ordering::Acquire, Ordering::Relaxed};
use std::sync::{Arc, PoisonError, RwLock, RwLockReadGuard};
use std::time::Duration;

/// Sinks one fan-out can hold: an event's routes are the top `MAX_SINKS` bits of its id.
pub const MAX_SINKS: usize = 16;

/// Bits of an event id below the routes: its sequence number (2^48 events per fan-out; at ten
/// million events a second that is ten months).
const SEQ_BITS: u32 = 64 - MAX_SINKS as u32;
const SEQ_MASK: u64 = (1 << SEQ_BITS) - 1;

/// Sink serials are process-wide so a handle from another fan-out never matches a slot here.
static NEXT_SERIAL: AtomicU64 = AtomicU64::new(1);

/// Returned by `attach`; give it back to `detach` (a copy detaches nothing twice: slots carry a
/// serial).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SinkHandle {
    slot: usize,
    serial: u64,
}

/// `attach` on a fan-out that already holds `MAX_SINKS` sinks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TooManySinks;

impl fmt::Display for TooManySinks {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "a profiler fan-out holds at most {MAX_SINKS} sinks")
    }
}

impl std::error::Error for TooManySinks {}

#[derive(Clone)]
struct Slot {
    sink: Arc<dyn Sink>,
    /// The sink's interest with ancestors; unused for a dynamic sink.
    mask: EventMask,
    dynamic: bool,
    serial: u64,
    /// Events with a lower sequence number started before this sink was attached.
    since: u64,
    /// One reference per table (current or held by a view) that has this sink: `detach` waits
    /// until it holds the last.
    tables: Arc<()>,
}

impl Slot {
    fn new(sink: Arc<dyn Sink>, serial: u64, since: u64) -> Slot {
        Slot {
            mask: sink.interest().with_ancestors(),
            dynamic: sink.dynamic(),
            sink,
            serial,
            since,
            tables: Arc::new(()),
        }
    }

    /// What this sink wants now, ancestors included.
    fn wants(&self) -> u64 {
        if self.dynamic {
            self.sink.interest().with_ancestors().0
        } else {
            self.mask.0
        }
    }
}

/// Set in `interest` while a dynamic sink is attached: `capture` must ask it.
const DYNAMIC: u64 = 1 << 63;

/// Thread-safe fan-out of profiler events to attached sinks; share it (`Arc`) between
/// communicators and threads.
pub struct Fanout {
    /// OR of the attached sinks' masks (dynamic ones as last captured), plus the `DYNAMIC` flag;
    /// the only thing a disabled check reads.
    interest: AtomicU64,
    /// OR of the static sinks' masks alone.
    fixed: AtomicU64,
    next_seq: AtomicU64,
    /// The slot table, replaced (never changed in place) by attach, detach and reload. Hooks
    /// run under the read lock or through a [`View`] holding the table, and `detach` waits for
    /// both, so once it returns the sink is never called again.
    sinks: RwLock<Arc<Table>>,
}

type Table = Vec<Option<Slot>>;

impl Default for Fanout {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for Fanout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Fanout")
            .field("interest", &self.interest())
            .field("sinks", &self.sink_count())
            .field("events_started", &(self.next_seq.load(Relaxed) - 1))
            .finish()
    }
}

impl Fanout {
    /// An empty fan-out: every type disabled.
    pub fn new() -> Self {
        Fanout {
            interest: AtomicU64::new(0),
            fixed: AtomicU64::new(0),
            next_seq: AtomicU64::new(1),
            sinks: RwLock::new(Arc::new(Vec::new())),
        }
    }

    fn read(&self) -> RwLockReadGuard<'_, Arc<Table>> {
        self.sinks.read().unwrap_or_else(PoisonError::into_inner)
    }

    /// The sinks attached now, for one operation's events: its `start`, `state` and `stop` take
    /// no lock. Drop it when the operation ends: `detach` waits for every view that holds the
    /// sink it detaches (so a thread must not detach while it holds a view of the same fan-out).
    pub fn view(&self) -> View<'_> {
        View { f: self, table: Arc::clone(&self.read()), seqs: Cell::new((0, 0)) }
    }

    fn rebuild(&self, slots: &[Option<Slot>]) {
        let mut fixed = slots.iter().flatten().filter(|s| !s.dynamic).fold(0, |m, s| m | s.mask.0);
        // Operation sums only while every sink takes them: the emitter then sends nothing else
        // for the operations it sums (dynamic sinks, NCCL plugins, never take them).
        if !slots.iter().flatten().all(|s| !s.dynamic && s.mask.wants_op_totals()) {
            fixed &= !EventMask::OP_TOTALS.0;
        }
        let dynamic = slots.iter().flatten().filter(|s| s.dynamic).fold(0, |m, s| m | s.wants() | DYNAMIC);
        self.fixed.store(fixed, Relaxed);
        self.interest.store(fixed | dynamic, Relaxed);
    }

    /// The event types an operation starting now must emit (ancestors included). NCCL captures
    /// the mask when a task is enqueued, so an operation in flight keeps what it started with.
    /// Without dynamic sinks this is one relaxed load.
    #[inline]
    pub fn capture(&self) -> EventMask {
        let v = self.interest.load(Relaxed);
        if v & DYNAMIC == 0 {
            return EventMask(v);
        }
        self.capture_dynamic()
    }

    #[inline(never)]
    fn capture_dynamic(&self) -> EventMask {
        let slots = self.read();
        let dynamic = slots.iter().flatten().filter(|s| s.dynamic).fold(0, |m, s| m | s.wants());
        let m = self.fixed.load(Relaxed) | dynamic;
        self.interest.store(m | DYNAMIC, Relaxed);
        EventMask(m)
    }

    /// Whether any attached sink wants `t`: one relaxed load and an AND. Emitters check it
    /// before building a descriptor.
    #[inline]
    pub fn enabled(&self, t: EventType) -> bool {
        self.interest.load(Relaxed) & EventMask::route_bits(t) != 0
    }

    /// The OR of the attached sinks' masks, ancestors included (dynamic sinks as last captured).
    pub fn interest(&self) -> EventMask {
        EventMask(self.interest.load(Relaxed) & !DYNAMIC)
    }

    /// Attached sinks.
    pub fn sink_count(&self) -> usize {
        self.read().iter().flatten().count()
    }

    /// Attaches `sink` with the mask its `interest()` returns now.
    pub fn attach(&self, sink: Arc<dyn Sink>) -> Result<SinkHandle, TooManySinks> {
        let serial = NEXT_SERIAL.fetch_add(1, Relaxed);
        let mut table = self.sinks.write().unwrap_or_else(PoisonError::into_inner);
        let mut slots = Table::clone(&table);
        let slot = match slots.iter().position(Option::is_none) {
            Some(i) => i,
            None if slots.len() < MAX_SINKS => {
                slots.push(None);
                slots.len() - 1
            }
            None => return Err(TooManySinks),
        };
        // Under the write lock no locked start runs, and a view's ids come from blocks it took
        // before now, on a table without this sink: every id routed here is at least this.
        let since = self.next_seq.load(Relaxed);
        slots[slot] = Some(Slot::new(sink, serial, since));
        self.rebuild(&slots);
        *table = Arc::new(slots);
        Ok(SinkHandle { slot, serial })
    }

    /// Detaches a sink and gives it back; `None` if the handle is not of this fan-out. The sink
    /// gets no further calls, not even stops of its live events (call its `finalize` if it is
    /// done for good).
    pub fn detach(&self, h: SinkHandle) -> Option<Arc<dyn Sink>> {
        let gone = {
            let mut table = self.sinks.write().unwrap_or_else(PoisonError::into_inner);
            let mut slots = Table::clone(&table);
            let entry = slots.get_mut(h.slot)?;
            if entry.as_ref().map(|s| s.serial) != Some(h.serial) {
                return None;
            }
            let gone = entry.take()?;
            self.rebuild(&slots);
            *table = Arc::new(slots);
            gone
        };
        wait_unshared(&gone.tables);
        Some(gone.sink)
    }

    /// Asks every sink for its `interest()` again and rebuilds the OR. Live events keep their
    /// routes.
    pub fn reload(&self) {
        let mut table = self.sinks.write().unwrap_or_else(PoisonError::into_inner);
        let mut slots = Table::clone(&table);
        for s in slots.iter_mut().flatten() {
            s.mask = s.sink.interest().with_ancestors();
        }
        self.rebuild(&slots);
        *table = Arc::new(slots);
    }

    /// Starts an event: issues an id and calls `start` on every sink whose mask has the type.
    /// Returns `None`, calling and allocating nothing, when no sink wants the type; the emitter
    /// then skips the event's states, stop and children (as NCCL does with a NULL handle).
    #[inline]
    pub fn start(&self, parent: Option<EventId>, descr: &EventDescr<'_>) -> Option<EventId> {
        let bit = EventMask::route_bits(descr.event_type());
        if self.interest.load(Relaxed) & bit == 0 {
            return None;
        }
        self.start_slow(parent, descr, bit)
    }

    #[inline(never)] // keep the disabled path small at every call site
    fn start_slow(&self, parent: Option<EventId>, descr: &EventDescr<'_>, bit: u64) -> Option<EventId> {
        start_on(&self.read(), bit, || self.next_seq.fetch_add(1, Relaxed), |s, id| s.start(id, parent, descr))
    }

    /// [`Fanout::start`] at an explicit time (ns on the span clock): an event whose times were
    /// measured elsewhere (a KernelCh's device timestamps); sinks get [`Sink::start_at`].
    pub fn start_at(&self, parent: Option<EventId>, descr: &EventDescr<'_>, t_ns: u64) -> Option<EventId> {
        let bit = EventMask::route_bits(descr.event_type());
        if self.interest.load(Relaxed) & bit == 0 {
            return None;
        }
        start_on(&self.read(), bit, || self.next_seq.fetch_add(1, Relaxed), |s, id| s.start_at(id, parent, descr, t_ns))
    }

    /// [`Fanout::stop`] at an explicit time (see [`Fanout::start_at`]).
    pub fn stop_at(&self, id: EventId, t_ns: u64) {
        for_each_route(&self.read(), id, |s| s.stop_at(id, t_ns));
    }

    /// Records a state of a live event, on the sinks that saw its start.
    pub fn state(&self, id: EventId, st: &StateArgs<'_>) {
        for_each_route(&self.read(), id, |s| s.state(id, st));
    }

    /// Stops a live event on the sinks that saw its start. Each event is stopped once: the
    /// fan-out keeps no per-event state, so it cannot tell a second stop from the first.
    pub fn stop(&self, id: EventId) {
        for_each_route(&self.read(), id, |s| s.stop(id));
    }

    /// [`View::step_totals`] under the read lock.
    pub fn step_totals(&self, op: EventId, totals: &StepTotals) {
        totals_on(&self.read(), op, totals);
    }

    /// Hands a [`Note`] to every attached sink (notes are not typed events: no mask applies).
    pub fn note(&self, note: &Note) {
        for s in self.read().iter().flatten() {
            s.sink.note(note);
        }
    }
}

/// Sequence numbers a view takes from its fan-out at once: one atomic add per operation or so
/// instead of one per event.
const SEQ_BLOCK: u64 = 32;

/// The fan-out's sinks as one operation sees them ([`Fanout::view`]); used by one thread.
pub struct View<'f> {
    f: &'f Fanout,
    table: Arc<Table>,
    /// The rest of this view's block of sequence numbers: (next, end).
    seqs: Cell<(u64, u64)>,
}

impl View<'_> {
    /// [`Fanout::start`] without the lock: the sinks of this view that want the type.
    #[inline]
    pub fn start(&self, parent: Option<EventId>, descr: &EventDescr<'_>) -> Option<EventId> {
        let bit = EventMask::route_bits(descr.event_type());
        if self.f.interest.load(Relaxed) & bit == 0 {
            return None;
        }
        start_on(&self.table, bit, || self.next_seq(), |s, id| s.start(id, parent, descr))
    }

    /// [`Fanout::start_at`] without the lock.
    pub fn start_at(&self, parent: Option<EventId>, descr: &EventDescr<'_>, t_ns: u64) -> Option<EventId> {
        let bit = EventMask::route_bits(descr.event_type());
        if self.f.interest.load(Relaxed) & bit == 0 {
            return None;
        }
        start_on(&self.table, bit, || self.next_seq(), |s, id| s.start_at(id, parent, descr, t_ns))
    }

    /// [`Fanout::stop_at`] without the lock.
    pub fn stop_at(&self, id: EventId, t_ns: u64) {
        for_each_route(&self.table, id, |s| s.stop_at(id, t_ns));
    }

    fn next_seq(&self) -> u64 {
        let (mut next, mut end) = self.seqs.get();
        if next == end {
            next = self.f.next_seq.fetch_add(SEQ_BLOCK, Relaxed);
            end = next + SEQ_BLOCK;
        }
        self.seqs.set((next + 1, end));
        next
    }

    /// [`Fanout::state`] without the lock.
    pub fn state(&self, id: EventId, st: &StateArgs<'_>) {
        for_each_route(&self.table, id, |s| s.state(id, st));
    }

    /// [`Fanout::stop`] without the lock.
    pub fn stop(&self, id: EventId) {
        for_each_route(&self.table, id, |s| s.stop(id));
    }

    /// Hands the step sums of the live ProxyOp `op` to the sinks that saw its start and want
    /// [`EventMask::STEP_TOTALS`].
    pub fn step_totals(&self, op: EventId, totals: &StepTotals) {
        totals_on(&self.table, op, totals);
    }

    /// Hands one summed operation to the sinks of this view that want
    /// [`EventMask::OP_TOTALS`] (every one, when the captured interest has the bit).
    pub fn op_totals(&self, totals: &OpTotals<'_>) {
        for s in self.table.iter().flatten() {
            if s.wants() & EventMask::OP_TOTALS.0 != 0 {
                s.sink.op_totals(totals);
            }
        }
    }

    /// [`Fanout::note`] to this view's sinks.
    pub fn note(&self, note: &Note) {
        for s in self.table.iter().flatten() {
            s.sink.note(note);
        }
    }
}

impl fmt::Debug for View<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("View").field("sinks", &self.table.iter().flatten().count()).finish()
    }
}

/// Issues an id (sequence number from `seq`) and calls `start` (`call`) on every sink of `slots`
/// that wants the type.
fn start_on(
    slots: &[Option<Slot>],
    bit: u64,
    seq: impl FnOnce() -> u64,
    call: impl Fn(&dyn Sink, EventId),
) -> Option<EventId> {
    // Re-check against the table itself: a detach may have raced with the fast check.
    let routes = slots
        .iter()
        .enumerate()
        .filter(|(_, s)| s.as_ref().is_some_and(|s| s.wants() & bit != 0))
        .fold(0u64, |r, (i, _)| r | 1 << i);
    if routes == 0 {
        return None;
    }
    let id = EventId(NonZeroU64::new(routes << SEQ_BITS | (seq() & SEQ_MASK))?);
    for_each_route(slots, id, |s| call(s, id));
    Some(id)
}

/// Step sums to the sinks that saw `op` start and want them.
fn totals_on(slots: &[Option<Slot>], op: EventId, totals: &StepTotals) {
    for_each_slot(slots, op, |s| {
        if s.wants() & EventMask::STEP_TOTALS.0 != 0 {
            s.sink.step_totals(op, totals);
        }
    });
}

/// Returns once no table but the caller's slot refers to a detached sink: every view taken
/// while it was attached is dropped (read-locked calls ended when the table was replaced).
fn wait_unshared(tables: &Arc<()>) {
    let mut spins = 0u32;
    while Arc::strong_count(tables) > 1 {
        spins += 1;
        if spins < 64 {
            std::thread::yield_now();
        } else {
            // An operation in flight holds a view: it ends within its own timeout.
            std::thread::sleep(Duration::from_micros(200));
        }
    }
    // The holders' calls happen before the sink is handed back.
    fence(Acquire);
}

/// Calls `f` on every sink that saw `id` start: its route bits, skipping slots detached or
/// reused since.
fn for_each_route(slots: &[Option<Slot>], id: EventId, mut f: impl FnMut(&dyn Sink)) {
    for_each_slot(slots, id, |s| f(&*s.sink));
}

fn for_each_slot(slots: &[Option<Slot>], id: EventId, mut f: impl FnMut(&Slot)) {
    let (mut routes, seq) = (id.get() >> SEQ_BITS, id.get() & SEQ_MASK);
    while routes != 0 {
        let i = routes.trailing_zeros() as usize;
        routes &= routes - 1;
        if let Some(Some(s)) = slots.get(i) {
            if seq >= s.since {
                f(s);
            }
        }
    }
}

#[cfg(test)]
#[path = "fanout_tests.rs"]
mod tests;
