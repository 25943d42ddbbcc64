//! From a finished gather to the report: the analysis with what this process knows of its own communicators.

use super::timestamp::local_time;
use super::Gathered;
use crate::analysis::{analyze, AnalysisInput, StuckPolicy};
use crate::report::{Report, VersionInfo};

/// The version block of our reports: occl's version, and the NCCL release whose format we follow.
fn version() -> VersionInfo {
    VersionInfo {
        occl_version: env!("CARGO_PKG_VERSION").to_string(),
        nccl_compat_version: occl_types::NCCL_VERSION.to_string(),
        cuda_compiled: None,
        cuda_runtime: 0,
        cuda_driver: 0,
    }
}

/// The report for a finished gather (`verbose`: `VERBOSE STATUS`'s listing rule).
pub(crate) fn build_report(g: &Gathered, verbose: bool) -> Report {
    let timestamp = local_time(g.unix_ns / 1_000_000_000);
    analyze(&AnalysisInput {
        gather: &g.result,
        peers: &g.table,
        known: &g.known,
        version: &version(),
        now_ns: g.unix_ns,
        timestamp: &timestamp,
        verbose,
        stuck: StuckPolicy::default(),
    })
}
