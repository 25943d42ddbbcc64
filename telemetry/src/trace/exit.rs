//! Writing trace files when the process exits: an `atexit` handler, so a job that returns from
//! `main` or calls `exit` without destroying its communicators still leaves its traces. (Inside
//! the NCCL plugin, glibc runs it when the library is unloaded or the process exits.)
#![allow(unsafe_code)] // registering a C exit handler

use std::sync::OnceLock;

/// What the handler runs: the exporter's flush, set by the first `install`.
static FLUSH: OnceLock<fn()> = OnceLock::new();

extern "C" fn at_exit() {
    // Never unwind into C. (Nothing here logs through `tracing`: see the exporter's
    // `flush_at_exit`.)
    if let Some(flush) = FLUSH.get() {
        let _ = std::panic::catch_unwind(flush);
    }
}

/// Registers the handler once per process, to run `flush`.
pub(super) fn install(flush: fn()) {
    if FLUSH.set(flush).is_err() {
        return;
    }
    // SAFETY: `at_exit` is a plain `extern "C" fn()` that lives as long as the code it is in.
    if unsafe { libc::atexit(at_exit) } != 0 {
        tracing::warn!("occl trace: atexit failed; traces are written at communicator destroy and flush only");
    }
}
