//! Which exporters the environment turns on. Each exporter module adds its own line here; with
//! none enabled, [`super::Telemetry::global`] is `None` and nothing is collected.

use super::Exporter;
use std::sync::Arc;

/// The exporters that the process environment enables, in a fixed order.
pub fn exporters_from_env() -> Vec<Arc<dyn Exporter>> {
    let mut v: Vec<Arc<dyn Exporter>> = Vec::new();
    v.extend(crate::prometheus::from_env());
    v.extend(crate::otlp::OtlpExporter::from_env());
    v.extend(crate::trace::TraceExporter::from_env().map(|e| Arc::new(e) as Arc<dyn Exporter>));
    v
}
