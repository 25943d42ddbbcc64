//! Whole jobs on the simulated network: the situations of the NCCL captures (SIGKILL, SIGSTOP) and worse.

use std::time::Duration;

use super::sim::{Cut, Sim, MS, SEC};
use crate::mesh::*;
use crate::record::convert::comm_data;
use crate::record::{step_state, CollType};
use crate::report::MissingRankData;

const PEER_NEWS: usize = 5;
const STATUS_REQUEST: usize = 6;
const STATUS_REPLY: usize = 7;

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

fn peers(ids: &[usize]) -> Vec<PeerId> {
    ids.iter().map(|&i| PeerId(i as u32)).collect()
}

fn answered(r: &GatherResult) -> Vec<usize> {
    let mut v: Vec<usize> = r.statuses.iter().map(|s| s.peer.0 as usize).collect();
    v.sort();
    v
}

/// A job that has had time to connect: every process holds its wanted links.
fn healthy(n: usize) -> Sim {
    let mut sim = Sim::new(n, MeshConfig::default());
    sim.run_until(3 * SEC);
    for p in 0..n {
        let m = sim.mesh(p);
        let connected = m.connected_peers();
        for l in m.desired_links() {
            assert!(connected.contains(l), "process {p} lacks its link to {l}");
        }
    }
    sim
}

fn dead_events(sim: &Sim, victim: usize) -> Vec<(Time, usize, MonitorEvent)> {
    sim.events_where(|e| matches!(e, MonitorEvent::PeerDead { peer, .. } if peer.0 as usize == victim))
}

#[test]
fn healthy_job_of_8_gathers_everyone() {
    let mut sim = healthy(8);
    assert!(sim
        .events_where(|e| matches!(e, MonitorEvent::PeerDead { .. } | MonitorEvent::PeerUnresponsive { .. }))
        .is_empty());
    for p in 0..8 {
        assert_eq!(sim.mesh(p).desired_links().len(), 2, "a ring: two neighbours");
    }
    // Rank 5 is stuck in an all-reduce, waiting to receive from rank 6.
    let stuck = sim.procs[5].comm.live().launch(CollType::AllReduce, 1 << 20, 123_456);
    sim.procs[5].comm.live().waiting_on(Some(6), Some(step_state::RECV_WAIT));
    let (took, r) = sim.gather(3, secs(5));
    assert_eq!(answered(&r), (0..8).collect::<Vec<_>>());
    let five = r.statuses.iter().find(|s| s.peer == PeerId(5)).expect("process 5");
    let op = five.records[0].live.in_flight.clone().expect("in flight");
    assert_eq!(
        (op.seq, op.coll, op.coll_seq, op.bytes, op.start_ns),
        (stuck, CollType::AllReduce, 11, 1 << 20, 123_456)
    );
    assert_eq!(op.waiting_label(), "RecvWait on rank 6");
    assert_eq!(r.statuses[0].peer, PeerId(3), "the originator first");
    assert!(r.missing.is_empty() && r.dead.is_empty() && r.unresponsive.is_empty());
    assert_eq!(r.leg_timeouts, 0);
    assert!(took < 5 * MS, "took {took} ns");
    // The records make a report: one communicator, every rank, nothing missing.
    let records: Vec<_> = r.statuses.iter().flat_map(|s| s.records.iter()).collect();
    let comms = comm_data(records, |_, rank| MissingRankData {
        rank,
        host: String::new(),
        pid: 0,
        cuda_dev: 0,
        nvml_dev: 0,
        unresponsive: true,
        considered_dead: false,
    });
    assert_eq!(comms.len(), 1);
    assert_eq!(comms[0].ranks.len(), 8);
    assert!(comms[0].missing_ranks.is_empty());
    let counts: Vec<u64> = comms[0].ranks.iter().map(|r| r.collective_counts[4]).collect();
    assert_eq!(counts, [10, 10, 10, 10, 10, 11, 10, 10], "launched, not completed");
    // Steady state: keep-alives only, one per connection direction per second.
    sim.reset_counters();
    sim.run_for(10 * SEC);
    let per_sec = sim.total_sent() / 10;
    assert_eq!(sim.total_sent(), sim.sent[4], "only keep-alives");
    assert!(per_sec <= 16, "{per_sec} messages per second for 8 connections");
}

