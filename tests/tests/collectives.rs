//! Correctness of every collective, datatype, operator, size and placement, in real processes
//! (shm, tcp, and a mix of both) and in the threads mode, against an f64 reference.

mod common;

use common::{assert_all_ok, env, run_job};
use occl::{Comm, Config, TransportKind};
use occl_tests::launch::Spawn;
use occl_tests::matrix::{self, Spec};
use std::time::Duration;

/// Sizes the issue asks for (element counts): 0, 1, 7 and 4099 here; 1 MiB + 3 below.
const SMALL: &str = "counts=0,1,7,4099";
const BIG: &str = "counts=1048579";

#[test]
fn processes_shm_every_collective_dtype_op_ranks_1_to_8() {
    for n in 1..=8 {
        let outs = run_job(n, &["matrix", SMALL], Spawn::default(), Duration::from_secs(120));
        assert_all_ok(&outs, &format!("shm nranks={n}"));
        assert!(outs[0].output.contains("checked=1824"), "{}", outs[0].output);
        if n > 1 {
            assert!(outs[0].output.contains("transport=shm"), "{}", outs[0].output);
        }
    }
}

#[test]
fn processes_tcp_every_collective_dtype_op() {
    for n in [2, 3, 5, 8] {
        let spawn = Spawn { env: env(&[("OCCL_TRANSPORT", "tcp"), ("OCCL_NSOCKS", "2")]), ..Spawn::default() };
        let outs = run_job(n, &["matrix", SMALL], spawn, Duration::from_secs(120));
        assert_all_ok(&outs, &format!("tcp nranks={n}"));
        assert!(outs[0].output.contains("transport=tcp"), "{}", outs[0].output);
    }
}

#[test]
fn processes_two_hosts_mix_shm_and_tcp() {
    // Ranks 0,1 on "host a" and 2,3,4 on "host b": ring steps cross transports.
    let hosts = ["a", "a", "b", "b", "b"];
    let spawn = Spawn { rank_env: hosts.iter().map(|h| env(&[("OCCL_HOSTID", h)])).collect(), ..Spawn::default() };
    let outs = run_job(5, &["matrix", SMALL], spawn, Duration::from_secs(120));
    assert_all_ok(&outs, "mixed shm+tcp");
    assert!(outs[0].output.contains("transport=shm+tcp"), "{}", outs[0].output);
}

#[test]
fn processes_interleaved_hosts_run_in_host_order() {
    // Hosts interleaved by rank: rings, chains and trees run in the order 0,2 | 1,3,4 (ranks of
    // one host adjacent), not in rank order, and every result must still be rank-ordered.
    let hosts = ["a", "b", "a", "b", "b"];
    let spawn = Spawn { rank_env: hosts.iter().map(|h| env(&[("OCCL_HOSTID", h)])).collect(), ..Spawn::default() };
    let outs = run_job(5, &["matrix", SMALL], spawn, Duration::from_secs(120));
    assert_all_ok(&outs, "interleaved hosts");
    assert!(outs[0].output.contains("transport=shm+tcp"), "{}", outs[0].output);
}

#[test]
fn processes_one_mib_plus_3_every_collective_dtype_op() {
    let outs = run_job(3, &["matrix", BIG], Spawn::default(), Duration::from_secs(600));
    assert_all_ok(&outs, "1 MiB + 3, nranks=3");
    assert!(outs[0].output.contains("checked=456"), "{}", outs[0].output);
}

#[test]
fn processes_one_mib_plus_3_at_8_ranks_and_over_tcp() {
    let spec = format!("{BIG};dtypes=f32,bf16,u8,i64,f8e4m3");
    let outs = run_job(8, &["matrix", &spec], Spawn::default(), Duration::from_secs(600));
    assert_all_ok(&outs, "1 MiB + 3, nranks=8");
    let spawn = Spawn { env: env(&[("OCCL_TRANSPORT", "tcp")]), ..Spawn::default() };
    let spec = format!("{BIG};dtypes=f32,f16,i8;ops=sum,avg,min");
    let outs = run_job(4, &["matrix", &spec], spawn, Duration::from_secs(600));
    assert_all_ok(&outs, "1 MiB + 3 over tcp, nranks=4");
}

fn threads(n: usize, spec: &Spec, config: Config) {
    threads_with(n, spec, config, |_| {});
}

