//! `libnccl-profiler-occl.so`: occl's telemetry sinks packaged as an NCCL profiler plugin, so a
//! job on NVIDIA's NCCL gets the same metrics, spans and traces. Filled in by the telemetry-sinks
//! issue; until then the library only builds and exports nothing.
