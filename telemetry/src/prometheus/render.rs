//! The exporter's counters as Prometheus text exposition (format 0.0.4): one `# HELP` and
//! `# TYPE` per family, every sample of a family together, families without samples left out.

use super::comm::{CommStats, Kind, OpKey, OpSeries, DIRECTIONS, LOST_REASONS, STEP_STATES};
use super::hist::Snapshot;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// A metric family: name, type and help text.
pub(crate) struct Family {
    pub name: &'static str,
    pub kind: &'static str,
    pub help: &'static str,
}

const fn fam(name: &'static str, kind: &'static str, help: &'static str) -> Family {
    Family { name, kind, help }
}

pub(crate) const COMM_INFO: Family = fam(
    "occl_communicator_info",
    "gauge",
    "Communicator ranks of this process (always 1); nranks and nnodes are the communicator's size and node count.",
);
/// Per (collective, point-to-point): operations, bytes, size histogram, duration histogram.
pub(crate) const OPS: [[Family; 4]; 2] = [
    [
        fam("occl_collective_operations_total", "counter", "Collectives that ended (failed ones too), per communicator rank, op, algorithm, protocol and datatype."),
        fam("occl_collective_bytes_total", "counter", "Bytes of collectives: count x element size as the descriptor counts (per rank for AllGather, ReduceScatter, AlltoAll)."),
        fam("occl_collective_message_size_bytes", "histogram", "Size of each collective in bytes (count x element size)."),
        fam("occl_collective_duration_seconds", "histogram", "Time from a collective's start to its end (the last of its proxy operations where they outlive it)."),
    ],
    [
        fam("occl_p2p_operations_total", "counter", "Point-to-point operations (Send, Recv) that ended, per communicator rank, op and datatype."),
        fam("occl_p2p_bytes_total", "counter", "Bytes of point-to-point operations (count x element size)."),
        fam("occl_p2p_message_size_bytes", "histogram", "Size of each point-to-point operation in bytes."),
        fam("occl_p2p_duration_seconds", "histogram", "Time from a point-to-point operation's start to its end."),
    ],
];
pub(crate) const BUS_BYTES: Family = fam(
    "occl_collective_bus_bytes_total",
    "counter",
    "Bytes x nccl-tests' bus factor, counted with the duration: bus bandwidth = rate(this) / rate(occl_collective_duration_seconds_sum).",
);
pub(crate) const STEPS: Family =
    fam("occl_proxy_steps_total", "counter", "Proxy steps (network slices) completed, by direction.");
pub(crate) const STEP_BYTES: Family =
    fam("occl_proxy_step_bytes_total", "counter", "Bytes proxy steps moved (transSize), by direction.");
pub(crate) const STEP_WAIT: Family = fam(
    "occl_proxy_step_wait_seconds_total",
    "counter",
    "Time proxy steps spent in each state: waiting for the GPU, the peer's credit, the network or the consumer.",
);
pub(crate) const SOCKET_BYTES: Family = fam(
    "occl_net_socket_bytes_total",
    "counter",
    "Bytes of socket requests reported by the network plugin events, by direction.",
);
pub(crate) const TRANSPORT_BYTES: Family = fam(
    "occl_transport_bytes_total",
    "counter",
    "Bytes moved to or from peers, by transport (shm, tcp) and direction.",
);
pub(crate) const ERRORS: Family =
    fam("occl_operation_errors_total", "counter", "Operations that failed, by op and error kind.");
pub(crate) const LOST: Family = fam(
    "occl_metrics_dropped_total",
    "counter",
    "Observations the metrics exporter could not record, by reason (series or communicator limit reached).",
);

/// Every family this exporter writes, in output order (for the docs test).
#[cfg(test)]
pub(crate) fn families() -> Vec<&'static Family> {
    let mut v = vec![&COMM_INFO];
    for k in &OPS {
        v.extend(k.iter());
    }
    v.extend([&BUS_BYTES, &STEPS, &STEP_BYTES, &STEP_WAIT, &SOCKET_BYTES, &TRANSPORT_BYTES, &ERRORS, &LOST]);
    v
}

