//! `occl-perf --events-ab R [--events-sink S]`: the cost of profiler events, measured A/B in one
//! run. For each size, R rounds alternate a batch with no sink attached (every event site is one
//! relaxed load and a branch) and a batch with sink S attached. Reported: the median time of
//! each, the overhead, events per operation, and the cost per event.
//!
//! Sinks: `counter` counts every event type (NCCL's full hierarchy, ProxyStep per slice);
//! `prometheus` is the span collector feeding the Prometheus exporter, as `OCCL_METRICS=1` runs
//! it; `spans` is the collector feeding an exporter that wants the same events and does nothing
//! (what the collector alone costs).

use super::bench::{Average, Bench};
use super::Layout;
use crate::events::Counter;
use occl::Comm;
use occl_telemetry::spans::{CommMeta, Exporter, Span, Telemetry};
use occl_telemetry::{EventMask, Sink};
use std::io::Write;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

/// What the "on" batches attach.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum EventsSink {
    Counter,
    Prometheus,
    Spans,
}

/// Wants what the Prometheus exporter wants, does nothing.
struct Idle(EventMask);

impl Exporter for Idle {
    fn name(&self) -> &str {
        "idle"
    }
    fn interest(&self) -> EventMask {
        self.0
    }
    fn span(&self, _: &Span<'_>) {}
}

/// The sink to attach and its label, plus the counter that counts the events it receives.
fn make_sink(comm: &Comm, which: EventsSink) -> (Arc<dyn Sink>, Arc<Counter>, String) {
    let counter = Arc::new(Counter::default());
    let meta =
        || CommMeta { name: None, hash: comm.id(), rank: comm.rank() as i32, nranks: comm.nranks() as i32, n_nodes: 1 };
    let prom: Arc<dyn Exporter> = Arc::new(occl_telemetry::prometheus::Exporter::new());
    let (sink, label): (Arc<dyn Sink>, String) = match which {
        EventsSink::Counter => {
            counter.mask.store(EventMask::ALL.0, Relaxed);
            return (counter.clone(), counter, "a counting sink (mask 0x7fff)".into());
        }
        EventsSink::Prometheus => {
            (Telemetry::new(vec![prom.clone()]).comm_sink(meta()), "the Prometheus exporter (span collector)".into())
        }
        EventsSink::Spans => (
            Telemetry::new(vec![Arc::new(Idle(prom.interest()))]).comm_sink(meta()),
            "the span collector with an idle exporter (Prometheus's events)".into(),
        ),
    };
    counter.mask.store(sink.interest().0, Relaxed);
    (sink, counter, label)
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// How the A/B runs: rounds, calls per batch (after `warmup` untimed ones), and the "on" sink.
#[derive(Clone, Copy, Debug)]
pub struct Plan {
    pub rounds: usize,
    pub warmup: usize,
    pub iters: usize,
    pub sink: EventsSink,
}

/// Runs the A/B rounds for every layout (out-of-place) and prints one row per size on rank 0.
pub fn run(
    comm: &Comm,
    bench: &mut Bench<'_>,
    layouts: &[Layout],
    plan: Plan,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    let Plan { rounds, warmup, iters, sink: which } = plan;
    let lead = comm.rank() == 0;
    let (sink, counter, label) = make_sink(comm, which);
    if lead {
        writeln!(out, "# events A/B: {rounds} rounds of {iters} calls with no sink / with {label}")?;
        writeln!(
            out,
            "#{:>11} {:>12} {:>12} {:>9} {:>10} {:>10}",
            "size(B)", "off(us)", "on(us)", "overhead", "events/op", "ns/event"
        )?;
    }
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
            let h = comm.attach_sink(sink.clone())?;
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
