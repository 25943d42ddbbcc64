//! The ring of the last N operations of one communicator rank: one writer, lock-free readers.
//!
//! Every slot is a per-slot seqlock built from atomics: the writer makes the slot's version odd,
//! stores the fields (relaxed), and makes the version even again (release); a reader loads the
//! version (acquire), the fields (relaxed), fences (acquire) and loads the version again, and
//! keeps the copy only if both loads saw the same even version. A reader never blocks the writer;
//! a slot that stays torn for a few tries is left out of that read. Fields are plain words, so
//! nothing allocates per operation and no clock is read: the caller passes the timestamps.

use super::names::{self, NONE};
use std::collections::VecDeque;
use std::fmt;
use std::sync::atomic::{fence, AtomicU64, AtomicUsize, Ordering::*};
use std::sync::{Arc, Mutex, PoisonError};

/// Default number of operations kept per communicator (`OCCL_FLIGHT_RECORDER_SIZE`).
pub const DEFAULT_CAPACITY: usize = 2048;
/// Largest capacity accepted (128 MiB of slots).
pub const MAX_CAPACITY: usize = 1 << 20;
/// Failure reasons and dump reasons are cut to this many bytes (at a character boundary).
pub const MAX_REASON_BYTES: usize = 512;
/// Failure reasons kept per recorder; the oldest goes first (failures are rare; a failing
/// communicator fails the few operations it has in flight, then stops).
pub const MAX_ERRORS: usize = 256;

/// Tries a reader makes on a slot the writer is rewriting before it leaves the slot out.
const READ_TRIES: usize = 64;

/// Who an operation addresses besides the communicator: the root of a rooted collective
/// (Broadcast, Reduce) or the peer of a point-to-point operation (Send, Recv).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RootOrPeer {
    Root(u32),
    Peer(u32),
}

/// What the communicator knows about an operation when it enqueues it. Names are the spellings
/// the core already uses elsewhere (NCCL's: "AllReduce", "ncclFloat32", "RING", "SIMPLE").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OpInfo {
    /// The communicator's operation counter, any kind of operation; equal on all ranks.
    pub seq: u64,
    /// The per-function counter (NCCL's `seqNumber`).
    pub coll_seq: u64,
    pub op: &'static str,
    pub dtype: &'static str,
    /// The reduction, for reducing collectives.
    pub redop: Option<&'static str>,
    /// Elements.
    pub count: u64,
    pub in_bytes: u64,
    pub out_bytes: u64,
    pub root_or_peer: Option<RootOrPeer>,
    pub algo: &'static str,
    pub proto: &'static str,
}

/// Where an operation is. Transitions only go forward: `Enqueued` → `Started` →
/// `Completed` | `Failed`, and `Started` may be skipped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum OpState {
    Enqueued = 0,
    Started = 1,
    Completed = 2,
    Failed = 3,
}

impl OpState {
    /// The spelling in the JSON dump.
    pub const fn as_str(self) -> &'static str {
        match self {
            OpState::Enqueued => "enqueued",
            OpState::Started => "started",
            OpState::Completed => "completed",
            OpState::Failed => "failed",
        }
    }

    /// Neither completed nor failed.
    pub const fn in_flight(self) -> bool {
        matches!(self, OpState::Enqueued | OpState::Started)
    }

    const fn rank(self) -> u8 {
        match self {
            OpState::Enqueued => 0,
            OpState::Started => 1,
            OpState::Completed | OpState::Failed => 2,
        }
    }

    const fn from_bits(b: u64) -> OpState {
        match b & 3 {
            0 => OpState::Enqueued,
            1 => OpState::Started,
            2 => OpState::Completed,
            _ => OpState::Failed,
        }
    }
}

impl fmt::Display for OpState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The identity of the communicator rank a recorder belongs to, as the dump names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FlightComm {
    /// The communicator's 64-bit id, equal on all ranks (NCCL's `commHash`).
    pub comm_hash: u64,
    pub rank: u32,
    pub nranks: u32,
    pub pid: u32,
    pub host: String,
    /// `config.commName`, if the application gave one.
    pub comm_name: Option<String>,
}

