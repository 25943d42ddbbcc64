//! occl's metrics in an application's `prometheus-client` registry (feature `prometheus-client`):
//! a [`Collector`] that takes a snapshot at each encode and hands every family to the registry's
//! encoder, which writes it in the registry's format (OpenMetrics or Prometheus text) beside the
//! application's own metrics.
//!
//! ```ignore
//! let mut registry = prometheus_client::registry::Registry::default();
//! registry.register_collector(Box::new(occl::telemetry::exporters::collector()));
//! ```
//!
//! The encoder adds a counter's `_total` and a unit's suffix itself, so each family goes to it by
//! its base name ([`super::Descr::base_name`]); the series come out with the names Prometheus
//! scrapes of occl have. A registry with a prefix prefixes occl's names too.

use super::{Family, Kind, Unit, Value};
use prometheus_client::collector::Collector as PcCollector;
use prometheus_client::encoding::{DescriptorEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry;
use std::fmt;
use std::sync::Arc;

/// What the collector reads at each encode.
pub type Source = Arc<dyn Fn() -> Vec<Family> + Send + Sync>;

/// A `prometheus_client` collector of the families `source` returns.
#[derive(Clone)]
pub struct Collector {
    source: Source,
}

impl fmt::Debug for Collector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("occl metrics collector")
    }
}

impl Collector {
    pub fn new(source: Source) -> Collector {
        Collector { source }
    }
}

fn unit(u: Unit) -> Option<registry::Unit> {
    match u {
        Unit::None => None,
        Unit::Seconds => Some(registry::Unit::Seconds),
        Unit::Bytes => Some(registry::Unit::Bytes),
    }
}

/// Writes `families` through `encoder` (families without samples are left out).
pub fn encode(families: &[Family], mut encoder: DescriptorEncoder<'_>) -> fmt::Result {
    for f in families.iter().filter(|f| !f.samples.is_empty()) {
        let d = &f.descr;
        let u = unit(d.unit);
        let ty = match d.kind {
            Kind::Counter => MetricType::Counter,
            Kind::Gauge => MetricType::Gauge,
            Kind::Histogram => MetricType::Histogram,
        };
        let mut m = encoder.encode_descriptor(d.base_name(), d.help, u.as_ref(), ty)?;
        for s in &f.samples {
            let labels: Vec<(&str, &str)> = s.labels.iter().map(|(k, v)| (*k, v.as_str())).collect();
            let mut e = m.encode_family(&labels)?;
            match (&s.value, d.kind) {
                (Value::Histogram(h), _) => {
                    // Per-bucket counts: the encoder makes them cumulative, and adds +Inf.
                    let counts = h.bucket_counts();
                    let buckets: Vec<(f64, u64)> =
                        h.bounds.iter().copied().chain([f64::INFINITY]).zip(counts).collect();
                    e.encode_histogram::<NoLabelSet>(h.sum, h.count, &buckets, None)?;
                }
                (Value::Int(v), Kind::Counter) => e.encode_counter::<NoLabelSet, _, u64>(v, None)?,
                (Value::Float(v), Kind::Counter) => e.encode_counter::<NoLabelSet, _, u64>(v, None)?,
                (Value::Int(v), _) => e.encode_gauge(v)?,
                (Value::Float(v), _) => e.encode_gauge(v)?,
            }
        }
    }
    Ok(())
}

impl PcCollector for Collector {
    fn encode(&self, encoder: DescriptorEncoder<'_>) -> fmt::Result {
        encode(&(self.source)(), encoder)
    }
}
