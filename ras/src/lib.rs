//! occl-ras: NCCL-compatible RAS (reliability, availability, serviceability) for occl.
//!
//! This crate is a leaf: it never depends on `occl`, and its protocol cores do no I/O (no sockets, no clock, no
//! runtime), so they are deterministic and testable in memory, like quinn-proto.
//!
//! What exists now:
//! - [`client`]: the `ncclras` client-port text protocol (`CLIENT PROTOCOL`, `TIMEOUT`, `SET FORMAT text|json`,
//!   `STATUS`, `VERBOSE STATUS`, `MONITOR`) as a line-in, action-out state machine, [`client::ClientSession`], with
//!   NCCL's replies and a 1 KiB line limit.
//! - [`fuzz_client_bytes`]: the body of a future `fuzz/` target for that state machine.
//!
//! What later steps add:
//! - Rank records, updated by `occl`: per communicator and rank, launched and completed operation counters per
//!   collective type and for p2p, init/error/abort/finalize state, and the operation in flight.
//! - The mesh: a ring over the sorted peer table with keep-alives, fallback links, dead-peer flooding and job-secret
//!   authentication, as a sans-IO `Mesh` driven by `(frame, now)` with one `Timer` enum.
//! - The gather: a status request flooded as a spanning tree with per-leg timeouts, and the text and JSON report
//!   renderers (NCCL's layout, plus which operation a lagging rank is stuck in).
//! - The thin tokio driver: the client port (`OCCL_RAS_ADDR` / `NCCL_RAS_ADDR`, default `localhost:28028`), which
//!   also answers HTTP on the same port (`/metrics`, `/api/v1/status`, `/api/v1/events`, `/healthz`), told apart
//!   from the text protocol by the first bytes.
#![forbid(unsafe_code)]

pub mod client;
pub mod report;

pub use client::fuzz_client_bytes;
