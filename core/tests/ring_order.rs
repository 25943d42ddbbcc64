//! Rings, chains and trees run in host-grouped order (ranks of one host next to each other):
//! with hosts interleaved (ranks 0 and 2 on "a", 1 and 3 on "b"), the order differs from rank
//! order, and every collective those algorithms carry must still give rank-ordered results.

use occl::telemetry::{EventDescr, EventId, EventMask, EventType, Sink};
use occl::{CollType, Comm, Config, RedOp, UniqueId};
use std::sync::{Arc, Mutex};

const N: usize = 4;

fn comms(algo: &str) -> Vec<Comm> {
    let id = UniqueId::new().expect("unique id");
    let handles: Vec<_> = (0..N)
        .map(|r| {
            let id = id.clone();
            let config = Config {
                host_id: Some(if r % 2 == 0 { "a" } else { "b" }.into()),
                algo: Some(algo.into()),
                ..Config::default()
            };
            std::thread::spawn(move || Comm::init_rank(N, &id, r, config))
        })
        .collect();
    handles.into_iter().map(|h| h.join().expect("init").expect("init")).collect()
}

/// Runs `f` on every rank at once.
fn each<T: Send>(comms: &[Comm], f: impl Fn(&Comm) -> T + Sync) -> Vec<T> {
    std::thread::scope(|s| {
        let hs: Vec<_> = comms.iter().map(|c| s.spawn(|| f(c))).collect();
        hs.into_iter().map(|h| h.join().expect("rank thread")).collect()
    })
}

/// Rank r's element i: distinct per rank and position, exact in f64.
fn val(r: usize, i: usize) -> f64 {
    (r * 1000 + i % 997) as f64
}

fn check_all(comms: &[Comm], count: usize) {
    let sum = |i: usize| (0..N).map(|r| val(r, i)).sum::<f64>();
    let out = each(comms, |c| {
        let send: Vec<f64> = (0..count).map(|i| val(c.rank(), i)).collect();
        let mut recv = vec![0.0; count];
        c.all_reduce(&send, &mut recv, RedOp::Sum).expect("all-reduce");
        recv
    });
    for (r, v) in out.iter().enumerate() {
        assert!(v.iter().enumerate().all(|(i, &x)| x == sum(i)), "all-reduce on rank {r}, count {count}");
    }
    for root in [1, 2] {
        let out = each(comms, |c| {
            let send: Vec<f64> = (0..count).map(|i| val(c.rank(), i)).collect();
            let mut recv = vec![0.0; count];
            c.broadcast(&send, &mut recv, root).expect("broadcast");
            recv
        });
        for (r, v) in out.iter().enumerate() {
            assert!(v.iter().enumerate().all(|(i, &x)| x == val(root, i)), "broadcast from {root} on rank {r}");
        }
        let out = each(comms, |c| {
            let send: Vec<f64> = (0..count).map(|i| val(c.rank(), i)).collect();
            let mut recv = vec![0.0; count];
            c.reduce(&send, &mut recv, RedOp::Sum, root).expect("reduce");
            recv
        });
        assert!(out[root].iter().enumerate().all(|(i, &x)| x == sum(i)), "reduce to {root}, count {count}");
    }
}

fn check_blocks(comms: &[Comm], count: usize) {
    let out = each(comms, |c| {
        let send: Vec<f64> = (0..count).map(|i| val(c.rank(), i)).collect();
        let mut recv = vec![0.0; count * N];
        c.all_gather(&send, &mut recv).expect("all-gather");
        recv
    });
    for (r, v) in out.iter().enumerate() {
        for b in 0..N {
            assert!((0..count).all(|i| v[b * count + i] == val(b, i)), "all-gather block {b} on rank {r}");
        }
    }
    let out = each(comms, |c| {
        // Block b of rank r: val(r, b * count + i).
        let send: Vec<f64> = (0..count * N).map(|i| val(c.rank(), i)).collect();
        let mut recv = vec![0.0; count];
        c.reduce_scatter(&send, &mut recv, RedOp::Sum).expect("reduce-scatter");
        recv
    });
    for (r, v) in out.iter().enumerate() {
        let want = |i: usize| (0..N).map(|q| val(q, r * count + i)).sum::<f64>();
        assert!(v.iter().enumerate().all(|(i, &x)| x == want(i)), "reduce-scatter on rank {r}");
    }
}

#[test]
fn ring_and_chain_in_host_order() {
    let cs = comms("ring");
    assert_eq!(cs[0].algorithm(CollType::AllReduce, 8 << 20), "ring");
    assert_eq!(cs[0].algorithm(CollType::Broadcast, 8 << 20), "chain");
    for count in [1, 7, 300_001] {
        check_all(&cs, count);
        check_blocks(&cs, count);
    }
    for c in cs {
        c.destroy().unwrap();
    }
}

#[test]
fn trees_in_host_order() {
    let cs = comms("ring;allreduce:tree;broadcast:tree;reduce:tree");
    assert_eq!(cs[0].algorithm(CollType::AllReduce, 8 << 20), "tree");
    assert_eq!(cs[0].algorithm(CollType::Reduce, 8 << 20), "tree");
    for count in [1, 7, 300_001] {
        check_all(&cs, count);
    }
    for c in cs {
        c.destroy().unwrap();
    }
}

/// Keeps each ProxyOp's (peer, is_send).
#[derive(Default)]
struct Legs(Mutex<Vec<(i32, bool)>>);

impl Sink for Legs {
    fn interest(&self) -> EventMask {
        EventMask(EventType::ProxyOp.bit())
    }
    fn start(&self, _: EventId, _: Option<EventId>, ev: &EventDescr<'_>) {
        if let EventDescr::ProxyOp { peer, is_send, .. } = ev {
            self.0.lock().expect("sink lock").push((*peer, *is_send));
        }
    }
}

/// The ring's neighbours are the host-grouped ones: order 0, 2, 1, 3, so rank 0 sends to 2
/// (rank order would send to 1) and receives from 3; rank 1 sends to 3 and receives from 2.
#[test]
fn ring_neighbours_are_host_neighbours() {
    let cs = comms("ring");
    let sinks: Vec<Arc<Legs>> = (0..N).map(|_| Arc::new(Legs::default())).collect();
    for (c, s) in cs.iter().zip(&sinks) {
        c.attach_sink(s.clone()).unwrap();
    }
    each(&cs, |c| {
        let mut buf = vec![1.0f64; 4096];
        c.all_reduce_in_place(&mut buf, RedOp::Sum).unwrap();
        assert!(buf.iter().all(|&x| x == N as f64));
    });
    let legs = |r: usize| {
        let mut v = sinks[r].0.lock().unwrap().clone();
        v.sort();
        v.dedup();
        v
    };
    assert_eq!(legs(0), [(2, true), (3, false)]);
    assert_eq!(legs(1), [(2, false), (3, true)]);
    assert_eq!(legs(2), [(0, false), (1, true)]);
    assert_eq!(legs(3), [(0, true), (1, false)]);
    for c in cs {
        c.destroy().unwrap();
    }
}
