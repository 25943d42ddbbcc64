//! Prometheus metrics: counters and histograms in base units (seconds, bytes), kept on atomics,
//! fed two ways (below). Neither takes a lock on an operation's path: a series is found without
//! one and updated with relaxed atomics; only the first sight of a series (a new communicator,
//! op, algorithm, protocol or datatype) takes a mutex to create it.
//!
//! **Enabling.** On by default: the process's exporter ([`process`]) is made when the first
//! communicator is; `OCCL_METRICS=0` (or `false`/`off`) turns it off, and [`enable`], called
//! before the first communicator is created, turns it on whatever the variable says. Under occl,
//! RAS serves it with the rest of the process's collector ([`crate::exporters::global`]) for every
//! process of the node on its port (`OCCL_RAS_ADDR`, default 28028) at `/metrics`, labelled with
//! each process's `pid`, the node's `host` name and the `job` (`OCCL_JOB_ID`, `SLURM_JOB_ID` or
//! `TORCHELASTIC_RUN_ID`), beside RAS's own series (their table is in
//! `ras/src/server/metrics.rs`). An exporter of one's own: [`Exporter::new`], passed to
//! [`crate::spans::Telemetry::new`] (then register that collector and serve its
//! `render_metrics` yourself).
//!
//! **Two routes, one set of series.** Which one a communicator rank takes is decided when its
//! sinks are made (occl's `profile` module):
//!
//! | Case | Route |
//! |---|---|
//! | every peer over shm (threads of one process too), the process's profilers | direct: occl's core bumps a [`RankMetrics`] at each operation's end (`direct.rs`) |
//! | single calls, grouped calls, send/recv, failures on such a rank | direct |
//! | a peer over tcp or ib | spans: every operation's events through the span collector |
//! | a device communicator (`CudaComm`; KernelCh times) | spans (its rank leaves the direct route when it is made) |
//! | profilers handed in (`Config::profilers`), an exporter of one's own | spans |
//! | NCCL with `libnccl-profiler-occl.so` (the plugin) | spans (NCCL's events; ProxyOp and KernelCh children) |
//!
//! On the direct route the core finds the series through a small array of the rank's (op,
//! datatype, size class) without hashing, adds with a relaxed load and store into cache lines
//! only that rank's thread writes, and takes its times from the clock readings its rank record
//! already makes; it counts steps and bytes as the primitives move them, without a clock read.
//! Step waits it times only where a rank waits on a peer: a wait whose first look finds its slot
//! or data not ready starts a stopwatch on the span route's clock (`occl_events::Stopwatch`:
//! the clock's rate read then, only the counter when the wait ends), and the operation adds
//! those times by state at its end ([`RankMetrics::waited`]); a wait that is ready at once
//! reads no clock. So on this route `occl_proxy_step_wait_seconds_total`
//! holds the time ranks blocked: `RecvWait` (data from the peer), `SendPeerWait` (a free slot,
//! the receiver's credit) and `SendWait` (the receiver reading a pointed-to buffer), the states
//! the rank record names for RAS; `SendGPUWait`, `RecvFlushWait` and `RecvGPUWait` stay 0. The
//! span route reads the clock at every step's state change and counts each step from mark to
//! mark, so its waits also hold the rank's own work between marks (copying a slice in, reducing
//! one): the two routes agree on where a rank blocked, not to the nanosecond. Every other series
//! has the same value either way (`tests/tests/prometheus.rs` checks both), and an exporter
//! declines the spans of a rank it is fed directly ([`spans::Exporter::takes`]).
//!
//! **Expositions.** [`spans::Exporter::metrics`] reads every counter once into a snapshot
//! ([`crate::metrics`]; `snapshot.rs` names each family's type and unit) that every format is
//! written from: Prometheus text 0.0.4 (`render_metrics`, what RAS's processes send each other),
//! OpenMetrics 1.0 ([`crate::spans::Telemetry::render_openmetrics`]; RAS's `/metrics` converts the
//! node's merged scrape when the request's `Accept` prefers it, see `occl_ras_proto::openmetrics`),
//! a `prometheus-client` registry (`crate::metrics::client`, feature `prometheus-client`) and
//! OTLP metrics (`crate::otlp::metrics`, `OTEL_METRICS_EXPORTER=otlp`, which turns this exporter
//! on too, unless `OCCL_METRICS=0`).
//!
//! **Labels.** Every series of a communicator rank has `comm` (the communicator's 64-bit hash in
//! hex, equal on all ranks), `comm_name` (only when the application named it) and `rank`. Ops,
//! algorithms, protocols and datatypes are NCCL's spellings (`AllReduce`, `RING`, `SIMPLE`,
//! `ncclFloat32`). No label holds a size, a sequence number or a peer: sizes are histograms, and
//! operation series carry a `size_class` out of six fixed values (`0-4KiB`, `4KiB-64KiB`,
//! `64KiB-1MiB`, `1MiB-16MiB`, `16MiB-256MiB`, `256MiB+`; bytes per rank, lower bound included),
//! so bandwidth and latency can be read per collective and size class.
//!
//! | Metric | Type | Labels (besides comm, rank) | What |
//! |---|---|---|---|
//! | `occl_communicator_info` | gauge | nranks, nnodes | 1 per communicator rank of the process |
//! | `occl_collective_operations_total` | counter | op, algo, proto, dtype, size_class | collectives that ended, failed ones too (Coll spans) |
//! | `occl_collective_bytes_total` | counter | op, algo, proto, dtype, size_class | count × element size, the descriptor's count (per rank for AllGather, ReduceScatter, AlltoAll) |
//! | `occl_collective_message_size_bytes` | histogram | op, algo, proto, dtype, size_class | that size per collective; buckets 1 B … 4 GiB, ×4 |
//! | `occl_collective_duration_seconds` | histogram | op, algo, proto, dtype, size_class | start to end; buckets 1 µs … 100 s, 1-2.5-5 |
//! | `occl_collective_bus_bytes_total` | counter | op, algo, proto, dtype, size_class | bytes × nccl-tests' bus factor, added when the duration is observed |
//! | `occl_p2p_operations_total` | counter | op, dtype, size_class | Send/Recv that ended (P2p spans) |
//! | `occl_p2p_bytes_total` | counter | op, dtype, size_class | count × element size |
//! | `occl_p2p_message_size_bytes` | histogram | op, dtype, size_class | size per operation |
//! | `occl_p2p_duration_seconds` | histogram | op, dtype, size_class | start to end |
//! | `occl_proxy_steps_total` | counter | direction | ProxyStep spans (slices on the wire or through shm) |
//! | `occl_proxy_step_bytes_total` | counter | direction | `transSize` at SendWait / RecvFlushWait |
//! | `occl_proxy_step_wait_seconds_total` | counter | state | time steps spent in SendGPUWait, SendPeerWait, SendWait, RecvWait, RecvFlushWait, RecvGPUWait (direct route: only the waits on a peer that blocked, see above) |
//! | `occl_net_socket_bytes_total` | counter | direction | bytes of socket requests (NetPlugin events, net type SOCK) |
//! | `occl_transport_bytes_total` | counter | transport, direction | bytes per transport (`shm`, `tcp`), reported by occl's core ([`crate::Note`]) |
//! | `occl_operation_errors_total` | counter | op, kind | failed operations by error kind, reported by occl's core |
//! | `occl_metrics_dropped_total` | counter | reason (no comm, rank) | observations lost: `series_limit` (256 series of a kind per communicator rank), `comm_limit` (1,024 communicator ranks) |
//!
//! **Bus bandwidth**, as nccl-tests computes it, averaged over a window and weighted by time:
//! `rate(occl_collective_bus_bytes_total[1m]) / rate(occl_collective_duration_seconds_sum[1m])`
//! (bytes/s; both grow at the same moment, when a collective's duration is known). Algorithm
//! bandwidth: the same with `occl_collective_bytes_total`, for AllReduce, Broadcast and Reduce.
//!
//! **Durations under occl and under NCCL.** In occl a Coll or P2p span stays open while its
//! ProxyOps run, so its own span is the whole operation and it is observed at its stop. Under
//! NCCL (the profiler plugin) it stops once the host has enqueued it and its ProxyOps and KernelCh
//! events stop later: the operation is parked and each child's stop pushes its end out; it is
//! observed when its parking slot is reused (64 per communicator rank), at a scrape once it has
//! been idle for a second, or when the communicator is finalized. Intra-node NCCL work without
//! ProxyOps is timed by its KernelCh events when those are enabled, else by its host enqueue;
//! a call on the copy engines by its CeColl (under its API event, at the device's times).
//!
//! **Operation sums** (the span route). The exporter also takes [`EventMask::OP_TOTALS`]: while it
//! is the only consumer of a communicator's events (no OTLP, trace file, plugin or attached sink
//! beside it), occl's core hands each single shm/threads call as one [`OpTotals`] instead of its
//! ~18 callbacks; tcp legs and grouped calls still come as events. The series are the same either
//! way (`tests/tests/prometheus.rs`).
//!
//! Step wait counts a step's time from each state mark to the next (the last one to the step's
//! stop). The exporter asks for step sums ([`EventMask::STEP_TOTALS`]), not ProxySteps: occl's
//! core sums the steps of its shm legs per ProxyOp (one call per op instead of five per step);
//! its tcp legs' steps and NCCL's arrive as ProxySteps and the collector sums them. Over shm a
//! summed step's SendWait and RecvFlushWait are 0 (posting is delivery; host memory needs no
//! flush), where a ProxyStep event shows the few ns between its two marks. Dashboards get per-rank, per-communicator series; `sum by` and `rate` over them are
//! meaningful (every series is a per-process counter).

