//! The OTLP exporter against a real receiver: a 2-rank job (real processes) exports its spans
//! over OTLP/HTTP (protobuf and JSON) and OTLP/gRPC to a receiver in this test that decodes them
//! with the OpenTelemetry project's own types (`opentelemetry-proto`; tonic serves the gRPC side).
//! Checked: every parent present and of the right kind (GroupApi → CollApi → Coll → ProxyOp →
//! ProxyStep, the legacy Group under its GroupApi), every attribute equal to what the job ran,
//! one trace per collective across both ranks, the resource attributes, the request headers.
//! And: a collector that is down or never answers leaves the job finishing normally, with the
//! dropped spans counted. Over TLS (a CA and certificate made here with `rcgen`, the CA handed
//! through `OTEL_EXPORTER_OTLP_CERTIFICATE`) with gzip, OTLP/HTTP and gRPC arrive whole; a bad CA
//! file or an unknown compression is a logged error that says what to set, never a failure.

mod common;

use common::{assert_all_ok, env, run_job};
use occl_tests::launch::{RankOutput, Spawn};
use opentelemetry_proto::tonic::collector::trace::v1::{ExportTraceServiceRequest, ExportTraceServiceResponse};
use opentelemetry_proto::tonic::common::v1::{any_value::Value as Av, KeyValue};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What the receiver got: per request, its content type, the test header, and the decoded body.
#[derive(Default)]
struct Store {
    requests: Vec<(String, String, ExportTraceServiceRequest)>,
    errors: Vec<String>,
}

type Shared = Arc<Mutex<Store>>;

fn header(h: &http::HeaderMap, k: &str) -> String {
    h.get(k).and_then(|v| v.to_str().ok()).unwrap_or("").to_string()
}

/// Runs `fut` on a runtime of its own thread (the receiver outlives the job; the test process ends it).
fn serve_in_background<F: std::future::Future<Output = ()> + Send + 'static>(f: impl FnOnce() -> F + Send + 'static) {
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        rt.block_on(f());
    });
}

/// A receiver on a loopback port: `conn` serves each accepted connection, with the store.
fn receiver<F, Fut>(conn: F) -> (SocketAddr, Shared)
where
    F: Fn(tokio::net::TcpStream, Shared) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.set_nonblocking(true).expect("nonblocking");
    let addr = l.local_addr().expect("addr");
    let store = Shared::default();
    let st = store.clone();
    serve_in_background(move || async move {
        let l = tokio::net::TcpListener::from_std(l).expect("listener");
        loop {
            let Ok((c, _)) = l.accept().await else { continue };
            tokio::spawn(conn(c, st.clone()));
        }
    });
    (addr, store)
}

/// OTLP/HTTP receiver (hyper, HTTP/1.1): decodes protobuf or JSON by content type.
fn http_receiver() -> (SocketAddr, Shared) {
    receiver(|c, st| async move {
        let svc = hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
            let st = st.clone();
            async move {
                use http_body_util::BodyExt;
                let ct = header(req.headers(), "content-type");
                let tag = header(req.headers(), "x-occl-test");
                let path = req.uri().path().to_string();
                let body = req.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
                let decoded: Result<ExportTraceServiceRequest, String> = match ct.as_str() {
                    "application/x-protobuf" => prost::Message::decode(body).map_err(|e| e.to_string()),
                    "application/json" => serde_json::from_slice(&body).map_err(|e| e.to_string()),
                    other => Err(format!("content type {other:?}")),
                };
                let mut g = st.lock().expect("store");
                if path != "/v1/traces" {
                    g.errors.push(format!("POST to {path}"));
                }
                let reply = match decoded {
                    Ok(r) => {
                        g.requests.push((ct.clone(), tag, r));
                        if ct == "application/json" {
                            b"{}".to_vec()
                        } else {
                            prost::Message::encode_to_vec(&ExportTraceServiceResponse::default())
                        }
                    }
                    Err(e) => {
                        g.errors.push(e);
                        Vec::new()
                    }
                };
                let resp = hyper::Response::builder()
                    .header("content-type", ct)
                    .body(http_body_util::Full::new(bytes::Bytes::from(reply)));
                resp.map_err(|e| e.to_string())
            }
        });
        let _ = hyper::server::conn::http1::Builder::new().serve_connection(hyper_util::rt::TokioIo::new(c), svc).await;
    })
}

