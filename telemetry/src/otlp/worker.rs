//! The export thread: drains the queue, decides traces ([`Resolver`]), and sends a batch when it
//! is full, when the schedule delay passed, or when a flush asks; retries with bounded backoff.
//!
//! It parks between rounds, so producers never pay for waking it except when the queue reaches a
//! batch (one `unpark`). A collector that is down costs one failed connect per batch: after a
//! batch failed every attempt, later batches get a single attempt until one succeeds, so the
//! queue keeps draining (into the drop count) instead of backing up behind retries.

use super::config::{OtlpConfig, Protocol};
use super::model::{self, OutSpan};
use super::record::Rec;
use super::resolve::{Resolved, Resolver};
use super::resource::{self, Resource};
use super::transport::Client;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::mpsc::{Receiver, TryRecvError};
use std::sync::{Condvar, Mutex, OnceLock, PoisonError};
use std::thread::Thread;
use std::time::{Duration, Instant};

/// How long spans wait for their tree's Coll/P2p before their tree gets a trace of its own: longer
/// than any sane collective (the CollApi of an occl operation waits for the whole operation).
const HOLD: Duration = Duration::from_secs(30);
/// Attempts per batch while the collector answers; one after a batch failed them all.
const ATTEMPTS: u32 = 5;
const FIRST_BACKOFF: Duration = Duration::from_millis(100);
/// At most one warning per this long about failed exports.
const WARN_EVERY: Duration = Duration::from_secs(30);

/// Counters, shared with the exporter (render_metrics, the finalize log line).
#[derive(Default)]
pub struct Stats {
    pub exported: AtomicU64,
    pub dropped_queue_full: AtomicU64,
    pub dropped_export_failed: AtomicU64,
    pub requests_ok: AtomicU64,
    pub requests_failed: AtomicU64,
}

/// What the exporter and its thread share.
#[derive(Default)]
pub struct Shared {
    pub stats: Stats,
    /// Spans queued and not yet taken by the thread.
    pub queued: AtomicUsize,
    /// The job id of `service.instance.id` (the launcher's, else the first communicator's hash).
    pub job: OnceLock<String>,
    pub thread: OnceLock<Thread>,
    /// Flush tickets: (requested, done).
    flush: Mutex<(u64, u64)>,
    flushed: Condvar,
}

impl Shared {
    pub fn wake(&self) {
        if let Some(t) = self.thread.get() {
            t.unpark();
        }
    }

    /// Asks the thread to export everything queued so far and waits up to `limit`; `false` if it
    /// did not finish in time (the thread goes on; nothing here blocks longer).
    pub fn flush(&self, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        let mut g = self.flush.lock().unwrap_or_else(PoisonError::into_inner);
        g.0 += 1;
        let ticket = g.0;
        self.wake();
        while g.1 < ticket {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            g = self.flushed.wait_timeout(g, left).unwrap_or_else(PoisonError::into_inner).0;
        }
        true
    }

    pub(super) fn flush_requested(&self) -> u64 {
        self.flush.lock().unwrap_or_else(PoisonError::into_inner).0
    }

    pub(super) fn flush_done(&self, ticket: u64) {
        let mut g = self.flush.lock().unwrap_or_else(PoisonError::into_inner);
        g.1 = g.1.max(ticket);
        self.flushed.notify_all();
    }
}

struct Worker {
    cfg: OtlpConfig,
    sh: std::sync::Arc<Shared>,
    client: Client,
    track_steps: bool,
    host: String,
    resources: HashMap<i64, Resource>,
    /// The last batch failed every attempt.
    degraded: bool,
    last_warn: Option<Instant>,
}

