//! One export request over the wire: OTLP/HTTP (HTTP/1.1 POST, keep-alive) or OTLP/gRPC
//! (`TraceService/Export` over HTTP/2), over TLS for an `https://` endpoint ([`super::tls`]),
//! gzip-compressed when configured, on a current-thread runtime owned by the export thread. Every
//! attempt is bounded by a deadline; a connection that failed is dropped and made again on the
//! next attempt.

use super::config::{Compression, OtlpConfig, Protocol};
use super::tls::Tls;
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::header::{
    HeaderMap, HeaderName, HeaderValue, CONTENT_ENCODING, CONTENT_TYPE, HOST, RETRY_AFTER, USER_AGENT,
};
use hyper::{Request, Response, Uri};
use hyper_util::rt::{TokioExecutor, TokioIo};
use std::time::Duration;
use tokio::net::TcpStream;

/// gRPC method of a trace export.
pub const GRPC_PATH: &str = "/opentelemetry.proto.collector.trace.v1.TraceService/Export";
/// gRPC method of a metrics export.
pub const GRPC_METRICS_PATH: &str = "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export";
/// Bytes of a response read at most (OTLP responses are a few bytes; an error page is cut).
const MAX_RESPONSE: usize = 64 * 1024;

/// Why an attempt failed, and whether trying again may help.
#[derive(Debug)]
pub struct Failure {
    pub retryable: bool,
    /// The server's `Retry-After`, if it sent one.
    pub retry_after: Option<Duration>,
    pub msg: String,
}

fn fail(retryable: bool, msg: impl Into<String>) -> Failure {
    Failure { retryable, retry_after: None, msg: msg.into() }
}

enum Conn {
    H1(hyper::client::conn::http1::SendRequest<Full<Bytes>>),
    H2(hyper::client::conn::http2::SendRequest<Full<Bytes>>),
}

impl Conn {
    fn is_closed(&self) -> bool {
        match self {
            Conn::H1(s) => s.is_closed(),
            Conn::H2(s) => s.is_closed(),
        }
    }
}

struct Target {
    protocol: Protocol,
    compression: Compression,
    /// TLS for an `https://` endpoint.
    tls: Option<Tls>,
    /// `host:port` to connect to.
    addr: String,
    /// The request's URI: origin-form for HTTP/1.1, absolute for HTTP/2.
    uri: Uri,
    host: HeaderValue,
    headers: HeaderMap,
}

/// The export client of one exporter.
pub struct Client {
    rt: tokio::runtime::Runtime,
    target: Target,
    conn: Option<Conn>,
}

impl Client {
    pub fn new(cfg: &OtlpConfig) -> Result<Client, String> {
        Client::for_signal(cfg, GRPC_PATH)
    }

    /// The client of a signal whose gRPC method is `grpc_path` (over HTTP, `cfg.endpoint` is the
    /// signal's whole URL).
    pub fn for_signal(cfg: &OtlpConfig, grpc_path: &str) -> Result<Client, String> {
        let url: Uri = cfg.endpoint.parse().map_err(|e| format!("endpoint {:?}: {e}", cfg.endpoint))?;
        let auth = url.authority().ok_or_else(|| format!("endpoint {:?} has no host", cfg.endpoint))?;
        let https = url.scheme_str() == Some("https");
        let addr = format!("{}:{}", auth.host(), auth.port_u16().unwrap_or(if https { 443 } else { 80 }));
        let host = HeaderValue::from_str(auth.as_str()).map_err(|e| format!("endpoint host: {e}"))?;
        let tls = if https {
            Some(Tls::new(auth.host(), cfg.certificate.as_ref(), cfg.protocol == Protocol::Grpc)?)
        } else {
            None
        };
        let uri = match cfg.protocol {
            Protocol::Grpc => {
                format!("{}://{}{grpc_path}", if https { "https" } else { "http" }, auth.as_str()).parse()
            }
            _ => url.path_and_query().map_or("/", |p| p.as_str()).parse(),
        }
        .map_err(|e| format!("endpoint {:?}: {e}", cfg.endpoint))?;
        let mut headers = HeaderMap::new();
        for (k, v) in &cfg.headers {
            match (HeaderName::from_bytes(k.as_bytes()), HeaderValue::from_str(v)) {
                (Ok(k), Ok(v)) => {
                    headers.insert(k, v);
                }
                _ => tracing::warn!("occl otlp: header {k:?} is not a valid HTTP header; not sent"),
            }
        }
        let content_type = match cfg.protocol {
            Protocol::HttpProtobuf => "application/x-protobuf",
            Protocol::HttpJson => "application/json",
            Protocol::Grpc => "application/grpc",
        };
        headers.insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
        headers.insert(USER_AGENT, HeaderValue::from_static(concat!("occl-otlp/", env!("CARGO_PKG_VERSION"))));
        if cfg.protocol == Protocol::Grpc {
            headers.insert(HeaderName::from_static("te"), HeaderValue::from_static("trailers"));
        }
        if cfg.compression == Compression::Gzip {
            let (k, v) = match cfg.protocol {
                Protocol::Grpc => (HeaderName::from_static("grpc-encoding"), HeaderValue::from_static("gzip")),
                _ => (CONTENT_ENCODING, HeaderValue::from_static("gzip")),
            };
            headers.insert(k, v);
        }
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .enable_time()
            .build()
            .map_err(|e| format!("runtime: {e}"))?;
        let target = Target { protocol: cfg.protocol, compression: cfg.compression, tls, addr, uri, host, headers };
        Ok(Client { rt, target, conn: None })
    }

