//! The five callbacks in safe Rust, shared by every API version: the `abi` modules read NCCL's
//! arguments (the only `unsafe` part) and call these.
//!
//! `init` never fails: without a backend, or when the profiler declines a communicator, the
//! context is NULL (every later call with it does nothing) and the reason is logged once. The
//! first live communicator starts the `/metrics` server and the last one's `finalize` stops it
//! and flushes the exporters, because NCCL may unload the library right after.

use crate::backend::{self, Backend};
use crate::comms;
use crate::labels::Labels;
use crate::metrics::{self, MetricsServer, Render};
use crate::nccl_log;
use crate::stats::{self, Reason};
use occl_telemetry::nccl::decode::{DecodeError, Decoded};
use occl_telemetry::nccl::ApiVersion;
use occl_telemetry::{CommInfo, EventDescr, EventId, EventMask, StateArgs};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

/// What `init` gives back to NCCL.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Init {
    /// `*context` (0: NULL).
    pub context: usize,
    /// `*eActivationMask`: what every live communicator's sink wants, in the version's types.
    pub mask: EventMask,
}

static NO_BACKEND: AtomicBool = AtomicBool::new(false);
static DECLINED: AtomicBool = AtomicBool::new(false);
static FULL: AtomicBool = AtomicBool::new(false);

pub fn init(version: ApiVersion, info: &CommInfo<'_>) -> Init {
    let known = version.known_types();
    let none = || Init { context: 0, mask: comms::interest() & known };
    let Some(backend) = backend::choose() else {
        nccl_log::warn_once(
            &NO_BACKEND,
            "occl profiler plugin: no exporter is enabled (Prometheus, OTLP or trace files; see occl-telemetry's \
             documentation), so events are not collected; NCCL runs as without a plugin",
        );
        return none();
    };
    let Some(sink) = backend.profiler.init(info) else {
        nccl_log::warn_once(
            &DECLINED,
            &format!(
                "occl profiler plugin: profiler {:?} declined a communicator; its events are dropped",
                backend.profiler.name()
            ),
        );
        return none();
    };
    // NCCL sends every step: a sink that wants step sums gets them as ProxySteps.
    let interest = sink.interest().steps_as_events() & known;
    let Some(comm) = comms::add(version, sink.clone(), interest, info.comm_hash, info.rank) else {
        sink.finalize();
        nccl_log::warn_once(
            &FULL,
            &format!(
                "occl profiler plugin: more than {} communicators at once; later ones are not profiled",
                comms::MAX_COMMS
            ),
        );
        return none();
    };
    opened(&backend);
    let mask = comms::interest() & known;
    nccl_log::info(&format!(
        "occl profiler plugin (API {version}): communicator {:#018x} rank {}/{}, {} node(s): event mask {:#x}",
        info.comm_hash, info.rank, info.nranks, info.n_nodes, mask.0
    ));
    Init { context: comm.context(), mask }
}

/// `startEvent`: the handle for NCCL (0: NULL, the event is dropped). `decode` reads the
/// descriptor, resolving handles with the function it is given.
pub fn start<'a>(
    context: usize,
    decode: impl FnOnce(&dyn Fn(usize) -> Option<EventId>) -> Result<Decoded<'a>, DecodeError>,
) -> usize {
    if context == 0 {
        return 0;
    }
    let handle = comms::with_context(context, |c| {
        let d = match decode(&|h| c.own(h)) {
            Ok(d) => d,
            Err(e) => {
                tracing::debug!(target: "occl_profiler", "startEvent dropped: {e}");
                stats::count(Reason::BadDescriptor);
                return 0;
            }
        };
        // Under PXN another process's proxy op arrives with its context and parent (reference
        // §10): neither names anything here.
        if let EventDescr::ProxyOp { pid, .. } = d.descr {
            if pid != 0 && pid as u32 != std::process::id() {
                stats::count(Reason::ForeignProcess);
                return 0;
            }
        }
        let id = c.issue();
        match (&d.descr, d.parent) {
            (EventDescr::Coll { .. } | EventDescr::P2p { .. }, _) => c.flight.op_started(id.get(), Instant::now()),
            (EventDescr::ProxyOp { .. } | EventDescr::KernelCh { .. }, Some(p)) => {
                c.flight.child_started(id.get(), p.get())
            }
            _ => {}
        }
        c.sink.start(id, d.parent, &d.descr);
        id.get() as usize
    });
    handle.unwrap_or_else(|| {
        stats::count(Reason::UnknownHandle);
        0
    })
}

