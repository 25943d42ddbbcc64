//! `ncclProfiler_v3` (NCCL 2.26): v2 plus KernelCh (no timestamps) and NetPlugin events.

use super::v1::UNKNOWN_COMM;
use super::{finalize, guard, run_init, run_start, stop_event, Exported, InitV1, NAME};
use crate::hooks;
use occl_telemetry::nccl::abi::Table;
use occl_telemetry::nccl::{decode, ApiVersion};
use std::ffi::{c_int, c_void};

unsafe extern "C" fn init(context: *mut *mut c_void, mask: *mut c_int) -> c_int {
    // SAFETY: NCCL's out-pointers and its global mask.
    unsafe { run_init(ApiVersion::V3, context, mask, UNKNOWN_COMM) }
}

unsafe extern "C" fn start(context: *mut c_void, handle: *mut *mut c_void, descr: *mut c_void) -> c_int {
    let start = || {
        // SAFETY: NCCL's v3 descriptor (or NULL), valid for this call.
        hooks::start(context as usize, |ids| unsafe { decode::v3(descr.cast(), ids) })
    };
    // SAFETY: NCCL's out-pointer.
    unsafe { run_start(handle, start) }
}

unsafe extern "C" fn record(handle: *mut c_void, state: c_int, args: *mut c_void) -> c_int {
    // SAFETY: NCCL's v3 state arguments (or NULL), valid for this call.
    guard(|| hooks::state(handle as usize, || unsafe { decode::state_v1(ApiVersion::V3, state, args.cast()) }))
}

/// The table NCCL 2.26 looks for.
#[no_mangle]
#[allow(non_upper_case_globals)]
pub static ncclProfiler_v3: Exported<InitV1> = Exported(Table {
    name: NAME.as_ptr(),
    init: Some(init),
    start_event: Some(start),
    stop_event: Some(stop_event),
    record_event_state: Some(record),
    finalize: Some(finalize),
});
