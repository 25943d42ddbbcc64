//! `occl-perf`: occl's collective benchmark, in the manner of nccl-tests.
//!
//! ```text
//! occl-perf all_reduce -b 8 -e 64M -f 2 --ranks 2          # start 2 local ranks
//! OCCL_TRANSPORT=tcp occl-perf all_gather -b 1M -e 64M -f 4 --ranks 2 --json
//! torchrun --nproc-per-node 2 occl-perf reduce_scatter ...  # join a launcher's job
//! ```
//!
//! With `--ranks N` the process is a launcher: it starts N copies of itself (same arguments,
//! minus `--ranks`), relays rank 0's output and fails if any rank fails. Without it the process
//! is one rank and joins the job its launcher describes (`occl::Comm::from_env`).
//!
//! For every size: a checked run (inputs filled with `occl_tests::pattern`, outputs compared,
//! wrong elements summed over ranks), then `-w` warm-up calls, a barrier, and `-n` calls timed
//! as one batch; time per call = batch time / n, combined over ranks as `-a` says (default 3:
//! the slowest rank, as a job waits for its slowest rank). Out-of-place, then in-place.
//! algbw = bytes / time (GB/s = 1e9 B/s), busbw = algbw × nccl-tests' factor.

use anyhow::Context;
use clap::Parser;
use occl::{Comm, DataType, RedOp};
use occl_tests::launch::{Job, Spawn};
use occl_tests::perf::bench::{Average, Bench};
use occl_tests::perf::events_ab::{AbSink, Plan};
use occl_tests::perf::{self, Collective, Measure, RowInfo};
use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

#[derive(Debug, Parser)]
#[command(
    name = "occl-perf",
    version,
    about = "occl collective benchmark with nccl-tests' flags and columns",
    after_help = "Sizes take K/M/G suffixes (binary). For all_gather, reduce_scatter and alltoall the size is the \
                  total buffer (nranks blocks); for sendrecv it is what each rank sends to the next.\n\
                  Without --ranks the process joins a job from the launcher's environment (OCCL_RANK/OCCL_NRANKS/\
                  OCCL_UNIQUE_ID, torchrun, Open MPI, Slurm)."
)]
struct Args {
    /// The operation to measure.
    #[arg(value_enum)]
    collective: Collective,
    /// Smallest size in bytes.
    #[arg(short = 'b', long = "minbytes", value_parser = perf::parse_size, default_value = "32M")]
    min_bytes: usize,
    /// Largest size in bytes.
    #[arg(short = 'e', long = "maxbytes", value_parser = perf::parse_size, default_value = "32M")]
    max_bytes: usize,
    /// Size increment when the step factor is 1.
    #[arg(short = 'i', long = "stepbytes", value_parser = perf::parse_size, default_value = "1M")]
    step_bytes: usize,
    /// Size multiplier between rows (above 1: geometric sweep; 1: add --stepbytes).
    #[arg(short = 'f', long = "stepfactor", default_value_t = 1)]
    step_factor: u64,
    /// Timed iterations per size.
    #[arg(short = 'n', long = "iters", default_value_t = 20, value_parser = clap::value_parser!(u64).range(1..))]
    iters: u64,
    /// Untimed warm-up iterations per size.
    #[arg(short = 'w', long = "warmup_iters", default_value_t = 5)]
    warmup: u64,
    /// Check results (1) or not (0).
    #[arg(short = 'c', long = "check", default_value_t = 1)]
    check: u32,
    /// Datatype (nccl-tests' names: float, half, bfloat16, double, int8, uint8, int32, ... or f32, bf16, ...).
    #[arg(short = 'd', long = "datatype", default_value = "float")]
    dtype: DataType,
    /// Reduction (sum, prod, max, min, avg); ignored by collectives that do not reduce.
    #[arg(short = 'o', long = "op", default_value = "sum")]
    op: RedOp,
    /// Root rank of broadcast and reduce.
    #[arg(short = 'r', long = "root", default_value_t = 0)]
    root: usize,
    /// Time reported: 0 rank 0's, 1 mean over ranks, 2 min, 3 max (the default here).
    #[arg(short = 'a', long = "average", default_value_t = 3, value_parser = clap::value_parser!(u8).range(0..=3))]
    average: u8,
    /// Devices per process (nccl-tests' -g): occl-perf runs one rank per process, so only 1.
    #[arg(short = 'g', long = "ngpus", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=1))]
    ngpus: u32,
    /// Start N local ranks (processes) and relay rank 0's output.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=1024))]
    ranks: Option<u64>,
    /// One JSON object per (size, in-place) line instead of the table.
    #[arg(long)]
    json: bool,
    /// Instead of the table: the cost of profiler events, R rounds alternating no sink and a
    /// counting sink that wants every event (out-of-place only).
    #[arg(long, value_name = "ROUNDS", value_parser = clap::value_parser!(u64).range(1..=1000))]
    events_ab: Option<u64>,
    /// What --events-ab attaches in its "on" batches: counter (every event, counted), collector
    /// (the span collector, spans dropped), prometheus, split (prometheus's A/A check, with
    /// OCCL_METRICS=0), otlp, otlp:FRACTION (ProxyStep sampling) or trace (that exporter behind
    /// the collector).
    #[arg(long, value_name = "SINK", default_value = "counter", requires = "events_ab")]
    events_sink: AbSink,
    /// Time B batches of -n calls (each after a barrier, combined over ranks as -a says) and
    /// report the median batch: on a shared machine one preemption then spoils one batch, not the
    /// figure (Open MPI's anchor, mpi_coll.c, measures the same way).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=10000))]
    batches: u64,
    /// Pin rank r to the r-th CPU this process may use, when there are at least as many CPUs as
    /// ranks (what Open MPI's mpirun does by default for 2 ranks): on a machine busy with other
    /// work the scheduler may otherwise stack both ranks on one core.
    #[arg(long)]
    bind: bool,
    /// With `--bind`: CPUs per rank (rank r gets the r-th run of that many, fewer where the mask
    /// is too small for every rank to get as many). More than one leaves room for the rank's
    /// registered-collective helper threads (`OCCL_REG_THREADS`).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=1024))]
    cpus_per_rank: u64,
    /// Allocate the buffers as `occl::HostBuf` and register them (`Comm::register`): all-reduce,
    /// all-gather and reduce-scatter on one host read the peers' buffers in place.
    #[arg(long)]
    registered: bool,
    /// Instead of the table: JSON rows for each of these choices, comma-separated (`-` the
    /// tuner's, `ring`, `tree/ll`, …), each on a communicator split off with that algorithm (and
    /// protocol) forced for this collective, batches interleaved over the choices, out of place.
    /// Each row's `forced` names its choice.
    #[arg(long, value_name = "LIST", value_delimiter = ',', allow_hyphen_values = true, conflicts_with_all = ["registered", "events_ab"])]
    compare: Vec<perf::compare::Choice>,
}

