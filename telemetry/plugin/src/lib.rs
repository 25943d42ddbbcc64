//! `libnccl-profiler-occl.so`: occl's telemetry (the span collector and its exporters:
//! Prometheus, OTLP, trace files) as an NCCL profiler plugin, so a job on NVIDIA's NCCL gets the
//! same metrics, spans and traces as one on occl.
//!
//! - Exports `ncclProfiler_v1` … `ncclProfiler_v6` (name "occl"), so NCCL 2.23 to 2.30 each find
//!   their native version ([`abi`]). NCCL's arguments are read with `occl_telemetry::nccl::decode`,
//!   which validates them.
//! - `init` never fails. It writes `*eActivationMask` with what the sinks want (the OR over live
//!   communicators, since NCCL has one mask per process). Without an exporter enabled it logs
//!   once through NCCL's logger and returns a NULL context, whose events are dropped.
//! - Contexts and event handles are integers that name a communicator and an occl [`EventId`],
//!   never pointers, so a stale, foreign (PXN) or garbage value NCCL passes back is harmless.
//!   Calls may come from any thread: application, proxy, network.
//! - One process-wide profiler, chosen in one function (`backend::choose`), gives each
//!   communicator its sink. Rust hosts that link the rlib can [`install`] another one (tests do).
//! - `/metrics` is served on a port of its own ([`metrics`]: `OCCL_METRICS_ADDR`, default
//!   `127.0.0.1:9464` plus the launcher's local rank; `off` disables it) while any communicator
//!   lives; the last `finalize` stops it and flushes the exporters. Its series carry `job`,
//!   `host` and `pid` ([`labels`]) besides `comm` and `rank`, as RAS's do for a job on occl; the
//!   plugin adds each communicator rank's `occl_operation_in_flight_age_seconds` (`inflight`).
//!
//! Load it with `NCCL_PROFILER_PLUGIN=/abs/path/libnccl_profiler_occl.so` (NCCL 2.23–2.30 except
//! 2.27.3), or copy it to `libnccl-profiler-occl.so` on `LD_LIBRARY_PATH` and set
//! `NCCL_PROFILER_PLUGIN=occl` (NCCL ≥ 2.26). The repository's
//! `scripts/nccl-plugin/check_nccl.sh` runs it under PyTorch.
//!
//! [`EventId`]: occl_telemetry::EventId
#![deny(unsafe_code)]

#[allow(unsafe_code)] // the exported C tables and NCCL's raw arguments
pub mod abi;
mod backend;
mod comms;
mod hooks;
mod inflight;
pub mod labels;
pub mod metrics;
#[allow(unsafe_code)] // calls NCCL's C-variadic logger
mod nccl_log;
mod stats;
#[cfg(feature = "test-support")]
mod testlog;

pub use abi::{ncclProfiler_v1, ncclProfiler_v2, ncclProfiler_v3, ncclProfiler_v4, ncclProfiler_v5, ncclProfiler_v6};
pub use backend::{install, Backend};
pub use metrics::{MetricsServer, Render};

/// Calls NCCL passed that the plugin dropped, by reason (bad descriptor, bad state, unknown
/// handle, foreign process, panic), as `/metrics` counts them.
pub fn dropped_calls() -> [(&'static str, u64); 5] {
    stats::all()
}