/// The token `enqueue` returns, to pass to `started`/`completed`/`failed`. Once the ring has
/// wrapped past the operation, the token no longer matches its slot and updates are dropped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Slot {
    record: u64,
    index: u32,
}

impl Slot {
    /// The token of a disabled recorder; every update with it is a no-op.
    pub const DISABLED: Slot = Slot { record: u64::MAX, index: u32::MAX };

    /// The recorder's own counter of `enqueue` calls (PyTorch's `record_id`); `None` for
    /// [`Slot::DISABLED`].
    pub fn record_id(self) -> Option<u64> {
        (self != Slot::DISABLED).then_some(self.record)
    }
}

/// One operation as a reader saw it: a consistent copy of one slot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// The recorder's own counter of enqueued operations, from 0.
    pub record_id: u64,
    pub info: OpInfo,
    pub state: OpState,
    pub t_enqueued_ns: u64,
    pub t_started_ns: Option<u64>,
    /// When it completed or failed (see `state`).
    pub t_ended_ns: Option<u64>,
    /// Collectives (not send/recv) this recorder had enqueued up to and including this one
    /// (PyTorch's `collective_seq_id`: equal on every rank for the same collective).
    pub collective_seq_id: u64,
    /// Sends and receives it had enqueued up to and including this one (`p2p_seq_id`).
    pub p2p_seq_id: u64,
    /// The failure reason, while the recorder still holds it (the last [`MAX_ERRORS`]).
    pub error: Option<String>,
}

impl Entry {
    /// From start to completion or failure; `None` unless both were recorded.
    pub fn duration_ns(&self) -> Option<u64> {
        Some(self.t_ended_ns?.saturating_sub(self.t_started_ns?))
    }
}

// `meta` word: bits 0-15 proto, 16-17 state, 18 started-time present, 19 root, 20 peer,
// 32-63 root or peer rank. `names` word: op, dtype, redop, algo, 16 bits each.
const STATE_SHIFT: u32 = 16;
const STATE_MASK: u64 = 3 << STATE_SHIFT;
const HAS_START: u64 = 1 << 18;
const IS_ROOT: u64 = 1 << 19;
const IS_PEER: u64 = 1 << 20;

/// One ring slot: 112 bytes of fields in 128, aligned so that it fills two cache lines.
#[repr(align(64))]
#[derive(Default)]
struct Rec {
    /// Seqlock: 0 never written, odd while being written.
    version: AtomicU64,
    record: AtomicU64,
    seq: AtomicU64,
    coll_seq: AtomicU64,
    count: AtomicU64,
    in_bytes: AtomicU64,
    out_bytes: AtomicU64,
    names: AtomicU64,
    meta: AtomicU64,
    t_enqueued: AtomicU64,
    t_started: AtomicU64,
    t_ended: AtomicU64,
    /// Collectives and sends/receives enqueued so far, this one included.
    colls: AtomicU64,
    p2ps: AtomicU64,
}

/// A plain copy of a slot.
#[derive(Clone, Copy)]
struct Raw {
    record: u64,
    seq: u64,
    coll_seq: u64,
    count: u64,
    in_bytes: u64,
    out_bytes: u64,
    names: u64,
    meta: u64,
    t_enqueued: u64,
    t_started: u64,
    t_ended: u64,
    colls: u64,
    p2ps: u64,
}

impl Rec {
    /// Opens the slot for writing; returns the version to pass to `close`.
    #[inline]
    fn open(&self) -> u64 {
        let v = self.version.load(Relaxed);
        self.version.store(v | 1, Relaxed);
        fence(Release);
        v | 1
    }

    #[inline]
    fn close(&self, odd: u64) {
        self.version.store(odd + 1, Release);
    }

