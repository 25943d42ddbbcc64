//! The report model: what the root knows after a gather, already analysed (grouping, verdicts, outlier selection).
//! Renderers only lay it out, so the text and JSON forms can never disagree about a verdict.

/// Version lines. occl prints its own version where NCCL prints `NCCL version X.Y.Z`.
#[derive(Clone, Debug, PartialEq)]
pub struct VersionInfo {
    /// occl's own version, e.g. `env!("CARGO_PKG_VERSION")`.
    pub occl_version: String,
    /// The NCCL release whose report format and API this mirrors (JSON `nccl_version`, for existing consumers).
    pub nccl_compat_version: String,
    /// `M.m` the build targeted, if any (`compiled with CUDA M.m`).
    pub cuda_compiled: Option<String>,
    /// CUDA runtime and driver versions as integers (e.g. 13000).
    pub cuda_runtime: i32,
    pub cuda_driver: i32,
}

/// The job summary. When every node runs the same number of processes, each with the same number of GPUs, NCCL
/// prints one row of these numbers; otherwise `spread` says how they vary and the per-node and per-process numbers
/// here are unused.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct JobSummary {
    pub nodes: u32,
    pub processes_per_node: u32,
    pub gpus_per_process: u32,
    pub processes_total: u32,
    pub gpus_total: u32,
    pub spread: Option<SummarySpread>,
}

/// NCCL's alternative summary tables for a job whose nodes or processes are not all alike.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SummarySpread {
    /// `(nodes, processes per node)`, most frequent first, ties by more processes first.
    pub processes_per_node: Vec<(u32, u32)>,
    /// How many GPUs every process has, when that is uniform (the per-node table then gets a GPUs column).
    pub uniform_gpus: Option<u32>,
    /// `(processes, GPUs per process)`, most frequent first, ties by more GPUs first; empty when `uniform_gpus`.
    pub gpus_per_process: Vec<(u32, u32)>,
    /// Only with `uniform_gpus`: per rarer processes-per-node shape that counts as an outlier, its nodes.
    pub outlier_nodes: Vec<Vec<NodeRef>>,
}

/// A node and the processes it runs, in the summary's outlier list.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeRef {
    pub host: String,
    pub pids: Vec<u32>,
}

/// The communicator's highest status bit (NCCL's `Status` column).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum CommStatus {
    NoComm,
    Init,
    Running,
    Finalize,
    Abort,
}

impl CommStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            CommStatus::NoComm => "NOCOMM",
            CommStatus::Init => "INIT",
            CommStatus::Running => "RUNNING",
            CommStatus::Finalize => "FINALIZE",
            CommStatus::Abort => "ABORT",
        }
    }
}

/// The `Errors` column: a set, printed as `OK` when empty, else `INCOMPLETE,ERROR,MISMATCH` order.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ErrorSet {
    pub incomplete: bool,
    pub error: bool,
    pub mismatch: bool,
}

impl ErrorSet {
    pub fn label(self) -> String {
        let parts: Vec<&str> = [(self.incomplete, "INCOMPLETE"), (self.error, "ERROR"), (self.mismatch, "MISMATCH")]
            .into_iter()
            .filter_map(|(on, s)| on.then_some(s))
            .collect();
        if parts.is_empty() {
            "OK".to_string()
        } else {
            parts.join(",")
        }
    }
}

/// One row of the communicators table: a group of communicators with the same shape and verdict.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CommGroupRow {
    pub comms_in_group: u32,
    pub nodes_per_comm: u32,
    /// Min and max ranks per node; printed as `min-max` when they differ.
    pub ranks_per_node: (u32, u32),
    pub ranks_per_comm: u32,
    /// Unique (process, NVML GPU) pairs across the group.
    pub ranks_in_group: u32,
    pub status: CommStatus,
    pub errors: ErrorSet,
}

/// `#<group>-<index> (<hash>)`: how Errors and Warnings refer to a communicator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CommRef {
    pub group: u32,
    pub index: u32,
    pub hash: u64,
}