/// OTLP/gRPC receiver: tonic's server with `TraceService/Export` decoded by tonic-prost.
fn grpc_receiver() -> (SocketAddr, Shared) {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.set_nonblocking(true).expect("nonblocking");
    let addr = l.local_addr().expect("addr");
    let store = Shared::default();
    let st = store.clone();
    serve_in_background(move || async move {
        let l = tokio::net::TcpListener::from_std(l).expect("listener");
        let incoming = tonic::transport::server::TcpIncoming::from(l);
        let svc = tower::service_fn(move |req: http::Request<tonic::body::Body>| {
            let st = st.clone();
            async move {
                let path = req.uri().path().to_string();
                let tag = header(req.headers(), "x-occl-test");
                let ct = header(req.headers(), "content-type");
                if path != "/opentelemetry.proto.collector.trace.v1.TraceService/Export" {
                    st.lock().expect("store").errors.push(format!("gRPC call {path}"));
                    return Ok::<_, std::convert::Infallible>(tonic::Status::unimplemented(path).into_http());
                }
                let export = tower::service_fn(move |r: tonic::Request<ExportTraceServiceRequest>| {
                    let (st, tag, ct) = (st.clone(), tag.clone(), ct.clone());
                    async move {
                        st.lock().expect("store").requests.push((ct, tag, r.into_inner()));
                        Ok::<_, tonic::Status>(tonic::Response::new(ExportTraceServiceResponse::default()))
                    }
                });
                let mut grpc = tonic::server::Grpc::new(tonic_prost::ProstCodec::<
                    ExportTraceServiceResponse,
                    ExportTraceServiceRequest,
                >::new());
                Ok(grpc.unary(export, req).await)
            }
        });
        let _ = tonic::transport::Server::builder().serve_with_incoming(svc, incoming).await;
    });
    (addr, store)
}

/// One received span, flattened.
#[derive(Debug, Clone)]
struct S {
    resource: HashMap<String, String>,
    trace: Vec<u8>,
    id: Vec<u8>,
    parent: Vec<u8>,
    name: String,
    start: u64,
    end: u64,
    attrs: HashMap<String, String>,
    events: Vec<(String, HashMap<String, String>)>,
    error: bool,
}

impl S {
    fn a(&self, k: &str) -> &str {
        self.attrs.get(k).map_or("", String::as_str)
    }
    fn event(&self) -> &str {
        self.a("occl.event")
    }
    fn rank(&self) -> &str {
        self.a("occl.rank")
    }
}

fn kv(attrs: &[KeyValue]) -> HashMap<String, String> {
    attrs
        .iter()
        .map(|k| {
            let v = match k.value.as_ref().and_then(|v| v.value.as_ref()) {
                Some(Av::StringValue(s)) => s.clone(),
                Some(Av::IntValue(i)) => i.to_string(),
                Some(Av::BoolValue(b)) => b.to_string(),
                other => format!("{other:?}"),
            };
            (k.key.clone(), v)
        })
        .collect()
}

fn flatten(store: &Store) -> Vec<S> {
    let mut out = Vec::new();
    for (_, _, req) in &store.requests {
        for rs in &req.resource_spans {
            let resource = kv(&rs.resource.as_ref().map(|r| r.attributes.clone()).unwrap_or_default());
            for ss in &rs.scope_spans {
                assert_eq!(ss.scope.as_ref().map(|s| s.name.as_str()), Some("occl"), "instrumentation scope");
                for sp in &ss.spans {
                    out.push(S {
                        resource: resource.clone(),
                        trace: sp.trace_id.clone(),
                        id: sp.span_id.clone(),
                        parent: sp.parent_span_id.clone(),
                        name: sp.name.clone(),
                        start: sp.start_time_unix_nano,
                        end: sp.end_time_unix_nano,
                        attrs: kv(&sp.attributes),
                        events: sp.events.iter().map(|e| (e.name.clone(), kv(&e.attributes))).collect(),
                        error: sp.status.as_ref().is_some_and(|s| s.code == 2),
                    });
                }
            }
        }
    }
    out
}

