//! [`LiveRecord`]: the counters and in-flight operation of one rank, written by that rank's thread on the collective
//! path and read by the RAS thread at any time.
//!
//! Cost on the writer's side: plain loads and relaxed stores (no read-modify-write, no lock, no allocation), because
//! each record has a single writer. Only a failure, off the success path, takes a lock to keep its error text. The in-flight fields change together, so they sit behind a sequence counter
//! (odd while the writer is between its stores) that lets a reader retry until it sees one consistent operation.
//! On x86 and ARM the release fences the writer needs compile to nothing or to one barrier instruction.

use std::sync::atomic::{fence, AtomicI32, AtomicU64, AtomicU8, Ordering::*};
use std::sync::{Mutex, PoisonError};

use super::{CollType, Failure, Flag, InFlight, LiveSnapshot, ResultCode, MAX_ERROR_BYTES};

/// `waiting_on` packs the peer and the step state into one word so that one store updates both; this marks "none".
const NONE32: u64 = u32::MAX as u64;
const NO_WAIT: u64 = (NONE32 << 32) | NONE32;

/// How often a reader retries a read the writer interfered with: spinning at first, then yielding (a writer
/// preempted between its stores needs the CPU back). Giving up takes a writer that changes the operation during every
/// one of thousands of scheduler slices; the reader then reports nothing rather than a torn operation.
const SPIN_RETRIES: usize = 64;
const READ_RETRIES: usize = 10_000;

/// Counters and the in-flight operation of one rank of one communicator.
///
/// One thread writes (the rank's own); any number read. Two threads calling the writer methods at once do not
/// cause undefined behaviour, but counts may be lost.
#[derive(Debug)]
pub struct LiveRecord {
    launched: [AtomicU64; CollType::COUNT],
    completed: [AtomicU64; CollType::COUNT],
    total: AtomicU64,
    /// Sequence counter over the `op_*` fields: odd while they are being changed.
    version: AtomicU64,
    /// In-flight sequence number (any type); 0 when nothing is in flight.
    op_seq: AtomicU64,
    /// `coll as u64 | coll_seq << 8`.
    op_coll: AtomicU64,
    op_bytes: AtomicU64,
    op_start: AtomicU64,
    /// `peer << 32 | step_state`, each `u32::MAX` for none. Written outside the sequence counter (one store), reset
    /// inside it at each launch so a new operation never shows the previous one's wait.
    op_wait: AtomicU64,
    init_state: AtomicI32,
    async_error: AtomicI32,
    flags: AtomicU8,
    /// Calls that failed, and the last one's operation and error.
    failed: AtomicU64,
    last_failure: Mutex<Option<Failure>>,
}

impl Default for LiveRecord {
    fn default() -> Self {
        Self::new()
    }
}

fn bump(a: &AtomicU64) -> u64 {
    // Single writer: a load and a store instead of a locked read-modify-write.
    let n = a.load(Relaxed).wrapping_add(1);
    a.store(n, Relaxed);
    n
}

impl LiveRecord {
    /// A record with no operations, init in progress, no error and no flags.
    pub fn new() -> Self {
        Self {
            launched: Default::default(),
            completed: Default::default(),
            total: AtomicU64::new(0),
            version: AtomicU64::new(0),
            op_seq: AtomicU64::new(0),
            op_coll: AtomicU64::new(0),
            op_bytes: AtomicU64::new(0),
            op_start: AtomicU64::new(0),
            op_wait: AtomicU64::new(NO_WAIT),
            init_state: AtomicI32::new(ResultCode::InProgress.code()),
            async_error: AtomicI32::new(ResultCode::Success.code()),
            flags: AtomicU8::new(0),
            failed: AtomicU64::new(0),
            last_failure: Mutex::new(None),
        }
    }

    /// Runs `write` between the two halves of the sequence counter.
    #[inline]
    fn write_op(&self, write: impl FnOnce()) {
        let v = self.version.load(Relaxed);
        self.version.store(v.wrapping_add(1), Relaxed);
        fence(Release);
        write();
        self.version.store(v.wrapping_add(2), Release);
    }

    /// An operation of `coll` moving `bytes` started at `start_ns` (wall-clock ns since the Unix epoch; the caller
    /// reads the clock so this stays clock-free). Returns its sequence number among all of this record's operations.
    #[inline]
    pub fn launch(&self, coll: CollType, bytes: u64, start_ns: u64) -> u64 {
        let coll_seq = bump(&self.launched[coll as usize]);
        let seq = bump(&self.total);
        self.write_op(|| {
            self.op_coll.store(coll as u64 | coll_seq << 8, Relaxed);
            self.op_bytes.store(bytes, Relaxed);
            self.op_start.store(start_ns, Relaxed);
            self.op_wait.store(NO_WAIT, Relaxed);
            self.op_seq.store(seq, Relaxed);
        });
        seq
    }

    /// The operation in flight, of type `coll`, returned successfully (a failed one goes through
    /// [`LiveRecord::fail`] instead).
    #[inline]
    pub fn complete(&self, coll: CollType) {
        bump(&self.completed[coll as usize]);
        self.write_op(|| {
            self.op_seq.store(0, Relaxed);
            self.op_wait.store(NO_WAIT, Relaxed);
        });
    }

