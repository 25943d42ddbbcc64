//! The tuner's interface: forcing with `OCCL_ALGO`/`OCCL_PROTO` and their NCCL spellings, the
//! documented errors for what occl cannot run, ranks that disagree, `OCCL_TUNER_FILE`, and the
//! `OCCL_DEBUG=INFO` log of each choice. (Correctness of every forced algorithm is in
//! `collectives.rs`, their profiler events in `profiler.rs`.)

mod common;

use common::{assert_all_ok, env, err_of, run_job, scratch};
use occl::{CollType, Comm, Config, ErrorKind, RedOp};
use occl_tests::launch::Spawn;
use std::time::Duration;

fn on_threads(n: usize, config: Config, f: impl Fn(&Comm) + Send + Sync + Copy + 'static) {
    let comms = Comm::init_all_with(n, config).expect("init_all");
    let hs: Vec<_> = comms
        .into_iter()
        .map(|c| {
            std::thread::spawn(move || {
                f(&c);
                c.destroy().expect("destroy");
            })
        })
        .collect();
    for h in hs {
        h.join().expect("rank thread panicked");
    }
}

fn forced(algo: Option<&str>, proto: Option<&str>) -> Config {
    Config { algo: algo.map(String::from), proto: proto.map(String::from), ..Config::default() }
}

#[test]
fn a_forced_choice_occl_cannot_run_is_invalid_usage_naming_what_it_supports() {
    on_threads(3, forced(Some("tree"), None), |c| {
        let a = vec![1.0f32; 12];
        let mut b = vec![0f32; 12];
        for e in
            [c.all_gather(&a[..4], &mut b).unwrap_err(), c.reduce_scatter(&a, &mut b[..4], RedOp::Sum).unwrap_err()]
        {
            assert_eq!(e.kind(), ErrorKind::InvalidUsage, "{e}");
            let m = e.to_string();
            assert!(m.contains("OCCL_ALGO=\"tree\"") && m.contains("supports RING, PAT"), "{m}");
        }
        assert_eq!(c.algorithm(CollType::AllGather, 16), "none");
        // The refusal fails that call alone: what tree runs still works, and all-to-all is not tuned.
        assert_eq!(c.algorithm(CollType::AllReduce, 16), "tree");
        c.all_reduce(&a, &mut b, RedOp::Sum).expect("tree all-reduce after a refused all-gather");
        assert_eq!(b, vec![3.0; 12]);
        c.all_to_all(&a, &mut b).expect("all-to-all");
    });
    on_threads(2, forced(Some("nvls,collnetdirect,collnetchain,nvlstree"), None), |c| {
        let e = c.all_reduce(&[1.0f32], &mut [0f32], RedOp::Sum).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidUsage);
        assert!(e.to_string().contains("supports RING, TREE, ONESHOT"), "{e}");
        let e = c.broadcast_in_place(&mut [0u8; 4], 0).unwrap_err();
        assert!(e.to_string().contains("supports RING, TREE"), "{e}");
    });
    for proto in ["LL128", "allreduce:ll128"] {
        on_threads(2, forced(None, Some(proto)), |c| {
            let e = c.all_reduce(&[1.0f32], &mut [0f32], RedOp::Sum).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidUsage);
            assert!(e.to_string().contains("no protocol") && e.to_string().contains("supports SIMPLE, LL"), "{e}");
        });
    }
    // LL runs on shm, and is refused over tcp, naming what tcp runs.
    on_threads(2, forced(None, Some("ll")), |c| {
        assert_eq!(c.protocol(CollType::AllReduce, 8), "ll");
        let mut out = [0f32; 3];
        c.all_reduce(&[1.0f32, 2.0, 3.0], &mut out, RedOp::Sum).expect("LL all-reduce");
        assert_eq!(out, [2.0, 4.0, 6.0]);
    });
    let tcp_ll = Config { transport: Some(occl::TransportKind::Tcp), ..forced(None, Some("ll")) };
    on_threads(2, tcp_ll, |c| {
        let e = c.all_reduce(&[1.0f32], &mut [0f32], RedOp::Sum).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidUsage);
        let m = e.to_string();
        assert!(m.contains("OCCL_PROTO=\"ll\"") && m.contains("over tcp") && m.contains("supports SIMPLE ("), "{m}");
        assert_eq!(c.protocol(CollType::AllReduce, 8), "none");
    });
    // Excluding LL and LL128 leaves Simple.
    on_threads(2, forced(None, Some("^ll,ll128")), |c| {
        assert_eq!(c.protocol(CollType::AllReduce, 8), "simple");
        c.all_reduce(&[1.0f32], &mut [0f32], RedOp::Sum).expect("simple");
    });
}

