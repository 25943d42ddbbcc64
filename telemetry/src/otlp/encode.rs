//! OTLP's `ExportTraceServiceRequest` in protobuf wire format, written directly: the handful of
//! messages a trace export uses (field numbers from opentelemetry-proto's `trace.proto`,
//! `resource.proto`, `common.proto`, `trace_service.proto`) do not justify a code generator in
//! the library. The tests decode what this writes with the `opentelemetry-proto` crate.

use super::model::{Attr, OutSpan, Val};
use super::resource::Resource;

pub(crate) const VARINT: u32 = 0;
pub(crate) const FIXED64: u32 = 1;
pub(crate) const LEN: u32 = 2;

/// Protobuf writer with length-prefixed nesting.
#[derive(Default)]
pub struct Pb {
    pub buf: Vec<u8>,
}

fn varint_into(mut v: u64, out: &mut [u8; 10]) -> usize {
    let mut n = 0;
    while v >= 0x80 {
        out[n] = (v as u8) | 0x80;
        v >>= 7;
        n += 1;
    }
    out[n] = v as u8;
    n + 1
}

impl Pb {
    pub(crate) fn varint(&mut self, v: u64) {
        let mut b = [0u8; 10];
        let n = varint_into(v, &mut b);
        self.buf.extend_from_slice(&b[..n]);
    }

    pub(crate) fn tag(&mut self, field: u32, wire: u32) {
        self.varint(u64::from(field << 3 | wire));
    }

    pub(crate) fn bytes(&mut self, field: u32, b: &[u8]) {
        self.tag(field, LEN);
        self.varint(b.len() as u64);
        self.buf.extend_from_slice(b);
    }

    pub(crate) fn string(&mut self, field: u32, s: &str) {
        if !s.is_empty() {
            self.bytes(field, s.as_bytes());
        }
    }

    pub(crate) fn uint(&mut self, field: u32, v: u64) {
        if v != 0 {
            self.tag(field, VARINT);
            self.varint(v);
        }
    }

    pub(crate) fn fixed64(&mut self, field: u32, v: u64) {
        self.tag(field, FIXED64);
        self.buf.extend_from_slice(&v.to_le_bytes());
    }

    /// A nested message: written in place, then its length inserted before it.
    pub(crate) fn nested(&mut self, field: u32, f: impl FnOnce(&mut Pb)) {
        self.tag(field, LEN);
        let start = self.buf.len();
        f(self);
        let mut b = [0u8; 10];
        let n = varint_into((self.buf.len() - start) as u64, &mut b);
        self.buf.splice(start..start, b[..n].iter().copied());
    }

    /// `KeyValue { key = 1; AnyValue value = 2 }`, `AnyValue { string 1; bool 2; int64 3 }`.
    pub(crate) fn key_value(&mut self, field: u32, key: &str, v: &Val) {
        self.nested(field, |p| {
            p.string(1, key);
            p.nested(2, |p| match v {
                Val::Str(s) => p.bytes(1, s.as_bytes()),
                Val::Bool(b) => {
                    p.tag(2, VARINT);
                    p.varint(u64::from(*b));
                }
                Val::Int(i) => {
                    p.tag(3, VARINT);
                    p.varint(*i as u64);
                }
            });
        });
    }

    pub(crate) fn attrs(&mut self, field: u32, attrs: &[Attr]) {
        for (k, v) in attrs {
            self.key_value(field, k, v);
        }
    }

    /// `Resource { attributes = 1 }`.
    pub(crate) fn resource(&mut self, field: u32, res: &Resource) {
        self.nested(field, |p| p.attrs(1, &res.attrs));
    }

    /// `InstrumentationScope { name = 1; version = 2 }`: occl's.
    pub(crate) fn scope(&mut self, field: u32, version: &str) {
        self.nested(field, |p| {
            p.string(1, "occl");
            p.string(2, version);
        });
    }

    /// `Span` (trace.proto).
    fn span(&mut self, s: &OutSpan) {
        self.bytes(1, &s.trace);
        self.bytes(2, &s.span);
        if let Some(p) = &s.parent {
            self.bytes(4, p);
        }
        self.string(5, &s.name);
        // SPAN_KIND_INTERNAL: work inside the library, not a remote call.
        self.uint(6, 1);
        self.fixed64(7, s.start_ns);
        self.fixed64(8, s.end_ns);
        self.attrs(9, &s.attrs);
        for e in &s.events {
            self.nested(11, |p| {
                p.fixed64(1, e.t_ns);
                p.string(2, e.name);
                p.attrs(3, &e.attrs);
            });
        }
        self.uint(12, u64::from(s.dropped_events));
        if let Some(msg) = &s.error {
            // Status { message = 2; code = 3 (STATUS_CODE_ERROR = 2) }.
            self.nested(15, |p| {
                p.string(2, msg);
                p.uint(3, 2);
            });
        }
    }
}

/// The request body: each resource with its spans.
pub fn request(groups: &[(&Resource, Vec<&OutSpan>)], scope_version: &str) -> Vec<u8> {
    let mut p = Pb { buf: Vec::with_capacity(256 * groups.iter().map(|g| g.1.len()).sum::<usize>()) };
    for (res, spans) in groups {
        // ExportTraceServiceRequest.resource_spans = 1.
        p.nested(1, |p| {
            // ResourceSpans.resource = 1.
            p.resource(1, res);
            // ResourceSpans.scope_spans = 2: scope = 1, spans = 2.
            p.nested(2, |p| {
                p.scope(1, scope_version);
                for s in spans {
                    p.nested(2, |p| p.span(s));
                }
            });
        });
    }
    p.buf
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varints_and_nesting() {
        let mut b = [0u8; 10];
        let n = varint_into(1, &mut b);
        assert_eq!(&b[..n], &[1]);
        let n = varint_into(300, &mut b);
        assert_eq!(&b[..n], &[0xac, 0x02]);
        assert_eq!(varint_into(u64::MAX, &mut b), 10);
        let mut p = Pb::default();
        p.nested(1, |p| p.bytes(2, &[0u8; 200]));
        // tag, length 203 as two bytes, inner tag, inner length 200 as two bytes, data.
        assert_eq!(&p.buf[..5], &[0x0a, 0xcb, 0x01, 0x12, 0xc8]);
        assert_eq!(p.buf.len(), 1 + 2 + 1 + 2 + 200);
    }
}
