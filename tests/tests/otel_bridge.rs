//! occl's spans in an application's own OpenTelemetry SDK (`occl::telemetry::otel`): a program
//! with `opentelemetry_sdk`'s tracer and in-memory exporter runs collectives on 2 ranks (threads
//! of this process, one communicator each) inside spans of its own, and finds occl's operations
//! as children of those spans with their real times, ProxyOps under them, and occl's cross-rank
//! trace id as a link and attribute; an operation called without an active span is a root, and
//! with `TRACEPARENT` in the environment a child of it.
//!
//! One test function: the bridge is registered process-wide, and `TRACEPARENT` is read from the
//! environment when the exporter is made.

use occl::telemetry::otel;
use occl::{Comm, Config, RedOp};
use opentelemetry::trace::{SpanContext, SpanId, TraceContextExt, TraceId, Tracer, TracerProvider as _};
use opentelemetry::{Context, Value};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use std::time::SystemTime;

fn provider() -> (SdkTracerProvider, InMemorySpanExporter) {
    let exp = InMemorySpanExporter::default();
    (SdkTracerProvider::builder().with_simple_exporter(exp.clone()).build(), exp)
}

fn attr<'a>(s: &'a SpanData, k: &str) -> Option<&'a Value> {
    s.attributes.iter().find(|kv| kv.key.as_str() == k).map(|kv| &kv.value)
}