#[test]
fn nccl_spellings_force_and_malformed_lists_fail_init() {
    // NCCL_ALGO alone forces; OCCL_ALGO wins over it.
    let spec = "colls=all_reduce,all_gather;dtypes=f32;ops=sum;counts=1,1025";
    let outs = run_job(
        3,
        &["matrix", spec],
        Spawn { env: env(&[("NCCL_ALGO", "allreduce:tree")]), ..Spawn::default() },
        Duration::from_secs(60),
    );
    assert_all_ok(&outs, "NCCL_ALGO");
    assert!(
        outs[0].output.contains("AllReduce:tree") && outs[0].output.contains("protos=simple"),
        "{}",
        outs[0].output
    );
    let both = env(&[("NCCL_ALGO", "allreduce:tree"), ("OCCL_ALGO", "allreduce:ring"), ("NCCL_PROTO", "Simple")]);
    let outs = run_job(3, &["matrix", spec], Spawn { env: both, ..Spawn::default() }, Duration::from_secs(60));
    assert_all_ok(&outs, "OCCL_ALGO over NCCL_ALGO");
    assert!(outs[0].output.contains("AllReduce:ring"), "{}", outs[0].output);
    for (var, bad, want) in [
        ("NCCL_ALGO", "ring,bogus", "unknown name \"bogus\""),
        ("OCCL_ALGO", "allreduce:tree;ring", "needs a collective prefix"),
        ("NCCL_PROTO", "alltoall:simple", "unknown collective"),
    ] {
        let outs = run_job(
            2,
            &["matrix", spec],
            Spawn { env: env(&[(var, bad)]), ..Spawn::default() },
            Duration::from_secs(60),
        );
        for o in &outs {
            let (kind, _, line) =
                err_of(o).unwrap_or_else(|| panic!("{var}={bad}: rank {} did not fail: {}", o.rank, o.output));
            assert_eq!(kind, "InvalidUsage", "{line}");
            assert!(line.contains(var) && line.contains(want), "{line}");
        }
    }
}

#[test]
fn ranks_that_would_choose_differently_fail_init_on_every_rank() {
    let spawn =
        Spawn { rank_env: vec![env(&[]), env(&[("OCCL_ALGO", "allreduce:tree")]), env(&[])], ..Spawn::default() };
    let outs = run_job(3, &["matrix", "counts=1"], spawn, Duration::from_secs(60));
    for o in &outs {
        let (kind, _, line) = err_of(o).unwrap_or_else(|| panic!("rank {} did not fail: {}", o.rank, o.output));
        assert_eq!(kind, "InvalidUsage", "{line}");
        assert!(line.contains("tunes differently"), "{line}");
    }
}

