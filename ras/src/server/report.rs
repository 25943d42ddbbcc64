//! From a finished gather to the report: the analysis with what this process knows of its own communicators.

use super::Gathered;
use crate::analysis::{analyze, AnalysisInput, KnownComm, StuckPolicy};
use crate::report::{Report, VersionInfo};

pub(crate) fn report_from_gather(g: &Gathered, version: VersionInfo, verbose: bool) -> Report {
    let timestamp = super::metrics::local_time(g.unix_ns / 1_000_000_000);
    let known: &[KnownComm] = &g.known;
    analyze(&AnalysisInput {
        gather: &g.result,
        peers: &g.table,
        known,
        version: &version,
        now_ns: g.unix_ns,
        timestamp: &timestamp,
        verbose,
        stuck: StuckPolicy::default(),
    })
}
