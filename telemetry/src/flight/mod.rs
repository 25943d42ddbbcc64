//! The flight recorder: the last N operations of each communicator rank (N =
//! `OCCL_FLIGHT_RECORDER_SIZE`, default 2048), with sequence numbers, op, sizes, dtype, state
//! and timestamps, dumped as JSON into `OCCL_FLIGHT_RECORDER_DIR` on a timeout, on an error and,
//! with `OCCL_FLIGHT_RECORDER_SIGNAL=SIGUSR1`, on SIGUSR1. It is what RAS and a person read to learn what a rank is stuck in.
//!
//! # Writing
//! The communicator creates one [`FlightRecorder`] per rank and records each operation:
//!
//! ```
//! use occl_telemetry::flight::{FlightComm, FlightRecorder, OpInfo};
//! let comm = FlightComm { comm_hash: 0xabc, rank: 0, nranks: 2, pid: 1, host: "h".into(), comm_name: None };
//! let rec = FlightRecorder::new(comm, 2048);
//! let op = OpInfo {
//!     seq: 1, coll_seq: 1, op: "AllReduce", dtype: "ncclFloat32", redop: Some("ncclSum"),
//!     count: 2, in_bytes: 8, out_bytes: 8, root_or_peer: None, algo: "RING", proto: "SIMPLE",
//! };
//! let slot = rec.enqueue(&op, 1_000);
//! rec.started(slot, 1_100);
//! rec.completed(slot, 1_300);
//! assert_eq!(rec.last_in_flight(), None);
//! ```
//!
//! Contract: `enqueue`, `started`, `completed` and `failed` of one recorder must not run
//! concurrently (one writer: the communicator, which already serialises its operations; calls
//! from different threads are fine when they are ordered, e.g. by the communicator's lock).
//! Breaking it cannot cause undefined behaviour (everything is atomics) but may garble entries.
//! Timestamps are the caller's, in ns since the Unix epoch; the recorder reads no clock. An
//! update through a [`Slot`] whose operation the ring has already overwritten is dropped, and
//! states only move forward (a `completed` after `failed` is ignored). With capacity 0 every call
//! is one branch.
//!
//! Cost: enqueue + started + completed is about 25 relaxed stores into a preallocated slot plus
//! one pointer hash and two loads per name ([`names`]), no allocation and no lock: about 10 ns
//! in all on the development machine (the ignored `bench_record` test; 1.5 ns disabled).
//!
//! # Reading
//! [`FlightRecorder::snapshot`], [`FlightRecorder::last_in_flight`] and the dumps never block
//! the writer: each slot is a seqlock (see [`ring`]). A dump file is written entry by entry, so
//! its memory does not grow with the capacity; `to_json` builds the whole document as a value.
//! In `status`, an operation counts as started once it has a start time or has completed.
//!
//! # Dumping
//! [`FlightRecorder::to_json`] builds the document below; [`FlightRecorder::dump_to_dir`] writes
//! it atomically as `occl_flight_<comm hash hex>_r<rank>_<pid>.json`, and beside it the same
//! operations in PyTorch's Flight Recorder layout, `occl_fr_<comm hash hex>_rank_<rank>`, a
//! pickle that PyTorch's analyzer (`torchfrtrace DIR`) reads across ranks ([`torch`], written
//! by our own encoder, [`pickle`]). [`install_from_env`] (or
//! [`install_config`] with a [`FlightConfig`]) sets the dump directory and, when asked, starts a
//! thread that dumps every live recorder on SIGUSR1 ([`install_signal`]); the communicator calls
//! [`FlightRecorder::dump`] on a timeout (`"timeout"`) and on an error (`"error"` or the error
//! text).
//!
//! ```text
//! {                                                  (a file: one key, and one entry, per line)
//!   "format": "occl-flight-recorder", "version": 1,
//!   "reason": "SIGUSR1"|"timeout"|..., "dump_time_ns": u64, "pid": u32, "host": str,
//!   "comm": { "hash": "16 hex digits", "name": str|null, "rank": u32, "nranks": u32 },
//!   "capacity": usize, "recorded": u64,            // recorded - len(entries) were overwritten
//!   "status": { "last_enqueued_collective": seq|null,   // PyTorch's pg_status names
//!               "last_started_collective": seq|null, "last_completed_collective": seq|null },
//!   "in_flight": null | { ...the oldest entry neither completed nor failed...,
//!                         "age_ns": dump_time_ns - (t_started_ns or t_enqueued_ns) },
//!   "entries": [ {                                   // oldest first
//!       "record_id": u64, "seq": u64, "coll_seq": u64, "op": str,
//!       "state": "enqueued"|"started"|"completed"|"failed",
//!       "dtype": str, "redop": str|null, "count": u64, "in_bytes": u64, "out_bytes": u64,
//!       "root": u32|null, "peer": u32|null, "is_p2p": bool, "algo": str, "proto": str,
//!       "t_enqueued_ns": u64, "t_started_ns": u64|null, "t_completed_ns": u64|null,
//!       "t_failed_ns": u64|null, "duration_ns": u64|null (end - start), "error": str|null } ]
//! }
//! ```

mod config;
mod json;
pub mod names;
pub mod pickle;
mod registry;
pub mod ring;
pub mod torch;

pub use config::{parse_capacity, FlightConfig, FlightEnvError, DIR_ENV, SIGNAL_ENV, SIZE_ENV};
pub use json::{entry_json, FORMAT, FORMAT_VERSION};
pub use registry::{
    dump_all, dump_all_to, dump_dir, install, install_config, install_from_env, install_signal, live_recorders,
    InstallError, SIGNAL_REASON,
};
pub use ring::{
    Entry, FlightComm, FlightRecorder, OpInfo, OpState, RootOrPeer, Slot, DEFAULT_CAPACITY, MAX_CAPACITY, MAX_ERRORS,
    MAX_REASON_BYTES,
};
pub use torch::TORCH_FORMAT_VERSION;

#[cfg(test)]
mod tests;
