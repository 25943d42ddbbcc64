//! Profiler events: each communicator owns a fan-out (`occl_events::Fanout`) holding the sinks
//! that its profilers created for it (`Config::profilers`: those handed in, or the process's
//! default set, `occl_telemetry::exporters::process_profilers`), plus any attached with
//! `Comm::attach_sink`.
//!
//! An operation captures the mask once when it starts (`OpProf::begin`); with no sink that wants
//! anything that is one relaxed load and a branch, and nothing else on the collective path
//! touches the profiler. With events on, the operation emits NCCL's hierarchy (see `op.rs`).

pub(crate) mod group;
pub(crate) mod op;

use crate::config::Profilers;
use occl_events::{CommInfo, Fanout, Profiler, Sink, SinkHandle};
use std::sync::{Arc, Mutex, PoisonError};

pub(crate) use op::{Leg, OpProf, Steps};

/// The profiling state of one communicator.
pub(crate) struct Profiling {
    pub fanout: Arc<Fanout>,
    /// Sinks attached here, finalized when the communicator goes away.
    sinks: Mutex<Vec<(SinkHandle, Arc<dyn Sink>)>>,
}

impl Profiling {
    /// Asks each of `profilers` for this communicator's sink. A profiler that declines (`None`)
    /// is simply not attached.
    pub(crate) fn init(info: &CommInfo<'_>, profilers: &Profilers) -> Profiling {
        if let Err(e) = occl_events::activation::init_from_env() {
            tracing::warn!("occl: {e}; the profiler activation mask stays as it was");
        }
        let p = Profiling { fanout: Arc::new(Fanout::new()), sinks: Mutex::new(Vec::new()) };
        let profilers: Vec<Arc<dyn Profiler>> = match profilers {
            Profilers::Process => occl_telemetry::exporters::process_profilers(),
            Profilers::Given(v) => v.clone(),
        };
        for prof in profilers {
            match prof.init(info) {
                Some(sink) => {
                    if let Err(e) = p.attach(sink) {
                        tracing::warn!("occl: profiler {}: {e}; its events are dropped", prof.name());
                    }
                }
                None => tracing::debug!("occl: profiler {} declined comm {:016x}", prof.name(), info.comm_hash),
            }
        }
        p
    }

    pub(crate) fn attach(&self, sink: Arc<dyn Sink>) -> Result<SinkHandle, occl_events::TooManySinks> {
        let h = self.fanout.attach(sink.clone())?;
        let copy = SinkHandle::clone(&h);
        self.sinks.lock().unwrap_or_else(PoisonError::into_inner).push((copy, sink));
        Ok(h)
    }

    /// Detaches a sink attached here; it is finalized. `false` if the handle is not ours.
    pub(crate) fn detach(&self, h: SinkHandle) -> bool {
        let mut sinks = self.sinks.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(i) = sinks.iter().position(|(x, _)| *x == h) else { return false };
        let (h, sink) = sinks.swap_remove(i);
        drop(sinks);
        self.fanout.detach(h);
        sink.finalize();
        true
    }

    /// NCCL's `finalize` for every sink, once, when the communicator is destroyed.
    pub(crate) fn finalize(&self) {
        let sinks = std::mem::take(&mut *self.sinks.lock().unwrap_or_else(PoisonError::into_inner));
        for (h, sink) in sinks {
            self.fanout.detach(h);
            sink.finalize();
        }
    }
}
