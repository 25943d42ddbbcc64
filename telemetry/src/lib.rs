//! occl-telemetry: the sinks that consume the profiler event model, and NCCL's plugin ABI.
//!
//! This crate never depends on `occl`. The event model is `occl-events`'; its modules are
//! re-exported here under their own names ([`event`], [`mask`], [`sink`], [`fanout`],
//! [`profiler`], [`activation`], [`files`]), so `occl_telemetry::event::…` names the same items.
//!
//! - [`nccl`]: NCCL C-ABI profiler plugins (`ncclProfiler_v1`…`v6`) loaded by NCCL's rules and
//!   adapted to a [`Profiler`] ([`plugin_from_env`]). The only module with `unsafe` code.
//! - [`flight`]: the flight recorder ([`FlightRecorder`]), the last N operations of each
//!   communicator rank, dumped as JSON on a timeout, an error or SIGUSR1.
//! - [`spans`]: the span collector ([`spans::Telemetry`], a [`Profiler`]) that turns events into
//!   finished spans for the exporters (Prometheus, OpenTelemetry, HTA trace files); the same
//!   collector runs in `libnccl-profiler-occl.so`.
//! - [`metrics`]: a snapshot model of metrics (families, samples, histograms) that every
//!   exposition is written from: Prometheus text 0.0.4, OpenMetrics 1.0, a `prometheus-client`
//!   collector (feature `prometheus-client`), OTLP metrics.
//! - [`ids`]: occl's deterministic trace and span ids (one trace per collective on all ranks).
//! - [`semconv`]: how a span reads in OpenTelemetry and `tracing` (names, attributes, events).
//! - [`otlp`]: the OpenTelemetry exporter (OTLP over HTTP or gRPC, TLS for `https://`, gzip,
//!   standard `OTEL_*` variables), for programs without an OpenTelemetry SDK.
//! - `otel` (feature `otel`): occl's operations as spans of the application's own
//!   OpenTelemetry tracer, children of the caller's context.
//! - `tracing_spans` (feature `tracing-spans`): occl's operations as `tracing` spans under the
//!   caller's current span.
//! - [`trace`]: the HTA trace exporter ([`trace::TraceExporter`], `OCCL_TRACE_DIR`), one
//!   Kineto/Chrome-trace JSON per rank, and `ProfilerStep#N` marks ([`trace::profiler_step`]).
#![deny(unsafe_code)]

use occl_events::idtable;
pub use occl_events::{activation, event, fanout, files, mask, profiler, sink};

pub mod exporters;
pub mod flight;
#[cfg(any(feature = "otel", feature = "tracing-spans"))]
mod held;
pub mod ids;
pub mod metrics;
#[allow(unsafe_code)] // dlopen, the C function tables and their descriptors
pub mod nccl;
#[cfg(feature = "otel")]
pub mod otel;
#[cfg(feature = "otlp")]
pub mod otlp;
pub mod prometheus;
pub mod semconv;
pub mod spans;
#[cfg(test)]
mod test_descr;
#[cfg(feature = "trace")]
pub mod trace;
#[cfg(feature = "tracing-spans")]
pub mod tracing_spans;

pub use flight::{FlightComm, FlightConfig, FlightRecorder, OpInfo, OpState, RootOrPeer};
pub use nccl::plugin_from_env;
pub use occl_events::{
    CeState, CommInfo, EventDescr, EventId, EventMask, EventType, Fanout, GroupApiState, Note, OpTotals,
    ParseMaskError, Profiler, ProxyCtrlState, ProxyOpState, ProxyStepState, Sink, SinkHandle, StateArgs, StepTotals,
    TooManySinks, MAX_SINKS,
};

/// The flight recorder is shared between communicators and threads.
const _: () = {
    const fn send_sync<T: Send + Sync>() {}
    send_sync::<FlightRecorder>();
};
