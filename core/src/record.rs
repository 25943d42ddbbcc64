//! The per-rank record of operations: how many of each kind were launched and completed, and
//! which one is in flight. RAS reads it to say who is behind and what a hung rank is stuck in;
//! updating it is a few relaxed atomic stores per operation.

use occl_ras_proto::record::{CommRecord, Flag, RankInfo, ResultCode};
use std::sync::Arc;

/// The operations a communicator runs, numbered as NCCL's `ncclFunc_t` (the vocabulary type the record and the
/// report share).
pub use occl_types::CollType;

/// An operation in flight, as seen in a snapshot (occl-ras-proto's type: what RAS reports is what this returns).
pub use occl_ras_proto::record::InFlight;

/// Counters and the in-flight operation of one rank of one communicator: occl-ras-proto's record, which the RAS thread
/// reports. Every update is a few relaxed stores by the rank's own thread.
#[derive(Debug)]
pub struct OpRecord {
    rec: Arc<CommRecord>,
}

/// Wall-clock nanoseconds at nanosecond resolution: the span clock (the TSC scaled to the
/// monotonic clock and anchored to the wall clock once per process, ~8 ns a read; see
/// `occl_events::clock`). The flight recorder's durations of sub-millisecond operations and RAS's
/// age of a stuck one both come from it, twice per operation.
#[inline]
pub(crate) fn now_ns() -> u64 {
    occl_events::clock::unix_nanos()
}

impl OpRecord {
    pub(crate) fn new(info: RankInfo) -> OpRecord {
        OpRecord { rec: Arc::new(CommRecord::new(info)) }
    }

    /// The record RAS registers and reports.
    pub(crate) fn shared(&self) -> &Arc<CommRecord> {
        &self.rec
    }

    /// Stamps an operation that starts at `t_ns` (from `now_ns`); returns its sequence number.
    #[inline]
    pub(crate) fn launch(&self, coll: CollType, bytes: u64, t_ns: u64) -> u64 {
        self.rec.live().launch(coll, bytes, t_ns)
    }

    #[inline]
    pub(crate) fn complete(&self, coll: CollType) {
        self.rec.live().complete(coll);
    }

    /// The operation in flight waits on `peer` in ProxyStep state `state` (called only when a wait blocks).
    #[inline]
    pub(crate) fn waiting_on(&self, peer: usize, state: u32) {
        self.rec.live().waiting_on(Some(peer as u32), Some(state));
    }

    pub(crate) fn initialized(&self) {
        self.rec.live().set_init_state(ResultCode::Success);
    }

    /// The operation in flight failed with `e`, which fails the communicator: RAS reports the operation as failed
    /// with this error (no longer in flight) and `e`'s kind as the communicator's asynchronous error.
    pub(crate) fn failed(&self, e: &crate::Error) {
        use crate::ErrorKind as K;
        let code = match e.kind() {
            K::SystemError => ResultCode::SystemError,
            K::InvalidArgument => ResultCode::InvalidArgument,
            K::InvalidUsage => ResultCode::InvalidUsage,
            K::RemoteError | K::Timeout => ResultCode::RemoteError,
            _ => ResultCode::InternalError,
        };
        self.rec.live().fail(code, &e.to_string(), now_ns());
    }

    pub(crate) fn aborted(&self) {
        self.rec.live().set_flag(Flag::Aborted);
    }

    pub(crate) fn destroyed(&self) {
        self.rec.live().set_flag(Flag::Destroyed);
    }

    /// Operations of `coll` started so far.
    pub fn launched(&self, coll: CollType) -> u64 {
        self.rec.live().launched(coll)
    }

    /// Operations of `coll` that returned successfully.
    pub fn completed(&self, coll: CollType) -> u64 {
        self.rec.live().completed(coll)
    }

    /// The operation running now, if any (a failed one is not; RAS reports it as failed, with its error).
    pub fn in_flight(&self) -> Option<InFlight> {
        self.rec.live().in_flight()
    }
}
