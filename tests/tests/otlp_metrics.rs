//! OTLP metrics against a real receiver: a 2-rank job (real processes) runs a known workload with
//! `OTEL_METRICS_EXPORTER=otlp`, and a receiver in this test decodes every request with the
//! OpenTelemetry project's own types (`opentelemetry-proto`). Over OTLP/HTTP with a short
//! `OTEL_METRIC_EXPORT_INTERVAL`, each process exports on that period, cumulatively (one start
//! time, counters that only grow), and its last export has the job's exact operation counts and
//! bytes per rank and op, as monotonic sums, and every operation in the duration histograms. Over
//! gRPC with the default interval (a minute), the export at the communicator's destroy carries the
//! same numbers.

mod common;

use common::{assert_all_ok, env, run_job, worker};
use occl_tests::launch::{Job, Spawn};
use opentelemetry_proto::tonic::collector::metrics::v1::{ExportMetricsServiceRequest, ExportMetricsServiceResponse};
use opentelemetry_proto::tonic::common::v1::{any_value::Value as Av, KeyValue};
use opentelemetry_proto::tonic::metrics::v1::{metric::Data, number_data_point::Value as Nv};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Per request: the path (HTTP) or gRPC method, and the decoded body.
type Store = Arc<Mutex<(Vec<(String, ExportMetricsServiceRequest)>, Vec<String>)>>;

fn serve_in_background<F: std::future::Future<Output = ()> + Send + 'static>(f: impl FnOnce() -> F + Send + 'static) {
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        rt.block_on(f());
    });
}

fn listener() -> (std::net::TcpListener, SocketAddr) {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.set_nonblocking(true).expect("nonblocking");
    let addr = l.local_addr().expect("addr");
    (l, addr)
}

/// OTLP/HTTP receiver (hyper, HTTP/1.1), protobuf only.
fn http_receiver() -> (SocketAddr, Store) {
    let (l, addr) = listener();
    let store = Store::default();
    let st = store.clone();
    serve_in_background(move || async move {
        let l = tokio::net::TcpListener::from_std(l).expect("listener");
        loop {
            let Ok((c, _)) = l.accept().await else { continue };
            let st = st.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                    let st = st.clone();
                    async move {
                        use http_body_util::BodyExt;
                        let ct = req.headers().get("content-type").and_then(|v| v.to_str().ok()).unwrap_or("");
                        let ok_ct = ct == "application/x-protobuf";
                        let path = req.uri().path().to_string();
                        let body = req.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
                        let decoded: Result<ExportMetricsServiceRequest, _> = prost::Message::decode(body);
                        let mut g = st.lock().expect("store");
                        match decoded {
                            Ok(r) if ok_ct => g.0.push((path, r)),
                            Ok(_) => g.1.push("content type".into()),
                            Err(e) => g.1.push(e.to_string()),
                        }
                        let reply = prost::Message::encode_to_vec(&ExportMetricsServiceResponse::default());
                        hyper::Response::builder()
                            .header("content-type", "application/x-protobuf")
                            .body(http_body_util::Full::new(bytes::Bytes::from(reply)))
                            .map_err(|e| e.to_string())
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(c), svc)
                    .await;
            });
        }
    });
    (addr, store)
}

/// OTLP/gRPC receiver: tonic's server with `MetricsService/Export` decoded by tonic-prost.
fn grpc_receiver() -> (SocketAddr, Store) {
    let (l, addr) = listener();
    let store = Store::default();
    let st = store.clone();
    serve_in_background(move || async move {
        let l = tokio::net::TcpListener::from_std(l).expect("listener");
        let incoming = tonic::transport::server::TcpIncoming::from(l);
        let svc = tower::service_fn(move |req: http::Request<tonic::body::Body>| {
            let st = st.clone();
            async move {
                let path = req.uri().path().to_string();
                let export = tower::service_fn(move |r: tonic::Request<ExportMetricsServiceRequest>| {
                    let (st, path) = (st.clone(), path.clone());
                    async move {
                        st.lock().expect("store").0.push((path, r.into_inner()));
                        Ok::<_, tonic::Status>(tonic::Response::new(ExportMetricsServiceResponse::default()))
                    }
                });
                let mut grpc = tonic::server::Grpc::new(tonic_prost::ProstCodec::<
                    ExportMetricsServiceResponse,
                    ExportMetricsServiceRequest,
                >::new());
                Ok::<_, std::convert::Infallible>(grpc.unary(export, req).await)
            }
        });
        let _ = tonic::transport::Server::builder().serve_with_incoming(svc, incoming).await;
    });
    (addr, store)
}