fn attr_s(s: &SpanData, k: &str) -> String {
    attr(s, k).map(|v| v.as_str().into_owned()).unwrap_or_default()
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// One rank's part: an application span around two all-reduces and a send or receive.
struct Step {
    rank: usize,
    parent: SpanContext,
    t0: SystemTime,
    t1: SystemTime,
}

fn finished(e: &InMemorySpanExporter) -> Vec<SpanData> {
    e.get_finished_spans().expect("finished spans")
}

fn occl_spans(all: &[SpanData]) -> Vec<&SpanData> {
    all.iter().filter(|s| s.instrumentation_scope.name() == "occl").collect()
}

#[test]
fn occl_spans_are_children_of_the_callers_span_or_of_traceparent() {
    let (pa, ea) = provider();
    let bridge = otel::install_with(&pa);
    let app = pa.tracer("trainer");
    let comms = Comm::init_all_with(2, Config::default()).expect("init_all");
    let steps: Vec<Step> = std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .iter()
            .map(|c| {
                let app = &app;
                s.spawn(move || {
                    let cx = Context::current_with_span(app.start("train step"));
                    let guard = cx.clone().attach();
                    let t0 = SystemTime::now();
                    let a = [1.0f32; 1024];
                    let mut b = [0f32; 1024];
                    c.all_reduce(&a, &mut b, RedOp::Sum).expect("all_reduce");
                    c.all_reduce(&b.clone(), &mut b, RedOp::Sum).expect("all_reduce");
                    assert_eq!(b[0], 4.0);
                    let buf = [7u8; 4096];
                    if c.rank() == 0 {
                        c.send(&buf, 1).expect("send");
                    } else {
                        let mut r = [0u8; 4096];
                        c.recv(&mut r, 0).expect("recv");
                    }
                    let t1 = SystemTime::now();
                    drop(guard);
                    cx.span().end();
                    Step { rank: c.rank(), parent: cx.span().span_context().clone(), t0, t1 }
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("rank thread")).collect()
    });
    // No active span: a root.
    std::thread::scope(|s| {
        for c in &comms {
            s.spawn(move || {
                let mut b = [1i32; 16];
                c.all_reduce_in_place(&mut b, RedOp::Sum).expect("all_reduce");
            });
        }
    });
    assert_eq!(bridge.open_spans(), 0, "every started span ended");
    pa.force_flush().expect("flush");
    let all = finished(&ea);
    let spans = occl_spans(&all);
    let mut link_traces: Vec<Vec<String>> = vec![Vec::new(); 2];
    let ns = |t: SystemTime| t.duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    for st in &steps {
        let rank = st.rank.to_string();
        let mine: Vec<&SpanData> = spans
            .iter()
            .copied()
            .filter(|s| attr(s, "occl.rank").map(|v| v.as_str().into_owned()) == Some(rank.clone()))
            .collect();
        let mut ops: Vec<&SpanData> =
            mine.iter().copied().filter(|s| s.parent_span_id == st.parent.span_id()).collect();
        ops.sort_by_key(|s| s.start_time);
        let names: Vec<&str> = ops.iter().map(|s| s.name.as_ref()).collect();
        let p2p = if st.rank == 0 { "Send" } else { "Recv" };
        assert_eq!(names, ["AllReduce", "AllReduce", p2p], "rank {rank}: operations under the caller's span");
        for op in &ops {
            let ctx = format!("rank {rank} {} {:?}", op.name, op.attributes);
            assert_eq!(op.span_context.trace_id(), st.parent.trace_id(), "{ctx}: in the caller's trace");
            assert!(
                op.start_time >= st.t0 && op.end_time <= st.t1 && op.start_time <= op.end_time,
                "{ctx}: times: the step {}..{} ns, the operation {}..{} ns",
                ns(st.t0),
                ns(st.t1),
                ns(op.start_time),
                ns(op.end_time)
            );
            assert_eq!(attr_s(op, "occl.event"), if op.name == p2p { "P2p" } else { "Coll" }, "{ctx}");
            assert_eq!(attr_s(op, "occl.nranks"), "2", "{ctx}");
            // occl's own ids: an attribute and a link that say the same.
            let links = &op.links.links;
            assert_eq!(links.len(), 1, "{ctx}: one link");
            let tid = hex(&links[0].span_context.trace_id().to_bytes());
            assert_eq!(attr_s(op, "occl.trace_id"), tid, "{ctx}");
            assert_eq!(attr_s(op, "occl.span_id"), hex(&links[0].span_context.span_id().to_bytes()), "{ctx}");
            if op.name == "AllReduce" {
                assert_eq!(attr_s(op, "occl.count"), "1024", "{ctx}");
                link_traces[st.rank].push(tid);
            }
            // ProxyOps under it, inside its times, with their state events.
            let proxies: Vec<&&SpanData> =
                mine.iter().filter(|s| s.parent_span_id == op.span_context.span_id()).collect();
            assert!(!proxies.is_empty(), "{ctx}: no ProxyOp under the operation");
            for p in proxies {
                assert!(matches!(p.name.as_ref(), "proxy send" | "proxy recv"), "{ctx}: child {}", p.name);
                assert_eq!(p.span_context.trace_id(), op.span_context.trace_id());
                assert!(p.start_time >= op.start_time && p.end_time <= op.end_time, "{ctx}: ProxyOp inside");
                assert!(!p.events.events.is_empty(), "{ctx}: ProxyOp state events");
            }
        }
    }
    // One collective, one occl trace id on both ranks; two collectives, two ids.
    assert_eq!(link_traces[0], link_traces[1], "the cross-rank trace ids agree");
    assert_ne!(link_traces[0][0], link_traces[0][1]);
    // The operation called without a span: a root of a new trace.
    let roots: Vec<&&SpanData> =
        spans.iter().filter(|s| s.parent_span_id == SpanId::INVALID && s.name == "AllReduce").collect();
    assert_eq!(roots.len(), 2, "one root AllReduce per rank");
    for r in roots {
        assert!(steps.iter().all(|st| st.parent.trace_id() != r.span_context.trace_id()));
        assert_eq!(attr_s(r, "occl.datatype"), "ncclInt32");
    }
    for c in comms {
        c.destroy().expect("destroy");
    }

    // TRACEPARENT: a second bridge, made with it in the environment, for new communicators.
    let traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    // SAFETY of the process: no other thread of this test binary reads the environment now.
    std::env::set_var("TRACEPARENT", traceparent);
    let (pb, eb) = provider();
    let _bridge_b = otel::install_with(&pb);
    std::env::remove_var("TRACEPARENT");
    let comms = Comm::init_all_with(2, Config::default()).expect("init_all");
    std::thread::scope(|s| {
        for c in &comms {
            s.spawn(move || {
                let mut b = [1f64; 8];
                c.all_reduce_in_place(&mut b, RedOp::Sum).expect("all_reduce");
            });
        }
    });
    for c in comms {
        c.destroy().expect("destroy");
    }
    pb.force_flush().expect("flush");
    let all = finished(&eb);
    let ops: Vec<&SpanData> = occl_spans(&all).into_iter().filter(|s| s.name == "AllReduce").collect();
    assert_eq!(ops.len(), 2, "one AllReduce per rank: {ops:?}");
    for op in ops {
        assert_eq!(op.span_context.trace_id(), TraceId::from_hex("4bf92f3577b34da6a3ce929d0e0e4736").expect("hex"));
        assert_eq!(op.parent_span_id, SpanId::from_hex("00f067aa0ba902b7").expect("hex"));
        assert!(op.parent_span_is_remote, "TRACEPARENT is a remote parent");
    }
}
