//! What the exporter keeps per communicator rank, and how each finished span lands in it: every
//! update is a relaxed atomic add on a series that, after its first sight, is found without a
//! lock.

use super::hist::{Histogram, Snapshot, DURATION_NS, SIZE_BYTES};
use super::pending::{Done, Pending};
use super::table::Table;
use crate::event::StepTotals;
use crate::sink::Note;
use crate::spans::{CommMeta, Span};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};

/// Series of one kind a communicator rank may have (op × algo × proto × dtype combinations).
pub(crate) const MAX_SERIES: usize = 256;
/// Transports and (op, error kind) pairs per communicator rank.
const MAX_SMALL: usize = 64;

/// What an operation series is labelled by. Names are `'static` (NCCL's tables or the
/// collector's interned strings); p2p has no algorithm or protocol ("").
// Equality is the derived Hash's and Ord's (the names' contents); `eq` only looks at the
// pointers first, as the same series almost always comes with the same strings.
#[allow(clippy::derived_hash_with_manual_eq)]
#[derive(Clone, Copy, Debug, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct OpKey {
    pub op: &'static str,
    pub algo: &'static str,
    pub proto: &'static str,
    pub dtype: &'static str,
    /// [`size_class`] of the operation's bytes.
    pub size_class: &'static str,
}

/// Remembers where a table lookup found its key (written only when it moved: the common case
/// reads the hint and writes nothing).
fn keep(hint: &AtomicUsize, i: usize) {
    if hint.load(Relaxed) != i {
        hint.store(i, Relaxed);
    }
}

/// Content equality, deciding at once for the same string.
fn same(a: &str, b: &str) -> bool {
    (std::ptr::eq(a.as_ptr(), b.as_ptr()) && a.len() == b.len()) || a == b
}

impl PartialEq for OpKey {
    fn eq(&self, o: &Self) -> bool {
        same(self.op, o.op)
            && same(self.algo, o.algo)
            && same(self.proto, o.proto)
            && same(self.dtype, o.dtype)
            && same(self.size_class, o.size_class)
    }
}

/// Upper bounds (exclusive) of the size classes and their label values; the last class is open.
/// Six fixed values, ×16 apart, so dashboards can show bandwidth and latency per collective and
/// size without a size in any label (the exact sizes are the message-size histogram's).
pub(crate) const SIZE_CLASSES: [(u64, &str); 6] = [
    (4 << 10, "0-4KiB"),
    (64 << 10, "4KiB-64KiB"),
    (1 << 20, "64KiB-1MiB"),
    (16 << 20, "1MiB-16MiB"),
    (256 << 20, "16MiB-256MiB"),
    (u64::MAX, "256MiB+"),
];

/// The `size_class` label of an operation of `bytes` (per rank, as the descriptor counts).
pub(crate) fn size_class(bytes: u64) -> &'static str {
    SIZE_CLASSES.iter().find(|(below, _)| bytes < *below).map_or(SIZE_CLASSES[5].1, |(_, name)| name)
}

/// Counters of one (op, algo, proto, dtype) of a communicator rank. Its operation and byte
/// totals are the size histogram's count and sum (two fewer atomic adds per operation). Aligned
/// to a cache line: the series of two ranks never share one.
#[repr(align(64))]
pub(crate) struct OpSeries {
    pub bus_bytes: AtomicU64,
    pub size: Histogram<{ SIZE_BYTES.len() }>,
    pub duration: Histogram<{ DURATION_NS.len() }>,
}

impl OpSeries {
    pub(crate) fn new() -> Self {
        OpSeries {
            bus_bytes: AtomicU64::new(0),
            size: Histogram::new(&SIZE_BYTES),
            duration: Histogram::new(&DURATION_NS),
        }
    }

    fn complete(&self, duration_ns: u64, bus: u64) {
        self.duration.observe(duration_ns);
        self.bus_bytes.fetch_add(bus, Relaxed);
    }

    /// Operations counted and their bytes.
    pub(crate) fn totals(&self) -> (u64, u64) {
        self.size.totals()
    }

    pub(crate) fn size_snapshot(&self) -> Snapshot<'static> {
        self.size.snapshot()
    }

    /// Durations in ns.
    pub(crate) fn duration_snapshot(&self) -> Snapshot<'static> {
        self.duration.snapshot()
    }

    pub(crate) fn bus_bytes(&self) -> u64 {
        self.bus_bytes.load(Relaxed)
    }
}

/// Collectives (Coll spans) or point-to-point operations (P2p spans).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Coll = 0,
    P2p = 1,
}