/// As `threads`, with `attach` called on every communicator before the matrix runs.
fn threads_with(n: usize, spec: &Spec, config: Config, attach: impl Fn(&Comm)) {
    let comms = Comm::init_all_with(n, config).expect("init_all");
    assert_eq!(comms.len(), n);
    comms.iter().for_each(&attach);
    let handles: Vec<_> = comms
        .into_iter()
        .enumerate()
        .map(|(r, c)| {
            assert_eq!(c.rank(), r);
            let spec = spec.clone();
            std::thread::spawn(move || {
                let out = matrix::run(&c, &spec);
                c.destroy().expect("destroy");
                out
            })
        })
        .collect();
    for (r, h) in handles.into_iter().enumerate() {
        let out = h.join().expect("rank thread").unwrap_or_else(|e| panic!("threads n={n} rank {r}: {e}"));
        assert!(out.failures.is_empty(), "threads n={n} rank {r}: {:#?}", out.failures);
        assert!(out.checked > 0);
    }
}

#[test]
fn threads_mode_every_collective_dtype_op_ranks_1_to_8() {
    let spec = Spec::parse(SMALL).expect("spec");
    for n in 1..=8 {
        threads(n, &spec, Config::default());
    }
}

#[test]
fn threads_mode_large_and_over_tcp() {
    let spec = Spec::parse(&format!("{BIG};dtypes=f32,f64,bf16,i32")).expect("spec");
    threads(4, &spec, Config::default());
    let tcp = Config { transport: Some(TransportKind::Tcp), ..Config::default() };
    threads(3, &Spec::parse(SMALL).expect("spec"), tcp);
}

/// Forced algorithm sets (`OCCL_ALGO`, NCCL's syntax) covering every algorithm the tuner can
/// choose, with what the worker must then report at 4 KiB.
const FORCED: [(&str, &str); 2] = [
    (
        "ring;allreduce:tree;broadcast:tree;reduce:tree;allgather:pat;reducescatter:pat",
        "Broadcast:tree,Reduce:tree,AllGather:pat,ReduceScatter:pat,AllReduce:tree",
    ),
    ("ring;allreduce:oneshot", "Broadcast:chain,Reduce:chain,AllGather:ring,ReduceScatter:ring,AllReduce:one-shot"),
];

/// Tiny FIFOs (4 KiB slices, 8 KiB pieces) so that small counts cross every slice and piece
/// boundary, and past 64 KiB (f32 16384, i64 8192, bf16 32768 elements) the all-reduce splits
/// over both trees.
const SMALL_FIFOS: [(&str, &str); 3] =
    [("OCCL_SHM_SLOT_SIZE", "4096"), ("OCCL_TCP_SLOT_SIZE", "4096"), ("OCCL_FIFO_SLOTS", "4")];
const ALGO_SPEC: &str = "colls=all_reduce,broadcast,reduce,all_gather,reduce_scatter;dtypes=f32,bf16,i64;\
    ops=sum,avg,max;counts=0,1,7,513,1025,2049,4097,16389,32771";

fn forced_job(n: usize, algo: &str, want: &str, tcp: bool) {
    forced_proto_job(n, algo, want, tcp, None);
}

/// As `forced_job`, with `OCCL_PROTO=proto` when given (the worker then reports it).
fn forced_proto_job(n: usize, algo: &str, want: &str, tcp: bool, proto: Option<&str>) {
    let mut vars = SMALL_FIFOS.to_vec();
    vars.push(("OCCL_ALGO", algo));
    if tcp {
        vars.push(("OCCL_TRANSPORT", "tcp"));
    }
    if let Some(p) = proto {
        vars.push(("OCCL_PROTO", p));
    }
    let outs =
        run_job(n, &["matrix", ALGO_SPEC], Spawn { env: env(&vars), ..Spawn::default() }, Duration::from_secs(120));
    assert_all_ok(&outs, &format!("OCCL_ALGO={algo} OCCL_PROTO={proto:?} tcp={tcp} nranks={n}"));
    if n > 1 {
        assert!(outs[0].output.contains(&format!("algos={want}")), "{}", outs[0].output);
        if let Some(p) = proto {
            let want = format!("protos={}", p.to_ascii_lowercase());
            assert!(outs[0].output.contains(&want), "{}", outs[0].output);
        }
    }
}

#[test]
fn processes_shm_every_forced_algorithm_ranks_1_to_8() {
    for n in 1..=8 {
        forced_job(n, FORCED[0].0, FORCED[0].1, false);
    }
    for n in [2, 3, 5, 8] {
        forced_job(n, FORCED[1].0, FORCED[1].1, false);
    }
}

#[test]
fn processes_tcp_every_forced_algorithm() {
    for (algo, want) in FORCED {
        for n in [3, 4] {
            forced_job(n, algo, want, true);
        }
    }
}