/// What one rank announced (`OTLPOP` lines), in order.
fn announced(o: &RankOutput) -> Vec<HashMap<String, String>> {
    o.output
        .lines()
        .filter_map(|l| l.strip_prefix("OTLPOP "))
        .map(|l| l.split_whitespace().filter_map(|kv| kv.split_once('=')).map(|(k, v)| (k.into(), v.into())).collect())
        .collect()
}

fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname").map(|s| s.trim().to_string()).unwrap_or_default()
}

fn run_exporting(protocol: &str, endpoint: &str, extra: &[(&str, &str)]) -> Vec<RankOutput> {
    let mut vars = vec![
        ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", protocol),
        ("OTEL_EXPORTER_OTLP_HEADERS", "x-occl-test=yes%20please"),
        ("OTEL_SERVICE_NAME", "occl-otlp-test"),
        ("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=ci,service.name=overridden"),
        ("OTEL_BSP_SCHEDULE_DELAY", "200"),
        ("OCCL_JOB_ID", "job42"),
        ("OCCL_LOG", "occl_telemetry=info,warn"),
    ];
    vars.extend_from_slice(extra);
    run_job(2, &["otlp"], Spawn { env: env(&vars), ..Spawn::default() }, Duration::from_secs(60))
}

/// The whole check of one protocol's export.
fn check_export(protocol: &str, endpoint: &str, store: &Shared, extra: &[(&str, &str)]) {
    let mut vars = vec![("OCCL_OTEL_STEP_SAMPLING", "1")];
    vars.extend_from_slice(extra);
    let outs = run_exporting(protocol, endpoint, &vars);
    assert_all_ok(&outs, "otlp job");
    for o in &outs {
        assert!(o.output.contains("0 dropped"), "rank {}: finalize line:\n{}", o.rank, o.output);
    }
    let st = store.lock().expect("store");
    assert!(st.errors.is_empty(), "receiver errors: {:?}", st.errors);
    assert!(!st.requests.is_empty(), "no request arrived");
    let want_ct = match protocol {
        "grpc" => "application/grpc",
        "http/json" => "application/json",
        _ => "application/x-protobuf",
    };
    for (ct, tag, _) in &st.requests {
        assert_eq!((ct.as_str(), tag.as_str()), (want_ct, "yes please"), "content type and OTEL_EXPORTER_OTLP_HEADERS");
    }
    let spans = flatten(&st);
    drop(st);
    check_spans(&spans, &outs);
}

