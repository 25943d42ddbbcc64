//! The dump in PyTorch's Flight Recorder layout, a pickle that `torchfrtrace` (PyTorch's
//! `torch.distributed.flight_recorder` analyzer) reads with the other ranks' to name the rank
//! that is missing from a collective or issued a different one.
//!
//! One file per communicator rank, `occl_fr_<comm hash, 16 hex digits>_rank_<rank>`: the
//! analyzer takes the rank from the digits after the common prefix. A directory that holds one
//! communicator's files is read as it is (`torchfrtrace DIR`); with several communicators,
//! `-p occl_fr_<hash>_rank_` picks one. The communicator is one process group, named by its
//! hash, described by `config.commName` (else `undefined`), with ranks 0 to nranks - 1.
//!
//! ```text
//! { "version": "2.10", "comm_lib_version": "occl <version>",
//!   "pg_config": { hash: { "name": hash, "desc": str, "ranks": "[0, 1, ...]" } },
//!   "pg_status": { "0": { "last_enqueued_collective": int, "last_started_collective": int,
//!                         "last_completed_collective": int } },   (-1: none)
//!   "entries": [ {                                               oldest first
//!       "record_id", "pg_id": 0, "process_group": (hash, desc), "collective_seq_id",
//!       "p2p_seq_id", "op_id" (the communicator's operation number), "is_p2p",
//!       "profiling_name": "nccl:all_reduce" | "nccl:send 0->1" | "nccl:recv 1<-0" | ...,
//!       "time_created_ns", "time_discovered_started_ns", "time_discovered_completed_ns",
//!       "duration_ms" (completed only), "input_sizes": [[elements]], "input_dtypes": ["Float"],
//!       "output_sizes", "output_dtypes", "state": "scheduled" | "started" | "completed",
//!       "retired" (completed or failed), "frames": [],
//!       "occl_state": our state ("failed" included), "occl_error": str | None } ] }
//! ```
//!
//! A failed operation reads as PyTorch shows one that timed out: retired, never completed.

use super::pickle::{dict, Pickler, Py};
use super::ring::{Entry, FlightRecorder, OpState, RootOrPeer};
use std::io::{self, BufWriter, Write};

/// The dump-format version we write: the analyzer checks that all ranks agree, and from 2.7 on
/// matches collectives inside coalesced groups as well.
pub const TORCH_FORMAT_VERSION: &str = "2.10";

/// The analyzer's name of an operation (`profiling_name` without `nccl:` and the peers), by
/// NCCL's function name.
fn torch_op(op: &str) -> &str {
    match op {
        "AllReduce" => "all_reduce",
        "Broadcast" => "broadcast",
        "Reduce" => "reduce",
        "AllGather" => "all_gather",
        "ReduceScatter" => "reduce_scatter",
        "AlltoAll" | "AllToAll" => "all_to_all",
        "Gather" => "gather",
        "Scatter" => "scatter",
        "Send" => "send",
        "Recv" => "recv",
        other => other,
    }
}

/// PyTorch's name of a data type (`c10::toString(ScalarType)`) and its size in bytes, by NCCL's
/// name.
fn torch_dtype(dtype: &str) -> (&str, u64) {
    match dtype {
        "ncclInt8" => ("Char", 1),
        "ncclUint8" => ("Byte", 1),
        "ncclInt32" => ("Int", 4),
        "ncclUint32" => ("UInt32", 4),
        "ncclInt64" => ("Long", 8),
        "ncclUint64" => ("UInt64", 8),
        "ncclFloat16" => ("Half", 2),
        "ncclFloat32" => ("Float", 4),
        "ncclFloat64" => ("Double", 8),
        "ncclBfloat16" => ("BFloat16", 2),
        "ncclFloat8e4m3" => ("Float8_e4m3fn", 1),
        "ncclFloat8e5m2" => ("Float8_e5m2", 1),
        other => (other, 0),
    }
}

/// One tensor of `elements`, as the analyzer's size lists have it.
fn sizes(elements: u64) -> Py {
    Py::List(vec![Py::List(vec![Py::from(elements)])])
}

impl FlightRecorder {
    fn pg_name(&self) -> String {
        format!("{:016x}", self.comm().comm_hash)
    }

    fn pg_desc(&self) -> String {
        self.comm().comm_name.clone().unwrap_or_else(|| "undefined".to_owned())
    }

