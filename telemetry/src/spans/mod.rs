//! Span assembly: the one sink that turns `start`/`state`/`stop` into finished spans, and the
//! exporters (Prometheus, OTLP, trace files) that consume them.
//!
//! Modelled on `tracing-subscriber`'s registry and layers: [`Telemetry`] is a
//! [`Profiler`](occl_events::Profiler) whose per-communicator sink keeps each open event's data
//! (start time, descriptor with its names made `'static`, state marks, its trace root) in a slab
//! addressed by the event id (`open.rs`), and at the stop hands a finished [`Span`] to every
//! [`Exporter`] that asked for its type (an ancestor none asked for keeps only its trace root, a
//! ProxyStep none keeps is only counted in its ProxyOp, and an exporter that asks for
//! [`EventMask::STEP_TOTALS`] gets step sums, from the emitter or summed here from ProxySteps).
//! Exporters never see half an event and never keep their own per-event tables. The same collector
//! runs inside occl and inside `libnccl-profiler-occl.so`, so both feed identical exporters.
//!
//! An exporter that asks ([`Exporter::wants_starts`]) also hears each start, on the thread that
//! started the event: the OpenTelemetry and `tracing` bridges capture the caller's context there.
//!
//! Exporters run on the emitting thread, inside a collective: they must not block (aggregate into
//! atomics, or push into a bounded queue that a thread of their own drains, and count drops).

mod collector;
mod intern;
mod open;
mod spin;

pub use collector::{CommSpans, Telemetry};
pub use intern::intern;
use occl_events::clock;
pub use occl_events::clock::unix_nanos;

use crate::event::{EventDescr, EventId, EventType, OpTotals, ProxyStepState, StepTotals};
use crate::mask::EventMask;
use crate::sink::Note;
use std::sync::Arc;

/// The communicator a span belongs to (NCCL's `init` arguments).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CommMeta {
    /// `config.commName`, if the application gave one.
    pub name: Option<String>,
    /// The communicator's 64-bit id, equal on every rank.
    pub hash: u64,
    pub rank: i32,
    pub nranks: i32,
    pub n_nodes: i32,
}

/// A state change of a span, in order of arrival.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StateMark {
    /// When it arrived, ns since the Unix epoch.
    pub t_ns: u64,
    /// NCCL's numeric state (`StateArgs::state_raw`).
    pub state: u32,
    /// The state's number, where it has one: bytes (`trans_size`) for ProxyOp and ProxyStep,
    /// appended ops for ProxyCtrl's AppendEnd, the GPU stop time for KernelCh; else 0.
    pub value: u64,
}

/// A started event, as [`Exporter::start`] hears it.
#[derive(Clone, Copy, Debug)]
pub struct Started<'a> {
    pub comm: &'a Arc<CommMeta>,
    pub id: EventId,
    pub parent: Option<EventId>,
    /// The outermost ancestor (see [`Span::root`]).
    pub root: EventId,
    /// ns since the Unix epoch.
    pub start_ns: u64,
    pub descr: &'a EventDescr<'static>,
}

/// A finished event.
#[derive(Clone, Debug)]
pub struct Span<'a> {
    pub comm: &'a Arc<CommMeta>,
    pub id: EventId,
    /// The parent event (NCCL's `parentObj`), possibly stopped long before this span.
    pub parent: Option<EventId>,
    /// The outermost ancestor the collector saw: the GroupApi of an API call's tree, the event
    /// itself for one without parent (ProxyCtrl). One trace per root.
    pub root: EventId,
    /// Start and stop, ns since the Unix epoch.
    pub start_ns: u64,
    pub end_ns: u64,
    /// The start descriptor; its names are `'static` (NCCL's tables or [`intern`]), and a
    /// NetPlugin's payload is in `payload` instead.
    pub descr: EventDescr<'static>,
    /// NetPlugin's start payload (at most [`MAX_PAYLOAD`] bytes), empty otherwise.
    pub payload: &'a [u8],
    /// State changes in arrival order (at most [`MAX_STATES`]; later ones are counted in
    /// `states_dropped`).
    pub states: &'a [StateMark],
    pub states_dropped: u32,
    /// For a ProxyOp: its ProxySteps that stopped before it, as events or in step sums (0 when
    /// no exporter asks for either). Fewer than `n_steps` means the op ended early: a failed
    /// operation.
    pub steps_done: u32,
}

