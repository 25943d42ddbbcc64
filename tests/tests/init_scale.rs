//! Scalable init (several unique ids, NCCL's `ncclCommInitRankScalable`): communicators made
//! through 1, 2 and 8 ids are the same as through one (rank order, peer table) and pass the
//! collective suite, in threads mode and in real processes (`OCCL_UNIQUE_ID=<id>,<id>,…`).

mod common;

use common::{assert_all_ok, env, run_job};
use occl::{Comm, Config, ErrorKind, UniqueId};
use occl_tests::launch::Spawn;
use occl_tests::matrix::{self, Spec};
use std::time::Duration;

const SMALL: &str = "counts=0,1,7,4099";

fn suite(comms: Vec<Comm>, spec: &Spec, what: &str) {
    let n = comms.len();
    let handles: Vec<_> = comms
        .into_iter()
        .enumerate()
        .map(|(r, c)| {
            assert_eq!((c.rank(), c.nranks()), (r, n), "{what}");
            let spec = spec.clone();
            std::thread::spawn(move || {
                let out = matrix::run(&c, &spec);
                c.destroy().expect("destroy");
                out
            })
        })
        .collect();
    for (r, h) in handles.into_iter().enumerate() {
        let out = h.join().expect("rank thread").unwrap_or_else(|e| panic!("{what} rank {r}: {e}"));
        assert!(out.failures.is_empty(), "{what} rank {r}: {:#?}", out.failures);
        assert!(out.checked > 0, "{what}");
    }
}

#[test]
fn threads_with_1_2_and_8_ids_pass_the_collective_suite() {
    let spec = Spec::parse(SMALL).expect("spec");
    for (n, m) in [(8, 1), (8, 2), (8, 8), (5, 2), (9, 8)] {
        let comms = Comm::init_all_scalable(n, m, Config::default()).unwrap_or_else(|e| panic!("n={n} ids={m}: {e}"));
        // Every rank sees the same peer table, in rank order: this process, once per rank.
        for c in &comms {
            for p in 0..n {
                assert_eq!(c.peer_process(p).map(|x| x.0), Some(std::process::id()), "n={n} ids={m}");
            }
            assert_eq!(c.id(), comms[0].id(), "one communicator id on every rank (n={n} ids={m})");
        }
        suite(comms, &spec, &format!("threads n={n} ids={m}"));
    }
}

#[test]
fn processes_through_three_ids_from_the_environment() {
    // Rank r joins id r*3/5: ranks 0,1 → id 0; 2,3 → id 1; 4 → id 2. Each id's root runs in
    // this process; the ranks are real processes.
    let ids: Vec<String> = (0..3).map(|_| UniqueId::new().expect("id").to_string()).collect();
    let spawn = Spawn { env: env(&[("OCCL_UNIQUE_ID", &ids.join(","))]), ..Spawn::default() };
    let outs = run_job(5, &["matrix", SMALL], spawn, Duration::from_secs(120));
    assert_all_ok(&outs, "5 processes through 3 ids");
    assert!(outs[0].output.contains("checked=1824"), "{}", outs[0].output);
}

#[test]
fn ids_that_disagree_fail_every_rank_instead_of_hanging() {
    let config = Config { timeout: Duration::from_secs(5), ..Config::default() };
    assert_eq!(
        Comm::init_rank_scalable(4, &[], 0, config.clone()).expect_err("no ids").kind(),
        ErrorKind::InvalidArgument
    );
    let three: Vec<UniqueId> = (0..3).map(|_| UniqueId::new().expect("id")).collect();
    assert_eq!(
        Comm::init_rank_scalable(2, &three, 0, config.clone()).expect_err("more ids than ranks").kind(),
        ErrorKind::InvalidArgument
    );
    // Ranks 0 and 1 share id 0 but name different next roots. Whichever joins first defines
    // the job for that root, which refuses the other; the first (whose round cannot complete)
    // times out rather than hanging.
    let a: Vec<UniqueId> = (0..2).map(|_| UniqueId::new().expect("id")).collect();
    let b = vec![a[0].clone(), UniqueId::new().expect("id")];
    let t0 = std::time::Instant::now();
    let h: Vec<_> = [(0usize, a.clone()), (1, b)]
        .into_iter()
        .map(|(r, ids)| {
            let config = config.clone();
            std::thread::spawn(move || Comm::init_rank_scalable(4, &ids, r, config).map(|_| ()))
        })
        .collect();
    let res: Vec<_> = h.into_iter().map(|h| h.join().expect("thread")).collect();
    assert!(res.iter().all(Result::is_err), "{res:?}");
    let msgs: Vec<String> = res.iter().map(|r| r.as_ref().expect_err("checked above").to_string()).collect();
    assert_eq!(msgs.iter().filter(|m| m.contains("same ids")).count(), 1, "{msgs:?}");
    assert_eq!(msgs.iter().filter(|m| m.contains("within 5.0 s")).count(), 1, "{msgs:?}");
    assert!(t0.elapsed() < Duration::from_secs(30));
}

/// After the root phase the bootstrap runs over a tree of the ranks' own links. A rank that
/// destroys its communicator while the others enter a bootstrap exchange (here a split) must
/// make each of them fail at once, naming that rank, rather than wait for the timeout. With 7
/// ranks, rank 1 is an inner node: rank 0 above it and ranks 3 and 4 below learn directly,
/// and the rest through the error frames that travel on.
#[test]
fn a_rank_gone_from_the_bootstrap_tree_fails_the_others_exchange_fast_naming_it() {
    let config = Config { timeout: Duration::from_secs(60), ..Config::default() };
    let mut comms = Comm::init_all_scalable(7, 2, config).expect("init");
    let gone = comms.remove(1);
    gone.destroy().expect("destroy");
    let t0 = std::time::Instant::now();
    let h: Vec<_> = comms
        .into_iter()
        .map(|c| {
            std::thread::spawn(move || {
                let r = c.rank();
                (r, c.split(0, r as i32).map(|_| ()))
            })
        })
        .collect();
    for h in h {
        let (r, res) = h.join().expect("rank thread");
        let e = res.expect_err("split without rank 1 must fail");
        assert_eq!(e.kind(), ErrorKind::RemoteError, "rank {r}: {e}");
        assert!(e.to_string().contains("peer rank 1"), "rank {r} does not name rank 1: {e}");
    }
    assert!(t0.elapsed() < Duration::from_secs(5), "took {:?}", t0.elapsed());
}
