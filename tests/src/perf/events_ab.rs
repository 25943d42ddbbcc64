//! `occl-perf --events-ab R [--ab-sink S]`: the cost of profiler events, measured A/B in one run.
//! For each size, R rounds alternate a batch with no sink attached (every event site is one
//! relaxed load and a branch) and a batch with sink S attached:
//!
//! - `counter` (default): a counting sink that wants every event type (NCCL's full hierarchy,
//!   ProxyStep per slice): the cost of emission itself;
//! - `otlp[:F]`: the span collector feeding the OTLP exporter, ProxySteps sampled at F (default
//!   the exporter's), exporting over HTTP to a loopback sink that each rank starts (a local
//!   collector agent's place): the whole cost of OpenTelemetry export, its thread included.
//!
//! Reported: the median time of each, the overhead, events (or spans) per operation, and the
//! cost per event.

use super::bench::{Average, Bench};
use super::Layout;
use crate::events::Counter;
use occl::Comm;
use occl_telemetry::otlp::{OtlpConfig, OtlpExporter};
use occl_telemetry::spans::{CommMeta, Telemetry};
use occl_telemetry::EventMask;
use occl_telemetry::Sink;
use std::io::Write;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

/// The B side of the comparison.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum AbSink {
    Counter,
    /// The OTLP exporter with this ProxyStep sampling fraction (`None`: its default).
    Otlp(Option<f64>),
    /// The span collector alone, handing spans of the OTLP exporter's types (steps at the
    /// default sampling) to an exporter that drops them: what every exporter pays before its own work.
    Collector,
}

impl std::str::FromStr for AbSink {
    type Err = String;
    fn from_str(s: &str) -> Result<AbSink, String> {
        match s.split_once(':') {
            None if s == "counter" => Ok(AbSink::Counter),
            None if s == "otlp" => Ok(AbSink::Otlp(None)),
            None if s == "collector" => Ok(AbSink::Collector),
            Some(("otlp", f)) => match f.parse::<f64>() {
                Ok(f) if (0.0..=1.0).contains(&f) => Ok(AbSink::Otlp(Some(f))),
                _ => Err(format!("'{f}' is not a sampling fraction between 0 and 1")),
            },
            _ => Err(format!("'{s}' is not a sink: expected counter, collector, otlp or otlp:FRACTION")),
        }
    }
}

/// Takes spans of the OTLP exporter's types and does nothing with them.
struct Null(EventMask);

impl occl_telemetry::spans::Exporter for Null {
    fn name(&self) -> &str {
        "null"
    }
    fn interest(&self) -> EventMask {
        self.0
    }
    fn span(&self, _: &occl_telemetry::spans::Span<'_>) {}
}

/// The OTLP exporter's side: a sink per round (detaching finalizes it, which flushes).
struct Otlp {
    exporter: Arc<OtlpExporter>,
    telemetry: Telemetry,
    meta: CommMeta,
    sampling: f64,
}

impl Otlp {
    fn start(comm: &Comm, sampling: Option<f64>) -> anyhow::Result<Otlp> {
        let (addr, _) = crate::otlp_sink::start()?;
        let d = OtlpConfig::default();
        let cfg = OtlpConfig {
            endpoint: format!("http://{addr}/v1/traces"),
            step_sampling: sampling.unwrap_or(d.step_sampling),
            rank: Some(comm.rank() as i64),
            ..d
        };
        let sampling = cfg.step_sampling;
        let exporter = OtlpExporter::new(cfg)?;
        let telemetry = Telemetry::new(vec![exporter.clone()]);
        let meta = CommMeta {
            name: None,
            hash: comm.id(),
            rank: comm.rank() as i32,
            nranks: comm.nranks() as i32,
            n_nodes: 1,
        };
        Ok(Otlp { exporter, telemetry, meta, sampling })
    }

    fn sink(&self) -> Arc<dyn Sink> {
        self.telemetry.comm_sink(self.meta.clone())
    }

    fn spans(&self) -> u64 {
        let s = self.exporter.stats();
        s.exported + s.dropped()
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
#[allow(clippy::too_many_arguments)] // the benchmark's knobs, passed through from the command line
pub fn run(
    comm: &Comm,
    bench: &mut Bench<'_>,
    layouts: &[Layout],
    rounds: usize,
    warmup: usize,
    iters: usize,
    b_side: AbSink,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    let lead = comm.rank() == 0;
    let counter = Arc::new(Counter::default());
    counter.mask.store(EventMask::ALL.0, Relaxed);
    let otlp = match b_side {
        AbSink::Otlp(f) => Some(Otlp::start(comm, f)?),
        AbSink::Counter | AbSink::Collector => None,
    };
    let null = (b_side == AbSink::Collector).then(|| {
        let d = OtlpConfig::default();
        let mask = OtlpExporter::interest_of(&d);
        let meta = CommMeta {
            name: None,
            hash: comm.id(),
            rank: comm.rank() as i32,
            nranks: comm.nranks() as i32,
            n_nodes: 1,
        };
        (Telemetry::new(vec![Arc::new(Null(mask))]), meta)
    });
    // A fresh sink for each batch with events on, and what it has seen so far.
    let sink = || -> Arc<dyn Sink> {
        match (&otlp, &null) {
            (Some(o), _) => o.sink(),
            (_, Some((t, meta))) => t.comm_sink(meta.clone()),
            _ => counter.clone(),
        }
    };
    let seen = || otlp.as_ref().map_or_else(|| counter.total(), Otlp::spans);
    if lead {
        let what = match (&otlp, &null) {
            (Some(o), _) => {
                format!("the OTLP exporter (http/protobuf to a loopback sink, step sampling {})", o.sampling)
            }
            (_, Some(_)) => "the span collector and an exporter that drops every span (OTLP's types)".into(),
            _ => "a counting sink (mask 0x7fff)".into(),
        };
        writeln!(out, "# events A/B: {rounds} rounds of {iters} calls with no sink / with {what}")?;
        let unit = if otlp.is_some() { "spans/op" } else { "events/op" };
        writeln!(
            out,
            "#{:>11} {:>12} {:>12} {:>9} {:>10} {:>10}",
            "size(B)", "off(us)", "on(us)", "overhead", unit, "ns/event"
        )?;
    }
    for &layout in layouts {
        // Events (spans) one call produces: every rank's own count; the slowest rank's time is reported.
        // (Detaching finalizes the sink: the OTLP exporter has flushed and counted by then.)
        let before = seen();
        let h = comm.attach_sink(sink())?;
        bench.launch(layout, false)?;
        bench.launch(layout, false)?;
        comm.detach_sink(h);
        let per_op = (seen() - before) / 2;
        let (mut off, mut on) = (Vec::new(), Vec::new());
        for _ in 0..rounds {
            let t = bench.time(layout, false, warmup, iters)?;
            off.push(bench.combine(t, Average::Max)?);
            let h = comm.attach_sink(sink())?;
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
    if let (Some(o), true) = (&otlp, lead) {
        let s = o.exporter.stats();
        writeln!(
            out,
            "# otlp (rank 0): {} spans exported in {} requests, {} dropped ({} queue full, {} export failed)",
            s.exported,
            s.requests_ok,
            s.dropped(),
            s.dropped_queue_full,
            s.dropped_export_failed
        )?;
    }
    Ok(())
}
