//! The direct route: the core bumps a communicator rank's series itself at the end of each
//! operation, with no event, span or table lookup by hash in between.
//!
//! A [`RankMetrics`] belongs to one communicator rank and lives in the state the core holds
//! under the communicator's operation lock, so its caches are plain fields behind `&mut self`
//! and every series update is a relaxed load and store ([`bump`]) into cache lines of that
//! rank's own [`CommStats`] and [`OpSeries`]. An operation's series is found through a small
//! array indexed by (op, datatype, size class), numbers the caller gives ([`OpSlot`]): each
//! entry holds the series itself, its bus factor and the caller's algorithm/protocol number; a
//! miss (the first operation of a kind, or another algorithm or protocol than the entry's last)
//! names the labels and finds or makes the series in the table once.

use super::comm::{bus_factor, BusFactor, CommStats, Kind, Lost, OpKey, OpSeries, SIZE_CLASSES};
use super::hist::bump;
use super::Exporter;
use crate::event::StepTotals;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Op numbers (`OpSlot::op`) the slot array tells apart: NCCL's `ncclFunc_t` numbers are below.
pub const OPS: usize = 16;
/// Datatype numbers (`OpSlot::dtype`) the slot array tells apart (NCCL's `ncclDataType_t`).
pub const DTYPES: usize = 16;
const CLASSES: usize = SIZE_CLASSES.len();
const SLOTS: usize = OPS * DTYPES * CLASSES;

/// Where an operation counts, in numbers: its op (`ncclFunc_t`), datatype (`ncclDataType_t`)
/// and `choice`, any number below 256 that the caller keeps distinct per (algorithm, protocol).
/// Each number stands for one name (the labels the caller gives on a miss): two ops under one
/// op number would count in one series. The size class is the operation's bytes'. An op or
/// datatype number at or above [`OPS`] or [`DTYPES`] has no entry: its operations are counted
/// the slow way (labels and a table lookup each time).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OpSlot {
    pub op: u8,
    pub dtype: u8,
    pub choice: u8,
}

/// The labels of an operation's series, asked for only when its slot misses. Names as the span
/// route has them: NCCL's (`AllReduce`, `RING`, `SIMPLE`, `ncclFloat32`); point-to-point has no
/// algorithm or protocol.
#[derive(Clone, Copy, Debug)]
pub struct OpLabels {
    pub p2p: bool,
    pub op: &'static str,
    pub algo: &'static str,
    pub proto: &'static str,
    pub dtype: &'static str,
}

/// Steps and bytes one operation moved, by direction (`[send, recv]`), over one transport.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Moved {
    pub steps: [u64; 2],
    pub bytes: [u64; 2],
}

/// The `size_class` index of `bytes` (see [`SIZE_CLASSES`]): classes are ×16 apart from 4 KiB,
/// so it is the bit length's distance from 4 KiB's, in fours.
#[inline]
fn class_of(bytes: u64) -> usize {
    if bytes < 4096 {
        return 0;
    }
    let log2 = 63 - bytes.leading_zeros() as usize;
    ((log2 - 12) / 4 + 1).min(CLASSES - 1)
}

/// One communicator rank's series, bumped by the core (see the module docs). Dropping it hands
/// the rank back to the span route (its counts stay).
pub struct RankMetrics<'e> {
    ex: &'e Exporter,
    stats: &'e CommStats,
    /// By (op, datatype, size class): the series counted there last.
    slots: Box<[Option<Hit<'e>>]>,
    /// The transport counted last and its byte counters.
    transport: Option<(&'static str, &'e [AtomicU64; 2])>,
}

/// A slot's series, for operations of the caller's `choice`.
#[derive(Clone, Copy)]
struct Hit<'e> {
    series: &'e OpSeries,
    bus: BusFactor,
    choice: u8,
}

impl Exporter {
    /// The direct route for communicator rank `m`: `None` when the exporter's limit of
    /// communicator ranks is reached or another [`RankMetrics`] of the rank lives. While it
    /// lives, the exporter declines the rank's spans ([`crate::spans::Exporter::takes`]), so
    /// take it before the rank's sinks are made.
    pub fn rank(&self, m: &crate::spans::CommMeta) -> Option<RankMetrics<'_>> {
        let (_, stats) = self.comms.get_or_insert_with((m.hash, m.rank), || CommStats::new(m))?;
        if stats.direct.swap(true, Relaxed) {
            return None;
        }
        Some(RankMetrics { ex: self, stats, slots: vec![None; SLOTS].into_boxed_slice(), transport: None })
    }
}