fn text(kv: &[KeyValue], key: &str) -> Option<String> {
    kv.iter().find(|a| a.key == key).and_then(|a| match a.value.as_ref()?.value.as_ref()? {
        Av::StringValue(s) => Some(s.clone()),
        Av::IntValue(i) => Some(i.to_string()),
        _ => None,
    })
}

/// What one request says: its process, the start time of its points, and per (metric, rank, op) the
/// value summed over the other labels (a histogram: its count, with its bucket counts checked).
struct Export {
    pid: String,
    start: Vec<u64>,
    time: u64,
    values: BTreeMap<(String, String, String), f64>,
    units: BTreeMap<String, String>,
}

fn read(r: &ExportMetricsServiceRequest) -> Export {
    assert_eq!(r.resource_metrics.len(), 1, "one resource per process");
    let rm = &r.resource_metrics[0];
    let res = rm.resource.as_ref().map(|r| r.attributes.clone()).unwrap_or_default();
    let mut e = Export {
        pid: text(&res, "process.pid").unwrap_or_default(),
        start: Vec::new(),
        time: 0,
        values: BTreeMap::new(),
        units: BTreeMap::new(),
    };
    assert_eq!(text(&res, "service.name").as_deref(), Some("occl-metrics-test"));
    for sm in &rm.scope_metrics {
        assert_eq!(sm.scope.as_ref().map(|s| s.name.as_str()), Some("occl"));
        for m in &sm.metrics {
            e.units.insert(m.name.clone(), m.unit.clone());
            let mut put = |attrs: &[KeyValue], start: u64, time: u64, v: f64| {
                e.start.push(start);
                e.time = e.time.max(time);
                let key =
                    (m.name.clone(), text(attrs, "rank").unwrap_or_default(), text(attrs, "op").unwrap_or_default());
                *e.values.entry(key).or_default() += v;
            };
            match m.data.as_ref().expect("data") {
                Data::Sum(s) => {
                    assert!(s.is_monotonic && s.aggregation_temporality == 2, "{}: a cumulative monotonic sum", m.name);
                    for p in &s.data_points {
                        let v = match p.value {
                            Some(Nv::AsInt(i)) => i as f64,
                            Some(Nv::AsDouble(d)) => d,
                            None => f64::NAN,
                        };
                        put(&p.attributes, p.start_time_unix_nano, p.time_unix_nano, v);
                    }
                }
                Data::Gauge(g) => {
                    for p in &g.data_points {
                        put(&p.attributes, p.start_time_unix_nano, p.time_unix_nano, 1.0);
                    }
                }
                Data::Histogram(h) => {
                    assert_eq!(h.aggregation_temporality, 2, "{}: cumulative", m.name);
                    for p in &h.data_points {
                        assert_eq!(p.bucket_counts.len(), p.explicit_bounds.len() + 1, "{}", m.name);
                        assert_eq!(p.bucket_counts.iter().sum::<u64>(), p.count, "{}: buckets add up", m.name);
                        assert!(p.explicit_bounds.windows(2).all(|w| w[0] < w[1]));
                        put(&p.attributes, p.start_time_unix_nano, p.time_unix_nano, p.count as f64);
                    }
                }
                other => panic!("{}: unexpected data {other:?}", m.name),
            }
        }
    }
    e
}

/// The `metrics` workload per rank (as in tests/tests/prometheus.rs, for two ranks): (metric, op) → value.
fn expected(rank: usize) -> Vec<((&'static str, &'static str), f64)> {
    let p2p = if rank == 0 { "Send" } else { "Recv" };
    vec![
        (("occl_collective_operations", "AllReduce"), 9.0),
        (("occl_collective_bytes", "AllReduce"), 7.0 * 4000.0 + 2.0 * 1048576.0),
        (("occl_collective_duration_seconds", "AllReduce"), 9.0),
        (("occl_collective_operations", "AllGather"), 3.0),
        (("occl_collective_bytes", "AllGather"), 3.0 * 1024.0),
        (("occl_collective_message_size_bytes", "AllGather"), 3.0),
        (("occl_collective_operations", "Broadcast"), 2.0),
        (("occl_p2p_operations", p2p), 1.0),
        (("occl_p2p_bytes", p2p), 300.0),
    ]
}

