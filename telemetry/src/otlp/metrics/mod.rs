//! OTLP metrics: the Prometheus exporter's series (the same families, labels and values; see
//! `crate::prometheus`) sent to the collector's `/v1/metrics` (OTLP/HTTP protobuf) or
//! `MetricsService/Export` (gRPC) by a thread of their own, every `OTEL_METRIC_EXPORT_INTERVAL`
//! (default 60 s), at the last communicator's finalize and on an explicit flush; configured by
//! `OTEL_METRICS_EXPORTER=otlp` and the metrics signal's `OTEL_EXPORTER_OTLP_METRICS_*` variables
//! ([`config`]). Counters are cumulative monotonic sums from the moment the exporter started,
//! histograms explicit-bucket histograms ([`encode`]). The series come from a [`Source`] (the
//! process's Prometheus exporter, which `OTEL_METRICS_EXPORTER=otlp` turns on unless
//! `OCCL_METRICS=0`: `crate::exporters`).
//!
//! It takes no spans: its interest is only [`EventMask::OP_TOTALS`], so the Prometheus exporter
//! beside it still gets whole-operation sums, and the operation path pays nothing for it.

pub mod config;
pub mod encode;

pub use config::MetricsConfig;

use super::resource::{self, Resource};
use super::transport::{Client, GRPC_METRICS_PATH};
use super::worker::{send_retrying, Shared};
use super::FLUSH_WAIT;
use crate::mask::EventMask;
use crate::metrics::Family;
use crate::spans::{self, CommMeta, Exporter, Span};
use std::borrow::Cow;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What the export thread reads at each export.
pub type Source = Arc<dyn Fn() -> Vec<Family> + Send + Sync>;

/// Attempts per export while the collector answers with a retryable failure.
const ATTEMPTS: u32 = 3;

/// Counters of the metrics exporter.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MetricsStats {
    /// Export requests the collector accepted.
    pub exports_ok: u64,
    /// Exports given up (every attempt failed, or no client).
    pub exports_failed: u64,
}

struct Inner {
    sh: Shared,
    stop: AtomicBool,
}

/// The OTLP metrics exporter (an [`Exporter`] for [`crate::spans::Telemetry`]).
pub struct OtlpMetricsExporter {
    inner: Arc<Inner>,
    live_comms: AtomicUsize,
    flush_wait: Duration,
}

impl OtlpMetricsExporter {
    /// Starts the export thread, which reads `source`.
    pub fn new(cfg: MetricsConfig, source: Source) -> std::io::Result<Arc<OtlpMetricsExporter>> {
        let inner = Arc::new(Inner { sh: Shared::default(), stop: AtomicBool::new(false) });
        if let Some(j) = &cfg.otlp.job {
            let _ = inner.sh.job.set(j.clone());
        }
        let flush_wait = FLUSH_WAIT.min(cfg.otlp.timeout.max(Duration::from_millis(100)));
        let i = inner.clone();
        let t = std::thread::Builder::new().name("occl-otlp-metrics".into()).spawn(move || run(cfg, source, &i))?;
        let _ = inner.sh.thread.set(t.thread().clone());
        Ok(Arc::new(OtlpMetricsExporter { inner, live_comms: AtomicUsize::new(0), flush_wait }))
    }

    /// The exporter the environment asks for ([`MetricsConfig::from_env`]), reading `source`; a
    /// misconfiguration is logged and leaves it off.
    pub fn from_config(cfg: Result<Option<MetricsConfig>, super::ConfigError>, source: Source) -> Option<Arc<Self>> {
        match cfg {
            Ok(Some(cfg)) => OtlpMetricsExporter::new(cfg, source)
                .map_err(|e| tracing::warn!("occl otlp: cannot start the metrics export thread: {e}"))
                .ok(),
            Ok(None) => None,
            Err(e) => {
                tracing::warn!("occl otlp: {e}; OTLP metrics are off");
                None
            }
        }
    }

    pub fn stats(&self) -> MetricsStats {
        let s = &self.inner.sh.stats;
        MetricsStats { exports_ok: s.requests_ok.load(Relaxed), exports_failed: s.dropped_export_failed.load(Relaxed) }
    }

    /// Exports the series as they are now, waiting at most `limit`; `false` if that was not
    /// enough.
    pub fn flush_within(&self, limit: Duration) -> bool {
        self.inner.sh.flush(limit)
    }
}

