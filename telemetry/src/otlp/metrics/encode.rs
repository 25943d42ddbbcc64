//! OTLP's `ExportMetricsServiceRequest` in protobuf wire format, from a metrics snapshot (field
//! numbers from opentelemetry-proto's `metrics.proto` and `metrics_service.proto`): one resource,
//! one scope `occl`, a metric per family. Counters are cumulative monotonic sums, gauges gauges,
//! histograms explicit-bucket histograms with cumulative temporality; every point starts at
//! `start_ns` (when the counters began) and is taken at `now_ns`. A metric is named by its
//! family's name without `_total` (`occl_collective_bytes`): a Prometheus exporter of an
//! OpenTelemetry collector adds the suffix back, so the series keep their Prometheus names.
//! The tests decode what this writes with the `opentelemetry-proto` crate.

use super::super::encode::{Pb, FIXED64, LEN};
use super::super::resource::Resource;
use crate::metrics::{Family, Kind, Value};

/// `AggregationTemporality.AGGREGATION_TEMPORALITY_CUMULATIVE`.
const CUMULATIVE: u64 = 2;

impl Pb {
    fn double(&mut self, field: u32, v: f64) {
        self.tag(field, FIXED64);
        self.buf.extend_from_slice(&v.to_bits().to_le_bytes());
    }

    /// A packed repeated fixed64 or double (8 bytes each, little-endian).
    fn packed(&mut self, field: u32, words: impl ExactSizeIterator<Item = u64>) {
        self.tag(field, LEN);
        self.varint(8 * words.len() as u64);
        for w in words {
            self.buf.extend_from_slice(&w.to_le_bytes());
        }
    }

    /// A label as `KeyValue { key = 1; value = 2 { string_value = 1 } }`.
    fn label(&mut self, field: u32, k: &str, v: &str) {
        self.nested(field, |p| {
            p.string(1, k);
            p.nested(2, |p| p.bytes(1, v.as_bytes()));
        });
    }
}

/// The request body for `families` (those without samples are left out).
pub fn request(families: &[Family], resource: &Resource, scope_version: &str, start_ns: u64, now_ns: u64) -> Vec<u8> {
    let mut p = Pb { buf: Vec::with_capacity(4096) };
    // ExportMetricsServiceRequest.resource_metrics = 1.
    p.nested(1, |p| {
        // ResourceMetrics.resource = 1.
        p.resource(1, resource);
        // ResourceMetrics.scope_metrics = 2: scope = 1, metrics = 2.
        p.nested(2, |p| {
            p.scope(1, scope_version);
            for f in families.iter().filter(|f| !f.samples.is_empty()) {
                p.nested(2, |p| metric(p, f, start_ns, now_ns));
            }
        });
    });
    p.buf
}

/// `Metric { name = 1; description = 2; unit = 3; gauge = 5 | sum = 7 | histogram = 9 }`.
fn metric(p: &mut Pb, f: &Family, start_ns: u64, now_ns: u64) {
    let d = &f.descr;
    p.string(1, d.family_name());
    p.string(2, d.help);
    p.string(3, d.unit.ucum());
    let points = |p: &mut Pb| {
        for s in &f.samples {
            match &s.value {
                // HistogramDataPoint { attributes = 9; start = 2; time = 3; count = 4; sum = 5;
                // bucket_counts = 6; explicit_bounds = 7 }.
                Value::Histogram(h) => p.nested(1, |p| {
                    for (k, v) in &s.labels {
                        p.label(9, k, v);
                    }
                    p.fixed64(2, start_ns);
                    p.fixed64(3, now_ns);
                    p.fixed64(4, h.count);
                    p.double(5, h.sum);
                    let counts = h.bucket_counts();
                    p.packed(6, counts.into_iter());
                    p.packed(7, h.bounds.iter().map(|b| b.to_bits()));
                }),
                // NumberDataPoint { attributes = 7; start = 2; time = 3; as_double = 4; as_int = 6 }.
                v => p.nested(1, |p| {
                    for (k, v) in &s.labels {
                        p.label(7, k, v);
                    }
                    p.fixed64(2, start_ns);
                    p.fixed64(3, now_ns);
                    match v {
                        // sfixed64: a counter beyond i64 wraps, as its u64 would.
                        Value::Int(n) => p.fixed64(6, *n),
                        other => p.double(4, other.as_f64()),
                    }
                }),
            }
        }
    };
    match d.kind {
        // Sum { data_points = 1; aggregation_temporality = 2; is_monotonic = 3 }.
        Kind::Counter => p.nested(7, |p| {
            points(p);
            p.uint(2, CUMULATIVE);
            p.uint(3, 1);
        }),
        // Gauge { data_points = 1 }.
        Kind::Gauge => p.nested(5, points),
        // Histogram { data_points = 1; aggregation_temporality = 2 }.
        Kind::Histogram => p.nested(9, |p| {
            points(p);
            p.uint(2, CUMULATIVE);
        }),
    }
}
