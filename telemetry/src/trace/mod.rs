//! HTA-ready trace files: one Kineto/Chrome-trace JSON per rank, which Holistic Trace Analysis
//! loads as a PyTorch profiler trace and Perfetto (ui.perfetto.dev) displays.
//!
//! Enabled by `OCCL_TRACE_DIR=<dir>` (or [`TraceExporter::new`] passed to
//! [`crate::spans::Telemetry::new`]):
//!
//! | variable | meaning |
//! |---|---|
//! | `OCCL_TRACE_DIR` | directory of the files, created if missing |
//! | `OCCL_TRACE_GZIP` | `1`: write `.json.gz` (HTA reads `.json` and `.gz` alike); default `0` |
//! | `OCCL_TRACE_MAX_EVENTS` | events kept per rank file (default 250000, at most 10000000); later ones are dropped and counted in the file's `occl.events_dropped` |
//! | `OCCL_TRACE_PROXY` | `none`, `ops` (default: one row per ProxyOp) or `steps` (also one per ProxyStep) |
//!
//! A file is named `occl-trace-rank<R>-<host>-<pid>.json[.gz]` and is rewritten whole, atomically
//! (temporary file + rename), when a communicator is destroyed, on [`flush`] and at process exit.
//! Point HTA at a directory holding one job's files only: it keys files by rank, not by name.
//!
//! What a file holds, and what HTA makes of it:
//! - `distributedInfo` (`rank`, `world_size`, `backend: "occl"`, `pg_config` with each
//!   communicator's id as `pg_name`): HTA takes the rank from here.
//! - Each collective and send/recv as a GPU-kernel-like row named `ncclKernel_<Func>_…`
//!   (communication to HTA's kernel classifier and its straggler analysis) with PyTorch's
//!   collective metadata (`Collective name`, `In msg nelems`, `Out msg nelems`, `Group size`,
//!   `dtype`, `In split size`, `Out split size`, `Process Group Name`/`Description`/`Ranks`, …):
//!   temporal breakdown, comm/comp overlap, kernel breakdown and stragglers use these.
//! - The call (`ncclAllReduce`, …) as a `cuda_runtime` row with the kernel's `correlation`: HTA's
//!   iteration assignment and its ≥ 2-step kernel filter use it. HTA's CUDA launch statistics
//!   look for `cudaLaunchKernel` rows and find none: there is no CUDA launch to measure.
//! - `ProfilerStep#N` rows from [`profiler_step`] / [`step_begin`] / [`step_end`].
//! - Proxy rows (`occl_proxy`, `occl_proxy_step`) and `ac2g` flow arrows: for Perfetto only;
//!   HTA loads and ignores them.
//!
//! Host-memory collectives have no compute kernels, so HTA reports 0% compute and 0% overlap:
//! time between collectives is idle from the "device"'s point of view.

mod config;
mod exit;
mod exporter;
mod log;
mod names;
mod record;
mod render;
mod step_grid;
mod steps;
mod threads;
mod write;

pub use config::{
    ProxyDetail, TraceConfig, TraceConfigError, DEFAULT_MAX_EVENTS, DIR_ENV, GZIP_ENV, LIMIT_MAX_EVENTS,
    MAX_EVENTS_ENV, PROXY_ENV,
};
pub use exporter::{flush, TraceExporter};
pub use steps::{profiler_step, step_begin, step_end, ProfilerStep};

#[cfg(test)]
mod tests;