mod comm;
mod direct;
mod hist;
mod pending;
mod snapshot;
mod table;
#[cfg(test)]
mod tests;

use crate::event::{EventDescr, EventType, OpTotals, StepTotals};
use crate::mask::EventMask;
use crate::metrics::Family;
use crate::sink::Note;
use crate::spans::{self, CommMeta, Span};
use comm::{elem_size, CommStats, Kind, Lost, OpKey, LOST_REASONS};
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::sync::OnceLock;
use table::Table;

pub use direct::{Moved, OpLabels, OpSlot, RankMetrics, DTYPES, OPS};

/// The series an operation's Coll or P2p descriptor counts in, and its bytes (count × element
/// size, as the series count them).
fn op_key(d: &EventDescr<'static>) -> Option<(Kind, OpKey, u64)> {
    let bytes = |count: usize, dtype: &str| (count as u64).saturating_mul(elem_size(dtype));
    match *d {
        EventDescr::Coll { func, datatype, algo, proto, count, .. } => {
            let b = bytes(count, datatype);
            Some((Kind::Coll, OpKey { op: func, algo, proto, dtype: datatype, size_class: comm::size_class(b) }, b))
        }
        EventDescr::P2p { func, datatype, count, .. } => {
            let b = bytes(count, datatype);
            Some((
                Kind::P2p,
                OpKey { op: func, algo: "", proto: "", dtype: datatype, size_class: comm::size_class(b) },
                b,
            ))
        }
        _ => None,
    }
}

