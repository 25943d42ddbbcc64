//! The consumer side: what an in-process sink (Prometheus, OTLP, trace file, C-ABI plugin
//! adapter) implements. Modelled on `tracing`'s `Layer`: every hook defaults to a no-op, and
//! interest is declared once instead of being asked per event.

use crate::event::{EventDescr, EventId, OpTotals, StateArgs, StepTotals};
use crate::mask::EventMask;

/// A fact the emitter knows that no profiler event carries: occl's own addition, never sent by
/// NCCL. Metrics need them (errors by kind, bytes by transport); strings are `'static` so a sink
/// can keep them as label values without copying.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Note {
    /// An operation of the communicator failed. `func` is NCCL's name ("AllReduce", "Send"),
    /// `kind` the error's kind ("Timeout", "RemoteError", …).
    OpFailed { func: &'static str, kind: &'static str },
    /// One operation moved `bytes` to (`send`) or from one peer over `transport` ("shm", "tcp").
    TransportBytes { transport: &'static str, send: bool, bytes: u64 },
}

/// A consumer of profiler events.
///
/// Hooks run on the emitting thread (application, proxy or network threads), possibly
/// concurrently for different events, so they must be cheap and must not block. A hook must not
/// attach, detach or reload sinks on the fan-out that calls it (that would deadlock).
pub trait Sink: Send + Sync + 'static {
    /// The event types this sink wants. Asked on attach and on reload, never per event; a sink
    /// that changes its mind asks its owner to call `Fanout::reload`.
    fn interest(&self) -> EventMask;

    /// An event of a type in `interest()` started. `parent` is the id of the parent event (NCCL's
    /// `parentObj`), if it has one and it was started through the same fan-out; it may already be
    /// stopped (NCCL starts children after the parent's stop). `ev` lives only for this call.
    fn start(&self, id: EventId, parent: Option<EventId>, ev: &EventDescr<'_>) {
        let _ = (id, parent, ev);
    }

    /// `start` at an explicit time `t_ns` (ns on the span clock, [`crate::clock::unix_nanos`]):
    /// an event measured elsewhere and reported after the fact (a KernelCh from device
    /// timestamps). A sink that keeps no times need not implement it: it defaults to `start`.
    fn start_at(&self, id: EventId, parent: Option<EventId>, ev: &EventDescr<'_>, t_ns: u64) {
        let _ = t_ns;
        self.start(id, parent, ev);
    }

    /// A state change of an event this sink saw start.
    fn state(&self, id: EventId, st: &StateArgs<'_>) {
        let _ = (id, st);
    }

    /// The sums of the steps of the ProxyOp `op` that its emitter did not send as ProxyStep
    /// events, just before the op's stop; only to a sink whose interest has
    /// [`EventMask::STEP_TOTALS`].
    fn step_totals(&self, op: EventId, totals: &StepTotals) {
        let _ = (op, totals);
    }

    /// One whole operation, summed by its emitter, instead of its events; only to a sink whose
    /// interest has [`EventMask::OP_TOTALS`], and only while every attached sink has it.
    fn op_totals(&self, totals: &OpTotals<'_>) {
        let _ = totals;
    }

    /// The end of an event this sink saw start; `id` is not used again.
    fn stop(&self, id: EventId) {
        let _ = id;
    }

    /// `stop` at an explicit time `t_ns` (see [`Sink::start_at`]); defaults to `stop`.
    fn stop_at(&self, id: EventId, t_ns: u64) {
        let _ = t_ns;
        self.stop(id);
    }

    /// Whether `interest()` may change at any moment without a `reload` (an NCCL plugin keeps a
    /// pointer to the global mask and stores into it). The fan-out then asks again each time an
    /// operation captures its mask, instead of only on attach and reload.
    fn dynamic(&self) -> bool {
        false
    }

    /// A [`Note`] from the emitter, whatever the sink's interest (they are rare: at most a few per
    /// operation).
    fn note(&self, note: &Note) {
        let _ = note;
    }

    /// NCCL's `finalize`: the communicator is being destroyed; no event reaches the sink after
    /// this call.
    fn finalize(&self) {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::EventType;
    use std::num::NonZeroU64;

    struct Quiet;
    impl Sink for Quiet {
        fn interest(&self) -> EventMask {
            EventMask::of(EventType::Coll)
        }
    }

    #[test]
    fn defaults_are_no_ops_and_object_safe() {
        let s: Box<dyn Sink> = Box::new(Quiet);
        let id = EventId(NonZeroU64::MIN);
        s.start(id, None, &EventDescr::Group);
        s.state(id, &StateArgs::KernelChStop { p_timer: 1 });
        s.stop(id);
        assert_eq!(s.interest(), EventMask(2));
    }
}
