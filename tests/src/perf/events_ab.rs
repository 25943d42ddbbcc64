//! `occl-perf --events-ab R [--events-sink S]`: the cost of profiler events and of each exporter,
//! measured A/B in one run. For each size, R rounds alternate a batch with no sink attached (every
//! event site is one relaxed load and a branch) and a batch with sink S attached:
//!
//! - `counter` (default): a sink that counts every event type (NCCL's full hierarchy, ProxyStep per
//!   slice): the cost of emission itself;
//! - `collector`: the span collector handing every span to an exporter that drops it: what each
//!   exporter pays before its own work;
//! - `prometheus`: Prometheus metrics as occl runs them by default: the job's communicator with the
//!   core bumping its series directly (the direct route, every peer over shm) against a
//!   communicator split off it without them (no profilers): the same ranks and transports;
//! - `split`: the check of that comparison, run with `OCCL_METRICS=0`: the job's communicator
//!   against the same split, neither with metrics, so what remains is what comparing two
//!   communicators costs (their FIFOs lie in other pages);
//! - `prometheus-spans`: the collector feeding the Prometheus exporter: the route a communicator
//!   with tcp peers takes;
//! - `otlp[:F]`: the collector feeding the OTLP exporter, ProxySteps sampled at F (default the
//!   exporter's), exporting over HTTP to a loopback sink each rank starts (a local collector
//!   agent's place): the whole cost of OpenTelemetry export, its thread included;
//! - `trace`: the collector feeding the HTA trace exporter, as `OCCL_TRACE_DIR` runs it (the file
//!   goes to a temporary directory, written once at the end and removed).
//!
//! Reported: the median time of each, the overhead (the median over rounds of on / off, the two
//! batches of a round in alternating order), callbacks per operation of the types S wants, and the
//! cost per callback.

use super::bench::{Average, Bench};
use super::{median, Layout};
use crate::events::Counter;
use occl::Comm;
use occl_telemetry::otlp::{OtlpConfig, OtlpExporter};
use occl_telemetry::spans::{CommMeta, Exporter, Span, Telemetry};
use occl_telemetry::trace::{TraceConfig, TraceExporter};
use occl_telemetry::{EventDescr, EventId, EventMask, Sink, StateArgs};
use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

/// The B side of the comparison.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum AbSink {
    Counter,
    Collector,
    /// The direct route: the job's communicator against a split without metrics.
    Prometheus,
    /// The job's communicator without metrics against that split (the A/A check of `Prometheus`).
    Split,
    /// The Prometheus exporter behind the span collector.
    PrometheusSpans,
    /// The OTLP exporter with this ProxyStep sampling fraction (`None`: its default).
    Otlp(Option<f64>),
    Trace,
}

impl std::str::FromStr for AbSink {
    type Err = String;
    fn from_str(s: &str) -> Result<AbSink, String> {
        match s.split_once(':') {
            None if s == "counter" => Ok(AbSink::Counter),
            None if s == "collector" => Ok(AbSink::Collector),
            None if s == "prometheus" => Ok(AbSink::Prometheus),
            None if s == "split" => Ok(AbSink::Split),
            None if s == "prometheus-spans" => Ok(AbSink::PrometheusSpans),
            None if s == "otlp" => Ok(AbSink::Otlp(None)),
            None if s == "trace" => Ok(AbSink::Trace),
            Some(("otlp", f)) => match f.parse::<f64>() {
                Ok(f) if (0.0..=1.0).contains(&f) => Ok(AbSink::Otlp(Some(f))),
                _ => Err(format!("'{f}' is not a sampling fraction between 0 and 1")),
            },
            _ => Err(format!(
                "'{s}' is not a sink: expected counter, collector, prometheus, split, prometheus-spans, otlp, otlp:FRACTION or trace"
            )),
        }
    }
}

/// Takes spans and does nothing with them.
struct Null(EventMask);

