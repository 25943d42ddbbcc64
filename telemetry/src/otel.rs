//! occl's spans in the application's OpenTelemetry tracer (feature `otel`): for a program that
//! already has an OpenTelemetry SDK, instead of (or beside) the standalone OTLP exporter.
//!
//! **What it makes.** Each operation (Coll or P2p) is a span named by the collective
//! (`AllReduce`, `Send`), started on the thread that called it as a child of the
//! [`opentelemetry::Context`] current there; without an active span in it, of the W3C
//! `TRACEPARENT` of the process environment; else a root. Its ProxyOps (`proxy send`/`proxy recv`)
//! are its children, as in occl's span tree; API calls, groups, ProxySteps and kernels are left
//! out (the standalone exporter has them). Names, attributes and state-change span events are
//! [`crate::semconv`]'s. Start and end times are the events' own, not the time of export.
//!
//! **occl's ids.** An operation's span carries occl's deterministic ids: the attribute
//! `occl.trace_id` (equal on every rank for one collective, [`crate::ids::coll_trace`]) and
//! `occl.span_id`, and a link to that span context, so one collective's spans on all ranks can be
//! joined although each rank's span lives in its caller's trace.
//!
//! **Cost and blocking.** The span starts at the event's start and ends at its stop, on the
//! emitting thread, through the tracer's own span processor: use the SDK's batch processor (a
//! simple processor exports on the calling thread). Open spans wait in a map under a mutex.
//!
//! Turned on by [`install`] (the global tracer provider) or [`install_with`] (a provider the
//! application hands over): each registers a collector with this exporter as a process profiler,
//! so communicators created afterwards report to it.

use crate::event::{EventDescr, EventType};
use crate::held::{key, Held, Key};
use crate::ids::{self, CommKey};
use crate::mask::EventMask;
use crate::semconv::{self, Attr, Val};
use crate::spans::{CommMeta, Exporter, Span, Started, Telemetry};
use opentelemetry::global::{self, BoxedSpan, BoxedTracer, ObjectSafeTracer};
use opentelemetry::trace::{
    Link, Span as _, SpanContext, SpanId, SpanKind, TraceContextExt, TraceFlags, TraceId, TraceState, Tracer,
    TracerProvider,
};
use opentelemetry::{Context, InstrumentationScope, KeyValue, Value};
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Operations whose span context is remembered after their stop, for ProxyOps that start later
/// (under NCCL's order a ProxyOp starts after its Coll stopped).
pub const RECENT_CAP: usize = 4096;

#[derive(Default)]
struct Recent {
    map: HashMap<Key, SpanContext>,
    order: VecDeque<Key>,
}

/// The OpenTelemetry bridge (an [`Exporter`] for [`crate::spans::Telemetry`]).
pub struct OtelExporter {
    tracer: BoxedTracer,
    /// The parent of operations called without an active span: `TRACEPARENT`, else none.
    env_parent: Option<Context>,
    open: Held<BoxedSpan>,
    recent: Mutex<Recent>,
}

fn scope() -> InstrumentationScope {
    InstrumentationScope::builder("occl").with_version(env!("CARGO_PKG_VERSION")).build()
}

/// A W3C `traceparent` (`00-<32 hex trace id>-<16 hex parent id>-<2 hex flags>`) as a remote
/// span context; `None` if it is not one.
pub fn parse_traceparent(s: &str) -> Option<SpanContext> {
    let mut it = s.trim().split('-');
    let (version, trace, span, flags) = (it.next()?, it.next()?, it.next()?, it.next()?);
    let hex = |p: &str, n: usize| p.len() == n && p.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    // Version 00 has exactly four fields; a later version may append more.
    if !hex(version, 2) || version == "ff" || (version == "00" && it.next().is_some()) {
        return None;
    }
    if !hex(trace, 32) || !hex(span, 16) || !hex(flags, 2) {
        return None;
    }
    let trace = TraceId::from_hex(trace).ok()?;
    let span = SpanId::from_hex(span).ok()?;
    let flags = u8::from_str_radix(flags, 16).ok()?;
    let cx = SpanContext::new(trace, span, TraceFlags::new(flags & 1), true, TraceState::NONE);
    cx.is_valid().then_some(cx)
}