/// `recordEventState`.
pub fn state<'a>(handle: usize, decode: impl FnOnce() -> Result<StateArgs<'a>, DecodeError>) {
    if handle == 0 {
        return;
    }
    let known = comms::with(handle, |c| {
        let id = c.own(handle)?;
        match decode() {
            Ok(st) => c.sink.state(id, &st),
            Err(e) => {
                tracing::debug!(target: "occl_profiler", "recordEventState dropped: {e}");
                stats::count(Reason::BadState);
            }
        }
        Some(())
    });
    if known.flatten().is_none() {
        stats::count(Reason::UnknownHandle);
    }
}

/// `stopEvent`.
pub fn stop(handle: usize) {
    if handle == 0 {
        return;
    }
    let known = comms::with(handle, |c| {
        c.own(handle).map(|id| {
            c.sink.stop(id);
            c.flight.stopped(id.get());
        })
    });
    if known.flatten().is_none() {
        stats::count(Reason::UnknownHandle);
    }
}

/// `finalize`.
pub fn finalize(context: usize) {
    if context == 0 {
        return;
    }
    match comms::remove(context) {
        Some(c) => {
            c.sink.finalize();
            drop(c);
            closed();
        }
        None => stats::count(Reason::UnknownHandle),
    }
}

/// What lives while any communicator does.
struct Life {
    live: usize,
    server: Option<MetricsServer>,
    flush: Option<Arc<dyn Fn() + Send + Sync>>,
}

static LIFE: Mutex<Life> = Mutex::new(Life { live: 0, server: None, flush: None });

fn opened(backend: &Backend) {
    let mut l = LIFE.lock().unwrap_or_else(PoisonError::into_inner);
    l.live += 1;
    if l.live > 1 {
        return;
    }
    l.flush = backend.flush.clone();
    if let Some(render) = &backend.render {
        l.server = serve(render.clone());
    }
}

fn closed() {
    let (server, flush) = {
        let mut l = LIFE.lock().unwrap_or_else(PoisonError::into_inner);
        l.live = l.live.saturating_sub(1);
        if l.live > 0 {
            return;
        }
        (l.server.take(), l.flush.take())
    };
    drop(server);
    if let Some(f) = flush {
        f();
    }
}

/// Starts the `/metrics` server where the environment says; a failure is logged, never fatal.
/// Every series it serves carries this process's [`Labels`].
fn serve(render: Render) -> Option<MetricsServer> {
    let addr = match metrics::addr_from_env() {
        Ok(Some(a)) => a,
        Ok(None) => return None,
        Err(e) => {
            nccl_log::warn(&format!("occl profiler plugin: no /metrics: {e}"));
            return None;
        }
    };
    let labels = Labels::from_env();
    let text: Render = Arc::new(move || {
        let mut s = render();
        stats::render(&mut s);
        labels.apply(&s)
    });
    match MetricsServer::start(addr, text) {
        Ok(s) => {
            nccl_log::info(&format!("occl profiler plugin: serving /metrics on http://{}", s.local_addr()));
            Some(s)
        }
        Err(e) => {
            nccl_log::warn(&format!(
                "occl profiler plugin: cannot listen on {addr} for /metrics ({e}); carrying on without it \
                 (set {} to another address, or to off)",
                metrics::ADDR_ENV
            ));
            None
        }
    }
}
