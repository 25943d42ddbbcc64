//! Writing trace files when the process exits: an `atexit` handler, so a job that returns from
//! `main` or calls `exit` without destroying its communicators still leaves its traces. (Inside
//! the NCCL plugin, glibc runs it when the library is unloaded or the process exits.)
#![allow(unsafe_code)] // registering a C exit handler

use std::sync::Once;

extern "C" fn at_exit() {
    // Never unwind into C. (Nothing here logs through `tracing`: see `flush_at_exit`.)
    let _ = std::panic::catch_unwind(super::exporter::flush_at_exit);
}

/// Registers the handler once per process.
pub(super) fn install() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // SAFETY: `at_exit` is a plain `extern "C" fn()` that lives as long as the code it is in.
        if unsafe { libc::atexit(at_exit) } != 0 {
            tracing::warn!("occl trace: atexit failed; traces are written at communicator destroy and flush only");
        }
    });
}
