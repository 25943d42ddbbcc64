//! NCCL's verdicts per communicator (`nccl-ras.md` §3.6), its grouping of communicators into table rows (§4.2), and
//! the Errors and Warnings entries (§4.3, §4.4).

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::counts;
use super::gathered::{Absent, CommView, Gathered};
use super::groups::{by_frequency, count, host_order, listed, rank_groups};
use crate::mesh::PeerId;
use crate::record::{CollType, RankRecord, ResultCode};
use crate::report::{
    CommGroupRow, CommRef, CommStatus, ErrorBreakdown, ErrorEntry, ErrorSet, OpCountMismatch, ProcessRef, RankRef,
    WarningEntry,
};

/// A rank's status, checked in NCCL's order: abort, then finalize or destroy, then whether init succeeded.
pub(super) fn rank_status(r: &RankRecord) -> CommStatus {
    let l = &r.live;
    if l.abort_flag {
        CommStatus::Abort
    } else if l.finalize_called || l.destroy_flag {
        CommStatus::Finalize
    } else if l.init_state == ResultCode::Success.code() {
        CommStatus::Running
    } else {
        CommStatus::Init
    }
}

/// NCCL's order of error bits, for sorting: INCOMPLETE above ERROR above MISMATCH.
fn error_bits(e: ErrorSet) -> u8 {
    u8::from(e.incomplete) << 2 | u8::from(e.error) << 1 | u8::from(e.mismatch)
}

/// One communicator, judged.
#[derive(Debug)]
pub(super) struct Verdict<'g, 'a> {
    pub view: &'g CommView<'a>,
    pub comm: CommRef,
    /// Every status some rank has (NOCOMM for absent ranks whose process answered).
    statuses: BTreeSet<CommStatus>,
    pub errors: ErrorSet,
    nodes: u32,
    /// Fewest and most present ranks on one node; `None` when no rank is present.
    ranks_per_node: Option<(u32, u32)>,
    /// Absent ranks whose process disowns the communicator (NOCOMM).
    nocomm: Vec<&'g Absent>,
    /// Absent ranks whose process did not answer (INCOMPLETE).
    incomplete: Vec<&'g Absent>,
    /// Counted collectives whose launch counts stay apart (see `counts`).
    apart: Vec<CollType>,
}

impl Verdict<'_, '_> {
    /// The Status column: the highest status present. A communicator with no status at all (only ranks of silent
    /// processes, which NCCL never has: the first contributor is a member) shows the lowest.
    fn status(&self) -> CommStatus {
        self.statuses.last().copied().unwrap_or(CommStatus::NoComm)
    }

    fn group_key(&self) -> (u32, u32, Option<CommStatus>, u8) {
        (self.view.size, self.nodes, self.statuses.last().copied(), error_bits(self.errors))
    }
}

fn judge_one<'g, 'a>(g: &Gathered<'a>, view: &'g CommView<'a>, now_ns: u64, grace_ns: u64) -> Verdict<'g, 'a> {
    let everyone = g.everyone_answered();
    let (nocomm, incomplete): (Vec<&Absent>, Vec<&Absent>) = view.absent.iter().partition(|a| everyone || a.answered);

    let mut statuses: BTreeSet<CommStatus> = view.ranks.iter().map(|r| rank_status(r.record)).collect();
    if !nocomm.is_empty() {
        statuses.insert(CommStatus::NoComm);
    }
    let apart = counts::apart(view, now_ns, grace_ns);
    let error = view
        .ranks
        .iter()
        .any(|r| ResultCode::is_error(r.record.live.init_state) || ResultCode::is_error(r.record.live.async_error));

    let mut per_node: BTreeMap<&str, u32> = BTreeMap::new();
    for r in &view.ranks {
        *per_node.entry(r.host()).or_default() += 1;
    }
    let ranks_per_node = per_node
        .values()
        .fold(None, |acc: Option<(u32, u32)>, &n| Some(acc.map_or((n, n), |(lo, hi)| (lo.min(n), hi.max(n)))));

    Verdict {
        view,
        comm: CommRef { group: 0, index: 0, hash: view.id.hash },
        errors: ErrorSet {
            incomplete: !incomplete.is_empty(),
            error,
            mismatch: !nocomm.is_empty() || !apart.is_empty() || statuses.len() > 1,
        },
        statuses,
        nodes: count(per_node.len()),
        ranks_per_node,
        nocomm,
        incomplete,
        apart,
    }
}