impl Exporter for Null {
    fn name(&self) -> &str {
        "null"
    }
    fn interest(&self) -> EventMask {
        self.0
    }
    fn span(&self, _: &Span<'_>) {}
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
    fn step_totals(&self, op: EventId, t: &occl_telemetry::StepTotals) {
        self.0.step_totals(op, t);
    }
}

/// What the B batches attach.
enum Kind {
    /// Attached as is.
    Counter(Arc<Counter>),
    /// The span collector: a fresh sink per batch (detaching finalizes it, which flushes the OTLP
    /// exporter).
    Collector(Telemetry),
    /// One collector sink kept open across batches; the file is written at the end.
    Trace(Arc<dyn Sink>, Arc<TraceExporter>, PathBuf),
    /// No sink: the "off" batches run on this communicator (the job's ranks without metrics).
    Split(Box<Comm>),
}

/// The B side, and what to report and clean up after the run.
struct BSide {
    label: String,
    kind: Kind,
    meta: CommMeta,
    otlp: Option<Arc<OtlpExporter>>,
}

impl BSide {
    fn new(which: AbSink, comm: &Comm, max_events: usize) -> anyhow::Result<BSide> {
        let meta = CommMeta {
            name: None,
            hash: comm.id(),
            rank: comm.rank() as i32,
            nranks: comm.nranks() as i32,
            n_nodes: 1,
        };
        let collector = |e: Arc<dyn Exporter>| Kind::Collector(Telemetry::new(vec![e]));
        let (label, kind, otlp) = match which {
            AbSink::Counter => {
                let c = Arc::new(Counter::default());
                c.mask.store(EventMask::ALL.0, Relaxed);
                ("a counting sink (mask 0x7fff)".to_string(), Kind::Counter(c), None)
            }
            AbSink::Collector => (
                "the span collector and an exporter that drops every span (all types)".into(),
                collector(Arc::new(Null(EventMask::ALL))),
                None,
            ),
            AbSink::Prometheus | AbSink::Split => {
                let label = match which {
                    AbSink::Prometheus if !comm.direct_metrics() => anyhow::bail!(
                        "--events-sink prometheus: this communicator has no direct metrics (OCCL_METRICS=0, or a peer not over shm); prometheus-spans measures the span route"
                    ),
                    AbSink::Split if comm.direct_metrics() => anyhow::bail!(
                        "--events-sink split compares two communicators without metrics: run it with OCCL_METRICS=0"
                    ),
                    AbSink::Prometheus => "Prometheus metrics, direct route (off: a split without metrics)",
                    _ => "no metrics on the job's communicator (off: a split without metrics; an A/A check)",
                };
                let config = occl::Config { profilers: occl::Profilers::Given(Vec::new()), ..comm.config().clone() };
                let off = comm
                    .split_with(0, comm.rank() as i32, config)?
                    .ok_or_else(|| anyhow::anyhow!("the split without metrics gave no communicator"))?;
                (label.into(), Kind::Split(Box::new(off)), None)
            }
            AbSink::PrometheusSpans => (
                "the Prometheus exporter (span collector)".into(),
                collector(Arc::new(occl_telemetry::prometheus::Exporter::new())),
                None,
            ),
            AbSink::Otlp(f) => {
                let (addr, _) = crate::otlp_sink::start()?;
                let d = OtlpConfig::default();
                let cfg = OtlpConfig {
                    endpoint: format!("http://{addr}/v1/traces"),
                    step_sampling: f.unwrap_or(d.step_sampling),
                    rank: Some(comm.rank() as i64),
                    ..d
                };
                let label = format!(
                    "the OTLP exporter (http/protobuf to a loopback sink, step sampling {})",
                    cfg.step_sampling
                );
                let ex = OtlpExporter::new(cfg)?;
                (label, collector(ex.clone()), Some(ex))
            }
            AbSink::Trace => {
                let dir = std::env::temp_dir().join(format!("occl-perf-trace-{}", std::process::id()));
                let ex = Arc::new(TraceExporter::new(TraceConfig { max_events, ..TraceConfig::new(&dir) }));
                let sink: Arc<dyn Sink> = Arc::new(KeepOpen(Telemetry::new(vec![ex.clone()]).comm_sink(meta.clone())));
                ("the HTA trace exporter (span collector)".into(), Kind::Trace(sink, ex, dir), None)
            }
        };
        Ok(BSide { label, kind, meta, otlp })
    }

    /// The event types the B sink wants, without creating one (a collector sink announces a
    /// communicator to its exporters).
    fn interest(&self) -> EventMask {
        match &self.kind {
            Kind::Counter(c) => c.interest(),
            Kind::Collector(t) => EventMask(t.exporters().iter().fold(0, |m, e| m | e.interest().0)),
            Kind::Trace(s, _, _) => s.interest(),
            Kind::Split(_) => EventMask::NONE,
        }
    }

