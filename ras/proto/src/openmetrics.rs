//! `/metrics` in OpenMetrics 1.0 for a scraper that prefers it: the format is negotiated from the
//! request's `Accept` header ([`negotiate`]), and a merged exposition ([`crate::exposition::merge`]'s
//! output, Prometheus text 0.0.4) is rewritten as OpenMetrics ([`from_text`]). The processes of a
//! node send each other text 0.0.4 (the mesh's metrics reply), so the node's scrape is converted
//! once, after the merge.
//!
//! What changes: a counter's family is named without its `_total` (its samples keep it); a counter
//! whose name lacks `_total`, or whose shortened name another family has, and an untyped family,
//! are `unknown`; a family whose name ends in `_seconds` or `_bytes` (before `_total`) gets that
//! `# UNIT`; help text escapes `"`; timestamps are seconds, not milliseconds; `# EOF` closes it.

use crate::exposition::sample;
use std::collections::HashSet;

/// `Content-Type` of Prometheus text 0.0.4.
pub const TEXT_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";
/// `Content-Type` of OpenMetrics 1.0.
pub const OPENMETRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The exposition formats `/metrics` answers in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exposition {
    /// Prometheus text 0.0.4: plain requests, curl, and any client that does not prefer OpenMetrics.
    Text,
    OpenMetrics,
}

impl Exposition {
    pub fn content_type(self) -> &'static str {
        match self {
            Exposition::Text => TEXT_CONTENT_TYPE,
            Exposition::OpenMetrics => OPENMETRICS_CONTENT_TYPE,
        }
    }
}

/// The format for a request with `accept` (its `Accept` header): OpenMetrics when the client
/// ranks `application/openmetrics-text` (version 1.0.0 or none named) above every media range
/// text 0.0.4 would answer (`text/plain`, `text/*`, `*/*`); text on a tie and without a header.
/// Prometheus sends `application/openmetrics-text;version=1.0.0,…,text/plain;version=0.0.4;q=0.5,*/*;q=0.1`
/// (or with its own q values): OpenMetrics.
pub fn negotiate(accept: Option<&str>) -> Exposition {
    let (mut om, mut text) = (0.0f64, 0.0f64);
    for range in accept.unwrap_or("").split(',') {
        let mut parts = range.split(';').map(str::trim);
        let media = parts.next().unwrap_or("").to_ascii_lowercase();
        let mut q = Some(1.0);
        let mut version = None;
        for p in parts {
            let Some((k, v)) = p.split_once('=') else { continue };
            let v = v.trim().trim_matches('"');
            match k.trim().to_ascii_lowercase().as_str() {
                "q" => q = v.parse::<f64>().ok().filter(|q| (0.0..=1.0).contains(q)),
                "version" => version = Some(v.to_string()),
                _ => {}
            }
        }
        // A range with a malformed q is ignored.
        let Some(q) = q else { continue };
        match media.as_str() {
            "application/openmetrics-text" if version.as_deref().is_none_or(|v| v == "1.0.0") => om = om.max(q),
            "text/plain" | "text/*" | "*/*" => text = text.max(q),
            _ => {}
        }
    }
    if om > 0.0 && om > text {
        Exposition::OpenMetrics
    } else {
        Exposition::Text
    }
}

/// OpenMetrics' type for a 0.0.4 family `name` of type `ty`, and its family name.
fn om_family<'a>(name: &'a str, ty: &str, declared: &HashSet<&str>) -> (&'a str, &'static str) {
    match ty {
        "counter" => match name.strip_suffix("_total") {
            Some(f) if !f.is_empty() && !declared.contains(f) => (f, "counter"),
            _ => (name, "unknown"),
        },
        "gauge" => (name, "gauge"),
        "histogram" => (name, "histogram"),
        "summary" => (name, "summary"),
        _ => (name, "unknown"),
    }
}