fn check_spans(spans: &[S], outs: &[RankOutput]) {
    let by_id: HashMap<&[u8], &S> = spans.iter().map(|s| (s.id.as_slice(), s)).collect();
    assert_eq!(by_id.len(), spans.len(), "span ids are unique");
    // Resource attributes.
    let host = host_name();
    for s in spans {
        let r = &s.resource;
        assert_eq!(r.get("service.name").map(String::as_str), Some("occl-otlp-test"), "OTEL_SERVICE_NAME wins");
        assert_eq!(r.get("service.instance.id"), Some(&format!("job42/{}", s.rank())), "instance = job/rank");
        assert_eq!(r.get("host.name"), Some(&host));
        assert_eq!(r.get("deployment.environment").map(String::as_str), Some("ci"));
        assert!(s.start > 1_600_000_000_000_000_000 && s.end >= s.start, "{} times {}..{}", s.name, s.start, s.end);
        assert!(!s.error, "{} {:?} has status ERROR", s.name, s.attrs);
    }
    // Every parent present, in the same trace, of the kind NCCL's hierarchy names.
    let mut children: HashMap<&[u8], Vec<&S>> = HashMap::new();
    for s in spans {
        let want: &[&str] = match s.event() {
            "GroupApi" => &[],
            "CollApi" | "P2pApi" | "Group" => &["GroupApi"],
            "Coll" => &["CollApi"],
            "P2p" => &["P2pApi"],
            "ProxyOp" => &["Coll", "P2p"],
            "ProxyStep" => &["ProxyOp"],
            other => panic!("unexpected span type {other}: {s:?}"),
        };
        if want.is_empty() {
            assert!(s.parent.is_empty(), "a GroupApi has no parent");
            continue;
        }
        let p = by_id.get(s.parent.as_slice()).unwrap_or_else(|| panic!("parent of {} {:?} missing", s.name, s.attrs));
        assert!(want.contains(&p.event()), "{} has a {} parent", s.event(), p.event());
        assert_eq!(p.trace, s.trace, "{} is in its parent's trace", s.name);
        assert_eq!(p.rank(), s.rank(), "parent on the same rank");
        children.entry(p.id.as_slice()).or_default().push(s);
    }
    let kids = |s: &S, ev: &str| -> Vec<&S> {
        children
            .get(s.id.as_slice())
            .map(|v| v.iter().copied().filter(|c| c.event() == ev).collect())
            .unwrap_or_default()
    };
    assert_eq!(outs.len(), 2);
    for (rank, out) in outs.iter().enumerate() {
        let rs = rank.to_string();
        let mine: Vec<&S> = spans.iter().filter(|s| s.rank() == rs).collect();
        let mut ops: Vec<&S> = mine.iter().copied().filter(|s| matches!(s.event(), "Coll" | "P2p")).collect();
        ops.sort_by_key(|s| s.start);
        let want = announced(out);
        assert_eq!(ops.len(), want.len(), "rank {rank}: Coll/P2p spans vs operations run");
        let mut seqs: HashMap<String, u64> = HashMap::new();
        for (s, w) in ops.iter().zip(&want) {
            let ctx = format!("rank {rank} {} {:?}", s.name, s.attrs);
            assert_eq!(s.name, w["func"], "{ctx}");
            assert_eq!(s.a("occl.op"), w["func"], "{ctx}");
            assert_eq!(s.a("occl.count"), w["count"], "{ctx}");
            assert_eq!(s.a("occl.datatype"), w["dtype"], "{ctx}");
            let elem = if w["dtype"] == "ncclFloat64" { 8 } else { 4 };
            let count: u64 = w["count"].parse().expect("count");
            assert_eq!(s.a("occl.bytes"), (count * elem).to_string(), "{ctx}");
            assert_eq!(s.a("occl.nranks"), "2", "{ctx}");
            assert_eq!(s.a("occl.comm.hash").len(), 16, "{ctx}");
            if s.event() == "Coll" {
                let seq = seqs.entry(w["func"].clone()).or_default();
                *seq += 1;
                assert_eq!(s.a("occl.seq"), seq.to_string(), "{ctx}");
                assert_eq!(s.a("occl.root"), w["root"], "{ctx}");
                assert_eq!(s.a("occl.algo"), w["algo"], "{ctx}");
                assert_eq!(s.a("occl.proto"), "SIMPLE", "{ctx}");
            } else {
                assert_eq!(s.a("occl.peer"), w["peer"], "{ctx}");
            }
            // The API span above it says the same.
            let api = by_id[s.parent.as_slice()];
            assert_eq!(
                (api.name.as_str(), api.a("occl.count")),
                (format!("nccl{}", w["func"]).as_str(), w["count"].as_str())
            );
            let group = by_id[api.parent.as_slice()];
            let legacy = kids(group, "Group");
            assert_eq!(legacy.len(), 1, "{ctx}: the GroupApi has its legacy Group");
            // ProxyOps inside the operation, each with every one of its steps.
            let pops = kids(s, "ProxyOp");
            assert!(!pops.is_empty(), "{ctx}: no ProxyOp");
            for p in pops {
                assert!(p.start >= s.start && p.end <= s.end, "{ctx}: ProxyOp inside its Coll (occl)");
                let steps = kids(p, "ProxyStep");
                assert_eq!(p.a("occl.steps"), steps.len().to_string(), "{ctx}: every step sampled (sampling 1)");
                assert_eq!(p.a("occl.steps.done"), p.a("occl.steps"), "{ctx}");
                assert!(!p.a("process.pid").is_empty());
                let send = p.a("occl.direction") == "send";
                assert_eq!(p.name, if send { "proxy send" } else { "proxy recv" });
                let want_states: &[&str] = if send {
                    &["SendGPUWait", "SendPeerWait", "SendWait"]
                } else {
                    &["RecvWait", "RecvFlushWait", "RecvGPUWait"]
                };
                let mut numbers: Vec<u64> = Vec::new();
                for st in steps {
                    let names: Vec<&str> = st.events.iter().map(|e| e.0.as_str()).collect();
                    assert_eq!(names, want_states, "{ctx}: step states");
                    assert!(st.start >= p.start && st.end <= p.end, "{ctx}: step inside its ProxyOp");
                    let bytes: u64 = st.a("occl.bytes").parse().expect("step bytes");
                    assert!(bytes > 0 && bytes <= p.a("occl.chunk.bytes").parse::<u64>().expect("chunk"), "{ctx}");
                    numbers.push(st.a("occl.step").parse().expect("step"));
                }
                numbers.sort_unstable();
                assert_eq!(numbers, (0..numbers.len() as u64).collect::<Vec<_>>(), "{ctx}: steps 0..n");
            }
        }
    }
    // One trace per collective, shared by both ranks; each holds both ranks' whole trees.
    let mut colls: BTreeMap<(String, String), Vec<&S>> = BTreeMap::new();
    for s in spans.iter().filter(|s| s.event() == "Coll") {
        colls.entry((s.name.clone(), s.a("occl.seq").to_string())).or_default().push(s);
    }
    assert_eq!(colls.len(), 4, "four collectives: {:?}", colls.keys().collect::<Vec<_>>());
    for (k, v) in &colls {
        assert_eq!(v.len(), 2, "{k:?} on both ranks");
        assert_eq!(v[0].trace, v[1].trace, "{k:?}: one trace across ranks");
        let in_trace: Vec<&S> = spans.iter().filter(|s| s.trace == v[0].trace).collect();
        let apis: HashSet<&str> = in_trace.iter().filter(|s| s.event() == "GroupApi").map(|s| s.rank()).collect();
        assert_eq!(apis.len(), 2, "{k:?}: the trace has both ranks' GroupApi");
    }
    // P2p trees are per rank: their traces differ from every collective's.
    let coll_traces: HashSet<&[u8]> = colls.values().flatten().map(|s| s.trace.as_slice()).collect();
    assert!(spans.iter().filter(|s| s.event() == "P2p").all(|s| !coll_traces.contains(s.trace.as_slice())));
}