/// ProxyStep states in the order their counters are kept (`StepTotals::STATES`): NCCL's numbers
/// and ABI names.
pub(crate) const STEP_STATES: [(u32, &str); 6] = [
    (8, "SendGPUWait"),
    (20, "SendPeerWait"),
    (9, "SendWait"),
    (10, "RecvWait"),
    (11, "RecvFlushWait"),
    (12, "RecvGPUWait"),
];

const _: () = {
    let mut i = 0;
    while i < STEP_STATES.len() {
        assert!(STEP_STATES[i].0 == StepTotals::STATES[i] as u32);
        i += 1;
    }
};

/// `direction` label values, by index.
pub(crate) const DIRECTIONS: [&str; 2] = ["send", "recv"];

/// Why an observation was lost (`occl_metrics_dropped_total{reason}`).
#[derive(Clone, Copy, Debug)]
pub(crate) enum Lost {
    /// A communicator rank reached its limit of series of a kind.
    SeriesLimit = 0,
    /// The exporter reached its limit of communicator ranks.
    CommLimit = 1,
}

pub(crate) const LOST_REASONS: [&str; 2] = ["series_limit", "comm_limit"];

/// One communicator rank's counters (cache-line aligned, as [`OpSeries`]).
#[repr(align(64))]
pub(crate) struct CommStats {
    pub hash: u64,
    pub rank: i32,
    pub name: Option<String>,
    pub nranks: i32,
    pub n_nodes: i32,
    pub ops: [Table<OpKey, OpSeries>; 2],
    pub step_wait_ns: [AtomicU64; STEP_STATES.len()],
    pub steps: [AtomicU64; 2],
    pub step_bytes: [AtomicU64; 2],
    pub socket_bytes: [AtomicU64; 2],
    pub transport_bytes: Table<&'static str, [AtomicU64; 2]>,
    pub errors: Table<(&'static str, &'static str), AtomicU64>,
    /// Where `ops` (by kind) and `transport_bytes` found their last key.
    hints: [AtomicUsize; 3],
    pending: Pending,
    /// The parent of the ProxyOp or KernelCh that stopped last: equal to an operation's id at its
    /// stop when its children ran inside it (occl), so its own span is its whole duration.
    last_child_parent: AtomicU64,
    /// The core bumps this rank's series directly (`direct.rs`): the exporter takes no spans of
    /// it. Set while a [`super::RankMetrics`] of it lives.
    pub direct: AtomicBool,
}

fn counters<const N: usize>() -> [AtomicU64; N] {
    std::array::from_fn(|_| AtomicU64::new(0))
}

/// NCCL's element size for a datatype name (0 when unknown: its bytes are not counted).
pub(crate) fn elem_size(dtype: &str) -> u64 {
    occl_types::DataType::from_nccl_name(dtype).map_or(0, |d| d.size() as u64)
}

/// Bytes over the "bus" for one rank's part in an operation of `bytes` (count × element size, as
/// the descriptor counts: per rank for AllGather, ReduceScatter and AlltoAll), with nccl-tests'
/// factors (PERFORMANCE.md): busbw = algbw × factor where algbw = S / t and S is nccl-tests' size.
/// AllReduce: S = bytes, 2(n-1)/n. AllGather, ReduceScatter, AlltoAll, Gather, Scatter:
/// S = bytes × n, (n-1)/n. Broadcast, Reduce, Send, Recv: 1.
pub(crate) fn bus_bytes(op: &str, bytes: u64, nranks: i32) -> u64 {
    bus_factor(op, nranks).apply(bytes)
}

/// nccl-tests' bus factor of an op on a communicator (see [`bus_bytes`]): bytes × `mul` / `div`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct BusFactor {
    mul: u64,
    div: u64,
}

pub(crate) fn bus_factor(op: &str, nranks: i32) -> BusFactor {
    let n = u64::from(nranks.max(1).unsigned_abs());
    match op {
        "AllReduce" => BusFactor { mul: 2 * (n - 1), div: n },
        "AllGather" | "ReduceScatter" | "AlltoAll" | "Gather" | "Scatter" => BusFactor { mul: n - 1, div: 1 },
        _ => BusFactor { mul: 1, div: 1 },
    }
}

impl BusFactor {
    /// `bytes` × the factor, rounded down; saturating.
    #[inline]
    pub(crate) fn apply(self, bytes: u64) -> u64 {
        match bytes.checked_mul(self.mul) {
            Some(x) if self.div == 1 => x,
            Some(x) => x / self.div,
            None => u64::try_from(u128::from(bytes) * u128::from(self.mul) / u128::from(self.div)).unwrap_or(u64::MAX),
        }
    }
}

