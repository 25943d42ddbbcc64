//! The per-rank record of operations: how many of each kind were launched and completed, and
//! which one is in flight. RAS reads it to say who is behind and what a hung rank is stuck in;
//! updating it is a few relaxed atomic stores per operation.

use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// The operations a communicator runs, numbered as NCCL's `ncclFunc_t` where it has them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum CollType {
    Broadcast = 0,
    Reduce = 1,
    AllGather = 2,
    ReduceScatter = 3,
    AllReduce = 4,
    Send = 5,
    Recv = 6,
    AllToAll = 7,
}

impl CollType {
    pub const ALL: [CollType; 8] = [
        CollType::Broadcast,
        CollType::Reduce,
        CollType::AllGather,
        CollType::ReduceScatter,
        CollType::AllReduce,
        CollType::Send,
        CollType::Recv,
        CollType::AllToAll,
    ];

    /// NCCL's spelling, as RAS reports and profiler plugins print it.
    pub const fn name(self) -> &'static str {
        match self {
            CollType::Broadcast => "Broadcast",
            CollType::Reduce => "Reduce",
            CollType::AllGather => "AllGather",
            CollType::ReduceScatter => "ReduceScatter",
            CollType::AllReduce => "AllReduce",
            CollType::Send => "Send",
            CollType::Recv => "Recv",
            CollType::AllToAll => "AllToAll",
        }
    }

    pub(crate) fn from_u8(v: u8) -> Option<CollType> {
        CollType::ALL.iter().copied().find(|c| *c as u8 == v)
    }
}

/// An operation in flight, as seen in a snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InFlight {
    /// 1-based sequence number among this communicator's operations of any kind.
    pub seq: u64,
    pub coll: CollType,
    pub bytes: u64,
    /// Start, in nanoseconds since the Unix epoch.
    pub start_ns: u64,
}

/// Counters and the in-flight operation of one rank of one communicator.
#[derive(Debug, Default)]
pub struct OpRecord {
    launched: [AtomicU64; 8],
    completed: [AtomicU64; 8],
    total: AtomicU64,
    inflight_seq: AtomicU64,
    inflight_coll: AtomicU8,
    inflight_bytes: AtomicU64,
    inflight_start: AtomicU64,
}

/// Wall-clock nanoseconds from the coarse clock (a few ns to read, ~4 ms resolution): enough to
/// say how long an operation has been stuck, and cheap enough for every call.
pub(crate) fn now_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes into the timespec we own.
    if unsafe { libc::clock_gettime(libc::CLOCK_REALTIME_COARSE, &mut ts) } == 0 {
        ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
    } else {
        SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
    }
}

impl OpRecord {
    /// Stamps an operation that starts at `t_ns` (from `now_ns`); returns its sequence number.
    pub(crate) fn launch(&self, coll: CollType, bytes: u64, t_ns: u64) -> u64 {
        self.launched[coll as usize].fetch_add(1, Ordering::Relaxed);
        let seq = self.total.fetch_add(1, Ordering::Relaxed) + 1;
        self.inflight_coll.store(coll as u8, Ordering::Relaxed);
        self.inflight_bytes.store(bytes, Ordering::Relaxed);
        self.inflight_start.store(t_ns, Ordering::Relaxed);
        self.inflight_seq.store(seq, Ordering::Release);
        seq
    }

    pub(crate) fn complete(&self, coll: CollType) {
        self.completed[coll as usize].fetch_add(1, Ordering::Relaxed);
        self.inflight_seq.store(0, Ordering::Release);
    }

    /// Operations of `coll` started so far.
    pub fn launched(&self, coll: CollType) -> u64 {
        self.launched[coll as usize].load(Ordering::Relaxed)
    }

    /// Operations of `coll` that returned successfully.
    pub fn completed(&self, coll: CollType) -> u64 {
        self.completed[coll as usize].load(Ordering::Relaxed)
    }

    /// The operation running now, if any (a failed one stays in flight).
    pub fn in_flight(&self) -> Option<InFlight> {
        let seq = self.inflight_seq.load(Ordering::Acquire);
        if seq == 0 {
            return None;
        }
        Some(InFlight {
            seq,
            coll: CollType::from_u8(self.inflight_coll.load(Ordering::Relaxed))?,
            bytes: self.inflight_bytes.load(Ordering::Relaxed),
            start_ns: self.inflight_start.load(Ordering::Relaxed),
        })
    }
}