/// Appends `v` as a label value: backslash, double quote and newline escaped.
fn escaped(out: &mut String, v: &str) {
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
}

/// Label pairs, comma-separated, without braces.
fn pairs(out: &mut String, labels: &[(&str, &str)]) {
    for (i, (k, v)) in labels.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(k);
        out.push_str("=\"");
        escaped(out, v);
        out.push('"');
    }
}

/// The labels every series of a communicator rank carries.
fn comm_labels(c: &CommStats) -> String {
    let mut s = String::new();
    pairs(&mut s, &[("comm", &format!("{:016x}", c.hash))]);
    if let Some(n) = &c.name {
        s.push(',');
        pairs(&mut s, &[("comm_name", n)]);
    }
    let _ = write!(s, ",rank=\"{}\"", c.rank);
    s
}

/// Writes families one at a time: samples go to a buffer, and the family is emitted only if it
/// got any.
struct Writer<'o> {
    out: &'o mut String,
    buf: String,
}

impl Writer<'_> {
    fn family(&mut self, f: &Family, fill: impl FnOnce(&mut String)) {
        self.buf.clear();
        fill(&mut self.buf);
        if !self.buf.is_empty() {
            let _ = writeln!(self.out, "# HELP {} {}\n# TYPE {} {}", f.name, f.help, f.name, f.kind);
            self.out.push_str(&self.buf);
        }
    }
}

/// One sample line: `name{base,extra} value`.
fn sample(out: &mut String, name: &str, base: &str, extra: &[(&str, &str)], value: impl std::fmt::Display) {
    out.push_str(name);
    out.push('{');
    out.push_str(base);
    if !extra.is_empty() {
        if !base.is_empty() {
            out.push(',');
        }
        pairs(out, extra);
    }
    let _ = writeln!(out, "}} {value}");
}

/// A histogram's `_bucket`, `_sum` and `_count` lines; sub-units divided by `per_unit` are base
/// units (a division keeps 1000 ns exactly "0.000001").
fn histogram(out: &mut String, name: &str, labels: &str, h: &Snapshot<'_>, per_unit: f64) {
    let bucket = format!("{name}_bucket");
    for (b, c) in h.bounds.iter().zip(&h.cumulative) {
        let le = format!("{}", *b as f64 / per_unit);
        sample(out, &bucket, labels, &[("le", &le)], c);
    }
    sample(out, &bucket, labels, &[("le", "+Inf")], h.count);
    sample(out, &format!("{name}_sum"), labels, &[], h.sum as f64 / per_unit);
    sample(out, &format!("{name}_count"), labels, &[], h.count);
}

fn seconds(ns: u64) -> f64 {
    ns as f64 / 1e9
}

