//! What the plugin feeds: one process-wide profiler (a sink per communicator), the text its
//! `/metrics` serves, and what to flush when the last communicator goes. [`choose`] is the one
//! place that decides.

use crate::metrics::Render;
use occl_telemetry::exporters;
use occl_telemetry::spans::Telemetry;
use occl_telemetry::Profiler;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

/// The profiler behind the plugin, with its metrics and flush.
#[derive(Clone)]
pub struct Backend {
    pub profiler: Arc<dyn Profiler>,
    /// Prometheus text for `/metrics`; `None`: no metrics port.
    pub render: Option<Render>,
    /// Called when the last communicator is finalized (NCCL may unload the library next).
    pub flush: Option<Arc<dyn Fn() + Send + Sync>>,
}

impl Backend {
    /// A bare profiler: no metrics of its own, nothing to flush.
    pub fn new(profiler: Arc<dyn Profiler>) -> Backend {
        Backend { profiler, render: None, flush: None }
    }

    /// occl's span collector: its exporters' metrics, and their flush.
    pub fn telemetry(t: Arc<Telemetry>) -> Backend {
        let (r, f) = (t.clone(), t.clone());
        Backend {
            profiler: t,
            render: Some(Arc::new(move || {
                let mut s = String::new();
                r.render_metrics(&mut s);
                s
            })),
            flush: Some(Arc::new(move || f.flush())),
        }
    }
}

static INSTALLED: Mutex<Option<Backend>> = Mutex::new(None);

/// Test hook (Rust hosts that link the rlib): makes `backend` the one every communicator
/// initialised from now on feeds, instead of the environment's; `None` goes back to the
/// environment's.
pub fn install(backend: Option<Backend>) {
    *INSTALLED.lock().unwrap_or_else(PoisonError::into_inner) = backend;
}

/// The backend for a new communicator: the installed one; else, once per load of the library,
/// occl's span collector with the exporters the environment enables (Prometheus, OTLP, trace
/// files), plus, in a build with the `test-support` feature, the test span log when
/// `OCCL_PROFILER_TEST_SPANS` asks for it (then in a collector of its own). `None` when nothing
/// is enabled.
pub fn choose() -> Option<Backend> {
    if let Some(b) = INSTALLED.lock().unwrap_or_else(PoisonError::into_inner).clone() {
        return Some(b);
    }
    static FROM_ENV: OnceLock<Option<Backend>> = OnceLock::new();
    FROM_ENV.get_or_init(from_env).clone()
}

#[cfg(feature = "test-support")]
fn from_env() -> Option<Backend> {
    match crate::testlog::SpanLog::from_env() {
        Some(log) => {
            let mut exporters = exporters::from_env();
            exporters.push(log);
            Some(Backend::telemetry(Arc::new(Telemetry::new(exporters))))
        }
        None => exporters::global().map(|t| Backend::telemetry(t.clone())),
    }
}

#[cfg(not(feature = "test-support"))]
fn from_env() -> Option<Backend> {
    exporters::global().map(|t| Backend::telemetry(t.clone()))
}
