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

/// Appends this process's own metrics (Prometheus text exposition) to the string: occl passes one that renders its
/// telemetry, so that any process of the node can answer a scrape for all of them.
pub type MetricsProvider = Arc<dyn Fn(&mut String) + Send + Sync>;

/// What this process reports to RAS: every rank record, and its metrics. It holds weak references to the records: a
/// communicator that is dropped disappears from reports without having to unregister (NCCL likewise stops reporting
/// a destroyed comm).
#[derive(Default)]
pub struct ProcessRecords {
    comms: Mutex<Vec<Weak<CommRecord>>>,
    metrics: Mutex<Option<MetricsProvider>>,
}

impl std::fmt::Debug for ProcessRecords {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let metrics = self.metrics.lock().map(|m| m.is_some()).unwrap_or(false);
        f.debug_struct("ProcessRecords").field("records", &self.len()).field("metrics", &metrics).finish()
    }
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

    /// Sets what renders this process's metrics (replacing any earlier one).
    pub fn set_metrics_provider(&self, p: MetricsProvider) {
        *self.metrics.lock().unwrap_or_else(|e| e.into_inner()) = Some(p);
    }

    /// Appends this process's metrics to `out` (nothing without a provider). The provider runs without the lock held.
    pub fn render_metrics(&self, out: &mut String) {
        let p = self.metrics.lock().unwrap_or_else(|e| e.into_inner()).clone();
        if let Some(p) = p {
            p(out);
        }
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