impl<'e> RankMetrics<'e> {
    /// One operation that ended (failed ones too): `bytes` as its descriptor counts them (count ×
    /// element size), `duration_ns` from its start to its end.
    #[inline]
    pub fn op(&mut self, slot: OpSlot, labels: impl FnOnce() -> OpLabels, bytes: u64, duration_ns: u64) {
        let class = class_of(bytes);
        let (op, dtype) = (usize::from(slot.op), usize::from(slot.dtype));
        let at = (op < OPS && dtype < DTYPES).then_some((op * DTYPES + dtype) * CLASSES + class);
        let cached = at.and_then(|i| self.slots.get(i).copied().flatten()).filter(|h| h.choice == slot.choice);
        let Some(hit) = cached.or_else(|| self.miss(at, slot.choice, labels(), class)) else { return };
        hit.series.size.observe_owned(bytes);
        hit.series.duration.observe_owned(duration_ns);
        bump(&hit.series.bus_bytes, hit.bus.apply(bytes));
    }

    /// Finds or makes the series of `l` in size class `class` and keeps it in slot `at`.
    #[cold]
    fn miss(&mut self, at: Option<usize>, choice: u8, l: OpLabels, class: usize) -> Option<Hit<'e>> {
        let kind = if l.p2p { Kind::P2p } else { Kind::Coll };
        let (algo, proto) = if l.p2p { ("", "") } else { (l.algo, l.proto) };
        let key = OpKey { op: l.op, algo, proto, dtype: l.dtype, size_class: SIZE_CLASSES[class].1 };
        let stats: &'e CommStats = self.stats;
        let Some((_, series)) = stats.ops[kind as usize].get_or_insert_with(key, OpSeries::new) else {
            self.ex.lose(Lost::SeriesLimit);
            return None;
        };
        let hit = Hit { series, bus: bus_factor(l.op, stats.nranks), choice };
        if let Some(s) = at.and_then(|i| self.slots.get_mut(i)) {
            *s = Some(hit);
        }
        Some(hit)
    }

    /// Steps and bytes an operation moved over `transport` (`shm`, `tcp`): the proxy step and
    /// transport series, as the span route counts them from step sums and transport notes.
    #[inline]
    pub fn moved(&mut self, transport: &'static str, m: &Moved) {
        let s = self.stats;
        let [send, recv] = m.bytes;
        bump(&s.steps[0], m.steps[0]);
        bump(&s.steps[1], m.steps[1]);
        if send | recv == 0 {
            return;
        }
        bump(&s.step_bytes[0], send);
        bump(&s.step_bytes[1], recv);
        // The transport of the last call, recognised by its name's address first.
        match self.transport.filter(|(t, _)| std::ptr::eq(*t, transport) || *t == transport) {
            Some((_, [a, b])) => {
                bump(a, send);
                bump(b, recv);
            }
            None => self.transport_slow(transport, send, recv),
        }
    }

    /// The time an operation's steps waited on peers, in ns by state (in [`StepTotals::STATES`]
    /// order): `occl_proxy_step_wait_seconds_total`. Only waits that blocked are timed, so an
    /// operation that never blocked has nothing to add and need not call this.
    #[cold]
    pub fn waited(&self, wait_ns: &[u64; StepTotals::STATES.len()]) {
        for (c, &ns) in self.stats.step_wait_ns.iter().zip(wait_ns) {
            if ns != 0 {
                bump(c, ns);
            }
        }
    }

    #[cold]
    fn transport_slow(&mut self, transport: &'static str, send: u64, recv: u64) {
        let stats: &'e CommStats = self.stats;
        match stats.transport_bytes.get_or_insert_with(transport, Default::default) {
            Some((_, c)) => {
                self.transport = Some((transport, c));
                bump(&c[0], send);
                bump(&c[1], recv);
            }
            None => self.ex.lose(Lost::SeriesLimit),
        }
    }

    /// An operation failed with an error of `kind` (`occl_operation_errors_total`).
    pub fn failed(&self, op: &'static str, kind: &'static str) {
        match self.stats.errors.get_or_insert_with((op, kind), Default::default) {
            Some((_, c)) => {
                c.fetch_add(1, Relaxed);
            }
            None => self.ex.lose(Lost::SeriesLimit),
        }
    }
}

impl Drop for RankMetrics<'_> {
    fn drop(&mut self) {
        self.stats.direct.store(false, Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::prometheus::comm::size_class;

    #[test]
    fn size_class_indices_are_the_labels() {
        let mut probes = vec![0, 1, 4095, 4096, 65535, 65536, (1 << 20) - 1, 1 << 20, 64 << 20, 256 << 20, u64::MAX];
        probes.extend((0..64).flat_map(|b| [(1u64 << b).saturating_sub(1), 1 << b, (1u64 << b) + 1]));
        for b in probes {
            assert_eq!(SIZE_CLASSES[class_of(b)].1, size_class(b), "{b} bytes");
        }
    }
}
