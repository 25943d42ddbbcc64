//! The device's event clock on the host's, one per CUDA context and shared by every
//! communicator of it that times copy-engine calls (`spans.rs`): one anchor stream and one
//! measurement a second for the process's GPU, however many communicators (process groups) it
//! holds, and a drift measured since the first of them was made.
//!
//! The anchor (`occl_kernels::stamps::Anchor`) is measured as the first communicator of the
//! context is made, waiting up to [`FIRST_PATIENCE`], and again about once a second while calls
//! are timed, for at most [`PATIENCE`], by the watcher thread as it looks at the calls
//! (`calls.rs`). The enqueue path and the collection only read the last measurement, which a
//! renewal publishes once it is done, so no caller's thread waits for the device; only when no
//! measurement has been tried for [`STRANDED`] (no watcher thread) does a caller measure.

use crate::cuda::kernels::cudarc::driver::CudaContext;
use crate::cuda::kernels::staging::RelaxedCapture;
use crate::cuda::kernels::stamps::{Anchor, AnchorTime, Reading, Stamp};
use crate::cuda::kernels::Result;
use crate::sync::lock;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Mutex, TryLockError, Weak};
use std::time::Duration;

/// How long the anchor's first measurement, as the first communicator is made, waits for its
/// stamp.
const FIRST_PATIENCE: Duration = Duration::from_millis(20);
/// How long a later one does.
const PATIENCE: Duration = Duration::from_micros(200);
/// Measurements a renewal takes, keeping the tightest: measured on the watcher's thread while
/// the callers' threads enqueue, one bracket came out about twice as wide as the first
/// anchor's (2×H200).
const TRIES: u32 = 4;
/// How long without a measurement tried before a timed call's own thread measures: the watcher
/// renews every second while calls are timed, so only a process without its thread gets here.
const STRANDED: Duration = Duration::from_secs(5);

/// One context's event clock.
pub(crate) struct DeviceClock {
    ctx: Arc<CudaContext>,
    /// `None` when its stream could not be made (logged): every call goes untimed. Held only
    /// while measuring.
    anchor: Mutex<Option<Anchor>>,
    /// The last measurement: what stamps are placed by. Never held across a device wait.
    reading: Mutex<Option<Reading>>,
    /// A call asked to be timed since the last renewal.
    wanted: AtomicBool,
}

/// The clocks alive, one per context.
static CLOCKS: Mutex<Vec<Weak<DeviceClock>>> = Mutex::new(Vec::new());

impl DeviceClock {
    /// The clock of `ctx`: the one its communicators already share, or a new one, measured now.
    pub(crate) fn of(ctx: &Arc<CudaContext>) -> Arc<DeviceClock> {
        let mut all = lock(&CLOCKS);
        all.retain(|w| w.strong_count() > 0);
        if let Some(c) = all.iter().filter_map(Weak::upgrade).find(|c| *c.ctx == **ctx) {
            return c;
        }
        let anchor = Anchor::new(ctx, &occl_events::unix_nanos, FIRST_PATIENCE, TRIES)
            .inspect_err(|e| tracing::warn!("occl: no device times for copy-engine calls: {e}"))
            .ok();
        let reading = anchor.as_ref().and_then(Anchor::reading);
        if let Some(r) = &reading {
            tracing::debug!("occl: device event clock anchored ± {} ns", r.time().err_ns);
        }
        let c = Arc::new(DeviceClock {
            ctx: ctx.clone(),
            anchor: Mutex::new(anchor),
            reading: Mutex::new(reading),
            wanted: AtomicBool::new(false),
        });
        all.push(Arc::downgrade(&c));
        c
    }

    /// Whether stamps can be placed on the host clock now; notes that calls are being timed,
    /// so that the watcher keeps the anchor fresh.
    pub(crate) fn ready(&self) -> bool {
        self.wanted.store(true, Relaxed);
        // Never waits: a measurement in progress holds the lock.
        let stranded = match self.anchor.try_lock() {
            Ok(mut g) => g.as_mut().filter(|a| a.untried_for(STRANDED)).map(|a| self.measure(a, 1)).is_some(),
            Err(TryLockError::Poisoned(_) | TryLockError::WouldBlock) => false,
        };
        if stranded {
            tracing::debug!("occl: the device event clock was measured on the enqueue path (no watcher renewing it)");
        }
        lock(&self.reading).is_some()
    }

    /// Measures the anchor again when calls have been timed since it last was and it is due
    /// (the watcher's thread, as it looks at the calls).
    pub(crate) fn renew_if_due(&self) {
        if !self.wanted.load(Relaxed) {
            return;
        }
        let mut g = lock(&self.anchor);
        if let Some(a) = g.as_mut().filter(|a| a.stale()) {
            self.wanted.store(false, Relaxed);
            self.measure(a, TRIES);
        }
    }

    /// A measurement of `tries`, published when it succeeds; a failure keeps the last one
    /// (logged). The caller's capture mode is relaxed, so that the queries do not break a graph
    /// the thread captures on another stream.
    fn measure(&self, a: &mut Anchor, tries: u32) {
        match RelaxedCapture::new().and_then(|_relaxed| a.renew(&occl_events::unix_nanos, PATIENCE, tries)) {
            Ok(true) => *lock(&self.reading) = a.reading(),
            Ok(false) => {
                tracing::debug!("occl: the device event clock's anchor took over {PATIENCE:?}; kept the last one")
            }
            Err(e) => tracing::debug!("occl: the device event clock's anchor: {e}; kept the last one"),
        }
    }

    /// The anchor's last measurement.
    pub(crate) fn reading(&self) -> Option<Reading> {
        lock(&self.reading).clone()
    }

    /// The anchor's last measurement's time.
    pub(crate) fn time(&self) -> Option<AnchorTime> {
        lock(&self.reading).as_ref().map(Reading::time)
    }
}

/// Two complete stamps on the host clock by `reading`; `None` before any measurement.
pub(crate) fn host_ns(reading: Option<&Reading>, start: &Stamp, end: &Stamp) -> Result<Option<(u64, u64)>> {
    match reading {
        Some(r) => Ok(Some((r.host_ns(start)?, r.host_ns(end)?))),
        None => Ok(None),
    }
}
