use std::time::Duration;

use super::sim::peer_addr;
use crate::mesh::news::NewsBook;
use crate::mesh::*;
use crate::wire::NewsItem;

#[test]
fn table_sorts_by_address_and_finds_peers() {
    let mk =
        |addr: &str| PeerAddr { addr: addr.into(), host: String::new(), pid: 1, cuda_devs: vec![], nvml_devs: vec![] };
    let t = PeerTable::new(vec![
        mk("[::1]:5"),
        mk("10.0.0.2:80"),
        mk("not-an-address"),
        mk("10.0.0.10:7"),
        mk("10.0.0.2:9"),
    ])
    .expect("table");
    let order: Vec<&str> = t.iter().map(|(_, p)| p.addr.as_str()).collect();
    assert_eq!(order, ["10.0.0.2:9", "10.0.0.2:80", "10.0.0.10:7", "[::1]:5", "not-an-address"]);
    assert_eq!(t.find("10.0.0.10:7"), Some(PeerId(2)));
    assert_eq!(t.find("not-an-address"), Some(PeerId(4)));
    assert_eq!(t.find("10.0.0.3:1"), None);
    // Same set in another order: same table.
    let u = PeerTable::new(vec![
        mk("10.0.0.2:9"),
        mk("not-an-address"),
        mk("10.0.0.10:7"),
        mk("[::1]:5"),
        mk("10.0.0.2:80"),
    ])
    .expect("table");
    assert_eq!(t.hash(), u.hash());
    assert!(matches!(PeerTable::new(vec![mk("a"), mk("a")]), Err(MeshError::DuplicateAddr(_))));
    assert!(matches!(PeerTable::new(vec![]), Err(MeshError::TableSize(0))));
}

#[test]
fn ring_and_long_range_shape() {
    assert_eq!(strides(8, true), [1]);
    assert_eq!(strides(1024, true), [1, 10, 102]);
    assert_eq!(strides(1024, false), [1]);
    let all = |_| true;
    assert_eq!(link_targets(8, PeerId(0), &[1], all), [PeerId(1), PeerId(7)]);
    assert_eq!(link_targets(2, PeerId(0), &[1], all), [PeerId(1)], "two processes share one link");
    assert_eq!(link_targets(1, PeerId(0), &[1], all), []);
    // Dead or silent neighbours are skipped: the next live peer in that direction is the fallback.
    let live = |p: PeerId| p.0 != 1 && p.0 != 2 && p.0 != 7;
    assert_eq!(link_targets(8, PeerId(0), &[1], live), [PeerId(3), PeerId(6)]);
    assert_eq!(link_targets(8, PeerId(0), &[1], |p| p.0 == 0), []);
    let t = link_targets(1024, PeerId(5), &strides(1024, true), all);
    let mut ids: Vec<u32> = t.iter().map(|p| p.0).collect();
    ids.sort();
    assert_eq!(ids, [4, 6, 15, 107, 927, 1019]);
}

#[test]
fn news_is_a_lattice_and_its_digest_ignores_order() {
    let items = [
        NewsItem { peer: PeerId(3), epoch: 0, dead: true },
        NewsItem { peer: PeerId(3), epoch: 1, dead: false },
        NewsItem { peer: PeerId(5), epoch: 0, dead: true },
        NewsItem { peer: PeerId(3), epoch: 0, dead: false },
        NewsItem { peer: PeerId(9), epoch: 0, dead: true }, // not in the table
    ];
    let mut a = NewsBook::new(8);
    let applied: Vec<bool> = items.iter().map(|i| a.apply(*i)).collect();
    assert_eq!(applied, [true, true, true, false, false]);
    let mut b = NewsBook::new(8);
    for i in items.iter().rev() {
        b.apply(*i);
    }
    assert_eq!(a.digest(), b.digest());
    assert_eq!(a.items(), b.items());
    assert_eq!(a.dead_peers(), [PeerId(5)]);
    assert_eq!(a.dead_count(), 1);
    assert!(!a.is_dead(PeerId(3)));
    assert_ne!(a.digest(), NewsBook::new(8).digest());
    // Applying the same news again changes nothing: that is what stops a flood.
    assert!(items.iter().all(|i| !a.apply(*i)));
}

