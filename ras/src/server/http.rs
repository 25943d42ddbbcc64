//! HTTP on the client port (axum over one accepted connection): `/metrics` (Prometheus text 0.0.4 for this node's
//! processes, or OpenMetrics 1.0 when the request's `Accept` prefers it, as Prometheus's does), `/api/v1/status` (the
//! JSON report), `/api/v1/events` (monitor events as server-sent events), `/api/v1/flight-recorder` (the flight
//! records of every process of the node, `flight`) and `/healthz`. With several jobs on the node, `?job=` picks one
//! for `/metrics`, `/api/v1/status` and `/api/v1/flight-recorder` (see `jobs`); the events are the port owner's job's.

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::{Query, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Extension, Router};
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpStream;

use super::events::event_line;
use super::jobs::{self, Reply};
use super::node_dir::other_jobs;
use super::report::build_report;
use super::seat::Seat;
use super::shared::{gather, Shared};
use crate::client::{EventGroups, Format, MAX_BAD_LINES};
use crate::openmetrics::{self, negotiate, Exposition};
use crate::report::render_json;

/// Scrapes and status requests gather with this budget unless `?timeout=` (or, for a scrape, Prometheus's
/// `X-Prometheus-Scrape-Timeout-Seconds`) says otherwise.
const HTTP_BUDGET: Duration = Duration::from_secs(5);

/// Set on a connection whose `/metrics` answer told Prometheus that the job has ended (see [`metrics`]).
#[derive(Clone, Default)]
struct ToldEnded(Arc<AtomicBool>);

pub(crate) async fn serve_connection(sh: Shared, stream: TcpStream, seat: Seat) {
    let bad = Arc::new(AtomicU32::new(0));
    let request_timeout = sh.cfg.client_request_timeout;
    let marker = seat.clone();
    let ending = sh.ending.clone();
    let told_ended = ToldEnded::default();
    let app = Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/metrics", get(metrics))
        .route("/api/v1/status", get(status))
        .route("/api/v1/events", get(events))
        .route("/api/v1/flight-recorder", get(super::flight::flight_recorder))
        .with_state(sh)
        .layer(axum::middleware::map_response(move |res: Response| close_after_bad(bad.clone(), res)))
        // While a request is served its connection is not evicted; between requests (keep-alive) it may be.
        .layer(axum::middleware::from_fn(move |req: Request, next: Next| {
            let seat = marker.clone();
            async move {
                seat.busy();
                let res = next.run(req).await;
                seat.waiting();
                res
            }
        }))
        .layer(Extension(seat))
        .layer(Extension(told_ended.clone()));
    let svc = TowerToHyperService::new(app);
    // The request timeout bounds the wait for each request head: the first, and each next one of a keep-alive
    // connection (hyper starts the timer when it starts reading a head, idle or not).
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(request_timeout)
        .serve_connection(TokioIo::new(stream), svc);
    match conn.await {
        // The answer that said the job ended has been written and the connection closed after it: only now may
        // the process exit on its account (an exit while it is written would cut it off before Prometheus has it).
        Ok(()) if told_ended.0.load(Ordering::SeqCst) => ending.scraped(true),
        Ok(()) => {}
        Err(e) => tracing::debug!("occl-ras: http connection: {e}"),
    }
}

/// The HTTP side of [`MAX_BAD_LINES`]: a connection gets that many client errors (unknown path, wrong method, bad
/// query) answered as usual; the next one is a final error with `Connection: close`, after which hyper closes it,
/// so pipelined junk is not answered request for request. (A request hyper cannot parse already ends the
/// connection with one 400.)
async fn close_after_bad(bad: Arc<AtomicU32>, res: Response) -> Response {
    if !res.status().is_client_error() {
        return res;
    }
    let n = bad.fetch_add(1, Ordering::Relaxed) + 1;
    if n <= MAX_BAD_LINES {
        return res;
    }
    let body = format!(
        "{n} bad requests on this connection; closing it (this port serves /metrics, /api/v1/status, /api/v1/events \
         and /healthz)\n"
    );
    let mut res = (res.status(), body).into_response();
    res.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
    res
}

#[derive(serde::Deserialize)]
struct Budget {
    /// Seconds.
    timeout: Option<f64>,
    /// One of the node's jobs (default: all of them).
    job: Option<String>,
}

fn budget(q: &Budget) -> Duration {
    q.timeout.filter(|t| t.is_finite() && *t > 0.0).map_or(HTTP_BUDGET, |t| Duration::from_secs_f64(t.min(600.0)))
}

