//! One rank of a multi-process test job, started by the integration tests with the launcher
//! environment set. `occl-test-worker <scenario> [args]`; prints `OK …` lines on success and
//! `ERR kind=<ErrorKind> …` when occl returned an error, and exits non-zero on any failure.

use occl::{Comm, RedOp, ShrinkMode};
use occl_tests::lifecycle;
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

/// A scenario's failure: occl's error as `ERR`, a wrong result as `WRONG`.
fn failure(f: lifecycle::Failure) -> ExitCode {
    match f {
        lifecycle::Failure::Occl(e) => report(&e),
        lifecycle::Failure::Wrong(w) => {
            println!("WRONG {w}");
            ExitCode::from(1)
        }
    }
}

/// The "trace" scenario's steps; returns the operations each step runs on this rank.
fn trace_steps(comm: &Comm, steps: u64, slow: bool, delay: Duration) -> occl::Result<u64> {
    let (r, n) = (comm.rank(), comm.nranks());
    let big = vec![1.0f32; 1 << 20];
    let mut big_out = vec![0f32; 1 << 20];
    let part = vec![r as f32; 4096];
    let mut gathered = vec![0f32; 4096 * n];
    let mut bc = vec![0f32; 1024];
    let mut tiny = [1.0f32; 2];
    let mut p2p_in = vec![0f32; 256];
    let p2p_out = vec![r as f32; 256];
    for step in 1..=steps {
        let _step = occl::profiler_step(step);
        if slow {
            std::thread::sleep(delay);
        }
        comm.all_reduce(&big, &mut big_out, RedOp::Sum)?;
        comm.all_gather(&part, &mut gathered)?;
        comm.broadcast_in_place(&mut bc, 0)?;
        comm.all_reduce_in_place(&mut tiny, RedOp::Sum)?;
        // A ring: even ranks send first, odd ranks receive first.
        let (to, from) = ((r + 1) % n, (r + n - 1) % n);
        if r % 2 == 0 {
            comm.send(&p2p_out, to)?;
            comm.recv(&mut p2p_in, from)?;
        } else {
            comm.recv(&mut p2p_in, from)?;
            comm.send(&p2p_out, to)?;
        }
    }
    Ok(6)
}

