//! `Comm::from_env()` joins a job from each launcher's variables: torchrun's, Open MPI's and
//! Slurm's (with MASTER_ADDR/MASTER_PORT for the root), and occl's own.

mod common;

use occl_tests::launch::{Job, Spawn};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A free loopback port (the root binds MASTER_PORT + 1).
fn free_port_pair() -> u16 {
    loop {
        let a = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let p = a.local_addr().expect("addr").port();
        if p < 65000 && std::net::TcpListener::bind(("127.0.0.1", p + 1)).is_ok() {
            return p;
        }
    }
}

fn run(nranks: usize, env_of: impl Fn(usize) -> Vec<(String, String)>) -> Vec<String> {
    let children: Vec<_> = (0..nranks)
        .map(|r| {
            let mut c = Command::new(common::worker());
            c.args(["matrix", "colls=all_reduce,all_gather;dtypes=f32,i64;ops=sum,max;counts=7,4099"])
                .env_remove("OCCL_RANK")
                .env_remove("OCCL_NRANKS")
                .env_remove("OCCL_UNIQUE_ID")
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            for (k, v) in env_of(r) {
                c.env(k, v);
            }
            c.spawn().expect("start rank")
        })
        .collect();
    let start = Instant::now();
    let mut outs = Vec::new();
    for c in children {
        let o = c.wait_with_output().expect("wait");
        let text = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
        assert!(o.status.success(), "rank failed ({}):\n{text}", o.status);
        outs.push(text);
    }
    assert!(start.elapsed() < Duration::from_secs(60));
    outs
}

fn kv(pairs: &[(&str, String)]) -> Vec<(String, String)> {
    pairs.iter().map(|(k, v)| (k.to_string(), v.clone())).collect()
}

#[test]
fn torchrun_variables() {
    let port = free_port_pair();
    let outs = run(3, |r| {
        kv(&[
            ("RANK", r.to_string()),
            ("WORLD_SIZE", "3".into()),
            ("MASTER_ADDR", "127.0.0.1".into()),
            ("MASTER_PORT", port.to_string()),
            ("TORCHELASTIC_RUN_ID", "test-run".into()),
        ])
    });
    for (r, o) in outs.iter().enumerate() {
        assert!(o.contains(&format!("OK rank={r} ")), "{o}");
    }
}

#[test]
fn open_mpi_variables_with_master_address() {
    let port = free_port_pair();
    let outs = run(2, |r| {
        kv(&[
            ("OMPI_COMM_WORLD_RANK", r.to_string()),
            ("OMPI_COMM_WORLD_SIZE", "2".into()),
            ("MASTER_ADDR", "127.0.0.1".into()),
            ("MASTER_PORT", port.to_string()),
        ])
    });
    assert!(outs[1].contains("OK rank=1 "), "{}", outs[1]);
}

#[test]
fn slurm_variables_with_an_explicit_secret_and_port() {
    let port = free_port_pair();
    let outs = run(2, |r| {
        kv(&[
            ("SLURM_PROCID", r.to_string()),
            ("SLURM_NTASKS", "2".into()),
            ("MASTER_ADDR", "localhost".into()),
            ("MASTER_PORT", "1".into()),
            ("OCCL_BOOTSTRAP_PORT", (port + 1).to_string()),
            ("OCCL_JOB_SECRET", "00112233445566778899aabbccddeeff".into()),
        ])
    });
    assert!(outs[0].contains("OK rank=0 "), "{}", outs[0]);
}

#[test]
fn ranks_with_different_job_secrets_do_not_form_a_job() {
    let port = free_port_pair();
    let children: Vec<_> = (0..2)
        .map(|r| {
            Command::new(common::worker())
                .args(["matrix", "colls=all_reduce;counts=1"])
                .env_remove("OCCL_RANK")
                .env_remove("OCCL_UNIQUE_ID")
                .env("RANK", r.to_string())
                .env("WORLD_SIZE", "2")
                .env("MASTER_ADDR", "127.0.0.1")
                .env("MASTER_PORT", port.to_string())
                .env("OCCL_JOB_SECRET", if r == 0 { "0".repeat(32) } else { "1".repeat(32) })
                .env("OCCL_TIMEOUT", "5")
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("start")
        })
        .collect();
    let outs: Vec<_> = children.into_iter().map(|c| c.wait_with_output().expect("wait")).collect();
    let rank1 = String::from_utf8_lossy(&outs[1].stdout).into_owned();
    assert!(!outs[1].status.success(), "a rank with the wrong secret joined:\n{rank1}");
    assert!(rank1.contains("ERR kind=InvalidUsage") && rank1.contains("secret"), "{rank1}");
    assert!(!outs[0].status.success(), "rank 0 cannot complete a job without rank 1");
}

