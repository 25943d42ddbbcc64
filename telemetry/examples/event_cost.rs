//! What the span collector costs per callback, without a collective around it: one thread emits
//! the events of a 2-rank all-reduce (occl's order, `core/src/profile/op.rs`) through a fan-out
//! view into the collector, feeding an exporter that drops every span (`null`) or the Prometheus
//! exporter (`prometheus`). `sums` is the Prometheus exporter fed as occl's core feeds it when it
//! is a communicator's only consumer: one operation sum per call (`Sink::op_totals`), no event.
//! `clock` is the span clock alone, read 8 times per "operation" (what a summed 2-rank one-step
//! all-reduce reads).
//!
//! ```text
//! cargo run -p occl-telemetry --release --example event_cost -- [null|prometheus|sums|clock] [STEPS] [OPS]
//! ```
//!
//! STEPS is the slices per direction (1 for 8 B; 16 for 1 MiB with 64 KiB slices). Prints the
//! median over 15 batches of ns per operation and per callback; `time per callback` is what an
//! exporter adds to a collective per event.

use occl_telemetry::event::{ProxyCtrlState, ProxyOpState, ProxyStepState};
use occl_telemetry::spans::{CommMeta, Exporter, Span, Telemetry};
use occl_telemetry::{EventDescr, EventId, EventMask, Fanout, GroupApiState, OpTotals, StateArgs, StepTotals};
use std::cell::Cell;
use std::sync::Arc;
use std::time::Instant;

struct Null;

impl Exporter for Null {
    fn name(&self) -> &str {
        "null"
    }
    fn interest(&self) -> EventMask {
        EventMask::ALL
    }
    fn span(&self, _: &Span<'_>) {}
}

/// The all-reduce's Coll descriptor, as occl's core makes it.
fn coll_descr(seq: u64, parent_group: Option<EventId>) -> EventDescr<'static> {
    EventDescr::Coll {
        rank: 0,
        seq_number: seq,
        func: "AllReduce",
        send_buff: 0x1000,
        recv_buff: 0x2000,
        count: 2,
        root: 0,
        datatype: "ncclFloat32",
        n_channels: 1,
        n_warps: 0,
        algo: "RING",
        proto: "SIMPLE",
        parent_group,
    }
}

/// One operation's events; returns the callbacks made.
fn op(fanout: &Fanout, seq: u64, steps: i32) -> u32 {
    // As occl's core does: one view of the sinks per operation.
    let f = &fanout.view();
    let n = Cell::new(0u32);
    let start = |p: Option<EventId>, d: &EventDescr<'_>| {
        n.set(n.get() + 1);
        f.start(p, d)
    };
    let st = |id: Option<EventId>, s: &StateArgs<'_>| {
        if let Some(id) = id {
            n.set(n.get() + 1);
            f.state(id, s);
        }
    };
    let stop = |id: Option<EventId>| {
        if let Some(id) = id {
            n.set(n.get() + 1);
            f.stop(id);
        }
    };
    let ctrl = |s| StateArgs::ProxyCtrl { state: s, appended_proxy_ops: 0 };
    let m = start(None, &EventDescr::ProxyCtrl);
    st(m, &ctrl(ProxyCtrlState::Active));
    stop(m);
    let ga = start(None, &EventDescr::GroupApi { graph_captured: false, group_depth: 1 });
    st(ga, &StateArgs::GroupApi { state: GroupApiState::StartApiStop });
    let api = start(
        ga,
        &EventDescr::CollApi {
            func: "AllReduce",
            count: 2,
            datatype: "ncclFloat32",
            root: 0,
            stream: 0,
            graph_captured: false,
        },
    );
    stop(api);
    st(ga, &StateArgs::GroupApi { state: GroupApiState::EndApiStart });
    let g = start(None, &EventDescr::Group);
    let coll = start(api, &coll_descr(seq, g));
    let c = start(None, &EventDescr::ProxyCtrl);
    st(c, &ctrl(ProxyCtrlState::Append));
    let leg = |send| EventDescr::ProxyOp {
        rank: 0,
        pid: 1,
        channel_id: 0,
        peer: 1,
        n_steps: steps,
        chunk_size: 65536,
        is_send: send,
    };
    let tx = start(coll, &leg(true));
    let rx = start(coll, &leg(false));
    st(c, &StateArgs::ProxyCtrl { state: ProxyCtrlState::AppendEnd, appended_proxy_ops: 2 });
    stop(c);
    let prog = StateArgs::ProxyOp { state: ProxyOpState::InProgress, trans_size: 0, steps: 0 };
    st(tx, &prog);
    st(rx, &prog);
    let step = |s, n| StateArgs::ProxyStep { state: s, trans_size: n };
    for i in 0..steps {
        let s = start(tx, &EventDescr::ProxyStep { rank: 0, step: i });
        st(s, &step(ProxyStepState::SendGpuWait, 0));
        st(s, &step(ProxyStepState::SendPeerWait, 0));
        st(s, &step(ProxyStepState::SendWait, 65536));
        stop(s);
        let r = start(rx, &EventDescr::ProxyStep { rank: 0, step: i });
        st(r, &step(ProxyStepState::RecvWait, 0));
        st(r, &step(ProxyStepState::RecvFlushWait, 65536));
        st(r, &step(ProxyStepState::RecvGpuWait, 65536));
        stop(r);
    }
    for id in [tx, rx, coll, g, ga] {
        stop(id);
    }
    let m = start(None, &EventDescr::ProxyCtrl);
    st(m, &ctrl(ProxyCtrlState::Idle));
    stop(m);
    n.get()
}

