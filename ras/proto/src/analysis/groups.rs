//! Ranks, processes or nodes that share a value: NCCL's order for such groups, its rule for when a group's members
//! are listed, and its order for hosts.

use std::cmp::Reverse;
use std::collections::BTreeMap;
use std::net::IpAddr;

use crate::report::{RankGroup, RankRef};

/// Outside verbose mode, NCCL lists the members of a group only up to this size.
const DETAIL_THRESHOLD: u64 = 10;

/// Whether a group of `count` gets its members listed (NCCL's outlier rule, `nccl-ras.md` §4.6). `total` is what the
/// group is part of (a communicator's ranks, the job's nodes), `None` for job-level lists.
pub(super) fn listed(count: u32, verbose: bool, total: Option<u32>) -> bool {
    let (c, t) = (u64::from(count), total.map(u64::from));
    if c == 1 {
        return true;
    }
    if verbose {
        // Fewer than half of the total.
        t.is_none_or(|t| 2 * c < t)
    } else {
        // At most a quarter of the total.
        c <= DETAIL_THRESHOLD && t.is_none_or(|t| 4 * c <= t)
    }
}

/// Groups `(key, member)` pairs by key: the most frequent key first, ties by key descending; members keep their input
/// order.
pub(super) fn by_frequency<K: Ord, M>(items: impl IntoIterator<Item = (K, M)>) -> Vec<(K, Vec<M>)> {
    let mut by_key: BTreeMap<K, Vec<M>> = BTreeMap::new();
    for (k, m) in items {
        by_key.entry(k).or_default().push(m);
    }
    let mut groups: Vec<(K, Vec<M>)> = by_key.into_iter().rev().collect();
    // Stable, so equal counts stay in descending key order.
    groups.sort_by_key(|g| Reverse(g.1.len()));
    groups
}

pub(super) fn count(len: usize) -> u32 {
    u32::try_from(len).unwrap_or(u32::MAX)
}

/// The report's rank groups, with members dropped where the outlier rule hides them.
pub(super) fn rank_groups<V>(groups: Vec<(V, Vec<RankRef>)>, verbose: bool, total: Option<u32>) -> Vec<RankGroup<V>> {
    groups
        .into_iter()
        .map(|(value, members)| {
            let count = count(members.len());
            let members = if listed(count, verbose, total) { members } else { Vec::new() };
            RankGroup { value, count, members }
        })
        .collect()
}

/// Sort key for a node as NCCL orders them: by address (IPv4 before IPv6), then names that are not addresses.
pub(super) fn host_order(host: &str) -> (bool, Option<IpAddr>, &str) {
    let ip = host.parse::<IpAddr>().ok();
    (ip.is_none(), ip, host)
}