    /// Sends one request body (already encoded for the protocol; compression and gRPC framing
    /// are added here), giving up after `limit`.
    pub fn send(&mut self, body: Vec<u8>, limit: Duration) -> Result<(), Failure> {
        let body = self.target.wire_body(body)?;
        let Client { rt, target, conn } = self;
        let res = rt.block_on(async {
            let go = async {
                // A kept-alive connection the collector closed while we were idle (its task runs
                // only while we send) fails at once: try again at once on a fresh one.
                let reused = conn.is_some();
                match attempt(conn, target, body.clone()).await {
                    Err(f) if reused && f.retryable => {
                        *conn = None;
                        attempt(conn, target, body).await
                    }
                    r => r,
                }
            };
            match tokio::time::timeout(limit, go).await {
                Ok(r) => r,
                Err(_) => Err(fail(true, format!("no answer within {limit:?}"))),
            }
        });
        if res.is_err() {
            // A half-used connection is never reused.
            self.conn = None;
        }
        res
    }
}

impl Target {
    /// The body as it goes on the wire: compressed if configured, and for gRPC one
    /// length-prefixed message (compressed flag, big-endian length).
    fn wire_body(&self, body: Vec<u8>) -> Result<Bytes, Failure> {
        let body = match self.compression {
            Compression::Gzip => gzip(&body).map_err(|e| fail(false, format!("gzip: {e}")))?,
            Compression::None => body,
        };
        Ok(Bytes::from(match self.protocol {
            Protocol::Grpc => {
                let len = u32::try_from(body.len()).map_err(|_| fail(false, "a gRPC message over 4 GiB"))?;
                let mut framed = Vec::with_capacity(body.len() + 5);
                framed.push(u8::from(self.compression == Compression::Gzip));
                framed.extend_from_slice(&len.to_be_bytes());
                framed.extend_from_slice(&body);
                framed
            }
            _ => body,
        }))
    }
}

fn gzip(body: &[u8]) -> std::io::Result<Vec<u8>> {
    use std::io::Write;
    let mut z = flate2::write::GzEncoder::new(Vec::with_capacity(body.len() / 4 + 64), flate2::Compression::fast());
    z.write_all(body)?;
    z.finish()
}

async fn connect(t: &Target) -> Result<Conn, Failure> {
    let tcp = TcpStream::connect(&t.addr).await.map_err(|e| fail(true, format!("connect {}: {e}", t.addr)))?;
    let _ = tcp.set_nodelay(true);
    match &t.tls {
        None => handshake(t, TokioIo::new(tcp)).await,
        Some(tls) => {
            // A certificate the configured roots do not accept will not be accepted on a retry.
            let io = tls.connector.connect(tls.server_name.clone(), tcp).await.map_err(|e| {
                let retry = e.kind() != std::io::ErrorKind::InvalidData;
                fail(retry, format!("TLS with {}: {e} (OTEL_EXPORTER_OTLP_CERTIFICATE names the CA to trust)", t.addr))
            })?;
            handshake(t, TokioIo::new(io)).await
        }
    }
}

