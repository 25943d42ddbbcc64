//! The per-process registry of rank records that the RAS thread reads when a status gather reaches this process.

use std::sync::{Arc, Mutex, MutexGuard, Weak};

use super::{LiveRecord, RankInfo, RankRecord};

/// One rank of one communicator: its static facts and its live counters.
#[derive(Debug)]
pub struct CommRecord {
    info: RankInfo,
    live: LiveRecord,
}

impl CommRecord {
    pub fn new(info: RankInfo) -> Self {
        Self { info, live: LiveRecord::new() }
    }

    pub fn info(&self) -> &RankInfo {
        &self.info
    }

    /// The counters the rank's thread updates.
    pub fn live(&self) -> &LiveRecord {
        &self.live
    }

    pub fn snapshot(&self) -> RankRecord {
        RankRecord { info: self.info.clone(), live: self.live.snapshot() }
    }
}

/// Every rank record of this process. It holds weak references: a communicator that is dropped disappears from
/// reports without having to unregister (NCCL likewise stops reporting a destroyed comm).
#[derive(Debug, Default)]
pub struct ProcessRecords {
    comms: Mutex<Vec<Weak<CommRecord>>>,
}

impl ProcessRecords {
    pub fn new() -> Self {
        Self::default()
    }

    // A panic while holding this lock cannot leave the list inconsistent (every change is one push or retain), so a
    // poisoned lock is used as is.
    fn lock(&self) -> MutexGuard<'_, Vec<Weak<CommRecord>>> {
        self.comms.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Adds a record; entries whose record was dropped are pruned on the way, so the list never outgrows the live
    /// communicators by much.
    pub fn register(&self, record: &Arc<CommRecord>) {
        let mut comms = self.lock();
        comms.retain(|w| w.strong_count() > 0);
        comms.push(Arc::downgrade(record));
    }

    /// Records still alive.
    pub fn len(&self) -> usize {
        self.lock().iter().filter(|w| w.strong_count() > 0).count()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Snapshots of every live record, ordered by (communicator, rank) as NCCL orders its local data. The lock is
    /// held only to take strong references, never while reading counters.
    pub fn snapshot_all(&self) -> Vec<RankRecord> {
        let live: Vec<Arc<CommRecord>> = self.lock().iter().filter_map(Weak::upgrade).collect();
        let mut out: Vec<RankRecord> = live.iter().map(|c| c.snapshot()).collect();
        out.sort_by_key(|r| (r.info.comm, r.info.rank));
        out
    }
}