/// Everything, for communicator ranks `comms` (any order; sorted here) and the exporter's own
/// loss counters.
pub(crate) fn render(out: &mut String, comms: &[&CommStats], lost: &[AtomicU64]) {
    let mut comms: Vec<(&CommStats, String)> = comms.iter().map(|c| (*c, comm_labels(c))).collect();
    comms.sort_by_key(|(c, _)| (c.hash, c.rank));
    let mut w = Writer { out, buf: String::new() };
    w.family(&COMM_INFO, |o| {
        for (c, l) in &comms {
            let (n, nodes) = (c.nranks.to_string(), c.n_nodes.to_string());
            sample(o, COMM_INFO.name, l, &[("nranks", &n), ("nnodes", &nodes)], 1);
        }
    });
    // Each communicator rank's op series, sorted by their labels, with the labels written once.
    type Row<'a> = (&'a OpSeries, String);
    let rows = |kind: Kind| -> Vec<Row<'_>> {
        let mut v: Vec<(&String, OpKey, &OpSeries)> = Vec::new();
        for (c, l) in &comms {
            let at = v.len();
            v.extend(c.ops[kind as usize].iter().map(|(k, s)| (l, *k, s)));
            v[at..].sort_by_key(|(_, k, _)| *k);
        }
        v.into_iter()
            .map(|(l, k, s)| {
                let mut labels = l.clone();
                labels.push(',');
                let mut kv = vec![("op", k.op)];
                if kind == Kind::Coll {
                    kv.extend([("algo", k.algo), ("proto", k.proto)]);
                }
                kv.extend([("dtype", k.dtype), ("size_class", k.size_class)]);
                pairs(&mut labels, &kv);
                (s, labels)
            })
            .collect()
    };
    for kind in [Kind::Coll, Kind::P2p] {
        let rows = rows(kind);
        let [ops, bytes, size, duration] = &OPS[kind as usize];
        w.family(ops, |o| rows.iter().for_each(|(s, l)| sample(o, ops.name, l, &[], s.size.totals().0)));
        w.family(bytes, |o| rows.iter().for_each(|(s, l)| sample(o, bytes.name, l, &[], s.size.totals().1)));
        w.family(size, |o| rows.iter().for_each(|(s, l)| histogram(o, size.name, l, &s.size.snapshot(), 1.0)));
        w.family(duration, |o| {
            rows.iter().for_each(|(s, l)| histogram(o, duration.name, l, &s.duration.snapshot(), 1e9))
        });
        if kind == Kind::Coll {
            w.family(&BUS_BYTES, |o| {
                rows.iter().for_each(|(s, l)| sample(o, BUS_BYTES.name, l, &[], s.bus_bytes.load(Relaxed)))
            });
        }
    }
    let per_dir = |o: &mut String, f: &Family, pick: &dyn Fn(&CommStats) -> &[AtomicU64; 2]| {
        for (c, l) in &comms {
            let v = pick(c);
            if v.iter().any(|x| x.load(Relaxed) != 0) {
                for (d, x) in DIRECTIONS.iter().zip(v) {
                    sample(o, f.name, l, &[("direction", d)], x.load(Relaxed));
                }
            }
        }
    };
    w.family(&STEPS, |o| per_dir(o, &STEPS, &|c| &c.steps));
    w.family(&STEP_BYTES, |o| per_dir(o, &STEP_BYTES, &|c| &c.step_bytes));
    w.family(&STEP_WAIT, |o| {
        for (c, l) in &comms {
            if c.steps.iter().any(|x| x.load(Relaxed) != 0) {
                for ((_, st), x) in STEP_STATES.iter().zip(&c.step_wait_ns) {
                    sample(o, STEP_WAIT.name, l, &[("state", st)], seconds(x.load(Relaxed)));
                }
            }
        }
    });
    w.family(&SOCKET_BYTES, |o| per_dir(o, &SOCKET_BYTES, &|c| &c.socket_bytes));
    w.family(&TRANSPORT_BYTES, |o| {
        for (c, l) in &comms {
            let mut t: Vec<_> = c.transport_bytes.iter().collect();
            t.sort_by_key(|(k, _)| **k);
            for (tr, v) in t {
                for (d, x) in DIRECTIONS.iter().zip(v) {
                    sample(o, TRANSPORT_BYTES.name, l, &[("transport", tr), ("direction", d)], x.load(Relaxed));
                }
            }
        }
    });
    w.family(&ERRORS, |o| {
        for (c, l) in &comms {
            let mut e: Vec<_> = c.errors.iter().collect();
            e.sort_by_key(|(k, _)| **k);
            for ((op, kind), n) in e {
                sample(o, ERRORS.name, l, &[("op", op), ("kind", kind)], n.load(Relaxed));
            }
        }
    });
    w.family(&LOST, |o| {
        for (r, n) in LOST_REASONS.iter().zip(lost) {
            sample(o, LOST.name, "", &[("reason", r)], n.load(Relaxed));
        }
    });
}