async fn handshake<I>(t: &Target, io: I) -> Result<Conn, Failure>
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let hs = |e: hyper::Error| fail(true, format!("handshake with {}: {e}", t.addr));
    Ok(match t.protocol {
        Protocol::Grpc => {
            let (send, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), io).await.map_err(hs)?;
            tokio::spawn(conn);
            Conn::H2(send)
        }
        _ => {
            let (send, conn) = hyper::client::conn::http1::handshake(io).await.map_err(hs)?;
            tokio::spawn(conn);
            Conn::H1(send)
        }
    })
}

fn request(t: &Target, body: Bytes) -> Result<Request<Full<Bytes>>, Failure> {
    let mut req = Request::post(t.uri.clone()).body(Full::new(body)).map_err(|e| fail(false, e.to_string()))?;
    *req.headers_mut() = t.headers.clone();
    if t.protocol != Protocol::Grpc {
        req.headers_mut().insert(HOST, t.host.clone());
    }
    Ok(req)
}

async fn attempt(conn: &mut Option<Conn>, t: &Target, body: Bytes) -> Result<(), Failure> {
    if conn.as_ref().is_none_or(Conn::is_closed) {
        *conn = Some(connect(t).await?);
    }
    let req = request(t, body)?;
    let sent = |e: hyper::Error| fail(true, format!("request to {}: {e}", t.addr));
    match conn {
        Some(Conn::H1(s)) => {
            s.ready().await.map_err(sent)?;
            let resp = s.send_request(req).await.map_err(sent)?;
            http_result(resp).await
        }
        Some(Conn::H2(s)) => {
            s.ready().await.map_err(sent)?;
            let resp = s.send_request(req).await.map_err(sent)?;
            grpc_result(resp).await
        }
        None => Err(fail(true, "no connection")),
    }
}

async fn read_body(resp: Response<hyper::body::Incoming>) -> (Bytes, Option<HeaderMap>) {
    match Limited::new(resp.into_body(), MAX_RESPONSE).collect().await {
        Ok(c) => {
            let trailers = c.trailers().cloned();
            (c.to_bytes(), trailers)
        }
        Err(_) => (Bytes::new(), None),
    }
}

/// OTLP/HTTP: 2xx is success; 429, 502, 503 and 504 may be retried (honouring `Retry-After`).
async fn http_result(resp: Response<hyper::body::Incoming>) -> Result<(), Failure> {
    let status = resp.status();
    let retry_after = resp
        .headers()
        .get(RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(Duration::from_secs);
    let (body, _) = read_body(resp).await;
    if status.is_success() {
        return Ok(());
    }
    let retryable = matches!(status.as_u16(), 429 | 502 | 503 | 504);
    let text = String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned();
    Err(Failure { retryable, retry_after, msg: format!("HTTP {status}: {text}") })
}

/// gRPC status codes a client may retry (OTLP specification): CANCELLED, DEADLINE_EXCEEDED,
/// RESOURCE_EXHAUSTED, ABORTED, OUT_OF_RANGE, UNAVAILABLE, DATA_LOSS.
fn grpc_retryable(code: u32) -> bool {
    matches!(code, 1 | 4 | 8 | 10 | 11 | 14 | 15)
}

fn grpc_status(h: &HeaderMap) -> Option<(u32, String)> {
    let code = h.get("grpc-status")?.to_str().ok()?.trim().parse().ok()?;
    let msg = h.get("grpc-message").and_then(|m| m.to_str().ok()).unwrap_or("").to_string();
    Some((code, msg))
}

async fn grpc_result(resp: Response<hyper::body::Incoming>) -> Result<(), Failure> {
    let status = resp.status();
    if !status.is_success() {
        // gRPC's mapping of HTTP statuses: these read UNAVAILABLE.
        let retryable = matches!(status.as_u16(), 429 | 502 | 503 | 504);
        return Err(fail(retryable, format!("gRPC over HTTP {status}")));
    }
    // A Trailers-Only response carries the status in its headers.
    let early = grpc_status(resp.headers());
    let (_, trailers) = read_body(resp).await;
    match early.or_else(|| trailers.as_ref().and_then(grpc_status)) {
        Some((0, _)) => Ok(()),
        Some((code, msg)) => Err(fail(grpc_retryable(code), format!("gRPC status {code}: {msg}"))),
        None => Err(fail(true, "gRPC response without grpc-status")),
    }
}
