//! `occl-gpu`: occl's device collectives on the GPU machine, one process per GPU.
//!
//! ```text
//! occl-gpu check --ranks 2                       # every collective x type x op x algorithm
//! occl-gpu check --ranks 2 --hosts 2 --big 64M    # each rank "on its own host": staged through host memory
//! occl-gpu check --threads 2                      # one process, CudaComm::init_all over the GPUs
//! occl-gpu check --ranks 4 --windows [--big 1G]   # all-gather, all-to-all, broadcast into symmetric windows
//! NCCL_CTA_POLICY=2 occl-gpu check --ranks 4 --windows   # the same on the copy engines' direct route
//! occl-gpu bench --ranks 2 --json [--graph] -d bfloat16 --sizes 8,64K,1G all_reduce,all_gather
//! occl-gpu bench --ranks 4 --sizes 64M,1G --phases all_gather,all_reduce   # + where the kernels' time goes
//! occl-gpu bench --ranks 4 --windows --phases all_gather,all_to_all   # outputs in symmetric windows
//! occl-gpu bench --ranks 2 --sizes 64M,1G sendrecv,grouped_all_to_all   # grouped sends and receives
//! occl-gpu events --ranks 2 [--iters 2000]       # KernelCh events from device timestamps
//! occl-gpu prebuild DIR [--arch sm_90] [--lanes 2,4] [--phases] [--jobs N]   # no GPU: NVRTC only
//! NCCL_CTA_POLICY=2 OCCL_TIMEOUT=5 occl-gpu stall --ranks 2   # a rank stops calling: rank 0 times out
//! ```
//!
//! Ranks go round-robin over the GPUs there are (two ranks may share one). `--hosts K` gives
//! rank r the host id `gpu-host-{r % K}` (`OCCL_HOSTID`), so ranks of different ids talk over
//! tcp and their device calls are staged through pinned host memory; the check then also
//! asserts that they are.
//!
//! `check` compares against a host reference: sizes 0, 1, odd, across the FIFO's chunks and
//! 1 GiB, in and out of place, and replayed from a captured CUDA graph; grouped sends and
//! receives (a ring exchange and an all-to-all, but staged); and pre-multiply sums with an
//! immediate scalar and with a device one changed between replays of a graph.
//! `check --windows` (one process per rank, `--ranks` only) checks instead all-gather, all-to-all
//! and broadcast whose outputs lie in symmetric windows, so that they take the windowed paths
//! (`occl_tests::gpu_windows`): offsets, inputs inside and outside, in place, every root, back
//! to back with no host sync, and graphs replayed with refilled inputs. `bench` prints one JSON
//! line per (collective, size) with the keys of `nccl_bench.py` (time per call from CUDA events
//! over `iters` calls, or over one replay of a graph of `iters` captured calls, after one untimed
//! lead call that lines the ranks up; the slowest rank).
//! All-reduce and broadcast run in place there, as `nccl_bench.py`'s PyTorch calls do. `sendrecv`
//! and `grouped_all_to_all` are groups of device sends and receives (`CudaComm::p2p_group_raw`,
//! what `ncclGroupStart`..`ncclGroupEnd` around `ncclSend`/`ncclRecv` runs), as nccl-tests'
//! sendrecv_perf and alltoall_perf call them: to rank r+1 and from r-1, and to and from every
//! other rank; their `channels` and `sms` are the group's channels and thread blocks.
//!
//! `bench --phases` (it sets `OCCL_KERNEL_PHASES=1`) then makes one more call of each (collective,
//! size) with the kernels' phase profile (`occl_kernels::phases`) and prints, from every rank, a
//! line with `"phases"`: per phase the ns summed over the rank's channels, per channel, and as a
//! share of the channels' time, and the skew of the channels' starts and ends.
//!
//! `bench --windows` puts each call's output in a region of its own that every rank maps and
//! registers as a symmetric window (as occl-nccl does for `ncclCommWindowRegister(..,
//! NCCL_WIN_COLL_SYMMETRIC)`), so all-gather, all-to-all and broadcast write the peers' outputs
//! directly: from the kernels' windowed mode, or on the copy engines under `NCCL_CTA_POLICY=2`.
//! One process per rank (`--ranks`): the peers' outputs are mapped through CUDA IPC.
//!
//! `prebuild` compiles every kernel program a communicator may build (`occl_kernels::prebuild`)
//! for one architecture into DIR, a kernel cache to copy into a GPU machine's
//! `OCCL_KERNEL_CACHE_DIR`, so that its first calls compile nothing. It needs NVRTC, not a GPU.

use anyhow::{bail, Context};
use occl::cuda::kernels::cudarc::driver::{sys, CudaSlice, CudaStream, DevicePtr};
use occl::cuda::kernels::phases::{ChannelRecord, Phase, Summary};
use occl::cuda::{CudaComm, DevAlgo, DevOp, P2p, PreMul};
use occl::{Comm, DataType, RedOp};
use occl_tests::gpu_windows::WindowedOut;
use occl_tests::launch::{Job, Spawn};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