#[test]
fn sigkill_is_dead_everywhere_within_5s_and_flooded_once() {
    let mut sim = healthy(8);
    let t0 = sim.now;
    let edges: usize = (0..8).map(|p| sim.mesh(p).connected_peers().len()).sum::<usize>() / 2;
    sim.reset_counters();
    sim.kill(5);
    sim.run_for(10 * SEC);
    let dead = dead_events(&sim, 5);
    let mut who: Vec<usize> = dead.iter().map(|(_, p, _)| *p).collect();
    who.sort();
    assert_eq!(who, [0, 1, 2, 3, 4, 6, 7], "every survivor, exactly once");
    let worst = dead.iter().map(|(t, _, _)| t - t0).max().unwrap_or(0);
    assert!(worst <= 5 * SEC, "detection took {worst} ns");
    // Neighbours saw the reset and a refused reconnect; everyone else heard the news.
    for (_, p, e) in &dead {
        let MonitorEvent::PeerDead { cause, .. } = e else { unreachable!() };
        match p {
            4 | 6 => assert_eq!(*cause, DeadCause::ConnectionLost),
            _ => assert!(matches!(cause, DeadCause::News { .. }), "{p}: {cause:?}"),
        }
    }
    assert!(sim.events_where(|e| matches!(e, MonitorEvent::PeerDead { peer, .. } if peer.0 != 5)).is_empty());
    // Each process forwards the news once per connection at most.
    let news = sim.sent[PEER_NEWS];
    assert!(news as usize <= 2 * (edges + 1), "{news} news messages over {edges} connections");
    eprintln!("SIGKILL, 8 processes: DEAD everywhere after {:.3} ms, {news} news messages", worst as f64 / 1e6);
    // The survivors re-linked around the dead one, and a gather lists it as missing and dead.
    assert!(sim.mesh(4).connected_peers().contains(&PeerId(6)));
    let (_, r) = sim.gather(0, secs(5));
    assert_eq!(answered(&r), [0, 1, 2, 3, 4, 6, 7]);
    assert_eq!((r.missing.clone(), r.dead.clone()), (peers(&[5]), peers(&[5])));
    assert_eq!(r.leg_timeouts, 0);
}

#[test]
fn sigstop_is_unresponsive_within_5s_and_alive_again_on_resume_without_any_dead() {
    let mut sim = healthy(8);
    let t0 = sim.now;
    sim.freeze(3);
    sim.run_until(t0 + 5 * SEC + MS);
    let silent = sim.events_where(|e| matches!(e, MonitorEvent::PeerUnresponsive { peer, .. } if peer.0 == 3));
    let mut who: Vec<usize> = silent.iter().map(|(_, p, _)| *p).collect();
    who.sort();
    assert_eq!(who, [2, 4], "its two neighbours notice");
    let worst = silent.iter().map(|(t, _, _)| t - t0).max().unwrap_or(0);
    assert!(worst <= 5 * SEC, "took {worst} ns");
    eprintln!("SIGSTOP, 8 processes: UNRESPONSIVE after {:.3} s", worst as f64 / 1e9);
    // The ring closes around it.
    sim.run_for(SEC);
    assert!(sim.mesh(2).connected_peers().contains(&PeerId(4)));
    assert_eq!(sim.mesh(2).health(PeerId(3)), PeerHealth::Unresponsive);
    // A gather meanwhile skips it at once and lists it as missing, not dead.
    let (took, r) = sim.gather(0, secs(5));
    assert!(took < 5 * MS, "took {took} ns");
    assert_eq!((r.missing.clone(), r.unresponsive.clone(), r.dead.clone()), (peers(&[3]), peers(&[3]), vec![]));

    sim.run_until(30 * SEC);
    sim.thaw(3);
    sim.run_until(100 * SEC);
    let back = sim.events_where(|e| matches!(e, MonitorEvent::PeerAlive { peer, from_dead: false } if peer.0 == 3));
    let mut who: Vec<usize> = back.iter().map(|(_, p, _)| *p).collect();
    who.sort();
    who.dedup();
    assert_eq!(who, [2, 4]);
    assert!(back.iter().all(|(t, _, _)| *t - 30 * SEC < 10 * MS), "alive as soon as its messages flow");
    assert!(
        sim.events_where(|e| matches!(e, MonitorEvent::PeerDead { .. })).is_empty(),
        "nobody is ever declared dead"
    );
    assert!(sim.events_where(|e| matches!(e, MonitorEvent::DeclaredDead { .. })).is_empty());
    // The resumed process did not blame anyone for its own pause.
    assert!(sim.events.iter().all(|(_, p, e)| *p != 3 || !matches!(e, MonitorEvent::PeerUnresponsive { .. })));
    for p in 0..8 {
        assert!(sim.mesh(p).table().ids().all(|q| sim.mesh(p).health(q) == PeerHealth::Alive));
    }
    // The fallback link went away once nobody needed it; the ring is back.
    assert!(!sim.mesh(2).connected_peers().contains(&PeerId(4)));
    let (_, r) = sim.gather(0, secs(5));
    assert_eq!(answered(&r).len(), 8);
}

