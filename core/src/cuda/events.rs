//! KernelCh events of the device operations: the kernel's channels write their `%globaltimer`
//! (start, stop) into a [`TimerRing`] slot that the launch was given, and the host turns
//! complete records into KernelCh events (parent: the operation's Coll/P2p, which stopped at
//! enqueue), on the device clock mapped to the span clock. A launch of a group's sends and
//! receives runs each connection (peer, direction) on channels of its own, its operations one
//! after another: each operation gets a record per channel of its connection (NCCL's KernelCh
//! per work item), numbered from 0 as the connection's channels are ([`Owner`] lists whose each
//! record is). A launch with more records than a slot holds takes consecutive slots. Records
//! are collected at the next operation, at `CudaComm::flush_events` and when the communicator
//! goes away: nothing on the enqueue path waits for the device.
//!
//! A launch that a CUDA graph captures gets no slot (its records would land in the same slot at
//! every replay, with no host operation to collect them): captured operations have their host
//! events and KernelLaunch, no KernelCh. When the slots a launch needs are taken by launches
//! the device has not run yet, it runs untimed and is counted in `untimed`.

use super::kernels::timer::{ClockMap, Probe, TimerRing, RECALIBRATE_SAMPLES};
use crate::sync::lock;
use occl_events::{EventDescr, EventId, Fanout, StateArgs};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Records a timer slot holds: the channels of a small call's launch, which is what the host
/// queues ahead of the device by the hundreds (a loop of small calls, a model's per-layer
/// gathers); a launch with more takes consecutive slots.
pub(crate) const SLOT_RECORDS: u32 = 16;
/// Slots of the ring: 2048 launches of up to 16 channels can be outstanding at once, 512 KiB of
/// pinned memory.
pub(crate) const RING_SLOTS: u32 = 2048;

/// How often the clock map is measured again: the device and host clocks drift apart by some
/// 10 µs a second, so a map from the communicator's creation alone goes stale; each new
/// measurement also refines the drift rate the map extrapolates with.
const RECALIBRATE_EVERY: Duration = Duration::from_secs(1);
/// How long an operation waits for a recalibration's probe kernel (a device full of other
/// work may not start it): past this the old map stays and the probe is told to finish.
const RECALIBRATE_PATIENCE: Duration = Duration::from_micros(500);

/// The clock map and what renews it.
struct Clock {
    /// The first measurement: the far end of every drift measurement.
    base: ClockMap,
    now: ClockMap,
    probe: Option<Probe>,
    last_try: Instant,
}

/// Consecutive records of a timed launch, one per channel, and the Coll/P2p they report under
/// (none: they are read and dropped).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Owner {
    pub parent: Option<EventId>,
    pub channels: u32,
}

/// The ring's slots a launch was given: `slots` consecutive ones from `first` (a launch with
/// more records than a slot holds runs on into the next), at device address `dev` for the
/// kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Slots {
    pub first: u32,
    pub slots: u32,
    pub dev: u64,
}

/// A timed launch whose records the host has not collected yet.
#[derive(Debug, PartialEq, Eq)]
struct Pending {
    at: Slots,
    records: u32,
    /// Whose the records are, in launch order; their channels add up to `records`.
    owners: Vec<Owner>,
}

struct State {
    /// Per slot, whether it is free.
    free: Vec<bool>,
    /// Where the search for free slots starts: after the last ones taken, as launches end about
    /// in the order they were given slots.
    cursor: usize,
    pending: VecDeque<Pending>,
    untimed: u64,
}

impl State {
    /// The first of `n` consecutive free slots from the cursor on (a run does not wrap past the
    /// last slot), taken: one pass over the slots at most, however full the ring.
    fn take(&mut self, n: usize) -> Option<usize> {
        let len = self.free.len();
        if n == 0 || n > len {
            return None;
        }
        let mut run = 0;
        for i in 0..len + n {
            let s = (self.cursor + i) % len;
            if s == 0 {
                run = 0;
            }
            run = if self.free[s] { run + 1 } else { 0 };
            if run == n {
                let first = s + 1 - n;
                self.free[first..=s].fill(false);
                self.cursor = (s + 1) % len;
                return Some(first);
            }
        }
        None
    }
}