/// One round of the "dashboards" scenario: small and 1 MiB all-reduces, an all-gather, a reduce-scatter, a
/// broadcast and a send/recv ring.
fn dashboards_round(comm: &Comm) -> occl::Result<()> {
    let (r, n) = (comm.rank(), comm.nranks());
    let (a, mut b) = (vec![1.0f32; 1000], vec![0f32; 1000]);
    comm.all_reduce(&a, &mut b, RedOp::Sum)?;
    let (a, mut b) = (vec![1.0f32; 1 << 18], vec![0f32; 1 << 18]);
    comm.all_reduce(&a, &mut b, RedOp::Sum)?;
    let (a, mut g) = (vec![r as i32; 4096], vec![0i32; 4096 * n]);
    comm.all_gather(&a, &mut g)?;
    let (a, mut s) = (vec![1.0f32; 8192 * n], vec![0f32; 8192]);
    comm.reduce_scatter(&a, &mut s, RedOp::Sum)?;
    let mut c = vec![0f64; 100];
    comm.broadcast_in_place(&mut c, 0)?;
    let (out, mut inp) = (vec![r as f32; 256], vec![0f32; 256]);
    let (to, from) = ((r + 1) % n, (r + n - 1) % n);
    if r % 2 == 0 {
        comm.send(&out, to)?;
        comm.recv(&mut inp, from)
    } else {
        comm.recv(&mut inp, from)?;
        comm.send(&out, to)
    }
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
    // Pinned to one CPU before the communicator exists, as `taskset -c N` or a launcher's
    // binding would (tests/tuner.rs: ranks pinned one per core).
    if let Some(cpu) = std::env::var("OCCL_TEST_PIN_CPU").ok().and_then(|v| v.parse::<usize>().ok()) {
        // SAFETY: cpu_set_t is plain data; CPU_SET stays within it for cpu < CPU_SETSIZE.
        let rc = unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(cpu % libc::CPU_SETSIZE as usize, &mut set);
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set)
        };
        if rc != 0 {
            eprintln!("occl-test-worker: pin to cpu {cpu}: {}", std::io::Error::last_os_error());
            return ExitCode::FAILURE;
        }
    }
    if scenario == "events" {
        // Registered before the communicator exists: profilers reach communicators created after.
        let dir = std::env::var_os("OCCL_TEST_EVENTS_DIR").map(std::path::PathBuf::from).unwrap_or_else(|| ".".into());
        occl_telemetry::profiler::register(std::sync::Arc::new(occl_tests::events::Recorder {
            dir,
            mask: occl_telemetry::EventMask::ALL,
        }));
    }
    if scenario == "nbinit" {
        // Rank 1 starts late; the others poll meanwhile.
        let late = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(300);
        return match lifecycle::init_nonblocking(late) {
            Ok((comm, polls)) => {
                println!("OK rank={} in_progress_polls={polls}", comm.rank());
                match comm.destroy() {
                    Ok(()) => ExitCode::SUCCESS,
                    Err(e) => report(&e),
                }
            }
            Err(f) => failure(f),
        };
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
                    let mut protos: Vec<&str> =
                        occl::CollType::NCCL_COUNTED.iter().map(|&c| comm.protocol(c, 4096)).collect();
                    protos.sort_unstable();
                    protos.dedup();
                    println!(
                        "OK rank={r} checked={} transport={} algos={} protos={}",
                        out.checked,
                        comm.transport_summary(),
                        algos.join(","),
                        protos.join(",")
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
        // All-reduces for `args[1]` ms, then a normal end (the communicator is destroyed, the process exits 0).
        "for_ms" => {
            let ms: u64 = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(1000);
            let buf = vec![1.0f32; 4096];
            let mut out = vec![0f32; 4096];
            println!("READY rank={r} pid={}", std::process::id());
            let t = std::time::Instant::now();
            loop {
                if let Err(e) = comm.all_reduce(&buf, &mut out, RedOp::Sum) {
                    return report(&e);
                }
                // Rank 0's clock decides, so that every rank stops after the same operation.
                let mut done = [f32::from(u8::from(r == 0 && t.elapsed() >= Duration::from_millis(ms)))];
                if let Err(e) = comm.all_reduce_in_place(&mut done, RedOp::Sum) {
                    return report(&e);
                }
                if done[0] > 0.0 {
                    break;
                }
            }
            println!("OK rank={r}");
        }
        // Registered vs unregistered collectives (args[1]: host|vec buffers, args[2]:
        // shared|inactive windows expected).
        "register" => {
            let host = args.get(1).is_none_or(|a| a == "host");
            let shared = args.get(2).is_none_or(|a| a == "shared");
            let helpers = std::env::var("OCCL_REG_THREADS").ok().and_then(|v| v.parse().ok());
            match occl_tests::register::all(&comm, host, shared, helpers) {
                Ok(w) if w.is_empty() => println!("OK rank={r}"),
                Ok(w) => {
                    for l in w {
                        println!("WRONG {l}");
                    }
                    return ExitCode::from(1);
                }
                Err(e) => return report(&e),
            }
        }
        "register-mixed" => match occl_tests::register::mixed(&comm) {
            Ok(()) => println!("RESULT rank={r} (no error)"),
            Err(e) => return report(&e),
        },
        // Registered all-reduces until occl fails (the test kills a peer).
        "register-loop" => {
            if let Err(e) = occl_tests::register::loop_until_error(&comm) {
                return report(&e);
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
        // Five all-reduces, then rank `args[1]` sends a different count in the 6th, so every rank's 6th fails;
        // each prints its error and stays alive (as a training process that catches it may), for RAS to be asked.
        "fail_idle" => {
            let odd = args.get(1).and_then(|s| s.parse::<usize>().ok()).unwrap_or(1);
            let a = vec![1.0f32; 4096];
            let mut b = vec![0f32; 4096];
            for _ in 0..5 {
                if let Err(e) = comm.all_reduce(&a, &mut b, RedOp::Sum) {
                    return report(&e);
                }
            }
            let n = if r == odd { 2048 } else { 4096 };
            match comm.all_reduce(&a[..n], &mut b[..n], RedOp::Sum) {
                Ok(()) => {
                    println!("OK rank={r} (no error)");
                    return ExitCode::from(1);
                }
                Err(e) => {
                    let _ = report(&e);
                }
            }
            println!("READY rank={r} pid={}", std::process::id());
            std::thread::sleep(Duration::from_secs(3600));
        }
        // A broadcast or reduce (`args[1]`) of `args[2]` bytes where rank `args[3]` passes itself
        // as the root and the others pass 0; prints how long the call took on this rank.
        "roots" => {
            let coll = args.get(1).map(String::as_str).unwrap_or("broadcast");
            let bytes: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(256);
            let odd = args.get(3).and_then(|s| s.parse::<usize>().ok()).unwrap_or(1);
            let a = vec![r as f32 + 1.0; bytes / 4];
            let mut b = vec![0f32; bytes / 4];
            // All ranks enter the call together, so its time is the call's own.
            if let Err(e) = comm.all_reduce_in_place(&mut [1f32], RedOp::Sum) {
                return report(&e);
            }
            let root = if r == odd { odd } else { 0 };
            let t0 = std::time::Instant::now();
            let res = match coll {
                "reduce" => comm.reduce(&a, &mut b, RedOp::Sum, root),
                _ => comm.broadcast(&a, &mut b, root),
            };
            println!("TOOK rank={r} ms={:.3}", t0.elapsed().as_secs_f64() * 1e3);
            match res {
                Ok(()) => println!("OK rank={r} (no error) first={:?}", b.first()),
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
        // A known workload for the metrics test (tests/tests/prometheus.rs mirrors it), then idle until killed:
        // 7 all-reduces of 1000 f32 and 2 of 2^18 f32, 3 all-gathers of 256 i32 per rank, 2 broadcasts of 100 f64,
        // and one send of 300 bytes from each even rank to the next.
        "metrics" => {
            let run = || -> occl::Result<()> {
                let (a, mut b) = (vec![1.0f32; 1000], vec![0f32; 1000]);
                for _ in 0..7 {
                    comm.all_reduce(&a, &mut b, RedOp::Sum)?;
                }
                let (a, mut b) = (vec![1.0f32; 1 << 18], vec![0f32; 1 << 18]);
                for _ in 0..2 {
                    comm.all_reduce(&a, &mut b, RedOp::Sum)?;
                }
                let (a, mut b) = (vec![r as i32; 256], vec![0i32; 256 * comm.nranks()]);
                for _ in 0..3 {
                    comm.all_gather(&a, &mut b)?;
                }
                let mut c = vec![0f64; 100];
                for _ in 0..2 {
                    comm.broadcast_in_place(&mut c, 0)?;
                }
                let mut p = vec![7u8; 300];
                if r % 2 == 0 && r + 1 < comm.nranks() {
                    comm.send(&p, r + 1)?;
                } else if r % 2 == 1 {
                    comm.recv(&mut p, r - 1)?;
                }
                Ok(())
            };
            if let Err(e) = run() {
                return report(&e);
            }
            // `metrics then-exit`: the communicator is destroyed and the process ends (tests/tests/otlp_metrics.rs).
            if args.get(1).map(String::as_str) == Some("then-exit") {
                println!("OK rank={r} metrics");
            } else {
                println!("READY rank={r} pid={}", std::process::id());
                std::thread::sleep(Duration::from_secs(3600));
            }
        }
        // Rank 1 enters its collectives `args[1]` ms late (default 200), twice: an all-reduce of 2 f32 and an
        // all-gather of 1000 f32 per rank, then a group of a send and a receive between ranks 0 and 1. The others
        // wait for it in both (tests/tests/prometheus.rs reads their step waits); then idle until killed.
        "metrics-late" => {
            let late = Duration::from_millis(args.get(1).and_then(|s| s.parse().ok()).unwrap_or(200));
            let run = || -> occl::Result<()> {
                if r == 1 {
                    std::thread::sleep(late);
                }
                let (a, mut b) = (vec![1.0f32; 2], vec![0f32; 2]);
                comm.all_reduce(&a, &mut b, RedOp::Sum)?;
                let (a, mut b) = (vec![1.0f32; 1000], vec![0f32; 1000 * comm.nranks()]);
                comm.all_gather(&a, &mut b)?;
                if r < 2 {
                    if r == 1 {
                        std::thread::sleep(late);
                    }
                    let (p, mut q) = (vec![7u8; 3000], vec![0u8; 3000]);
                    occl::group(|g| {
                        g.send(&comm, &p, 1 - r)?;
                        g.recv(&comm, &mut q, 1 - r)
                    })?;
                }
                Ok(())
            };
            if let Err(e) = run() {
                return report(&e);
            }
            println!("READY rank={r} pid={}", std::process::id());
            std::thread::sleep(Duration::from_secs(3600));
        }
        // A live job for the dashboards test (tests/tests/dashboards.rs): rounds of collectives at a few sizes and a
        // send/recv ring, 20 a second, until killed. While the file `$OCCL_TEST_PAUSE_DIR/pause-<rank>` exists the
        // rank stops calling collectives (a hung job: its RAS still answers). After an error (a peer was killed) it
        // stays alive, idle, so that the node's RAS port still answers scrapes.
        "dashboards" => {
            let pause =
                std::env::var_os("OCCL_TEST_PAUSE_DIR").map(|d| std::path::Path::new(&d).join(format!("pause-{r}")));
            let mut first = true;
            loop {
                while pause.as_ref().is_some_and(|p| p.exists()) {
                    std::thread::sleep(Duration::from_millis(20));
                }
                if let Err(e) = dashboards_round(&comm) {
                    let code = report(&e);
                    use std::io::Write;
                    let _ = std::io::stdout().flush();
                    std::thread::sleep(Duration::from_secs(3600));
                    return code;
                }
                if first {
                    println!("READY rank={r} pid={}", std::process::id());
                    first = false;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        // Every collective and p2p at a few sizes, with a recording profiler (see "events" above).
        "events" => {
            if let Err(e) = occl_tests::events::every_operation(&comm) {
                return report(&e);
            }
            println!("OK rank={r} events transport={}", comm.transport_summary());
        }
        // Grouped send/recv, all-to-all(v), gather, scatter (see occl_tests::lifecycle::groups).
        "groups" => match lifecycle::groups(&comm) {
            Ok(n) => println!("OK rank={r} checked={n} transport={}", comm.transport_summary()),
            Err(f) => return failure(f),
        },
        // Split by parity (args[1] = "nocolor": the last rank takes no color) and run the
        // child and the parent at once.
        "split" => match lifecycle::split(&comm, args.get(1).is_some_and(|a| a == "nocolor")) {
            Ok(Some((cr, cn))) => println!("OK rank={r} child={cr}/{cn}"),
            Ok(None) => println!("OK rank={r} child=none"),
            Err(f) => return failure(f),
        },
        // Rank args[1] passes color args[2] (an invalid one), the others their parity.
        "split-bad" => {
            let odd = args.get(1).and_then(|s| s.parse::<usize>().ok()).unwrap_or(1);
            let bad = args.get(2).and_then(|s| s.parse::<i32>().ok()).unwrap_or(-7);
            let color = if r == odd { bad } else { (r % 2) as i32 };
            match comm.split(color, 0) {
                Ok(_) => println!("OK rank={r} (no error)"),
                Err(e) => return report(&e),
            }
        }
        // Rank args[1] stops calling; ranks args[2] ("all" or a list a,b) abort from a watchdog.
        "abort" => {
            let hang = args.get(1).and_then(|s| s.parse::<usize>().ok()).unwrap_or(comm.nranks() - 1);
            let who: Vec<usize> = match args.get(2).map(String::as_str) {
                Some("all") | None => (0..comm.nranks()).collect(),
                Some(list) => list.split(',').filter_map(|x| x.parse().ok()).collect(),
            };
            match lifecycle::abort(&comm, hang, &who) {
                Ok(()) => println!("OK rank={r} (stayed out)"),
                Err(f) => return failure(f),
            }
        }
        // Rank args[1] is killed by the test; the others shrink (args[2]: default|abort).
        "shrink" => {
            let dead = args.get(1).and_then(|s| s.parse::<usize>().ok()).unwrap_or(1);
            let mode = if args.get(2).is_some_and(|m| m == "abort") { ShrinkMode::Abort } else { ShrinkMode::Default };
            match lifecycle::shrink(&comm, dead, mode) {
                Ok((nr, nn, v)) => println!("OK rank={r} new={nr}/{nn} sum={v}"),
                Err(f) => return failure(f),
            }
        }
        // Rank args[1] is stopped by the test; the others shrink from a watchdog once the file
        // args[2] exists.
        "shrink-hung" => {
            let stopped = args.get(1).and_then(|s| s.parse::<usize>().ok()).unwrap_or(1);
            let go = std::path::PathBuf::from(args.get(2).map(String::as_str).unwrap_or("go"));
            match lifecycle::shrink_hung(&comm, stopped, &go) {
                Ok((nr, nn, v)) => println!("OK rank={r} new={nr}/{nn} sum={v}"),
                Err(f) => return failure(f),
            }
        }
        // A known sequence of operations for the OTLP exporter tests; each prints what it did.
        "otlp" => {
            if let Err(e) = occl_tests::otlp_ops::run(&comm) {
                return report(&e);
            }
            println!("OK rank={r} otlp");
        }
        // Rank 0 sends rank 1 a small and a large message and broadcasts, then leaves at once
        // without destroying its communicator (`args[1]`: "exit" calls exit(0), "return" leaks the
        // communicator and returns from main); rank 1 checks every byte. With `args[2]` > 0, rank 1
        // first sends rank 0 that many bytes that rank 0 never receives (unread at its exit), then
        // creates the file `args[3]`, which rank 0 waits for before it leaves: its own sends may
        // all fit in the sockets' buffers, and a rank 1 started late would otherwise send to a
        // rank that had already gone (an error, rightly, and not the case under test).
        // Rank 1 starts each receive late, so rank 0 is gone with data still on the way.
        "exit-after-send" if comm.nranks() == 2 => {
            let how = args.get(1).map(String::as_str).unwrap_or("exit");
            let unread = args.get(2).and_then(|s| s.parse::<usize>().ok()).unwrap_or(0);
            let sent_mark = args.get(3).map(std::path::PathBuf::from);
            let pattern = |tag: u32, n: usize| -> Vec<u32> {
                (0..n as u32).map(|i| i.wrapping_mul(2_654_435_761).rotate_left(tag) ^ tag).collect()
            };
            let (small, big, bcast) = (pattern(1, 1000), pattern(2, 6 << 18), pattern(3, 1 << 16));
            if r == 0 {
                let run = || -> occl::Result<()> {
                    comm.send(&small, 1)?;
                    comm.send(&big, 1)?;
                    // Not after data left unread: rank 1's send comes first on their ordered
                    // channel, and the broadcast's root check would read it as a mismatch.
                    if unread > 0 {
                        if let Some(mark) = &sent_mark {
                            let t = std::time::Instant::now();
                            while !mark.exists() && t.elapsed() < Duration::from_secs(30) {
                                std::thread::sleep(Duration::from_millis(5));
                            }
                        }
                        return Ok(());
                    }
                    comm.broadcast_in_place(&mut bcast.clone(), 0)
                };
                if let Err(e) = run() {
                    return report(&e);
                }
                println!("OK rank=0 sent, leaving by {how}");
                use std::io::Write;
                let _ = std::io::stdout().flush();
                if how == "exit" {
                    std::process::exit(0);
                }
                std::mem::forget(comm);
                return ExitCode::SUCCESS;
            }
            let run = || -> occl::Result<Vec<String>> {
                if unread > 0 {
                    comm.send(&vec![7u8; unread], 0)?;
                    if let Some(mark) = &sent_mark {
                        if let Err(e) = std::fs::write(mark, b"sent") {
                            eprintln!("cannot create {}: {e}", mark.display());
                        }
                    }
                }
                let mut wrong = Vec::new();
                let mut check = |what: &str, got: &[u32], want: &[u32]| {
                    if let Some(i) = got.iter().zip(want).position(|(g, w)| g != w) {
                        wrong.push(format!("{what}: element {i} of {} differs", want.len()));
                    }
                };
                let late = || std::thread::sleep(Duration::from_millis(200));
                late();
                let mut got = vec![0u32; small.len()];
                comm.recv(&mut got, 0)?;
                check("small send", &got, &small);
                late();
                let mut got = vec![0u32; big.len()];
                comm.recv(&mut got, 0)?;
                check("large send", &got, &big);
                if unread == 0 {
                    late();
                    let mut got = vec![0u32; bcast.len()];
                    comm.broadcast_in_place(&mut got, 0)?;
                    check("broadcast", &got, &bcast);
                }
                Ok(wrong)
            };
            match run() {
                Ok(wrong) if wrong.is_empty() => println!("OK rank=1 received every byte"),
                Ok(wrong) => {
                    for w in wrong {
                        println!("WRONG {w}");
                    }
                    return ExitCode::from(1);
                }
                Err(e) => return report(&e),
            }
        }
        // `args[1]` training steps (ProfilerStep#1…) of collectives and a send/recv ring, for the
        // trace files (OCCL_TRACE_DIR); rank `args[2]` sleeps `args[3]` ms at the start of each
        // step, before its big all-reduce (a straggler on purpose).
        "trace" => {
            let num = |i: usize, d: u64| args.get(i).and_then(|s| s.parse::<u64>().ok()).unwrap_or(d);
            let (steps, slow, slow_ms) = (num(1, 5), num(2, u64::MAX), num(3, 0));
            match trace_steps(&comm, steps, r as u64 == slow, Duration::from_millis(slow_ms)) {
                Ok(per_step) => {
                    println!("OK rank={r} trace steps={steps} per_step={per_step} collectives={}", per_step * steps)
                }
                Err(e) => return report(&e),
            }
            // `args[4]` = "exit": leave without destroying the communicator (the trace is written
            // at process exit).
            if args.get(4).is_some_and(|a| a == "exit") {
                use std::io::Write;
                let _ = std::io::stdout().flush();
                std::process::exit(0);
            }
        }
        _ => {
            eprintln!("unknown scenario {scenario:?}; expected matrix, loop, mismatch, roots, late, idle, hang, subcomm, metrics, dashboards, events, otlp, trace, exit-after-send (2 ranks), groups, split, split-bad, abort, shrink, shrink-hung or nbinit");
            return ExitCode::from(2);
        }
    }
    match comm.destroy() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => report(&e),
    }
}
