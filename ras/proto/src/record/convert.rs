//! From gathered rank records to the report model's raw per-communicator data ([`CommData`], what the JSON dump
//! prints and the analysis groups). Verdicts are not decided here.

use std::collections::BTreeMap;

use super::{CollType, CommId, RankRecord, MAX_COMM_RANKS};
use crate::report::{CommData, MissingRankData, OpTotals, RankData};

/// How a host-only rank's device shows in the report model, whose device fields are unsigned: NCCL's -1.
pub const NO_DEVICE: u32 = u32::MAX;

impl RankRecord {
    /// The JSON dump's per-rank data: NCCL's five launch counters in its order.
    pub fn to_rank_data(&self) -> RankData {
        let i = &self.info;
        let l = &self.live;
        RankData {
            rank: i.rank,
            host: i.host.clone(),
            pid: i.pid,
            cuda_dev: i.cuda_dev.unwrap_or(NO_DEVICE),
            nvml_dev: i.nvml_dev.or(i.cuda_dev).unwrap_or(NO_DEVICE),
            init_state: l.init_state,
            async_error: l.async_error,
            finalize_called: l.finalize_called,
            destroy_flag: l.destroy_flag,
            abort_flag: l.abort_flag,
            collective_counts: CollType::NCCL_COUNTED.map(|c| l.launched[c as usize]),
            occl_ops: Some(OpTotals {
                launched: l.launched.iter().fold(0u64, |a, &n| a.saturating_add(n)),
                completed: l.completed.iter().fold(0u64, |a, &n| a.saturating_add(n)),
                failed: l.failed,
            }),
        }
    }
}

/// Groups records by communicator, in commId order, with ranks in rank order (a rank reported twice is kept once)
/// and a missing-rank entry for every rank below the communicator's size (at most [`MAX_COMM_RANKS`]) that no record
/// covers. `missing` describes such a rank: the caller knows where it lives (its own comm membership, the peer
/// table) and whether its process is dead or unresponsive.
/// Missing-rank entries listed in one report, over all communicators. Sizes come from peers: without a bound, a few
/// records claiming 2^20-rank communicators would make the answering process build gigabytes of entries. A real
/// job this large cannot be listed rank by rank anyway; the counts stay right, the listing stops.
pub const MAX_MISSING_LISTED: usize = 1 << 18;

pub fn comm_data<'a>(
    records: impl IntoIterator<Item = &'a RankRecord>,
    mut missing: impl FnMut(&CommId, u32) -> MissingRankData,
) -> Vec<CommData> {
    let mut by_comm: BTreeMap<CommId, (u32, BTreeMap<u32, &RankRecord>)> = BTreeMap::new();
    for r in records {
        let size = r.info.size.min(MAX_COMM_RANKS);
        let e = by_comm.entry(r.info.comm).or_insert((size, BTreeMap::new()));
        e.0 = e.0.max(size);
        e.1.entry(r.info.rank).or_insert(r);
    }
    let mut budget = MAX_MISSING_LISTED;
    by_comm
        .into_iter()
        .map(|(id, (size, ranks))| {
            let missing_ranks: Vec<MissingRankData> =
                (0..size).filter(|r| !ranks.contains_key(r)).take(budget).map(|r| missing(&id, r)).collect();
            budget -= missing_ranks.len();
            CommData {
                hash: id.hash,
                secondary_hash: (id.root_host_hash, id.root_pid_hash),
                size,
                ranks: ranks.values().map(|r| r.to_rank_data()).collect(),
                missing_ranks,
            }
        })
        .collect()
}