#[test]
fn http_protobuf_export_has_the_whole_tree() {
    let (addr, store) = http_receiver();
    check_export("http/protobuf", &format!("http://{addr}"), &store, &[]);
}

#[test]
fn http_json_export_has_the_whole_tree() {
    let (addr, store) = http_receiver();
    check_export("http/json", &format!("http://{addr}"), &store, &[]);
}

#[test]
fn grpc_export_has_the_whole_tree() {
    let (addr, store) = grpc_receiver();
    check_export("grpc", &format!("http://{addr}"), &store, &[]);
}

#[test]
fn grpc_export_of_a_tcp_job_has_the_whole_tree() {
    // Small slots: many steps per ProxyOp, some of them ended by the socket writer.
    let (addr, store) = grpc_receiver();
    check_export(
        "grpc",
        &format!("http://{addr}"),
        &store,
        &[("OCCL_TRANSPORT", "tcp"), ("OCCL_TCP_SLOT_SIZE", "65536")],
    );
}

/// `dropped N (Q queue full, E export failed)` from a rank's finalize line.
fn drops(o: &RankOutput) -> (u64, u64) {
    let line =
        o.output.lines().find(|l| l.contains("occl otlp:") && l.contains("spans exported to")).unwrap_or_else(|| {
            panic!("rank {}: no finalize line:\n{}", o.rank, o.output);
        });
    let num = |before: &str| -> u64 {
        let i = line.find(before).unwrap_or_else(|| panic!("{before:?} in {line}"));
        line[..i]
            .split(|c: char| !c.is_ascii_digit())
            .rfind(|t| !t.is_empty())
            .and_then(|t| t.parse().ok())
            .unwrap_or(0)
    };
    (num(" queue full"), num(" export failed"))
}