#[test]
fn config_from_environment() {
    let none = |_: &str| None;
    assert_eq!(MeshConfig::from_vars(none).expect("cfg"), MeshConfig::default());
    let vars = |k: &str| match k {
        "NCCL_RAS_TIMEOUT_FACTOR" => Some("3".to_string()),
        "OCCL_RAS_DEAD_TIMEOUT" => Some("90".to_string()),
        _ => None,
    };
    let cfg = MeshConfig::from_vars(vars).expect("cfg");
    assert_eq!(cfg.keepalive, Duration::from_secs(3));
    assert_eq!(cfg.unresponsive_after, Duration::from_secs(15));
    assert_eq!(cfg.dead_timeout, Duration::from_secs(90), "the dead timeout is absolute");
    assert_eq!(cfg.status_budget(crate::client::Timeout::Default), Duration::from_secs(15));
    assert_eq!(cfg.status_budget(crate::client::Timeout::Seconds(2)), Duration::from_secs(2));
    assert_eq!(cfg.status_budget(crate::client::Timeout::Disabled), MAX_BUDGET);
    let bad = |k: &str| (k == "OCCL_RAS_DEAD_TIMEOUT").then(|| "soon".to_string());
    assert!(matches!(MeshConfig::from_vars(bad), Err(MeshError::BadVar(..))));
    let zero = |k: &str| (k == "OCCL_RAS_TIMEOUT_FACTOR").then(|| "0".to_string());
    assert!(MeshConfig::from_vars(zero).is_err());
}

#[test]
fn a_process_not_in_the_table_is_refused() {
    let table = PeerTable::new((0..3).map(peer_addr).collect()).expect("table");
    let err = Mesh::new(MeshConfig::default(), table, "10.9.9.9:1", [0; 16], [0; 16], Default::default(), 0);
    assert!(matches!(err, Err(MeshError::NotInTable(_))));
}

#[test]
fn hostile_connections_never_break_a_mesh() {
    // The mesh fuzz target's body over random message streams, whole and damaged, from a stranger and from an
    // authenticated peer (a fixed seed, so any failure replays).
    use crate::test_rng::TestRng;
    use crate::wire::{
        encode, tests::random_msg, ByeReason, KeepAlive, Msg, NewsId, NewsItem, PeerNews, StatusReply, StatusRequest,
    };
    let mut rng = TestRng::new(77);
    let table = PeerTable::new((0..4).map(crate::mesh::fuzz::peer).collect()).expect("table");
    for case in 0..20_000u32 {
        let mut bytes = vec![case as u8];
        if case % 4 == 0 {
            // A stranger that gets as far as a well-formed hello.
            let hello = crate::wire::Hello {
                table_hash: table.hash(),
                from: PeerId(1),
                from_addr: crate::mesh::fuzz::peer(1).addr,
                epoch: 0,
                nonce: [3; 16],
            };
            encode(&Msg::Hello(hello), &mut bytes).expect("encode");
        }
        for _ in 0..1 + rng.usize(8) {
            // Plausible messages for a 4-process job as well as random ones.
            let msg = match rng.below(6) {
                0 => Msg::PeerNews(PeerNews {
                    id: NewsId { origin: PeerId(1), seq: rng.below(4) },
                    items: (0..1 + rng.usize(3))
                        .map(|_| NewsItem {
                            peer: PeerId(rng.below(5) as u32),
                            epoch: rng.below(3) as u32,
                            dead: rng.chance(50),
                        })
                        .collect(),
                }),
                1 => Msg::StatusRequest(StatusRequest {
                    id: RequestId { origin: PeerId(rng.below(5) as u32), seq: rng.below(4) },
                    budget_ns: rng.wide(),
                    path: vec![PeerId(1)],
                }),
                2 => Msg::StatusReply(StatusReply {
                    id: RequestId { origin: PeerId(0), seq: rng.wide() },
                    duplicate: rng.chance(50),
                    leg_timeouts: rng.wide() as u32,
                    statuses: vec![],
                }),
                3 => Msg::KeepAlive(KeepAlive {
                    table_hash: rng.u64(),
                    news_digest: rng.u64(),
                    dead: 0,
                    unresponsive: 0,
                    link: rng.chance(50),
                }),
                4 => Msg::Bye(ByeReason::from_code(rng.below(5) as u8)),
                _ => random_msg(&mut rng),
            };
            encode(&msg, &mut bytes).expect("encode");
        }
        if rng.chance(30) {
            let i = 1 + rng.usize(bytes.len());
            bytes.truncate(i);
        }
        if rng.chance(20) && bytes.len() > 1 {
            let i = 1 + rng.usize(bytes.len() - 1);
            bytes[i] ^= 1 << rng.below(8);
        }
        fuzz_mesh_bytes(&bytes);
    }
}
