//! A snapshot of metrics, independent of how they are exposed: families (name, type, unit, help)
//! with their samples (labels and a value: an integer, a float, or a histogram's cumulative
//! buckets, sum and count), in base units (seconds, bytes). The exporters build one from their
//! counters in one pass ([`crate::spans::Exporter::metrics`]); it is written as Prometheus text
//! 0.0.4 or OpenMetrics 1.0 ([`text`]), handed to a `prometheus-client` registry (`client`,
//! feature `prometheus-client`) or sent as OTLP metrics (`crate::otlp::metrics`).
//!
//! Names follow Prometheus: a counter's name ends in `_total`, a family with a unit ends in
//! `_<unit>` before that (`occl_collective_bytes_total`: counter, unit bytes). Formats that
//! append those suffixes themselves (OpenMetrics' family names, `prometheus-client`) take them
//! off with [`Descr::base_name`].

#[cfg(feature = "prometheus-client")]
pub mod client;
pub mod text;

/// A family's type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Only ever grows (from the process's start); its name ends in `_total`.
    Counter,
    Gauge,
    /// Cumulative buckets over fixed bounds, with the sum and count of the observations.
    Histogram,
}

impl Kind {
    /// The name both text formats use.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }
}

/// A family's unit (base units only).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unit {
    None,
    Seconds,
    Bytes,
}

impl Unit {
    /// The name OpenMetrics' `# UNIT` and the family name's suffix use ("" for none).
    pub fn name(self) -> &'static str {
        match self {
            Unit::None => "",
            Unit::Seconds => "seconds",
            Unit::Bytes => "bytes",
        }
    }

    /// The UCUM code OTLP's `unit` field takes ("" for none).
    pub fn ucum(self) -> &'static str {
        match self {
            Unit::None => "",
            Unit::Seconds => "s",
            Unit::Bytes => "By",
        }
    }
}

/// What a family is: its full Prometheus name, type, unit and help text (one line).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Descr {
    pub name: &'static str,
    pub kind: Kind,
    pub unit: Unit,
    pub help: &'static str,
}

impl Descr {
    pub const fn new(name: &'static str, kind: Kind, unit: Unit, help: &'static str) -> Descr {
        Descr { name, kind, unit, help }
    }

    /// The name without the counter's `_total`: OpenMetrics' family name.
    pub fn family_name(&self) -> &'static str {
        match self.kind {
            Kind::Counter => self.name.strip_suffix("_total").unwrap_or(self.name),
            _ => self.name,
        }
    }

    /// The family name without its unit's suffix too (what `prometheus-client` adds back).
    pub fn base_name(&self) -> &'static str {
        let f = self.family_name();
        match self.unit {
            Unit::None => f,
            u => f.strip_suffix(u.name()).and_then(|b| b.strip_suffix('_')).unwrap_or(f),
        }
    }
}

/// A histogram's state: `cumulative[i]` observations at or below `bounds[i]`; `count` is the
/// `+Inf` bucket.
#[derive(Clone, Debug, PartialEq)]
pub struct Histogram {
    pub bounds: Vec<f64>,
    pub cumulative: Vec<u64>,
    pub count: u64,
    pub sum: f64,
}

impl Histogram {
    /// Observations per bucket (not cumulative), the last above every bound: OTLP's
    /// `bucket_counts`.
    pub fn bucket_counts(&self) -> Vec<u64> {
        let mut prev = 0u64;
        let mut v: Vec<u64> = self
            .cumulative
            .iter()
            .map(|&c| {
                let d = c.wrapping_sub(prev);
                prev = c;
                d
            })
            .collect();
        v.push(self.count.wrapping_sub(prev));
        v
    }
}

#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    Int(u64),
    Float(f64),
    Histogram(Histogram),
}

impl Value {
    /// The value as a float (a histogram's sum).
    pub fn as_f64(&self) -> f64 {
        match self {
            Value::Int(v) => *v as f64,
            Value::Float(v) => *v,
            Value::Histogram(h) => h.sum,
        }
    }
}

/// One series: label pairs in output order, and its value.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    pub labels: Vec<(&'static str, String)>,
    pub value: Value,
}

/// A family and its samples (a family without samples is not written).
#[derive(Clone, Debug, PartialEq)]
pub struct Family {
    pub descr: Descr,
    pub samples: Vec<Sample>,
}

impl Family {
    pub fn new(descr: Descr) -> Family {
        Family { descr, samples: Vec::new() }
    }

    pub fn push(&mut self, labels: Vec<(&'static str, String)>, value: Value) {
        self.samples.push(Sample { labels, value });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_lose_their_suffixes_in_order() {
        let d = Descr::new("occl_x_bytes_total", Kind::Counter, Unit::Bytes, "x");
        assert_eq!((d.family_name(), d.base_name()), ("occl_x_bytes", "occl_x"));
        let d = Descr::new("occl_d_seconds", Kind::Histogram, Unit::Seconds, "d");
        assert_eq!((d.family_name(), d.base_name()), ("occl_d_seconds", "occl_d"));
        let d = Descr::new("occl_n_total", Kind::Counter, Unit::None, "n");
        assert_eq!((d.family_name(), d.base_name()), ("occl_n", "occl_n"));
        let h = Histogram { bounds: vec![1.0, 2.0], cumulative: vec![1, 3], count: 4, sum: 7.0 };
        assert_eq!(h.bucket_counts(), [1, 2, 1]);
    }
}