fn main() -> ExitCode {
    let _ = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_env("OCCL_LOG").unwrap_or_else(|_| "warn".into()))
        .try_init();
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--phases") {
        // Read when the communicator is created: the profiled kernels are built then.
        std::env::set_var(occl::cuda::KERNEL_PHASES_VAR, "1");
    }
    if args.first().map(String::as_str) == Some("prebuild") {
        return match prebuild(&args) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("occl-gpu prebuild: {e:#}");
                ExitCode::FAILURE
            }
        };
    }
    let windowed_check = args.first().is_some_and(|a| a == "check") && args.iter().any(|a| a == "--windows");
    if windowed_check && args.iter().any(|a| a == "--threads" || a == "--hosts") {
        eprintln!(
            "occl-gpu: check --windows needs one process per rank on one host (--ranks N): the \
             peers' windows are mapped through CUDA IPC, and staged calls have none"
        );
        return ExitCode::FAILURE;
    }
    let res = match args.iter().position(|a| a == "--ranks") {
        Some(i) => launch(&args, i),
        None => run(&args),
    };
    match res {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("occl-gpu: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn launch(args: &[String], i: usize) -> anyhow::Result<()> {
    let n: usize = args.get(i + 1).context("--ranks N")?.parse().context("--ranks N")?;
    let mut child: Vec<String> = args.to_vec();
    child.drain(i..i + 2);
    let exe = std::env::current_exe()?;
    let outs = Job::spawn(&exe, &child, n, &Spawn::default())?.wait(Duration::from_secs(3600))?;
    if let Some(o) = outs.iter().find(|o| !o.status.success()) {
        bail!("rank {} failed ({})", o.rank, o.status);
    }
    Ok(())
}

/// `prebuild DIR`: every program for `--arch` (sm_90), lane widths of `--lanes` (2) and, with
/// `--phases`, the profiled builds, compiled `--jobs` at a time into the cache DIR.
fn prebuild(args: &[String]) -> anyhow::Result<()> {
    use occl::cuda::kernels::{cache::Cache, prebuild};
    let dir = args.get(1).filter(|d| !d.starts_with("--")).context("prebuild DIR")?;
    let arch = flag(args, "--arch").unwrap_or("sm_90");
    let lanes = flag(args, "--lanes")
        .unwrap_or("2")
        .split(',')
        .map(|l| match l.trim().parse::<u32>() {
            Ok(n @ (1 | 2 | 4)) => Ok(n),
            _ => bail!("--lanes {l:?}: 1, 2 or 4 channels per block, comma-separated"),
        })
        .collect::<anyhow::Result<Vec<u32>>>()?;
    let jobs = match flag(args, "--jobs") {
        Some(j) => j.parse().context("--jobs N")?,
        None => std::thread::available_parallelism().map_or(1, |n| n.get()),
    };
    let progs = prebuild::all_programs(&lanes, args.iter().any(|a| a == "--phases"));
    let t = Instant::now();
    let built = prebuild::prebuild(&Cache::new(dir), arch, &progs, jobs)?;
    let compiled = built.iter().filter(|b| b.compile_time.is_some()).count();
    println!(
        "occl-gpu prebuild: {} programs for {arch} in {dir} ({compiled} compiled, {} there already) in {:.1} s",
        built.len(),
        built.len() - compiled,
        t.elapsed().as_secs_f64()
    );
    Ok(())
}

fn flag<'a>(args: &'a [String], name: &str) -> Option<&'a str> {
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).map(String::as_str)
}

fn parse_size(t: &str) -> anyhow::Result<usize> {
    let t = t.trim().to_ascii_uppercase();
    let (n, m) = match t.chars().last() {
        Some('K') => (&t[..t.len() - 1], 1 << 10),
        Some('M') => (&t[..t.len() - 1], 1 << 20),
        Some('G') => (&t[..t.len() - 1], 1 << 30),
        _ => (&t[..], 1),
    };
    Ok(n.parse::<usize>().with_context(|| format!("size {t}"))? * m)
}

fn run(args: &[String]) -> anyhow::Result<()> {
    let devices = match occl::cuda::kernels::device::device_count() {
        Ok(n) => n,
        Err(e) => {
            println!("occl-gpu: SKIPPED: no usable GPU: {e}");
            return Ok(());
        }
    };
    if let Some(t) = flag(args, "--threads") {
        let n: usize = t.parse().context("--threads N")?;
        let on: Vec<usize> = (0..n).map(|i| i % devices).collect();
        let ccs = CudaComm::init_all(&on)?;
        println!("occl-gpu: {n} thread ranks in one process on GPUs {on:?}");
        return std::thread::scope(|sc| {
            let hs: Vec<_> = ccs.iter().map(|cc| sc.spawn(move || dispatch(cc, args))).collect();
            hs.into_iter().try_for_each(|h| h.join().unwrap_or_else(|_| bail!("a rank's thread panicked")))
        });
    }
    let hosts = flag(args, "--hosts").map(str::parse::<usize>).transpose().context("--hosts K")?;
    if let Some(k) = hosts {
        let rank: usize = std::env::var("OCCL_RANK").context("OCCL_RANK (run under --ranks)")?.parse()?;
        std::env::set_var("OCCL_HOSTID", format!("gpu-host-{}", rank % k.max(1)));
    }
    let comm = Comm::from_env()?;
    let dev = comm.rank() % devices;
    let cc = CudaComm::new(comm, dev)?;
    if hosts.is_some_and(|k| k > 1) && !cc.is_staged() {
        bail!("rank {}: peers on other hosts, yet the device calls are not staged", cc.rank());
    }
    dispatch(&cc, args)
}