#[test]
fn stopped_longer_than_the_dead_timeout_is_dead_and_rejoins_when_resumed() {
    let mut sim = healthy(8);
    let t0 = sim.now;
    sim.freeze(3);
    sim.run_until(t0 + 58 * SEC);
    assert!(dead_events(&sim, 3).is_empty(), "not before the dead timeout");
    sim.run_until(t0 + 62 * SEC);
    let dead = dead_events(&sim, 3);
    assert_eq!(dead.len(), 7, "every other process, once");
    let first = dead.iter().map(|(t, _, _)| t - t0).min().unwrap_or(0);
    let last = dead.iter().map(|(t, _, _)| t - t0).max().unwrap_or(0);
    // 60 s after the last message it sent, which was at most a keep-alive interval before it stopped.
    assert!((59 * SEC..=60 * SEC).contains(&first), "{first}");
    assert!(last - first < 10 * MS, "the news spreads in milliseconds");
    eprintln!(
        "SIGSTOP beyond the dead timeout: DEAD after {:.3} s, everywhere within {:.3} ms",
        first as f64 / 1e9,
        (last - first) as f64 / 1e6
    );
    let (_, r) = sim.gather(0, secs(5));
    assert_eq!((r.missing.clone(), r.dead.clone()), (peers(&[3]), peers(&[3])));

    // SIGCONT: it finds its connections closed, reconnects, learns it was declared dead and refutes it.
    sim.run_until(70 * SEC);
    sim.thaw(3);
    sim.run_until(75 * SEC);
    assert_eq!(sim.mesh(3).epoch(), 1);
    assert_eq!(sim.events_where(|e| matches!(e, MonitorEvent::DeclaredDead { epoch: 1 })).len(), 1);
    let alive = sim.events_where(|e| matches!(e, MonitorEvent::PeerAlive { peer, from_dead: true } if peer.0 == 3));
    assert_eq!(alive.len(), 7, "every other process, once");
    // The resumed process declared nobody dead.
    assert!(sim.events.iter().all(|(_, p, e)| *p != 3 || !matches!(e, MonitorEvent::PeerDead { .. })));
    for p in 0..8 {
        assert!(sim.mesh(p).table().ids().all(|q| sim.mesh(p).health(q) == PeerHealth::Alive), "view of {p}");
    }
    let (_, r) = sim.gather(0, secs(5));
    assert_eq!(answered(&r).len(), 8);
    assert_eq!(r.statuses.iter().find(|s| s.peer == PeerId(3)).map(|s| s.epoch), Some(1));
}