    /// The sink of the "on" batches (none for a split: they run on the job's communicator).
    fn sink(&self) -> Option<Arc<dyn Sink>> {
        match &self.kind {
            Kind::Counter(c) => Some(c.clone()),
            Kind::Collector(t) => Some(t.comm_sink(self.meta.clone())),
            Kind::Trace(s, _, _) => Some(s.clone()),
            Kind::Split(_) => None,
        }
    }

    /// Reports what the exporter did and removes what it wrote.
    fn finish(self, lead: bool, out: &mut dyn Write) -> anyhow::Result<()> {
        if let (Some(o), true) = (&self.otlp, lead) {
            let s = o.stats();
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
        if let Kind::Split(c) = self.kind {
            c.destroy()?;
            return Ok(());
        }
        if let Kind::Trace(_, ex, dir) = self.kind {
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
}

/// How the A/B runs: rounds, calls per batch (after `warmup` untimed ones), and the B sink.
#[derive(Clone, Copy, Debug)]
pub struct Plan {
    pub rounds: usize,
    pub warmup: usize,
    pub iters: usize,
    pub sink: AbSink,
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
    // Room for every event of the run, so the trace exporter never takes the cheaper "log full" path.
    let max_events = layouts.len().max(1) * (rounds + 1) * (warmup + iters + 4) * 64;
    let b = BSide::new(which, comm, max_events)?;
    if lead {
        writeln!(out, "# events A/B: {rounds} rounds of {iters} calls with no sink / with {}", b.label)?;
        writeln!(
            out,
            "#{:>11} {:>12} {:>12} {:>9} {:>10} {:>10}",
            "size(B)", "off(us)", "on(us)", "overhead", "events/op", "ns/event"
        )?;
    }
    let mut off_bench = match &b.kind {
        Kind::Split(c) => Some(bench.on(c)),
        _ => None,
    };
    // Counts the callbacks of the types the B sink wants (ancestors included, as emitted).
    let counter = Arc::new(Counter::default());
    counter.mask.store(b.interest().with_ancestors().0, Relaxed);
    for &layout in layouts {
        // Callbacks one call makes (every rank's own count; the slowest rank's time is reported).
        let h = comm.attach_sink(counter.clone())?;
        bench.launch(layout, false)?;
        let before = counter.total();
        bench.launch(layout, false)?;
        let per_op = counter.total() - before;
        comm.detach_sink(h);
        let (mut off, mut on, mut ratio) = (Vec::new(), Vec::new(), Vec::new());
        for round in 0..rounds {
            // Off first in even rounds, on first in odd ones, so that whatever favours the first
            // or the second batch of a round (drift, the attach) weighs on both sides alike.
            let mut pair = [0.0; 2];
            for with in if round % 2 == 0 { [false, true] } else { [true, false] } {
                let h = match b.sink() {
                    Some(s) if with => Some(comm.attach_sink(s)?),
                    _ => None,
                };
                let t = match (&mut off_bench, with) {
                    (Some(o), false) => o.time(layout, false, warmup, iters)?,
                    _ => bench.time(layout, false, warmup, iters)?,
                };
                if let Some(h) = h {
                    comm.detach_sink(h);
                }
                pair[usize::from(with)] = bench.combine(t, Average::Max)?;
            }
            off.push(pair[0]);
            on.push(pair[1]);
            ratio.push(pair[1] / pair[0]);
        }
        // The overhead is the median of the rounds' own ratios: neighbouring batches share the
        // machine's state of the moment, which the two medians of all batches do not.
        let (off, on, ratio) = (median(&mut off), median(&mut on), median(&mut ratio));
        if lead {
            let ns_per_event = if per_op > 0 { (on - off) * 1e9 / per_op as f64 } else { 0.0 };
            writeln!(
                out,
                "{:>12} {:>12.2} {:>12.2} {:>8.1}% {:>10} {:>10.1}",
                layout.bytes,
                off * 1e6,
                on * 1e6,
                (ratio - 1.0) * 100.0,
                per_op,
                ns_per_event
            )?;
            out.flush()?;
        }
    }
    drop(off_bench);
    b.finish(lead, out)
}
