//! The direct route: the core bumps a communicator rank's series itself at the end of each
//! operation, with no event, span or table lookup by hash in between.
//!
//! A [`RankMetrics`] belongs to one communicator rank and is written only by the thread that
//! runs that rank's operations (the core holds the communicator's operation lock), so every
//! update is a relaxed load and store ([`bump`]) into cache lines of that rank's own
//! [`CommStats`] and [`OpSeries`]. An operation's series is found through a small array indexed
//! by (op, datatype, size class), numbers the caller gives ([`OpSlot`]): each entry holds the
//! series' place in the rank's table and the caller's algorithm/protocol number; a miss (the
//! first operation of a kind, or another algorithm or protocol than the entry's last) names the
//! labels and finds or makes the series in the table once.

use super::comm::{bus_factor, BusFactor, CommStats, Kind, Lost, OpKey, OpSeries, SIZE_CLASSES};
use super::hist::bump;
use super::Exporter;
use crate::event::StepTotals;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::OnceLock;

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

/// One slot: 0 when empty, else `(table index + 1) << 9 | kind << 8 | choice`.
fn pack(idx: usize, kind: Kind, choice: u8) -> u64 {
    ((idx as u64 + 1) << 9) | (kind as u64) << 8 | u64::from(choice)
}

/// One communicator rank's series, bumped by the core (see the module docs). Dropping it hands
/// the rank back to the span route (its counts stay).
pub struct RankMetrics<'e> {
    ex: &'e Exporter,
    stats: &'e CommStats,
    slots: Box<[AtomicU64]>,
    /// The bus factor of each op number, set on its first miss.
    bus: [OnceLock<BusFactor>; OPS],
    /// The transport last counted and its entry in the rank's table.
    transport: OnceLock<(&'static str, usize)>,
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
        Some(RankMetrics {
            ex: self,
            stats,
            slots: (0..SLOTS).map(|_| AtomicU64::new(0)).collect(),
            bus: std::array::from_fn(|_| OnceLock::new()),
            transport: OnceLock::new(),
        })
    }
}

impl RankMetrics<'_> {
    /// One operation that ended (failed ones too): `bytes` as its descriptor counts them (count ×
    /// element size), `duration_ns` from its start to its end.
    #[inline]
    pub fn op(&self, slot: OpSlot, labels: impl FnOnce() -> OpLabels, bytes: u64, duration_ns: u64) {
        let class = class_of(bytes);
        let (op, dtype) = (usize::from(slot.op), usize::from(slot.dtype));
        let entry = (op < OPS && dtype < DTYPES).then(|| &self.slots[(op * DTYPES + dtype) * CLASSES + class]);
        let hit = entry
            .map(|e| e.load(Relaxed))
            .filter(|e| e >> 9 != 0 && e & 0xff == u64::from(slot.choice))
            .and_then(|e| self.series(e))
            .zip(self.bus.get(op).and_then(OnceLock::get).copied());
        let Some((series, bus)) = hit.or_else(|| self.miss(entry, slot, labels(), class)) else { return };
        series.size.observe_owned(bytes);
        series.duration.observe_owned(duration_ns);
        bump(&series.bus_bytes, bus.apply(bytes));
    }

    #[inline]
    fn series(&self, e: u64) -> Option<&OpSeries> {
        let kind = if (e >> 8) & 1 == Kind::P2p as u64 { Kind::P2p } else { Kind::Coll };
        self.stats.ops[kind as usize].at((e >> 9) as usize - 1)
    }

    /// Finds or makes the series of `l` in size class `class` and keeps it in `entry`.
    #[cold]
    fn miss(
        &self,
        entry: Option<&AtomicU64>,
        slot: OpSlot,
        l: OpLabels,
        class: usize,
    ) -> Option<(&OpSeries, BusFactor)> {
        let kind = if l.p2p { Kind::P2p } else { Kind::Coll };
        let (algo, proto) = if l.p2p { ("", "") } else { (l.algo, l.proto) };
        let key = OpKey { op: l.op, algo, proto, dtype: l.dtype, size_class: SIZE_CLASSES[class].1 };
        let Some((idx, series)) = self.stats.ops[kind as usize].get_or_insert_with(key, OpSeries::new) else {
            self.ex.lose(Lost::SeriesLimit);
            return None;
        };
        let factor = bus_factor(l.op, self.stats.nranks);
        if let (Some(e), Some(b)) = (entry, self.bus.get(usize::from(slot.op))) {
            b.get_or_init(|| factor);
            e.store(pack(idx, kind, slot.choice), Relaxed);
        }
        Some((series, factor))
    }

    /// Steps and bytes an operation moved over `transport` (`shm`, `tcp`): the proxy step and
    /// transport series, as the span route counts them from step sums and transport notes.
    #[inline]
    pub fn moved(&self, transport: &'static str, m: &Moved) {
        let s = self.stats;
        let [send, recv] = m.bytes;
        bump(&s.steps[0], m.steps[0]);
        bump(&s.steps[1], m.steps[1]);
        if send | recv == 0 {
            return;
        }
        bump(&s.step_bytes[0], send);
        bump(&s.step_bytes[1], recv);
        // The transport of the first call, recognised by its name's address first.
        let cached = self.transport.get().filter(|(t, _)| std::ptr::eq(*t, transport) || *t == transport);
        match cached.and_then(|(_, i)| s.transport_bytes.at(*i)) {
            Some([a, b]) => {
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
    fn transport_slow(&self, transport: &'static str, send: u64, recv: u64) {
        match self.stats.transport_bytes.get_or_insert_with(transport, Default::default) {
            Some((i, [a, b])) => {
                let _ = self.transport.set((transport, i));
                bump(a, send);
                bump(b, recv);
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