    fn read(&self) -> Option<Raw> {
        for _ in 0..READ_TRIES {
            let v1 = self.version.load(Acquire);
            if v1 == 0 {
                return None;
            }
            if v1 & 1 == 1 {
                std::hint::spin_loop();
                continue;
            }
            let raw = Raw {
                record: self.record.load(Relaxed),
                seq: self.seq.load(Relaxed),
                coll_seq: self.coll_seq.load(Relaxed),
                count: self.count.load(Relaxed),
                in_bytes: self.in_bytes.load(Relaxed),
                out_bytes: self.out_bytes.load(Relaxed),
                names: self.names.load(Relaxed),
                meta: self.meta.load(Relaxed),
                t_enqueued: self.t_enqueued.load(Relaxed),
                t_started: self.t_started.load(Relaxed),
                t_ended: self.t_ended.load(Relaxed),
                colls: self.colls.load(Relaxed),
                p2ps: self.p2ps.load(Relaxed),
            };
            fence(Acquire);
            if self.version.load(Relaxed) == v1 {
                return Some(raw);
            }
        }
        None
    }
}

/// The last N operations of one communicator rank. See the module docs of [`crate::flight`] for
/// the writer contract.
pub struct FlightRecorder {
    comm: FlightComm,
    slots: Box<[Rec]>,
    /// Operations enqueued so far (the next record id); written by the writer only.
    next_record: AtomicU64,
    /// The slot of the next record; writer only.
    next_index: AtomicUsize,
    /// Collectives and sends/receives enqueued so far; writer only.
    colls: AtomicU64,
    p2ps: AtomicU64,
    /// (record id, reason) of recent failures, oldest first.
    errors: Mutex<VecDeque<(u64, String)>>,
}

impl fmt::Debug for FlightRecorder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FlightRecorder")
            .field("comm", &self.comm)
            .field("capacity", &self.capacity())
            .field("recorded", &self.recorded())
            .finish()
    }
}

