//! The exporter's configuration from OpenTelemetry's standard variables (OTLP exporter and batch
//! span processor specifications) plus occl's own: `OCCL_OTEL`, `OCCL_OTEL_STEP_SAMPLING`.
//!
//! Read through a lookup function so tests pass a map instead of the process environment.

use std::path::PathBuf;
use std::time::Duration;

/// The wire format and transport of an export.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    /// `http/protobuf`: POST of the binary protobuf to `…/v1/traces` (the specification's default).
    HttpProtobuf,
    /// `http/json`: the same request as OTLP/JSON.
    HttpJson,
    /// `grpc`: `TraceService/Export` over HTTP/2 (TLS for an `https://` endpoint).
    Grpc,
}

/// How request bodies are compressed (`OTEL_EXPORTER_OTLP_COMPRESSION`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Compression {
    None,
    /// `Content-Encoding: gzip` over HTTP; `grpc-encoding: gzip` and compressed messages over gRPC.
    Gzip,
}

/// The PEM file of CA certificates that a TLS collector's certificate must chain to, and the
/// variable that named it (for messages).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CaFile {
    pub var: &'static str,
    pub path: PathBuf,
}

impl Protocol {
    pub fn parse(s: &str) -> Result<Protocol, ConfigError> {
        match s.trim() {
            "http/protobuf" => Ok(Protocol::HttpProtobuf),
            "http/json" => Ok(Protocol::HttpJson),
            "grpc" => Ok(Protocol::Grpc),
            other => Err(ConfigError::Protocol(other.to_string())),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Protocol::HttpProtobuf => "http/protobuf",
            Protocol::HttpJson => "http/json",
            Protocol::Grpc => "grpc",
        }
    }
}

/// A configuration the exporter cannot run with.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConfigError {
    #[error("OTLP protocol {0:?} is not one of grpc, http/protobuf, http/json")]
    Protocol(String),
    #[error("OTLP endpoint {0:?} is not an http:// or https:// URL")]
    Endpoint(String),
    #[error("{var}={value:?} is not {what}")]
    Value { var: &'static str, value: String, what: &'static str },
}

/// Everything the exporter needs to know before it starts.
#[derive(Clone, Debug, PartialEq)]
pub struct OtlpConfig {
    pub protocol: Protocol,
    /// Where requests go: the full URL for HTTP (path included), scheme://host:port for gRPC;
    /// `https://` is TLS.
    pub endpoint: String,
    /// The CA certificates of a TLS collector (`OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE`, else
    /// `OTEL_EXPORTER_OTLP_CERTIFICATE`); without one, the Mozilla roots of `webpki-roots`.
    pub certificate: Option<CaFile>,
    pub compression: Compression,
    /// Extra request headers (`OTEL_EXPORTER_OTLP_HEADERS`, then the traces-only ones).
    pub headers: Vec<(String, String)>,
    /// Bound on one export request, connection included.
    pub timeout: Duration,
    /// Spans the queue holds before new ones are dropped.
    pub max_queue: usize,
    /// Spans per request at most; a queue this full wakes the export thread early.
    pub max_batch: usize,
    /// Time between exports of a partly filled batch.
    pub schedule_delay: Duration,
    /// Fraction of ProxySteps exported as spans (0 = none, and ProxyStep events are not asked
    /// for at all; 1 = every step).
    pub step_sampling: f64,
    /// `service.name`.
    pub service_name: String,
    /// `OTEL_RESOURCE_ATTRIBUTES`, in order, after the ones occl sets.
    pub resource: Vec<(String, String)>,
    /// Job identifier for `service.instance.id`, when the launcher gives one.
    pub job: Option<String>,
    /// This process's rank in its job, when the launcher gives one (else each communicator's).
    pub rank: Option<i64>,
}

/// Default fraction of ProxySteps exported: one in a hundred shows step timing in a long run and
/// keeps ProxyStep events on, which a ProxyOp's failure status needs. Any fraction above 0 makes
/// the span collector handle every step (the fraction only thins what is exported); 0 is the
/// cheapest setting.
pub const DEFAULT_STEP_SAMPLING: f64 = 0.01;