fn dispatch(cc: &CudaComm, args: &[String]) -> anyhow::Result<()> {
    let stream = cc.context().new_stream()?;
    match args.first().map(String::as_str) {
        Some("check") => check(cc, &stream, args),
        Some("bench") => bench(cc, &stream, args),
        Some("events") => occl_tests::gpu_events::run(cc, &stream, args),
        Some("stall") => {
            let calls = flag(args, "--calls").map(str::parse).transpose().context("--calls N")?.unwrap_or(3);
            let bytes = flag(args, "--bytes").map(parse_size).transpose()?.unwrap_or(64 << 20);
            occl_tests::gpu_stall::run(cc, &stream, calls, bytes)
        }
        _ => bail!("usage: occl-gpu check|bench|events|stall [--ranks N [--hosts K] | --threads N] ..."),
    }
}

/// Device buffer of `bytes` and its address.
fn alloc(stream: &Arc<CudaStream>, bytes: usize) -> anyhow::Result<(CudaSlice<u8>, u64)> {
    let s = stream.alloc_zeros::<u8>(bytes.max(16))?;
    let p = { s.device_ptr(stream).0 };
    Ok((s, p))
}

/// Element `i` of rank `r`'s input as a small integer: exact in every type, sums and products
/// of a few ranks stay exact.
fn val(op: RedOp, r: usize, i: usize) -> f64 {
    match op {
        RedOp::Prod => [1.0, 2.0, -1.0][(i + r) % 3],
        _ => ((i * 7 + r * 3) % 11) as f64 - 5.0,
    }
}

fn encode(dt: DataType, v: f64, out: &mut Vec<u8>) {
    match dt {
        DataType::F32 => out.extend((v as f32).to_le_bytes()),
        DataType::F64 => out.extend(v.to_le_bytes()),
        DataType::Bf16 => out.extend((((v as f32).to_bits() >> 16) as u16).to_le_bytes()),
        DataType::I32 => out.extend((v as i32).to_le_bytes()),
        DataType::I64 => out.extend((v as i64).to_le_bytes()),
        DataType::I8 => out.push(v as i8 as u8),
        _ => unreachable!("types the check uses"),
    }
}

fn decode(dt: DataType, b: &[u8]) -> f64 {
    match dt {
        DataType::F32 => f64::from(f32::from_le_bytes(b[..4].try_into().unwrap_or_default())),
        DataType::F64 => f64::from_le_bytes(b[..8].try_into().unwrap_or_default()),
        DataType::Bf16 => f64::from(f32::from_bits(u32::from(u16::from_le_bytes([b[0], b[1]])) << 16)),
        DataType::I32 => f64::from(i32::from_le_bytes(b[..4].try_into().unwrap_or_default())),
        DataType::I64 => i64::from_le_bytes(b[..8].try_into().unwrap_or_default()) as f64,
        DataType::I8 => f64::from(b[0] as i8),
        _ => f64::NAN,
    }
}

