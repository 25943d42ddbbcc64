//! OpenTelemetry exporter: occl's spans as OTLP traces, over HTTP (`http/protobuf`, `http/json`)
//! or gRPC, configured by the standard `OTEL_*` variables ([`config`]); TLS (rustls, ring) for an
//! `https://` endpoint with the CA file of `OTEL_EXPORTER_OTLP_CERTIFICATE` or the public roots,
//! gzip with `OTEL_EXPORTER_OTLP_COMPRESSION=gzip`. A configuration it cannot use (a CA file it
//! cannot read, an unknown compression or protocol) is logged as an error saying what to set,
//! and the exporter stays off.
//! occl's metrics go as OTLP metrics by an exporter of their own ([`metrics`],
//! `OTEL_METRICS_EXPORTER=otlp`), over the same transport.
//!
//! **What is exported.** GroupApi → CollApi/P2pApi → Coll/P2p → ProxyOp, the legacy Group (as a
//! child of its GroupApi, in the same trace), KernelCh, KernelLaunch and CeColl (a copy-engine
//! call's device time, under its CollApi/P2pApi); ProxySteps as child
//! spans of their ProxyOp, sampled by `OCCL_OTEL_STEP_SAMPLING` (a fraction, default
//! [`config::DEFAULT_STEP_SAMPLING`]; 0 turns ProxyStep events off altogether); the collector
//! asks [`Exporter::keeps_step`] at a step's start, so a step not sampled is only counted.
//! Every state change is a span event. ProxyCtrl (process-wide progress-thread activity, no
//! trace to belong to) and NetPlugin (socket requests under a step) are left to the metrics and
//! trace-file exporters.
//! Names and attributes: [`crate::semconv`], the OTLP form: [`model`]. Status ERROR marks a ProxyOp that finished fewer steps than
//! planned (with step sampling on), and under occl its Coll/P2p (which stops after its
//! ProxyOps; under NCCL the Coll stops first and only the ProxyOp says so).
//!
//! **Traces.** All spans of one collective on all ranks share one trace, derived from the
//! communicator hash, the function and its sequence number; p2p trees have a trace per rank.
//! Span ids are derived from the event ids, so every parent link is exact ([`ids`]).
//!
//! **Never blocking.** [`Exporter::span`] copies the span into a bounded queue and returns; a full
//! queue drops the span and counts it. A thread of its own batches, encodes and sends, with
//! bounded retries. At the last communicator's finalize the exporter flushes, waiting at most
//! [`FLUSH_WAIT`] (or the export timeout if shorter), then logs what it exported and dropped;
//! its metrics (`occl_otlp_*`) show the same counters.

pub mod config;
mod encode;
pub use crate::ids;
mod json;
pub mod metrics;
pub mod model;
mod record;
mod resolve;
mod resource;
mod tls;
mod transport;
mod worker;

pub use config::{ConfigError, OtlpConfig, Protocol};

use crate::event::{EventId, EventType};
use crate::mask::EventMask;
use crate::metrics::{Descr, Family, Kind, Unit, Value};
use crate::spans::{CommMeta, Exporter, Span};
use record::Rec;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::mpsc::{sync_channel, SyncSender, TrySendError};
use std::sync::Arc;
use std::time::Duration;
use worker::Shared;

/// Why an exporter did not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The endpoint, its TLS certificates or the runtime cannot be used (the message says what
    /// to set).
    #[error("{0}")]
    Client(String),
    #[error("cannot start the export thread: {0}")]
    Thread(#[from] std::io::Error),
}

/// Longest a finalize (or an explicit flush) waits for the export thread.
pub const FLUSH_WAIT: Duration = Duration::from_secs(5);

/// Counters of one exporter.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OtlpStats {
    pub exported: u64,
    /// Dropped because the queue was full (the thread or the collector was slow).
    pub dropped_queue_full: u64,
    /// Dropped because the collector refused them or could not be reached.
    pub dropped_export_failed: u64,
    pub requests_ok: u64,
    pub requests_failed: u64,
}

impl OtlpStats {
    pub fn dropped(&self) -> u64 {
        self.dropped_queue_full + self.dropped_export_failed
    }
}

/// The OTLP exporter (an [`Exporter`] for [`crate::spans::Telemetry`]).
pub struct OtlpExporter {
    interest: EventMask,
    step_threshold: u64,
    /// Queue length at which producers wake the thread.
    wake_at: usize,
    flush_wait: Duration,
    endpoint: String,
    protocol: Protocol,
    tx: SyncSender<Rec>,
    sh: Arc<Shared>,
    live_comms: AtomicUsize,
}

impl OtlpExporter {
    /// The event types an exporter with `cfg` asks for.
    pub fn interest_of(cfg: &OtlpConfig) -> EventMask {
        use EventType as T;
        let types = [
            T::GroupApi,
            T::CollApi,
            T::P2pApi,
            T::Group,
            T::Coll,
            T::P2p,
            T::ProxyOp,
            T::KernelCh,
            T::KernelLaunch,
            T::CeColl,
        ];
        let m = types.into_iter().fold(EventMask::NONE, EventMask::with);
        if cfg.step_sampling > 0.0 {
            m.with(T::ProxyStep)
        } else {
            m
        }
    }

