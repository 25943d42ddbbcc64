//! The exporters the environment turns on (Prometheus; OTLP and trace files when built with the
//! `otlp` and `trace` features), and the process's collector built from them. Above the span collector and the exporters, so that neither
//! names the other's concrete types: each exporter module adds its own line here.

use crate::spans::{Exporter, Telemetry};
use crate::Profiler;
use std::sync::{Arc, OnceLock};

/// The exporters that the process environment enables, in a fixed order.
pub fn from_env() -> Vec<Arc<dyn Exporter>> {
    let mut v: Vec<Arc<dyn Exporter>> = Vec::new();
    v.extend(crate::prometheus::from_env());
    #[cfg(feature = "otlp")]
    v.extend(crate::otlp::OtlpExporter::from_env());
    #[cfg(feature = "trace")]
    v.extend(crate::trace::TraceExporter::from_env().map(|e| Arc::new(e) as Arc<dyn Exporter>));
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