fn fold(op: RedOp, n: usize, dt: DataType, i: usize) -> f64 {
    let vs = (0..n).map(|r| val(op, r, i));
    match op {
        RedOp::Sum => vs.sum(),
        RedOp::Prod => vs.product(),
        RedOp::Max => vs.fold(f64::MIN, f64::max),
        RedOp::Min => vs.fold(f64::MAX, f64::min),
        RedOp::Avg => {
            let s: f64 = vs.sum();
            if dt.is_float() {
                s / n as f64
            } else {
                (s / n as f64).trunc()
            }
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Coll {
    AllReduce(DevAlgo),
    ReduceScatter,
    Reduce,
    AllGather,
    Broadcast,
    AllToAll,
    SendRecv,
    /// One group of a send to r+1 and a receive from r-1 (`p2p_group_raw`).
    GroupedSendRecv,
    /// One group of a send to and a receive from every rank, this one included.
    GroupedAllToAll,
}

/// A group of rank `r`'s send of `count` elements at `src` to r+1 and receive at `dst` from r-1.
fn ring_exchange(r: usize, n: usize, src: u64, dst: u64, count: usize, dt: DataType) -> [P2p; 2] {
    [
        P2p { send: true, peer: (r + 1) % n, buf: src, count, dt },
        P2p { send: false, peer: (r + n - 1) % n, buf: dst, count, dt },
    ]
}

/// A group of rank `r`'s sends of block p of `src` to every rank p and receives of block p of
/// `dst` from it (`count` elements a block), to itself too when `with_self`.
fn grouped_all_to_all(r: usize, n: usize, src: u64, dst: u64, count: usize, dt: DataType, with_self: bool) -> Vec<P2p> {
    let at = |p: usize| (p * count * dt.size()) as u64;
    (0..n)
        .filter(|&p| with_self || p != r)
        .flat_map(|p| {
            [
                P2p { send: true, peer: p, buf: src + at(p), count, dt },
                P2p { send: false, peer: p, buf: dst + at(p), count, dt },
            ]
        })
        .collect()
}

/// One case: fills inputs, runs (optionally captured in a graph and replayed twice), compares.
/// Returns wrong elements.
#[allow(clippy::too_many_arguments)]
fn case(
    cc: &CudaComm,
    s: &Arc<CudaStream>,
    coll: Coll,
    dt: DataType,
    op: RedOp,
    count: usize,
    inplace: bool,
    graph: bool,
) -> anyhow::Result<usize> {
    let (r, n, es) = (cc.rank(), cc.nranks(), dt.size());
    let (in_n, out_n) = match coll {
        Coll::AllReduce(_) | Coll::Reduce | Coll::Broadcast | Coll::SendRecv | Coll::GroupedSendRecv => (count, count),
        Coll::ReduceScatter => (count * n, count),
        Coll::AllGather => (count, count * n),
        Coll::AllToAll | Coll::GroupedAllToAll => (count * n, count * n),
    };
    let mut host = Vec::with_capacity(in_n * es);
    for i in 0..in_n {
        encode(dt, val(op, r, i), &mut host);
    }
    let (mut obuf, optr) = alloc(s, out_n * es)?;
    let (mut ibuf, iptr) = alloc(s, in_n * es)?;
    // Poison the output: every element must be written.
    s.memset_zeros(&mut obuf)?;
    let poison = vec![0x7bu8; out_n * es];
    if out_n > 0 {
        s.memcpy_htod(&poison, &mut obuf.slice_mut(..out_n * es))?;
    }
    let (src, dst) = if inplace {
        // The input sits where NCCL's in-place form puts it.
        let off = match coll {
            Coll::AllGather => r * count * es,
            _ => 0,
        };
        let target = if in_n > 0 { Some(off) } else { None };
        if let Some(off) = target {
            s.memcpy_htod(&host, &mut obuf.slice_mut(off..off + in_n * es))?;
        }
        let rs_off = if coll == Coll::ReduceScatter { r * count * es } else { 0 };
        (optr + off as u64, optr + rs_off as u64)
    } else {
        if in_n > 0 {
            s.memcpy_htod(&host, &mut ibuf.slice_mut(..in_n * es))?;
        }
        (iptr, optr)
    };
    let go = || -> anyhow::Result<()> {
        // SAFETY: buffers of the sizes each operation reads and writes, alive until synchronised.
        unsafe {
            match coll {
                Coll::AllReduce(_) => cc.all_reduce_raw(s, src, dst, count, dt, op)?,
                Coll::ReduceScatter => cc.reduce_scatter_raw(s, src, dst, count, dt, op)?,
                Coll::Reduce => cc.reduce_raw(s, src, dst, count, dt, op, n - 1)?,
                Coll::AllGather => cc.all_gather_raw(s, src, dst, count, dt)?,
                Coll::Broadcast => cc.broadcast_raw(s, src, dst, count, dt, n - 1)?,
                Coll::AllToAll => cc.all_to_all_raw(s, src, dst, count, dt)?,
                Coll::SendRecv => {
                    let (to, from) = ((r + 1) % n, (r + n - 1) % n);
                    // Even ranks send first; odd ranks receive first (FIFO-bounded both ways).
                    if r % 2 == 0 {
                        cc.send_raw(s, src, count, dt, to)?;
                        cc.recv_raw(s, dst, count, dt, from)?;
                    } else {
                        cc.recv_raw(s, dst, count, dt, from)?;
                        cc.send_raw(s, src, count, dt, to)?;
                    }
                }
                Coll::GroupedSendRecv => cc.p2p_group_raw(s, &ring_exchange(r, n, src, dst, count, dt))?,
                Coll::GroupedAllToAll => cc.p2p_group_raw(s, &grouped_all_to_all(r, n, src, dst, count, dt, true))?,
            }
        }
        Ok(())
    };
    if graph && !matches!(coll, Coll::Reduce | Coll::Broadcast) {
        s.begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)?;
        go()?;
        let g = s.end_capture(sys::CUgraphInstantiate_flags(0))?.context("empty graph")?;
        // Replays: the sequence numbers move on on the device.
        g.launch()?;
        g.launch()?;
    } else {
        go()?;
    }
    s.synchronize()?;
    cc.device_error()?;
    let mut got = vec![0u8; out_n * es];
    if out_n > 0 {
        s.memcpy_dtoh(&obuf.slice(..out_n * es), &mut got)?;
    }
    let want = |i: usize| -> Option<f64> {
        Some(match coll {
            Coll::AllReduce(_) => fold(op, n, dt, i),
            Coll::ReduceScatter => fold(op, n, dt, r * count + i),
            Coll::Reduce => {
                if r != n - 1 {
                    return None;
                }
                fold(op, n, dt, i)
            }
            Coll::AllGather => val(op, i / count, i % count),
            Coll::Broadcast => val(op, n - 1, i),
            Coll::AllToAll | Coll::GroupedAllToAll => val(op, i / count, r * count + i % count),
            Coll::SendRecv | Coll::GroupedSendRecv => val(op, (r + n - 1) % n, i),
        })
    };
    // Every input and every sum is a small integer, exact in every type; only a float average
    // over a rank count that is no power of two rounds: allow its last bit.
    let ulp = match dt {
        DataType::Bf16 => 2f64.powi(-7),
        DataType::F32 => 2f64.powi(-23),
        _ => 2f64.powi(-52),
    };
    let slack = |w: f64| if op == RedOp::Avg && dt.is_float() { w.abs() * ulp } else { 0.0 };
    let mut wrong = 0;
    for i in 0..out_n {
        if let Some(w) = want(i) {
            let g = decode(dt, &got[i * es..]);
            let w = match dt {
                DataType::I8 => f64::from(w as i64 as i8),
                _ => w,
            };
            if (g - w).abs() > slack(w) || g.is_nan() {
                if wrong < 3 {
                    eprintln!("rank {r}: {coll:?} {dt} {op:?} count {count} inplace {inplace} graph {graph}: [{i}] = {g}, want {w}");
                }
                wrong += 1;
            }
        }
    }
    Ok(wrong)
}

/// Rank `r`'s pre-multiply scalar on replay `k`: small, so that sums of products stay exact in
/// bf16 and i8 on 8 ranks.
fn premul_scalar(r: usize, k: usize) -> f64 {
    (1 + r % 2 + k) as f64
}

/// A pre-multiply sum: every rank's input times its own scalar, then summed. The scalar is
/// immediate, or read by the kernel from device memory; with `graph` the call is captured once
/// and replayed with the device scalar changed before each replay. Returns wrong elements.
#[allow(clippy::too_many_arguments)]
fn premul_case(
    cc: &CudaComm,
    s: &Arc<CudaStream>,
    coll: Coll,
    dt: DataType,
    count: usize,
    inplace: bool,
    device: bool,
    graph: bool,
) -> anyhow::Result<usize> {
    let (r, n, es) = (cc.rank(), cc.nranks(), dt.size());
    let (in_n, out_n) = if coll == Coll::ReduceScatter { (count * n, count) } else { (count, count) };
    let mut host = Vec::with_capacity(in_n * es);
    for i in 0..in_n {
        encode(dt, val(RedOp::Sum, r, i), &mut host);
    }
    let (mut ibuf, iptr) = alloc(s, in_n * es)?;
    let (mut obuf, optr) = alloc(s, out_n * es)?;
    let (mut sbuf, sptr) = alloc(s, es)?;
    let set_scalar = |sbuf: &mut CudaSlice<u8>, k: usize| -> anyhow::Result<()> {
        let mut b = Vec::new();
        encode(dt, premul_scalar(r, k), &mut b);
        s.memcpy_htod(&b, &mut sbuf.slice_mut(..es))?;
        Ok(())
    };
    let op = if device {
        DevOp::PreMulSum(PreMul::Device(sptr))
    } else {
        let mut b = Vec::new();
        encode(dt, premul_scalar(r, 0), &mut b);
        DevOp::PreMulSum(PreMul::immediate(&b)?)
    };
    let replays = if graph && device { 2 } else { 1 };
    let want = |i: usize, k: usize| -> Option<f64> {
        let at = match coll {
            Coll::ReduceScatter => r * count + i,
            Coll::Reduce if r != n - 1 => return None,
            _ => i,
        };
        Some((0..n).map(|q| premul_scalar(q, if device { k } else { 0 }) * val(RedOp::Sum, q, at)).sum())
    };
    let (src, dst) = if inplace { (optr, optr) } else { (iptr, optr) };
    let go = || -> anyhow::Result<()> {
        // SAFETY: buffers of the sizes each operation reads and writes, and a device scalar of
        // one element, alive until synchronised.
        unsafe {
            match coll {
                Coll::AllReduce(_) => cc.all_reduce_raw(s, src, dst, count, dt, op)?,
                Coll::ReduceScatter => cc.reduce_scatter_raw(s, src, dst, count, dt, op)?,
                Coll::Reduce => cc.reduce_raw(s, src, dst, count, dt, op, n - 1)?,
                c => bail!("{c:?} is no reduction"),
            }
        }
        Ok(())
    };
    let g = if graph {
        s.begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)?;
        go()?;
        Some(s.end_capture(sys::CUgraphInstantiate_flags(0))?.context("empty graph")?)
    } else {
        None
    };
    let mut wrong = 0;
    for k in 0..replays {
        let poison = vec![0x7bu8; out_n * es];
        s.memcpy_htod(&poison, &mut obuf.slice_mut(..out_n * es))?;
        if count > 0 {
            let into = if inplace { &mut obuf } else { &mut ibuf };
            s.memcpy_htod(&host, &mut into.slice_mut(..in_n * es))?;
        }
        set_scalar(&mut sbuf, k)?;
        match &g {
            Some(g) => g.launch()?,
            None => go()?,
        }
        s.synchronize()?;
        cc.device_error()?;
        let mut got = vec![0u8; out_n * es];
        if out_n > 0 {
            s.memcpy_dtoh(&obuf.slice(..out_n * es), &mut got)?;
        }
        for i in 0..out_n {
            let Some(w) = want(i, k) else { continue };
            let v = decode(dt, &got[i * es..]);
            if v != w {
                if wrong < 3 {
                    eprintln!(
                        "rank {r}: premul {coll:?} {dt} count {count} inplace {inplace} device {device} graph {graph} \
                         replay {k}: [{i}] = {v}, want {w}"
                    );
                }
                wrong += 1;
            }
        }
    }
    Ok(wrong)
}

fn check(cc: &CudaComm, s: &Arc<CudaStream>, args: &[String]) -> anyhow::Result<()> {
    let n = cc.nranks();
    let big = flag(args, "--big").map(parse_size).transpose()?.unwrap_or(1 << 30);
    if args.iter().any(|a| a == "--windows") {
        return occl_tests::gpu_windows::check(cc, s, big);
    }
    let chunk = 256 << 10;
    let mut algos = vec![DevAlgo::OneShot];
    if n > 1 {
        algos.extend([DevAlgo::TwoShot, DevAlgo::Ring]);
    }
    let dts = [DataType::F32, DataType::Bf16, DataType::I32, DataType::F64, DataType::I64, DataType::I8];
    let ops = [RedOp::Sum, RedOp::Prod, RedOp::Max, RedOp::Min, RedOp::Avg];
    let (mut cases, mut bad) = (0usize, 0usize);
    let mut run = |coll: Coll, dt: DataType, op: RedOp, count: usize, ip: bool, g: bool| -> anyhow::Result<()> {
        if let Coll::AllReduce(a) = coll {
            cc.force_all_reduce(Some(a))?;
        }
        let w = case(cc, s, coll, dt, op, count, ip, g)?;
        cases += 1;
        if w > 0 {
            bad += 1;
        }
        Ok(())
    };
    for dt in dts {
        let e = dt.size();
        // 0, 1, odd, across several FIFO chunks of one channel and of many channels.
        let sizes = [0, 1, 1001, 3 * chunk / e + 7, 40 * chunk / e + 3];
        for &a in &algos {
            for op in ops {
                if op == RedOp::Avg && dt == DataType::I8 {
                    continue;
                }
                for &c in &sizes {
                    for ip in [false, true] {
                        run(Coll::AllReduce(a), dt, op, c, ip, false)?;
                    }
                }
                run(Coll::AllReduce(a), dt, op, 1001, false, true)?;
            }
        }
        for coll in [Coll::ReduceScatter, Coll::Reduce] {
            for op in ops {
                if op == RedOp::Avg && dt == DataType::I8 {
                    continue;
                }
                for &c in &sizes {
                    run(coll, dt, op, c, false, false)?;
                }
            }
            run(coll, dt, RedOp::Sum, 1001, false, true)?;
        }
        // Grouped sends and receives are device launches of their own: a staged communicator
        // refuses them (its calls run through the host path).
        let grouped: &[Coll] = if cc.is_staged() { &[] } else { &[Coll::GroupedSendRecv, Coll::GroupedAllToAll] };
        let movers = [Coll::AllGather, Coll::Broadcast, Coll::AllToAll, Coll::SendRecv];
        for coll in movers.into_iter().chain(grouped.iter().copied()) {
            // A rank alone has nobody to send to (a send to itself is an argument error).
            if n == 1 && coll == Coll::SendRecv {
                continue;
            }
            for &c in &sizes {
                for ip in [false, true] {
                    if ip && matches!(coll, Coll::SendRecv | Coll::GroupedSendRecv | Coll::GroupedAllToAll) {
                        continue;
                    }
                    run(coll, dt, RedOp::Sum, c, ip, false)?;
                }
            }
            if n > 1 || coll != Coll::SendRecv {
                run(coll, dt, RedOp::Sum, 1001, false, true)?;
            }
        }
    }
    // 1 GiB per rank, f32 sum, each all-reduce algorithm and the byte movers.
    for &a in &algos {
        run(Coll::AllReduce(a), DataType::F32, RedOp::Sum, big / 4, false, false)?;
    }
    run(Coll::AllGather, DataType::F32, RedOp::Sum, big / 4 / n, false, false)?;
    run(Coll::ReduceScatter, DataType::F32, RedOp::Sum, big / 4 / n, false, false)?;
    run(Coll::AllToAll, DataType::F32, RedOp::Sum, big / 4 / n, false, false)?;
    if !cc.is_staged() {
        run(Coll::GroupedAllToAll, DataType::F32, RedOp::Sum, big / 4 / n, false, false)?;
    }
    // Pre-multiply sums: immediate and device scalars, in place, and graph replays that read a
    // changed device scalar.
    for dt in dts {
        let sizes = [1, 1001, 3 * chunk / dt.size() + 7];
        let colls: Vec<Coll> =
            algos.iter().map(|&a| Coll::AllReduce(a)).chain([Coll::ReduceScatter, Coll::Reduce]).collect();
        for coll in colls {
            if let Coll::AllReduce(a) = coll {
                cc.force_all_reduce(Some(a))?;
            }
            for &c in &sizes {
                for (ip, dev) in [(false, false), (false, true), (true, true)] {
                    if ip && coll == Coll::ReduceScatter {
                        continue;
                    }
                    cases += 1;
                    bad += usize::from(premul_case(cc, s, coll, dt, c, ip, dev, false)? > 0);
                }
            }
            if coll != Coll::Reduce {
                for dev in [false, true] {
                    cases += 1;
                    bad += usize::from(premul_case(cc, s, coll, dt, 1001, false, dev, true)? > 0);
                }
            }
        }
    }
    cc.force_all_reduce(None)?;
    let how = if cc.is_staged() { "staged through host memory" } else { "cuda-p2p" };
    println!("rank {}: {cases} cases, {bad} wrong ({how})", cc.rank());
    if bad > 0 {
        bail!("{bad} of {cases} cases wrong");
    }
    Ok(())
}

fn bench(cc: &CudaComm, s: &Arc<CudaStream>, args: &[String]) -> anyhow::Result<()> {
    let (r, n) = (cc.rank(), cc.nranks());
    let dname = flag(args, "-d").unwrap_or("float32");
    let dt = match dname {
        "float32" | "float" => DataType::F32,
        "bfloat16" => DataType::Bf16,
        d => bail!("-d {d}: float32 or bfloat16"),
    };
    let graph = args.iter().any(|a| a == "--graph");
    let algo = flag(args, "--algo");
    let sizes: Vec<usize> =
        flag(args, "--sizes").unwrap_or("8,64K,1M,64M,256M,1G").split(',').map(parse_size).collect::<Result<_, _>>()?;
    let colls = args.last().map(String::as_str).filter(|c| !c.starts_with('-')).unwrap_or("all_reduce");
    if let Some(a) = algo {
        let a = DevAlgo::ALL.into_iter().find(|x| x.name() == a).context("--algo oneshot|twoshot|ring")?;
        cc.force_all_reduce(Some(a))?;
    }
    cc.prepare(dt)?;
    let es = dt.size();
    let iters_arg: usize = flag(args, "--iters").map(str::parse).transpose()?.unwrap_or(100);
    let phases = args.iter().any(|a| a == "--phases");
    let windows = args.iter().any(|a| a == "--windows");
    if windows && cc.is_staged() {
        bail!("--windows: peers on other hosts have no mapped outputs");
    }
    for coll in colls.split(',') {
        for &size in &sizes {
            // nccl_bench.py's sizes: per-rank bytes; all_gather reports the output, reduce_scatter the input.
            let count = (size / es).max(1);
            let (nbytes, ibytes, obytes, factor) = match coll {
                "all_reduce" => (count * es, count * es, count * es, 2.0 * (n as f64 - 1.0) / n as f64),
                "broadcast" => (count * es, count * es, count * es, 1.0),
                "all_gather" => (count * es * n, count * es, count * es * n, (n as f64 - 1.0) / n as f64),
                "reduce_scatter" => (count * es * n, count * es * n, count * es, (n as f64 - 1.0) / n as f64),
                "all_to_all" | "grouped_all_to_all" => {
                    let c = (count - count % n).max(n);
                    (c * es, c * es, c * es, (n as f64 - 1.0) / n as f64)
                }
                "sendrecv" => (count * es, count * es, count * es, 1.0),
                c => bail!("unknown collective {c}"),
            };
            let (_ib, ip) = alloc(s, ibytes)?;
            let win = if windows { Some(WindowedOut::new(cc, obytes)?) } else { None };
            let (_ob, op) = match &win {
                Some(w) => (None, w.ptr()),
                None => alloc(s, obytes).map(|(b, p)| (Some(b), p))?,
            };
            let go = || -> anyhow::Result<()> {
                // SAFETY: buffers of the sizes above, alive for the whole measurement.
                unsafe {
                    match coll {
                        // In place, as nccl_bench.py's PyTorch calls are (an out-of-place
                        // broadcast's root also copies its input to its own output).
                        "all_reduce" => cc.all_reduce_raw(s, op, op, count, dt, RedOp::Sum)?,
                        "broadcast" => cc.broadcast_raw(s, op, op, count, dt, 0)?,
                        "all_gather" => cc.all_gather_raw(s, ip, op, count, dt)?,
                        "reduce_scatter" => cc.reduce_scatter_raw(s, ip, op, count, dt, RedOp::Sum)?,
                        "sendrecv" => cc.p2p_group_raw(s, &ring_exchange(r, n, ip, op, count, dt))?,
                        "grouped_all_to_all" => {
                            cc.p2p_group_raw(s, &grouped_all_to_all(r, n, ip, op, ibytes / es / n, dt, false))?
                        }
                        _ => cc.all_to_all_raw(s, ip, op, ibytes / es / n, dt)?,
                    }
                }
                Ok(())
            };
            let iters = if size <= 16 << 20 { iters_arg } else { (iters_arg / 10).max(5) };
            for _ in 0..10 {
                go()?;
            }
            s.synchronize()?;
            let graph_exec = if graph {
                s.begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)?;
                for _ in 0..iters {
                    go()?;
                }
                let g = s.end_capture(sys::CUgraphInstantiate_flags(0))?.context("empty graph")?;
                g.launch()?;
                s.synchronize()?;
                Some(g)
            } else {
                None
            };
            // A host barrier, then a lead call, untimed, as nccl_bench.py makes: the ranks leave the
            // barrier apart and the GPU has idled, which would fall on the first timed call.
            cc.comm().all_reduce(&[0u8], &mut [0u8], RedOp::Sum)?;
            go()?;
            let t0 = s.record_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))?;
            match &graph_exec {
                Some(g) => g.launch()?,
                None => {
                    for _ in 0..iters {
                        go()?;
                    }
                }
            }
            let t1 = s.record_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))?;
            t1.synchronize()?;
            cc.device_error()?;
            let us = f64::from(t0.elapsed_ms(&t1)?) * 1000.0 / iters as f64;
            let mut worst = [0f64];
            cc.comm().all_reduce(&[us], &mut worst, RedOp::Max)?;
            let algo_name = match coll {
                _ if cc.is_staged() => "staged",
                "all_reduce" => cc.all_reduce_algorithm(count, dt).name(),
                "broadcast" => cc.broadcast_algorithm(count, dt)?,
                "reduce_scatter" => cc.reduce_scatter_algorithm(count, dt)?,
                "sendrecv" | "grouped_all_to_all" => "grouped",
                _ => "direct",
            };
            // The channels and SMs the timed calls launched (none on the copy engines).
            let (channels, sms) = cc.last_launch();
            let algo_name = if channels == 0 { "CE" } else { algo_name };
            if phases {
                // The call before it lines the ranks up on the device: the profiled one starts as
                // that collective ends on every rank, not when each host launched it.
                go()?;
                cc.profile_next_call()?;
                go()?;
                s.synchronize()?;
                cc.device_error()?;
                let line = serde_json::json!({"collective": coll, "nranks": n, "rank": r, "size_bytes": nbytes,
                    "dtype": dname, "library": "occl", "algorithm": algo_name, "channels": channels, "sms": sms,
                    "windows": windows});
                println!("{}", phase_line(line, cc.kernel_phases()?.as_deref()));
            }
            if r == 0 {
                let t = worst[0];
                let algbw = nbytes as f64 / (t * 1e-6) / 1e9;
                println!(
                    "{}",
                    serde_json::json!({"collective": coll, "nranks": n, "size_bytes": nbytes, "dtype": dname,
                        "time_us": (t * 1000.0).round() / 1000.0, "algbw_gbps": (algbw * 1000.0).round() / 1000.0,
                        "busbw_gbps": (algbw * factor * 1000.0).round() / 1000.0, "graph": graph,
                        "library": "occl", "algorithm": algo_name, "channels": channels, "sms": sms,
                        "windows": windows})
                );
            }
            drop(graph_exec);
            if let Some(w) = win {
                w.close(cc, s)?;
            }
        }
    }
    Ok(())
}