/// Where a rank lives. `None` in [`RankRef::loc`] prints `[process information not found]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RankLoc {
    pub cuda_dev: u32,
    /// Printed as ` (NVML n)` only when it differs from `cuda_dev`.
    pub nvml_dev: u32,
    pub pid: u32,
    pub host: String,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RankRef {
    pub rank: u32,
    pub loc: Option<RankLoc>,
}

/// A job process in the job-level entries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcessRef {
    pub pid: u32,
    pub host: String,
    pub cuda_devs: Vec<u32>,
    /// Printed as ` (NVML list)` only when it differs from `cuda_devs`.
    pub nvml_devs: Vec<u32>,
}

/// Ranks sharing one value. `count` is the group size; `members` are the ranks listed under it (empty when the
/// outlier rule hides them). A group with `count == 1` is printed in NCCL's one-line form.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RankGroup<V> {
    pub value: V,
    pub count: u32,
    pub members: Vec<RankRef>,
}

/// One `Communicator ranks have different <coll> operation counts` block.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OpCountMismatch {
    /// NCCL's collective name: Broadcast, Reduce, AllGather, ReduceScatter, AllReduce.
    pub collective: String,
    /// Most frequent first; ties by value, descending. Value 0 means "not launched any operations".
    pub groups: Vec<RankGroup<u64>>,
}

/// Per-error-kind breakdown of init or async errors: the value is NCCL's error name (`Unhandled CUDA error`...).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ErrorBreakdown {
    pub ranks: u32,
    pub groups: Vec<RankGroup<String>>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ErrorEntry {
    /// Job processes that did not answer and are not (yet) considered dead.
    Incomplete { processes: Vec<ProcessRef>, missing: u32, not_found: u32 },
    /// Processes on the replicated dead list; `not_found` of them are not in the peer table.
    Dead { processes: Vec<ProcessRef>, dead: u32, not_found: u32 },
    /// Ranks of a communicator whose data did not arrive.
    CommIncomplete { comm: CommRef, missing: u32, ranks: Vec<RankRef> },
    /// Init or async errors reported by ranks of a communicator.
    CommError { comm: CommRef, init: Option<ErrorBreakdown>, async_: Option<ErrorBreakdown> },
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WarningEntry {
    /// Gather legs that timed out.
    Timeout { count: u32 },
    /// Ranks disagreeing on status (NOCOMM included) and/or on per-collective operation counts.
    CommMismatch { comm: CommRef, status: Vec<RankGroup<CommStatus>>, counts: Vec<OpCountMismatch> },
}

/// occl-only: an operation a rank has been waiting in, with its progress state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StuckOp {
    pub comm: CommRef,
    pub rank: RankRef,
    pub operation: String,
    /// The per-communicator, per-collective sequence number (matches the op counters).
    pub seq: u64,
    pub waited_ms: u64,
    /// The peer rank it waits on, if known.
    pub peer: Option<u32>,
    /// Free-form protocol step state, e.g. `recv step 3/8`.
    pub step: String,
}

/// occl-only: a rank whose last call failed (the communicator is unusable from then on), with the operation it was
/// in and the error it returned. The operation is no longer in flight, so it is not a [`StuckOp`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FailedOp {
    pub comm: CommRef,
    pub rank: RankRef,
    /// The operation's name and per-collective sequence number; `None` when no operation was in flight.
    pub operation: Option<(String, u64)>,
    /// How long the operation ran before it failed.
    pub ran_ms: u64,
    /// How long ago it failed.
    pub ago_ms: u64,
    /// The `ncclResult_t` the call returned.
    pub result: i32,
    /// The error as the call returned it.
    pub error: String,
}

