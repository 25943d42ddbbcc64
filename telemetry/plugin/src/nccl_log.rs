//! Messages to the user: through `tracing` (for a Rust host such as occl) and through NCCL's own
//! logger, which v4+ `init` hands over, so they appear among NCCL's lines under `NCCL_DEBUG`.

use occl_telemetry::nccl::abi::DebugLogger;
use std::ffi::{c_int, c_ulong, CString};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};

/// NCCL's levels and the INIT subsystem (reference §3).
const WARN: c_int = 2;
const INFO: c_int = 3;
const SUBSYS_INIT: c_ulong = 1;

static LOGGER: Mutex<Option<DebugLogger>> = Mutex::new(None);

/// Keeps the logger of the latest v4+ `init` (every communicator's is NCCL's one function).
pub fn set_logger(logger: Option<DebugLogger>) {
    if let Some(l) = logger {
        *LOGGER.lock().unwrap_or_else(PoisonError::into_inner) = Some(l);
    }
}

fn to_nccl(level: c_int, msg: &str) {
    let Some(log) = *LOGGER.lock().unwrap_or_else(PoisonError::into_inner) else { return };
    let Ok(text) = CString::new(msg.replace('\0', " ")) else { return };
    // SAFETY: NCCL's logger, called as NCCL calls it: a C string file name, a line, and the text
    // passed as an argument of "%s", never as the format.
    unsafe { log(level, SUBSYS_INIT, c"occl-profiler".as_ptr(), 0, c"%s".as_ptr(), text.as_ptr()) };
}

pub fn info(msg: &str) {
    tracing::info!(target: "occl_profiler", "{msg}");
    to_nccl(INFO, msg);
}

pub fn warn(msg: &str) {
    tracing::warn!(target: "occl_profiler", "{msg}");
    to_nccl(WARN, msg);
}

/// A warning said once per load of the library: `flag` remembers it was said.
pub fn warn_once(flag: &AtomicBool, msg: &str) {
    if !flag.swap(true, Ordering::Relaxed) {
        warn(msg);
    }
}
