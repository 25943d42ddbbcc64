//! A snapshot as text: Prometheus exposition format 0.0.4, or OpenMetrics 1.0. Both write one
//! block of metadata per family and every sample of a family together, and leave out families
//! without samples; sample lines are the same in both (`name{labels} value`, histograms as
//! `_bucket`, `_sum`, `_count`). OpenMetrics differs in its metadata: a counter's family is named
//! without `_total`, a `# UNIT` line names the unit, help text escapes `"` too, and the exposition
//! ends with `# EOF` ([`openmetrics`]).

use super::{Family, Kind, Value};
use std::fmt::Write as _;

/// `Content-Type` of [`Format::Text`].
pub const TEXT_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";
/// `Content-Type` of [`Format::OpenMetrics`].
pub const OPENMETRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// Prometheus text exposition format 0.0.4.
    Text,
    /// OpenMetrics 1.0 text, without its closing `# EOF` (several writers may share one
    /// exposition; [`openmetrics`] closes it).
    OpenMetrics,
}

/// Appends `v` escaped: backslash and newline always, the double quote in label values (and in
/// OpenMetrics help text).
fn escaped(out: &mut String, v: &str, quote: bool) {
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' if quote => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
}

/// A float as both formats read it (`+Inf`, `-Inf`, `NaN`; finite values in Rust's shortest
/// exact decimal, never an exponent).
fn float(out: &mut String, v: f64) {
    if v.is_nan() {
        out.push_str("NaN");
    } else if v.is_infinite() {
        out.push_str(if v > 0.0 { "+Inf" } else { "-Inf" });
    } else {
        let _ = write!(out, "{v}");
    }
}

/// One sample line: `name{labels[,le]} value`; no braces when there are no labels.
fn sample(out: &mut String, name: &str, suffix: &str, labels: &[(&str, String)], le: Option<&str>, v: &Value) {
    out.push_str(name);
    out.push_str(suffix);
    if !labels.is_empty() || le.is_some() {
        out.push('{');
        let le = le.map(|l| ("le", l));
        for (i, (k, v)) in labels.iter().map(|(k, v)| (*k, v.as_str())).chain(le).enumerate() {
            if i > 0 {
                out.push(',');
            }
            out.push_str(k);
            out.push_str("=\"");
            escaped(out, v, true);
            out.push('"');
        }
        out.push('}');
    }
    out.push(' ');
    match v {
        Value::Int(n) => {
            let _ = write!(out, "{n}");
        }
        Value::Float(f) => float(out, *f),
        Value::Histogram(h) => float(out, h.sum),
    }
    out.push('\n');
}

/// Appends `families` in `format`.
pub fn write(out: &mut String, families: &[Family], format: Format) {
    for f in families.iter().filter(|f| !f.samples.is_empty()) {
        let d = &f.descr;
        match format {
            Format::Text => {
                let _ = write!(out, "# HELP {} ", d.name);
                escaped(out, d.help, false);
                let _ = writeln!(out, "\n# TYPE {} {}", d.name, d.kind.name());
            }
            Format::OpenMetrics => {
                let fam = d.family_name();
                let _ = writeln!(out, "# TYPE {fam} {}", d.kind.name());
                let unit = d.unit.name();
                if !unit.is_empty() && fam.strip_suffix(unit).is_some_and(|b| b.ends_with('_')) {
                    let _ = writeln!(out, "# UNIT {fam} {unit}");
                }
                let _ = write!(out, "# HELP {fam} ");
                escaped(out, d.help, true);
                out.push('\n');
            }
        }
        for s in &f.samples {
            match &s.value {
                Value::Histogram(h) if d.kind == Kind::Histogram => {
                    let mut le = String::new();
                    for (b, c) in h.bounds.iter().zip(&h.cumulative) {
                        le.clear();
                        float(&mut le, *b);
                        sample(out, d.name, "_bucket", &s.labels, Some(&le), &Value::Int(*c));
                    }
                    sample(out, d.name, "_bucket", &s.labels, Some("+Inf"), &Value::Int(h.count));
                    sample(out, d.name, "_sum", &s.labels, None, &Value::Float(h.sum));
                    sample(out, d.name, "_count", &s.labels, None, &Value::Int(h.count));
                }
                v => sample(out, d.name, "", &s.labels, None, v),
            }
        }
    }
}