/// A merged text 0.0.4 exposition (every family has its `# TYPE`, after its `# HELP` if any, before
/// its samples) as OpenMetrics 1.0, with its `# EOF`. Lines that are neither metadata nor a sample
/// are left out.
pub fn from_text(text: &str) -> String {
    let declared: HashSet<&str> =
        text.lines().filter_map(|l| l.strip_prefix("# TYPE ")?.split(' ').next()).filter(|n| !n.is_empty()).collect();
    let mut out = String::with_capacity(text.len() + text.len() / 16 + 8);
    let mut help: Option<(&str, &str)> = None;
    for line in text.lines() {
        if let Some(h) = line.strip_prefix("# HELP ") {
            help = Some(h.split_once(' ').unwrap_or((h, "")));
            continue;
        }
        if let Some(t) = line.strip_prefix("# TYPE ") {
            let (name, ty) = t.split_once(' ').unwrap_or((t, "untyped"));
            let (fam, om_ty) = om_family(name, ty, &declared);
            out.push_str(&format!("# TYPE {fam} {om_ty}\n"));
            if om_ty != "unknown" {
                if let Some(unit) = ["seconds", "bytes"].into_iter().find(|u| fam.ends_with(&format!("_{u}"))) {
                    out.push_str(&format!("# UNIT {fam} {unit}\n"));
                }
            }
            if let Some((_, h)) = help.take().filter(|(n, _)| *n == name) {
                // 0.0.4 escapes only `\\` and `\n` in help text; OpenMetrics also `"`.
                out.push_str(&format!("# HELP {fam} {}\n", h.replace('"', "\\\"")));
            }
            continue;
        }
        let Some(s) = sample(line) else { continue };
        let head = &line[..line.len() - s.rest.len()];
        let mut fields = s.rest.split(' ').filter(|f| !f.is_empty());
        let (Some(value), ts) = (fields.next(), fields.next()) else { continue };
        out.push_str(head.trim_end());
        out.push(' ');
        out.push_str(value);
        if let Some(ms) = ts.and_then(|t| t.parse::<i64>().ok()) {
            let sign = if ms < 0 { "-" } else { "" };
            let ms = ms.unsigned_abs();
            out.push_str(&format!(" {sign}{}.{:03}", ms / 1000, ms % 1000));
        }
        out.push('\n');
    }
    out.push_str("# EOF\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prometheus_gets_openmetrics_and_everyone_else_text() {
        let om = Exposition::OpenMetrics;
        let text = Exposition::Text;
        // Prometheus 2 and 3, as they send it by default.
        let p2 = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,\
                  text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
        let p3 = "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.6,\
                  application/openmetrics-text;version=0.0.1;q=0.5,text/plain;version=1.0.0;escaping=allow-utf-8;q=0.4,\
                  text/plain;version=0.0.4;q=0.3,*/*;q=0.2";
        assert_eq!(negotiate(Some(p2)), om);
        assert_eq!(negotiate(Some(p3)), om);
        // A Prometheus told to prefer the classic text.
        assert_eq!(negotiate(Some("text/plain;version=0.0.4;q=0.5,application/openmetrics-text;q=0.4")), text);
        // curl, a browser, no header, an empty one.
        assert_eq!(negotiate(Some("*/*")), text);
        assert_eq!(negotiate(Some("text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8")), text);
        assert_eq!(negotiate(None), text);
        assert_eq!(negotiate(Some("")), text);
        // OpenMetrics alone, in any case, with spaces; a tie goes to text.
        assert_eq!(negotiate(Some(" Application/OpenMetrics-Text ; Version=\"1.0.0\" ")), om);
        assert_eq!(negotiate(Some("application/openmetrics-text,*/*")), text);
        // A version this server does not write, q=0, or a malformed q: not OpenMetrics.
        assert_eq!(negotiate(Some("application/openmetrics-text;version=0.0.1")), text);
        assert_eq!(negotiate(Some("application/openmetrics-text;q=0,text/plain;q=0.1")), text);
        assert_eq!(negotiate(Some("application/openmetrics-text;q=high")), text);
        assert_eq!(om.content_type(), "application/openmetrics-text; version=1.0.0; charset=utf-8");
    }

    const TEXT: &str = "\
# HELP occl_ras_peers Processes \"by\" state \\\\ x.
# TYPE occl_ras_peers gauge
occl_ras_peers{state=\"alive\"} 2
# HELP occl_collective_bytes_total Bytes.
# TYPE occl_collective_bytes_total counter
occl_collective_bytes_total{job=\"j\",pid=\"1\",rank=\"0\",comm_name=\"a b} c\"} 4000
# TYPE occl_d_seconds histogram
occl_d_seconds_bucket{le=\"0.5\"} 1
occl_d_seconds_bucket{le=\"+Inf\"} 2
occl_d_seconds_sum 1.5
occl_d_seconds_count 2
# TYPE occl_odd counter
occl_odd 3 1700000000123
# TYPE occl_x untyped
occl_x 1
# TYPE occl_y gauge
occl_y 1
# TYPE occl_y_total counter
occl_y_total 1
";

    #[test]
    fn a_merged_scrape_becomes_openmetrics() {
        let om = from_text(TEXT);
        let want = "\
# TYPE occl_ras_peers gauge
# HELP occl_ras_peers Processes \\\"by\\\" state \\\\ x.
occl_ras_peers{state=\"alive\"} 2
# TYPE occl_collective_bytes counter
# UNIT occl_collective_bytes bytes
# HELP occl_collective_bytes Bytes.
occl_collective_bytes_total{job=\"j\",pid=\"1\",rank=\"0\",comm_name=\"a b} c\"} 4000
# TYPE occl_d_seconds histogram
# UNIT occl_d_seconds seconds
occl_d_seconds_bucket{le=\"0.5\"} 1
occl_d_seconds_bucket{le=\"+Inf\"} 2
occl_d_seconds_sum 1.5
occl_d_seconds_count 2
# TYPE occl_odd unknown
occl_odd 3 1700000000.123
# TYPE occl_x unknown
occl_x 1
# TYPE occl_y gauge
occl_y 1
# TYPE occl_y_total unknown
occl_y_total 1
# EOF
";
        assert_eq!(om, want);
        assert_eq!(from_text(""), "# EOF\n");
    }
}
