//! `occl-perf --events-ab R [--events-sink KIND]`: the cost of profiler events, measured A/B in
//! one run. For each size, R rounds alternate a batch with no sink attached (every event site is
//! one relaxed load and a branch) and a batch with the B sink attached:
//! - `count`: a counting sink that wants every event type (NCCL's full hierarchy, ProxyStep per
//!   slice): the cost of emission itself;
//! - `trace`: the HTA trace exporter (`occl_telemetry::trace`, ProxyOp rows) behind the span
//!   collector, as `OCCL_TRACE_DIR` enables it (files go to a temporary directory, removed after).
//!
//! Reported: the median time of each, the overhead, callbacks per operation of the types B
//! wants, and the cost per callback.

use super::bench::{Average, Bench};
use super::Layout;
use crate::events::Counter;
use occl::Comm;
use occl_telemetry::spans::{CommMeta, Telemetry};
use occl_telemetry::trace::{TraceConfig, TraceExporter};
use occl_telemetry::{EventDescr, EventId, EventMask, Sink, StateArgs};
use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

/// What the B batches attach.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum SinkKind {
    /// A sink that counts every event of every type (mask 0x7fff).
    Count,
    /// The HTA trace exporter behind the span collector.
    Trace,
}

/// The B sink, and what to clean up after the run.
struct BSide {
    sink: Arc<dyn Sink>,
    label: &'static str,
    trace: Option<(Arc<TraceExporter>, PathBuf)>,
}

fn b_side(kind: SinkKind, comm: &Comm, max_events: usize) -> BSide {
    match kind {
        SinkKind::Count => {
            let c = Arc::new(Counter::default());
            c.mask.store(EventMask::ALL.0, Relaxed);
            BSide { sink: c, label: "a counting sink (mask 0x7fff)", trace: None }
        }
        SinkKind::Trace => {
            let dir = std::env::temp_dir().join(format!("occl-perf-trace-{}", std::process::id()));
            let ex = Arc::new(TraceExporter::new(TraceConfig { max_events, ..TraceConfig::new(&dir) }));
            let tel = Telemetry::new(vec![ex.clone()]);
            let meta = CommMeta {
                name: None,
                hash: comm.id(),
                rank: comm.rank() as i32,
                nranks: comm.nranks() as i32,
                n_nodes: 1,
            };
            let sink = Arc::new(KeepOpen(tel.comm_sink(meta)));
            BSide { sink, label: "the HTA trace exporter (ProxyOp rows)", trace: Some((ex, dir)) }
        }
    }
}

/// Forwards everything but `finalize`: detaching between rounds must not write the trace file
/// each time (tens of MB of I/O beside the timed batches); it is written once, at the end.
struct KeepOpen(Arc<dyn Sink>);

impl Sink for KeepOpen {
    fn interest(&self) -> EventMask {
        self.0.interest()
    }
    fn start(&self, id: EventId, parent: Option<EventId>, ev: &EventDescr<'_>) {
        self.0.start(id, parent, ev);
    }
    fn state(&self, id: EventId, st: &StateArgs<'_>) {
        self.0.state(id, st);
    }
    fn stop(&self, id: EventId) {
        self.0.stop(id);
    }
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// Runs the A/B rounds for every layout (out-of-place) and prints one row per size on rank 0.
#[allow(clippy::too_many_arguments)]
pub fn run(
    comm: &Comm,
    bench: &mut Bench<'_>,
    layouts: &[Layout],
    kind: SinkKind,
    rounds: usize,
    warmup: usize,
    iters: usize,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    let lead = comm.rank() == 0;
    // Room for every event of the run, so the B side never takes the cheaper "log full" path.
    let max_events = layouts.len().max(1) * (rounds + 1) * (warmup + iters + 4) * 64;
    let b = b_side(kind, comm, max_events);
    if lead {
        writeln!(out, "# events A/B: {rounds} rounds of {iters} calls with no sink / with {}", b.label)?;
        writeln!(
            out,
            "#{:>11} {:>12} {:>12} {:>9} {:>10} {:>10}",
            "size(B)", "off(us)", "on(us)", "overhead", "events/op", "ns/event"
        )?;
    }
    // Counts the callbacks of the types the B sink wants (ancestors included, as emitted).
    let counter = Arc::new(Counter::default());
    counter.mask.store(b.sink.interest().with_ancestors().0, Relaxed);
    for &layout in layouts {
        // Callbacks one call makes (every rank's own count; the slowest rank's time is reported).
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
            let h = comm.attach_sink(b.sink.clone())?;
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
    if let Some((ex, dir)) = b.trace {
        // Written once now (detaching did not finalize); then cleaned up.
        for p in ex.write_all() {
            let p = p?;
            if lead {
                writeln!(out, "# trace file written and removed: {} bytes", std::fs::metadata(&p)?.len())?;
            }
            std::fs::remove_file(p)?;
        }
        let _ = std::fs::remove_dir(dir);
    }
    Ok(())
}