/// A loopback TCP port that refuses every connection for as long as this lives: bound, never
/// listening. Holding it keeps another test's `bind(":0")` from taking the port (a listener
/// that took it could accept and never answer, and the exports would wait out their timeout).
struct RefusingPort {
    fd: libc::c_int,
    port: u16,
}

impl RefusingPort {
    fn new() -> RefusingPort {
        // SAFETY: a fresh socket, bound to a sockaddr_in that lives across the calls.
        unsafe {
            let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
            assert!(fd >= 0, "socket: {}", std::io::Error::last_os_error());
            let mut sa: libc::sockaddr_in = std::mem::zeroed();
            sa.sin_family = libc::AF_INET as libc::sa_family_t;
            sa.sin_addr.s_addr = u32::from(std::net::Ipv4Addr::LOCALHOST).to_be();
            let mut len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
            let sp = (&raw mut sa).cast::<libc::sockaddr>();
            assert_eq!(libc::bind(fd, sp, len), 0, "bind: {}", std::io::Error::last_os_error());
            assert_eq!(libc::getsockname(fd, sp, &mut len), 0, "getsockname: {}", std::io::Error::last_os_error());
            RefusingPort { fd, port: u16::from_be(sa.sin_port) }
        }
    }
}

impl Drop for RefusingPort {
    fn drop(&mut self) {
        // SAFETY: our own descriptor, closed once.
        unsafe { libc::close(self.fd) };
    }
}

#[test]
fn a_collector_that_is_down_costs_nothing_but_the_dropped_spans() {
    let down = RefusingPort::new();
    let port = down.port;
    let t0 = Instant::now();
    let outs = run_exporting("http/protobuf", &format!("http://127.0.0.1:{port}"), &[]);
    let took = t0.elapsed();
    assert_all_ok(&outs, "job with the collector down");
    for o in &outs {
        let (_, failed) = drops(o);
        assert!(failed > 0, "rank {}: spans that could not be exported are counted:\n{}", o.rank, o.output);
    }
    assert!(took < Duration::from_secs(20), "the job took {took:?}");
}

