//! The logger plugins receive in `init` (v4+): the C shim in `logger.c` formats the variadic
//! call, and [`on_message`] turns the text into a `tracing` event at NCCL's level.

use super::abi::DebugLogger;
use std::ffi::{c_char, c_int, c_ulong, CStr};
use std::sync::Once;

type Callback = extern "C" fn(c_int, c_ulong, *const c_char, c_int, *const c_char);

extern "C" {
    fn occl_nccl_logger(level: c_int, flags: c_ulong, file: *const c_char, line: c_int, fmt: *const c_char, ...);
    fn occl_nccl_logger_set_callback(cb: Callback);
}

/// NCCL's levels: VERSION 1, WARN 2, INFO 3, ABORT 4, TRACE 5 (0 is NONE).
const VERSION: c_int = 1;
const WARN: c_int = 2;
const INFO: c_int = 3;
const ABORT: c_int = 4;
const TRACE: c_int = 5;

static INSTALL: Once = Once::new();

/// The `ncclDebugLogger_t` to pass to a plugin.
pub fn logger() -> DebugLogger {
    INSTALL.call_once(|| {
        // SAFETY: stores a function pointer with an atomic store; `on_message` has the callback's
        // C signature and lives for the whole process.
        unsafe { occl_nccl_logger_set_callback(on_message) }
    });
    occl_nccl_logger
}

/// Copies a C string the plugin (or the shim) passed; NULL becomes "".
///
/// # Safety
/// `p` is NULL or NUL-terminated and valid for the call.
unsafe fn text(p: *const c_char) -> String {
    if p.is_null() {
        String::new()
    } else {
        // SAFETY: guaranteed by the caller.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }
}

/// Called by the shim with the formatted message. Never unwinds into C.
extern "C" fn on_message(level: c_int, flags: c_ulong, file: *const c_char, line: c_int, msg: *const c_char) {
    let _ = std::panic::catch_unwind(|| {
        // SAFETY: the shim passes its NUL-terminated buffer; `file` is the plugin's `__FILE__`
        // literal or NULL.
        let (msg, file) = unsafe { (text(msg), text(file)) };
        match level {
            WARN => tracing::warn!(target: "occl::nccl_plugin", flags, file, line, "{msg}"),
            ABORT => tracing::error!(target: "occl::nccl_plugin", flags, file, line, "{msg}"),
            TRACE => tracing::trace!(target: "occl::nccl_plugin", flags, file, line, "{msg}"),
            INFO | VERSION => tracing::info!(target: "occl::nccl_plugin", flags, file, line, "{msg}"),
            _ => {}
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shim_formats_and_never_treats_text_as_a_format() {
        let log = logger();
        // Mostly a check that calling through the variadic pointer works; the message reaching
        // `tracing` is checked by the plugin tests, which capture it.
        // SAFETY: a valid format with matching arguments; the shim copies into its own buffer.
        unsafe { log(INFO, 16384, c"t.c".as_ptr(), 1, c"%s %d%%".as_ptr(), c"x".as_ptr(), 5 as c_int) };
        unsafe { log(0, 0, std::ptr::null(), 0, std::ptr::null()) };
    }
}
