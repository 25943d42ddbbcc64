//! The process-wide list of live recorders, dumps of all of them, and the opt-in SIGUSR1 thread.

use super::config::{FlightConfig, FlightEnvError};
use super::ring::{FlightComm, FlightRecorder};
use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError, Weak};

/// Recorders created by `FlightRecorder::new` (enabled ones), held weakly.
static LIVE: Mutex<Vec<Weak<FlightRecorder>>> = Mutex::new(Vec::new());

/// The directory the SIGUSR1 thread was started with; set once.
static INSTALLED: Mutex<Option<PathBuf>> = Mutex::new(None);

/// The reason SIGUSR1 dumps carry.
pub const SIGNAL_REASON: &str = "SIGUSR1";

impl FlightRecorder {
    /// A recorder of the last `capacity` operations (capped at [`super::ring::MAX_CAPACITY`]; 0 gives a
    /// disabled recorder whose every call is one branch). The slots are allocated here, once.
    /// An enabled recorder is registered process-wide (weakly) so that [`crate::flight::dump_all`]
    /// and the SIGUSR1 handler find it while it lives.
    pub fn new(comm: FlightComm, capacity: usize) -> Arc<FlightRecorder> {
        let r = FlightRecorder::unregistered(comm, capacity);
        if r.capacity() > 0 {
            register(&r);
        }
        r
    }
}

fn register(r: &Arc<FlightRecorder>) {
    let mut live = LIVE.lock().unwrap_or_else(PoisonError::into_inner);
    live.retain(|w| w.strong_count() > 0);
    live.push(Arc::downgrade(r));
}

/// The recorders alive now, in creation order.
pub fn live_recorders() -> Vec<Arc<FlightRecorder>> {
    LIVE.lock().unwrap_or_else(PoisonError::into_inner).iter().filter_map(Weak::upgrade).collect()
}

/// Dumps every live recorder into `dir`; one result per recorder. A failure is logged and does
/// not stop the others.
pub fn dump_all_to(dir: &Path, reason: &str) -> Vec<io::Result<PathBuf>> {
    live_recorders()
        .iter()
        .map(|r| {
            let res = r.dump_to_dir(dir, reason);
            match &res {
                Ok(p) => tracing::info!(path = %p.display(), reason, "flight recorder dumped"),
                Err(e) => tracing::warn!(error = %e, reason, "flight recorder dump failed"),
            }
            res
        })
        .collect()
}

/// The directory dumps go to: the one [`install`] was given, else `None`.
pub fn dump_dir() -> Option<PathBuf> {
    INSTALLED.lock().unwrap_or_else(PoisonError::into_inner).clone()
}

/// Dumps every live recorder into [`dump_dir`]; `None` when no directory is installed.
pub fn dump_all(reason: &str) -> Option<Vec<io::Result<PathBuf>>> {
    Some(dump_all_to(&dump_dir()?, reason))
}

impl FlightRecorder {
    /// Dumps this recorder into [`dump_dir`] (what the communicator calls on a timeout or an
    /// error); `None` when no directory is installed.
    pub fn dump(&self, reason: &str) -> Option<io::Result<PathBuf>> {
        let dir = dump_dir()?;
        let res = self.dump_to_dir(&dir, reason);
        match &res {
            Ok(p) => tracing::info!(path = %p.display(), reason, "flight recorder dumped"),
            Err(e) => tracing::warn!(error = %e, reason, "flight recorder dump failed"),
        }
        Some(res)
    }
}

/// Makes `dir` the dump directory (the first call's directory stays; later calls return it).
/// SIGUSR1 is left alone: [`install_signal`] takes it.
pub fn install(dir: &Path) -> PathBuf {
    let mut installed = INSTALLED.lock().unwrap_or_else(PoisonError::into_inner);
    installed.get_or_insert_with(|| dir.to_path_buf()).clone()
}

/// Starts, once per process, a thread that dumps every live recorder into [`dump_dir`] (reason
/// [`SIGNAL_REASON`]) each time the process gets SIGUSR1. SIGUSR1 then no longer terminates the
/// process; a handler installed before is still called (signal-hook chains them).
pub fn install_signal() -> io::Result<()> {
    static STARTED: Mutex<bool> = Mutex::new(false);
    let mut started = STARTED.lock().unwrap_or_else(PoisonError::into_inner);
    if *started {
        return Ok(());
    }
    let mut signals = signal_hook::iterator::Signals::new([signal_hook::consts::SIGUSR1])?;
    std::thread::Builder::new().name("occl-flight-sigusr1".into()).spawn(move || {
        for _ in signals.forever() {
            if let Some(d) = dump_dir() {
                dump_all_to(&d, SIGNAL_REASON);
            }
        }
    })?;
    *started = true;
    Ok(())
}

/// [`install`] or [`FlightConfig::from_env`] failed.
#[derive(Debug)]
pub enum InstallError {
    Env(FlightEnvError),
    Signal(io::Error),
}

impl fmt::Display for InstallError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            InstallError::Env(e) => e.fmt(f),
            InstallError::Signal(e) => write!(f, "flight recorder: cannot install the SIGUSR1 dump thread: {e}"),
        }
    }
}

impl std::error::Error for InstallError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            InstallError::Env(e) => Some(e),
            InstallError::Signal(e) => Some(e),
        }
    }
}

/// [`install`] with the configured directory, if there is one, and [`install_signal`] when the
/// configuration asks for it; `Ok(None)` when no directory is configured (no dumps, SIGUSR1
/// untouched).
pub fn install_config(config: &FlightConfig) -> io::Result<Option<PathBuf>> {
    let Some(dir) = config.dir.as_deref() else { return Ok(None) };
    let dir = install(dir);
    if config.signal {
        install_signal()?;
    }
    Ok(Some(dir))
}

/// [`install_config`] with [`FlightConfig::from_env`]: if `OCCL_FLIGHT_RECORDER_DIR` is set,
/// dumps go there, and with `OCCL_FLIGHT_RECORDER_SIGNAL=SIGUSR1` SIGUSR1 dumps every live
/// recorder.
pub fn install_from_env() -> Result<Option<PathBuf>, InstallError> {
    let config = FlightConfig::from_env().map_err(InstallError::Env)?;
    install_config(&config).map_err(InstallError::Signal)
}