impl CommStats {
    pub(crate) fn new(m: &CommMeta) -> Self {
        CommStats {
            hash: m.hash,
            rank: m.rank,
            name: m.name.clone(),
            nranks: m.nranks,
            n_nodes: m.n_nodes,
            ops: [Table::new(MAX_SERIES), Table::new(MAX_SERIES)],
            step_wait_ns: counters(),
            steps: counters(),
            step_bytes: counters(),
            socket_bytes: counters(),
            transport_bytes: Table::new(MAX_SMALL),
            errors: Table::new(MAX_SMALL),
            hints: std::array::from_fn(|_| AtomicUsize::new(0)),
            pending: Pending::new(),
            last_child_parent: AtomicU64::new(0),
            direct: AtomicBool::new(false),
        }
    }

    /// The operation series of `kind`, with their labels.
    pub(crate) fn op_series(&self, kind: Kind) -> impl Iterator<Item = (OpKey, &OpSeries)> {
        self.ops[kind as usize].iter().map(|(k, s)| (*k, s))
    }

    /// Proxy steps completed, by direction (send, recv).
    pub(crate) fn steps_done(&self) -> &[AtomicU64; 2] {
        &self.steps
    }

    /// Bytes proxy steps moved, by direction.
    pub(crate) fn step_bytes(&self) -> &[AtomicU64; 2] {
        &self.step_bytes
    }

    /// ns proxy steps spent in each of [`STEP_STATES`].
    pub(crate) fn step_wait_ns(&self) -> &[AtomicU64; STEP_STATES.len()] {
        &self.step_wait_ns
    }

    /// Bytes of socket requests, by direction.
    pub(crate) fn socket_bytes(&self) -> &[AtomicU64; 2] {
        &self.socket_bytes
    }

    /// A Coll or P2p span: counted at once; its duration now if its children ran inside it,
    /// else once they have stopped too.
    pub(crate) fn op(&self, s: &Span<'_>, kind: Kind, key: OpKey, bytes: u64, lost: &dyn Fn(Lost)) {
        let Some((idx, series, bus)) = self.count_op(kind, key, bytes, lost) else { return };
        let id = s.id.get();
        if self.last_child_parent.load(Relaxed) == id {
            series.complete(s.duration_ns(), bus);
            return;
        }
        let op = Done { start: s.start_ns, end: s.end_ns, series: (kind as u64) << 32 | idx as u64, bus };
        if !self.pending.park(id, op, |d| self.finish(d)) {
            series.complete(s.duration_ns(), bus);
        } else if let Some(api) = s.parent {
            self.pending.alias(api.get(), id);
        }
    }

    /// An operation its emitter summed ([`crate::OpTotals`]): counted and observed at once.
    pub(crate) fn op_summed(&self, kind: Kind, key: OpKey, bytes: u64, duration_ns: u64, lost: &dyn Fn(Lost)) {
        if let Some((_, series, bus)) = self.count_op(kind, key, bytes, lost) {
            series.complete(duration_ns, bus);
        }
    }

    /// Counts one operation of `bytes` in its series; returns the series and its bus bytes.
    fn count_op(&self, kind: Kind, key: OpKey, bytes: u64, lost: &dyn Fn(Lost)) -> Option<(usize, &OpSeries, u64)> {
        let hint = &self.hints[kind as usize];
        let Some((idx, series)) = self.ops[kind as usize].get_or_insert_hinted(key, hint.load(Relaxed), OpSeries::new)
        else {
            lost(Lost::SeriesLimit);
            return None;
        };
        keep(hint, idx);
        series.size.observe(bytes);
        Some((idx, series, bus_bytes(key.op, bytes, self.nranks)))
    }

    fn finish(&self, d: Done) {
        let kind = if d.series >> 32 == Kind::P2p as u64 { Kind::P2p } else { Kind::Coll };
        if let Some(series) = self.ops[kind as usize].at((d.series & 0xffff_ffff) as usize) {
            series.complete(d.end.saturating_sub(d.start), d.bus);
        }
    }

    /// Observes parked operations untouched since `before` (span clock), all for `u64::MAX`.
    pub(crate) fn finish_idle(&self, before: u64) {
        self.pending.finish_idle(before, |d| self.finish(d));
    }

    /// A ProxyOp or KernelCh stopped: its operation is done no earlier.
    pub(crate) fn child(&self, s: &Span<'_>) {
        if let Some(p) = s.parent {
            self.last_child_parent.store(p.get(), Relaxed);
            self.pending.extend(p.get(), s.end_ns);
        }
    }

