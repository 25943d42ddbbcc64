//! KernelCh events of the device operations: the kernel's channels write their `%globaltimer`
//! (start, stop) into a [`TimerRing`] slot that the launch was given, and the host turns
//! complete records into KernelCh events (parent: the operation's Coll/P2p, which stopped at
//! enqueue), on the device clock mapped to the span clock. A launch of a group's sends and
//! receives runs each connection (peer, direction) on channels of its own, in call order: its
//! channels' records go to the connection's first operation, numbered from 0 as its channels
//! are, so every Coll/P2p with channels has KernelCh 0..n. Records are collected at the next
//! operation, at `CudaComm::flush_events` and when the communicator goes away: nothing on the
//! enqueue path waits for the device.
//!
//! A launch that a CUDA graph captures gets no slot (its records would land in the same slot at
//! every replay, with no host operation to collect them): captured operations have their host
//! events and KernelLaunch, no KernelCh. When every slot is taken by launches the device has
//! not run yet, a new launch runs untimed and is counted in `untimed`.

use super::kernels::timer::{ClockMap, Probe, TimerRing, RECALIBRATE_SAMPLES};
use occl_events::{EventDescr, EventId, Fanout, StateArgs};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

/// Launches whose records can be outstanding at once.
pub(crate) const RING_SLOTS: u32 = 256;

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

/// Consecutive channels of a timed launch and the Coll/P2p they report under (none: their
/// records are read and dropped).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Owner {
    pub parent: Option<EventId>,
    pub channels: u32,
}

/// A timed launch whose records the host has not collected yet.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Pending {
    slot: u32,
    blocks: u32,
    /// Whose the channels are, in launch order; their channels add up to `blocks`.
    owners: Vec<Owner>,
}

struct State {
    free: Vec<u32>,
    pending: VecDeque<Pending>,
    untimed: u64,
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
        let free = (0..ring.slots()).rev().collect();
        DevEvents {
            ring,
            clock: Mutex::new(Clock { base: clock, now: clock, probe, last_try: Instant::now() }),
            state: Mutex::new(State { free, pending: VecDeque::new(), untimed: 0 }),
            outstanding: AtomicUsize::new(0),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn clock(&self) -> ClockMap {
        self.clock.lock().unwrap_or_else(PoisonError::into_inner).now
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

    /// A slot for a launch of `blocks` blocks, and its device address for the kernel; `None`
    /// when the launch has more blocks than the ring's channels or every slot is outstanding.
    pub(crate) fn reserve(&self, blocks: u32) -> Option<(u32, u64)> {
        let mut s = self.lock();
        let slot = if blocks <= self.ring.channels() { s.free.pop() } else { None };
        match slot {
            Some(slot) => Some((slot, self.ring.device_slot(slot))),
            None => {
                s.untimed += 1;
                None
            }
        }
    }

    /// The launch given `slot` was enqueued with the channels of `owners`: its records are
    /// awaited.
    pub(crate) fn launched(&self, slot: u32, owners: Vec<Owner>) {
        let blocks = owners.iter().map(|o| o.channels).sum();
        let mut s = self.lock();
        s.pending.push_back(Pending { slot, blocks, owners });
        self.outstanding.store(s.pending.len(), Relaxed);
    }

    /// The launch given `slot` did not happen (or has no parent to report under).
    pub(crate) fn release(&self, slot: u32) {
        self.ring.clear(slot);
        self.lock().free.push(slot);
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
            s.pending.retain(|p| match self.ring.read(p.slot, p.blocks) {
                Some(r) => {
                    done.push((p.clone(), r));
                    false
                }
                None => true,
            });
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
            self.release(p.slot);
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
        let (a, _) = ev.reserve(2).expect("a slot");
        let (b, _) = ev.reserve(1).expect("another");
        assert_eq!(ev.reserve(1), None, "two slots, both taken");
        assert_eq!(ev.reserve(5), None, "more blocks than channels");
        assert_eq!(ev.untimed(), 2);
        ev.launched(a, one(parent, 2));
        ev.launched(b, one(parent, 1));
        // The second launch (another stream) finishes first; the first has one block done.
        ev.ring.write(b, 0, 50, 80);
        ev.ring.write(a, 0, 10, 40);
        assert_eq!(ev.collect(&f), 1);
        assert_eq!(ev.outstanding(), 1);
        ev.ring.write(a, 1, 12, 45);
        assert_eq!(ev.collect(&f), 1);
        assert_eq!(ev.outstanding(), 0);
        let got: Vec<_> = sink.0.lock().expect("lock").iter().map(|e| (e.1, e.2, e.3, e.4, e.5)).collect();
        let p = Some(parent.get());
        assert_eq!(got, vec![(p, 0, 50, 1_050, 1_080), (p, 0, 10, 1_010, 1_040), (p, 1, 12, 1_012, 1_045)]);
        // Both slots are free again and cleared.
        let (c, _) = ev.reserve(1).expect("freed");
        let (d, _) = ev.reserve(1).expect("freed");
        assert_ne!(c, d);
        ev.launched(c, one(parent, 1));
        assert_eq!(ev.collect(&f), 0, "a reused slot starts empty");
        ev.release(d);
    }

    fn one(parent: EventId, channels: u32) -> Vec<Owner> {
        vec![Owner { parent: Some(parent), channels }]
    }

    #[test]
    fn a_groups_channels_go_to_their_connections_numbered_from_zero() {
        let f = Fanout::new();
        let sink = Arc::new(Chans::default());
        let _h = f.attach(sink.clone()).expect("attach");
        let send = f.start(None, &EventDescr::Group).expect("a parent");
        let recv = f.start(None, &EventDescr::Group).expect("another");
        let ev = DevEvents::new(TimerRing::in_memory(1, 8).expect("ring"), ClockMap::default(), None);
        let (slot, _) = ev.reserve(5).expect("a slot");
        // Two channels of a send, one of a connection nobody reports, two of a receive.
        let owners = vec![
            Owner { parent: Some(send), channels: 2 },
            Owner { parent: None, channels: 1 },
            Owner { parent: Some(recv), channels: 2 },
        ];
        ev.launched(slot, owners);
        for ch in 0..4 {
            ev.ring.write(slot, ch, 100 + ch as u64, 200 + ch as u64);
        }
        assert_eq!(ev.collect(&f), 0, "the launch's last channel has not written its record");
        ev.ring.write(slot, 4, 104, 204);
        assert_eq!(ev.collect(&f), 1);
        let got: Vec<_> = sink.0.lock().expect("lock").iter().map(|e| (e.1, e.2, e.3)).collect();
        let (s, r) = (Some(send.get()), Some(recv.get()));
        assert_eq!(got, vec![(s, 0, 100), (s, 1, 101), (r, 0, 103), (r, 1, 104)]);
        assert_eq!(ev.outstanding(), 0);
    }
}