/// The thread's body; returns when every sender is gone (after a last flush).
pub fn run(cfg: OtlpConfig, client: Client, rx: Receiver<Rec>, sh: std::sync::Arc<Shared>) {
    let track_steps = cfg.step_sampling > 0.0;
    let mut resolver = Resolver::new(HOLD, cfg.max_queue, track_steps);
    let mut w = Worker {
        cfg,
        sh,
        client,
        track_steps,
        host: resource::host_name(),
        resources: HashMap::new(),
        degraded: false,
        last_warn: None,
    };
    let mut ready: Vec<Resolved> = Vec::new();
    let mut next_export = Instant::now() + w.cfg.schedule_delay;
    let mut flushed = 0u64;
    loop {
        let mut gone = false;
        let mut taken = 0usize;
        let now = Instant::now();
        loop {
            match rx.try_recv() {
                Ok(rec) => {
                    taken += 1;
                    resolver.push(rec, now, &mut ready);
                }
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => {
                    gone = true;
                    break;
                }
            }
        }
        let _ = w.sh.queued.fetch_update(Relaxed, Relaxed, |q| Some(q.saturating_sub(taken)));
        let ticket = w.sh.flush_requested();
        let flushing = gone || ticket > flushed;
        if flushing {
            resolver.drain(&mut ready);
        } else {
            resolver.expire(now, &mut ready);
        }
        let due = now >= next_export;
        while ready.len() >= w.cfg.max_batch || (!ready.is_empty() && (due || flushing)) {
            let n = ready.len().min(w.cfg.max_batch);
            let batch: Vec<Resolved> = ready.drain(..n).collect();
            w.export(&batch);
        }
        if due {
            next_export = Instant::now() + w.cfg.schedule_delay;
        }
        if flushing {
            flushed = ticket;
            w.sh.flush_done(ticket);
        }
        if gone {
            return;
        }
        let wake = resolver.next_expiry().map_or(next_export, |e| e.min(next_export));
        std::thread::park_timeout(wake.saturating_duration_since(Instant::now()));
    }
}

impl Worker {
    fn resource(&mut self, rank: i64) -> &Resource {
        let (cfg, host, job) = (&self.cfg, &self.host, self.sh.job.get().map_or("unknown", String::as_str));
        self.resources
            .entry(rank)
            .or_insert_with(|| resource::resource(&cfg.service_name, job, rank, host, &cfg.resource))
    }

    fn encode(&mut self, spans: &[OutSpan]) -> Vec<u8> {
        let mut by_rank: BTreeMap<i64, Vec<&OutSpan>> = BTreeMap::new();
        for s in spans {
            by_rank.entry(s.instance).or_default().push(s);
        }
        for &r in by_rank.keys() {
            self.resource(r);
        }
        let groups: Vec<(&Resource, Vec<&OutSpan>)> =
            by_rank.into_iter().filter_map(|(r, v)| self.resources.get(&r).map(|res| (res, v))).collect();
        let version = env!("CARGO_PKG_VERSION");
        match self.cfg.protocol {
            Protocol::HttpJson => super::json::request(&groups, version),
            _ => super::encode::request(&groups, version),
        }
    }

    fn export(&mut self, batch: &[Resolved]) {
        let spans: Vec<OutSpan> = batch.iter().map(|r| model::out_span(r, self.cfg.rank, self.track_steps)).collect();
        let n = spans.len() as u64;
        let body = self.encode(&spans);
        let stats = &self.sh.stats;
        let client = &mut self.client;
        let attempts = if self.degraded { 1 } else { ATTEMPTS };
        let last = match send_retrying(client, &body, self.cfg.timeout, attempts, stats) {
            Ok(()) => {
                stats.exported.fetch_add(n, Relaxed);
                if self.degraded {
                    tracing::info!("occl otlp: the collector at {} accepts spans again", self.cfg.endpoint);
                }
                self.degraded = false;
                return;
            }
            Err(last) => last,
        };
        stats.dropped_export_failed.fetch_add(n, Relaxed);
        self.degraded = true;
        if self.last_warn.is_none_or(|t| t.elapsed() >= WARN_EVERY) {
            self.last_warn = Some(Instant::now());
            tracing::warn!("occl otlp: export to {} failed ({last}); {n} spans dropped", self.cfg.endpoint);
        }
    }
}

/// Sends `body`, trying again after a retryable failure (honouring `Retry-After`, else with a
/// doubling backoff from [`FIRST_BACKOFF`]) up to `attempts` times within `timeout`; every
/// attempt counts in `stats`' requests. The last failure's message if none succeeded.
pub(super) fn send_retrying(
    client: &mut Client,
    body: &[u8],
    timeout: Duration,
    attempts: u32,
    stats: &Stats,
) -> Result<(), String> {
    let deadline = Instant::now() + timeout;
    let mut backoff = FIRST_BACKOFF;
    let mut last = format!("no attempt within {timeout:?}");
    for i in 1..=attempts {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        match client.send(body.to_vec(), left) {
            Ok(()) => {
                stats.requests_ok.fetch_add(1, Relaxed);
                return Ok(());
            }
            Err(f) => {
                stats.requests_failed.fetch_add(1, Relaxed);
                last = f.msg;
                if !f.retryable || i == attempts {
                    break;
                }
                std::thread::sleep(
                    f.retry_after.unwrap_or(backoff).min(deadline.saturating_duration_since(Instant::now())),
                );
                backoff = backoff.saturating_mul(2);
            }
        }
    }
    Err(last)
}