fn main() -> ExitCode {
    let args = Args::parse();
    occl_tests::logging::init();
    let res = match args.ranks {
        Some(n) => check_args(&args, Some(n as usize)).and_then(|()| launch(n as usize)),
        None => run_rank(&args),
    };
    match res {
        Ok(code) => code,
        Err(e) => {
            eprintln!("occl-perf: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Checks what can be checked before any rank starts (`nranks` when known), so that a bad
/// size range or root is reported once, by the launcher.
fn check_args(args: &Args, nranks: Option<usize>) -> anyhow::Result<()> {
    perf::sweep(args.min_bytes, args.max_bytes, args.step_factor, args.step_bytes).map_err(anyhow::Error::msg)?;
    if let Some(n) = nranks {
        if args.collective.rooted() && args.root >= n {
            anyhow::bail!("root {} is out of range for {n} ranks (-r takes 0..{})", args.root, n - 1);
        }
    }
    Ok(())
}

/// The launcher: N copies of this program with the same arguments minus `--ranks`.
fn launch(nranks: usize) -> anyhow::Result<ExitCode> {
    let mut child_args = Vec::new();
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        if a == "--ranks" {
            it.next();
        } else if !a.starts_with("--ranks=") {
            child_args.push(a);
        }
    }
    let exe = std::env::current_exe().context("find this program's path to start the ranks")?;
    // The ranks inherit stdout and stderr: only rank 0 prints to stdout, so its lines are
    // relayed as they come, and every rank's errors reach stderr.
    let job = Job::spawn(&exe, &child_args, nranks, &Spawn::default())?;
    // Every wait in occl is bounded by OCCL_TIMEOUT, so a rank that hangs fails by itself; this
    // limit is only a last resort.
    let outs = job.wait(Duration::from_secs(7 * 24 * 3600))?;
    let failed: Vec<_> = outs.iter().filter(|o| !o.status.success()).collect();
    for o in &failed {
        eprintln!("occl-perf: rank {} failed ({})", o.rank, o.status);
    }
    Ok(if failed.is_empty() { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

/// Every rank's (pid, hostname), from the communicator's peer table, for the header.
fn gather_ranks(comm: &Comm) -> occl::Result<Vec<(u32, String)>> {
    Ok((0..comm.nranks()).filter_map(|r| comm.peer_process(r)).map(|(pid, host)| (pid, host.to_string())).collect())
}

/// Pins this process to the `rank`-th run of `per` CPUs of its affinity mask (fewer per rank
/// where the mask has fewer than `nranks * per`), if it has at least `nranks` CPUs.
fn bind_to_share(rank: usize, nranks: usize, per: usize) -> anyhow::Result<()> {
    // SAFETY: cpu_set_t is plain data; sched_getaffinity/setaffinity fill and read it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            anyhow::bail!("sched_getaffinity: {}", std::io::Error::last_os_error());
        }
        let cpus: Vec<usize> = (0..libc::CPU_SETSIZE as usize).filter(|&c| libc::CPU_ISSET(c, &set)).collect();
        if cpus.len() < nranks {
            return Ok(()); // more ranks than CPUs: binding would only stack them
        }
        let k = (cpus.len() / nranks).min(per).max(1);
        let share = &cpus[rank * k..(rank + 1) * k];
        let mut mine: libc::cpu_set_t = std::mem::zeroed();
        for &c in share {
            libc::CPU_SET(c, &mut mine);
        }
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mine) != 0 {
            anyhow::bail!("sched_setaffinity to CPUs {share:?}: {}", std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// One rank of the benchmark.
fn run_rank(args: &Args) -> anyhow::Result<ExitCode> {
    check_args(args, None)?;
    let comm = Comm::from_env()?;
    let (n, rank) = (comm.nranks(), comm.rank());
    if args.bind {
        bind_to_share(rank, n, usize::try_from(args.cpus_per_rank).unwrap_or(1))?;
    }
    let lead = rank == 0;
    let coll = args.collective;
    if coll == Collective::SendRecv && n < 2 {
        if lead {
            println!("# occl-perf: sendrecv needs at least 2 ranks (rank r sends to r+1); skipped with 1 rank");
        }
        comm.destroy()?;
        return Ok(ExitCode::SUCCESS);
    }
    check_args(args, Some(n))?;
    let sizes =
        perf::sweep(args.min_bytes, args.max_bytes, args.step_factor, args.step_bytes).map_err(anyhow::Error::msg)?;
    // Rows as run: whole elements (and blocks), no empty or repeated sizes.
    let mut layouts = Vec::new();
    for s in sizes {
        let l = coll.layout(s, args.dtype, n);
        if l.count > 0 && layouts.last() != Some(&l) {
            layouts.push(l);
        }
    }
    let ranks = gather_ranks(&comm)?;
    let info = RowInfo {
        coll,
        nranks: n,
        dtype: args.dtype,
        op: args.op,
        root: args.root,
        transport: comm.transport_summary(),
    };
    let average = Average::from_flag(args.average);
    let check = args.check != 0;
    let (warmup, iters) = (args.warmup as usize, args.iters as usize);
    let _ = args.ngpus; // only 1 is accepted: one rank per process

    let out = std::io::stdout();
    let mut out = out.lock();
    // --compare prints JSON rows only.
    if lead && !args.json && args.compare.is_empty() {
        let per_rank = |l: &perf::Layout| l.count * args.dtype.size();
        let mut algos: Vec<&str> = layouts.iter().map(|l| comm.algorithm(coll.coll_type(), per_rank(l))).collect();
        algos.dedup();
        let mut protos: Vec<&str> = layouts.iter().map(|l| comm.protocol(coll.coll_type(), per_rank(l))).collect();
        protos.dedup();
        writeln!(
            out,
            "# occl-perf: nranks {n}, transport {}, algo {}, proto {}",
            info.transport,
            algos.join("/"),
            protos.join("/")
        )?;
        writeln!(
            out,
            "# collective {}  minBytes {} maxBytes {} step: {} warmup iters: {warmup} iters: {iters} validation: {} time: {}",
            coll.json_name(),
            args.min_bytes,
            args.max_bytes,
            if args.step_factor > 1 { format!("{}(factor)", args.step_factor) } else { format!("{}(bytes)", args.step_bytes) },
            u32::from(check),
            average.describe()
        )?;
        writeln!(out, "#\n# Using ranks")?;
        for (r, (pid, host)) in ranks.iter().enumerate() {
            writeln!(out, "#  Rank {r:>2} Pid {pid:>6} on {host}")?;
        }
        writeln!(out, "#")?;
        writeln!(out, "{}", perf::table_header("out-of-place", "in-place"))?;
        if coll == Collective::SendRecv {
            writeln!(
                out,
                "# sendrecv: blocking send/recv run as a closing chain (rank 0 sends then receives, others receive \
                 then send); no in-place form"
            )?;
        }
        out.flush()?;
    }
    if layouts.is_empty() {
        if lead {
            eprintln!(
                "occl-perf: no size in {}..{} holds a whole element per rank; nothing to run",
                args.min_bytes, args.max_bytes
            );
        }
        comm.destroy()?;
        return Ok(ExitCode::SUCCESS);
    }

    let max_bytes = layouts.iter().map(|l| l.bytes).max().unwrap_or(0);
    if !args.compare.is_empty() {
        let plan = perf::compare::Plan { batches: args.batches as usize, warmup, iters, check, average };
        let sweep = perf::compare::Sweep { layouts: &layouts, choices: &args.compare, plan, info: &info };
        let wrong = perf::compare::run(&comm, max_bytes, &sweep, &mut out)?;
        comm.destroy()?;
        if wrong > 0 {
            if lead {
                eprintln!("occl-perf: {wrong} wrong element(s) in total; see the wrong fields");
            }
            return Ok(ExitCode::FAILURE);
        }
        return Ok(ExitCode::SUCCESS);
    }
    let mut bench = Bench::new(&comm, coll, args.dtype, args.op, args.root, max_bytes);
    let mut reg_shared = false;
    if args.registered {
        let shared = bench.register()?;
        reg_shared =
            shared && matches!(coll, Collective::AllReduce | Collective::AllGather | Collective::ReduceScatter);
        if lead && !args.json {
            writeln!(
                out,
                "# registered buffers: windows {}",
                if shared { "shared" } else { "inactive (normal path)" }
            )?;
        }
    }
    if let Some(rounds) = args.events_ab {
        let plan = Plan { rounds: rounds as usize, warmup, iters, sink: args.events_sink };
        perf::events_ab::run(&comm, &mut bench, &layouts, plan, &mut out)?;
        drop(bench);
        comm.destroy()?;
        return Ok(ExitCode::SUCCESS);
    }
    let (mut total_wrong, mut bw_sum, mut bw_rows) = (0u64, 0f64, 0usize);
    for &layout in &layouts {
        let mut halves: [Option<Measure>; 2] = [None, None];
        for (h, inplace) in [false, true].into_iter().enumerate() {
            if inplace && !bench.has_in_place() {
                continue;
            }
            let wrong = if check {
                let mine = bench.check(layout, inplace)?;
                let all = bench.sum(mine)?;
                total_wrong += all;
                Some(all)
            } else {
                None
            };
            let mut times = Vec::with_capacity(args.batches as usize);
            for b in 0..args.batches {
                let secs = bench.time(layout, inplace, if b == 0 { warmup } else { 0 }, iters)?;
                times.push(bench.combine(secs, average)?);
            }
            times.sort_by(f64::total_cmp);
            let secs = times[times.len() / 2];
            let m = Measure::new(coll, layout.bytes, n, secs * 1e6, wrong);
            bw_sum += m.busbw;
            bw_rows += 1;
            if lead && args.json {
                let bytes = layout.count * args.dtype.size();
                let reg_path =
                    matches!(coll, Collective::AllReduce | Collective::AllGather | Collective::ReduceScatter);
                let algo = if reg_shared && reg_path { "registered" } else { comm.algorithm(coll.coll_type(), bytes) };
                let chosen = (algo, comm.protocol(coll.coll_type(), bytes));
                writeln!(out, "{}", perf::json_row(&info, layout, inplace, &m, chosen))?;
                out.flush()?;
            }
            halves[h] = Some(m);
        }
        if lead && !args.json {
            writeln!(out, "{}", perf::table_row(&info, layout, halves[0].as_ref(), halves[1].as_ref()))?;
            out.flush()?;
        }
    }
    if lead && !args.json {
        if check {
            writeln!(out, "# Out of bounds values : {total_wrong} {}", if total_wrong == 0 { "OK" } else { "FAILED" })?;
        } else {
            writeln!(out, "# Out of bounds values : N/A (-c 0)")?;
        }
        writeln!(out, "# Avg bus bandwidth    : {:.4}", if bw_rows > 0 { bw_sum / bw_rows as f64 } else { 0.0 })?;
        writeln!(out, "#")?;
        out.flush()?;
    }
    drop(bench);
    comm.destroy()?;
    if total_wrong > 0 {
        if lead {
            eprintln!("occl-perf: {total_wrong} wrong element(s) in total; see the #wrong column");
        }
        return Ok(ExitCode::FAILURE);
    }
    Ok(ExitCode::SUCCESS)
}
