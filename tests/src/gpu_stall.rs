//! `occl-gpu stall`: a copy-engine call whose peer lives but stops calling is stopped at
//! `OCCL_TIMEOUT` and reported, instead of holding the caller's stream forever.
//!
//! ```text
//! NCCL_CTA_POLICY=2 OCCL_TIMEOUT=5 occl-gpu stall --ranks 2 [--calls 3] [--bytes 64M]
//! ```
//!
//! Every rank runs `--calls` all-gathers of `--bytes` per rank on the copy engines and checks
//! the last one's data. Then every rank but 0 stops calling and sleeps, alive, for
//! `OCCL_TIMEOUT` + 3 s, while rank 0 calls one more all-gather. Rank 0 must see its stream
//! drain no earlier than `OCCL_TIMEOUT` and within `OCCL_TIMEOUT` + 1 s of the call,
//! `device_error` report a `Timeout` that names the call, and its next call refused with it;
//! it prints `PASS` or `FAIL` with the times and the errors. A stream still running 10 s past
//! the bound is a FAIL, and the process exits at once (its communicator cannot be dropped).

use anyhow::{bail, ensure};
use occl::cuda::kernels::cudarc::driver::{CudaStream, DevicePtr};
use occl::cuda::kernels::staging::Mark;
use occl::cuda::CudaComm;
use occl::{CollType, DataType, ErrorKind};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How much later than `OCCL_TIMEOUT` the stalled call may drain.
const GRACE: Duration = Duration::from_secs(1);

pub fn run(cc: &CudaComm, s: &Arc<CudaStream>, calls: usize, bytes: usize) -> anyhow::Result<()> {
    let (n, r) = (cc.nranks(), cc.rank());
    let timeout = cc.comm().config().timeout;
    ensure!(n >= 2, "occl-gpu stall needs 2 ranks or more");
    ensure!(bytes > 0, "--bytes must be more than 0");
    ensure!(
        cc.on_copy_engines(CollType::AllGather),
        "the all-gathers would not run on the copy engines: run with NCCL_CTA_POLICY=2"
    );
    let mut input = s.alloc_zeros::<u8>(bytes)?;
    s.memcpy_htod(&vec![r as u8 + 1; bytes], &mut input)?;
    let output = s.alloc_zeros::<u8>(bytes * n)?;
    let ip = { input.device_ptr(s).0 };
    let op = { output.device_ptr(s).0 };
    // SAFETY (every call below): `ip` holds `bytes` and `op` n × `bytes` of this GPU's memory,
    // alive until the stream has run the call (synchronised, or the process exits).
    for _ in 0..calls {
        unsafe { cc.all_gather_raw(s, ip, op, bytes, DataType::U8)? };
        s.synchronize()?;
        cc.device_error()?;
    }
    let mut got = vec![0u8; bytes * n];
    s.memcpy_dtoh(&output, &mut got)?;
    s.synchronize()?;
    if let Some(i) = got.iter().enumerate().position(|(i, &b)| b != (i / bytes) as u8 + 1) {
        bail!("rank {r}: byte {i} of the all-gather is {}, not {}", got[i], i / bytes + 1);
    }
    if r != 0 {
        let nap = timeout + Duration::from_secs(3);
        println!("occl-gpu stall: rank {r}: {calls} copy-engine all-gathers right; stops calling, alive, for {nap:?}");
        std::thread::sleep(nap);
        println!("occl-gpu stall: rank {r}: exits");
        return Ok(());
    }
    println!("occl-gpu stall: rank 0: {calls} copy-engine all-gathers right; calls one more alone (OCCL_TIMEOUT {timeout:?})");
    let t0 = Instant::now();
    unsafe { cc.all_gather_raw(s, ip, op, bytes, DataType::U8)? };
    let end = Mark::new(cc.context())?;
    end.record(s)?;
    let limit = timeout + GRACE + Duration::from_secs(10);
    while !end.done()? {
        if t0.elapsed() > limit {
            println!(
                "occl-gpu stall: FAIL: rank 0's stalled all-gather still runs after {:.2} s",
                t0.elapsed().as_secs_f64()
            );
            std::process::exit(1);
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    let drained = t0.elapsed();
    let error = cc.device_error();
    let next = unsafe { cc.all_gather_raw(s, ip, op, bytes, DataType::U8) };
    let timed_out = |r: &occl::Result<()>| matches!(r, Err(e) if e.kind() == ErrorKind::Timeout);
    let in_time = drained >= timeout && drained <= timeout + GRACE;
    let verdict = if in_time && timed_out(&error) && timed_out(&next) { "PASS" } else { "FAIL" };
    let text = |r: &occl::Result<()>| r.as_ref().err().map_or("no error".to_string(), ToString::to_string);
    println!(
        "occl-gpu stall: {verdict}: rank 0's stalled all-gather drained after {:.2} s (OCCL_TIMEOUT {:.1} s, bound \
         {:.1} s); device_error: {}; the next call: {}",
        drained.as_secs_f64(),
        timeout.as_secs_f64(),
        (timeout + GRACE).as_secs_f64(),
        text(&error),
        text(&next)
    );
    if next.is_ok() {
        // A call that was not refused runs alone and waits for a peer that does not call.
        std::process::exit(1);
    }
    ensure!(verdict == "PASS", "the stalled copy-engine call was not stopped and reported in time");
    Ok(())
}