impl Span<'_> {
    pub fn event_type(&self) -> EventType {
        self.descr.event_type()
    }

    /// Duration in ns.
    pub fn duration_ns(&self) -> u64 {
        self.end_ns.saturating_sub(self.start_ns)
    }

    /// A ProxyStep as step sums of one step: the time from each state mark to the next (the
    /// last one to the stop), the bytes at SendWait or RecvFlushWait, the direction of its first
    /// state. `None` for another type or a step with no ProxyStep state.
    pub fn as_step_totals(&self) -> Option<StepTotals> {
        if self.event_type() != EventType::ProxyStep {
            return None;
        }
        let mut t = StepTotals::default();
        let (mut dir, mut bytes) = (None, None);
        for (i, m) in self.states.iter().enumerate() {
            let Some(k) = StepTotals::index_of(m.state) else { continue };
            let next = self.states.get(i + 1).map_or(self.end_ns, |n| n.t_ns);
            t.wait_ns[k] = t.wait_ns[k].saturating_add(next.saturating_sub(m.t_ns));
            dir.get_or_insert(k < 3);
            if (m.state == ProxyStepState::SendWait as u32 || m.state == ProxyStepState::RecvFlushWait as u32)
                && bytes.is_none()
            {
                bytes = Some(m.value);
            }
        }
        t.send = dir?;
        t.steps = 1;
        t.bytes = bytes.unwrap_or(0);
        Some(t)
    }
}

/// State marks a span keeps: enough for every state of a ProxyStep or ProxyOp many times over;
/// a long-lived event that changes state without end cannot grow without bound.
pub const MAX_STATES: usize = 64;
/// NetPlugin payload bytes a span keeps (NCCL's socket and IB payloads are 24–40 bytes).
pub const MAX_PAYLOAD: usize = 64;

/// A consumer of finished spans.
pub trait Exporter: Send + Sync + 'static {
    /// For logs ("prometheus", "otlp", "trace").
    fn name(&self) -> &str;

    /// The event types this exporter wants spans of; asked once, when a communicator starts.
    fn interest(&self) -> EventMask;

    /// Whether this exporter takes communicator `comm`'s spans at all (asked once, when it
    /// starts). One that is fed another way (the Prometheus exporter for a rank whose series
    /// occl's core bumps directly) declines, and gets no callback of it.
    fn takes(&self, comm: &CommMeta) -> bool {
        let _ = comm;
        true
    }

    /// A communicator was created (NCCL's `init`).
    fn comm_init(&self, comm: &Arc<CommMeta>) {
        let _ = comm;
    }

    /// Whether this exporter wants the ProxyStep `id` (asked at its start; a sampling exporter
    /// declines most). A step no exporter wants costs no clock read and makes no span; it still
    /// counts in its ProxyOp's `steps_done`.
    fn keeps_step(&self, id: EventId) -> bool {
        let _ = id;
        true
    }

    /// Whether this exporter wants [`Exporter::start`] calls; asked once, when a communicator
    /// starts (a collector none of whose exporters wants them pays nothing at a start).
    fn wants_starts(&self) -> bool {
        false
    }

    /// An event of a type in `interest()` started, on the thread that started it (under occl,
    /// the thread that called the operation): where an exporter captures the caller's context.
    /// Runs on the emitting thread: must not block.
    fn start(&self, ev: &Started<'_>) {
        let _ = ev;
    }

    /// An event of a type in `interest()` finished. Runs on the emitting thread: must not block.
    fn span(&self, span: &Span<'_>);

    /// Step sums of one ProxyOp, for an exporter whose interest has
    /// [`EventMask::STEP_TOTALS`]: those its emitter summed, and one per ProxyStep event
    /// ([`Span::as_step_totals`]). Runs on the emitting thread: must not block.
    fn step_totals(&self, comm: &Arc<CommMeta>, totals: &StepTotals) {
        let _ = (comm, totals);
    }

    /// One whole operation summed by its emitter, instead of its spans, step sums and transport
    /// notes; only while every exporter of the collector has [`EventMask::OP_TOTALS`] in its
    /// interest. Runs on the emitting thread: must not block.
    fn op_totals(&self, comm: &Arc<CommMeta>, totals: &OpTotals<'_>) {
        let _ = (comm, totals);
    }

    /// A [`Note`] from occl's core about this communicator (an operation failed, bytes crossed a
    /// transport): what the span data lacks. Runs on the emitting thread: must not block.
    fn note(&self, comm: &Arc<CommMeta>, note: &Note) {
        let _ = (comm, note);
    }

    /// The communicator is being destroyed (NCCL's `finalize`); no span of it follows.
    fn comm_finalize(&self, comm: &Arc<CommMeta>) {
        let _ = comm;
    }

    /// Appends this exporter's metrics as a snapshot, if it has any: what every exposition of
    /// them is written from (Prometheus text, OpenMetrics, a `prometheus-client` registry, OTLP).
    fn metrics(&self, out: &mut Vec<crate::metrics::Family>) {
        let _ = out;
    }

    /// Appends this exporter's metrics in Prometheus text exposition format 0.0.4 (served by the
    /// RAS HTTP endpoint or the plugin's own port): [`Exporter::metrics`], written out.
    fn render_metrics(&self, out: &mut String) {
        let mut f = Vec::new();
        self.metrics(&mut f);
        crate::metrics::text::write(out, &f, crate::metrics::text::Format::Text);
    }

    /// Writes out what is buffered (process exit, an explicit flush); may block briefly.
    fn flush(&self) {}
}
