//! The exporter's counters as a metrics snapshot ([`crate::metrics`]): every family in output
//! order, samples sorted by communicator rank and then by their labels, read in one pass. The
//! counters are read through `CommStats`' and `OpSeries`' accessors only.

use super::comm::{CommStats, Kind, OpKey, OpSeries, DIRECTIONS, LOST_REASONS, STEP_STATES};
use super::hist::Snapshot;
use crate::metrics::{Descr, Family, Histogram, Kind as K, Unit, Value};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

const fn fam(name: &'static str, kind: K, unit: Unit, help: &'static str) -> Descr {
    Descr::new(name, kind, unit, help)
}

pub(crate) const COMM_INFO: Descr = fam(
    "occl_communicator_info",
    K::Gauge,
    Unit::None,
    "Communicator ranks of this process (always 1); nranks and nnodes are the communicator's size and node count.",
);
/// Per (collective, point-to-point): operations, bytes, size histogram, duration histogram.
pub(crate) const OPS: [[Descr; 4]; 2] = [
    [
        fam("occl_collective_operations_total", K::Counter, Unit::None, "Collectives that ended (failed ones too), per communicator rank, op, algorithm, protocol and datatype."),
        fam("occl_collective_bytes_total", K::Counter, Unit::Bytes, "Bytes of collectives: count x element size as the descriptor counts (per rank for AllGather, ReduceScatter, AlltoAll)."),
        fam("occl_collective_message_size_bytes", K::Histogram, Unit::Bytes, "Size of each collective in bytes (count x element size)."),
        fam("occl_collective_duration_seconds", K::Histogram, Unit::Seconds, "Time from a collective's start to its end (the last of its proxy operations where they outlive it)."),
    ],
    [
        fam("occl_p2p_operations_total", K::Counter, Unit::None, "Point-to-point operations (Send, Recv) that ended, per communicator rank, op and datatype."),
        fam("occl_p2p_bytes_total", K::Counter, Unit::Bytes, "Bytes of point-to-point operations (count x element size)."),
        fam("occl_p2p_message_size_bytes", K::Histogram, Unit::Bytes, "Size of each point-to-point operation in bytes."),
        fam("occl_p2p_duration_seconds", K::Histogram, Unit::Seconds, "Time from a point-to-point operation's start to its end."),
    ],
];
pub(crate) const BUS_BYTES: Descr = fam(
    "occl_collective_bus_bytes_total",
    K::Counter,
    Unit::Bytes,
    "Bytes x nccl-tests' bus factor, counted with the duration: bus bandwidth = rate(this) / rate(occl_collective_duration_seconds_sum).",
);
pub(crate) const STEPS: Descr =
    fam("occl_proxy_steps_total", K::Counter, Unit::None, "Proxy steps (network slices) completed, by direction.");
pub(crate) const STEP_BYTES: Descr =
    fam("occl_proxy_step_bytes_total", K::Counter, Unit::Bytes, "Bytes proxy steps moved (transSize), by direction.");
pub(crate) const STEP_WAIT: Descr = fam(
    "occl_proxy_step_wait_seconds_total",
    K::Counter,
    Unit::Seconds,
    "Time proxy steps spent in each state: waiting for the GPU, the peer's credit, the network or the consumer.",
);
pub(crate) const SOCKET_BYTES: Descr = fam(
    "occl_net_socket_bytes_total",
    K::Counter,
    Unit::Bytes,
    "Bytes of socket requests reported by the network plugin events, by direction.",
);
pub(crate) const TRANSPORT_BYTES: Descr = fam(
    "occl_transport_bytes_total",
    K::Counter,
    Unit::Bytes,
    "Bytes moved to or from peers, by transport (shm, tcp) and direction.",
);
pub(crate) const ERRORS: Descr =
    fam("occl_operation_errors_total", K::Counter, Unit::None, "Operations that failed, by op and error kind.");
pub(crate) const LOST: Descr = fam(
    "occl_metrics_dropped_total",
    K::Counter,
    Unit::None,
    "Observations the metrics exporter could not record, by reason (series or communicator limit reached).",
);

/// Every family this exporter writes, in output order (for the docs test).
#[cfg(test)]
pub(crate) fn families() -> Vec<&'static Descr> {
    let mut v = vec![&COMM_INFO];
    for k in &OPS {
        v.extend(k.iter());
    }
    v.extend([&BUS_BYTES, &STEPS, &STEP_BYTES, &STEP_WAIT, &SOCKET_BYTES, &TRANSPORT_BYTES, &ERRORS, &LOST]);
    v
}