/// The worker with no launcher's variables at all.
fn without_launcher() -> Command {
    let mut c = Command::new(common::worker());
    c.args(["matrix", ""]);
    for v in [
        "OCCL_RANK",
        "OCCL_NRANKS",
        "OCCL_UNIQUE_ID",
        "RANK",
        "WORLD_SIZE",
        "OMPI_COMM_WORLD_RANK",
        "OMPI_COMM_WORLD_SIZE",
        "PMI_RANK",
        "PMI_SIZE",
        "SLURM_PROCID",
        "SLURM_NTASKS",
    ] {
        c.env_remove(v);
    }
    c
}

#[test]
fn missing_launcher_environment_is_a_clear_error() {
    let o = without_launcher().output().expect("run");
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(!o.status.success());
    assert!(out.contains("ERR kind=InvalidUsage") && out.contains("OCCL_RANK"), "{out}");
    let o = Command::new(common::worker())
        .args(["matrix", ""])
        .env("OCCL_RANK", "0")
        .env("OCCL_NRANKS", "2")
        .env("OCCL_UNIQUE_ID", "occl1-nothex@127.0.0.1:1")
        .output()
        .expect("run");
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("ERR kind=InvalidArgument") && out.contains("unique id"), "{out}");
}

/// torchrun's variables for rank `r` of `world` ranks at the root `127.0.0.1:port`.
fn torchrun(r: usize, world: usize, port: u16) -> Vec<(String, String)> {
    kv(&[
        ("RANK", r.to_string()),
        ("WORLD_SIZE", world.to_string()),
        ("MASTER_ADDR", "127.0.0.1".into()),
        ("MASTER_PORT", port.to_string()),
        ("TORCHELASTIC_RUN_ID", "size-test".into()),
    ])
}

/// One rank started with another WORLD_SIZE: every rank fails within seconds (OCCL_TIMEOUT
/// is the default 600 s), each naming a rank, its WORLD_SIZE and the root's.
#[test]
fn a_wrong_world_size_on_one_rank_fails_every_rank_naming_both_sizes() {
    let port = free_port_pair();
    for (odd, wrong, want) in [
        (2, 8, "rank 2 says WORLD_SIZE=8, the root has WORLD_SIZE=4"),
        (2, 3, "rank 2 says WORLD_SIZE=3, the root has WORLD_SIZE=4"),
        // Rank 2 is out of its own range, and still tells the root.
        (2, 2, "rank 2 says WORLD_SIZE=2, the root has WORLD_SIZE=4"),
        // The root's own rank is the odd one: whichever rank joins first is named.
        (0, 2, " says WORLD_SIZE=4, the root has WORLD_SIZE=2"),
    ] {
        let launcher = (0..4).map(|r| torchrun(r, if r == odd { wrong } else { 4 }, port)).collect();
        let spawn = Spawn { capture_stdout: true, capture_stderr: true, ..Spawn::default() };
        let args: Vec<String> = ["matrix", "colls=all_reduce;counts=1"].iter().map(|s| s.to_string()).collect();
        let start = Instant::now();
        let job = Job::start(common::worker(), &args, launcher, &spawn).expect("start");
        let outs = job.wait(Duration::from_secs(60)).expect("every rank exits (none waits out OCCL_TIMEOUT)");
        let took = start.elapsed();
        for o in &outs {
            assert!(!o.status.success(), "rank {} of a job with two sizes succeeded:\n{}", o.rank, o.output);
            let (kind, _, line) = common::err_of(o).unwrap_or_else(|| panic!("rank {}: no ERR:\n{}", o.rank, o.output));
            assert_eq!(kind, "InvalidUsage", "rank {}: {line}", o.rank);
            assert!(line.contains(want), "rank {}: {line}", o.rank);
        }
        assert!(took < Duration::from_secs(15), "the job took {took:?} to fail");
        eprintln!("WORLD_SIZE={wrong} on rank {odd} of 4: every rank failed in {took:?}");
    }
}

/// Half of a launcher's pair names the other half.
#[test]
fn a_rank_without_a_size_names_the_missing_variable() {
    for (set, value, missing) in [("RANK", "1", "WORLD_SIZE"), ("WORLD_SIZE", "4", "RANK")] {
        let o = without_launcher()
            .env(set, value)
            .env("MASTER_ADDR", "127.0.0.1")
            .env("MASTER_PORT", "29500")
            .output()
            .expect("run");
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(!o.status.success(), "{out}");
        assert!(
            out.contains("ERR kind=InvalidUsage") && out.contains(&format!("{set} is set but {missing} is not")),
            "{out}"
        );
    }
}
