//! Shared helpers for occl's integration tests and the `occl-perf` benchmark: starting the
//! ranks of a local job as real processes, and filling/checking buffers of any datatype.

pub mod events;
#[cfg(feature = "cuda")]
pub mod gpu_events;
#[cfg(feature = "cuda")]
pub mod gpu_stall;
#[cfg(feature = "cuda")]
pub mod gpu_windows;
pub mod launch;
pub mod lifecycle;
pub mod logging;
pub mod matrix;
pub mod openmetrics;
pub mod otlp_ops;
pub mod otlp_sink;
pub mod pattern;
pub mod perf;
pub mod ras_client;
pub mod register;