type Labels = Vec<(&'static str, String)>;

/// The labels every series of a communicator rank carries.
fn comm_labels(c: &CommStats) -> Labels {
    let mut l = vec![("comm", format!("{:016x}", c.hash))];
    if let Some(n) = &c.name {
        l.push(("comm_name", n.clone()));
    }
    l.push(("rank", c.rank.to_string()));
    l
}

fn with(base: &Labels, extra: &[(&'static str, &str)]) -> Labels {
    let mut l = base.clone();
    l.extend(extra.iter().map(|(k, v)| (*k, (*v).to_string())));
    l
}

/// A histogram in base units: sub-units divided by `per_unit` (a division keeps 1000 ns exactly
/// "0.000001").
fn histogram(h: &Snapshot<'_>, per_unit: f64) -> Value {
    Value::Histogram(Histogram {
        bounds: h.bounds.iter().map(|b| *b as f64 / per_unit).collect(),
        cumulative: h.cumulative.clone(),
        count: h.count,
        sum: h.sum as f64 / per_unit,
    })
}

fn seconds(ns: u64) -> Value {
    Value::Float(ns as f64 / 1e9)
}

fn int(c: &AtomicU64) -> Value {
    Value::Int(c.load(Relaxed))
}

/// Every family, for communicator ranks `comms` (any order; sorted here) and the exporter's own
/// loss counters.
pub(crate) fn build(out: &mut Vec<Family>, comms: &[&CommStats], lost: &[AtomicU64]) {
    let mut comms: Vec<(&CommStats, Labels)> = comms.iter().map(|c| (*c, comm_labels(c))).collect();
    comms.sort_by_key(|(c, _)| (c.hash, c.rank));
    let mut info = Family::new(COMM_INFO);
    for (c, l) in &comms {
        let (n, nodes) = (c.nranks.to_string(), c.n_nodes.to_string());
        info.push(with(l, &[("nranks", &n), ("nnodes", &nodes)]), Value::Int(1));
    }
    out.push(info);
    // Each communicator rank's op series, sorted by their labels.
    let rows = |kind: Kind| -> Vec<(&OpSeries, Labels)> {
        let mut v: Vec<(&Labels, OpKey, &OpSeries)> = Vec::new();
        for (c, l) in &comms {
            let at = v.len();
            v.extend(c.op_series(kind).map(|(k, s)| (l, k, s)));
            v[at..].sort_by_key(|(_, k, _)| *k);
        }
        v.into_iter()
            .map(|(l, k, s)| {
                let mut kv = vec![("op", k.op)];
                if kind == Kind::Coll {
                    kv.extend([("algo", k.algo), ("proto", k.proto)]);
                }
                kv.extend([("dtype", k.dtype), ("size_class", k.size_class)]);
                (s, with(l, &kv))
            })
            .collect()
    };
    for kind in [Kind::Coll, Kind::P2p] {
        let rows = rows(kind);
        let [ops, bytes, size, duration] = OPS[kind as usize].map(Family::new);
        let mut fams = [ops, bytes, size, duration];
        let mut bus = Family::new(BUS_BYTES);
        for (s, l) in rows {
            let (n, b) = s.totals();
            fams[0].push(l.clone(), Value::Int(n));
            fams[1].push(l.clone(), Value::Int(b));
            fams[2].push(l.clone(), histogram(&s.size_snapshot(), 1.0));
            fams[3].push(l.clone(), histogram(&s.duration_snapshot(), 1e9));
            if kind == Kind::Coll {
                bus.push(l, Value::Int(s.bus_bytes()));
            }
        }
        out.extend(fams);
        if kind == Kind::Coll {
            out.push(bus);
        }
    }
    let per_dir = |d: Descr, pick: &dyn Fn(&CommStats) -> &[AtomicU64; 2]| {
        let mut f = Family::new(d);
        for (c, l) in &comms {
            let v = pick(c);
            if v.iter().any(|x| x.load(Relaxed) != 0) {
                for (dir, x) in DIRECTIONS.iter().zip(v) {
                    f.push(with(l, &[("direction", dir)]), int(x));
                }
            }
        }
        f
    };
    out.push(per_dir(STEPS, &|c| c.steps_done()));
    out.push(per_dir(STEP_BYTES, &|c| c.step_bytes()));
    let mut wait = Family::new(STEP_WAIT);
    for (c, l) in &comms {
        if c.steps_done().iter().any(|x| x.load(Relaxed) != 0) {
            for ((_, st), x) in STEP_STATES.iter().zip(c.step_wait_ns()) {
                wait.push(with(l, &[("state", st)]), seconds(x.load(Relaxed)));
            }
        }
    }
    out.push(wait);
    out.push(per_dir(SOCKET_BYTES, &|c| c.socket_bytes()));
    let mut transport = Family::new(TRANSPORT_BYTES);
    let mut errors = Family::new(ERRORS);
    for (c, l) in &comms {
        let mut t: Vec<_> = c.transport_bytes.iter().collect();
        t.sort_by_key(|(k, _)| **k);
        for (tr, v) in t {
            for (d, x) in DIRECTIONS.iter().zip(v) {
                transport.push(with(l, &[("transport", tr), ("direction", d)]), int(x));
            }
        }
        let mut e: Vec<_> = c.errors.iter().collect();
        e.sort_by_key(|(k, _)| **k);
        for ((op, kind), n) in e {
            errors.push(with(l, &[("op", op), ("kind", kind)]), int(n));
        }
    }
    out.push(transport);
    out.push(errors);
    let mut dropped = Family::new(LOST);
    for (r, n) in LOST_REASONS.iter().zip(lost) {
        dropped.push(vec![("reason", (*r).to_string())], int(n));
    }
    out.push(dropped);
}