#[test]
fn gather_with_one_dead_and_one_stopped_process_finishes_within_budget() {
    let mut sim = healthy(8);
    sim.kill(6);
    sim.run_for(2 * SEC);
    sim.freeze(2);
    sim.run_for(500 * MS);
    let budget = secs(3);
    let (took, r) = sim.gather(0, budget);
    assert!(took <= budget.as_nanos() as u64, "took {took} ns");
    assert!(took >= 2 * SEC, "it did wait for the stopped process ({took} ns)");
    assert_eq!(answered(&r), [0, 1, 3, 4, 5, 7]);
    assert_eq!(r.missing, peers(&[2, 6]));
    assert_eq!(r.dead, peers(&[6]));
    assert!(r.leg_timeouts >= 1);
    eprintln!(
        "gather with a dead and a stopped process: {:.3} s of a {} s budget, {} leg timeouts",
        took as f64 / 1e9,
        budget.as_secs(),
        r.leg_timeouts
    );
    // Once the stopped process is known to be silent, gathers skip it and return at once.
    sim.run_for(5 * SEC);
    let (took, r) = sim.gather(0, budget);
    assert!(took < 5 * MS, "took {took} ns");
    assert_eq!((r.missing.clone(), r.dead.clone(), r.unresponsive.clone()), (peers(&[2, 6]), peers(&[6]), peers(&[2])));
}

#[test]
fn partition_each_side_reports_the_other_missing() {
    let mut sim = healthy(8);
    sim.cut(vec![0, 0, 0, 0, 1, 1, 1, 1], Cut::Reset);
    sim.run_for(5 * SEC);
    let (_, a) = sim.gather(1, secs(2));
    let (_, b) = sim.gather(6, secs(2));
    assert_eq!(answered(&a), [0, 1, 2, 3]);
    assert_eq!(a.missing, peers(&[4, 5, 6, 7]));
    assert_eq!(answered(&b), [4, 5, 6, 7]);
    assert_eq!(b.missing, peers(&[0, 1, 2, 3]));
    // The processes at the cut saw their connections reset and reconnects refused: dead at once.
    assert_eq!(a.dead, peers(&[4, 7]));
    assert_eq!(b.dead, peers(&[0, 3]));
    // The rest cannot be reached either: unresponsive after 5 s, dead after the dead timeout.
    sim.run_for(70 * SEC);
    let (_, a) = sim.gather(1, secs(2));
    assert_eq!(answered(&a), [0, 1, 2, 3]);
    assert_eq!(a.dead, peers(&[4, 5, 6, 7]));
}

#[test]
fn silent_partition_makes_the_other_side_unresponsive() {
    let mut sim = healthy(8);
    sim.cut(vec![0, 0, 0, 0, 1, 1, 1, 1], Cut::Silent);
    sim.run_for(6 * SEC);
    let (took, a) = sim.gather(1, secs(2));
    assert!(took < 5 * MS);
    assert_eq!(answered(&a), [0, 1, 2, 3]);
    assert_eq!(a.missing, peers(&[4, 5, 6, 7]));
    assert_eq!(a.unresponsive, peers(&[4, 7]));
    assert!(a.dead.is_empty());
    // Nothing closes and nothing is refused: dead only after the dead timeout of silence or unreachability.
    sim.run_for(50 * SEC);
    assert!(sim.events_where(|e| matches!(e, MonitorEvent::PeerDead { .. })).is_empty());
    sim.run_for(20 * SEC);
    let (_, a) = sim.gather(1, secs(2));
    assert_eq!(a.dead, peers(&[4, 5, 6, 7]));
}

#[test]
fn scale_1024_processes_gather_with_linear_messages() {
    let n = 1024;
    let mut sim = healthy(n);
    let edges: usize = (0..n).map(|p| sim.mesh(p).connected_peers().len()).sum::<usize>() / 2;
    assert_eq!(edges, 3 * n, "ring plus two long-range strides: 3 links per process");
    sim.reset_counters();
    let (took, r) = sim.gather(0, secs(10));
    assert_eq!(r.statuses.len(), n);
    assert!(r.missing.is_empty());
    assert_eq!(r.leg_timeouts, 0);
    let msgs = sim.sent[STATUS_REQUEST] + sim.sent[STATUS_REPLY];
    let bytes = sim.bytes[STATUS_REQUEST] + sim.bytes[STATUS_REPLY];
    // Every connection carries at most a request and a reply each way.
    assert!(msgs as usize <= 4 * edges, "{msgs} messages over {edges} connections");
    assert!(msgs as usize <= 12 * n);
    eprintln!(
        "1024 processes: gather in {:.3} ms virtual ({} us per hop), {msgs} messages ({:.2} per process), {:.1} MB, {edges} connections",
        took as f64 / 1e6,
        sim.latency / 1000,
        msgs as f64 / n as f64,
        bytes as f64 / 1e6
    );
    // Failure at scale: a killed process is dead everywhere quickly and the news costs O(N) messages.
    sim.reset_counters();
    let t0 = sim.now;
    sim.kill(500);
    sim.run_for(5 * SEC);
    let dead = dead_events(&sim, 500);
    assert_eq!(dead.len(), n - 1);
    let worst = dead.iter().map(|(t, _, _)| t - t0).max().unwrap_or(0);
    assert!(worst <= 5 * SEC);
    assert!(sim.sent[PEER_NEWS] as usize <= 2 * edges + n);
    eprintln!(
        "1024 processes: SIGKILL DEAD everywhere after {:.3} ms, {} news messages",
        worst as f64 / 1e6,
        sim.sent[PEER_NEWS]
    );
    let (_, r) = sim.gather(1, secs(10));
    assert_eq!(r.statuses.len(), n - 1);
    assert_eq!(r.dead, peers(&[500]));
}