impl Default for OtlpConfig {
    fn default() -> Self {
        OtlpConfig {
            protocol: Protocol::HttpProtobuf,
            endpoint: "http://localhost:4318/v1/traces".into(),
            certificate: None,
            compression: Compression::None,
            headers: Vec::new(),
            timeout: Duration::from_secs(10),
            max_queue: 2048,
            max_batch: 512,
            schedule_delay: Duration::from_secs(5),
            step_sampling: DEFAULT_STEP_SAMPLING,
            service_name: "occl".into(),
            resource: Vec::new(),
            job: None,
            rank: None,
        }
    }
}

/// The longest export timeout or schedule delay, in milliseconds (a day).
const MAX_MS: u64 = 86_400_000;

const TRUE: [&str; 4] = ["1", "true", "yes", "on"];

fn truthy(v: &str) -> bool {
    TRUE.iter().any(|t| v.trim().eq_ignore_ascii_case(t))
}

/// `key=value,key=value` with percent-encoded values (the W3C baggage form the specification
/// uses for headers and resource attributes); malformed members are skipped.
pub fn parse_pairs(s: &str) -> Vec<(String, String)> {
    s.split(',')
        .filter_map(|m| {
            let (k, v) = m.split_once('=')?;
            let k = percent_decode(k.trim());
            (!k.is_empty()).then(|| (k, percent_decode(v.trim())))
        })
        .collect()
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        if b[i] == b'%' && i + 2 < b.len() {
            if let (Some(h), Some(l)) = (hex(b[i + 1]), hex(b[i + 2])) {
                out.push((h * 16 + l) as u8);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `base` + `v1/traces`, with exactly one slash between them.
fn traces_url(base: &str) -> String {
    format!("{}/v1/traces", base.trim_end_matches('/'))
}

impl OtlpConfig {
    /// The configuration the environment asks for: `Ok(None)` when the exporter is not enabled
    /// (no endpoint and no `OCCL_OTEL=1`, or `OTEL_SDK_DISABLED=true`, or `OTEL_TRACES_EXPORTER`
    /// without `otlp`), an error when it is enabled but misconfigured.
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Option<OtlpConfig>, ConfigError> {
        let get = |k: &str| get(k).filter(|v| !v.trim().is_empty());
        if get("OTEL_SDK_DISABLED").is_some_and(|v| v.trim().eq_ignore_ascii_case("true")) {
            return Ok(None);
        }
        if let Some(list) = get("OTEL_TRACES_EXPORTER") {
            if !list.split(',').any(|e| e.trim() == "otlp") {
                return Ok(None);
            }
        }
        let occl = get("OCCL_OTEL");
        let traces_ep = get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT");
        let base_ep = get("OTEL_EXPORTER_OTLP_ENDPOINT");
        let asked = occl.as_deref().map(truthy);
        if asked == Some(false) || (asked.is_none() && traces_ep.is_none() && base_ep.is_none()) {
            return Ok(None);
        }
        let protocol = match get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL").or_else(|| get("OTEL_EXPORTER_OTLP_PROTOCOL")) {
            Some(p) => Protocol::parse(&p)?,
            None => Protocol::HttpProtobuf,
        };
        let endpoint = match (protocol, traces_ep, base_ep) {
            // The traces endpoint is used as it is; for gRPC the path is not used at all.
            (_, Some(t), _) => t.trim().to_string(),
            (Protocol::Grpc, None, Some(b)) => b.trim().to_string(),
            (_, None, Some(b)) => traces_url(b.trim()),
            (Protocol::Grpc, None, None) => "http://localhost:4317".into(),
            (_, None, None) => "http://localhost:4318/v1/traces".into(),
        };
        let tls = endpoint.starts_with("https://");
        if !tls && !endpoint.starts_with("http://") {
            return Err(ConfigError::Endpoint(endpoint));
        }
        let certificate = ["OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE", "OTEL_EXPORTER_OTLP_CERTIFICATE"]
            .into_iter()
            .find_map(|var| get(var).map(|p| CaFile { var, path: PathBuf::from(p.trim()) }));
        if let (Some(c), false) = (&certificate, tls) {
            tracing::warn!(
                "occl otlp: {}={} is not used: the endpoint {endpoint} is not https://",
                c.var,
                c.path.display()
            );
        }
        let compression = match ["OTEL_EXPORTER_OTLP_TRACES_COMPRESSION", "OTEL_EXPORTER_OTLP_COMPRESSION"]
            .into_iter()
            .find_map(|var| get(var).map(|v| (var, v)))
        {
            None => Compression::None,
            Some((var, v)) => match v.trim() {
                "gzip" => Compression::Gzip,
                "none" => Compression::None,
                _ => return Err(ConfigError::Value { var, value: v, what: "gzip or none" }),
            },
        };
        let mut headers = get("OTEL_EXPORTER_OTLP_HEADERS").map(|h| parse_pairs(&h)).unwrap_or_default();
        for (k, v) in get("OTEL_EXPORTER_OTLP_TRACES_HEADERS").map(|h| parse_pairs(&h)).unwrap_or_default() {
            headers.retain(|(hk, _)| !hk.eq_ignore_ascii_case(&k));
            headers.push((k, v));
        }
        let num = |var: &'static str| -> Result<Option<u64>, ConfigError> {
            get(var)
                .map(|v| {
                    v.trim().parse::<u64>().map_err(|_| ConfigError::Value { var, value: v, what: "a whole number" })
                })
                .transpose()
        };
        // Milliseconds, at most a day: every deadline `now + d` stays far inside `Instant`.
        let ms = |var: &'static str| -> Result<Option<Duration>, ConfigError> {
            match num(var)? {
                Some(n) if n > MAX_MS => Err(ConfigError::Value {
                    var,
                    value: n.to_string(),
                    what: "a whole number of milliseconds up to 86400000 (a day)",
                }),
                n => Ok(n.map(Duration::from_millis)),
            }
        };
        let d = OtlpConfig::default();
        let timeout =
            ms("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT")?.or(ms("OTEL_EXPORTER_OTLP_TIMEOUT")?).unwrap_or(d.timeout);
        let max_queue = num("OTEL_BSP_MAX_QUEUE_SIZE")?.map_or(d.max_queue, |n| n.clamp(1, 1 << 20) as usize);
        let max_batch =
            num("OTEL_BSP_MAX_EXPORT_BATCH_SIZE")?.map_or(d.max_batch, |n| n.clamp(1, 1 << 16) as usize).min(max_queue);
        let schedule_delay = ms("OTEL_BSP_SCHEDULE_DELAY")?.unwrap_or(d.schedule_delay);
        let step_sampling = match get("OCCL_OTEL_STEP_SAMPLING") {
            None => DEFAULT_STEP_SAMPLING,
            Some(v) => match v.trim().parse::<f64>() {
                Ok(f) if (0.0..=1.0).contains(&f) => f,
                _ => {
                    return Err(ConfigError::Value {
                        var: "OCCL_OTEL_STEP_SAMPLING",
                        value: v,
                        what: "a fraction between 0 and 1",
                    })
                }
            },
        };
        let resource = get("OTEL_RESOURCE_ATTRIBUTES").map(|r| parse_pairs(&r)).unwrap_or_default();
        let service_name = get("OTEL_SERVICE_NAME")
            .or_else(|| resource.iter().find(|(k, _)| k == "service.name").map(|(_, v)| v.clone()))
            .unwrap_or_else(|| d.service_name.clone());
        let job = ["OCCL_JOB_ID", "SLURM_JOB_ID", "TORCHELASTIC_RUN_ID"].iter().find_map(|k| get(k));
        let rank = ["OCCL_RANK", "RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"]
            .iter()
            .find_map(|k| get(k).and_then(|v| v.trim().parse::<i64>().ok()));
        Ok(Some(OtlpConfig {
            protocol,
            endpoint,
            certificate,
            compression,
            headers,
            timeout,
            max_queue,
            max_batch,
            schedule_delay,
            step_sampling,
            service_name,
            resource,
            job,
            rank,
        }))
    }

    /// [`OtlpConfig::from_lookup`] on the process environment.
    pub fn from_env() -> Result<Option<OtlpConfig>, ConfigError> {
        OtlpConfig::from_lookup(|k| std::env::var(k).ok())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn cfg(vars: &[(&str, &str)]) -> Result<Option<OtlpConfig>, ConfigError> {
        let m: HashMap<String, String> = vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        OtlpConfig::from_lookup(|k| m.get(k).cloned())
    }

    fn on(vars: &[(&str, &str)]) -> OtlpConfig {
        cfg(vars).expect("valid").expect("enabled")
    }

    #[test]
    fn enabled_by_an_endpoint_or_occl_otel_and_off_by_the_standard_switches() {
        assert_eq!(cfg(&[]), Ok(None));
        assert_eq!(on(&[("OCCL_OTEL", "1")]).endpoint, "http://localhost:4318/v1/traces");
        assert!(on(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318")]).step_sampling > 0.0);
        let ep = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://c:1/x");
        assert_eq!(cfg(&[ep, ("OCCL_OTEL", "0")]), Ok(None));
        assert_eq!(cfg(&[ep, ("OTEL_SDK_DISABLED", "true")]), Ok(None));
        assert_eq!(cfg(&[ep, ("OTEL_TRACES_EXPORTER", "none")]), Ok(None));
        assert_eq!(cfg(&[ep, ("OTEL_TRACES_EXPORTER", "console")]), Ok(None));
        assert!(cfg(&[ep, ("OTEL_TRACES_EXPORTER", "console,otlp")]).expect("ok").is_some());
        assert!(cfg(&[ep, ("OTEL_SDK_DISABLED", "false")]).expect("ok").is_some());
    }

    #[test]
    fn endpoints_follow_the_specification() {
        let base = |b: &str| on(&[("OTEL_EXPORTER_OTLP_ENDPOINT", b)]).endpoint;
        assert_eq!(base("http://c:4318"), "http://c:4318/v1/traces");
        assert_eq!(base("http://c:4318/"), "http://c:4318/v1/traces");
        assert_eq!(base("http://c/otel"), "http://c/otel/v1/traces");
        // The signal's own endpoint is used as it is.
        let t = on(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://a:1"),
            ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://b:2/t"),
        ]);
        assert_eq!(t.endpoint, "http://b:2/t");
        let g = on(&[("OCCL_OTEL", "1"), ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")]);
        assert_eq!((g.protocol, g.endpoint.as_str()), (Protocol::Grpc, "http://localhost:4317"));
        let g = on(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:9"), ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "grpc")]);
        assert_eq!(g.endpoint, "http://c:9");
        let j = on(&[("OCCL_OTEL", "1"), ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")]);
        assert_eq!(j.protocol, Protocol::HttpJson);
        assert_eq!(
            cfg(&[("OCCL_OTEL", "1"), ("OTEL_EXPORTER_OTLP_PROTOCOL", "thrift")]),
            Err(ConfigError::Protocol("thrift".into()))
        );
        assert!(matches!(cfg(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "ftp://c:4318")]), Err(ConfigError::Endpoint(_))));
        assert_eq!(base("https://c:4318"), "https://c:4318/v1/traces");
    }

    #[test]
    fn tls_certificates_and_compression() {
        let c = on(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "https://c"), ("OTEL_EXPORTER_OTLP_CERTIFICATE", "/a.pem")]);
        assert_eq!(c.certificate, Some(CaFile { var: "OTEL_EXPORTER_OTLP_CERTIFICATE", path: "/a.pem".into() }));
        assert_eq!(c.compression, Compression::None);
        let c = on(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "https://c"),
            ("OTEL_EXPORTER_OTLP_CERTIFICATE", "/a.pem"),
            ("OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE", "/t.pem"),
            ("OTEL_EXPORTER_OTLP_COMPRESSION", "none"),
            ("OTEL_EXPORTER_OTLP_TRACES_COMPRESSION", "gzip"),
        ]);
        assert_eq!(c.certificate.map(|c| c.var), Some("OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE"));
        assert_eq!(c.compression, Compression::Gzip);
        let e = cfg(&[("OCCL_OTEL", "1"), ("OTEL_EXPORTER_OTLP_COMPRESSION", "zstd")]).expect_err("unknown");
        assert_eq!(e.to_string(), "OTEL_EXPORTER_OTLP_COMPRESSION=\"zstd\" is not gzip or none");
    }

    #[test]
    fn headers_timeouts_batching_and_resource() {
        let c = on(&[
            ("OCCL_OTEL", "1"),
            ("OTEL_EXPORTER_OTLP_HEADERS", "api-key=a%20b, x=1,bad"),
            ("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "X=2"),
            ("OTEL_EXPORTER_OTLP_TIMEOUT", "2500"),
            ("OTEL_BSP_MAX_QUEUE_SIZE", "100"),
            ("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "500"),
            ("OTEL_BSP_SCHEDULE_DELAY", "20"),
            ("OCCL_OTEL_STEP_SAMPLING", "0.25"),
            ("OTEL_RESOURCE_ATTRIBUTES", "service.name=fromattrs,deployment.environment=ci%2C1"),
            ("SLURM_JOB_ID", "77"),
            ("RANK", "3"),
        ]);
        assert_eq!(c.headers, vec![("api-key".into(), "a b".into()), ("X".into(), "2".into())]);
        assert_eq!(c.timeout, Duration::from_millis(2500));
        assert_eq!((c.max_queue, c.max_batch), (100, 100));
        assert_eq!(c.schedule_delay, Duration::from_millis(20));
        assert_eq!(c.step_sampling, 0.25);
        assert_eq!(c.service_name, "fromattrs");
        assert_eq!(c.resource[1], ("deployment.environment".into(), "ci,1".into()));
        assert_eq!((c.job.as_deref(), c.rank), (Some("77"), Some(3)));
        let c =
            on(&[("OCCL_OTEL", "1"), ("OTEL_SERVICE_NAME", "trainer"), ("OTEL_RESOURCE_ATTRIBUTES", "service.name=x")]);
        assert_eq!(c.service_name, "trainer");
        assert!(cfg(&[("OCCL_OTEL", "1"), ("OCCL_OTEL_STEP_SAMPLING", "2")]).is_err());
        assert!(cfg(&[("OCCL_OTEL", "1"), ("OTEL_EXPORTER_OTLP_TIMEOUT", "soon")]).is_err());
        assert_eq!(percent_decode("%zz%4"), "%zz%4");
    }

    /// Hostile numbers: refused with the variable named, or clamped where the specification
    /// clamps (queue and batch sizes); never a panic and never a duration past a day.
    #[test]
    fn hostile_numbers_are_refused_or_clamped() {
        let huge = "18446744073709551615";
        for var in [
            "OTEL_EXPORTER_OTLP_TIMEOUT",
            "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT",
            "OTEL_BSP_SCHEDULE_DELAY",
            "OTEL_BSP_MAX_QUEUE_SIZE",
            "OTEL_BSP_MAX_EXPORT_BATCH_SIZE",
            "OCCL_OTEL_STEP_SAMPLING",
        ] {
            for v in ["NaN", "inf", "-1", "1e30", huge, "99999999999999999999999", "86400001", "0"] {
                match cfg(&[("OCCL_OTEL", "1"), (var, v)]) {
                    Err(e) => assert!(e.to_string().contains(var), "{var}={v}: {e}"),
                    Ok(c) => {
                        let c = c.expect("enabled");
                        let day = Duration::from_secs(86_400);
                        assert!(c.timeout <= day && c.schedule_delay <= day, "{var}={v}");
                        assert!((1..=1 << 20).contains(&c.max_queue) && (1..=c.max_queue).contains(&c.max_batch));
                        assert!((0.0..=1.0).contains(&c.step_sampling), "{var}={v}");
                    }
                }
            }
        }
        let e = cfg(&[("OCCL_OTEL", "1"), ("OTEL_EXPORTER_OTLP_TIMEOUT", huge)]).expect_err("past a day").to_string();
        assert!(e.contains("86400000"), "{e}");
        assert_eq!(on(&[("OCCL_OTEL", "1"), ("OTEL_BSP_MAX_QUEUE_SIZE", huge)]).max_queue, 1 << 20);
        assert!(cfg(&[("OCCL_OTEL", "1"), ("OCCL_OTEL_STEP_SAMPLING", "NaN")]).is_err());
    }
}
