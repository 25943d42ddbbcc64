//! occl-telemetry: the profiler event model and the sinks that consume it.
//!
//! This crate is a leaf: it never depends on `occl`.
//!
//! - [`event`]: NCCL's profiler event types (`EventType::bit()` = `ncclProfile*`), descriptors
//!   ([`EventDescr`], borrowed, v5/v6 fields), states with NCCL's numbers and their arguments
//!   ([`StateArgs`]).
//! - [`mask`]: [`EventMask`] and the `OCCL_PROFILE_EVENT_MASK` / `NCCL_PROFILE_EVENT_MASK` syntax.
//! - [`sink`]: the [`Sink`] trait (no-op hooks, interest declared once).
//! - [`fanout`]: [`Fanout`], which issues [`EventId`]s and calls only the sinks that want a type;
//!   a disabled type costs one relaxed load and an AND.
//! - [`nccl`]: NCCL C-ABI profiler plugins (`ncclProfiler_v1`…`v6`) loaded by NCCL's rules and
//!   adapted to a [`Profiler`] ([`plugin_from_env`]). The only module with `unsafe` code.
//! - [`flight`]: the flight recorder ([`FlightRecorder`]), the last N operations of each
//!   communicator rank, dumped as JSON on a timeout, an error or SIGUSR1.
//! - [`spans`]: the span collector ([`spans::Telemetry`], a [`Profiler`]) that turns events into
//!   finished spans for the exporters (Prometheus, OpenTelemetry, HTA trace files); the same
//!   collector runs in `libnccl-profiler-occl.so`.
//! - [`otlp`]: the OpenTelemetry exporter (OTLP over HTTP or gRPC, standard `OTEL_*` variables).
//! - [`files`]: creating files in user-named directories without following planted symlinks
//!   (new, owner-only, renamed into place), and size-capped reads of configured paths.
//! - [`trace`]: the HTA trace exporter ([`trace::TraceExporter`], `OCCL_TRACE_DIR`), one
//!   Kineto/Chrome-trace JSON per rank, and `ProfilerStep#N` marks ([`trace::profiler_step`]).
#![deny(unsafe_code)]

pub mod activation;
pub mod event;
pub mod exporters;
pub mod fanout;
pub mod files;
pub mod flight;
mod idtable;
pub mod mask;
#[allow(unsafe_code)] // dlopen, the C function tables and their descriptors
pub mod nccl;
#[cfg(feature = "otlp")]
pub mod otlp;
pub mod profiler;
pub mod prometheus;
pub mod sink;
pub mod spans;
#[cfg(feature = "trace")]
pub mod trace;

pub use event::{
    CeState, EventDescr, EventId, EventType, GroupApiState, OpTotals, ProxyCtrlState, ProxyOpState, ProxyStepState,
    StateArgs, StepTotals,
};
pub use fanout::{Fanout, SinkHandle, TooManySinks, MAX_SINKS};
pub use flight::{FlightComm, FlightConfig, FlightRecorder, OpInfo, OpState, RootOrPeer};
pub use mask::{EventMask, ParseMaskError};
pub use nccl::plugin_from_env;
pub use profiler::{CommInfo, Profiler};
pub use sink::{Note, Sink};

/// `Fanout` is shared between communicators and threads.
const _: () = {
    const fn send_sync<T: Send + Sync>() {}
    send_sync::<Fanout>();
    send_sync::<FlightRecorder>();
};
