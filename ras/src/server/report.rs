//! From a finished gather to the report: the analysis with what this process knows of its own communicators, and
//! the report a `STATUS` client gets (text or JSON).

use std::time::Duration;

use super::shared::{gather, Shared};
use super::timestamp::local_time;
use super::Gathered;
use crate::analysis::{analyze, AnalysisInput, StuckPolicy};
use crate::client::Format;
use crate::report::{render_json, render_text, Report, VersionInfo};

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

/// Gathers and renders the report as a `STATUS` client gets it (the whole text, then EOF).
pub(crate) async fn report_text(sh: &Shared, budget: Duration, verbose: bool, format: Format) -> String {
    match gather(sh, budget).await {
        Ok(g) => {
            let r = build_report(&g, verbose || format == Format::Json);
            match format {
                Format::Text => render_text(&r),
                Format::Json => render_json(&r),
            }
        }
        Err(e) => format!("occl RAS: the status could not be gathered: {e}\n"),
    }
}
