//! occl-ras-proto: the sans-IO model of NCCL-compatible RAS (reliability, availability, serviceability) for occl.
//!
//! This crate never depends on `occl`, and does no I/O (no sockets, no clock, no runtime), so it is deterministic
//! and testable in memory, as quinn-proto is; `occl-ras` drives it over real sockets on a tokio runtime.
//!
//! - [`client`]: the `ncclras` client-port text protocol (`CLIENT PROTOCOL`, `TIMEOUT`, `SET FORMAT text|json`,
//!   `STATUS`, `VERBOSE STATUS`, `MONITOR`) as a line-in, action-out state machine, [`client::ClientSession`], with
//!   NCCL's replies and a 1 KiB line limit.
//! - [`report`]: the analysed report model and NCCL's text and JSON renderings of it.
//! - [`analysis`]: [`analyze`], the pure function from a status gather to that model: NCCL 2.28's job summary,
//!   communicator groups and verdicts (INCOMPLETE, DEAD, ERROR, TIMEOUT, MISMATCH with NOCOMM), and occl's stuck
//!   and failed operations.
//! - [`record`]: rank records. `occl` updates a [`record::LiveRecord`] per communicator and rank on the collective
//!   path (relaxed atomic stores, no lock, no allocation) and registers it in the process's
//!   [`record::ProcessRecords`]; RAS ships [`record::RankRecord`] snapshots and converts gathered ones into the
//!   report model's raw data.
//! - [`wire`]: the peer-to-peer messages (handshake, keep-alive, peer news, status request and reply, metrics request
//!   and reply, goodbye) and a size-bounded, length-prefixed, versioned codec with a streaming [`wire::Decoder`].
//! - [`mesh`]: the mesh and the status gather as a sans-IO [`mesh::Mesh`] driven by `(input, now)`: a ring over the
//!   sorted peer table with long-range links and fallbacks, keep-alives, unresponsive and dead verdicts, dead-peer
//!   news flooding, job-secret authentication, a spanning-tree gather with per-hop budgets, and node metrics
//!   fetched from every process of the host with one deadline. Tested on a
//!   simulated network of up to 1,024 processes on a virtual clock.
//! - [`exposition`]: merging the Prometheus texts of a node's processes into one scrape (one HELP/TYPE per family,
//!   a `pid` label per process, every line from a peer checked); [`openmetrics`]: the same scrape as OpenMetrics 1.0
//!   for a client whose `Accept` header prefers it.
//! - Fuzz entries for every decoder of untrusted bytes, `fuzz_client_bytes`, `fuzz_wire_bytes`,
//!   `mesh::fuzz_mesh_bytes` and `fuzz_exposition_bytes`, which the cargo-fuzz crate in `ras/proto/fuzz/` runs (feature
//!   `test-support`; not in the library otherwise).
#![forbid(unsafe_code)]

pub mod analysis;
pub mod client;
pub mod exposition;
pub mod mesh;
pub mod openmetrics;
pub mod record;
pub mod report;
pub mod wire;

#[cfg(test)]
mod fuzz_seeds;
#[cfg(test)]
mod test_rng;

pub use analysis::{analyze, AnalysisInput, KnownComm, KnownRank, StuckPolicy};
#[cfg(any(test, feature = "test-support"))]
pub use client::fuzz_client_bytes;
#[cfg(any(test, feature = "test-support"))]
pub use exposition::fuzz_exposition_bytes;
#[cfg(any(test, feature = "test-support"))]
pub use wire::fuzz_wire_bytes;