/// Whether `e` has every rank's expected values (each process holds one rank).
fn complete(e: &Export) -> bool {
    let ranks: Vec<usize> = (0..2).filter(|r| e.values.keys().any(|(_, rank, _)| rank == &r.to_string())).collect();
    ranks.len() == 1
        && ranks.iter().all(|&r| {
            expected(r)
                .iter()
                .all(|((m, op), v)| e.values.get(&(m.to_string(), r.to_string(), op.to_string())) == Some(v))
        })
}

fn vars(protocol: &str, endpoint: &str, interval: Option<&str>) -> Vec<(String, String)> {
    let mut v = vec![
        ("OTEL_METRICS_EXPORTER", "otlp"),
        ("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", endpoint),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", protocol),
        ("OTEL_SERVICE_NAME", "occl-metrics-test"),
        ("OCCL_JOB_ID", "job7"),
    ];
    if let Some(i) = interval {
        v.push(("OTEL_METRIC_EXPORT_INTERVAL", i));
    }
    env(&v)
}

#[test]
fn otlp_http_metrics_are_exported_on_their_period_cumulatively_with_exact_values() {
    let (addr, store) = http_receiver();
    let spawn = Spawn {
        env: vars("http/protobuf", &format!("http://{addr}/v1/metrics"), Some("300")),
        capture_stdout: true,
        capture_stderr: true,
        ..Spawn::default()
    };
    let job = Job::spawn(worker(), &["metrics".to_string()], 2, &spawn).expect("start job");
    job.wait_for_all("READY", Duration::from_secs(60)).expect("ranks ran the workload");
    // Each process keeps exporting while idle; wait for three complete exports of each.
    let t = Instant::now();
    let by_pid = loop {
        let g = store.lock().expect("store");
        assert!(g.1.is_empty(), "receiver errors: {:?}", g.1);
        let mut by_pid: BTreeMap<String, Vec<Export>> = BTreeMap::new();
        for (path, r) in &g.0 {
            assert_eq!(path, "/v1/metrics");
            let e = read(r);
            by_pid.entry(e.pid.clone()).or_default().push(e);
        }
        drop(g);
        if by_pid.len() == 2 && by_pid.values().all(|v| v.iter().filter(|e| complete(e)).count() >= 3) {
            break by_pid;
        }
        assert!(t.elapsed() < Duration::from_secs(30), "no 3 complete exports per process: {} processes", by_pid.len());
        std::thread::sleep(Duration::from_millis(100));
    };
    drop(job);
    for (pid, exports) in &by_pid {
        // One start time for every point of every export: cumulative from the exporter's start.
        let start = exports[0].start[0];
        assert!(exports.iter().all(|e| e.start.iter().all(|s| *s == start)), "pid {pid}: one start time");
        assert!(exports.windows(2).all(|w| w[0].time < w[1].time && start < w[0].time), "pid {pid}: times increase");
        // Counters never go down from one export to the next.
        for w in exports.windows(2) {
            for (k, v) in &w[0].values {
                assert!(w[1].values.get(k).is_some_and(|n| n >= v), "pid {pid}: {k:?} went down");
            }
        }
        let last = exports.last().expect("exports");
        assert_eq!(last.units.get("occl_collective_bytes").map(String::as_str), Some("By"));
        assert_eq!(last.units.get("occl_collective_duration_seconds").map(String::as_str), Some("s"));
        assert_eq!(last.units.get("occl_collective_operations").map(String::as_str), Some(""));
    }
}

#[test]
fn otlp_grpc_metrics_are_exported_when_the_communicator_is_destroyed() {
    let (addr, store) = grpc_receiver();
    // The default interval is a minute: only the export at destroy can arrive in time.
    let spawn = Spawn { env: vars("grpc", &format!("http://{addr}"), None), ..Spawn::default() };
    let outs = run_job(2, &["metrics", "then-exit"], spawn, Duration::from_secs(60));
    assert_all_ok(&outs, "metrics job");
    let g = store.lock().expect("store");
    assert!(g.1.is_empty(), "receiver errors: {:?}", g.1);
    let exports: Vec<Export> =
        g.0.iter()
            .map(|(path, r)| {
                assert_eq!(path, "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export");
                read(r)
            })
            .collect();
    assert_eq!(exports.len(), 2, "one export per process, at destroy");
    assert!(exports.iter().all(complete), "every rank's exact values");
    assert_ne!(exports[0].pid, exports[1].pid);
}
