//! occl-ras: NCCL-compatible RAS (reliability, availability, serviceability) for occl.
//!
//! This crate never depends on `occl`. Its model is `occl-ras-proto` (records, wire format, mesh, analysis,
//! reports, the client protocol: sans-IO, no runtime); its modules are re-exported here under their own names,
//! so `occl_ras::record::…` names the same items. This crate adds the I/O, behind feature `server`:
//!
//! - [`server`]: the RAS thread, a tokio current-thread runtime that drives the mesh over real sockets and serves
//!   the client port (`OCCL_RAS_ADDR` / `NCCL_RAS_ADDR`, default `127.0.0.1:28028`, held by one process of the
//!   node for every job of its user there, see `server::node`): NCCL's text
//!   protocol, and HTTP on the same port told apart by the first bytes (`/metrics`, `/api/v1/status`,
//!   `/api/v1/events`, `/healthz`). Client connections are bounded (in all, per peer address, streams) and a
//!   newcomer pushes out an idle one, so a flood of silent connections never keeps `ncclras` or a scrape out.
#![forbid(unsafe_code)]

pub use occl_ras_proto::{analysis, client, exposition, mesh, openmetrics, record, report, wire};
pub use occl_ras_proto::{analyze, AnalysisInput, KnownComm, KnownRank, StuckPolicy};

#[cfg(feature = "server")]
pub mod server;
