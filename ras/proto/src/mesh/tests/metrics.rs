//! Node metrics on the simulated network: who is asked, who answers, and what a silent, dead or far process does.

use std::time::Duration;

use super::sim::{metrics_text, Sim, MS, SEC};
use crate::mesh::*;

const METRICS_REQUEST: usize = 9;

fn answered(r: &MetricsResult) -> Vec<usize> {
    let mut v: Vec<usize> = r.answers.iter().map(|(p, _)| p.0 as usize).collect();
    v.sort();
    v
}

/// 12 processes: 8 on the first node (0–7), 4 on the second (8–11), links up.
fn job() -> Sim {
    let mut sim = Sim::new(12, MeshConfig::default());
    sim.run_until(3 * SEC);
    sim
}

#[test]
fn every_process_of_the_node_and_only_those_answer_with_their_own_text() {
    let mut sim = job();
    // Process 3's ring links are 2 and 4; the others of its node get a connection on demand.
    assert_eq!(sim.mesh(3).desired_links(), &[PeerId(2), PeerId(4)]);
    let (took, r) = sim.fetch_metrics(3, Duration::from_secs(2));
    assert_eq!(answered(&r), (0..8).collect::<Vec<_>>());
    assert_eq!(r.answers[0].0, PeerId(3), "the asking process first");
    for (p, text) in &r.answers {
        assert_eq!(*text, metrics_text(p.0 as usize));
    }
    assert!(r.timed_out.is_empty() && r.dead.is_empty());
    assert!(took < 5 * MS, "connect, handshake and answer on a 100 us network: {took} ns");
    let (_, r) = sim.fetch_metrics(9, Duration::from_secs(2));
    assert_eq!(answered(&r), vec![8, 9, 10, 11]);

    // The connections stay while scrapes come, so the next fetch is one round trip.
    sim.run_for(30 * SEC);
    sim.reset_counters();
    let (took, r) = sim.fetch_metrics(3, Duration::from_secs(2));
    assert_eq!(answered(&r).len(), 8);
    assert!(took <= 2 * sim.latency + MS, "{took} ns");
    assert_eq!(sim.sent[METRICS_REQUEST], 7);
    assert!(sim.mesh(3).connected_peers().len() >= 7);
    // Without scrapes they are let go: back to the ring's links.
    sim.run_for(METRICS_KEEP.as_nanos() as u64 + 30 * SEC);
    assert_eq!(sim.mesh(3).connected_peers(), vec![PeerId(2), PeerId(4)]);
    assert!(sim.events_where(|e| matches!(e, MonitorEvent::PeerDead { .. })).is_empty());
}

#[test]
fn a_stopped_process_is_skipped_after_the_timeout_and_a_dead_one_is_not_asked() {
    let mut sim = job();
    sim.fetch_metrics(0, Duration::from_secs(2));
    sim.procs[5].state = super::sim::State::Frozen;
    let (took, r) = sim.fetch_metrics(0, Duration::from_millis(700));
    assert_eq!(answered(&r), vec![0, 1, 2, 3, 4, 6, 7]);
    assert_eq!(r.timed_out, vec![PeerId(5)]);
    assert!((700 * MS..=701 * MS).contains(&took), "{took} ns");
    sim.thaw(5);
    sim.kill(6);
    sim.run_for(SEC);
    let (_, r) = sim.fetch_metrics(0, Duration::from_secs(1));
    assert_eq!(r.dead, vec![PeerId(6)]);
    assert_eq!(answered(&r), vec![0, 1, 2, 3, 4, 5, 7]);
    assert!(r.timed_out.is_empty());
}

#[test]
fn a_process_alone_on_its_node_answers_at_once_and_too_many_fetches_get_their_own_only() {
    let mut sim = Sim::new(9, MeshConfig::default());
    sim.run_until(3 * SEC);
    let (took, r) = sim.fetch_metrics(8, Duration::from_secs(1));
    assert_eq!((took, answered(&r)), (0, vec![8]));
    let now = sim.now;
    for t in 0..MAX_FETCHES as u64 + 1 {
        sim.procs[0].mesh.start_metrics(now, 100 + t, Duration::from_secs(1));
    }
    let over: Vec<Action> = std::iter::from_fn(|| sim.procs[0].mesh.poll_action())
        .filter(|a| matches!(a, Action::MetricsDone(r) if r.token == 100 + MAX_FETCHES as u64))
        .collect();
    match over.as_slice() {
        [Action::MetricsDone(r)] => assert_eq!((r.answers.len(), r.timed_out.len()), (1, 7)),
        other => panic!("{other:?}"),
    }
}
