"""Decodes the OTLP/HTTP request bodies saved by otlp_sink.py and prints the span tree: names,
child -> parent counts, resources and one AllReduce span's attributes (needs opentelemetry-proto).

usage: decode_otlp.py <dir>
"""
import collections, glob, sys
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
spans, res = [], collections.Counter()
for p in sorted(glob.glob(sys.argv[1] + "/*.pb")):
    req = trace_service_pb2.ExportTraceServiceRequest()
    req.ParseFromString(open(p, "rb").read())
    for rs in req.resource_spans:
        attrs = {a.key: a.value.string_value or a.value.int_value for a in rs.resource.attributes}
        res[(attrs.get("service.name"), attrs.get("service.instance.id"), attrs.get("host.name"))] += 1
        for ss in rs.scope_spans:
            for s in ss.spans:
                spans.append((s, {a.key: (a.value.string_value or a.value.int_value or a.value.double_value) for a in s.attributes}))
print("requests:", len(glob.glob(sys.argv[1] + "/*.pb")), "spans:", len(spans))
print("resources:", dict(res))
by_id = {s.span_id: (s, a) for s, a in spans}
names = collections.Counter(s.name for s, _ in spans)
print("span names:", dict(names.most_common(12)))
parents = collections.Counter()
orphans = 0
for s, a in spans:
    if s.parent_span_id:
        p = by_id.get(s.parent_span_id)
        if p is None:
            orphans += 1
        else:
            parents[(s.name.split(" ")[0], p[0].name.split(" ")[0])] += 1
    else:
        parents[(s.name.split(" ")[0], "-")] += 1
print("child -> parent:", dict(parents.most_common(12)))
print("children whose parent was not exported:", orphans)
ex = [a for s, a in spans if s.name.startswith("AllReduce")][:1]
print("an AllReduce span's attributes:", ex)
events = sum(len(s.events) for s, _ in spans)
print("span events:", events)
