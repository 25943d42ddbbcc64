//! occl's stuck operations: ranks that have been in one operation for too long, the laggards of each communicator
//! first, so the rank the others wait for leads. And failed ones: ranks whose last call returned an error, the
//! earliest first.

use super::verdicts::Verdict;
use super::StuckPolicy;
use crate::record::RankRecord;
use crate::report::{FailedOp, StuckOp};

/// How far a rank got: operations of any kind completed, then launched (within a communicator every rank runs the
/// same sequence, so fewer means behind).
fn progress(r: &RankRecord) -> (u64, u64) {
    let sum = |v: &[u64]| v.iter().fold(0u64, |a, &b| a.saturating_add(b));
    (sum(&r.live.completed), sum(&r.live.launched))
}

/// Per communicator in table order, each rank whose operation in flight has waited at least the policy's minimum,
/// laggards first.
pub(super) fn stuck_ops(judged: &[Verdict], now_ns: u64, policy: StuckPolicy) -> Vec<StuckOp> {
    let mut out = Vec::new();
    for v in judged {
        let mut waiting: Vec<_> = v
            .view
            .ranks
            .iter()
            .filter_map(|r| r.record.live.in_flight.as_ref().map(|op| (r, op)))
            .filter(|(_, op)| op.waited_ns(now_ns) >= policy.min_wait_ns)
            // Read at the instant of its failure, an operation can be in flight and failed at once: it failed.
            .filter(|(r, op)| {
                r.record.live.last_failure.as_ref().and_then(|f| f.op.as_ref()).is_none_or(|f| f.seq != op.seq)
            })
            .collect();
        waiting.sort_by_key(|(r, _)| (progress(r.record), r.rank()));
        out.extend(waiting.into_iter().map(|(r, op)| {
            StuckOp {
                comm: v.comm,
                rank: r.rank_ref(),
                operation: op.coll.name().to_string(),
                seq: op.coll_seq,
                waited_ms: op.waited_ns(now_ns) / 1_000_000,
                peer: op.peer,
                // The peer has its own field; the step names only the state (e.g. `RecvWait`).
                step: op
                    .step_state
                    .map(|st| {
                        crate::record::step_state::name(st).map_or_else(|| format!("step state {st}"), str::to_owned)
                    })
                    .unwrap_or_else(|| "state unknown".to_string()),
            }
        }));
    }
    out
}

/// Per communicator in table order, each rank whose last call failed, the earliest failure first.
pub(super) fn failed_ops(judged: &[Verdict], now_ns: u64) -> Vec<FailedOp> {
    let mut out = Vec::new();
    for v in judged {
        let mut failed: Vec<_> =
            v.view.ranks.iter().filter_map(|r| r.record.live.last_failure.as_ref().map(|f| (r, f))).collect();
        failed.sort_by_key(|(r, f)| (f.at_ns, r.rank()));
        out.extend(failed.into_iter().map(|(r, f)| FailedOp {
            comm: v.comm,
            rank: r.rank_ref(),
            operation: f.op.as_ref().map(|op| (op.coll.name().to_string(), op.coll_seq)),
            ran_ms: f.ran_ns() / 1_000_000,
            ago_ms: now_ns.saturating_sub(f.at_ns) / 1_000_000,
            result: f.result,
            error: f.error.clone(),
        }));
    }
    out
}