/// The process's `TRACEPARENT` as a parent context (a malformed one is logged and ignored).
fn env_parent() -> Option<Context> {
    let v = std::env::var("TRACEPARENT").ok().filter(|v| !v.trim().is_empty())?;
    match parse_traceparent(&v) {
        Some(cx) => Some(Context::new().with_remote_span_context(cx)),
        None => {
            tracing::warn!(
                "occl otel: TRACEPARENT={v:?} is not a W3C traceparent (00-<32 hex>-<16 hex>-<2 hex>); ignored"
            );
            None
        }
    }
}

fn time(ns: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_nanos(ns)
}

fn kv((k, v): Attr) -> KeyValue {
    let v = match v {
        Val::Str(s) => Value::from(s),
        Val::Int(i) => Value::I64(i),
        Val::Bool(b) => Value::Bool(b),
    };
    KeyValue::new(k, v)
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// occl's own trace id of an operation: one per collective across ranks, one per p2p tree.
fn occl_trace(ev: &Started<'_>) -> Option<[u8; 16]> {
    let c = CommKey { hash: ev.comm.hash, rank: ev.comm.rank };
    match *ev.descr {
        EventDescr::Coll { func, seq_number, .. } => Some(ids::coll_trace(c.hash, func, seq_number)),
        EventDescr::P2p { .. } => Some(ids::local_trace(c, ev.root.get())),
        _ => None,
    }
}

impl OtelExporter {
    /// An exporter that starts its spans with `tracer`.
    pub fn new(tracer: BoxedTracer) -> OtelExporter {
        OtelExporter { tracer, env_parent: env_parent(), open: Held::default(), recent: Mutex::new(Recent::default()) }
    }

    /// An exporter with the tracer (scope `occl`) of the global provider as it is now.
    pub fn global() -> OtelExporter {
        OtelExporter::new(global::tracer_provider().tracer_with_scope(scope()))
    }

    /// An exporter with the tracer (scope `occl`) of `provider`.
    pub fn with_provider<P>(provider: &P) -> OtelExporter
    where
        P: TracerProvider,
        P::Tracer: Send + Sync + 'static,
        <P::Tracer as Tracer>::Span: Send + Sync + 'static,
    {
        let t: Box<dyn ObjectSafeTracer + Send + Sync> = Box::new(provider.tracer_with_scope(scope()));
        OtelExporter::new(BoxedTracer::new(t))
    }

    /// Spans started and not yet ended.
    pub fn open_spans(&self) -> usize {
        self.open.count()
    }

    /// The parent of an operation: the caller's active span, else `TRACEPARENT`, else none.
    fn caller_context(&self) -> Context {
        let cx = Context::current();
        if cx.has_active_span() {
            return cx;
        }
        self.env_parent.clone().unwrap_or_default()
    }

    /// The span context of a started or recently ended operation.
    fn op_context(&self, k: Key) -> Option<SpanContext> {
        if let Some(cx) = self.open.with(k, |s| s.span_context().clone()) {
            return Some(cx);
        }
        self.recent.lock().unwrap_or_else(PoisonError::into_inner).map.get(&k).cloned()
    }

    fn remember(&self, k: Key, cx: SpanContext) {
        let mut r = self.recent.lock().unwrap_or_else(PoisonError::into_inner);
        if r.map.insert(k, cx).is_none() {
            r.order.push_back(k);
        }
        if r.order.len() > RECENT_CAP {
            if let Some(old) = r.order.pop_front() {
                r.map.remove(&old);
            }
        }
    }
}

impl Exporter for OtelExporter {
    fn name(&self) -> &str {
        "otel"
    }

    fn interest(&self) -> EventMask {
        [EventType::Coll, EventType::P2p, EventType::ProxyOp].into_iter().fold(EventMask::NONE, EventMask::with)
    }

    fn wants_starts(&self) -> bool {
        true
    }

    fn start(&self, ev: &Started<'_>) {
        let (name, attrs) = semconv::describe(ev.comm, ev.descr, &[], None);
        let mut attrs: Vec<KeyValue> = attrs.into_iter().map(kv).collect();
        let mut links = Vec::new();
        let parent = match ev.descr {
            EventDescr::ProxyOp { .. } => {
                // A ProxyOp whose operation this exporter never saw has no place in the tree.
                let Some(op) = ev.parent.and_then(|p| self.op_context(key(ev.comm, p.get()))) else { return };
                Context::new().with_remote_span_context(op)
            }
            _ => {
                let span_id = ids::span_id(CommKey { hash: ev.comm.hash, rank: ev.comm.rank }, ev.id.get());
                attrs.push(KeyValue::new("occl.span_id", hex(&span_id)));
                if let Some(trace) = occl_trace(ev) {
                    attrs.push(KeyValue::new("occl.trace_id", hex(&trace)));
                    let cx = SpanContext::new(
                        TraceId::from_bytes(trace),
                        SpanId::from_bytes(span_id),
                        TraceFlags::SAMPLED,
                        true,
                        TraceState::NONE,
                    );
                    links.push(Link::with_context(cx));
                }
                self.caller_context()
            }
        };
        let span = self
            .tracer
            .span_builder(name)
            .with_kind(SpanKind::Internal)
            .with_start_time(time(ev.start_ns))
            .with_attributes(attrs)
            .with_links(links)
            .start_with_context(&self.tracer, &parent);
        self.open.insert(key(ev.comm, ev.id.get()), span);
    }

    fn span(&self, s: &Span<'_>) {
        let k = key(s.comm, s.id.get());
        let Some(mut span) = self.open.remove(k) else { return };
        for e in semconv::events(s.event_type(), s.states) {
            span.add_event_with_timestamp(e.name, time(e.t_ns), e.attrs.into_iter().map(kv).collect());
        }
        if s.event_type() != EventType::ProxyOp {
            self.remember(k, span.span_context().clone());
        }
        span.end_with_timestamp(time(s.end_ns.max(s.start_ns)));
    }

    fn comm_finalize(&self, comm: &Arc<CommMeta>) {
        // Spans of a communicator destroyed mid-operation end now; its address may be reused.
        for mut s in self.open.take_comm(comm) {
            s.set_status(opentelemetry::trace::Status::error(
                "the communicator was destroyed before the operation ended",
            ));
            s.end();
        }
        let me = Arc::as_ptr(comm) as usize;
        let mut r = self.recent.lock().unwrap_or_else(PoisonError::into_inner);
        r.map.retain(|k, _| k.0 != me);
        r.order.retain(|k| k.0 != me);
    }
}

/// Registers a collector that hands occl's spans to `exporter`; communicators created from now on
/// report to it. Returns the exporter.
fn register(exporter: OtelExporter) -> Arc<OtelExporter> {
    let e = Arc::new(exporter);
    crate::profiler::register(Arc::new(Telemetry::new(vec![e.clone()])));
    e
}

/// occl's spans to the tracer of the global tracer provider (set it first:
/// `opentelemetry::global::set_tracer_provider`).
pub fn install() -> Arc<OtelExporter> {
    register(OtelExporter::global())
}

/// occl's spans to the tracer of `provider`.
pub fn install_with<P>(provider: &P) -> Arc<OtelExporter>
where
    P: TracerProvider,
    P::Tracer: Send + Sync + 'static,
    <P::Tracer as Tracer>::Span: Send + Sync + 'static,
{
    register(OtelExporter::with_provider(provider))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traceparent_is_parsed_as_the_w3c_form() {
        let cx = parse_traceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01").expect("valid");
        assert_eq!(cx.trace_id(), TraceId::from_hex("4bf92f3577b34da6a3ce929d0e0e4736").expect("hex"));
        assert_eq!(cx.span_id(), SpanId::from_hex("00f067aa0ba902b7").expect("hex"));
        assert!(cx.is_sampled() && cx.is_remote());
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x",
        ] {
            assert!(parse_traceparent(bad).is_none(), "{bad:?}");
        }
    }
}