/// Judges every communicator at `now_ns` and orders them as NCCL's table: largest first (size, then nodes), then by
/// status and errors, worst first; consecutive communicators alike in all four form a group, numbered in `comm`. An
/// operation in flight for less than `grace_ns` does not count as launched when counts are compared.
pub(super) fn judge<'g, 'a>(g: &'g Gathered<'a>, now_ns: u64, grace_ns: u64) -> Vec<Verdict<'g, 'a>> {
    let mut v: Vec<Verdict> = g.comms.iter().map(|c| judge_one(g, c, now_ns, grace_ns)).collect();
    // Stable, so communicators alike in every key stay in commId order.
    v.sort_by_key(|x| {
        let (size, nodes, status, errors) = x.group_key();
        (Reverse(size), Reverse(nodes), Reverse(status), Reverse(errors), x.view.ranks.len())
    });
    let (mut group, mut index) = (0u32, 0u32);
    for i in 0..v.len() {
        if i > 0 {
            if v[i].group_key() == v[i - 1].group_key() {
                index += 1;
            } else {
                (group, index) = (group + 1, 0);
            }
        }
        v[i].comm.group = group;
        v[i].comm.index = index;
    }
    v
}

/// The communicators table.
pub(super) fn rows(judged: &[Verdict]) -> Vec<CommGroupRow> {
    judged.chunk_by(|a, b| a.comm.group == b.comm.group).map(row).collect()
}

fn row(group: &[Verdict]) -> CommGroupRow {
    let first = &group[0];
    let ranks_per_node = group
        .iter()
        .filter_map(|v| v.ranks_per_node)
        .reduce(|(lo, hi), (l, h)| (lo.min(l), hi.max(h)))
        .unwrap_or((0, 0));
    CommGroupRow {
        comms_in_group: count(group.len()),
        nodes_per_comm: first.nodes,
        ranks_per_node,
        ranks_per_comm: first.view.size,
        ranks_in_group: ranks_in_group(group),
        status: first.status(),
        errors: first.errors,
    }
}

/// Distinct GPUs across the group, per process and NVML device. Host-only ranks have no device to tell them apart,
/// so a process counts as many of them as it has in any one communicator of the group.
fn ranks_in_group(group: &[Verdict]) -> u32 {
    let mut gpus: HashMap<PeerId, BTreeSet<u32>> = HashMap::new();
    let mut host_only: HashMap<PeerId, u32> = HashMap::new();
    for v in group {
        let mut here: HashMap<PeerId, u32> = HashMap::new();
        for r in &v.view.ranks {
            match r.nvml_dev() {
                Some(d) => _ = gpus.entry(r.process).or_default().insert(d),
                None => *here.entry(r.process).or_default() += 1,
            }
        }
        for (p, n) in here {
            let e = host_only.entry(p).or_default();
            *e = (*e).max(n);
        }
    }
    let devices = gpus.values().map(|s| count(s.len()));
    devices.chain(host_only.into_values()).fold(0, u32::saturating_add)
}

fn absent_ref(a: &Absent) -> RankRef {
    RankRef { rank: a.rank, loc: a.loc.clone() }
}

/// Job-level entries (missing and dead processes) and, per communicator in table order, INCOMPLETE and ERROR.
pub(super) fn errors(g: &Gathered, judged: &[Verdict], verbose: bool) -> Vec<ErrorEntry> {
    let mut out = Vec::new();
    if !g.missing.is_empty() {
        let (processes, not_found, missing) = processes(g, &g.missing, verbose);
        out.push(ErrorEntry::Incomplete { processes, missing, not_found });
    }
    if !g.dead.is_empty() {
        let (processes, not_found, dead) = processes(g, &g.dead, verbose);
        out.push(ErrorEntry::Dead { processes, dead, not_found });
    }
    for v in judged {
        if v.errors.incomplete {
            let missing = count(v.incomplete.len());
            let listed = listed(missing, verbose, None);
            let ranks = if listed { v.incomplete.iter().map(|a| absent_ref(a)).collect() } else { Vec::new() };
            out.push(ErrorEntry::CommIncomplete { comm: v.comm, missing, ranks });
        }
        if v.errors.error {
            let init = breakdown(v, verbose, |r| r.live.init_state);
            let async_ = breakdown(v, verbose, |r| r.live.async_error);
            out.push(ErrorEntry::CommError { comm: v.comm, init, async_ });
        }
    }
    out
}

