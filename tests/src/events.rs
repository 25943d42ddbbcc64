//! In-process profiler sinks for tests and benchmarks: a recorder that writes every callback
//! as one JSON line per event (read back by the profiler tests), and a counter that only counts
//! (the benchmark's "all events on" sink, so it measures emission, not logging).

use occl_telemetry::{CommInfo, EventDescr, EventId, EventMask, Profiler, Sink, StateArgs};
use serde_json::{json, Value};
use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, PoisonError};

/// Records everything of `mask` and writes `<dir>/events-<rank>-<comm hash>.jsonl` at finalize.
pub struct Recorder {
    pub dir: PathBuf,
    pub mask: EventMask,
}

struct RecSink {
    path: PathBuf,
    mask: EventMask,
    lines: Mutex<Vec<Value>>,
}

impl Profiler for Recorder {
    fn name(&self) -> &str {
        "test-recorder"
    }
    fn init(&self, c: &CommInfo<'_>) -> Option<Arc<dyn Sink>> {
        let path = self.dir.join(format!("events-{}-{:016x}.jsonl", c.rank, c.comm_hash));
        let head = json!({"ev": "init", "rank": c.rank, "nranks": c.nranks, "comm": format!("{:016x}", c.comm_hash), "n_nodes": c.n_nodes});
        Some(Arc::new(RecSink { path, mask: self.mask, lines: Mutex::new(vec![head]) }))
    }
}

fn descr(d: &EventDescr<'_>) -> Value {
    let pg = |p: &Option<EventId>| p.map(EventId::get);
    match *d {
        EventDescr::Coll {
            rank,
            seq_number,
            func,
            count,
            root,
            datatype,
            n_channels,
            algo,
            proto,
            parent_group,
            send_buff,
            recv_buff,
            ..
        } => json!({"rank": rank, "seq": seq_number, "func": func, "count": count, "root": root,
            "dtype": datatype, "nch": n_channels, "algo": algo, "proto": proto, "pgroup": pg(&parent_group),
            "sendbuf": send_buff, "recvbuf": recv_buff}),
        EventDescr::P2p { rank, func, datatype, count, peer, parent_group, .. } => {
            json!({"rank": rank, "func": func, "dtype": datatype, "count": count, "peer": peer, "pgroup": pg(&parent_group)})
        }
        EventDescr::ProxyOp { rank, pid, channel_id, peer, n_steps, chunk_size, is_send } => {
            json!({"rank": rank, "pid": pid, "ch": channel_id, "peer": peer, "nsteps": n_steps, "chunk": chunk_size, "send": is_send})
        }
        EventDescr::ProxyStep { rank, step } => json!({"rank": rank, "step": step}),
        EventDescr::NetPlugin { rank, id, data } => {
            // NCCL's socket payload: type u8 @0, fd i32 @8, op i32 @12, length u64 @16.
            let i32_at = |o: usize| data.get(o..o + 4).map(|b| i32::from_ne_bytes([b[0], b[1], b[2], b[3]]));
            let len = data.get(16..24).map(|b| u64::from_ne_bytes(b.try_into().unwrap_or([0; 8])));
            json!({"rank": rank, "plugin_id": id, "data_len": data.len(), "kind": data.first(),
                "fd": i32_at(8), "op": i32_at(12), "length": len})
        }
        EventDescr::GroupApi { graph_captured, group_depth } => json!({"graph": graph_captured, "depth": group_depth}),
        EventDescr::CollApi { func, count, datatype, root, .. } => {
            json!({"func": func, "count": count, "dtype": datatype, "root": root})
        }
        EventDescr::P2pApi { func, count, datatype, .. } => json!({"func": func, "count": count, "dtype": datatype}),
        _ => json!({}),
    }
}

fn state_args(st: &StateArgs<'_>) -> Value {
    match *st {
        StateArgs::ProxyStep { trans_size, .. } => json!({"size": trans_size}),
        StateArgs::ProxyCtrl { appended_proxy_ops, .. } => json!({"appended": appended_proxy_ops}),
        StateArgs::ProxyOp { trans_size, steps, .. } => json!({"size": trans_size, "steps": steps}),
        _ => json!({}),
    }
}

