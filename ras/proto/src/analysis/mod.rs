//! From a status gather to the report model: NCCL 2.28's verdicts (reference `nccl-ras.md` §3.6 and §4) and occl's
//! stuck and failed operations.
//!
//! [`analyze`] is a pure function: the caller passes the clock readings, the peer table and what the answering
//! process knows of its own communicators, so one input always gives one report, and records from peers (any size,
//! rank or duplicate) can make it neither panic nor disagree with itself.
//!
//! - `gathered`: the gather indexed per communicator: who answered, where each absent rank lives and why it is
//!   absent, and the raw [`CommData`](crate::report::CommData) the JSON dump prints.
//! - `summary`: the job summary from the peer table.
//! - `counts`: which launch counters stay apart, once operations just launched and records read a moment apart are
//!   allowed for.
//! - `verdicts`: per-communicator status and error bits, NCCL's grouping into table rows, the Errors and Warnings
//!   entries.
//! - `groups`: ranks or processes sharing a value, and NCCL's rule for when their members are listed.
//! - `stuck`: operations in flight for too long, lagging ranks first; failed ones, the earliest first.

mod counts;
mod gathered;
mod groups;
mod stuck;
mod summary;
#[cfg(test)]
mod tests;
mod verdicts;

use crate::mesh::{GatherResult, PeerId, PeerTable};
use crate::record::CommId;
use crate::report::{Report, VersionInfo};

/// One rank of a communicator this process belongs to, as it learned at communicator creation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KnownRank {
    pub rank: u32,
    /// The process that owns the rank.
    pub peer: PeerId,
    /// `None` for a host-only rank.
    pub cuda_dev: Option<u32>,
    pub nvml_dev: Option<u32>,
}

/// A communicator the answering process knows of. Its members say where an absent rank lives (NCCL's missing-rank
/// records); they may be partial, and a rank with no entry prints as `[process information not found]` and counts as
/// INCOMPLETE unless every process answered. Its size matters only when no answer mentions the communicator at all
/// (then it still shows up, every rank absent); otherwise the sizes in the records decide.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KnownComm {
    pub id: CommId,
    pub size: u32,
    pub members: Vec<KnownRank>,
}

/// When an operation in flight counts as stuck, and as launched when launch counts are compared (MISMATCH).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StuckPolicy {
    /// An operation is listed once it has waited this long. Ranks disagreeing on counts is not enough by itself:
    /// under load they always do for a moment (capture `A_status_normal.txt`), so that alone would list healthy jobs.
    /// Younger operations are in flight: a rank that has just launched the next operation is ahead, not apart.
    pub min_wait_ns: u64,
}

impl Default for StuckPolicy {
    fn default() -> Self {
        Self { min_wait_ns: 1_000_000_000 }
    }
}

/// Everything [`analyze`] needs.
#[derive(Clone, Copy, Debug)]
pub struct AnalysisInput<'a> {
    pub gather: &'a GatherResult,
    /// The job's processes: node count and shape for the summary, and who a missing process is.
    pub peers: &'a PeerTable,
    /// The answering process's communicators.
    pub known: &'a [KnownComm],
    pub version: &'a VersionInfo,
    /// Wall clock, nanoseconds since the Unix epoch (in-flight operations' `start_ns` use the same clock).
    pub now_ns: u64,
    /// Local time as `YYYY-MM-DD HH:MM:SS`, for the JSON dump.
    pub timestamp: &'a str,
    /// `VERBOSE STATUS`: lists more members of rank and process groups.
    pub verbose: bool,
    pub stuck: StuckPolicy,
}

/// Analyses a gather into the report both renderers print.
pub fn analyze(input: &AnalysisInput<'_>) -> Report {
    let gathered = gathered::Gathered::new(input.gather, input.peers, input.known);
    let judged = verdicts::judge(&gathered, input.now_ns, input.stuck.min_wait_ns);
    let g = input.gather;
    Report {
        version: input.version.clone(),
        timestamp: input.timestamp.to_string(),
        collection_time_sec: g.finished.saturating_sub(g.started) as f64 / 1e9,
        timeouts_count: g.leg_timeouts,
        summary: summary::job_summary(input.peers, input.verbose),
        groups: verdicts::rows(&judged),
        errors: verdicts::errors(&gathered, &judged, input.verbose),
        warnings: verdicts::warnings(g.leg_timeouts, &judged, input.verbose),
        stuck: stuck::stuck_ops(&judged, input.now_ns, input.stuck),
        failed: stuck::failed_ops(&judged, input.now_ns),
        comms: gathered.data,
    }
}
