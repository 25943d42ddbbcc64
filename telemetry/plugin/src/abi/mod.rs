//! The exported function tables, `ncclProfiler_v1` … `ncclProfiler_v6` (one module per API
//! version, reference §6), and the only `unsafe` code of the crate: reading NCCL's arguments and
//! writing its out-parameters. Everything else happens in `hooks`, in safe Rust.
//!
//! Every callback returns success and never unwinds into NCCL: a panic is caught and counted (an
//! unwinding `extern "C"` function would abort the process). Out-parameters are written NULL
//! before anything else runs, so NCCL never keeps a stale value.

mod step;
mod v1;
mod v2;
mod v3;
mod v4;
mod v5;
mod v6;

pub use step::{occlProfilerStepBegin, occlProfilerStepEnd};
pub use v1::ncclProfiler_v1;
pub use v2::ncclProfiler_v2;
pub use v3::ncclProfiler_v3;
pub use v4::ncclProfiler_v4;
pub use v5::ncclProfiler_v5;
pub use v6::ncclProfiler_v6;

use crate::hooks::{self, Init};
use crate::stats::{self, Reason};
use occl_telemetry::nccl::abi::{DebugLogger, Table};
use occl_telemetry::nccl::ApiVersion;
use occl_telemetry::CommInfo;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr;
use std::sync::atomic::{AtomicI32, Ordering::Relaxed};

/// The plugin's `name`, as NCCL logs it.
pub const NAME: &CStr = c"occl";

/// v1–v3 `init(context, eActivationMask)`.
pub type InitV1 = unsafe extern "C" fn(*mut *mut c_void, *mut c_int) -> c_int;
/// v4 `init(context, mask, commName, commHash, nNodes, nranks, rank, logfn)`; the logger is an
/// `Option` so that a NULL one is a value, not undefined behaviour.
pub type InitV4 = unsafe extern "C" fn(
    *mut *mut c_void,
    *mut c_int,
    *const c_char,
    u64,
    c_int,
    c_int,
    c_int,
    Option<DebugLogger>,
) -> c_int;
/// v5/v6 `init(context, commId, mask, commName, nNodes, nranks, rank, logfn)`.
pub type InitV5 = unsafe extern "C" fn(
    *mut *mut c_void,
    u64,
    *mut c_int,
    *const c_char,
    c_int,
    c_int,
    c_int,
    Option<DebugLogger>,
) -> c_int;

/// An exported table: NCCL's 48-byte struct.
#[repr(transparent)]
pub struct Exported<I: Copy>(pub Table<I>);

// SAFETY: the table is never written: a pointer to a static C string and function pointers.
unsafe impl<I: Copy> Sync for Exported<I> {}

/// Runs a callback's body; a panic is counted, and NCCL gets success either way.
fn guard(f: impl FnOnce()) -> c_int {
    if catch_unwind(AssertUnwindSafe(f)).is_err() {
        stats::count(Reason::Panic);
    }
    0
}

/// `init` of every version: `*context` is NULL until a communicator is registered, then the
/// context; `*eActivationMask` what the sinks of every live communicator want.
///
/// # Safety
/// `context` is NULL or writable; `mask` is NULL or NCCL's aligned, live, process-global `int`.
unsafe fn run_init(version: ApiVersion, context: *mut *mut c_void, mask: *mut c_int, info: CommInfo<'_>) -> c_int {
    if !context.is_null() {
        // SAFETY: writable (caller's promise).
        unsafe { context.write(ptr::null_mut()) };
    }
    guard(|| {
        let Init { context: ctx, mask: m } = hooks::init(version, &info);
        if !context.is_null() {
            // SAFETY: as above.
            unsafe { context.write(ctx as *mut c_void) };
        }
        if !mask.is_null() && mask.is_aligned() {
            // SAFETY: NCCL's global mask, read by other threads with relaxed atomic loads
            // (reference §4, §15); only the 32 bits of NCCL's int are defined.
            unsafe { AtomicI32::from_ptr(mask) }.store(m.0 as u32 as i32, Relaxed);
        }
    })
}

/// `startEvent` of every version: `*eHandle` is NULL until `start` returns the handle.
///
/// # Safety
/// `handle` is NULL or writable.
unsafe fn run_start(handle: *mut *mut c_void, start: impl FnOnce() -> usize) -> c_int {
    if handle.is_null() {
        // Nowhere to put a handle: the event could never be stopped.
        return 0;
    }
    // SAFETY: writable (caller's promise).
    unsafe { handle.write(ptr::null_mut()) };
    guard(|| {
        let h = start();
        // SAFETY: as above.
        unsafe { handle.write(h as *mut c_void) };
    })
}

/// `stopEvent` (every version). The handle is an integer of ours, never dereferenced.
unsafe extern "C" fn stop_event(handle: *mut c_void) -> c_int {
    guard(|| hooks::stop(handle as usize))
}

/// `finalize` (every version). The context is an integer of ours, never dereferenced.
unsafe extern "C" fn finalize(context: *mut c_void) -> c_int {
    guard(|| hooks::finalize(context as usize))
}

// NCCL reads 48 bytes: a name and five function pointers (reference §6).
const _: () = {
    assert!(std::mem::size_of::<Exported<InitV1>>() == 48);
    assert!(std::mem::size_of::<Exported<InitV4>>() == 48);
    assert!(std::mem::size_of::<Exported<InitV5>>() == 48);
};
