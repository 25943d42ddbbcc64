//! Each operation as a `tracing` span (feature `tracing-spans`), so that any subscriber
//! (`tracing-opentelemetry`, `tracing-chrome`, a `fmt` layer with span events) sees occl's
//! collectives inside the application's own spans.
//!
//! A Coll or P2p is a span of target `occl` at level INFO, named by the collective (`AllReduce`,
//! `Broadcast`, `Send`…; `collective` for a name occl does not know), created when the operation
//! starts on the thread that called it, so its parent is that thread's contextual current span,
//! and closed when the operation stops: the subscriber's clock times it. It is never entered
//! (occl does not hold the caller's thread between the two). Fields: `comm` (hash, hex), `rank`,
//! `nranks`, `count`, `dtype`, `bytes`, and `seq`, `algo`, `proto`, `root` for a collective,
//! `peer` for a send or receive. ProxyOps and the other event types are not spans here.
//!
//! Turned on by [`install`]: it registers a collector with this exporter as a process profiler,
//! so communicators created afterwards report to it. A span no subscriber enables costs a
//! callsite check and nothing more.

use crate::event::{EventDescr, EventType};
use crate::held::{key, Held};
use crate::mask::EventMask;
use crate::semconv::datatype_size;
use crate::spans::{CommMeta, Exporter, Span, Started, Telemetry};
use std::sync::Arc;
use tracing::field::Empty;

/// The `tracing` exporter (an [`Exporter`] for [`crate::spans::Telemetry`]).
#[derive(Default)]
pub struct TracingSpans {
    open: Held<tracing::Span>,
}

/// A span named `op`: a callsite per collective, since a `tracing` span's name is static.
fn op_span(op: &str, comm: &CommMeta, count: usize, dtype: &'static str) -> tracing::Span {
    let comm_hex = format_args!("{:016x}", comm.hash);
    let bytes = (count as u64).saturating_mul(datatype_size(dtype));
    macro_rules! by_name {
        ($($name:literal),*) => {
            match op {
                $($name => tracing::info_span!(
                    target: "occl", $name, op = $name, comm = %comm_hex, rank = comm.rank, nranks = comm.nranks,
                    count, dtype, bytes, seq = Empty, algo = Empty, proto = Empty, root = Empty, peer = Empty
                ),)*
                _ => tracing::info_span!(
                    target: "occl", "collective", op, comm = %comm_hex, rank = comm.rank, nranks = comm.nranks,
                    count, dtype, bytes, seq = Empty, algo = Empty, proto = Empty, root = Empty, peer = Empty
                ),
            }
        };
    }
    by_name!(
        "AllReduce",
        "Broadcast",
        "Reduce",
        "AllGather",
        "ReduceScatter",
        "AlltoAll",
        "Gather",
        "Scatter",
        "Send",
        "Recv",
        "SendRecv"
    )
}

impl TracingSpans {
    pub fn new() -> TracingSpans {
        TracingSpans::default()
    }

    /// Operations started and not yet stopped (with a span some subscriber enabled).
    pub fn open_spans(&self) -> usize {
        self.open.count()
    }
}

impl Exporter for TracingSpans {
    fn name(&self) -> &str {
        "tracing"
    }

    fn interest(&self) -> EventMask {
        EventMask::NONE.with(EventType::Coll).with(EventType::P2p)
    }

    fn wants_starts(&self) -> bool {
        true
    }

    fn start(&self, ev: &Started<'_>) {
        let span = match *ev.descr {
            EventDescr::Coll { func, seq_number, count, root, datatype, algo, proto, .. } => {
                let s = op_span(func, ev.comm, count, datatype);
                s.record("seq", seq_number).record("algo", algo).record("proto", proto).record("root", root);
                s
            }
            EventDescr::P2p { func, datatype, count, peer, .. } => {
                let s = op_span(func, ev.comm, count, datatype);
                s.record("peer", peer);
                s
            }
            _ => return,
        };
        if !span.is_disabled() {
            self.open.insert(key(ev.comm, ev.id.get()), span);
        }
    }

    fn span(&self, s: &Span<'_>) {
        // Dropping the last handle closes the span.
        drop(self.open.remove(key(s.comm, s.id.get())));
    }

    fn comm_finalize(&self, comm: &Arc<CommMeta>) {
        // Spans of a communicator destroyed mid-operation close now; its address may be reused.
        drop(self.open.take_comm(comm));
    }
}

/// Registers a collector that makes occl's operations `tracing` spans; communicators created from
/// now on report to it. Returns the exporter.
pub fn install() -> Arc<TracingSpans> {
    let e = Arc::new(TracingSpans::new());
    crate::profiler::register(Arc::new(Telemetry::new(vec![e.clone()])));
    e
}