/// With the default FIFOs a tree's data is one piece up to half a FIFO (512 KiB over tcp, 1 MiB
/// over shm): one tree then swaps at the top, and past 64 KiB two trees of one piece each share
/// each pair of ranks' FIFOs. Counts below and above 64 KiB and the piece, in and out of place.
#[test]
fn processes_forced_tree_with_default_fifos() {
    let spec = "colls=all_reduce;dtypes=f32,i64;ops=sum,avg,max;counts=1,7,16385,131075,300001";
    for tcp in [false, true] {
        for n in [2, 3, 4] {
            let mut vars = vec![("OCCL_ALGO", "allreduce:tree")];
            if tcp {
                vars.push(("OCCL_TRANSPORT", "tcp"));
            }
            let outs =
                run_job(n, &["matrix", spec], Spawn { env: env(&vars), ..Spawn::default() }, Duration::from_secs(120));
            assert_all_ok(&outs, &format!("forced tree, default FIFOs, tcp={tcp} nranks={n}"));
        }
    }
}

#[test]
fn threads_mode_every_forced_algorithm_ranks_1_to_8() {
    let spec = Spec::parse(ALGO_SPEC).expect("spec");
    let small = Config { shm_slot_size: 4096, tcp_slot_size: 4096, fifo_slots: 4, ..Config::default() };
    for n in 1..=8 {
        threads(n, &spec, Config { algo: Some(FORCED[0].0.into()), ..small.clone() });
    }
    for n in [3, 6] {
        threads(n, &spec, Config { algo: Some(FORCED[1].0.into()), ..small.clone() });
    }
}

/// The LL protocol (`OCCL_PROTO=LL`, shm only) under every algorithm that can carry it, at
/// ranks 1-8 in the threads mode. Its slices are one LL step (2024 bytes of payload) and its
/// pieces two steps here, so the counts of `ALGO_SPEC` cross every LL slice and piece boundary
/// for each datatype (f32 506 elements a step, bf16 1012, i64 253) and pass 64 KiB, where the
/// tree all-reduce splits over both trees.
#[test]
fn threads_mode_every_forced_algorithm_with_ll_ranks_1_to_8() {
    let spec = Spec::parse(ALGO_SPEC).expect("spec");
    let small = Config { shm_slot_size: 4096, fifo_slots: 4, proto: Some("LL".into()), ..Config::default() };
    for n in 1..=8 {
        for (algo, _) in FORCED {
            threads(n, &spec, Config { algo: Some(algo.into()), ..small.clone() });
        }
    }
}

/// A one-shot all-reduce of one slice (at most 2024 bytes: one LL step, or a Simple slot) runs
/// straight on the FIFOs, and past that the schedule takes over. Both protocols, at 2-8 ranks,
/// with counts up to, at and just past 2024 bytes for each datatype and past a small Simple slot
/// (1 KiB); without a profiler, and with one attached, which must see step events
/// (`profiler.rs` checks them against the plan).
#[test]
fn threads_mode_one_step_all_reduce_with_and_without_a_profiler() {
    use occl_tests::events::Counter;
    use std::sync::atomic::Ordering::Relaxed;
    let spec = Spec::parse(
        "colls=all_reduce;dtypes=f32,bf16,i64,u8;ops=sum,avg,max,prod;counts=0,1,7,253,254,506,507,1012,1013,2024,2025",
    )
    .expect("spec");
    let oneshot = Config { algo: Some("allreduce:oneshot".into()), ..Config::default() };
    let configs = [
        Config { proto: Some("LL".into()), ..oneshot.clone() },
        Config { proto: Some("Simple".into()), ..oneshot.clone() },
        Config { proto: Some("Simple".into()), shm_slot_size: 1024, fifo_slots: 4, ..oneshot },
    ];
    for config in configs {
        for n in [2, 3, 5, 8] {
            threads(n, &spec, config.clone());
            let sinks = std::sync::Mutex::new(Vec::new());
            threads_with(n, &spec, config.clone(), |c| {
                let k = std::sync::Arc::new(Counter::default());
                k.mask.store(occl::telemetry::EventMask::ALL.0, Relaxed);
                c.attach_sink(k.clone()).expect("attach");
                sinks.lock().expect("sinks").push(k);
            });
            let sinks = sinks.into_inner().expect("sinks");
            let steps = |k: &Counter| k.sums.load(Relaxed) + k.states.load(Relaxed);
            assert!(sinks.iter().all(|k| steps(k) > 0), "no step events with a profiler attached (n={n})");
        }
    }
}

/// LL in real processes (cross-process shared memory and its wake-ups): a representative
/// subset of rank counts; the worker reports the protocol it ran.
#[test]
fn processes_shm_every_forced_algorithm_with_ll() {
    for (n, (algo, want)) in [(2, FORCED[0]), (5, FORCED[0]), (8, FORCED[0]), (3, FORCED[1]), (4, FORCED[1])] {
        forced_proto_job(n, algo, want, false, Some("LL"));
    }
}