    /// One entry in PyTorch's layout.
    fn torch_entry(&self, e: &Entry) -> Py {
        let i = &e.info;
        let me = self.comm().rank;
        let (is_p2p, name) = match (i.op, i.root_or_peer) {
            ("Send", Some(RootOrPeer::Peer(p))) => (true, format!("nccl:send {me}->{p}")),
            ("Recv", Some(RootOrPeer::Peer(p))) => (true, format!("nccl:recv {me}<-{p}")),
            (op, _) => (false, format!("nccl:{}", torch_op(op))),
        };
        let (dtype, size) = torch_dtype(i.dtype);
        let elements = |bytes: u64| bytes.checked_div(size).unwrap_or(i.count);
        // A send's tensor is its input and a receive's its output; the analyzer pairs a send's
        // input sizes with the receive's output sizes, so both sides carry the one tensor.
        let (input, output) = if is_p2p {
            let n = elements(i.in_bytes.max(i.out_bytes));
            (n, n)
        } else {
            (elements(i.in_bytes), elements(i.out_bytes))
        };
        let completed = e.state == OpState::Completed;
        let state = match e.state {
            OpState::Completed => "completed",
            _ if e.t_started_ns.is_some() => "started",
            _ => "scheduled",
        };
        let pg = Py::Tuple(vec![Py::from(self.pg_name()), Py::from(self.pg_desc())]);
        let duration_ms = e.duration_ns().filter(|_| completed).map(|d| Py::Float(d as f64 / 1e6));
        let mut fields = vec![
            ("record_id", Py::from(e.record_id)),
            ("pg_id", Py::Int(0)),
            ("process_group", pg),
            ("collective_seq_id", Py::from(e.collective_seq_id)),
            ("p2p_seq_id", Py::from(e.p2p_seq_id)),
            ("op_id", Py::from(i.seq)),
            ("profiling_name", Py::from(name)),
            ("time_created_ns", Py::from(e.t_enqueued_ns)),
            ("input_sizes", sizes(input)),
            ("input_dtypes", Py::List(vec![Py::from(dtype)])),
            ("output_sizes", sizes(output)),
            ("output_dtypes", Py::List(vec![Py::from(dtype)])),
            ("state", Py::from(state)),
            ("time_discovered_started_ns", Py::from(e.t_started_ns)),
            ("time_discovered_completed_ns", Py::from(e.t_ended_ns.filter(|_| completed))),
            ("retired", Py::from(!e.state.in_flight())),
            ("is_p2p", Py::from(is_p2p)),
            ("frames", Py::List(Vec::new())),
            ("occl_state", Py::from(e.state.as_str())),
            ("occl_error", Py::from(e.error.clone())),
        ];
        if let Some(d) = duration_ms {
            fields.insert(8, ("duration_ms", d));
        }
        Py::Dict(fields.into_iter().map(|(k, v)| (Py::from(k), v)).collect())
    }

    /// Writes the dump in PyTorch's layout (see the module docs) to `w`, entry by entry.
    pub fn write_torch_pickle<W: Write>(&self, w: W) -> io::Result<()> {
        let (mut enqueued, mut started, mut completed) = (-1i64, -1i64, -1i64);
        self.for_each_entry(|e| {
            if matches!(e.info.root_or_peer, Some(RootOrPeer::Peer(_))) {
                return;
            }
            let seq = i64::try_from(e.collective_seq_id).unwrap_or(i64::MAX);
            enqueued = enqueued.max(seq);
            if e.t_started_ns.is_some() || e.state == OpState::Completed {
                started = started.max(seq);
            }
            if e.state == OpState::Completed {
                completed = completed.max(seq);
            }
        });
        let c = self.comm();
        let ranks: Vec<String> = (0..c.nranks).map(|r| r.to_string()).collect();
        let pg_config = Py::Dict(vec![(
            Py::from(self.pg_name()),
            dict([
                ("name", Py::from(self.pg_name())),
                ("desc", Py::from(self.pg_desc())),
                ("ranks", Py::from(format!("[{}]", ranks.join(", ")))),
            ]),
        )]);
        let pg_status = Py::Dict(vec![(
            Py::from("0"),
            dict([
                ("last_enqueued_collective", Py::Int(enqueued)),
                ("last_started_collective", Py::Int(started)),
                ("last_completed_collective", Py::Int(completed)),
            ]),
        )]);
        let mut p = Pickler::new(BufWriter::new(w))?;
        p.begin_dict()?;
        p.key("version")?;
        p.value(&Py::from(TORCH_FORMAT_VERSION))?;
        p.key("comm_lib_version")?;
        p.value(&Py::from(concat!("occl ", env!("CARGO_PKG_VERSION"))))?;
        p.key("pg_config")?;
        p.value(&pg_config)?;
        p.key("pg_status")?;
        p.value(&pg_status)?;
        p.key("entries")?;
        p.begin_list()?;
        let mut res = Ok(());
        self.for_each_entry(|e| {
            if res.is_ok() {
                res = p.value(&self.torch_entry(&e));
            }
        });
        res?;
        p.end_list()?;
        p.end_dict()?;
        p.finish()?.flush()
    }

    /// The PyTorch-layout dump's file name: `occl_fr_<comm hash>_rank_<rank>`.
    pub fn torch_file_name(&self) -> String {
        format!("occl_fr_{}_rank_{}", self.pg_name(), self.comm().rank)
    }
}