/// The environment variable that turns the exporter off (`0`, `false`, `off`) or on.
pub const ENV: &str = "OCCL_METRICS";

/// Communicator ranks one exporter keeps counters for (they stay after a communicator is
/// destroyed, so a job's totals survive to its last scrape).
pub const MAX_COMMS: usize = 1024;

/// A parked operation (NCCL order, see the module docs) untouched this long is observed at the
/// next scrape.
const IDLE_NS: u64 = 1_000_000_000;

static ENABLED_BY_API: AtomicBool = AtomicBool::new(false);

/// Turns the process's exporter on even where `OCCL_METRICS` says off. Call it before the first
/// communicator is created: the exporter is made once, at that moment.
pub fn enable() {
    ENABLED_BY_API.store(true, Relaxed);
}

/// Whether the process's exporter is on: unless `OCCL_METRICS` (read through `var`) says off,
/// or [`enable`] was called. A value that is neither on nor off is logged and leaves it on.
pub fn enabled(var: impl Fn(&str) -> Option<String>) -> bool {
    if ENABLED_BY_API.load(Relaxed) {
        return true;
    }
    match var(ENV).as_deref().map(str::trim) {
        None | Some("" | "1" | "true" | "on") => true,
        Some("0" | "false" | "off") => false,
        Some(other) => {
            tracing::warn!("occl telemetry: {ENV}={other:?} is not 0 or 1; Prometheus metrics stay on");
            true
        }
    }
}

/// The process's exporter, made on first use if [`enabled`] by the environment: the one the
/// process's collector ([`crate::exporters::global`]) renders and feeds from spans, and whose
/// [`Exporter::rank`] the core bumps directly.
pub fn process() -> Option<&'static Arc<Exporter>> {
    static PROCESS: OnceLock<Option<Arc<Exporter>>> = OnceLock::new();
    PROCESS.get_or_init(|| enabled(|k| std::env::var(k).ok()).then(|| Arc::new(Exporter::new()))).as_ref()
}

