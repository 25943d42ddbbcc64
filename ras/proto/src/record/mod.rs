//! Rank records: what each rank of each communicator tells RAS about itself.
//!
//! `occl` owns one [`CommRecord`] per (communicator, local rank): the static facts ([`RankInfo`]) plus a
//! [`LiveRecord`] that the rank's own thread updates on the collective path with relaxed atomic stores only. The RAS
//! thread reads them through the per-process [`ProcessRecords`] registry and ships plain [`RankRecord`] snapshots
//! over the mesh; [`convert`] turns gathered snapshots into the report model's raw data.

pub mod convert;
mod live;
mod registry;
#[cfg(test)]
mod tests;

use serde::{Deserialize, Serialize};

pub use crate::report::ResultCode;
pub use live::LiveRecord;
pub use occl_types::CollType;
pub use registry::{CommRecord, MetricsProvider, ProcessRecords};

/// The largest communicator a record may describe. Bounds what a record from a peer can make a reader do (one
/// missing-rank entry per absent rank); NCCL's own limits are far below it.
pub const MAX_COMM_RANKS: u32 = 1 << 20;

/// Lifecycle flags of a rank (NCCL's finalizeCalled, destroyFlag, abortFlag). They only ever get set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Flag {
    Finalized,
    Destroyed,
    Aborted,
}

impl Flag {
    pub(crate) const fn bit(self) -> u8 {
        match self {
            Flag::Finalized => 1,
            Flag::Destroyed => 2,
            Flag::Aborted => 4,
        }
    }
}

/// NCCL profiler ProxyStep state numbers a rank can wait in (`waiting_on`'s step state); any other number is kept
/// and shown as a number.
pub mod step_state {
    pub const SEND_GPU_WAIT: u32 = 8;
    pub const SEND_WAIT: u32 = 9;
    pub const RECV_WAIT: u32 = 10;
    pub const RECV_FLUSH_WAIT: u32 = 11;
    pub const RECV_GPU_WAIT: u32 = 12;
    pub const SEND_PEER_WAIT: u32 = 20;

    /// NCCL's name for a ProxyStep state, without the `ProxyStep` prefix.
    pub fn name(state: u32) -> Option<&'static str> {
        Some(match state {
            SEND_GPU_WAIT => "SendGPUWait",
            SEND_WAIT => "SendWait",
            RECV_WAIT => "RecvWait",
            RECV_FLUSH_WAIT => "RecvFlushWait",
            RECV_GPU_WAIT => "RecvGPUWait",
            SEND_PEER_WAIT => "SendPeerWait",
            _ => return None,
        })
    }
}

/// A communicator's identity across the job. The hash alone is not unique (NCCL's commId has the same three
/// parts): the host hash and pid hash of comm rank 0 tell apart communicators that hash alike.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default, Serialize, Deserialize)]
pub struct CommId {
    pub hash: u64,
    pub root_host_hash: u64,
    pub root_pid_hash: u64,
}

/// What a rank's record says that never changes after the communicator is created.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub struct RankInfo {
    pub comm: CommId,
    /// Ranks in the communicator.
    pub size: u32,
    pub rank: u32,
    pub pid: u32,
    /// The node as reports print it (an IP address).
    pub host: String,
    /// CUDA device, `None` for a host-only rank.
    pub cuda_dev: Option<u32>,
    /// NVML device, `None` for a host-only rank.
    pub nvml_dev: Option<u32>,
}

/// The operation a rank is running now.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct InFlight {
    /// 1-based sequence number among this communicator's operations of any kind (as `occl`'s `OpRecord`).
    pub seq: u64,
    pub coll: CollType,
    /// 1-based sequence number among this communicator's operations of `coll`: what the launch counters show.
    pub coll_seq: u64,
    pub bytes: u64,
    /// Start, in nanoseconds since the Unix epoch.
    pub start_ns: u64,
    /// The communicator rank it waits on, when known.
    pub peer: Option<u32>,
    /// The NCCL ProxyStep state it waits in (see [`step_state`]), when known.
    pub step_state: Option<u32>,
}

impl InFlight {
    /// How long it has been running at wall-clock `now_ns` (0 if the clocks disagree).
    pub fn waited_ns(&self, now_ns: u64) -> u64 {
        now_ns.saturating_sub(self.start_ns)
    }

    /// A short description of what it waits for, e.g. `RecvWait on rank 3`, or empty when nothing is known.
    pub fn waiting_label(&self) -> String {
        let state =
            self.step_state.map(|s| step_state::name(s).map_or_else(|| format!("step state {s}"), str::to_owned));
        match (state, self.peer) {
            (Some(s), Some(p)) => format!("{s} on rank {p}"),
            (Some(s), None) => s,
            (None, Some(p)) => format!("waiting on rank {p}"),
            (None, None) => String::new(),
        }
    }
}

/// The longest error message a record keeps, in bytes; a longer one is cut at a character boundary.
pub const MAX_ERROR_BYTES: usize = 1024;

/// A rank's last failed call: the operation that was in flight and the error it returned.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Failure {
    /// The operation in flight when the call failed (`None`: nothing was).
    pub op: Option<InFlight>,
    /// When it failed, in nanoseconds since the Unix epoch.
    pub at_ns: u64,
    /// The `ncclResult_t` it returned.
    pub result: i32,
    /// The error as the call returned it, at most [`MAX_ERROR_BYTES`].
    pub error: String,
}

impl Failure {
    /// How long the operation ran before it failed (0 when none was in flight).
    pub fn ran_ns(&self) -> u64 {
        self.op.as_ref().map_or(0, |o| self.at_ns.saturating_sub(o.start_ns))
    }
}

/// What a [`LiveRecord`] held at one moment.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct LiveSnapshot {
    /// Operations launched, per [`CollType`] number.
    pub launched: [u64; CollType::COUNT],
    /// Operations completed successfully, per [`CollType`] number.
    pub completed: [u64; CollType::COUNT],
    /// `ncclResult_t` of init: in progress while initializing, then success or the error.
    pub init_state: i32,
    /// `ncclResult_t` of the communicator's asynchronous error (success when none).
    pub async_error: i32,
    pub finalize_called: bool,
    pub destroy_flag: bool,
    pub abort_flag: bool,
    pub in_flight: Option<InFlight>,
    /// Calls that returned an error (a group of sends and receives counts once).
    pub failed: u64,
    /// The last of them, with its error.
    pub last_failure: Option<Failure>,
}

impl Default for LiveSnapshot {
    fn default() -> Self {
        Self {
            launched: [0; CollType::COUNT],
            completed: [0; CollType::COUNT],
            init_state: ResultCode::InProgress.code(),
            async_error: ResultCode::Success.code(),
            finalize_called: false,
            destroy_flag: false,
            abort_flag: false,
            in_flight: None,
            failed: 0,
            last_failure: None,
        }
    }
}

/// One rank of one communicator, as a plain value: what the mesh carries and a report is built from.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub struct RankRecord {
    pub info: RankInfo,
    pub live: LiveSnapshot,
}

impl RankRecord {
    pub fn launched(&self, coll: CollType) -> u64 {
        self.live.launched[coll as usize]
    }

    pub fn completed(&self, coll: CollType) -> u64 {
        self.live.completed[coll as usize]
    }
}