#[test]
fn a_collector_that_never_answers_neither_blocks_collectives_nor_the_exit() {
    // Accepts connections and reads nothing: every export waits for its timeout.
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = l.local_addr().expect("addr");
    let held = Arc::new(Mutex::new(Vec::new()));
    let h = held.clone();
    std::thread::spawn(move || {
        for c in l.incoming().flatten() {
            h.lock().expect("held").push(c);
        }
    });
    let t0 = Instant::now();
    let outs = run_exporting(
        "grpc",
        &format!("http://{addr}"),
        &[
            ("OTEL_EXPORTER_OTLP_TIMEOUT", "3000"),
            ("OTEL_BSP_MAX_QUEUE_SIZE", "16"),
            ("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "8"),
            ("OTEL_BSP_SCHEDULE_DELAY", "10"),
            ("OCCL_OTEL_STEP_SAMPLING", "1"),
        ],
    );
    let took = t0.elapsed();
    assert_all_ok(&outs, "job with a silent collector");
    for o in &outs {
        let (full, _) = drops(o);
        assert!(full > 0, "rank {}: a stuck export thread makes the queue drop, counted:\n{}", o.rank, o.output);
        assert!(
            o.output.contains("did not finish in time"),
            "rank {}: the finalize flush gave up:\n{}",
            o.rank,
            o.output
        );
    }
    // Finalize waits at most the export timeout (3 s) for the flush.
    assert!(took < Duration::from_secs(15), "the job took {took:?}");
    assert!(!held.lock().expect("held").is_empty(), "the exporter did connect");
}

/// A CA and a `localhost` certificate it signed, made here; the CA's PEM is written to a file for
/// `OTEL_EXPORTER_OTLP_CERTIFICATE`.
fn test_pki(dir: &std::path::Path) -> (std::path::PathBuf, tokio_rustls::TlsAcceptor) {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
    let ca_key = KeyPair::generate().expect("CA key");
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.distinguished_name.push(DnType::CommonName, "occl test CA");
    let ca = ca_params.self_signed(&ca_key).expect("CA certificate");
    let leaf_key = KeyPair::generate().expect("leaf key");
    let leaf = CertificateParams::new(vec!["localhost".to_string()])
        .expect("leaf params")
        .signed_by(&leaf_key, &Issuer::new(ca_params, ca_key))
        .expect("leaf certificate");
    let ca_file = dir.join("ca.pem");
    std::fs::write(&ca_file, ca.pem()).expect("write CA");
    let key = rustls::pki_types::PrivateKeyDer::Pkcs8(leaf_key.serialize_der().into());
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_no_client_auth()
        .with_single_cert(vec![leaf.der().clone()], key)
        .expect("server certificate");
    cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    (ca_file, tokio_rustls::TlsAcceptor::from(Arc::new(cfg)))
}

/// A collector over TLS (hyper, HTTP/1.1 for OTLP/HTTP and HTTP/2 for gRPC by ALPN) that takes
/// only gzip-compressed requests, decompresses and decodes them with `opentelemetry-proto`'s types.
fn tls_gzip_receiver(acceptor: tokio_rustls::TlsAcceptor) -> (SocketAddr, Shared) {
    receiver(move |c, st| {
        let acceptor = acceptor.clone();
        async move {
            let tls = match acceptor.accept(c).await {
                Ok(t) => t,
                Err(e) => {
                    st.lock().expect("store").errors.push(format!("TLS accept: {e}"));
                    return;
                }
            };
            let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2");
            let svc = hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                let st = st.clone();
                async move { Ok::<_, std::convert::Infallible>(tls_gzip_answer(&st, req).await) }
            });
            let io = hyper_util::rt::TokioIo::new(tls);
            if h2 {
                let b = hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new());
                let _ = b.serve_connection(io, svc).await;
            } else {
                let _ = hyper::server::conn::http1::Builder::new().serve_connection(io, svc).await;
            }
        }
    })
}

fn gunzip(b: &[u8]) -> Result<Vec<u8>, String> {
    use std::io::Read;
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(b).read_to_end(&mut out).map_err(|e| format!("gunzip: {e}"))?;
    Ok(out)
}

