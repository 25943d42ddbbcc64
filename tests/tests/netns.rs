//! RAS across two "nodes": network namespaces joined by a veth pair that this test creates, with two ranks in
//! each. Cutting the link must leave the near side reporting the far side's processes. Needs root and iproute2
//! (the test command installs iproute2; CI runs as root); without them the test says it was skipped and why.

mod common;

use common::netns::{in_netns, Netns};
use common::{env, worker};
use occl_tests::launch::{Job, Spawn};
use occl_tests::ras_client::free_port;
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

fn status_in(ns: &str, port: u16) -> String {
    in_netns(ns, || {
        let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect to RAS in the namespace");
        s.set_read_timeout(Some(Duration::from_secs(20))).expect("timeout");
        s.write_all(b"STATUS\n").expect("send");
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        out
    })
}

#[test]
fn a_cut_link_leaves_the_far_nodes_processes_reported() {
    if common::netns::unusable("a_cut_link_leaves_the_far_nodes_processes_reported").is_some() {
        return;
    }
    let tag = std::process::id() % 100_000;
    let ns = match Netns::create(tag) {
        Ok(n) => n,
        Err(e) => {
            eprintln!("SKIPPED a_cut_link_leaves_the_far_nodes_processes_reported: cannot create namespaces: {e}");
            return;
        }
    };
    let net = 10 + tag % 200;
    let port = free_port();
    let (ip_a, ip_b) = (format!("10.77.{net}.1"), format!("10.77.{net}.2"));
    let ras = format!("127.0.0.1:{port}");
    let ranks = [(&ns.a, &ip_a, "nodeA"), (&ns.a, &ip_a, "nodeA"), (&ns.b, &ip_b, "nodeB"), (&ns.b, &ip_b, "nodeB")];
    let spawn = Spawn {
        env: env(&[("OCCL_RAS_ADDR", &ras), ("OCCL_RAS_DEAD_TIMEOUT", "8"), ("OCCL_TIMEOUT", "60")]),
        rank_env: ranks
            .iter()
            .map(|(n, a, h)| env(&[("OCCL_TEST_NETNS", n), ("OCCL_SOCKET_ADDR", a), ("OCCL_HOSTID", h)]))
            .collect(),
        capture_stdout: true,
        capture_stderr: true,
        root_ip: Some(IpAddr::V4(Ipv4Addr::new(10, 77, net as u8, 1))),
    };
    let w = worker().to_string_lossy().to_string();
    let args: Vec<String> = ["-c", "exec ip netns exec \"$OCCL_TEST_NETNS\" \"$0\" \"$@\"", &w, "idle"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let job = in_netns(&ns.a, || Job::spawn(std::path::Path::new("/bin/sh"), &args, 4, &spawn).expect("start job"));
    job.wait_for_all("READY", Duration::from_secs(30)).expect("ranks ready");
    let row = |t: &str| {
        t.lines().find(|l| l.trim_start().starts_with("0 ")).map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
    };
    // 2 nodes, 2 ranks per node, 4 ranks, all fine, once the mesh has linked the two sides (ranks report READY
    // before their RAS connections are up).
    let t = Instant::now();
    loop {
        let before = status_in(&ns.a, port);
        if row(&before).as_deref() == Some("0 1 2 2 4 4 RUNNING OK") {
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(15), "the job never looked whole:\n{before}");
        std::thread::sleep(Duration::from_millis(200));
    }
    ns.cut(tag).expect("cut the link");
    let t = Instant::now();
    let after = loop {
        let text = status_in(&ns.a, port);
        if text.contains("INCOMPLETE") {
            break text;
        }
        assert!(t.elapsed() < Duration::from_secs(20), "the far side still looks complete:\n{text}");
        std::thread::sleep(Duration::from_millis(500));
    };
    eprintln!("far side missing {:?} after the cut:\n{after}", t.elapsed());
    for pid in [job.children[2].id(), job.children[3].id()] {
        assert!(after.contains(&format!("process {pid} on node {ip_b}")), "far process {pid} not named:\n{after}");
    }
    assert!(after.contains("Missing communicator data from 2 ranks"), "{after}");
    drop(job);
}