/// The Prometheus exporter: a [`spans::Exporter`] that aggregates spans into metrics and renders
/// them in text exposition format.
pub struct Exporter {
    comms: Table<(u64, i32), CommStats>,
    lost: [AtomicU64; LOST_REASONS.len()],
}

impl Default for Exporter {
    fn default() -> Self {
        Self::new()
    }
}

impl Exporter {
    pub fn new() -> Exporter {
        Exporter { comms: Table::new(MAX_COMMS), lost: std::array::from_fn(|_| AtomicU64::new(0)) }
    }

    fn lose(&self, why: Lost) {
        self.lost[why as usize].fetch_add(1, Relaxed);
    }

    #[inline]
    fn comm(&self, m: &CommMeta) -> Option<&CommStats> {
        // Per thread: a thread drives one communicator rank at a time (ranks of one process run
        // on threads of their own), and a shared hint would bounce between their cores.
        thread_local!(static HINT: Cell<usize> = const { Cell::new(0) });
        let c = self.comms.get_or_insert_hinted((m.hash, m.rank), HINT.get(), || CommStats::new(m)).map(|(i, c)| {
            HINT.set(i);
            c
        });
        if c.is_none() {
            self.lose(Lost::CommLimit);
        }
        c
    }
}

impl spans::Exporter for Exporter {
    fn name(&self) -> &str {
        "prometheus"
    }

    fn interest(&self) -> EventMask {
        EventMask::of(EventType::Coll)
            | EventType::P2p
            | EventType::ProxyOp
            | EventType::KernelCh
            | EventType::CeColl
            | EventType::NetPlugin
            | EventMask::STEP_TOTALS
            | EventMask::OP_TOTALS
    }

    fn step_totals(&self, comm: &Arc<CommMeta>, totals: &StepTotals) {
        if let Some(c) = self.comm(comm) {
            c.steps(totals);
        }
    }

    fn comm_init(&self, comm: &Arc<CommMeta>) {
        let _ = self.comm(comm);
    }

    fn takes(&self, comm: &CommMeta) -> bool {
        !self.comms.get(&(comm.hash, comm.rank)).is_some_and(|c| c.direct.load(Relaxed))
    }

    fn span(&self, s: &Span<'_>) {
        let Some(c) = self.comm(s.comm) else { return };
        let lost = |w| self.lose(w);
        match s.descr {
            EventDescr::Coll { .. } | EventDescr::P2p { .. } => {
                if let Some((kind, key, bytes)) = op_key(&s.descr) {
                    c.op(s, kind, key, bytes, &lost)
                }
            }
            EventDescr::ProxyOp { .. } | EventDescr::KernelCh { .. } => c.child(s),
            EventDescr::CeColl { .. } => c.ce_child(s),
            EventDescr::NetPlugin { id, .. } => c.net(id, s.payload),
            _ => {}
        }
    }

    fn op_totals(&self, comm: &Arc<CommMeta>, t: &OpTotals<'_>) {
        let Some(c) = self.comm(comm) else { return };
        let lost = |w| self.lose(w);
        if let Some((kind, key, bytes)) = op_key(&t.descr) {
            c.op_summed(kind, key, bytes, t.end_ns.saturating_sub(t.start_ns), &lost);
        }
        for s in t.steps.iter().filter(|s| s.steps > 0) {
            c.steps(s);
        }
        for &(transport, send, bytes) in t.transport_bytes {
            c.note(&Note::TransportBytes { transport, send, bytes }, &lost);
        }
    }

    fn note(&self, comm: &Arc<CommMeta>, note: &Note) {
        if let Some(c) = self.comm(comm) {
            c.note(note, &|w| self.lose(w));
        }
    }

    fn comm_finalize(&self, comm: &Arc<CommMeta>) {
        if let Some(c) = self.comms.get(&(comm.hash, comm.rank)) {
            c.finish_idle(u64::MAX);
        }
    }

    fn metrics(&self, out: &mut Vec<Family>) {
        let before = spans::unix_nanos().saturating_sub(IDLE_NS);
        let comms: Vec<&CommStats> = self.comms.iter().map(|(_, c)| c).collect();
        for c in &comms {
            c.finish_idle(before);
        }
        snapshot::build(out, &comms, &self.lost);
    }
}
