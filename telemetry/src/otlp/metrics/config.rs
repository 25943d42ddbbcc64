//! The metrics signal's configuration: `OTEL_METRICS_EXPORTER` (`otlp` turns it on; unset or
//! without `otlp`, it is off: a collector that only receives traces gets no metrics requests it
//! would refuse), `OTEL_METRIC_EXPORT_INTERVAL` (ms, default 60000), and the OTLP exporter's
//! variables with the metrics signal's own (`OTEL_EXPORTER_OTLP_METRICS_ENDPOINT`, `_PROTOCOL`,
//! `_HEADERS`, `_TIMEOUT`, …) in place of the traces signal's.
//!
//! The common variables are read by [`OtlpConfig::from_lookup`] itself, through a lookup that
//! answers each `OTEL_EXPORTER_OTLP_TRACES_*` question with the `…_METRICS_*` variable, so both
//! signals read every setting the same way.

use crate::otlp::config::{ConfigError, OtlpConfig, Protocol};
use std::time::Duration;

/// Default `OTEL_METRIC_EXPORT_INTERVAL`.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(60);
/// The shortest export interval taken (a smaller one is raised to it).
pub const MIN_INTERVAL: Duration = Duration::from_millis(100);

#[derive(Clone, Debug, PartialEq)]
pub struct MetricsConfig {
    /// Endpoint (the full URL for HTTP, `…/v1/metrics`), protocol, headers, timeout and resource.
    pub otlp: OtlpConfig,
    /// Time between exports.
    pub interval: Duration,
}

const TRACES: &str = "OTEL_EXPORTER_OTLP_TRACES_";
const METRICS: &str = "OTEL_EXPORTER_OTLP_METRICS_";

impl MetricsConfig {
    /// The configuration the environment asks for: `Ok(None)` when metrics export is off.
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Option<MetricsConfig>, ConfigError> {
        let get = |k: &str| get(k).filter(|v| !v.trim().is_empty());
        if get("OTEL_SDK_DISABLED").is_some_and(|v| v.trim().eq_ignore_ascii_case("true")) {
            return Ok(None);
        }
        if !get("OTEL_METRICS_EXPORTER").is_some_and(|l| l.split(',').any(|e| e.trim() == "otlp")) {
            return Ok(None);
        }
        let protocol = match get("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL").or_else(|| get("OTEL_EXPORTER_OTLP_PROTOCOL")) {
            Some(p) => Protocol::parse(&p)?,
            None => Protocol::HttpProtobuf,
        };
        if protocol == Protocol::HttpJson {
            tracing::warn!("occl otlp: metrics are sent as http/protobuf (http/json is for traces only)");
        }
        let endpoint = match (get("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"), get("OTEL_EXPORTER_OTLP_ENDPOINT")) {
            (Some(m), _) => m.trim().to_string(),
            (None, Some(b)) if protocol == Protocol::Grpc => b.trim().to_string(),
            (None, Some(b)) => format!("{}/v1/metrics", b.trim().trim_end_matches('/')),
            (None, None) if protocol == Protocol::Grpc => "http://localhost:4317".into(),
            (None, None) => "http://localhost:4318/v1/metrics".into(),
        };
        let mapped = |k: &str| -> Option<String> {
            match k {
                "OTEL_TRACES_EXPORTER" => None,
                "OCCL_OTEL" => Some("1".into()),
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT" => Some(endpoint.clone()),
                "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL" => Some(match protocol {
                    Protocol::Grpc => "grpc".into(),
                    _ => "http/protobuf".into(),
                }),
                _ => match k.strip_prefix(TRACES) {
                    Some(rest) => get(&format!("{METRICS}{rest}")),
                    None => get(k),
                },
            }
        };
        let Some(otlp) = OtlpConfig::from_lookup(mapped)? else { return Ok(None) };
        let interval = match get("OTEL_METRIC_EXPORT_INTERVAL") {
            None => DEFAULT_INTERVAL,
            Some(v) => match v.trim().parse::<u64>() {
                Ok(ms) if ms <= 86_400_000 => Duration::from_millis(ms).max(MIN_INTERVAL),
                _ => {
                    return Err(ConfigError::Value {
                        var: "OTEL_METRIC_EXPORT_INTERVAL",
                        value: v,
                        what: "a whole number of milliseconds up to 86400000 (a day)",
                    })
                }
            },
        };
        Ok(Some(MetricsConfig { otlp, interval }))
    }

    pub fn from_env() -> Result<Option<MetricsConfig>, ConfigError> {
        MetricsConfig::from_lookup(|k| std::env::var(k).ok())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn cfg(vars: &[(&str, &str)]) -> Result<Option<MetricsConfig>, ConfigError> {
        let m: HashMap<String, String> = vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        MetricsConfig::from_lookup(|k| m.get(k).cloned())
    }

    fn on(vars: &[(&str, &str)]) -> MetricsConfig {
        let mut v = vec![("OTEL_METRICS_EXPORTER", "otlp")];
        v.extend_from_slice(vars);
        cfg(&v).expect("valid").expect("on")
    }

    #[test]
    fn on_only_when_asked_and_off_by_the_standard_switches() {
        assert_eq!(cfg(&[]), Ok(None));
        assert_eq!(cfg(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318")]), Ok(None), "traces only");
        assert_eq!(cfg(&[("OTEL_METRICS_EXPORTER", "none")]), Ok(None));
        assert_eq!(cfg(&[("OTEL_METRICS_EXPORTER", "otlp"), ("OTEL_SDK_DISABLED", "true")]), Ok(None));
        let c = on(&[("OTEL_TRACES_EXPORTER", "none")]);
        assert_eq!(c.otlp.endpoint, "http://localhost:4318/v1/metrics");
        assert_eq!(c.interval, DEFAULT_INTERVAL);
        assert!(cfg(&[("OTEL_METRICS_EXPORTER", "console,otlp")]).expect("ok").is_some());
    }

    #[test]
    fn the_metrics_signal_has_its_own_endpoint_and_settings() {
        let b = ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318/");
        assert_eq!(on(&[b]).otlp.endpoint, "http://c:4318/v1/metrics");
        let m = ("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "http://m:9/x");
        let t = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://t:9/y");
        assert_eq!(on(&[b, m, t]).otlp.endpoint, "http://m:9/x");
        let g = on(&[b, ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")]).otlp;
        assert_eq!((g.protocol, g.endpoint.as_str()), (Protocol::Grpc, "http://c:4318/"));
        let c = on(&[
            ("OTEL_EXPORTER_OTLP_HEADERS", "a=1,b=2"),
            ("OTEL_EXPORTER_OTLP_METRICS_HEADERS", "b=3"),
            ("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "c=4"),
            ("OTEL_EXPORTER_OTLP_METRICS_TIMEOUT", "1500"),
            ("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "9000"),
            ("OTEL_METRIC_EXPORT_INTERVAL", "5"),
        ]);
        let h: Vec<(&str, &str)> = c.otlp.headers.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        assert_eq!(h, [("a", "1"), ("b", "3")]);
        assert_eq!(c.otlp.timeout, Duration::from_millis(1500));
        assert_eq!(c.interval, MIN_INTERVAL);
        assert_eq!(on(&[("OTEL_METRIC_EXPORT_INTERVAL", "2500")]).interval, Duration::from_millis(2500));
        assert!(cfg(&[("OTEL_METRICS_EXPORTER", "otlp"), ("OTEL_METRIC_EXPORT_INTERVAL", "soon")]).is_err());
        assert_eq!(on(&[("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL", "http/json")]).otlp.protocol, Protocol::HttpProtobuf);
    }
}
