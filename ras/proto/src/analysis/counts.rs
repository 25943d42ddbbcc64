//! Which launch counters of a communicator stay apart. Read one rank at a time, a healthy job's counters disagree
//! for a moment all the time: a rank has launched the next operation and the others have not yet, or one rank's
//! record was read just before an operation that another's, read later, has already finished. Neither is a
//! mismatch, so a counter is compared as settled:
//!
//! - an operation in flight for less than the grace period is in flight, not launched: the rank may be the first
//!   to reach it;
//! - an AllReduce, AllGather or ReduceScatter that any rank completed was launched by every rank (each rank's
//!   result needs every rank's data), however early a record was read.
//!
//! Counters that differ after that stay apart: a rank waits in an operation the others never launched (for longer
//! than the grace period), or the ranks stopped with different counts.

use super::gathered::CommView;
use crate::record::{CollType, RankRecord};

/// Collectives whose completion on one rank proves that every rank launched them.
const EVERY_RANK_JOINS: [CollType; 3] = [CollType::AllGather, CollType::ReduceScatter, CollType::AllReduce];

/// The rank's count of `coll`, less its operation in flight if that started less than `grace_ns` before `now_ns`.
fn settled(r: &RankRecord, coll: CollType, now_ns: u64, grace_ns: u64) -> u64 {
    let launched = r.launched(coll);
    let young = r
        .live
        .in_flight
        .as_ref()
        .is_some_and(|op| op.coll == coll && op.coll_seq == launched && op.waited_ns(now_ns) < grace_ns);
    launched - u64::from(young && launched > 0)
}

/// NCCL's counted collectives whose settled counts differ between the communicator's ranks, in NCCL's order.
pub(super) fn apart(view: &CommView, now_ns: u64, grace_ns: u64) -> Vec<CollType> {
    CollType::NCCL_COUNTED
        .into_iter()
        .filter(|&c| {
            let floor = if EVERY_RANK_JOINS.contains(&c) {
                view.ranks.iter().map(|r| r.record.completed(c)).max().unwrap_or(0)
            } else {
                0
            };
            let mut counts = view.ranks.iter().map(|r| settled(r.record, c, now_ns, grace_ns).max(floor));
            counts.next().is_some_and(|first| counts.any(|n| n != first))
        })
        .collect()
}