/// One request of [`tls_gzip_receiver`]: OTLP/HTTP protobuf with `Content-Encoding: gzip`, or a
/// gRPC message with `grpc-encoding: gzip` and its compressed flag set.
async fn tls_gzip_answer(
    st: &Shared,
    req: hyper::Request<hyper::body::Incoming>,
) -> hyper::Response<http_body_util::Full<bytes::Bytes>> {
    use http_body_util::BodyExt;
    let ct = header(req.headers(), "content-type");
    let tag = header(req.headers(), "x-occl-test");
    let grpc = ct == "application/grpc";
    let encoding = header(req.headers(), if grpc { "grpc-encoding" } else { "content-encoding" });
    let body = req.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
    let message = if grpc {
        match body.len().checked_sub(5) {
            Some(n) if body[0] == 1 && u32::from_be_bytes([body[1], body[2], body[3], body[4]]) as usize == n => {
                gunzip(&body[5..])
            }
            _ => Err(format!("gRPC frame not compressed or malformed: {:?}", &body[..body.len().min(5)])),
        }
    } else {
        gunzip(&body)
    };
    let decoded = message
        .and_then(|m| <ExportTraceServiceRequest as prost::Message>::decode(m.as_slice()).map_err(|e| e.to_string()));
    let mut g = st.lock().expect("store");
    if encoding != "gzip" {
        g.errors.push(format!("encoding header {encoding:?}"));
    }
    match decoded {
        Ok(r) => g.requests.push((ct.clone(), tag, r)),
        Err(e) => g.errors.push(e),
    }
    drop(g);
    let reply = prost::Message::encode_to_vec(&ExportTraceServiceResponse::default());
    let b = hyper::Response::builder().header("content-type", ct.as_str());
    let resp = if grpc {
        // Trailers-Only: the status in the headers, no message.
        b.header("grpc-status", "0").body(http_body_util::Full::new(bytes::Bytes::new()))
    } else {
        b.body(http_body_util::Full::new(bytes::Bytes::from(reply)))
    };
    resp.expect("response")
}

fn tls_dir(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("occl-otlp-tls-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&d).expect("temp dir");
    d
}

fn check_tls_gzip_export(protocol: &str) {
    let dir = tls_dir(&protocol.replace('/', "-"));
    let (ca, acceptor) = test_pki(&dir);
    let (addr, store) = tls_gzip_receiver(acceptor);
    let ca = ca.to_string_lossy().into_owned();
    let endpoint = format!("https://localhost:{}", addr.port());
    check_export(
        protocol,
        &endpoint,
        &store,
        &[("OTEL_EXPORTER_OTLP_CERTIFICATE", &ca), ("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip")],
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn http_protobuf_export_over_tls_with_gzip_has_the_whole_tree() {
    check_tls_gzip_export("http/protobuf");
}

#[test]
fn grpc_export_over_tls_with_gzip_has_the_whole_tree() {
    check_tls_gzip_export("grpc");
}

/// A CA file that does not exist, and one that is not PEM: the exporter stays off with an error
/// that names the variable and says what to set; the job runs normally.
#[test]
fn a_bad_certificate_file_is_a_clear_error_and_no_failure() {
    let dir = tls_dir("bad");
    let junk = dir.join("junk.pem");
    std::fs::write(&junk, "not a certificate\n").expect("write");
    let missing = dir.join("missing.pem");
    for (file, why) in [(&missing, "No such file"), (&junk, "no PEM certificate")] {
        let f = file.to_string_lossy().into_owned();
        let outs = run_exporting(
            "http/protobuf",
            "https://localhost:1",
            &[("OTEL_EXPORTER_OTLP_CERTIFICATE", &f), ("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip")],
        );
        assert_all_ok(&outs, "job with a bad CA file");
        for o in &outs {
            let line = o.output.lines().find(|l| l.contains("OTEL_EXPORTER_OTLP_CERTIFICATE=")).unwrap_or_else(|| {
                panic!("rank {}: no error naming the variable:\n{}", o.rank, o.output);
            });
            assert!(line.contains("ERROR") && line.contains(why), "{line}");
            assert!(line.contains("set OTEL_EXPORTER_OTLP_CERTIFICATE to") && line.contains("export is off"), "{line}");
        }
    }
    let outs = run_exporting("grpc", "https://localhost:1", &[("OTEL_EXPORTER_OTLP_COMPRESSION", "zstd")]);
    assert_all_ok(&outs, "job with an unknown compression");
    for o in &outs {
        assert!(
            o.output
                .contains("OTEL_EXPORTER_OTLP_COMPRESSION=\"zstd\" is not gzip or none; OpenTelemetry export is off"),
            "rank {}:\n{}",
            o.rank,
            o.output
        );
    }
    let _ = std::fs::remove_dir_all(dir);
}