/// Processes for a job-level entry, by node and pid, when the outlier rule lists them; with how many the peer table
/// does not know, and the total.
fn processes(g: &Gathered, ids: &[PeerId], verbose: bool) -> (Vec<ProcessRef>, u32, u32) {
    let total = count(ids.len());
    if !listed(total, verbose, None) {
        return (Vec::new(), 0, total);
    }
    let mut found: Vec<ProcessRef> = ids
        .iter()
        .filter_map(|&id| g.peers.get(id))
        .map(|p| {
            let devs = |d: &[u32]| d.iter().copied().collect::<BTreeSet<u32>>().into_iter().collect::<Vec<_>>();
            ProcessRef {
                pid: p.pid,
                host: p.host.clone(),
                cuda_devs: devs(&p.cuda_devs),
                nvml_devs: devs(&p.nvml_devs),
            }
        })
        .collect();
    found.sort_by(|a, b| (host_order(&a.host), a.pid).cmp(&(host_order(&b.host), b.pid)));
    let not_found = total - count(found.len());
    (found, not_found, total)
}

/// Init or async errors of a communicator's ranks, the most frequent kind first (ties: NCCL's lower code first; codes
/// it has no name for are one "Unexpected error" kind, last).
fn breakdown(v: &Verdict, verbose: bool, code: impl Fn(&RankRecord) -> i32) -> Option<ErrorBreakdown> {
    let failing: Vec<_> = v.view.ranks.iter().filter(|r| ResultCode::is_error(code(r.record))).collect();
    if failing.is_empty() {
        return None;
    }
    let kind = |c: i32| if ResultCode::from_code(c).is_some() { c } else { i32::MAX };
    let groups = by_frequency(failing.iter().map(|r| {
        let c = code(r.record);
        (Reverse(kind(c)), (ResultCode::report_name(c), r.rank_ref()))
    }));
    let groups = groups
        .into_iter()
        .map(|(_, members)| {
            let name = members.first().map_or("Unexpected error", |m| m.0).to_string();
            (name, members.into_iter().map(|m| m.1).collect())
        })
        .collect();
    Some(ErrorBreakdown { ranks: count(failing.len()), groups: rank_groups(groups, verbose, None) })
}

/// TIMEOUT, then per communicator in table order, MISMATCH: status and NCCL's five launch counters.
pub(super) fn warnings(leg_timeouts: u32, judged: &[Verdict], verbose: bool) -> Vec<WarningEntry> {
    let mut out = Vec::new();
    if leg_timeouts > 0 {
        out.push(WarningEntry::Timeout { count: leg_timeouts });
    }
    for v in judged.iter().filter(|v| v.errors.mismatch) {
        let total = Some(v.view.size);
        let status = if v.statuses.len() > 1 {
            let present = v.view.ranks.iter().map(|r| (rank_status(r.record), r.rank_ref()));
            let nocomm = v.nocomm.iter().map(|a| (CommStatus::NoComm, absent_ref(a)));
            rank_groups(by_frequency(present.chain(nocomm)), verbose, total)
        } else {
            Vec::new()
        };
        let counts = v
            .apart
            .iter()
            .map(|&c| {
                let values = v.view.ranks.iter().map(|r| (r.record.launched(c), r.rank_ref()));
                OpCountMismatch {
                    collective: c.name().to_string(),
                    groups: rank_groups(by_frequency(values), verbose, total),
                }
            })
            .collect();
        out.push(WarningEntry::CommMismatch { comm: v.comm, status, counts });
    }
    out
}
