//! Authentication, driven by hand between two meshes so that each message can be forged or dropped.

use std::sync::Arc;
use std::time::Duration;

use super::sim::{peer_addr, Sim, MS, SEC, SECRET};
use crate::mesh::*;
use crate::record::ProcessRecords;
use crate::wire::{ByeReason, Hello, HelloFinish, Msg};

fn mesh(n: usize, i: usize, secret: [u8; 16]) -> Mesh {
    let table = PeerTable::new((0..n).map(peer_addr).collect()).expect("table");
    let seed = [i as u8 + 1; 16];
    Mesh::new(MeshConfig::default(), table, &peer_addr(i).addr, secret, seed, Arc::new(ProcessRecords::new()), 0)
        .expect("mesh")
}

fn drain(m: &mut Mesh) -> Vec<Action> {
    std::iter::from_fn(|| m.poll_action()).collect()
}

fn sent(actions: &[Action]) -> Vec<Msg> {
    actions.iter().filter_map(|a| if let Action::Send(_, m) = a { Some(m.clone()) } else { None }).collect()
}

/// What a peer's state looks like from outside: health of every peer, who is connected, wanted links, epoch.
fn view(m: &Mesh) -> (Vec<PeerHealth>, Vec<PeerId>, Vec<PeerId>, u32) {
    let health = m.table().ids().map(|p| m.health(p)).collect();
    (health, m.connected_peers(), m.desired_links().to_vec(), m.epoch())
}

#[test]
fn the_handshake_authenticates_both_sides() {
    let mut a = mesh(4, 0, SECRET);
    let mut b = mesh(4, 1, SECRET);
    drain(&mut a);
    drain(&mut b);
    let (ca, cb) = (ConnId(1), ConnId(2));
    a.handle_connected(MS, ca, PeerId(1));
    b.handle_incoming(MS, cb);
    let hello = sent(&drain(&mut a));
    assert!(matches!(hello.as_slice(), [Msg::Hello(_)]));
    b.handle_msg(2 * MS, cb, hello[0].clone());
    let ack = sent(&drain(&mut b));
    assert!(matches!(ack.as_slice(), [Msg::HelloAck(_)]));
    assert!(!b.is_authenticated(cb));
    a.handle_msg(3 * MS, ca, ack[0].clone());
    let out = drain(&mut a);
    assert!(a.is_authenticated(ca));
    assert!(out.contains(&Action::Event(MonitorEvent::PeerConnected { peer: PeerId(1) })));
    let finish = sent(&out);
    assert!(matches!(finish[0], Msg::HelloFinish(_)));
    b.handle_msg(4 * MS, cb, finish[0].clone());
    assert!(b.is_authenticated(cb));
    assert_eq!(b.connected_peers(), [PeerId(0)]);
}

#[test]
fn a_connector_with_a_wrong_secret_is_refused_and_changes_nothing() {
    let mut a = mesh(4, 0, SECRET);
    let mut x = mesh(4, 1, [9; 16]); // claims to be peer 1, does not know the secret
    drain(&mut a);
    drain(&mut x);
    let before = view(&a);
    let (ca, cx) = (ConnId(10), ConnId(11));
    a.handle_incoming(MS, ca);
    x.handle_connected(MS, cx, PeerId(0));
    let hello = sent(&drain(&mut x));
    a.handle_msg(2 * MS, ca, hello[0].clone());
    let ack = sent(&drain(&mut a));
    // The impostor cannot check A's proof, so it gives up before proving anything itself.
    x.handle_msg(3 * MS, cx, ack[0].clone());
    let out = drain(&mut x);
    assert!(out.contains(&Action::Close(cx)));
    assert!(out.iter().any(|a| matches!(a, Action::Event(MonitorEvent::AuthFailed { .. }))));
    assert!(sent(&out).is_empty(), "no proof is sent");
    a.handle_closed(4 * MS, ca);
    let out = drain(&mut a);
    assert!(out.iter().all(|a| matches!(a, Action::Connect(_))), "{out:?}");
    assert_eq!(view(&a), before);
    assert_eq!(a.connection_count(), 0);
}

