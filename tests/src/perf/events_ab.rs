//! `occl-perf --events-ab R`: the cost of profiler events, measured A/B in one run. For each
//! size, R rounds alternate a batch with no sink attached (every event site is one relaxed load
//! and a branch) and a batch with a counting sink that wants every event type (NCCL's full
//! hierarchy, ProxyStep per slice). Reported: the median time of each, the overhead, events per
//! operation, and the cost per event.

use super::bench::{Average, Bench};
use super::Layout;
use crate::events::Counter;
use occl::Comm;
use occl_telemetry::EventMask;
use std::io::Write;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// Runs the A/B rounds for every layout (out-of-place) and prints one row per size on rank 0.
pub fn run(
    comm: &Comm,
    bench: &mut Bench<'_>,
    layouts: &[Layout],
    rounds: usize,
    warmup: usize,
    iters: usize,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    let lead = comm.rank() == 0;
    if lead {
        writeln!(
            out,
            "# events A/B: {rounds} rounds of {iters} calls with no sink / with a counting sink (mask 0x7fff)"
        )?;
        writeln!(
            out,
            "#{:>11} {:>12} {:>12} {:>9} {:>10} {:>10}",
            "size(B)", "off(us)", "on(us)", "overhead", "events/op", "ns/event"
        )?;
    }
    let counter = Arc::new(Counter::default());
    counter.mask.store(EventMask::ALL.0, Relaxed);
    for &layout in layouts {
        // Events one call emits (every rank's own count; the slowest rank's time is reported).
        let h = comm.attach_sink(counter.clone())?;
        bench.launch(layout, false)?;
        let before = counter.total();
        bench.launch(layout, false)?;
        let per_op = counter.total() - before;
        comm.detach_sink(h);
        let (mut off, mut on) = (Vec::new(), Vec::new());
        for _ in 0..rounds {
            let t = bench.time(layout, false, warmup, iters)?;
            off.push(bench.combine(t, Average::Max)?);
            let h = comm.attach_sink(counter.clone())?;
            let t = bench.time(layout, false, warmup, iters)?;
            comm.detach_sink(h);
            on.push(bench.combine(t, Average::Max)?);
        }
        let (off, on) = (median(&mut off), median(&mut on));
        if lead {
            let ns_per_event = if per_op > 0 { (on - off) * 1e9 / per_op as f64 } else { 0.0 };
            writeln!(
                out,
                "{:>12} {:>12.2} {:>12.2} {:>8.1}% {:>10} {:>10.1}",
                layout.bytes,
                off * 1e6,
                on * 1e6,
                (on / off - 1.0) * 100.0,
                per_op,
                ns_per_event
            )?;
            out.flush()?;
        }
    }
    Ok(())
}
