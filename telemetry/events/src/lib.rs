//! occl-events: NCCL's profiler event model and the fan-out to sinks, with no dependency beyond
//! `libc`. `occl` links it on the operation path; the sinks, exporters and the NCCL plugin
//! loader build on it in `occl-telemetry`.
//!
//! - [`event`]: NCCL's profiler event types (`EventType::bit()` = `ncclProfile*`), descriptors
//!   ([`EventDescr`], borrowed, v5/v6 fields), states with NCCL's numbers and their arguments
//!   ([`StateArgs`]).
//! - [`mask`]: [`EventMask`] and the `OCCL_PROFILE_EVENT_MASK` / `NCCL_PROFILE_EVENT_MASK` syntax.
//! - [`activation`]: the process's activation mask (`NCCL_PROFILE_EVENT_MASK` read once).
//! - [`sink`]: the [`Sink`] trait (no-op hooks, interest declared once).
//! - [`fanout`]: [`Fanout`], which issues [`EventId`]s and calls only the sinks that want a type;
//!   a disabled type costs one relaxed load and an AND.
//! - [`profiler`]: [`Profiler`], what makes a sink per communicator, and the process's registry.
//! - [`idtable`]: per-event state of an adapter, keyed by [`EventId`].
//! - [`clock`]: the span clock ([`unix_nanos`]) that event times are on.
//! - [`files`]: creating files in user-named directories without following planted symlinks
//!   (new, owner-only, renamed into place), and size-capped reads of configured paths.
#![deny(unsafe_code)]

pub mod activation;
pub mod clock;
pub mod event;
pub mod fanout;
pub mod files;
pub mod idtable;
pub mod mask;
pub mod profiler;
pub mod sink;

pub use clock::{unix_nanos, Stopwatch};
pub use event::{
    CeState, EventDescr, EventId, EventType, GroupApiState, OpTotals, ProxyCtrlState, ProxyOpState, ProxyStepState,
    StateArgs, StepTotals,
};
pub use fanout::{Fanout, SinkHandle, TooManySinks, MAX_SINKS};
pub use mask::{EventMask, ParseMaskError};
pub use profiler::{CommInfo, Profiler};
pub use sink::{Note, Sink};

/// `Fanout` is shared between communicators and threads.
const _: () = {
    const fn send_sync<T: Send + Sync>() {}
    send_sync::<Fanout>();
};
