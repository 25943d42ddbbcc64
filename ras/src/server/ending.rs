//! How a job's end reads on the node's RAS port, so that an alert tells a crash from a normal end after the port
//! has closed. `occl_ras_job_running` is 1 while the process that answers runs its job, and 0 once it is ending
//! without a failed communicator (its last communicator left, or it exits). A process that owns the port and has
//! been scraped by Prometheus waits at exit, bounded, for one more scrape, so that Prometheus's last value of a normal end is 0
//! (the bound lets one scrape be missed: Prometheus on a loaded node scrapes late, and a scrape answered after its
//! timeout is dropped there, so it is not counted here);
//! a process whose communicator failed does not wait, and its last value stays 1. The rule: the target is gone and
//! the series' last value is 1.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::*};
use std::time::{Duration, Instant};

use occl_ras_proto::record::ProcessRecords;

/// The series name.
pub(crate) const SERIES: &str = "occl_ras_job_running";

/// Added to two scrape intervals (one may be missed) when waiting at exit for a scrape to see the end.
const MARGIN: Duration = Duration::from_secs(1);

#[derive(Debug, Default)]
pub(crate) struct Ending {
    /// A communicator of this process failed (seen when the last one left, or at exit).
    failed: AtomicBool,
    /// The process is ending without a failure: the series says 0.
    ended: AtomicBool,
    /// Scrapes served, and those that said 0.
    scrapes: AtomicU64,
    scrapes_ended: AtomicU64,
    /// When the last two scrapes were served (ns since `epoch`), 0: not yet.
    last_ns: AtomicU64,
    interval_ns: AtomicU64,
    epoch: std::sync::OnceLock<Instant>,
}

impl Ending {
    fn now_ns(&self) -> u64 {
        let epoch = *self.epoch.get_or_init(Instant::now);
        u64::try_from(epoch.elapsed().as_nanos()).unwrap_or(u64::MAX).max(1)
    }

    /// Latches a failure of any communicator whose record is still registered.
    fn note_failures(&self, records: &ProcessRecords) {
        if records.snapshot_all().iter().any(|r| r.live.failed > 0 || r.live.abort_flag) {
            self.failed.store(true, SeqCst);
        }
    }

    /// The last communicator left: unless one failed, the job has ended here.
    pub(crate) fn left(&self, records: &ProcessRecords) {
        self.note_failures(records);
        if !self.failed.load(SeqCst) {
            self.ended.store(true, SeqCst);
        }
    }

    /// The series, as this process would serve it now.
    pub(crate) fn render(&self, out: &mut String) {
        let running = u8::from(!self.ended.load(SeqCst));
        out.push_str(&format!(
            "# HELP {SERIES} 1 while the job runs in the process answering (or after its communicator failed), 0 once \
             it ends without a failure; the last value before the port closes tells a crash from a normal end.\n\
             # TYPE {SERIES} gauge\n{SERIES} {running}\n"
        ));
    }

    /// Prometheus's scrape of `/metrics` was answered (after [`Ending::render`]) within its timeout, so Prometheus
    /// keeps what it said; one that said the job ended is counted once its connection has written it and closed.
    pub(crate) fn scraped(&self, said_ended: bool) {
        let now = self.now_ns();
        let last = self.last_ns.swap(now, SeqCst);
        if last != 0 {
            self.interval_ns.store(now - last, SeqCst);
        }
        self.scrapes.fetch_add(1, SeqCst);
        if said_ended {
            self.scrapes_ended.fetch_add(1, SeqCst);
        }
    }

    pub(crate) fn is_ended(&self) -> bool {
        self.ended.load(SeqCst)
    }

    /// At exit: unless a communicator failed, the job has ended here; if this process owns the port and has been
    /// scraped, waits until a scrape has said so: at most two of the scrape intervals seen so far (one scrape may be
    /// missed) plus a second, and never more than `cap`. Returns how long it waited.
    pub(crate) fn exit(&self, records: &ProcessRecords, owner: bool, cap: Duration) -> Duration {
        let t = Instant::now();
        self.left(records);
        if !self.ended.load(SeqCst) || !owner || self.scrapes.load(SeqCst) == 0 || cap.is_zero() {
            return Duration::ZERO;
        }
        let interval = match self.interval_ns.load(SeqCst) {
            0 => cap,
            ns => Duration::from_nanos(ns) * 2 + MARGIN,
        };
        let limit = interval.min(cap);
        while self.scrapes_ended.load(SeqCst) == 0 && t.elapsed() < limit {
            std::thread::sleep(Duration::from_millis(20));
        }
        t.elapsed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_clean_end_says_0_and_waits_for_a_scrape_only_when_scraped_and_owning_the_port() {
        let records = ProcessRecords::new();
        let e = Ending::default();
        let mut out = String::new();
        e.render(&mut out);
        assert!(out.ends_with("occl_ras_job_running 1\n"), "{out}");
        // Never scraped, or not the owner: no wait.
        assert_eq!(e.exit(&records, true, Duration::from_secs(5)), Duration::ZERO);
        assert!(e.is_ended());
        let e = Ending::default();
        e.scraped(false);
        assert_eq!(e.exit(&records, false, Duration::from_secs(5)), Duration::ZERO);
        // Scraped twice 50 ms apart: waits two intervals plus the margin (here the cap), unless a scrape says 0 first.
        let e = Ending::default();
        e.scraped(false);
        std::thread::sleep(Duration::from_millis(50));
        e.scraped(false);
        let waited = e.exit(&records, true, Duration::from_millis(300));
        assert!(waited >= Duration::from_millis(290) && waited < Duration::from_secs(2), "{waited:?}");
        let mut out = String::new();
        e.render(&mut out);
        assert!(out.ends_with("occl_ras_job_running 0\n"), "{out}");
        e.scraped(true);
        assert!(e.exit(&records, true, Duration::from_secs(5)) < Duration::from_millis(100));
    }
}
