//! A 2-node × 2-rank job started with torchrun's variables only (`MASTER_ADDR`, `MASTER_PORT`, `RANK`,
//! `WORLD_SIZE`, `LOCAL_RANK`, `LOCAL_WORLD_SIZE`): each "node" is a network namespace with its own host name,
//! the two joined by veth pairs that the test creates. No per-node setting tells occl where to listen: the ranks
//! find the interface that routes to the root (IPv4; IPv6 addresses only), or the one `NCCL_SOCKET_IFNAME`
//! names among two. Every collective runs; shared memory within a node, tcp between. Needs root, iproute2 and
//! unshare; without them each test says SKIPPED and why.

mod common;

use common::netns::{node_shell, Netns};
use common::worker;
use occl_tests::launch::{Job, RankOutput, Spawn};
use std::time::Duration;

/// Every collective, every reduction, a few sizes (each rank checks every element).
const EVERY_COLLECTIVE: &str = "dtypes=f32,i64,bf16;counts=1,4099,70000";

/// A job of 4 ranks, ranks 0–1 on node A (namespace `ns.a`, where the root is) and 2–3 on node B, with
/// torchrun's variables for the root `master` and `extra` for every rank; returns every rank's output.
fn torchrun_job(ns: &Netns, master: &str, extra: &[(&str, &str)], spec: &str) -> Vec<RankOutput> {
    let port = 20000 + std::process::id() % 20000;
    let launcher = (0..4)
        .map(|r| {
            let node = if r < 2 { ("nodeA", &ns.a) } else { ("nodeB", &ns.b) };
            [
                ("RANK", r.to_string()),
                ("WORLD_SIZE", "4".into()),
                ("LOCAL_RANK", (r % 2).to_string()),
                ("LOCAL_WORLD_SIZE", "2".into()),
                ("MASTER_ADDR", master.into()),
                ("MASTER_PORT", port.to_string()),
                ("OCCL_TEST_NODE", node.0.into()),
                ("OCCL_TEST_NETNS", node.1.clone()),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .chain(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())))
            .collect()
        })
        .collect();
    let w = worker().to_string_lossy().to_string();
    let args = node_shell(&w, &["matrix", spec]);
    let spawn = Spawn { capture_stdout: true, capture_stderr: true, ..Spawn::default() };
    let job = Job::start(std::path::Path::new("/bin/sh"), &args, launcher, &spawn).expect("start job");
    job.wait(Duration::from_secs(240)).expect("the job finishes")
}

fn assert_ran_over_tcp_between_nodes(outs: &[RankOutput], what: &str) {
    for o in outs {
        assert!(
            o.status.success() && o.output.contains(&format!("OK rank={} ", o.rank)),
            "{what}: rank {} failed ({}):\n{}",
            o.rank,
            o.status,
            o.output
        );
        assert!(o.output.contains("transport=shm+tcp"), "{what}: rank {}: {}", o.rank, o.output);
    }
}

/// Two empty nodes for test `case` (its number tags the namespaces and interfaces, whose names stay within 15
/// bytes), with the tag and a subnet number; `None` after saying SKIPPED when namespaces cannot be made here.
fn nodes(test: &str, case: u32) -> Option<(Netns, u32, u32)> {
    if common::netns::unusable(test).is_some() {
        return None;
    }
    let t = (std::process::id() % 10_000) * 10 + case;
    Some((Netns::pair("omn", t).expect("namespaces"), t, 10 + t % 200))
}

/// Every collective over one link between the nodes, whose ends have the addresses `addr(net, 1)` (node A,
/// where the root is) and `addr(net, 2)`, of prefix length `len`.
fn over_one_link(test: &str, case: u32, addr: fn(u32, u8) -> String, len: u8) {
    let Some((ns, t, net)) = nodes(test, case) else { return };
    let end = |host: u8| format!("{}/{len}", addr(net, host));
    ns.link((&format!("mna{t}"), &end(1)), (&format!("mnb{t}"), &end(2))).expect("link");
    let outs = torchrun_job(&ns, &addr(net, 1), &[], EVERY_COLLECTIVE);
    assert_ran_over_tcp_between_nodes(&outs, test);
}

#[test]
fn two_nodes_over_ipv4_from_torchrun_variables() {
    over_one_link("two_nodes_over_ipv4_from_torchrun_variables", 1, |net, host| format!("10.79.{net}.{host}"), 24);
}

#[test]
fn two_nodes_over_ipv6_only_from_torchrun_variables() {
    over_one_link("two_nodes_over_ipv6_only_from_torchrun_variables", 2, |net, host| format!("fd79:{net}::{host}"), 64);
}

/// Two links between the nodes; the root is on the first, which the route to it would choose.
/// `NCCL_SOCKET_IFNAME=^mn,lo` (all but the first link and loopback) puts the job's traffic on the second.
#[test]
fn nccl_socket_ifname_chooses_among_two_interfaces() {
    let Some((ns, t, net)) = nodes("nccl_socket_ifname_chooses_among_two_interfaces", 3) else { return };
    let (first_b, second_b) = (format!("mnb{t}"), format!("mxb{t}"));
    ns.link((&format!("mna{t}"), &format!("10.79.{net}.1/24")), (&first_b, &format!("10.79.{net}.2/24")))
        .expect("first link");
    ns.link((&format!("mxa{t}"), &format!("10.80.{net}.1/24")), (&second_b, &format!("10.80.{net}.2/24")))
        .expect("second link");
    let sent = |dev: &str| Netns::tx_bytes(&ns.b, dev).expect("tx bytes");
    let before = (sent(&first_b), sent(&second_b));
    let spec = "colls=all_reduce,all_gather,all_to_all;dtypes=f32;ops=sum;counts=1,262144";
    let outs = torchrun_job(&ns, &format!("10.79.{net}.1"), &[("NCCL_SOCKET_IFNAME", "^mn,lo")], spec);
    assert_ran_over_tcp_between_nodes(&outs, "NCCL_SOCKET_IFNAME");
    let (first, second) = (sent(&first_b) - before.0, sent(&second_b) - before.1);
    eprintln!("node B sent {first} bytes on the root's link, {second} on the chosen one");
    // Node B's ranks send their share of 3 collectives of 1 MiB per rank on the chosen link; the root's link
    // carries only their joins to the root.
    assert!(second > 4 << 20, "the chosen link carried {second} bytes");
    assert!(first < second / 50, "the root's link carried {first} bytes, the chosen one {second}");
}
