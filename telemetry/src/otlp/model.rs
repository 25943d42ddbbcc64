//! A resolved span in the OTLP model: trace and span ids, parent, times, status; its name,
//! attributes and span events are [`crate::semconv`]'s.

use super::ids;
use super::resolve::Resolved;
use crate::semconv;
use std::borrow::Cow;

pub use crate::semconv::{datatype_size, state_name, Attr, OutEvent, Val};

/// A span ready to encode.
#[derive(Clone, Debug, PartialEq)]
pub struct OutSpan {
    /// The rank whose resource the span goes under (`service.instance.id`).
    pub instance: i64,
    pub trace: [u8; 16],
    pub span: [u8; 8],
    pub parent: Option<[u8; 8]>,
    pub name: Cow<'static, str>,
    pub start_ns: u64,
    pub end_ns: u64,
    pub attrs: Vec<Attr>,
    pub events: Vec<OutEvent>,
    pub dropped_events: u32,
    /// Status ERROR with this message; unset otherwise.
    pub error: Option<String>,
}

/// The OTLP form of a resolved span. `track_steps`: ProxyStep events were collected, so a
/// ProxyOp's `steps_done` is meaningful.
pub fn out_span(r: &Resolved, rank_override: Option<i64>, track_steps: bool) -> OutSpan {
    let rec = &r.rec;
    let c = rec.key();
    let marks = rec.marks();
    let (name, attrs) = semconv::describe(&rec.comm, &rec.descr, marks, track_steps.then_some(rec.steps_done));
    let events = semconv::events(rec.descr.event_type(), marks);
    let parent = match r.parent_override.or(rec.parent) {
        // A root's own id never names its parent.
        Some(p) if p != rec.id => Some(ids::span_id(c, p)),
        _ => None,
    };
    OutSpan {
        instance: rank_override.unwrap_or(i64::from(rec.comm.rank)),
        trace: r.trace,
        span: ids::span_id(c, rec.id),
        parent,
        name,
        start_ns: rec.start_ns,
        end_ns: rec.end_ns.max(rec.start_ns),
        attrs,
        events,
        dropped_events: rec.marks_dropped,
        error: r.error.clone(),
    }
}