#[test]
fn the_tuner_file_sets_the_model_and_its_mistakes_name_the_line() {
    let dir = scratch("tuner-file");
    // Trees for free, everything else dear (LL too): the tuner must pick trees at every size.
    let good = dir.join("cheap-trees.conf");
    std::fs::write(
        &good,
        "# test\nshm.alpha_us = 1000\nshm.allreduce.tree.scale = 0.000001\nshm.allreduce.ring.base_us = 1e6\n\
         shm.allreduce.oneshot.base_us = 1e6\nshm-shared.allreduce.ring.base_us = 1e6\nshm-shared.allreduce.oneshot.base_us = 1e6\n\
         shm.ll.alpha_us = 1e6\nshm-shared.ll.alpha_us = 1e6\n",
    )
    .expect("write");
    let g = good.to_string_lossy().to_string();
    let spec = "colls=all_reduce;dtypes=f32;ops=sum;counts=1,300000";
    let outs = run_job(
        3,
        &["matrix", spec],
        Spawn { env: env(&[("OCCL_TUNER_FILE", &g)]), ..Spawn::default() },
        Duration::from_secs(60),
    );
    assert_all_ok(&outs, "tuner file");
    assert!(
        outs[0].output.contains("AllReduce:tree") && outs[0].output.contains("protos=simple"),
        "{}",
        outs[0].output
    );
    let bad = dir.join("bad.conf");
    std::fs::write(&bad, "shm.alpha_us = 1\ntcp.gbps = fast\n").expect("write");
    let b = bad.to_string_lossy().to_string();
    let outs = run_job(
        2,
        &["matrix", spec],
        Spawn { env: env(&[("OCCL_TUNER_FILE", &b)]), ..Spawn::default() },
        Duration::from_secs(60),
    );
    for o in &outs {
        let (kind, _, line) = err_of(o).unwrap_or_else(|| panic!("rank {} did not fail: {}", o.rank, o.output));
        assert_eq!(kind, "InvalidArgument", "{line}");
        assert!(line.contains("bad.conf") && line.contains("line 2"), "{line}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn occl_debug_info_logs_each_choice_once_per_size_class() {
    // 4 and 8..12 bytes: two size classes, each called 2 (in place or not) × 2 (ops) times or more.
    let spec = "colls=all_reduce;dtypes=f32;ops=sum,max;counts=1,2,3";
    let outs = run_job(
        2,
        &["matrix", spec],
        Spawn { env: env(&[("OCCL_DEBUG", "INFO")]), ..Spawn::default() },
        Duration::from_secs(60),
    );
    assert_all_ok(&outs, "OCCL_DEBUG=INFO");
    for o in &outs {
        let lines: Vec<&str> = o.output.lines().filter(|l| l.contains("occl: tuner: AllReduce")).collect();
        // The worker's own report asks about 4 KiB once more.
        for class in ["4..7 B", "8..15 B", "4096..8191 B"] {
            let n = lines.iter().filter(|l| l.contains(class)).count();
            assert_eq!(n, 1, "rank {}: {class} logged {n} times: {lines:#?}", o.rank);
        }
        assert_eq!(lines.len(), 3, "rank {}: {lines:#?}", o.rank);
        assert!(lines.iter().all(|l| l.contains("INFO") && l.contains("model: ring/simple")), "{lines:#?}");
    }
}

/// `occl-perf --compare`: every choice gets its own rows, each run the way it was forced, with
/// correct results; a choice the transport cannot run fails the benchmark naming it.
#[test]
fn occl_perf_compare_runs_each_forced_choice_interleaved_and_names_one_it_cannot_run() {
    let perf = env!("CARGO_BIN_EXE_occl-perf");
    let run = |transport: &str, list: &str| {
        std::process::Command::new(perf)
            .args(["all_reduce", "-b", "8", "-e", "64K", "-f", "64", "-n", "3", "-w", "1", "--batches", "3"])
            .args(["--ranks", "3", &format!("--compare={list}")])
            .env("OCCL_TRANSPORT", transport)
            .output()
            .expect("occl-perf starts")
    };
    let out = run("shm", "-,ring,tree/ll,oneshot/simple");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    let rows: Vec<serde_json::Value> =
        stdout.lines().filter(|l| l.starts_with('{')).map(|l| serde_json::from_str(l).expect("a JSON row")).collect();
    // 8 B, 512 B, 32 KiB: four rows each, in the list's order.
    assert_eq!(rows.len(), 12, "{stdout}");
    for (i, r) in rows.iter().enumerate() {
        let (forced, algo, proto) = (r["forced"].as_str(), r["algo"].as_str(), r["proto"].as_str());
        let want = ["-", "ring", "tree/ll", "oneshot/simple"][i % 4];
        assert_eq!(forced, Some(want), "{r}");
        match want {
            "ring" => assert_eq!(algo, Some("ring"), "{r}"),
            "tree/ll" => assert_eq!((algo, proto), (Some("tree"), Some("ll")), "{r}"),
            "oneshot/simple" => assert_eq!((algo, proto), (Some("one-shot"), Some("simple")), "{r}"),
            _ => {}
        }
        assert_eq!(r["wrong"].as_u64(), Some(0), "{r}");
        assert_eq!(r["inplace"].as_bool(), Some(false), "{r}");
        assert!(r["time_us"].as_f64().is_some_and(|t| t > 0.0), "{r}");
    }
    let out = run("tcp", "ring,ring/ll");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--compare ring/ll") && err.contains("supports SIMPLE"), "{err}");
}

/// Ranks pinned one per core (each alone sees a single CPU) have a core each: the host is not
/// oversubscribed, so the tuner prices plain `shm` and waits spin. Two ranks pinned to one core
/// are: `shm-shared`.
#[test]
fn ranks_pinned_one_per_core_are_not_oversubscribed_but_two_on_one_core_are() {
    let cpus = occl::topo::cpuset::process_affinity().expect("sched_getaffinity");
    let ids: Vec<u32> = cpus.iter().take(2).collect();
    if ids.len() < 2 {
        println!("SKIPPED: this process may run on {} CPU(s); pinning two ranks apart needs 2", ids.len());
        return;
    }
    let spec = "colls=all_reduce;dtypes=f32;ops=sum;counts=1";
    for (pins, link) in [([ids[0], ids[1]], "over shm:"), ([ids[0], ids[0]], "over shm-shared:")] {
        let rank_env = pins.iter().map(|c| vec![("OCCL_TEST_PIN_CPU".to_string(), c.to_string())]).collect();
        let outs = run_job(
            2,
            &["matrix", spec],
            Spawn { env: env(&[("OCCL_DEBUG", "INFO"), ("OCCL_TRANSPORT", "shm")]), rank_env, ..Spawn::default() },
            Duration::from_secs(60),
        );
        assert_all_ok(&outs, "pinned ranks");
        for o in &outs {
            let lines: Vec<&str> = o.output.lines().filter(|l| l.contains("occl: tuner: AllReduce")).collect();
            assert!(!lines.is_empty() && lines.iter().all(|l| l.contains(link)), "pins {pins:?}: {lines:#?}");
        }
    }
}
