//! TEST ONLY (feature `test-support`, which the crate's own tests turn on): an exporter that writes
//! every finished span the collector hands it as one JSON line, so the plugin's tests can check,
//! from outside the process that loaded the library, what went through the real path (host → C
//! ABI → this plugin → occl's span collector → exporter). Even when built in, it is off unless
//! `OCCL_PROFILER_TEST_SPANS` is set; a release build of the plugin does not contain it.
//!
//! - `OCCL_PROFILER_TEST_SPANS=<prefix>`: lines go to `<prefix>-<pid>.jsonl` (appended, so a
//!   library loaded again in the same process adds to the same file).
//! - `OCCL_PROFILER_TEST_MASK`: the exporter's interest (decimal or 0x hex; default all types).
//!
//! Lines: `{"ev":"init"|"finalize", "comm", "name", "rank", "nranks", "nnodes"}` and
//! `{"ev":"span", "comm", "rank", "id", "parent", "root", "type", "start_ns", "end_ns", "d": {the
//! descriptor's fields}, "payload": [bytes], "states": [[state, value], …], "states_dropped"}`.
//! Its metrics are `occl_test_spans_total{type}`.

use occl_telemetry::spans::{CommMeta, Exporter, Span};
use occl_telemetry::{EventDescr, EventId, EventMask, EventType};
use serde_json::{json, Value};
use std::fmt::Write as _;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, PoisonError};

pub const PREFIX_ENV: &str = "OCCL_PROFILER_TEST_SPANS";
pub const MASK_ENV: &str = "OCCL_PROFILER_TEST_MASK";

pub struct SpanLog {
    out: Mutex<BufWriter<File>>,
    mask: EventMask,
    counts: [AtomicU64; EventType::ALL.len()],
}

impl SpanLog {
    /// The exporter the environment asks for, if any; a file that cannot be opened or a bad mask
    /// is said on stderr (this is a test harness's switch).
    pub fn from_env() -> Option<Arc<SpanLog>> {
        let prefix = std::env::var(PREFIX_ENV).ok().filter(|p| !p.is_empty())?;
        let mask = match std::env::var(MASK_ENV) {
            Ok(m) => match EventMask::parse(&m) {
                Ok(m) => m,
                Err(e) => {
                    eprintln!("occl-profiler test span log: {MASK_ENV}: {e}");
                    return None;
                }
            },
            Err(_) => EventMask::ALL,
        };
        let path = format!("{prefix}-{}.jsonl", std::process::id());
        match File::options().create(true).append(true).open(&path) {
            Ok(f) => Some(Arc::new(SpanLog {
                out: Mutex::new(BufWriter::new(f)),
                mask,
                counts: std::array::from_fn(|_| AtomicU64::new(0)),
            })),
            Err(e) => {
                eprintln!("occl-profiler test span log: {path}: {e}");
                None
            }
        }
    }

    fn line(&self, v: &Value) {
        let mut out = self.out.lock().unwrap_or_else(PoisonError::into_inner);
        let _ = writeln!(out, "{v}");
    }

    fn comm_line(&self, ev: &str, c: &CommMeta) {
        self.line(&json!({"ev": ev, "comm": format!("{:016x}", c.hash), "name": c.name, "rank": c.rank,
            "nranks": c.nranks, "nnodes": c.n_nodes}));
    }
}