#[test]
fn a_forged_proof_is_refused_and_changes_nothing() {
    let mut a = mesh(4, 0, SECRET);
    drain(&mut a);
    let before = view(&a);
    let c = ConnId(5);
    a.handle_incoming(MS, c);
    let me = peer_addr(1);
    let hello = Hello { table_hash: a.table().hash(), from: PeerId(1), from_addr: me.addr, epoch: 7, nonce: [1; 16] };
    a.handle_msg(MS, c, Msg::Hello(hello));
    drain(&mut a);
    a.handle_msg(2 * MS, c, Msg::HelloFinish(HelloFinish { proof: [0; 16] }));
    let out = drain(&mut a);
    assert_eq!(
        out,
        [Action::Event(MonitorEvent::AuthFailed { conn: c, peer: Some(PeerId(1)) }), Action::Close(c)],
        "refused, nothing else"
    );
    assert_eq!(view(&a), before, "the claimed epoch 7 was not believed either");
    // Messages on an unauthenticated connection are refused the same way.
    let c2 = ConnId(6);
    a.handle_incoming(3 * MS, c2);
    a.handle_msg(3 * MS, c2, Msg::Bye(ByeReason::Shutdown));
    let c3 = ConnId(7);
    a.handle_incoming(3 * MS, c3);
    a.handle_msg(3 * MS, c3, Msg::HelloFinish(HelloFinish { proof: [0; 16] }));
    let out = drain(&mut a);
    assert!(out.contains(&Action::Close(c2)) && out.contains(&Action::Close(c3)));
    assert_eq!(view(&a), before);
}

#[test]
fn a_hello_with_another_table_is_refused() {
    let mut a = mesh(4, 0, SECRET);
    drain(&mut a);
    let c = ConnId(5);
    a.handle_incoming(MS, c);
    let hello = Hello { table_hash: 1, from: PeerId(1), from_addr: peer_addr(1).addr, epoch: 0, nonce: [1; 16] };
    a.handle_msg(MS, c, Msg::Hello(hello));
    let out = drain(&mut a);
    assert!(out.contains(&Action::Send(c, Msg::Bye(ByeReason::Refused))));
    assert!(out.contains(&Action::Close(c)));
    // A table entry that does not match the claimed address.
    let c = ConnId(6);
    a.handle_incoming(MS, c);
    let hello =
        Hello { table_hash: a.table().hash(), from: PeerId(2), from_addr: peer_addr(1).addr, epoch: 0, nonce: [1; 16] };
    a.handle_msg(MS, c, Msg::Hello(hello));
    assert!(drain(&mut a).contains(&Action::Close(c)));
}

#[test]
fn in_a_job_a_process_with_the_wrong_secret_never_joins() {
    let mut sim = Sim::with_secrets(6, MeshConfig::default(), |i| if i == 2 { [9; 16] } else { SECRET });
    sim.run_until(10 * SEC);
    for p in sim.alive() {
        if p != 2 {
            assert!(!sim.mesh(p).connected_peers().contains(&PeerId(2)), "{p} is connected to the impostor");
        }
    }
    assert!(sim.mesh(2).connected_peers().is_empty());
    assert!(!sim.events_where(|e| matches!(e, MonitorEvent::AuthFailed { .. })).is_empty());
    let (_, r) = sim.gather(0, Duration::from_secs(2));
    let mut answered: Vec<u32> = r.statuses.iter().map(|s| s.peer.0).collect();
    answered.sort();
    assert_eq!(answered, [0, 1, 3, 4, 5]);
    assert_eq!(r.missing, [PeerId(2)]);
}

#[test]
fn a_lost_connection_is_dead_only_when_the_reconnect_is_refused() {
    use crate::mesh::fuzz::{drain as take, handshake};
    let mut a = mesh(4, 0, SECRET);
    let mut b = mesh(4, 1, SECRET);
    take(&mut a);
    take(&mut b);
    handshake(SEC, &mut a, ConnId(1), &mut b, ConnId(2));
    take(&mut a);
    assert_eq!(a.connected_peers(), [PeerId(1)]);
    a.handle_closed(SEC, ConnId(1));
    let out = take(&mut a);
    assert!(out.contains(&Action::Event(MonitorEvent::PeerDisconnected { peer: PeerId(1) })));
    assert!(out.contains(&Action::Connect(PeerId(1))), "reconnects at once");
    // No answer in time is not proof: retried a second later.
    a.handle_connect_timed_out(SEC + 5 * MS, PeerId(1));
    assert!(take(&mut a).iter().all(|x| !matches!(x, Action::Event(MonitorEvent::PeerDead { .. }))));
    assert_eq!(a.health(PeerId(1)), PeerHealth::Alive);
    a.handle_timeout(2 * SEC + 5 * MS);
    assert!(take(&mut a).contains(&Action::Connect(PeerId(1))));
    // Refused: nothing listens there any more.
    a.handle_connect_failed(2 * SEC + 6 * MS, PeerId(1));
    let out = take(&mut a);
    assert!(out.contains(&Action::Event(MonitorEvent::PeerDead { peer: PeerId(1), cause: DeadCause::ConnectionLost })));
    assert!(out.iter().any(|x| matches!(x, Action::Send(_, Msg::PeerNews(_)))) || a.connected_peers().is_empty());
    assert_eq!(a.health(PeerId(1)), PeerHealth::Dead);
}
