//! One rank of a multi-process test job, started by the integration tests with the launcher
//! environment set. `occl-test-worker <scenario> [args]`; prints `OK …` lines on success and
//! `ERR kind=<ErrorKind> …` when occl returned an error, and exits non-zero on any failure.

use occl::{Comm, RedOp};
use occl_tests::matrix::{self, Spec};
use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

fn now_ns() -> u128 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0)
}

fn report(e: &occl::Error) -> ExitCode {
    println!("ERR kind={:?} at_ns={} msg={}", e.kind(), now_ns(), e);
    ExitCode::from(3)
}

fn main() -> ExitCode {
    // OCCL_LOG takes a tracing filter; OCCL_DEBUG (or NCCL_DEBUG) a level, as NCCL's.
    let filter = tracing_subscriber::EnvFilter::try_from_env("OCCL_LOG")
        .ok()
        .or_else(|| {
            let level = std::env::var("OCCL_DEBUG").or_else(|_| std::env::var("NCCL_DEBUG")).ok()?;
            tracing_subscriber::EnvFilter::try_new(level.to_ascii_lowercase()).ok()
        })
        .unwrap_or_else(|| "warn".into());
    let _ = tracing_subscriber::fmt().with_writer(std::io::stderr).with_env_filter(filter).try_init();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let scenario = args.first().map(String::as_str).unwrap_or("");
    if scenario == "events" {
        // Registered before the communicator exists: profilers reach communicators created after.
        let dir = std::env::var_os("OCCL_TEST_EVENTS_DIR").map(std::path::PathBuf::from).unwrap_or_else(|| ".".into());
        occl_telemetry::profiler::register(std::sync::Arc::new(occl_tests::events::Recorder {
            dir,
            mask: occl_telemetry::EventMask::ALL,
        }));
    }
    let comm = match Comm::from_env() {
        Ok(c) => c,
        Err(e) => return report(&e),
    };
    let r = comm.rank();
    match scenario {
        // The correctness matrix; args[1] is a Spec string.
        "matrix" => {
            let spec = match Spec::parse(args.get(1).map(String::as_str).unwrap_or("")) {
                Ok(s) => s,
                Err(e) => {
                    eprintln!("bad spec: {e}");
                    return ExitCode::from(2);
                }
            };
            match matrix::run(&comm, &spec) {
                Ok(out) if out.failures.is_empty() => {
                    // What the tuner picks at 4 KiB per rank, so tests see that forcing took effect.
                    let algos: Vec<String> = occl::CollType::NCCL_COUNTED
                        .iter()
                        .map(|&c| format!("{}:{}", c.name(), comm.algorithm(c, 4096)))
                        .collect();
                    println!(
                        "OK rank={r} checked={} transport={} algos={}",
                        out.checked,
                        comm.transport_summary(),
                        algos.join(",")
                    );
                }
                Ok(out) => {
                    for f in &out.failures {
                        println!("WRONG {f}");
                    }
                    return ExitCode::from(1);
                }
                Err(e) => {
                    println!("ERR kind=matrix msg={e}");
                    return ExitCode::from(1);
                }
            }
        }
        // All-reduces until occl fails (a peer is killed by the test); prints when it did.
        "loop" => {
            let buf = vec![1.0f32; 1 << 16];
            let mut out = vec![0f32; 1 << 16];
            println!("READY rank={r} pid={}", std::process::id());
            for i in 0u64.. {
                if let Err(e) = comm.all_reduce(&buf, &mut out, RedOp::Sum) {
                    println!("after {i} ops");
                    return report(&e);
                }
                if i > 10_000_000 {
                    break;
                }
            }
        }
        // Rank `args[1]` runs a different operation (`args[2]`: count|coll|dtype|root) than the others.
        "mismatch" => {
            let odd = args.get(1).and_then(|s| s.parse::<usize>().ok()).unwrap_or(1);
            let how = args.get(2).map(String::as_str).unwrap_or("count");
            let a = vec![1.0f32; 1000];
            let mut b = vec![0f32; 2000];
            let res = if r != odd {
                comm.all_reduce(&a, &mut b[..1000], RedOp::Sum)
            } else {
                match how {
                    "count" => comm.all_reduce(&b[..1500], &mut vec![0f32; 1500], RedOp::Sum),
                    "coll" => comm.broadcast_in_place(&mut b[..1000], 0),
                    "dtype" => comm.all_reduce(&vec![1.0f64; 500], &mut vec![0f64; 500], RedOp::Sum),
                    _ => comm.all_reduce(&a, &mut b[..1000], RedOp::Max),
                }
            };
            match res {
                Ok(()) => println!("OK rank={r} (no error)"),
                Err(e) => return report(&e),
            }
        }
        // Rank 1 arrives `args[1]` ms late to an all-reduce; the others should time out.
        "late" => {
            let ms: u64 = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(3000);
            if r == 1 {
                std::thread::sleep(Duration::from_millis(ms));
            }
            // Large enough for the ring (a one-shot exchange would let the late rank finish from
            // data its peers published before they timed out).
            let a = vec![1.0f32; 1 << 16];
            let mut b = vec![0f32; 1 << 16];
            match comm.all_reduce(&a, &mut b, RedOp::Sum) {
                Ok(()) => println!("OK rank={r}"),
                Err(e) => return report(&e),
            }
        }
        // A few all-reduces, then idle until killed (RAS tests query the job meanwhile).
        "idle" => {
            let a = vec![1.0f32; 4096];
            let mut b = vec![0f32; 4096];
            for _ in 0..5 {
                if let Err(e) = comm.all_reduce(&a, &mut b, RedOp::Sum) {
                    return report(&e);
                }
            }
            println!("READY rank={r} pid={}", std::process::id());
            std::thread::sleep(Duration::from_secs(3600));
        }
        // Rank `args[1]` stops after 5 all-reduces; the others start a 6th and wait in it (a hung job).
        "hang" => {
            let odd = args.get(1).and_then(|s| s.parse::<usize>().ok()).unwrap_or(1);
            let a = vec![1.0f32; 1 << 16];
            let mut b = vec![0f32; 1 << 16];
            for _ in 0..5 {
                if let Err(e) = comm.all_reduce(&a, &mut b, RedOp::Sum) {
                    return report(&e);
                }
            }
            println!("READY rank={r} pid={}", std::process::id());
            if r == odd {
                std::thread::sleep(Duration::from_secs(3600));
            } else if let Err(e) = comm.all_reduce(&a, &mut b, RedOp::Sum) {
                return report(&e);
            }
        }
        // A second communicator over the same ranks (its id broadcast through the first); rank `args[1]`
        // destroys it, the others keep it; then idle (RAS reports the destroyed rank as NOCOMM).
        "subcomm" => {
            let gone = args.get(1).and_then(|s| s.parse::<usize>().ok()).unwrap_or(1);
            let mut text = [0u8; 256];
            if r == 0 {
                match occl::UniqueId::new() {
                    Ok(id) => {
                        let t = id.to_string();
                        let n = t.len().min(text.len());
                        text[..n].copy_from_slice(&t.as_bytes()[..n]);
                    }
                    Err(e) => return report(&e),
                }
            }
            if let Err(e) = comm.broadcast_in_place(&mut text, 0) {
                return report(&e);
            }
            let end = text.iter().position(|&b| b == 0).unwrap_or(text.len());
            let id: occl::UniqueId = match std::str::from_utf8(&text[..end]).ok().and_then(|t| t.parse().ok()) {
                Some(id) => id,
                None => {
                    println!("ERR kind=bad-id");
                    return ExitCode::from(2);
                }
            };
            let sub = match Comm::init_rank(comm.nranks(), &id, r, comm.config().clone()) {
                Ok(c) => c,
                Err(e) => return report(&e),
            };
            let mut v = [1.0f32; 64];
            if let Err(e) = sub.all_reduce_in_place(&mut v, RedOp::Sum) {
                return report(&e);
            }
            let keep = if r == gone {
                if let Err(e) = sub.destroy() {
                    return report(&e);
                }
                None
            } else {
                Some(sub)
            };
            println!("READY rank={r} pid={}", std::process::id());
            std::thread::sleep(Duration::from_secs(3600));
            drop(keep);
        }
        // Every collective and p2p at a few sizes, with a recording profiler (see "events" above).
        "events" => {
            if let Err(e) = occl_tests::events::every_operation(&comm) {
                return report(&e);
            }
            println!("OK rank={r} events transport={}", comm.transport_summary());
        }
        _ => {
            eprintln!("unknown scenario {scenario:?}; expected matrix, loop, mismatch, late or events");
            return ExitCode::from(2);
        }
    }
    match comm.destroy() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => report(&e),
    }
}