/// One operation as a single sum (occl's core with Prometheus its only consumer); one callback.
fn op_sum(fanout: &Fanout, seq: u64, steps: i32) -> u32 {
    let f = &fanout.view();
    let start_ns = occl_telemetry::spans::unix_nanos();
    let bytes = 8 * steps as u64;
    let sum = |send, wait_ns| StepTotals { send, steps: steps as u32, bytes, wait_ns };
    f.op_totals(&OpTotals {
        descr: coll_descr(seq, None),
        start_ns,
        end_ns: start_ns + 400,
        steps: [sum(true, [0, 30, 0, 0, 0, 0]), sum(false, [0, 0, 0, 150, 0, 20])],
        transport_bytes: &[("shm", true, bytes), ("shm", false, bytes)],
    });
    1
}

/// Eight reads of the span clock; "one callback".
fn clock() -> u32 {
    for _ in 0..8 {
        std::hint::black_box(occl_telemetry::spans::unix_nanos());
    }
    1
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let which = args.first().map_or("null", String::as_str);
    let steps: i32 = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(1);
    let ops: u64 = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(20_000);
    let ex: Arc<dyn Exporter> = match which {
        "prometheus" | "sums" => Arc::new(occl_telemetry::prometheus::Exporter::new()),
        _ => Arc::new(Null),
    };
    let t = Telemetry::new(vec![ex]);
    let f = Fanout::new();
    let meta = CommMeta { name: None, hash: 0x5eed, rank: 0, nranks: 2, n_nodes: 1 };
    if f.attach(t.comm_sink(meta)).is_err() {
        eprintln!("event_cost: cannot attach the collector");
        return;
    }
    let mut per_op = Vec::new();
    let mut calls = 0;
    for b in 0..16 {
        let t0 = Instant::now();
        for i in 0..ops {
            calls = match which {
                "sums" => op_sum(&f, b * ops + i, steps),
                "clock" => clock(),
                _ => op(&f, b * ops + i, steps),
            };
        }
        if b > 0 {
            per_op.push(t0.elapsed().as_nanos() as f64 / ops as f64);
        }
    }
    per_op.sort_by(f64::total_cmp);
    let med = per_op[per_op.len() / 2];
    println!(
        "{which}, {steps} step(s) per direction: {med:.0} ns per operation, {calls} callbacks, {:.1} ns per callback",
        med / f64::from(calls)
    );
}
