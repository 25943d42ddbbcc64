//! NCCL's JSON document (2.28.7+ layout, with 2.29's fix: valid JSON for missing ranks), plus occl extras under
//! `occl_*` / `stuck_operations` / `failed_operations` keys that NCCL consumers ignore.

use serde::Serialize;

use super::model::{CommData, FailedOp, Report, StuckOp};

#[derive(Serialize)]
struct Doc<'a> {
    nccl_version: &'a str,
    occl_version: &'a str,
    cuda_runtime_version: i32,
    cuda_driver_version: i32,
    timestamp: &'a str,
    communicators_count: usize,
    communicators: Vec<Comm<'a>>,
    ras: Ras,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    stuck_operations: Vec<Stuck<'a>>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    failed_operations: Vec<Failed<'a>>,
}

#[derive(Serialize)]
struct Ras {
    collection_time_sec: f64,
    timeouts_count: u32,
}

#[derive(Serialize)]
struct Comm<'a> {
    hash: String,
    secondary_hash: String,
    size: u32,
    ranks_count: usize,
    missing_ranks_count: usize,
    ranks: Vec<Rank<'a>>,
    missing_ranks: Vec<Missing<'a>>,
}

#[derive(Serialize)]
struct Rank<'a> {
    rank: u32,
    host: &'a str,
    pid: u32,
    cuda_dev: u32,
    nvml_dev: u32,
    status: RankStatus,
    collective_counts: Counts,
    /// occl-only: every kind of operation, launched and completed.
    #[serde(skip_serializing_if = "Option::is_none")]
    occl_operations: Option<Ops>,
}

#[derive(Serialize)]
struct Ops {
    launched: u64,
    completed: u64,
    failed: u64,
}

#[derive(Serialize)]
struct RankStatus {
    init_state: i32,
    async_error: i32,
    finalize_called: bool,
    destroy_flag: bool,
    abort_flag: bool,
}

// Field names are NCCL's ncclFuncStr spellings.
#[derive(Serialize)]
#[allow(non_snake_case)]
struct Counts {
    Broadcast: u64,
    Reduce: u64,
    AllGather: u64,
    ReduceScatter: u64,
    AllReduce: u64,
}

#[derive(Serialize)]
struct Missing<'a> {
    rank: u32,
    host: &'a str,
    pid: u32,
    cuda_dev: u32,
    nvml_dev: u32,
    status: MissingStatus,
}

#[derive(Serialize)]
struct MissingStatus {
    unresponsive: bool,
    considered_dead: bool,
}

#[derive(Serialize)]
struct Stuck<'a> {
    comm_hash: String,
    rank: u32,
    operation: &'a str,
    seq: u64,
    waited_ms: u64,
    peer: Option<u32>,
    step: &'a str,
}

#[derive(Serialize)]
struct Failed<'a> {
    comm_hash: String,
    rank: u32,
    /// `null` when no operation was in flight.
    operation: Option<&'a str>,
    seq: Option<u64>,
    /// How long the operation ran, and how long ago it failed.
    ran_ms: u64,
    failed_ms_ago: u64,
    /// `ncclResult_t`.
    result: i32,
    error: &'a str,
}

fn comm(c: &CommData) -> Comm<'_> {
    Comm {
        hash: format!("0x{:x}", c.hash),
        secondary_hash: format!("0x{:x}:0x{:x}", c.secondary_hash.0, c.secondary_hash.1),
        size: c.size,
        ranks_count: c.ranks.len(),
        missing_ranks_count: c.missing_ranks.len(),
        ranks: c
            .ranks
            .iter()
            .map(|r| {
                let [b, rd, ag, rs, ar] = r.collective_counts;
                Rank {
                    rank: r.rank,
                    host: &r.host,
                    pid: r.pid,
                    cuda_dev: r.cuda_dev,
                    nvml_dev: r.nvml_dev,
                    status: RankStatus {
                        init_state: r.init_state,
                        async_error: r.async_error,
                        finalize_called: r.finalize_called,
                        destroy_flag: r.destroy_flag,
                        abort_flag: r.abort_flag,
                    },
                    collective_counts: Counts {
                        Broadcast: b,
                        Reduce: rd,
                        AllGather: ag,
                        ReduceScatter: rs,
                        AllReduce: ar,
                    },
                    occl_operations: r.occl_ops.map(|o| Ops {
                        launched: o.launched,
                        completed: o.completed,
                        failed: o.failed,
                    }),
                }
            })
            .collect(),
        missing_ranks: c
            .missing_ranks
            .iter()
            .map(|m| Missing {
                rank: m.rank,
                host: &m.host,
                pid: m.pid,
                cuda_dev: m.cuda_dev,
                nvml_dev: m.nvml_dev,
                status: MissingStatus { unresponsive: m.unresponsive, considered_dead: m.considered_dead },
            })
            .collect(),
    }
}

fn stuck(s: &StuckOp) -> Stuck<'_> {
    Stuck {
        comm_hash: format!("0x{:x}", s.comm.hash),
        rank: s.rank.rank,
        operation: &s.operation,
        seq: s.seq,
        waited_ms: s.waited_ms,
        peer: s.peer,
        step: &s.step,
    }
}

fn failed(f: &FailedOp) -> Failed<'_> {
    Failed {
        comm_hash: format!("0x{:x}", f.comm.hash),
        rank: f.rank.rank,
        operation: f.operation.as_ref().map(|(name, _)| name.as_str()),
        seq: f.operation.as_ref().map(|(_, seq)| *seq),
        ran_ms: f.ran_ms,
        failed_ms_ago: f.ago_ms,
        result: f.result,
        error: &f.error,
    }
}

/// Renders the JSON document (pretty-printed, 2-space indent like NCCL's).
pub fn render_json(r: &Report) -> String {
    let doc = Doc {
        nccl_version: &r.version.nccl_compat_version,
        occl_version: &r.version.occl_version,
        cuda_runtime_version: r.version.cuda_runtime,
        cuda_driver_version: r.version.cuda_driver,
        timestamp: &r.timestamp,
        communicators_count: r.comms.len(),
        communicators: r.comms.iter().map(comm).collect(),
        ras: Ras { collection_time_sec: r.collection_time_sec, timeouts_count: r.timeouts_count },
        stuck_operations: r.stuck.iter().map(stuck).collect(),
        failed_operations: r.failed.iter().map(failed).collect(),
    };
    // Serializing plain structs of strings and numbers cannot fail; NaN times become null rather than panic.
    let mut s = serde_json::to_string_pretty(&doc).unwrap_or_default();
    s.push('\n');
    s
}
