//! The exporters the environment turns on (Prometheus; OTLP and trace files when built with the
//! `otlp` and `trace` features), and the process's collector built from them. Above the span collector and the exporters, so that neither
//! names the other's concrete types: each exporter module adds its own line here.

use crate::spans::{Exporter, Telemetry};
use crate::Profiler;
use std::sync::{Arc, OnceLock};

/// The exporters that the process environment enables, in a fixed order.
/// OTLP metrics (`OTEL_METRICS_EXPORTER=otlp`) export the Prometheus exporter's series (on unless
/// `OCCL_METRICS=0`), and come last, so that a communicator's finalize reaches
/// the counters before the export it triggers.
pub fn from_env() -> Vec<Arc<dyn Exporter>> {
    let mut v: Vec<Arc<dyn Exporter>> = Vec::new();
    // The one exporter the core also bumps directly (`prometheus::process`), so both routes and
    // every exposition count in the same series.
    let prom = crate::prometheus::process().cloned();
    #[cfg(feature = "otlp")]
    let otlp_metrics = crate::otlp::metrics::MetricsConfig::from_env();
    #[cfg(feature = "otlp")]
    if prom.is_none() && matches!(otlp_metrics, Ok(Some(_))) {
        tracing::warn!("occl telemetry: OTEL_METRICS_EXPORTER=otlp, but OCCL_METRICS=0 turns the counters off");
    }
    v.extend(prom.clone().map(|p| p as Arc<dyn Exporter>));
    #[cfg(feature = "otlp")]
    v.extend(crate::otlp::OtlpExporter::from_env());
    #[cfg(feature = "trace")]
    v.extend(crate::trace::TraceExporter::from_env().map(|e| Arc::new(e) as Arc<dyn Exporter>));
    #[cfg(feature = "otlp")]
    if let Some(p) = prom {
        let source: crate::otlp::metrics::Source = Arc::new(move || {
            let mut f = Vec::new();
            p.metrics(&mut f);
            f
        });
        v.extend(
            crate::otlp::metrics::OtlpMetricsExporter::from_config(otlp_metrics, source)
                .map(|e| e as Arc<dyn Exporter>),
        );
    }
    v
}

/// The profilers a process reports to unless its communicators are handed others: those
/// registered with [`crate::profiler::register`], the NCCL profiler plugin the environment names
/// ([`crate::plugin_from_env`]), and the collector of the exporters it enables ([`global`]).
pub fn process_profilers() -> Vec<Arc<dyn Profiler>> {
    let mut v = crate::profiler::registered();
    v.extend(crate::nccl::plugin_from_env());
    v.extend(global().map(|t| t.clone() as Arc<dyn Profiler>));
    v
}

/// The process's collector with the exporters the environment enables, built on first use;
/// `None` when none is enabled (nothing is collected).
pub fn global() -> Option<&'static Arc<Telemetry>> {
    static GLOBAL: OnceLock<Option<Arc<Telemetry>>> = OnceLock::new();
    GLOBAL
        .get_or_init(|| {
            let ex = from_env();
            if ex.is_empty() {
                return None;
            }
            let names: Vec<&str> = ex.iter().map(|e| e.name()).collect();
            tracing::info!("occl telemetry: exporters {}", names.join(", "));
            Some(Arc::new(Telemetry::new(ex)))
        })
        .as_ref()
}

/// A collector for an application's `prometheus-client` registry with the metrics of the
/// process's collector ([`global`]) at each scrape. It turns the Prometheus exporter on
/// ([`crate::prometheus::enable`]): call it before the first communicator is created.
#[cfg(feature = "prometheus-client")]
pub fn collector() -> crate::metrics::client::Collector {
    crate::prometheus::enable();
    crate::metrics::client::Collector::new(Arc::new(|| global().map(|t| t.metrics()).unwrap_or_default()))
}
