//! Result codes, the last error's text, and the barrier that keeps panics inside the library.
//!
//! NCCL reports a failure as a code and keeps a text for `ncclGetLastError`. occl's errors
//! carry the text; `guard` turns one into the code and remembers the text per thread and per
//! process (a watchdog thread asks for the text of an error another thread saw).

use crate::abi::*;
use occl::{Error, ErrorKind};
use std::cell::RefCell;
use std::ffi::CString;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Mutex;

pub(crate) type Result<T> = occl::Result<T>;

pub(crate) fn arg(msg: impl Into<String>) -> Error {
    Error::InvalidArgument(msg.into())
}

pub(crate) fn usage(msg: impl Into<String>) -> Error {
    Error::InvalidUsage(msg.into())
}

/// A CUDA driver failure: the call or step that failed and the driver's word for it.
pub(crate) fn sys(context: &str, text: impl std::fmt::Display) -> Error {
    Error::SystemError { context: context.into(), source: std::io::Error::other(text.to_string()) }
}

pub(crate) fn internal(msg: impl Into<String>) -> Error {
    Error::InternalError(msg.into())
}

/// A copy of `e`, for an error reported twice (at a call and again when its group ends).
pub(crate) fn again(e: &Error) -> Error {
    match e {
        Error::InvalidArgument(m) => Error::InvalidArgument(m.clone()),
        Error::InvalidUsage(m) => Error::InvalidUsage(m.clone()),
        Error::SystemError { context, source } => sys(context, source),
        Error::InternalError(m) => Error::InternalError(m.clone()),
        Error::RemoteError { peer, what } => Error::RemoteError { peer: *peer, what: what.clone() },
        Error::Timeout { what, secs } => Error::Timeout { what: what.clone(), secs: *secs },
    }
}

/// NCCL's code for an occl error. NCCL has no timeout code and reports those as system errors.
pub(crate) fn code_of(kind: ErrorKind) -> ncclResult_t {
    match kind {
        ErrorKind::InvalidArgument => ncclInvalidArgument,
        ErrorKind::InvalidUsage => ncclInvalidUsage,
        ErrorKind::SystemError | ErrorKind::Timeout => ncclSystemError,
        ErrorKind::InternalError => ncclInternalError,
        ErrorKind::RemoteError => ncclRemoteError,
    }
}

/// Whether an error leaves the communicator failed (what `ncclCommGetAsyncError` reports), as
/// opposed to a call refused for its arguments.
pub(crate) fn is_fatal(kind: ErrorKind) -> bool {
    !matches!(kind, ErrorKind::InvalidArgument | ErrorKind::InvalidUsage)
}

thread_local! {
    static THREAD_LAST: RefCell<Option<String>> = const { RefCell::new(None) };
    /// The text `ncclGetLastError` returned to this thread, alive until its next call.
    static RETURNED: RefCell<CString> = RefCell::new(CString::default());
}
static PROCESS_LAST: Mutex<Option<String>> = Mutex::new(None);

pub(crate) fn set_last(text: String) {
    THREAD_LAST.with(|t| *t.borrow_mut() = Some(text.clone()));
    *PROCESS_LAST.lock().unwrap_or_else(|p| p.into_inner()) = Some(text);
}

/// This thread's last error, else the process's, as a C string valid until this thread's next
/// call; `preferred` (a communicator's own last error) comes first.
pub(crate) fn last_error_ptr(preferred: Option<String>) -> *const std::ffi::c_char {
    let text = preferred
        .or_else(|| THREAD_LAST.with(|t| t.borrow().clone()))
        .or_else(|| PROCESS_LAST.lock().unwrap_or_else(|p| p.into_inner()).clone())
        .unwrap_or_default();
    let c = CString::new(text.replace('\0', " ")).unwrap_or_default();
    RETURNED.with(|r| {
        *r.borrow_mut() = c;
        r.borrow().as_ptr()
    })
}

fn panic_text(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>().map(|s| s.to_string()).or_else(|| p.downcast_ref::<String>().cloned()).unwrap_or_default()
}

/// Runs an entry point's body: its error becomes NCCL's code with the text kept for
/// `ncclGetLastError`, and a panic stops here as `ncclInternalError` (unwinding into C is
/// undefined behaviour).
pub(crate) fn guard(name: &'static str, body: impl FnOnce() -> Result<ncclResult_t>) -> ncclResult_t {
    // NCCL's default: no lines unless NCCL_DEBUG (or OCCL_DEBUG) asks.
    occl::log::init(None);
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(code)) => code,
        Ok(Err(e)) => {
            let code = code_of(e.kind());
            tracing::warn!("{name}: {e}");
            set_last(format!("{name}: {e}"));
            code
        }
        Err(p) => {
            let text = format!("{name}: internal error: occl panicked ({}); please report this", panic_text(&*p));
            tracing::error!("{text}");
            set_last(text);
            ncclInternalError
        }
    }
}

/// As `guard` for entry points that return a value, not a code: `fallback` on error or panic.
pub(crate) fn guard_value<T>(name: &'static str, fallback: T, body: impl FnOnce() -> Result<T>) -> T {
    let mut out = None;
    let code = guard(name, || {
        out = Some(body()?);
        Ok(ncclSuccess)
    });
    match out {
        Some(v) if code == ncclSuccess => v,
        _ => fallback,
    }
}

/// A short text for a result code (`ncclGetErrorString`); `ncclGetLastError` has the details.
pub(crate) fn error_string(code: ncclResult_t) -> &'static std::ffi::CStr {
    match code {
        ncclSuccess => c"no error",
        ncclUnhandledCudaError => c"a CUDA call failed (see ncclGetLastError)",
        ncclSystemError => c"a system call failed or a wait timed out (see ncclGetLastError)",
        ncclInternalError => c"internal error in occl; please report it (see ncclGetLastError)",
        ncclInvalidArgument => c"invalid argument (see ncclGetLastError)",
        ncclInvalidUsage => c"invalid usage (see ncclGetLastError)",
        ncclRemoteError => c"a remote rank failed, exited or could not be reached (see ncclGetLastError)",
        ncclInProgress => c"operation in progress",
        _ => c"unknown ncclResult_t",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guard_maps_errors_and_stops_panics() {
        assert_eq!(guard("t", || Err(arg("bad count"))), ncclInvalidArgument);
        let text = unsafe { std::ffi::CStr::from_ptr(last_error_ptr(None)) }.to_str().unwrap().to_string();
        assert_eq!(text, "t: invalid argument: bad count");
        assert_eq!(guard("p", || panic!("boom")), ncclInternalError);
        let text = unsafe { std::ffi::CStr::from_ptr(last_error_ptr(None)) }.to_str().unwrap().to_string();
        assert_eq!(text, "p: internal error: occl panicked (boom); please report this");
        assert_eq!(guard_value("v", -1, || Err(usage("no"))), -1);
        assert_eq!(guard_value("v", -1, || Ok(3)), 3);
        assert_eq!(code_of(ErrorKind::Timeout), ncclSystemError);
        assert_eq!(code_of(ErrorKind::RemoteError), ncclRemoteError);
    }
}