/// `families` as one whole OpenMetrics exposition (with its `# EOF`).
pub fn openmetrics(families: &[Family]) -> String {
    let mut s = String::new();
    write(&mut s, families, Format::OpenMetrics);
    s.push_str("# EOF\n");
    s
}

#[cfg(test)]
mod tests {
    use super::super::{Descr, Histogram, Unit};
    use super::*;

    fn families() -> Vec<Family> {
        let mut c = Family::new(Descr::new("occl_b_bytes_total", Kind::Counter, Unit::Bytes, "Bytes \"moved\" \\ so."));
        c.push(vec![("comm", "ab".into()), ("name", "a\"b\nc".into())], Value::Int(7));
        let mut g = Family::new(Descr::new("occl_g", Kind::Gauge, Unit::None, "A gauge."));
        g.push(vec![], Value::Float(f64::INFINITY));
        let mut h = Family::new(Descr::new("occl_d_seconds", Kind::Histogram, Unit::Seconds, "Durations."));
        let hist = Histogram { bounds: vec![0.000001, 0.5], cumulative: vec![1, 2], count: 3, sum: 2.5 };
        h.push(vec![("rank", "0".into())], Value::Histogram(hist));
        let empty = Family::new(Descr::new("occl_e_total", Kind::Counter, Unit::None, "Empty."));
        vec![c, g, h, empty]
    }

    #[test]
    fn text_0_0_4() {
        let mut s = String::new();
        write(&mut s, &families(), Format::Text);
        let want = [
            "# HELP occl_b_bytes_total Bytes \"moved\" \\\\ so.",
            "# TYPE occl_b_bytes_total counter",
            "occl_b_bytes_total{comm=\"ab\",name=\"a\\\"b\\nc\"} 7",
            "# HELP occl_g A gauge.",
            "# TYPE occl_g gauge",
            "occl_g +Inf",
            "# HELP occl_d_seconds Durations.",
            "# TYPE occl_d_seconds histogram",
            "occl_d_seconds_bucket{rank=\"0\",le=\"0.000001\"} 1",
            "occl_d_seconds_bucket{rank=\"0\",le=\"0.5\"} 2",
            "occl_d_seconds_bucket{rank=\"0\",le=\"+Inf\"} 3",
            "occl_d_seconds_sum{rank=\"0\"} 2.5",
            "occl_d_seconds_count{rank=\"0\"} 3",
        ];
        assert_eq!(s, want.map(|l| format!("{l}\n")).concat());
    }

    #[test]
    fn openmetrics_names_families_without_total_gives_units_and_ends_with_eof() {
        let s = openmetrics(&families());
        let head = [
            "# TYPE occl_b_bytes counter",
            "# UNIT occl_b_bytes bytes",
            "# HELP occl_b_bytes Bytes \\\"moved\\\" \\\\ so.",
            "occl_b_bytes_total{comm=\"ab\",name=\"a\\\"b\\nc\"} 7",
            "# TYPE occl_g gauge",
            "# HELP occl_g A gauge.",
            "occl_g +Inf",
            "# TYPE occl_d_seconds histogram",
            "# UNIT occl_d_seconds seconds",
        ];
        assert!(s.starts_with(&head.map(|l| format!("{l}\n")).concat()), "{s}");
        assert!(!s.contains("occl_e"), "no samples, no family");
        assert!(s.ends_with("occl_d_seconds_count{rank=\"0\"} 3\n# EOF\n"), "{s}");
    }
}