/// A scrape's budget: `?timeout=`, else most of the time Prometheus says it waits, else [`HTTP_BUDGET`].
fn scrape_budget(q: &Budget, headers: &HeaderMap) -> Duration {
    if q.timeout.is_some() {
        return budget(q);
    }
    prometheus_timeout(headers).map_or(HTTP_BUDGET, |t| t.mul_f64(0.8))
}

/// The scrape timeout Prometheus says it waits (`X-Prometheus-Scrape-Timeout-Seconds`, at most 600 s); `None` for
/// any other client.
fn prometheus_timeout(headers: &HeaderMap) -> Option<Duration> {
    headers
        .get("x-prometheus-scrape-timeout-seconds")
        .and_then(|v| v.to_str().ok()?.trim().parse::<f64>().ok())
        .filter(|t| t.is_finite() && *t > 0.0)
        .map(|t| Duration::from_secs_f64(t.min(600.0)))
}

/// `/metrics`: every job's of the node, or `?job=`'s (see `metrics::job_metrics`).
///
/// Prometheus's scrapes (which say their timeout) are what the alert rules read, a person's curl is not, and one
/// answered after that timeout is dropped by Prometheus: only the others count for `ending`. One that says the job
/// has ended closes its connection and counts once that connection has written it and closed (see
/// [`serve_connection`]).
async fn metrics(
    State(sh): State<Shared>,
    Extension(told_ended): Extension<ToldEnded>,
    Query(q): Query<Budget>,
    headers: HeaderMap,
) -> Response {
    let b = scrape_budget(&q, &headers);
    let asked = Instant::now();
    let ended = sh.ending.is_ended();
    match jobs::metrics(&sh, b, q.job.as_deref()).await {
        Reply::Ok(body) => {
            let prometheus = prometheus_timeout(&headers).is_some_and(|t| asked.elapsed() < t);
            let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok());
            let format = negotiate(accept);
            let body = match format {
                Exposition::Text => body,
                Exposition::OpenMetrics => openmetrics::from_text(&body),
            };
            let mut res = ([(header::CONTENT_TYPE, format.content_type())], body).into_response();
            match (prometheus, ended) {
                (true, true) => {
                    told_ended.0.store(true, Ordering::SeqCst);
                    res.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
                }
                (true, false) => sh.ending.scraped(false),
                (false, _) => {}
            }
            res
        }
        Reply::Unknown(e) => (StatusCode::NOT_FOUND, format!("{e}\n")).into_response(),
        Reply::Failed(e) => (StatusCode::SERVICE_UNAVAILABLE, format!("{e}\n")).into_response(),
    }
}

/// `/api/v1/status`: the JSON report of `?job=`, or of the node's only job, or `{"jobs": {name: report}}`.
async fn status(State(sh): State<Shared>, Query(q): Query<Budget>) -> Response {
    if q.job.is_none() && other_jobs(sh.node.as_ref(), &sh.job).await.is_empty() {
        return match gather(&sh, budget(&q)).await {
            Ok(g) => {
                ([(header::CONTENT_TYPE, "application/json")], render_json(&build_report(&g, true))).into_response()
            }
            Err(e) => (StatusCode::SERVICE_UNAVAILABLE, format!("{e}\n")).into_response(),
        };
    }
    match jobs::status(&sh, budget(&q), true, Format::Json, q.job.as_deref()).await {
        Reply::Ok(body) => ([(header::CONTENT_TYPE, "application/json")], body).into_response(),
        Reply::Unknown(e) => (StatusCode::NOT_FOUND, format!("{e}\n")).into_response(),
        Reply::Failed(e) => (StatusCode::SERVICE_UNAVAILABLE, e).into_response(),
    }
}

async fn events(State(sh): State<Shared>, Extension(seat): Extension<Seat>) -> Response {
    if !seat.stream() {
        let msg = "too many event streams on this process; try again later\n";
        return (StatusCode::SERVICE_UNAVAILABLE, [(header::CONNECTION, "close")], msg).into_response();
    }
    let rx = sh.events.subscribe();
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        loop {
            match rx.recv().await {
                Ok(e) => {
                    if let Some(line) = event_line(&e, EventGroups::ALL, Format::Json) {
                        return Some((Ok::<_, Infallible>(SseEvent::default().data(line.trim_end())), rx));
                    }
                }
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                Err(_) => return None,
            }
        }
    });
    Sse::new(stream).keep_alive(KeepAlive::default()).into_response()
}
