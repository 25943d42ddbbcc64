//! Lazy connection (`OCCL_RUNTIME_CONNECT`, default on): shm peers connect on their first
//! operation together, and only the pairs an operation uses; with it off, at init. Thread
//! ranks here; the process and tcp suites in collectives.rs run over the same lazy path.

mod common;

use common::{assert_all_ok, env, run_job};
use occl::{Comm, Config, RedOp};
use occl_tests::launch::Spawn;
use std::time::Duration;

fn connected(comms: &[Comm]) -> Vec<Vec<usize>> {
    comms.iter().map(Comm::connected_peers).collect()
}

fn each<F: Fn(usize, &Comm) + Sync>(comms: &[Comm], f: F) {
    std::thread::scope(|s| {
        for (r, c) in comms.iter().enumerate() {
            let f = &f;
            s.spawn(move || f(r, c));
        }
    });
}

#[test]
fn shm_peers_connect_on_first_use_and_only_the_pairs_used() {
    let n = 6;
    let config = Config { algo: Some("ring".into()), ..Config::default() };
    let comms = Comm::init_all_with(n, config).expect("init_all");
    assert!(connected(&comms).iter().all(Vec::is_empty), "nothing connects at init: {:?}", connected(&comms));

    // One pair talks: only that pair connects. 70,000 f32 crosses several FIFO slots.
    each(&comms, |r, c| {
        let mut buf = vec![r as f32; 70_000];
        match r {
            0 => c.send(&buf, 1).expect("send"),
            1 => {
                c.recv(&mut buf, 0).expect("recv");
                assert!(buf.iter().all(|&v| v == 0.0), "rank 1 received rank 0's data");
            }
            _ => {}
        }
    });
    let after_p2p = connected(&comms);
    assert_eq!(after_p2p[0], vec![1]);
    assert_eq!(after_p2p[1], vec![0]);
    assert!(after_p2p[2..].iter().all(Vec::is_empty), "{after_p2p:?}");

    // A ring all-reduce connects each rank to its two ring neighbours and no further.
    each(&comms, |r, c| {
        let send = vec![r as f64 + 1.0; 1000];
        let mut recv = vec![0f64; 1000];
        c.all_reduce(&send, &mut recv, RedOp::Sum).expect("all_reduce");
        assert!(recv.iter().all(|&v| v == 21.0), "rank {r}: {}", recv[0]);
    });
    let after_ring = connected(&comms);
    for (r, peers) in after_ring.iter().enumerate() {
        for q in [(r + 1) % n, (r + n - 1) % n] {
            assert!(peers.contains(&q), "rank {r} not connected to its ring neighbour {q}: {after_ring:?}");
        }
        assert!(peers.len() <= 3, "rank {r} connected beyond the ring (and the p2p pair): {peers:?}");
        for &q in peers {
            assert!(after_ring[q].contains(&r), "rank {r} → {q} is not mutual: {after_ring:?}");
        }
    }
    for c in comms {
        c.destroy().expect("destroy");
    }
}

#[test]
fn runtime_connect_off_connects_every_shm_peer_at_init() {
    let n = 4;
    let comms = Comm::init_all_with(n, Config { runtime_connect: false, ..Config::default() }).expect("init_all");
    for (r, peers) in connected(&comms).iter().enumerate() {
        assert_eq!(*peers, (0..n).filter(|&q| q != r).collect::<Vec<_>>(), "rank {r}");
    }
    each(&comms, |r, c| {
        let mut recv = vec![0i32; 10];
        c.all_reduce(&[r as i32; 10], &mut recv, RedOp::Max).expect("all_reduce");
        assert_eq!(recv, vec![n as i32 - 1; 10]);
    });
    for c in comms {
        c.destroy().expect("destroy");
    }
}

#[test]
fn processes_pass_the_matrix_connecting_lazily_and_eagerly() {
    // Real processes meet in named segments whichever side comes first; the environment
    // spelling of NCCL is honoured for the eager mode.
    for (var, value) in [("OCCL_RUNTIME_CONNECT", "1"), ("NCCL_RUNTIME_CONNECT", "0")] {
        let spawn = Spawn { env: env(&[("OCCL_TRANSPORT", "shm"), (var, value)]), ..Spawn::default() };
        let outs = run_job(3, &["matrix", "counts=0,1,7,4099,70000"], spawn, Duration::from_secs(120));
        assert_all_ok(&outs, &format!("3 processes with {var}={value}"));
    }
}

#[test]
fn a_bad_runtime_connect_value_names_the_variable() {
    let spawn = Spawn { env: env(&[("OCCL_RUNTIME_CONNECT", "lazy")]), ..Spawn::default() };
    let outs = run_job(2, &["matrix", "counts=1"], spawn, Duration::from_secs(60));
    for o in &outs {
        assert!(!o.status.success(), "rank {} accepted OCCL_RUNTIME_CONNECT=lazy", o.rank);
        assert!(o.output.contains("OCCL_RUNTIME_CONNECT=\"lazy\" must be 0 or 1"), "{}", o.output);
    }
}

#[test]
fn runtime_connect_off_refuses_more_thread_ranks_than_the_map_limit_allows() {
    // Eagerly, n thread ranks map n·(n−1) FIFOs; past the kernel's limit thread creation
    // itself would fail and abort the process, so init must refuse first and say why.
    let limit: usize =
        std::fs::read_to_string("/proc/sys/vm/max_map_count").ok().and_then(|s| s.trim().parse().ok()).unwrap_or(65530);
    let n = (limit as f64 / 2.0).sqrt().ceil() as usize + 2;
    if n > 1024 {
        println!("SKIPPED: vm.max_map_count={limit} would need {n} thread ranks to reach the limit");
        return;
    }
    let err = Comm::init_all_with(n, Config { runtime_connect: false, ..Config::default() })
        .map(|_| ())
        .expect_err("init past the map limit must fail");
    assert_eq!(err.kind(), occl::ErrorKind::InvalidUsage, "{err}");
    assert!(err.to_string().contains("vm.max_map_count") && err.to_string().contains("OCCL_RUNTIME_CONNECT"), "{err}");
}
