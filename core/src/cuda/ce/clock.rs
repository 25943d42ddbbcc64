//! The device's event clock on the host's, one per CUDA context and shared by every
//! communicator of it that times copy-engine calls (`spans.rs`): one anchor stream and one
//! measurement a second for the process's GPU, however many communicators (process groups) it
//! holds, and a drift measured since the first of them was made.
//!
//! The anchor (`occl_kernels::stamps::Anchor`) is measured as the first communicator of the
//! context is made, waiting up to [`FIRST_PATIENCE`], and again about once a second as calls
//! are timed, for at most [`PATIENCE`], with this thread's capture mode relaxed so that its
//! query does not break a graph the thread captures on another stream.

use crate::cuda::kernels::cudarc::driver::CudaContext;
use crate::cuda::kernels::staging::RelaxedCapture;
use crate::cuda::kernels::stamps::{Anchor, AnchorTime, Stamp};
use crate::cuda::kernels::Result;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

/// How long the anchor's first measurement, as the first communicator is made, waits for its
/// stamp.
const FIRST_PATIENCE: Duration = Duration::from_millis(20);
/// How long a later one does, on the enqueue path.
const PATIENCE: Duration = Duration::from_micros(200);

/// One context's event clock.
pub(crate) struct DeviceClock {
    ctx: Arc<CudaContext>,
    /// `None` when its stream could not be made (logged): every call goes untimed.
    anchor: Mutex<Option<Anchor>>,
}

/// The clocks alive, one per context.
static CLOCKS: Mutex<Vec<Weak<DeviceClock>>> = Mutex::new(Vec::new());

impl DeviceClock {
    /// The clock of `ctx`: the one its communicators already share, or a new one, measured now.
    pub(crate) fn of(ctx: &Arc<CudaContext>) -> Arc<DeviceClock> {
        let mut all = CLOCKS.lock().unwrap_or_else(|p| p.into_inner());
        all.retain(|w| w.strong_count() > 0);
        if let Some(c) = all.iter().filter_map(Weak::upgrade).find(|c| *c.ctx == **ctx) {
            return c;
        }
        let anchor = Anchor::new(ctx, &occl_events::unix_nanos, FIRST_PATIENCE)
            .inspect_err(|e| tracing::warn!("occl: no device times for copy-engine calls: {e}"))
            .ok();
        if let Some(t) = anchor.as_ref().and_then(Anchor::time) {
            tracing::debug!("occl: device event clock anchored ± {} ns", t.err_ns);
        }
        let c = Arc::new(DeviceClock { ctx: ctx.clone(), anchor: Mutex::new(anchor) });
        all.push(Arc::downgrade(&c));
        c
    }

    fn lock(&self) -> MutexGuard<'_, Option<Anchor>> {
        self.anchor.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether stamps can be placed on the host clock now, measuring the anchor again first
    /// when it is due (a failure keeps the last measurement, logged).
    pub(crate) fn ready(&self) -> bool {
        let mut g = self.lock();
        if let Some(a) = g.as_mut().filter(|a| a.stale()) {
            let renewed = RelaxedCapture::new().and_then(|_relaxed| a.renew(&occl_events::unix_nanos, PATIENCE));
            match renewed {
                Ok(true) => {}
                Ok(false) => {
                    tracing::debug!("occl: the device event clock's anchor took over {PATIENCE:?}; kept the last one")
                }
                Err(e) => tracing::debug!("occl: the device event clock's anchor: {e}; kept the last one"),
            }
        }
        g.as_ref().and_then(Anchor::time).is_some()
    }

    /// The anchor's last measurement.
    pub(crate) fn time(&self) -> Option<AnchorTime> {
        self.lock().as_ref().and_then(Anchor::time)
    }

    /// Two complete stamps of this context on the host clock; `None` before any measurement.
    pub(crate) fn host_ns(&self, start: &Stamp, end: &Stamp) -> Result<Option<(u64, u64)>> {
        match self.lock().as_ref() {
            Some(a) => Ok(a.host_ns(start)?.zip(a.host_ns(end)?)),
            None => Ok(None),
        }
    }
}
