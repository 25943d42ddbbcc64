//! Placeholder until the analysis lands: a report with the summary and the raw communicator data only.
use super::Gathered;
use crate::record::convert::comm_data;
use crate::report::{JobSummary, MissingRankData, Report, VersionInfo};

pub(crate) fn report_from_gather(g: &Gathered, version: VersionInfo, _verbose: bool) -> Report {
    let mut hosts: Vec<&str> = g.table.iter().map(|p| p.host.as_str()).collect();
    hosts.sort_unstable();
    hosts.dedup();
    let n = g.table.len() as u32;
    let records: Vec<_> = g.result.statuses.iter().flat_map(|s| s.records.iter()).collect();
    let comms = comm_data(records, |_, r| MissingRankData {
        rank: r,
        host: String::new(),
        pid: 0,
        cuda_dev: u32::MAX,
        nvml_dev: u32::MAX,
        unresponsive: false,
        considered_dead: false,
    });
    Report {
        version,
        timestamp: super::metrics::local_time(g.unix_ns / 1_000_000_000),
        collection_time_sec: g.result.finished.saturating_sub(g.result.started) as f64 / 1e9,
        timeouts_count: g.result.leg_timeouts,
        summary: JobSummary {
            nodes: hosts.len() as u32,
            processes_per_node: n / (hosts.len() as u32).max(1),
            gpus_per_process: 0,
            processes_total: n,
            gpus_total: 0,
        },
        groups: Vec::new(),
        errors: Vec::new(),
        warnings: Vec::new(),
        stuck: Vec::new(),
        comms,
    }
}
