//! The body of the `mesh` fuzz target: what one connection can make a mesh do.

use super::*;
use crate::wire::Decoder;

const SEC: u64 = 1_000_000_000;
/// Actions one input may cause, at most: a flood on each of a handful of connections, a reply, a few events.
const MAX_ACTIONS_PER_INPUT: usize = 64;

/// Process `i` of the 4-process job the target runs.
pub(crate) fn peer(i: u32) -> PeerAddr {
    PeerAddr {
        addr: format!("10.0.0.1:{}", 1000 + i),
        host: "10.0.0.1".into(),
        pid: i,
        cuda_devs: vec![],
        nvml_devs: vec![],
    }
}

pub(crate) fn drain(m: &mut Mesh) -> Vec<Action> {
    let out: Vec<Action> = std::iter::from_fn(|| m.poll_action()).collect();
    assert!(out.len() <= MAX_ACTIONS_PER_INPUT, "{} actions for one input", out.len());
    out
}

/// Runs a real handshake between `a` (accepting on `ca`) and `b` (dialling on `cb`), moving messages by hand.
pub(crate) fn handshake(now: Time, a: &mut Mesh, ca: ConnId, b: &mut Mesh, cb: ConnId) {
    a.handle_incoming(now, ca);
    b.handle_connected(now, cb, a.me());
    for _ in 0..4 {
        for act in drain(b) {
            if let Action::Send(c, m) = act {
                if c == cb {
                    a.handle_msg(now, ca, m);
                }
            }
        }
        for act in drain(a) {
            if let Action::Send(c, m) = act {
                if c == ca {
                    b.handle_msg(now, cb, m);
                }
            }
        }
    }
}

/// `data[0]` picks a stranger (bit 0 clear) or an authenticated peer (set); the rest is a byte stream arriving on
/// that connection, in chunks of pseudo-random sizes, with time moving on (up to 2.5 s) between messages. Checks that a
/// stranger never gets past the handshake or changes any peer's state, that no input makes the mesh do more than a
/// bounded amount of work, and that the mesh always has a deadline in the future.
pub fn fuzz_mesh_bytes(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let Ok(table) = PeerTable::new((0..4).map(peer).collect()) else {
        return;
    };
    let secret = [0x5a; 16];
    let records = Arc::new(ProcessRecords::new());
    let mk = |i: u32, seed: u8| {
        Mesh::new(MeshConfig::default(), table.clone(), &peer(i).addr, secret, [seed; 16], records.clone(), 0)
    };
    let (Ok(mut a), Ok(mut b)) = (mk(0, 1), mk(1, 2)) else {
        return;
    };
    let mut now = SEC;
    let conn = ConnId(1);
    let authed = mode & 1 == 1;
    drain(&mut a);
    if authed {
        handshake(now, &mut a, conn, &mut b, ConnId(2));
        assert!(a.is_authenticated(conn), "the genuine handshake works");
    } else {
        a.handle_incoming(now, conn);
    }
    drain(&mut a);
    let health = |m: &Mesh| m.table().ids().map(|p| m.health(p)).collect::<Vec<_>>();
    let before = health(&a);
    let mut dec = if authed { Decoder::new() } else { Decoder::handshake() };
    let mut rest = rest;
    let mut open = true;
    // Chunk sizes and time steps from a generator seeded by the mode byte, so the stream itself is left intact.
    let mut lcg = u64::from(mode) | 1;
    while let (true, false) = (open, rest.is_empty()) {
        lcg = lcg.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let step = lcg >> 33;
        let n = (step as usize % 512 + 1).min(rest.len());
        let (chunk, tail) = rest.split_at(n);
        rest = tail;
        if dec.push(chunk).is_err() {
            break;
        }
        loop {
            match dec.next() {
                Ok(Some(msg)) => {
                    now += step % 256 * 10_000_000;
                    a.handle_msg(now, conn, msg);
                }
                Ok(None) => break,
                Err(_) => {
                    a.handle_closed(now, conn);
                    open = false;
                    break;
                }
            }
            let acts = drain(&mut a);
            if acts.contains(&Action::Close(conn)) {
                open = false;
            }
            if !authed {
                assert!(!a.is_authenticated(conn), "a stranger got through");
                assert!(
                    acts.iter().all(|x| matches!(x, Action::Send(..) | Action::Close(_) | Action::Connect(_))
                        || matches!(x, Action::Event(MonitorEvent::AuthFailed { .. }))),
                    "a stranger caused {acts:?}"
                );
                assert_eq!(health(&a), before, "a stranger changed a peer's state");
            }
            if !open {
                break;
            }
        }
        a.handle_timeout(now);
        drain(&mut a);
        assert!(a.poll_timeout().is_some_and(|t| t > now), "no future deadline");
    }
    // Whatever happened, time heals: every gather ends and the mesh keeps a deadline.
    now += 2 * ns(MAX_BUDGET);
    a.handle_timeout(now);
    drain(&mut a);
    assert_eq!(a.gathers_in_flight(), 0);
    assert!(a.poll_timeout().is_some_and(|t| t > now));
}