impl RecSink {
    fn push(&self, v: Value) {
        self.lines.lock().unwrap_or_else(PoisonError::into_inner).push(v);
    }
}

impl Sink for RecSink {
    fn interest(&self) -> EventMask {
        self.mask
    }
    fn start(&self, id: EventId, parent: Option<EventId>, ev: &EventDescr<'_>) {
        self.push(json!({"ev": "start", "id": id.get(), "parent": parent.map(EventId::get),
            "type": ev.event_type().name(), "d": descr(ev)}));
    }
    fn state(&self, id: EventId, st: &StateArgs<'_>) {
        self.push(json!({"ev": "state", "id": id.get(), "state": st.state_raw(), "a": state_args(st)}));
    }
    fn stop(&self, id: EventId) {
        self.push(json!({"ev": "stop", "id": id.get()}));
    }
    fn finalize(&self) {
        let lines = std::mem::take(&mut *self.lines.lock().unwrap_or_else(PoisonError::into_inner));
        let write = || -> std::io::Result<()> {
            let mut f = std::io::BufWriter::new(std::fs::File::create(&self.path)?);
            for l in &lines {
                writeln!(f, "{l}")?;
            }
            writeln!(f, "{}", json!({"ev": "finalize"}))?;
            f.flush()
        };
        if let Err(e) = write() {
            eprintln!("test recorder: writing {}: {e}", self.path.display());
        }
    }
}

/// Counts callbacks; its mask can be changed at run time (a dynamic sink, as NCCL plugins are).
#[derive(Default)]
pub struct Counter {
    pub mask: AtomicU64,
    pub starts: AtomicU64,
    pub states: AtomicU64,
    pub stops: AtomicU64,
    /// `step_totals` calls (one per summed ProxyOp).
    pub sums: AtomicU64,
}

impl Counter {
    pub fn total(&self) -> u64 {
        self.starts.load(Relaxed) + self.states.load(Relaxed) + self.stops.load(Relaxed) + self.sums.load(Relaxed)
    }
}

impl Sink for Counter {
    fn interest(&self) -> EventMask {
        EventMask(self.mask.load(Relaxed))
    }
    fn dynamic(&self) -> bool {
        true
    }
    fn start(&self, _: EventId, _: Option<EventId>, _: &EventDescr<'_>) {
        self.starts.fetch_add(1, Relaxed);
    }
    fn state(&self, _: EventId, _: &StateArgs<'_>) {
        self.states.fetch_add(1, Relaxed);
    }
    fn stop(&self, _: EventId) {
        self.stops.fetch_add(1, Relaxed);
    }
    fn step_totals(&self, _: EventId, _: &occl_telemetry::StepTotals) {
        self.sums.fetch_add(1, Relaxed);
    }
}

/// One of each operation per size: 1 element, a few slices, and several ring pieces.
pub fn every_operation(comm: &occl::Comm) -> occl::Result<()> {
    let (n, r) = (comm.nranks(), comm.rank());
    for count in [1usize, 1000, 70_000] {
        let a = vec![1.0f32; count * n];
        let mut b = vec![0f32; count * n];
        comm.all_reduce(&a[..count], &mut b[..count], occl::RedOp::Sum)?;
        comm.all_reduce_in_place(&mut b[..count], occl::RedOp::Max)?;
        comm.broadcast(&a[..count], &mut b[..count], 1 % n)?;
        comm.reduce(&a[..count], &mut b[..count], occl::RedOp::Sum, 0)?;
        comm.all_gather(&a[..count], &mut b)?;
        comm.reduce_scatter(&a, &mut b[..count], occl::RedOp::Sum)?;
        comm.all_to_all(&a, &mut b)?;
        if n > 1 {
            let (to, from) = ((r + 1) % n, (r + n - 1) % n);
            let mut c = vec![0f64; count];
            if r % 2 == 0 {
                comm.send(&vec![2.0f64; count], to)?;
                comm.recv(&mut c, from)?;
            } else {
                comm.recv(&mut c, from)?;
                comm.send(&vec![2.0f64; count], to)?;
            }
        }
    }
    Ok(())
}