/// `line` with the phase profile of one rank's call: per phase the ns summed over its channels
/// (`ns`), per channel (`ns_per_channel`) and its share of the channels' time; the rest no phase
/// counts as `other`; the skew of the channels' starts and ends. `"phases": null` when the call
/// ran no kernel (copy engines, staged).
fn phase_line(mut line: serde_json::Value, recs: Option<&[ChannelRecord]>) -> serde_json::Value {
    let round = |x: f64| (x * 10.0).round() / 10.0;
    let share = |x: f64| (x * 10_000.0).round() / 10_000.0;
    let sum = recs.and_then(Summary::of);
    line["phases"] = match &sum {
        None => serde_json::Value::Null,
        Some(s) => {
            let mut m = serde_json::Map::new();
            let per = s.channels as f64;
            for p in Phase::ALL {
                m.insert(
                    p.name().into(),
                    serde_json::json!({"ns": round(s.phase_ns[p as usize]), "ns_per_channel": round(s.mean_ns(p)),
                        "share": share(s.share(p))}),
                );
            }
            m.insert(
                "other".into(),
                serde_json::json!({"ns": round(s.other_ns), "ns_per_channel": round(s.other_ns / per),
                    "share": share(s.other_share())}),
            );
            serde_json::Value::Object(m)
        }
    };
    if let Some(s) = sum {
        let per = s.channels as f64;
        line["profiled_channels"] = s.channels.into();
        line["span_ns"] = s.span_ns.into();
        line["channel_ns"] = round(s.channel_ns / per).into();
        line["chunks_per_channel"] = round(s.chunks as f64 / per).into();
        line["steps_per_channel"] = round(s.steps as f64 / per).into();
        line["start_skew_ns"] = s.start_skew_ns.into();
        line["end_skew_ns"] = s.end_skew_ns.into();
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_phase_line_sums_the_channels_and_says_when_no_kernel_ran() {
        let rec = |start_ns: u64, phases: [u64; 5]| ChannelRecord {
            start_ns,
            end_ns: start_ns + 1_000,
            cycles: 2_000,
            phases,
            chunks: 3,
            steps: 6,
        };
        let recs = [rec(100, [200, 0, 1_000, 400, 200]), rec(150, [600, 0, 1_000, 0, 200])];
        let v = phase_line(serde_json::json!({"collective": "all_gather", "rank": 1}), Some(&recs));
        assert_eq!(v["collective"], "all_gather");
        assert_eq!(v["phases"]["push"], serde_json::json!({"ns": 1000.0, "ns_per_channel": 500.0, "share": 0.5}));
        assert_eq!(v["phases"]["wait_send"]["ns"], 400.0);
        assert_eq!(v["phases"]["copy_out"]["ns_per_channel"], 100.0);
        assert_eq!(v["phases"]["other"]["share"], 0.1);
        assert_eq!(
            (v["start_skew_ns"].as_u64(), v["end_skew_ns"].as_u64(), v["span_ns"].as_u64()),
            (Some(50), Some(50), Some(1_050))
        );
        assert_eq!((v["channel_ns"].as_f64(), v["chunks_per_channel"].as_f64()), (Some(1_000.0), Some(3.0)));
        let none = phase_line(serde_json::json!({"rank": 0}), None);
        assert!(none["phases"].is_null() && none.get("span_ns").is_none());
    }
}
