//! `ncclProfiler_v4` (NCCL 2.27): init gets the communicator and NCCL's logger (mask second,
//! hash fourth); KernelCh timestamps; 8-byte state arguments.

use super::{finalize, guard, run_init, run_start, stop_event, Exported, InitV4, NAME};
use crate::{hooks, nccl_log};
use occl_telemetry::nccl::abi::{DebugLogger, Table};
use occl_telemetry::nccl::{decode, ApiVersion};
use occl_telemetry::CommInfo;
use std::ffi::{c_char, c_int, c_void};

#[allow(clippy::too_many_arguments)] // NCCL's signature
unsafe extern "C" fn init(
    context: *mut *mut c_void,
    mask: *mut c_int,
    comm_name: *const c_char,
    comm_hash: u64,
    n_nodes: c_int,
    nranks: c_int,
    rank: c_int,
    logfn: Option<DebugLogger>,
) -> c_int {
    nccl_log::set_logger(logfn);
    // SAFETY: NULL or the communicator's name, which lives as long as the communicator.
    let comm_name = unsafe { decode::comm_name(comm_name) };
    let info = CommInfo { comm_name, comm_hash, n_nodes, nranks, rank };
    // SAFETY: NCCL's out-pointers and its global mask.
    unsafe { run_init(ApiVersion::V4, context, mask, info) }
}

unsafe extern "C" fn start(context: *mut c_void, handle: *mut *mut c_void, descr: *mut c_void) -> c_int {
    let start = || {
        // SAFETY: NCCL's v4 descriptor (or NULL), valid for this call.
        hooks::start(context as usize, |ids| unsafe { decode::v4(descr.cast(), ids) })
    };
    // SAFETY: NCCL's out-pointer.
    unsafe { run_start(handle, start) }
}

unsafe extern "C" fn record(handle: *mut c_void, state: c_int, args: *mut c_void) -> c_int {
    // SAFETY: NCCL's v4 state arguments (or NULL), valid for this call.
    guard(|| hooks::state(handle as usize, || unsafe { decode::state_v4(ApiVersion::V4, state, args.cast()) }))
}

/// The table NCCL 2.27 looks for.
#[no_mangle]
#[allow(non_upper_case_globals)]
pub static ncclProfiler_v4: Exported<InitV4> = Exported(Table {
    name: NAME.as_ptr(),
    init: Some(init),
    start_event: Some(start),
    stop_event: Some(stop_event),
    record_event_state: Some(record),
    finalize: Some(finalize),
});
