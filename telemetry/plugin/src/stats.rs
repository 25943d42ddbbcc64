//! The plugin's own counters (what NCCL passed that could not be used) and its metrics: the
//! lines `/metrics` serves after the exporters' (Prometheus text format, base units), with each
//! communicator rank's `occl_operation_in_flight_age_seconds` ([`crate::inflight`]).

use crate::comms;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Instant;

/// Why a call was dropped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    /// `startEvent` with a NULL descriptor or a type the version does not have.
    BadDescriptor,
    /// `recordEventState` with a state the version does not have.
    BadState,
    /// A non-NULL context or handle that names no live communicator of this process.
    UnknownHandle,
    /// A ProxyOp created by another process (PXN): its context and parent are not ours.
    ForeignProcess,
    /// A callback panicked (caught; NCCL got success).
    Panic,
}

const REASONS: [(Reason, &str); 5] = [
    (Reason::BadDescriptor, "bad_descriptor"),
    (Reason::BadState, "bad_state"),
    (Reason::UnknownHandle, "unknown_handle"),
    (Reason::ForeignProcess, "foreign_process"),
    (Reason::Panic, "panic"),
];

static DROPPED: [AtomicU64; 5] = [const { AtomicU64::new(0) }; 5];

pub fn count(d: Reason) {
    DROPPED[d as usize].fetch_add(1, Relaxed);
}

pub fn dropped(d: Reason) -> u64 {
    DROPPED[d as usize].load(Relaxed)
}

/// Every counter, by its label.
pub fn all() -> [(&'static str, u64); 5] {
    REASONS.map(|(d, name)| (name, dropped(d)))
}

/// Appends the plugin's metrics.
pub fn render(out: &mut String) {
    out.push_str(
        "# HELP occl_profiler_plugin_dropped_total NCCL profiler calls the plugin could not use, by reason.\n\
         # TYPE occl_profiler_plugin_dropped_total counter\n",
    );
    for (d, name) in REASONS {
        let _ = writeln!(out, "occl_profiler_plugin_dropped_total{{reason=\"{name}\"}} {}", dropped(d));
    }
    out.push_str(
        "# HELP occl_profiler_plugin_communicators Communicators the plugin serves, by the profiler API version NCCL chose.\n\
         # TYPE occl_profiler_plugin_communicators gauge\n",
    );
    for (v, n) in comms::census() {
        let _ = writeln!(out, "occl_profiler_plugin_communicators{{api=\"{v}\"}} {n}");
    }
    out.push_str(
        "# HELP occl_operation_in_flight_age_seconds How long the oldest operation in flight (its Coll or P2p, or a \
         ProxyOp or KernelCh of it, open) has run (0 when idle).\n\
         # TYPE occl_operation_in_flight_age_seconds gauge\n",
    );
    let now = Instant::now();
    comms::each(|c| {
        let age = c.flight.oldest_age_s(now);
        let _ = writeln!(
            out,
            "occl_operation_in_flight_age_seconds{{comm=\"{:016x}\",rank=\"{}\"}} {age:.6}",
            c.hash, c.rank
        );
    });
}
