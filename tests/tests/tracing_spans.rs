//! occl's operations as `tracing` spans (`occl::telemetry::tracing_spans`): a subscriber with a
//! small recording layer sees each collective of a 2-rank job (threads of this process) as a span
//! of target `occl`, named by the collective, with its fields, nested under the test's own span
//! on the calling thread, opened and closed within it.

use occl::telemetry::tracing_spans;
use occl::{Comm, Config, RedOp};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;
use tracing::span::{Attributes, Id, Record};
use tracing::Subscriber;
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::Layer;

/// A span as the layer saw it.
#[derive(Clone, Debug)]
struct Seen {
    target: String,
    name: String,
    parent: Option<String>,
    fields: HashMap<String, String>,
    opened: Instant,
    closed: Option<Instant>,
}

#[derive(Default, Clone)]
struct Recorder {
    spans: Arc<Mutex<HashMap<u64, Seen>>>,
}

struct Fields<'a>(&'a mut HashMap<String, String>);

impl tracing::field::Visit for Fields<'_> {
    fn record_debug(&mut self, f: &tracing::field::Field, v: &dyn std::fmt::Debug) {
        self.0.insert(f.name().to_string(), format!("{v:?}"));
    }
    fn record_str(&mut self, f: &tracing::field::Field, v: &str) {
        self.0.insert(f.name().to_string(), v.to_string());
    }
}

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Recorder {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let parent = ctx.span_scope(id).and_then(|mut s| s.nth(1)).map(|p| p.name().to_string());
        let mut fields = HashMap::new();
        attrs.record(&mut Fields(&mut fields));
        let seen = Seen {
            target: attrs.metadata().target().to_string(),
            name: attrs.metadata().name().to_string(),
            parent,
            fields,
            opened: Instant::now(),
            closed: None,
        };
        self.spans.lock().expect("spans").insert(id.into_u64(), seen);
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, _: Context<'_, S>) {
        if let Some(s) = self.spans.lock().expect("spans").get_mut(&id.into_u64()) {
            values.record(&mut Fields(&mut s.fields));
        }
    }

    fn on_close(&self, id: Id, _: Context<'_, S>) {
        if let Some(s) = self.spans.lock().expect("spans").get_mut(&id.into_u64()) {
            s.closed = Some(Instant::now());
        }
    }
}

#[test]
fn operations_are_spans_nested_under_the_callers_span() {
    let rec = Recorder::default();
    let subscriber = tracing_subscriber::registry().with(rec.clone());
    tracing::subscriber::set_global_default(subscriber).expect("the test's subscriber");
    let exporter = tracing_spans::install();
    let comms = Comm::init_all_with(2, Config::default()).expect("init_all");
    let windows: Vec<(usize, Instant, Instant)> = std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .iter()
            .map(|c| {
                s.spawn(move || {
                    let step = tracing::info_span!("train_step", rank = c.rank());
                    let _in = step.enter();
                    let t0 = Instant::now();
                    let a = [1.0f32; 256];
                    let mut b = [0f32; 256];
                    c.all_reduce(&a, &mut b, RedOp::Sum).expect("all_reduce");
                    c.broadcast(&a, &mut b, 1).expect("broadcast");
                    let buf = [1u8; 64];
                    if c.rank() == 0 {
                        c.send(&buf, 1).expect("send");
                    } else {
                        let mut r = [0u8; 64];
                        c.recv(&mut r, 0).expect("recv");
                    }
                    (c.rank(), t0, Instant::now())
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("rank thread")).collect()
    });
    assert_eq!(exporter.open_spans(), 0, "every operation's span closed");
    for c in comms {
        c.destroy().expect("destroy");
    }
    let spans = rec.spans.lock().expect("spans").clone();
    for (rank, t0, t1) in windows {
        let r = rank.to_string();
        let mut ops: Vec<&Seen> =
            spans.values().filter(|s| s.target == "occl" && s.fields.get("rank") == Some(&r)).collect();
        ops.sort_by_key(|s| s.opened);
        let names: Vec<&str> = ops.iter().map(|s| s.name.as_str()).collect();
        let p2p = if rank == 0 { "Send" } else { "Recv" };
        assert_eq!(names, ["AllReduce", "Broadcast", p2p], "rank {rank}");
        for s in ops {
            let ctx = format!("rank {rank} {s:?}");
            assert_eq!(s.parent.as_deref(), Some("train_step"), "{ctx}: nested under the caller's span");
            let closed = s.closed.unwrap_or_else(|| panic!("{ctx}: never closed"));
            assert!(s.opened >= t0 && closed <= t1 && s.opened <= closed, "{ctx}: inside the caller's span");
            assert_eq!(s.fields["op"], s.name, "{ctx}");
            assert_eq!(s.fields["nranks"], "2", "{ctx}");
            assert_eq!(s.fields["comm"].len(), 16, "{ctx}");
            if s.name == p2p {
                assert_eq!((s.fields["count"].as_str(), s.fields["dtype"].as_str()), ("64", "ncclUint8"), "{ctx}");
                assert_eq!(s.fields["peer"], (1 - rank).to_string(), "{ctx}");
            } else {
                assert_eq!((s.fields["count"].as_str(), s.fields["bytes"].as_str()), ("256", "1024"), "{ctx}");
                assert_eq!(s.fields["dtype"], "ncclFloat32", "{ctx}");
                assert_eq!(s.fields["seq"], "1", "{ctx}: first of its kind");
                assert!(!s.fields["algo"].is_empty() && !s.fields["proto"].is_empty(), "{ctx}");
            }
        }
    }
}