#[test]
fn two_processes_share_one_connection() {
    let mut sim = Sim::new(2, MeshConfig::default());
    sim.run_until(2 * SEC);
    assert_eq!(sim.mesh(0).connection_count(), 1);
    assert_eq!(sim.mesh(1).connection_count(), 1);
    let (_, r) = sim.gather(1, secs(1));
    assert_eq!(answered(&r), [0, 1]);
    sim.kill(0);
    sim.run_for(SEC);
    assert_eq!(dead_events(&sim, 0).len(), 1);
    let (_, r) = sim.gather(1, secs(1));
    assert_eq!((answered(&r), r.dead), (vec![1], peers(&[0])));
}

#[test]
fn a_clean_shutdown_says_goodbye() {
    let mut sim = healthy(6);
    sim.reset_counters();
    sim.shutdown(2);
    assert!(sim.sent[8] >= 2, "a goodbye to each neighbour");
    assert_eq!(sim.mesh(2).poll_timeout(), None);
    sim.run_for(SEC);
    let dead = dead_events(&sim, 2);
    assert_eq!(dead.len(), 5, "every other process, once");
    for (_, p, e) in &dead {
        if *p == 1 || *p == 3 {
            assert!(matches!(e, MonitorEvent::PeerDead { cause: DeadCause::Left, .. }), "{e:?}");
        }
    }
    assert!(sim.events_where(|e| matches!(e, MonitorEvent::PeerDisconnected { .. })).is_empty(), "not a failure");
}

#[test]
fn racing_connections_settle_on_one_per_pair() {
    // No grace: both ends of every link dial at the same moment.
    let cfg = MeshConfig { connect_grace: Duration::ZERO, ..MeshConfig::default() };
    let mut sim = Sim::new(6, cfg);
    sim.run_until(3 * SEC);
    for p in 0..6 {
        let m = sim.mesh(p);
        assert_eq!(m.connection_count(), m.connected_peers().len(), "process {p} kept a duplicate");
        assert_eq!(m.connected_peers().len(), 2);
    }
    assert!(sim
        .events_where(|e| matches!(e, MonitorEvent::PeerDisconnected { .. } | MonitorEvent::PeerDead { .. }))
        .is_empty());
    let (_, r) = sim.gather(0, secs(1));
    assert_eq!(answered(&r).len(), 6);
}

#[test]
fn a_process_that_never_starts_is_routed_around_then_dead() {
    let mut sim = Sim::new(8, MeshConfig::default());
    sim.kill(4);
    sim.run_until(12 * SEC);
    // Unreachable for 5 s: unresponsive, and the ring closes around it.
    assert!(sim.mesh(3).connected_peers().contains(&PeerId(5)));
    assert_eq!(sim.mesh(3).health(PeerId(4)), PeerHealth::Unresponsive);
    let (_, r) = sim.gather(0, secs(2));
    assert_eq!((r.missing.clone(), r.unresponsive.clone()), (peers(&[4]), peers(&[4])));
    sim.run_until(70 * SEC);
    assert_eq!(dead_events(&sim, 4).len(), 7);
    assert!(dead_events(&sim, 4).iter().all(|(t, _, _)| *t <= 62 * SEC));
}