fn fields(d: &EventDescr<'_>) -> Value {
    use EventDescr as D;
    let id = |p: Option<EventId>| p.map(EventId::get);
    match *d {
        D::Group | D::ProxyCtrl => json!({}),
        D::Coll {
            rank,
            seq_number,
            func,
            send_buff,
            recv_buff,
            count,
            root,
            datatype,
            n_channels,
            n_warps,
            algo,
            proto,
            parent_group,
        } => json!({"rank": rank, "seq": seq_number, "func": func, "sendbuf": send_buff, "recvbuf": recv_buff,
            "count": count, "root": root, "dtype": datatype, "nch": n_channels, "nwarps": n_warps, "algo": algo,
            "proto": proto, "pgroup": id(parent_group)}),
        D::P2p { rank, func, buff, datatype, count, peer, n_channels, parent_group } => {
            json!({"rank": rank, "func": func, "buf": buff, "dtype": datatype, "count": count, "peer": peer,
                "nch": n_channels, "pgroup": id(parent_group)})
        }
        D::ProxyOp { rank, pid, channel_id, peer, n_steps, chunk_size, is_send } => {
            json!({"rank": rank, "pid": pid, "ch": channel_id, "peer": peer, "nsteps": n_steps, "chunk": chunk_size,
                "send": is_send})
        }
        D::ProxyStep { rank, step } => json!({"rank": rank, "step": step}),
        D::KernelCh { channel_id, p_timer } => json!({"ch": channel_id, "ptimer": p_timer}),
        D::NetPlugin { rank, id, .. } => json!({"rank": rank, "plugin_id": id}),
        D::GroupApi { graph_captured, group_depth } => json!({"graph": graph_captured, "depth": group_depth}),
        D::CollApi { func, count, datatype, root, stream, graph_captured } => {
            json!({"func": func, "count": count, "dtype": datatype, "root": root, "stream": stream,
                "graph": graph_captured})
        }
        D::P2pApi { func, count, datatype, stream, graph_captured } => {
            json!({"func": func, "count": count, "dtype": datatype, "stream": stream, "graph": graph_captured})
        }
        D::KernelLaunch { stream } => json!({"stream": stream}),
        D::CeColl {
            seq_number,
            func,
            send_buff,
            recv_buff,
            count,
            root,
            datatype,
            sync_strategy,
            intra_batch_sync,
            batch_size,
            num_batches,
            ce_seq_num,
            stream,
        } => json!({"seq": seq_number, "func": func, "sendbuf": send_buff, "recvbuf": recv_buff, "count": count,
            "root": root, "dtype": datatype, "sync": sync_strategy, "intra": intra_batch_sync, "batch": batch_size,
            "nbatches": num_batches, "ceseq": ce_seq_num, "stream": stream}),
        D::CeSync { is_complete, n_ranks } => json!({"complete": is_complete, "nranks": n_ranks}),
        D::CeBatch { num_ops, total_bytes, use_intra_sync } => {
            json!({"nops": num_ops, "bytes": total_bytes, "intra": use_intra_sync})
        }
    }
}

impl Exporter for SpanLog {
    fn name(&self) -> &str {
        "test-span-log"
    }

    fn interest(&self) -> EventMask {
        self.mask
    }

    fn comm_init(&self, comm: &Arc<CommMeta>) {
        self.comm_line("init", comm);
    }

    fn span(&self, s: &Span<'_>) {
        let t = s.event_type();
        self.counts[t as usize].fetch_add(1, Relaxed);
        let states: Vec<[u64; 2]> = s.states.iter().map(|m| [u64::from(m.state), m.value]).collect();
        self.line(&json!({"ev": "span", "comm": format!("{:016x}", s.comm.hash), "rank": s.comm.rank,
            "id": s.id.get(), "parent": s.parent.map(EventId::get), "root": s.root.get(), "type": t.name(),
            "start_ns": s.start_ns, "end_ns": s.end_ns, "d": fields(&s.descr), "payload": s.payload,
            "states": states, "states_dropped": s.states_dropped}));
    }

    fn comm_finalize(&self, comm: &Arc<CommMeta>) {
        self.comm_line("finalize", comm);
        self.flush();
    }

    fn render_metrics(&self, out: &mut String) {
        out.push_str(
            "# HELP occl_test_spans_total Spans the plugin's test exporter received, by event type (tests only).\n\
             # TYPE occl_test_spans_total counter\n",
        );
        for t in EventType::ALL {
            let _ = writeln!(
                out,
                "occl_test_spans_total{{type=\"{}\"}} {}",
                t.name(),
                self.counts[t as usize].load(Relaxed)
            );
        }
    }

    fn flush(&self) {
        let _ = self.out.lock().unwrap_or_else(PoisonError::into_inner).flush();
    }
}