    /// What the in-flight operation waits for now: the communicator rank, and NCCL's ProxyStep state number (see
    /// [`super::step_state`]). `peer` must be below `u32::MAX`, which is read back as `None`.
    #[inline]
    pub fn waiting_on(&self, peer: Option<u32>, step_state: Option<u32>) {
        let p = peer.map_or(NONE32, u64::from);
        let s = step_state.map_or(NONE32, u64::from);
        self.op_wait.store(p << 32 | s, Relaxed);
    }

    /// The call running the operation in flight (if any) returned `result` with `error` at wall-clock `at_ns`: the
    /// operation leaves flight, the communicator's asynchronous error becomes `result`, and the record keeps the
    /// operation and the error (the last failure) for reports. Without this a failed operation would stay in flight
    /// and read as stuck, its wait growing for as long as the process lives.
    pub fn fail(&self, result: ResultCode, error: &str, at_ns: u64) {
        let failure =
            Failure { op: self.in_flight(), at_ns, result: result.code(), error: truncated(error).to_owned() };
        // Kept before the operation leaves flight, so a reader sees it in flight, failed, or (for an instant) both;
        // never neither.
        *self.last_failure.lock().unwrap_or_else(PoisonError::into_inner) = Some(failure);
        self.async_error.store(result.code(), Relaxed);
        bump(&self.failed);
        self.write_op(|| {
            self.op_seq.store(0, Relaxed);
            self.op_wait.store(NO_WAIT, Relaxed);
        });
    }

    /// Calls that failed so far.
    pub fn failed(&self) -> u64 {
        self.failed.load(Relaxed)
    }

    /// The last failed call's operation and error.
    pub fn last_failure(&self) -> Option<Failure> {
        self.last_failure.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// The communicator's asynchronous error (`ResultCode::Success` clears it).
    pub fn set_error(&self, code: ResultCode) {
        self.async_error.store(code.code(), Relaxed);
    }

    /// The result of init: `InProgress` (the initial value) until it finishes, then `Success` or the error.
    pub fn set_init_state(&self, code: ResultCode) {
        self.init_state.store(code.code(), Relaxed);
    }

    /// Sets a lifecycle flag; flags are never cleared.
    pub fn set_flag(&self, flag: Flag) {
        self.flags.fetch_or(flag.bit(), Relaxed);
    }

    /// Operations of `coll` started so far.
    pub fn launched(&self, coll: CollType) -> u64 {
        self.launched[coll as usize].load(Relaxed)
    }

    /// Operations of `coll` that returned successfully.
    pub fn completed(&self, coll: CollType) -> u64 {
        self.completed[coll as usize].load(Relaxed)
    }

    /// Operations of any type started so far.
    pub fn total(&self) -> u64 {
        self.total.load(Relaxed)
    }

    /// The operation running now, if any.
    pub fn in_flight(&self) -> Option<InFlight> {
        let (seq, coll, bytes, start_ns, wait) = self.read_op()?;
        if seq == 0 {
            return None;
        }
        let unpack = |w: u64| (w != NONE32).then_some(w as u32);
        Some(InFlight {
            seq,
            coll: CollType::from_u8(coll as u8)?,
            coll_seq: coll >> 8,
            bytes,
            start_ns,
            peer: unpack(wait >> 32),
            step_state: unpack(wait & NONE32),
        })
    }

    /// The in-flight fields as one consistent set, or `None` if the writer never let a read through.
    fn read_op(&self) -> Option<(u64, u64, u64, u64, u64)> {
        for attempt in 0..READ_RETRIES {
            let v1 = self.version.load(Acquire);
            let fields = (
                self.op_seq.load(Relaxed),
                self.op_coll.load(Relaxed),
                self.op_bytes.load(Relaxed),
                self.op_start.load(Relaxed),
                self.op_wait.load(Relaxed),
            );
            fence(Acquire);
            if v1.is_multiple_of(2) && self.version.load(Relaxed) == v1 {
                return Some(fields);
            }
            if attempt < SPIN_RETRIES {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
        None
    }

    /// Everything at once. Counters are read one by one (a counter may move between two reads); the in-flight
    /// operation is read consistently.
    pub fn snapshot(&self) -> LiveSnapshot {
        let flags = self.flags.load(Relaxed);
        LiveSnapshot {
            launched: std::array::from_fn(|i| self.launched[i].load(Relaxed)),
            completed: std::array::from_fn(|i| self.completed[i].load(Relaxed)),
            init_state: self.init_state.load(Relaxed),
            async_error: self.async_error.load(Relaxed),
            finalize_called: flags & Flag::Finalized.bit() != 0,
            destroy_flag: flags & Flag::Destroyed.bit() != 0,
            abort_flag: flags & Flag::Aborted.bit() != 0,
            in_flight: self.in_flight(),
            failed: self.failed(),
            last_failure: self.last_failure(),
        }
    }
}

/// `text` cut to at most [`MAX_ERROR_BYTES`], at a character boundary.
fn truncated(text: &str) -> &str {
    let mut end = text.len().min(MAX_ERROR_BYTES);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}