impl Drop for OtlpMetricsExporter {
    fn drop(&mut self) {
        self.inner.stop.store(true, Relaxed);
        self.inner.sh.wake();
    }
}

impl Exporter for OtlpMetricsExporter {
    fn name(&self) -> &str {
        "otlp-metrics"
    }

    fn interest(&self) -> EventMask {
        EventMask::OP_TOTALS
    }

    fn span(&self, _: &Span<'_>) {}

    fn comm_init(&self, comm: &Arc<CommMeta>) {
        let _ = self.inner.sh.job.set(format!("{:016x}", comm.hash));
        self.live_comms.fetch_add(1, Relaxed);
    }

    fn comm_finalize(&self, _: &Arc<CommMeta>) {
        let before = self.live_comms.fetch_update(Relaxed, Relaxed, |n| Some(n.saturating_sub(1)));
        if before.unwrap_or(0) <= 1 && !self.inner.sh.flush(self.flush_wait) {
            tracing::warn!("occl otlp: the metrics export at finalize did not finish in time");
        }
    }

    fn flush(&self) {
        self.inner.sh.flush(self.flush_wait);
    }
}

/// The resource of this process's metrics: the launcher's rank if it gives one; else the
/// instance is the host and pid (the series carry each communicator rank as a label).
fn process_resource(cfg: &MetricsConfig, job: &str) -> Resource {
    let c = &cfg.otlp;
    let host = resource::host_name();
    let mut r = resource::resource(&c.service_name, job, c.rank.unwrap_or(-1), &host, &c.resource);
    if c.rank.is_none() {
        let id = super::model::Val::Str(Cow::Owned(format!("{job}/{host}/{}", std::process::id())));
        for (k, v) in r.attrs.iter_mut() {
            if k == "service.instance.id" && !c.resource.iter().any(|(rk, _)| rk == "service.instance.id") {
                *v = id.clone();
            }
        }
        r.attrs.retain(|(k, _)| k != "occl.rank");
    }
    r
}

fn run(cfg: MetricsConfig, source: Source, inner: &Inner) {
    let mut client = match Client::for_signal(&cfg.otlp, GRPC_METRICS_PATH) {
        Ok(c) => Some(c),
        Err(e) => {
            tracing::warn!("occl otlp: cannot export metrics ({e})");
            None
        }
    };
    let start_ns = spans::unix_nanos();
    let mut next = Instant::now() + cfg.interval;
    let mut flushed = 0u64;
    let mut last_warn: Option<Instant> = None;
    loop {
        let stop = inner.stop.load(Relaxed);
        let ticket = inner.sh.flush_requested();
        let now = Instant::now();
        if stop || ticket > flushed || now >= next {
            let families = source();
            if families.iter().any(|f| !f.samples.is_empty()) {
                let job = inner.sh.job.get().map_or("unknown", String::as_str);
                let body = encode::request(
                    &families,
                    &process_resource(&cfg, job),
                    env!("CARGO_PKG_VERSION"),
                    start_ns,
                    spans::unix_nanos(),
                );
                if let Err(e) = export(client.as_mut(), body, &cfg, &inner.sh) {
                    if last_warn.is_none_or(|t| t.elapsed() >= Duration::from_secs(30)) {
                        last_warn = Some(Instant::now());
                        tracing::warn!("occl otlp: metrics export to {} failed ({e})", cfg.otlp.endpoint);
                    }
                }
            }
            if now >= next {
                next = now + cfg.interval;
            }
            if ticket > flushed {
                flushed = ticket;
                inner.sh.flush_done(ticket);
            }
        }
        if stop {
            return;
        }
        std::thread::park_timeout(next.saturating_duration_since(Instant::now()));
    }
}

/// One export, retried while the failure is retryable and the timeout allows.
fn export(client: Option<&mut Client>, body: Vec<u8>, cfg: &MetricsConfig, sh: &Shared) -> Result<(), String> {
    let r = match client {
        Some(c) => send_retrying(c, &body, cfg.otlp.timeout, ATTEMPTS, &sh.stats),
        None => Err("no client".into()),
    };
    if r.is_err() {
        sh.stats.dropped_export_failed.fetch_add(1, Relaxed);
    }
    r
}
