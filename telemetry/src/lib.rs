//! occl-telemetry: the profiler event model and the sinks that consume it (Prometheus,
//! OpenTelemetry, HTA trace files, NCCL profiler plugins).
//!
//! This crate is a leaf: it never depends on `occl`. The event model and sinks are filled in by
//! the profiler-events issue; until then the crate only builds.
#![forbid(unsafe_code)]