/// Raw per-rank data for the JSON dump.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RankData {
    pub rank: u32,
    pub host: String,
    pub pid: u32,
    pub cuda_dev: u32,
    pub nvml_dev: u32,
    pub init_state: i32,
    pub async_error: i32,
    pub finalize_called: bool,
    pub destroy_flag: bool,
    pub abort_flag: bool,
    /// Broadcast, Reduce, AllGather, ReduceScatter, AllReduce.
    pub collective_counts: [u64; 5],
    /// occl-only: operations of every kind (p2p and all-to-all included) launched, completed and failed by this rank;
    /// `None` for data that did not come from occl. Launched less completed is what the rank has in flight or lost
    /// to a failure.
    pub occl_ops: Option<OpTotals>,
}

/// occl-only per-rank operation totals (JSON `occl_operations`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OpTotals {
    pub launched: u64,
    pub completed: u64,
    /// Calls that returned an error (a group of sends and receives counts once).
    pub failed: u64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MissingRankData {
    pub rank: u32,
    pub host: String,
    pub pid: u32,
    pub cuda_dev: u32,
    pub nvml_dev: u32,
    pub unresponsive: bool,
    pub considered_dead: bool,
}

/// One communicator as gathered, in commId order (JSON is a raw dump, not grouped).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CommData {
    pub hash: u64,
    /// hostHash and pidHash of comm rank 0.
    pub secondary_hash: (u64, u64),
    pub size: u32,
    pub ranks: Vec<RankData>,
    pub missing_ranks: Vec<MissingRankData>,
}

/// A whole report.
#[derive(Clone, Debug, PartialEq)]
pub struct Report {
    pub version: VersionInfo,
    /// Local time `YYYY-MM-DD HH:MM:SS` (JSON only); the caller formats it so this crate stays clock-free.
    pub timestamp: String,
    /// Gather duration in seconds, printed with 3 decimals.
    pub collection_time_sec: f64,
    pub timeouts_count: u32,
    pub summary: JobSummary,
    /// Empty prints `No communicator data collected!`.
    pub groups: Vec<CommGroupRow>,
    pub errors: Vec<ErrorEntry>,
    pub warnings: Vec<WarningEntry>,
    pub stuck: Vec<StuckOp>,
    /// Failed operations, earliest failure first (the first is often the cause of the others).
    pub failed: Vec<FailedOp>,
    pub comms: Vec<CommData>,
}

/// NCCL's `ncclResult_t`, the values a rank's init state and async error take (reports print them as integers in
/// JSON and by name in text).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[repr(i32)]
pub enum ResultCode {
    Success = 0,
    UnhandledCudaError = 1,
    SystemError = 2,
    InternalError = 3,
    InvalidArgument = 4,
    InvalidUsage = 5,
    RemoteError = 6,
    InProgress = 7,
}

impl ResultCode {
    pub const fn code(self) -> i32 {
        self as i32
    }

    pub fn from_code(code: i32) -> Option<ResultCode> {
        use ResultCode::*;
        [
            Success,
            UnhandledCudaError,
            SystemError,
            InternalError,
            InvalidArgument,
            InvalidUsage,
            RemoteError,
            InProgress,
        ]
        .into_iter()
        .find(|r| r.code() == code)
    }

    /// The name NCCL's text report uses for an error code; unknown codes are "Unexpected error".
    pub fn report_name(code: i32) -> &'static str {
        match ResultCode::from_code(code) {
            Some(ResultCode::Success) => "Success",
            Some(ResultCode::UnhandledCudaError) => "Unhandled CUDA error",
            Some(ResultCode::SystemError) => "System error",
            Some(ResultCode::InternalError) => "Internal error",
            Some(ResultCode::InvalidArgument) => "Invalid argument",
            Some(ResultCode::InvalidUsage) => "Invalid usage",
            Some(ResultCode::RemoteError) => "Remote process error",
            Some(ResultCode::InProgress) => "NCCL operation in progress",
            None => "Unexpected error",
        }
    }

    /// Whether a report counts this code as an error (anything but success and in-progress).
    pub fn is_error(code: i32) -> bool {
        code != ResultCode::Success.code() && code != ResultCode::InProgress.code()
    }
}