    /// A CeColl stopped: the operation under the same API event is done no earlier.
    pub(crate) fn ce_child(&self, s: &Span<'_>) {
        if let Some(api) = s.parent {
            self.pending.extend_via(api.get(), s.end_ns);
        }
    }

    /// Step sums of a ProxyOp (or one ProxyStep): time in each state and the bytes moved.
    pub(crate) fn steps(&self, t: &StepTotals) {
        for (c, ns) in self.step_wait_ns.iter().zip(t.wait_ns) {
            if ns != 0 {
                c.fetch_add(ns, Relaxed);
            }
        }
        let d = usize::from(!t.send);
        self.steps[d].fetch_add(u64::from(t.steps), Relaxed);
        self.step_bytes[d].fetch_add(t.bytes, Relaxed);
    }

    /// A NetPlugin request: socket payloads (net type SOCK) carry the direction and length.
    pub(crate) fn net(&self, id: i64, payload: &[u8]) {
        const SOCK: i64 = 2;
        if (id >> 16) & 0xffff != SOCK || payload.len() < 24 || payload[0] != 1 {
            return;
        }
        let word = |r: std::ops::Range<usize>| payload.get(r).and_then(|b| <[u8; 8]>::try_from(b).ok());
        let op = payload.get(12..16).and_then(|b| <[u8; 4]>::try_from(b).ok()).map(i32::from_ne_bytes);
        let (Some(op), Some(len)) = (op, word(16..24).map(u64::from_ne_bytes)) else { return };
        if let Some(c) = self.socket_bytes.get(usize::from(op != 0)) {
            c.fetch_add(len, Relaxed);
        }
    }

    pub(crate) fn note(&self, n: &Note, lost: &dyn Fn(Lost)) {
        match *n {
            Note::OpFailed { func, kind } => match self.errors.get_or_insert_with((func, kind), Default::default) {
                Some((_, c)) => {
                    c.fetch_add(1, Relaxed);
                }
                None => lost(Lost::SeriesLimit),
            },
            Note::TransportBytes { transport, send, bytes } => {
                match self.transport_bytes.get_or_insert_hinted(transport, self.hints[2].load(Relaxed), counters) {
                    Some((i, c)) => {
                        keep(&self.hints[2], i);
                        c[usize::from(!send)].fetch_add(bytes, Relaxed);
                    }
                    None => lost(Lost::SeriesLimit),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_classes_split_at_their_bounds() {
        assert_eq!(size_class(0), "0-4KiB");
        assert_eq!(size_class(4095), "0-4KiB");
        assert_eq!(size_class(4096), "4KiB-64KiB");
        assert_eq!(size_class((1 << 20) - 1), "64KiB-1MiB");
        assert_eq!(size_class(1 << 20), "1MiB-16MiB");
        assert_eq!(size_class(64 << 20), "16MiB-256MiB");
        assert_eq!(size_class(256 << 20), "256MiB+");
        assert_eq!(size_class(u64::MAX), "256MiB+");
    }

    #[test]
    fn op_keys_are_equal_by_content() {
        let k = OpKey { op: "AllReduce", algo: "RING", proto: "LL", dtype: "ncclFloat32", size_class: "0-4KiB" };
        // The same name at another address (as an interned copy would be).
        let other = OpKey { op: Box::leak(String::from("AllReduce").into_boxed_str()), ..k };
        assert!(!std::ptr::eq(other.op.as_ptr(), k.op.as_ptr()));
        assert_eq!(other, k);
        assert_ne!(OpKey { proto: "SIMPLE", ..k }, k);
        assert_ne!(OpKey { size_class: "4KiB-64KiB", ..k }, k);
    }

    #[test]
    fn bus_factors_are_nccl_tests() {
        // 4 ranks, 1 MiB per rank's descriptor count.
        let b = 1 << 20;
        assert_eq!(bus_bytes("AllReduce", b, 4), b * 3 / 2);
        assert_eq!(bus_bytes("AllGather", b, 4), b * 3);
        assert_eq!(bus_bytes("ReduceScatter", b, 4), b * 3);
        assert_eq!(bus_bytes("AlltoAll", b, 4), b * 3);
        assert_eq!(bus_bytes("Broadcast", b, 4), b);
        assert_eq!(bus_bytes("Send", b, 4), b);
        assert_eq!(bus_bytes("AllReduce", b, 1), 0);
        assert_eq!(bus_bytes("AllReduce", u64::MAX, 2), u64::MAX);
        assert_eq!(elem_size("ncclBfloat16"), 2);
        assert_eq!(elem_size("ncclFloat64"), 8);
        assert_eq!(elem_size("bogus"), 0);
    }
}