/// Cuts `s` to at most `max` bytes at a character boundary.
pub(crate) fn truncate_str(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

impl FlightRecorder {
    /// A recorder of the last `capacity` operations (capped at [`MAX_CAPACITY`]; 0 gives a
    /// disabled recorder whose every call is one branch), not registered: the slots are
    /// allocated here, once. `FlightRecorder::new` (`registry.rs`) registers it.
    pub(super) fn unregistered(comm: FlightComm, capacity: usize) -> Arc<FlightRecorder> {
        let capacity = capacity.min(MAX_CAPACITY);
        let slots: Box<[Rec]> = (0..capacity).map(|_| Rec::default()).collect();
        Arc::new(FlightRecorder {
            comm,
            slots,
            next_record: AtomicU64::new(0),
            next_index: AtomicUsize::new(0),
            colls: AtomicU64::new(0),
            p2ps: AtomicU64::new(0),
            errors: Mutex::new(VecDeque::new()),
        })
    }

    /// The communicator rank this recorder belongs to.
    pub fn comm(&self) -> &FlightComm {
        &self.comm
    }

    /// Operations kept; 0 when disabled.
    pub fn capacity(&self) -> usize {
        self.slots.len()
    }

    /// Whether the recorder records anything.
    #[inline]
    pub fn is_enabled(&self) -> bool {
        !self.slots.is_empty()
    }

    /// Operations enqueued since creation (those before the last `capacity` are gone).
    pub fn recorded(&self) -> u64 {
        self.next_record.load(Acquire)
    }

    /// Records a new operation as enqueued at `t_ns` (ns since the Unix epoch), overwriting the
    /// oldest one once the ring is full.
    #[inline]
    pub fn enqueue(&self, op: &OpInfo, t_ns: u64) -> Slot {
        let index = self.next_index.load(Relaxed);
        let Some(r) = self.slots.get(index) else {
            return Slot::DISABLED;
        };
        let record = self.next_record.load(Relaxed);
        let names = u64::from(names::intern(op.op))
            | u64::from(names::intern(op.dtype)) << 16
            | u64::from(op.redop.map_or(NONE, names::intern)) << 32
            | u64::from(names::intern(op.algo)) << 48;
        let mut meta = u64::from(names::intern(op.proto)) | (OpState::Enqueued as u64) << STATE_SHIFT;
        let (mut colls, mut p2ps) = (self.colls.load(Relaxed), self.p2ps.load(Relaxed));
        match op.root_or_peer {
            Some(RootOrPeer::Root(r)) => meta |= IS_ROOT | u64::from(r) << 32,
            Some(RootOrPeer::Peer(p)) => meta |= IS_PEER | u64::from(p) << 32,
            None => {}
        }
        if meta & IS_PEER != 0 {
            p2ps += 1;
            self.p2ps.store(p2ps, Relaxed);
        } else {
            colls += 1;
            self.colls.store(colls, Relaxed);
        }
        let v = r.open();
        r.record.store(record, Relaxed);
        r.seq.store(op.seq, Relaxed);
        r.coll_seq.store(op.coll_seq, Relaxed);
        r.count.store(op.count, Relaxed);
        r.in_bytes.store(op.in_bytes, Relaxed);
        r.out_bytes.store(op.out_bytes, Relaxed);
        r.names.store(names, Relaxed);
        r.meta.store(meta, Relaxed);
        r.t_enqueued.store(t_ns, Relaxed);
        r.t_started.store(0, Relaxed);
        r.t_ended.store(0, Relaxed);
        r.colls.store(colls, Relaxed);
        r.p2ps.store(p2ps, Relaxed);
        r.close(v);
        let next = index + 1;
        self.next_index.store(if next == self.slots.len() { 0 } else { next }, Relaxed);
        self.next_record.store(record + 1, Release);
        Slot { record, index: index as u32 }
    }

    /// The slot of `s` if it still holds that operation and `to` is a step forward from its
    /// state; with the current `meta` word.
    #[inline]
    fn target(&self, s: Slot, to: OpState) -> Option<(&Rec, u64)> {
        let r = self.slots.get(s.index as usize)?;
        if r.record.load(Relaxed) != s.record {
            return None;
        }
        let meta = r.meta.load(Relaxed);
        (OpState::from_bits(meta >> STATE_SHIFT).rank() < to.rank()).then_some((r, meta))
    }

    /// Records that the operation started moving data at `t_ns`.
    #[inline]
    pub fn started(&self, s: Slot, t_ns: u64) {
        if let Some((r, meta)) = self.target(s, OpState::Started) {
            let v = r.open();
            r.t_started.store(t_ns, Relaxed);
            r.meta.store(meta & !STATE_MASK | (OpState::Started as u64) << STATE_SHIFT | HAS_START, Relaxed);
            r.close(v);
        }
    }

    #[inline]
    fn end(&self, r: &Rec, meta: u64, to: OpState, t_ns: u64) {
        let v = r.open();
        r.t_ended.store(t_ns, Relaxed);
        r.meta.store(meta & !STATE_MASK | (to as u64) << STATE_SHIFT, Relaxed);
        r.close(v);
    }

    /// Records that the operation completed at `t_ns`.
    #[inline]
    pub fn completed(&self, s: Slot, t_ns: u64) {
        if let Some((r, meta)) = self.target(s, OpState::Completed) {
            self.end(r, meta, OpState::Completed, t_ns);
        }
    }

    /// Records that the operation failed at `t_ns`; `reason` is kept (cut to
    /// [`MAX_REASON_BYTES`]) for the last [`MAX_ERRORS`] failures. Takes a lock: failures are rare.
    pub fn failed(&self, s: Slot, t_ns: u64, reason: &str) {
        let Some((r, meta)) = self.target(s, OpState::Failed) else {
            return;
        };
        {
            let cap = self.slots.len() as u64;
            let mut errors = self.errors.lock().unwrap_or_else(PoisonError::into_inner);
            while errors.len() >= MAX_ERRORS || errors.front().is_some_and(|(id, _)| id + cap <= s.record) {
                errors.pop_front();
            }
            errors.push_back((s.record, truncate_str(reason, MAX_REASON_BYTES).to_owned()));
        }
        // The reason is in the table before the state says "failed", so a reader that sees the
        // state finds the reason.
        self.end(r, meta, OpState::Failed, t_ns);
    }

    fn entry(raw: &Raw, error: Option<String>) -> Entry {
        let name = |shift: u32| names::lookup((raw.names >> shift) as u16);
        let text = |shift: u32| name(shift).unwrap_or(names::OVERFLOW_NAME);
        let state = OpState::from_bits(raw.meta >> STATE_SHIFT);
        let who = (raw.meta >> 32) as u32;
        Entry {
            record_id: raw.record,
            info: OpInfo {
                seq: raw.seq,
                coll_seq: raw.coll_seq,
                op: text(0),
                dtype: text(16),
                redop: name(32),
                count: raw.count,
                in_bytes: raw.in_bytes,
                out_bytes: raw.out_bytes,
                root_or_peer: if raw.meta & IS_ROOT != 0 {
                    Some(RootOrPeer::Root(who))
                } else if raw.meta & IS_PEER != 0 {
                    Some(RootOrPeer::Peer(who))
                } else {
                    None
                },
                algo: text(48),
                proto: names::lookup(raw.meta as u16).unwrap_or(names::OVERFLOW_NAME),
            },
            state,
            t_enqueued_ns: raw.t_enqueued,
            t_started_ns: (raw.meta & HAS_START != 0).then_some(raw.t_started),
            t_ended_ns: (!state.in_flight()).then_some(raw.t_ended),
            collective_seq_id: raw.colls,
            p2p_seq_id: raw.p2ps,
            error,
        }
    }

    fn error_of(&self, record: u64) -> Option<String> {
        let errors = self.errors.lock().unwrap_or_else(PoisonError::into_inner);
        errors.iter().rev().find(|(id, _)| *id == record).map(|(_, e)| e.clone())
    }

    /// Calls `f` with each operation the ring held when the call began, oldest first, without
    /// buffering them. Each entry is a consistent copy of its slot; the set is not one instant
    /// (the writer goes on meanwhile): an operation the writer overwrites before its slot is read,
    /// or whose slot it was rewriting throughout the read, is left out.
    pub fn for_each_entry(&self, mut f: impl FnMut(Entry)) {
        let cap = self.slots.len() as u64;
        let head = self.next_record.load(Acquire);
        for record in head.saturating_sub(cap)..head {
            let Some(raw) = self.slots.get((record % cap) as usize).and_then(Rec::read) else {
                continue;
            };
            if raw.record != record {
                continue;
            }
            let failed = OpState::from_bits(raw.meta >> STATE_SHIFT) == OpState::Failed;
            f(Self::entry(&raw, if failed { self.error_of(record) } else { None }));
        }
    }

    /// The operations the ring holds, oldest first (see [`FlightRecorder::for_each_entry`]).
    pub fn snapshot(&self) -> Vec<Entry> {
        let mut v = Vec::with_capacity(self.slots.len());
        self.for_each_entry(|e| v.push(e));
        v
    }

    /// The oldest operation that has neither completed nor failed: what this rank is stuck in,
    /// if it is stuck.
    pub fn last_in_flight(&self) -> Option<Entry> {
        let raw = self
            .slots
            .iter()
            .filter_map(Rec::read)
            .filter(|r| OpState::from_bits(r.meta >> STATE_SHIFT).in_flight())
            .min_by_key(|r| r.record)?;
        Some(Self::entry(&raw, None))
    }

    /// The entry of one token, if the ring still holds it (tests and RAS look-ups).
    pub fn get(&self, s: Slot) -> Option<Entry> {
        let raw = self.slots.get(s.index as usize)?.read()?;
        if raw.record != s.record {
            return None;
        }
        let failed = OpState::from_bits(raw.meta >> STATE_SHIFT) == OpState::Failed;
        Some(Self::entry(&raw, if failed { self.error_of(raw.record) } else { None }))
    }
}