/// The timer ring of one device communicator and the launches waiting on it.
pub(crate) struct DevEvents {
    ring: TimerRing,
    clock: Mutex<Clock>,
    state: Mutex<State>,
    /// `pending.len()`, read without the lock: with nothing pending an operation takes none.
    outstanding: AtomicUsize,
}

impl DevEvents {
    /// `probe` (none in tests) renews `clock` as it ages.
    pub(crate) fn new(ring: TimerRing, clock: ClockMap, probe: Option<Probe>) -> DevEvents {
        let free = vec![true; ring.slots() as usize];
        DevEvents {
            ring,
            clock: Mutex::new(Clock { base: clock, now: clock, probe, last_try: Instant::now() }),
            state: Mutex::new(State { free, cursor: 0, pending: VecDeque::new(), untimed: 0 }),
            outstanding: AtomicUsize::new(0),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }

    pub(crate) fn clock(&self) -> ClockMap {
        lock(&self.clock).now
    }

    /// Measures the clock map again if it is older than [`RECALIBRATE_EVERY`]; never on a
    /// thread whose stream is capturing a graph (the caller checks), and not while another
    /// thread does it.
    pub(crate) fn recalibrate_if_due(&self) {
        let Ok(mut c) = self.clock.try_lock() else { return };
        if c.last_try.elapsed() < RECALIBRATE_EVERY {
            return;
        }
        c.last_try = Instant::now();
        let Some(p) = c.probe.as_mut() else { return };
        match p.measure(&occl_events::unix_nanos, RECALIBRATE_SAMPLES, RECALIBRATE_PATIENCE) {
            Ok(Some(m)) => {
                c.now = ClockMap::with_drift_since(m, &c.base);
                tracing::trace!("occl: device clock offset {} ns ± {}, drift {} ppb", m.offset_ns, m.err_ns, c.now.ppb);
            }
            Ok(None) => tracing::debug!("occl: the clock probe did not answer in time; the old map stays"),
            Err(e) => tracing::debug!("occl: clock probe: {e}"),
        }
    }

    /// Slots for a launch of `records` records (a channel's, or an operation's on a channel):
    /// as many consecutive ones as they fill; `None` when no such run is free (the launch runs
    /// untimed, and is counted).
    pub(crate) fn reserve(&self, records: u32) -> Option<Slots> {
        let n = records.div_ceil(self.ring.records()).max(1);
        let mut s = self.lock();
        match s.take(n as usize) {
            Some(first) => {
                let first = first as u32;
                Some(Slots { first, slots: n, dev: self.ring.device_slot(first) })
            }
            None => {
                s.untimed += 1;
                None
            }
        }
    }

    /// The launch given `at` was enqueued with the records of `owners`: they are awaited.
    pub(crate) fn launched(&self, at: Slots, owners: Vec<Owner>) {
        let records = owners.iter().map(|o| o.channels).sum();
        let mut s = self.lock();
        s.pending.push_back(Pending { at, records, owners });
        self.outstanding.store(s.pending.len(), Relaxed);
    }

    /// The launch given `at` did not happen, or its records were read: the slots are cleared
    /// and free.
    pub(crate) fn release(&self, at: Slots) {
        let slots = at.first..at.first + at.slots;
        for slot in slots.clone() {
            self.ring.clear(slot);
        }
        if let Some(free) = self.lock().free.get_mut(slots.start as usize..slots.end as usize) {
            free.fill(true);
        }
    }

    /// Launches reserved a slot for that found none.
    pub(crate) fn untimed(&self) -> u64 {
        self.lock().untimed
    }

    /// Launches whose records are not collected yet.
    pub(crate) fn outstanding(&self) -> usize {
        self.outstanding.load(Relaxed)
    }

    /// Emits the KernelCh events of every launch whose blocks have all written their records,
    /// and frees their slots; returns how many launches it collected. Launches on different
    /// streams may finish in any order: each is taken as soon as it is complete.
    pub(crate) fn collect(&self, f: &Fanout) -> usize {
        if self.outstanding() == 0 {
            return 0;
        }
        let done: Vec<(Pending, Vec<(u64, u64)>)> = {
            let mut s = self.lock();
            let mut done = Vec::new();
            // Complete launches move out of the queue with their owners; the rest keep their order.
            let mut i = 0;
            while let Some(p) = s.pending.get(i) {
                match self.ring.read(p.at.first, p.records) {
                    Some(r) => done.extend(s.pending.remove(i).map(|p| (p, r))),
                    None => i += 1,
                }
            }
            self.outstanding.store(s.pending.len(), Relaxed);
            done
        };
        let clock = self.clock();
        for (p, records) in &done {
            let mut rest = records.as_slice();
            for o in &p.owners {
                let (mine, after) = rest.split_at((o.channels as usize).min(rest.len()));
                if let Some(parent) = o.parent {
                    emit(f, &clock, parent, mine);
                }
                rest = after;
            }
            self.release(p.at);
        }
        done.len()
    }
}

/// One KernelCh per channel of `parent`, at its device times on the span clock: start (pTimer =
/// the device start), KernelChStop (pTimer = the device stop), stop.
fn emit(f: &Fanout, clock: &ClockMap, parent: EventId, records: &[(u64, u64)]) {
    for (b, &(start, stop)) in records.iter().enumerate() {
        let channel_id = u8::try_from(b).unwrap_or(u8::MAX);
        let d = EventDescr::KernelCh { channel_id, p_timer: start };
        if let Some(id) = f.start_at(Some(parent), &d, clock.to_host(start)) {
            f.state(id, &StateArgs::KernelChStop { p_timer: stop });
            f.stop_at(id, clock.to_host(stop));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use occl_events::{EventMask, EventType, Sink};
    use std::sync::Arc;

    /// A KernelCh as received: id, parent, channel, pTimer, start and stop times.
    type Chan = (u64, Option<u64>, u8, u64, u64, u64);

    /// Keeps the KernelCh events with their times.
    #[derive(Default)]
    struct Chans(Mutex<Vec<Chan>>);

    impl Sink for Chans {
        fn interest(&self) -> EventMask {
            EventMask::of(EventType::KernelCh)
        }
        fn start_at(&self, id: EventId, parent: Option<EventId>, ev: &EventDescr<'_>, t_ns: u64) {
            if let EventDescr::KernelCh { channel_id, p_timer } = *ev {
                self.0.lock().expect("lock").push((id.get(), parent.map(EventId::get), channel_id, p_timer, t_ns, 0));
            }
        }
        fn stop_at(&self, id: EventId, t_ns: u64) {
            let mut v = self.0.lock().expect("lock");
            if let Some(e) = v.iter_mut().find(|e| e.0 == id.get()) {
                e.5 = t_ns;
            }
        }
    }

    #[test]
    fn complete_launches_become_kernel_channels_on_the_host_clock() {
        let f = Fanout::new();
        let sink = Arc::new(Chans::default());
        let _h = f.attach(sink.clone()).expect("attach");
        let parent = f.start(None, &EventDescr::Group).expect("an implied parent is wanted");
        let ev = DevEvents::new(
            TimerRing::in_memory(2, 4).expect("ring"),
            ClockMap { offset_ns: 1_000, err_ns: 5, ..ClockMap::default() },
            None,
        );
        assert_eq!(ev.collect(&f), 0, "nothing pending");
        let a = ev.reserve(2).expect("a slot");
        let b = ev.reserve(1).expect("another");
        assert_eq!(ev.reserve(1), None, "two slots, both taken");
        assert_eq!(ev.untimed(), 1);
        ev.launched(a, one(parent, 2));
        ev.launched(b, one(parent, 1));
        // The second launch (another stream) finishes first; the first has one block done.
        ev.ring.write(b.first, 0, 50, 80);
        ev.ring.write(a.first, 0, 10, 40);
        assert_eq!(ev.collect(&f), 1);
        assert_eq!(ev.outstanding(), 1);
        ev.ring.write(a.first, 1, 12, 45);
        assert_eq!(ev.collect(&f), 1);
        assert_eq!(ev.outstanding(), 0);
        let got: Vec<_> = sink.0.lock().expect("lock").iter().map(|e| (e.1, e.2, e.3, e.4, e.5)).collect();
        let p = Some(parent.get());
        assert_eq!(got, vec![(p, 0, 50, 1_050, 1_080), (p, 0, 10, 1_010, 1_040), (p, 1, 12, 1_012, 1_045)]);
        // Both slots are free again and cleared.
        let c = ev.reserve(1).expect("freed");
        let d = ev.reserve(1).expect("freed");
        assert_ne!(c.first, d.first);
        ev.launched(c, one(parent, 1));
        assert_eq!(ev.collect(&f), 0, "a reused slot starts empty");
        ev.release(d);
    }

    fn one(parent: EventId, channels: u32) -> Vec<Owner> {
        vec![Owner { parent: Some(parent), channels }]
    }

    #[test]
    fn a_launch_of_more_records_than_a_slot_takes_consecutive_free_slots() {
        let ev = DevEvents::new(TimerRing::in_memory(4, 2).expect("ring"), ClockMap::default(), None);
        let a = ev.reserve(2).expect("slot 0");
        let b = ev.reserve(3).expect("two slots");
        assert_eq!((a.first, a.slots, b.first, b.slots), (0, 1, 1, 2));
        // Slot 3 is free, but not two in a row.
        assert_eq!(ev.reserve(4), None);
        assert_eq!(ev.untimed(), 1);
        ev.release(a);
        // Slots 3 and 0 are free but do not follow each other in the ring's memory.
        assert_eq!(ev.reserve(3), None);
        let c = ev.reserve(1).expect("one slot");
        assert_eq!(c.first, 3, "the search starts after the last slots taken");
        ev.release(b);
        let d = ev.reserve(6).expect("slots 0 to 2");
        assert_eq!((d.first, d.slots), (0, 3));
        assert_eq!(ev.reserve(9), None, "more records than the ring holds");
    }

    #[test]
    fn a_free_run_that_starts_before_the_cursor_is_found() {
        let ev = DevEvents::new(TimerRing::in_memory(6, 1).expect("ring"), ClockMap::default(), None);
        let taken: Vec<_> = (0..3).map(|_| ev.reserve(1).expect("a slot")).collect();
        ev.release(taken[1]);
        ev.release(taken[2]);
        // Slots 1 to 5 are free and the search starts at 3: four in a row begin at 1.
        let a = ev.reserve(4).expect("slots 1 to 4");
        assert_eq!((a.first, a.slots), (1, 4));
        assert_eq!(ev.reserve(1).map(|s| s.first), Some(5));
        assert_eq!(ev.reserve(1), None, "every slot taken");
        assert_eq!(ev.untimed(), 1);
    }

    #[test]
    fn a_groups_records_go_to_their_operations_numbered_from_zero() {
        let f = Fanout::new();
        let sink = Arc::new(Chans::default());
        let _h = f.attach(sink.clone()).expect("attach");
        let send = f.start(None, &EventDescr::Group).expect("a parent");
        let recv = f.start(None, &EventDescr::Group).expect("another");
        // Three slots of two records: the launch's five records take slots 0 to 2.
        let ev = DevEvents::new(TimerRing::in_memory(3, 2).expect("ring"), ClockMap::default(), None);
        let at = ev.reserve(5).expect("slots");
        assert_eq!(at.slots, 3);
        // Two channels of a send, one of an operation nobody reports, two of a receive.
        let owners = vec![
            Owner { parent: Some(send), channels: 2 },
            Owner { parent: None, channels: 1 },
            Owner { parent: Some(recv), channels: 2 },
        ];
        ev.launched(at, owners);
        for ch in 0..4 {
            ev.ring.write(at.first, ch, 100 + u64::from(ch), 200 + u64::from(ch));
        }
        assert_eq!(ev.collect(&f), 0, "the launch's last record is not written");
        ev.ring.write(at.first, 4, 104, 204);
        assert_eq!(ev.collect(&f), 1);
        let got: Vec<_> = sink.0.lock().expect("lock").iter().map(|e| (e.1, e.2, e.3)).collect();
        let (s, r) = (Some(send.get()), Some(recv.get()));
        assert_eq!(got, vec![(s, 0, 100), (s, 1, 101), (r, 0, 103), (r, 1, 104)]);
        assert_eq!(ev.outstanding(), 0);
        assert_eq!(ev.reserve(6).map(|a| a.first), Some(0), "every slot free again");
    }
}
