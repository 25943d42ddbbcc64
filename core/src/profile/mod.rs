//! Profiler events: each communicator owns a fan-out (`occl_events::Fanout`) holding the sinks
//! that its profilers created for it (`Config::profilers`: those handed in, or the process's
//! default set, `occl_telemetry::exporters::process_profilers`), plus any attached with
//! `Comm::attach_sink`.
//!
//! An operation captures the mask once when it starts (`OpProf::begin`); with no sink that wants
//! anything that is one relaxed load and a branch, and nothing else on the collective path
//! touches the profiler. With events on, the operation emits NCCL's hierarchy (see `op.rs`).
//!
//! Prometheus metrics take one of two routes per communicator rank, chosen when its sinks are
//! made (`Profiling::attach_profilers`):
//! - **direct** (every peer over shm, the process's profilers, the process's exporter on): the
//!   rank holds a `RankMetrics` of the process's exporter in the state its operation lock
//!   guards (`comm::Inner`), and the executor bumps it at each
//!   operation's end (`exec`): op, algorithm, protocol and datatype series with the start and
//!   end times the rank record and flight recorder already take, and the steps and bytes the
//!   primitives counted in a `Tally` (`tally.rs`: plain adds, no clock). Grouped calls,
//!   send/recv and failures too. The exporter declines the rank's spans, so no event is made for
//!   it. Step wait times are those of the waits that blocked: the transport reads the clock only
//!   once a wait's first look fails and adds the time to the tally by state
//!   (`transport::fifo::Timed`; the group launch's progress loop likewise, from its first round
//!   that moves nothing).
//! - **spans** (a peer over tcp or ib, profilers handed in, a device communicator): the
//!   exporter is one of the collector's and counts from events, as `occl_telemetry::prometheus`
//!   describes (step waits, socket bytes, KernelCh times included).

pub(crate) mod group;
pub(crate) mod op;
mod running;
pub(crate) mod tally;

use crate::config::Profilers;
use crate::sync::lock;
use occl_events::{CommInfo, Fanout, Profiler, Sink, SinkHandle};
use occl_telemetry::prometheus::RankMetrics;
use occl_telemetry::spans::CommMeta;
use std::sync::{Arc, Mutex};

pub(crate) use op::{Leg, OpProf, Steps};
pub(crate) use tally::Tally;

/// The profiling state of one communicator.
pub(crate) struct Profiling {
    pub fanout: Arc<Fanout>,
    /// Sinks attached here, finalized when the communicator goes away.
    sinks: Mutex<Vec<(SinkHandle, Arc<dyn Sink>)>>,
    /// The rank as the exporter knows it, while its metrics take the direct route (see the
    /// module docs; the `RankMetrics` itself lives in `comm::Inner`).
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    meta: Option<CommMeta>,
}

impl Profiling {
    /// A fan-out with no sink yet ([`Profiling::attach_profilers`] adds them).
    pub(crate) fn new() -> Profiling {
        if let Err(e) = occl_events::activation::init_from_env() {
            tracing::warn!("occl: {e}; the profiler activation mask stays as it was");
        }
        Profiling { fanout: Arc::new(Fanout::new()), sinks: Mutex::new(Vec::new()), meta: None }
    }

    /// Chooses the rank's metrics route (direct when `all_shm` and the process's profilers are
    /// used: the `RankMetrics` returned), then asks each of `profilers` for this communicator's
    /// sink. A profiler that declines (`None`) is simply not attached.
    pub(crate) fn attach_profilers(
        &mut self,
        info: &CommInfo<'_>,
        profilers: &Profilers,
        all_shm: bool,
    ) -> Option<RankMetrics<'static>> {
        let mut metrics = None;
        if all_shm && matches!(profilers, Profilers::Process) {
            let m = meta(info);
            metrics = occl_telemetry::prometheus::process().and_then(|e| e.rank(&m));
            self.meta = metrics.is_some().then_some(m);
        }
        let p = &*self;
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
        metrics
    }

    /// Moves this rank's metrics from the direct route (`direct`, taken) to the span route (a
    /// device communicator: its operations are timed by their kernels' events). The series keep
    /// their counts.
    #[cfg(feature = "cuda")]
    pub(crate) fn metrics_to_spans(&mut self, direct: &mut Option<RankMetrics<'static>>) {
        let (Some(_), Some(m)) = (direct.take(), self.meta.take()) else { return };
        let Some(e) = occl_telemetry::prometheus::process() else { return };
        let t = occl_telemetry::spans::Telemetry::new(vec![Arc::clone(e) as Arc<dyn occl_telemetry::spans::Exporter>]);
        let hash = m.hash;
        if let Err(err) = self.attach(t.comm_sink(m)) {
            tracing::warn!("occl: Prometheus metrics of comm {hash:016x}: {err}; its events are dropped");
        }
    }

    pub(crate) fn attach(&self, sink: Arc<dyn Sink>) -> Result<SinkHandle, occl_events::TooManySinks> {
        let h = self.fanout.attach(sink.clone())?;
        let copy = SinkHandle::clone(&h);
        lock(&self.sinks).push((copy, sink));
        Ok(h)
    }

    /// Detaches a sink attached here; it is finalized. `false` if the handle is not ours.
    pub(crate) fn detach(&self, h: SinkHandle) -> bool {
        let mut sinks = lock(&self.sinks);
        let Some(i) = sinks.iter().position(|(x, _)| *x == h) else { return false };
        let (h, sink) = sinks.swap_remove(i);
        drop(sinks);
        self.fanout.detach(h);
        sink.finalize();
        true
    }

    /// NCCL's `finalize` for every sink, once, when the communicator is destroyed.
    pub(crate) fn finalize(&self) {
        let sinks = std::mem::take(&mut *lock(&self.sinks));
        for (h, sink) in sinks {
            self.fanout.detach(h);
            sink.finalize();
        }
    }
}

/// The exporter's description of a communicator rank, as the span collector makes it.
fn meta(c: &CommInfo<'_>) -> CommMeta {
    CommMeta {
        name: c.comm_name.map(str::to_owned),
        hash: c.comm_hash,
        rank: c.rank,
        nranks: c.nranks,
        n_nodes: c.n_nodes,
    }
}
