//! The gather indexed per communicator: present ranks with the process that reported them, absent ranks with where
//! they live and whether that process answered, and job-wide who is missing or dead.

use std::collections::{BTreeSet, HashMap};

use super::{KnownComm, KnownRank};
use crate::mesh::{GatherResult, PeerId, PeerTable};
use crate::record::convert::{comm_data, NO_DEVICE};
use crate::record::{CommId, RankRecord, MAX_COMM_RANKS};
use crate::report::{CommData, MissingRankData, RankLoc, RankRef};

/// A rank whose record arrived.
#[derive(Clone, Copy, Debug)]
pub(super) struct Present<'a> {
    /// The process that answered with it.
    pub process: PeerId,
    pub record: &'a RankRecord,
}

impl Present<'_> {
    pub fn rank(&self) -> u32 {
        self.record.info.rank
    }

    pub fn host(&self) -> &str {
        &self.record.info.host
    }

    /// The NVML device, as the JSON dump shows it (a host-only rank has none).
    pub fn nvml_dev(&self) -> Option<u32> {
        self.record.info.nvml_dev.or(self.record.info.cuda_dev)
    }

    pub fn rank_ref(&self) -> RankRef {
        RankRef { rank: self.rank(), loc: Some(self.loc()) }
    }

    pub fn loc(&self) -> RankLoc {
        let i = &self.record.info;
        RankLoc {
            cuda_dev: i.cuda_dev.unwrap_or(NO_DEVICE),
            nvml_dev: self.nvml_dev().unwrap_or(NO_DEVICE),
            pid: i.pid,
            host: i.host.clone(),
        }
    }
}

/// A rank of the communicator that no answering process reported.
#[derive(Clone, Debug)]
pub(super) struct Absent {
    pub rank: u32,
    /// Where it lives, when the answering process knows the rank and the peer table the process.
    pub loc: Option<RankLoc>,
    /// Its process answered the gather, only without this communicator (NCCL's NOCOMM).
    pub answered: bool,
}

/// One communicator as gathered.
#[derive(Clone, Debug)]
pub(super) struct CommView<'a> {
    pub id: CommId,
    pub size: u32,
    /// In rank order, one per rank.
    pub ranks: Vec<Present<'a>>,
    /// In rank order.
    pub absent: Vec<Absent>,
}

#[derive(Debug)]
pub(super) struct Gathered<'a> {
    pub peers: &'a PeerTable,
    /// Processes that did not answer and are not dead, in table order (ids outside the table last).
    pub missing: Vec<PeerId>,
    /// Processes on the dead list, in table order.
    pub dead: Vec<PeerId>,
    /// In commId order, as `data`.
    pub comms: Vec<CommView<'a>>,
    /// The raw dump, built by [`comm_data`] from the same records.
    pub data: Vec<CommData>,
}

impl<'a> Gathered<'a> {
    pub fn new(gather: &'a GatherResult, peers: &'a PeerTable, known: &[KnownComm]) -> Self {
        // The mesh keeps one answer per process; keep the first again, since this input is all we trust.
        let mut responded = BTreeSet::new();
        let statuses: Vec<_> = gather.statuses.iter().filter(|s| responded.insert(s.peer)).collect();

        // Everyone who did not answer is missing, whether the mesh listed them or not; dead ones are counted apart.
        // Silent and merely slow processes are alike here: NCCL's report tells only missing from dead.
        let mut absent: BTreeSet<PeerId> = peers.ids().chain(gather.missing.iter().copied()).collect();
        absent.retain(|p| !responded.contains(p));
        let dead: BTreeSet<PeerId> = gather.dead.iter().copied().filter(|p| absent.contains(p)).collect();
        let missing: Vec<PeerId> = absent.iter().copied().filter(|p| !dead.contains(p)).collect();

        let mut members: HashMap<(CommId, u32), &KnownRank> = HashMap::new();
        for k in known {
            for m in &k.members {
                members.entry((k.id, m.rank)).or_insert(m);
            }
        }
        let describe = |id: &CommId, rank: u32| -> (MissingRankData, Absent) {
            let member = members.get(&(*id, rank));
            let process = member.and_then(|m| peers.get(m.peer).map(|p| (m, p)));
            let answered = member.is_some_and(|m| responded.contains(&m.peer));
            let data = MissingRankData {
                rank,
                host: process.map_or_else(|| "unknown".to_string(), |(_, p)| p.host.clone()),
                pid: process.map_or(0, |(_, p)| p.pid),
                cuda_dev: member.and_then(|m| m.cuda_dev).unwrap_or(NO_DEVICE),
                nvml_dev: member.and_then(|m| m.nvml_dev.or(m.cuda_dev)).unwrap_or(NO_DEVICE),
                unresponsive: !answered,
                considered_dead: member.is_some_and(|m| dead.contains(&m.peer)),
            };
            let loc = process.map(|_| RankLoc {
                cuda_dev: data.cuda_dev,
                nvml_dev: data.nvml_dev,
                pid: data.pid,
                host: data.host.clone(),
            });
            (data, Absent { rank, loc, answered })
        };

        // Records in answer order, first report of a (communicator, rank) wins: the same rule as `comm_data`.
        let records = || statuses.iter().copied().flat_map(|s| s.records.iter().map(move |r| (s.peer, r)));
        let mut present: HashMap<(CommId, u32), Present<'a>> = HashMap::new();
        for (process, record) in records() {
            present.entry((record.info.comm, record.info.rank)).or_insert(Present { process, record });
        }
        let mut data = comm_data(records().map(|(_, r)| r), |id, rank| describe(id, rank).0);

        // A communicator this process is in that no answer mentions (its own records absent from the gather).
        let mut seen: BTreeSet<CommId> = data.iter().map(comm_id).collect();
        for k in known {
            if k.size > 0 && seen.insert(k.id) {
                let size = k.size.min(MAX_COMM_RANKS);
                data.push(CommData {
                    hash: k.id.hash,
                    secondary_hash: (k.id.root_host_hash, k.id.root_pid_hash),
                    size,
                    ranks: Vec::new(),
                    missing_ranks: (0..size).map(|r| describe(&k.id, r).0).collect(),
                });
            }
        }
        data.sort_by_key(comm_id);

        let comms = data
            .iter()
            .map(|d| {
                let id = comm_id(d);
                CommView {
                    id,
                    size: d.size,
                    ranks: d.ranks.iter().filter_map(|r| present.get(&(id, r.rank)).copied()).collect(),
                    absent: d.missing_ranks.iter().map(|m| describe(&id, m.rank).1).collect(),
                }
            })
            .collect();
        Self { peers, missing, dead: dead.into_iter().collect(), comms, data }
    }

    /// Nothing is missing job-wide: then every absent rank is one its process disowns (NCCL's NOCOMM).
    pub fn everyone_answered(&self) -> bool {
        self.missing.is_empty() && self.dead.is_empty()
    }
}

fn comm_id(d: &CommData) -> CommId {
    CommId { hash: d.hash, root_host_hash: d.secondary_hash.0, root_pid_hash: d.secondary_hash.1 }
}
