//! The job summary, from the peer table (dead processes included, as NCCL counts them).

use std::collections::{BTreeSet, HashMap};

use super::groups::{by_frequency, count, host_order, listed};
use crate::mesh::{PeerAddr, PeerTable};
use crate::report::{JobSummary, NodeRef, SummarySpread};

/// GPUs a process drives (NCCL counts its CUDA device bitmask).
fn gpus(p: &PeerAddr) -> u32 {
    count(p.cuda_devs.iter().collect::<BTreeSet<_>>().len())
}

pub(super) fn job_summary(peers: &PeerTable, verbose: bool) -> JobSummary {
    // Nodes in table order; a node is a host, whose processes the address-sorted table keeps together.
    let mut nodes: Vec<(&str, Vec<&PeerAddr>)> = Vec::new();
    let mut node_of: HashMap<&str, usize> = HashMap::new();
    for (_, p) in peers.iter() {
        let i = *node_of.entry(p.host.as_str()).or_insert_with(|| {
            nodes.push((p.host.as_str(), Vec::new()));
            nodes.len() - 1
        });
        nodes[i].1.push(p);
    }
    let procs = || nodes.iter().flat_map(|(_, ps)| ps.iter().copied());
    let first_ppn = nodes.first().map_or(0, |(_, ps)| count(ps.len()));
    let first_gpus = procs().next().map_or(0, gpus);
    let mut summary = JobSummary {
        nodes: count(nodes.len()),
        processes_per_node: first_ppn,
        gpus_per_process: first_gpus,
        processes_total: count(peers.len()),
        gpus_total: procs().map(gpus).fold(0u32, u32::saturating_add),
        spread: None,
    };
    let uniform_gpus = procs().all(|p| gpus(p) == first_gpus);
    if uniform_gpus && nodes.iter().all(|(_, ps)| count(ps.len()) == first_ppn) {
        return summary;
    }

    let mut shapes: Vec<(u32, Vec<NodeRef>)> = by_frequency(nodes.iter().map(|(host, ps)| {
        let mut pids: Vec<u32> = ps.iter().map(|p| p.pid).collect();
        pids.sort_unstable();
        (count(ps.len()), NodeRef { host: host.to_string(), pids })
    }));
    for (_, ns) in &mut shapes {
        ns.sort_by(|a, b| host_order(&a.host).cmp(&host_order(&b.host)));
    }
    let mut spread = SummarySpread {
        processes_per_node: shapes.iter().map(|(ppn, ns)| (count(ns.len()), *ppn)).collect(),
        ..SummarySpread::default()
    };
    if uniform_gpus {
        spread.uniform_gpus = Some(first_gpus);
        // The most frequent shape is taken as the norm; rarer ones are listed when they are outliers.
        spread.outlier_nodes = shapes
            .into_iter()
            .skip(1)
            .filter(|(_, ns)| listed(count(ns.len()), verbose, Some(summary.nodes)))
            .map(|(_, ns)| ns)
            .collect();
    } else {
        let by_gpus = by_frequency(procs().map(|p| (gpus(p), ())));
        spread.gpus_per_process = by_gpus.iter().map(|(g, ps)| (count(ps.len()), *g)).collect();
    }
    summary.spread = Some(spread);
    summary
}
