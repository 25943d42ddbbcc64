//! The same request as OTLP/JSON (`http/json`): the protobuf JSON mapping with OTLP's two
//! departures, trace and span ids as hex strings and enums as integers; 64-bit integers are
//! strings, as the protobuf JSON mapping writes them.

use super::model::{Attr, OutSpan, Val};
use super::resource::Resource;
use serde_json::{json, Map, Value};

fn hex(b: &[u8]) -> String {
    use std::fmt::Write;
    b.iter().fold(String::with_capacity(b.len() * 2), |mut s, x| {
        let _ = write!(s, "{x:02x}");
        s
    })
}

fn attrs(a: &[Attr]) -> Value {
    Value::Array(
        a.iter()
            .map(|(k, v)| {
                let v = match v {
                    Val::Str(s) => json!({ "stringValue": s }),
                    Val::Int(i) => json!({ "intValue": i.to_string() }),
                    Val::Bool(b) => json!({ "boolValue": b }),
                };
                json!({ "key": k, "value": v })
            })
            .collect(),
    )
}

fn span(s: &OutSpan) -> Value {
    let mut m = Map::new();
    m.insert("traceId".into(), hex(&s.trace).into());
    m.insert("spanId".into(), hex(&s.span).into());
    if let Some(p) = &s.parent {
        m.insert("parentSpanId".into(), hex(p).into());
    }
    m.insert("name".into(), s.name.as_ref().into());
    m.insert("kind".into(), 1.into());
    m.insert("startTimeUnixNano".into(), s.start_ns.to_string().into());
    m.insert("endTimeUnixNano".into(), s.end_ns.to_string().into());
    m.insert("attributes".into(), attrs(&s.attrs));
    let events: Vec<Value> = s
        .events
        .iter()
        .map(|e| json!({ "timeUnixNano": e.t_ns.to_string(), "name": e.name, "attributes": attrs(&e.attrs) }))
        .collect();
    m.insert("events".into(), events.into());
    if s.dropped_events > 0 {
        m.insert("droppedEventsCount".into(), s.dropped_events.into());
    }
    if let Some(msg) = &s.error {
        m.insert("status".into(), json!({ "code": 2, "message": msg }));
    }
    Value::Object(m)
}

/// The request body.
pub fn request(groups: &[(&Resource, Vec<&OutSpan>)], scope_version: &str) -> Vec<u8> {
    let rs: Vec<Value> = groups
        .iter()
        .map(|(res, spans)| {
            json!({
                "resource": { "attributes": attrs(&res.attrs) },
                "scopeSpans": [{
                    "scope": { "name": "occl", "version": scope_version },
                    "spans": spans.iter().map(|s| span(s)).collect::<Vec<_>>(),
                }],
            })
        })
        .collect();
    serde_json::to_vec(&json!({ "resourceSpans": rs })).unwrap_or_default()
}