    /// Makes the client (TLS roots included) and starts the export thread.
    pub fn new(cfg: OtlpConfig) -> Result<Arc<OtlpExporter>, StartError> {
        let client = transport::Client::new(&cfg).map_err(StartError::Client)?;
        let interest = OtlpExporter::interest_of(&cfg);
        let (tx, rx) = sync_channel(cfg.max_queue.max(1));
        let sh = Arc::new(Shared::default());
        if let Some(j) = &cfg.job {
            let _ = sh.job.set(j.clone());
        }
        let e = OtlpExporter {
            interest,
            step_threshold: ids::threshold(cfg.step_sampling),
            wake_at: cfg.max_batch.max(1),
            flush_wait: FLUSH_WAIT.min(cfg.timeout.max(Duration::from_millis(100))),
            endpoint: cfg.endpoint.clone(),
            protocol: cfg.protocol,
            tx,
            sh: sh.clone(),
            live_comms: AtomicUsize::new(0),
        };
        let t = std::thread::Builder::new().name("occl-otlp".into()).spawn(move || worker::run(cfg, client, rx, sh))?;
        let _ = e.sh.thread.set(t.thread().clone());
        Ok(Arc::new(e))
    }

    /// The exporter the environment asks for, if any (a misconfiguration is logged and leaves
    /// the exporter off).
    pub fn from_env() -> Option<Arc<dyn Exporter>> {
        match OtlpConfig::from_env() {
            Ok(Some(cfg)) => match OtlpExporter::new(cfg) {
                Ok(e) => Some(e),
                Err(err) => {
                    tracing::error!("occl otlp: {err}; OpenTelemetry export is off");
                    None
                }
            },
            Ok(None) => None,
            Err(err) => {
                tracing::error!("occl otlp: {err}; OpenTelemetry export is off");
                None
            }
        }
    }

    pub fn stats(&self) -> OtlpStats {
        let s = &self.sh.stats;
        OtlpStats {
            exported: s.exported.load(Relaxed),
            dropped_queue_full: s.dropped_queue_full.load(Relaxed),
            dropped_export_failed: s.dropped_export_failed.load(Relaxed),
            requests_ok: s.requests_ok.load(Relaxed),
            requests_failed: s.requests_failed.load(Relaxed),
        }
    }

    /// Exports everything queued so far, waiting at most `limit`; `false` if that was not enough.
    pub fn flush_within(&self, limit: Duration) -> bool {
        self.sh.flush(limit)
    }
}

impl Exporter for OtlpExporter {
    fn name(&self) -> &str {
        "otlp"
    }

    fn interest(&self) -> EventMask {
        self.interest
    }

    fn comm_init(&self, comm: &Arc<CommMeta>) {
        let _ = self.sh.job.set(format!("{:016x}", comm.hash));
        self.live_comms.fetch_add(1, Relaxed);
    }

    fn keeps_step(&self, id: EventId) -> bool {
        ids::sampled(id.get(), self.step_threshold)
    }

    fn span(&self, span: &Span<'_>) {
        if span.event_type() == EventType::ProxyStep && !ids::sampled(span.id.get(), self.step_threshold) {
            return;
        }
        match self.tx.try_send(Rec::new(span)) {
            Ok(()) => {
                if self.sh.queued.fetch_add(1, Relaxed) + 1 == self.wake_at {
                    self.sh.wake();
                }
            }
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                self.sh.stats.dropped_queue_full.fetch_add(1, Relaxed);
            }
        }
    }

    fn comm_finalize(&self, comm: &Arc<CommMeta>) {
        let before = self.live_comms.fetch_update(Relaxed, Relaxed, |n| Some(n.saturating_sub(1)));
        if before.unwrap_or(0) > 1 {
            return;
        }
        let done = self.sh.flush(self.flush_wait);
        let s = self.stats();
        let msg = format!(
            "occl otlp: {} spans exported to {} ({}), {} dropped ({} queue full, {} export failed){}",
            s.exported,
            self.endpoint,
            self.protocol.name(),
            s.dropped(),
            s.dropped_queue_full,
            s.dropped_export_failed,
            if done { "" } else { "; the flush at finalize did not finish in time" }
        );
        if s.dropped() > 0 || !done {
            tracing::warn!(comm = format_args!("{:016x}", comm.hash), "{msg}");
        } else {
            tracing::info!(comm = format_args!("{:016x}", comm.hash), "{msg}");
        }
    }

    fn metrics(&self, out: &mut Vec<Family>) {
        let s = self.stats();
        let counter = |name, help, samples: &[(&'static str, &str, u64)]| {
            let mut f = Family::new(Descr::new(name, Kind::Counter, Unit::None, help));
            for &(k, v, n) in samples {
                let labels = if k.is_empty() { vec![] } else { vec![(k, v.to_string())] };
                f.push(labels, Value::Int(n));
            }
            f
        };
        out.push(counter(
            "occl_otlp_spans_exported_total",
            "Spans the OTLP exporter delivered to the collector.",
            &[("", "", s.exported)],
        ));
        out.push(counter(
            "occl_otlp_spans_dropped_total",
            "Spans the OTLP exporter dropped: queue_full (export thread or collector too slow), export_failed (collector refused or unreachable).",
            &[("reason", "queue_full", s.dropped_queue_full), ("reason", "export_failed", s.dropped_export_failed)],
        ));
        out.push(counter(
            "occl_otlp_export_requests_total",
            "OTLP export requests by result (each retry counts).",
            &[("result", "ok", s.requests_ok), ("result", "error", s.requests_failed)],
        ));
    }

    fn flush(&self) {
        self.sh.flush(self.flush_wait);
    }
}

#[cfg(test)]
mod tests;
