//! `ncclProfiler_v6` (NCCL 2.29, 2.30): v5 plus the copy-engine events (CeColl, CeSync,
//! CeBatch) and their states.

use super::v5::init_v5;
use super::{finalize, guard, run_start, stop_event, Exported, InitV5, NAME};
use crate::hooks;
use occl_telemetry::nccl::abi::{DebugLogger, Table};
use occl_telemetry::nccl::{decode, ApiVersion};
use std::ffi::{c_char, c_int, c_void};

#[allow(clippy::too_many_arguments)] // NCCL's signature
unsafe extern "C" fn init(
    context: *mut *mut c_void,
    comm_id: u64,
    mask: *mut c_int,
    comm_name: *const c_char,
    n_nodes: c_int,
    nranks: c_int,
    rank: c_int,
    logfn: Option<DebugLogger>,
) -> c_int {
    // SAFETY: NCCL's init arguments, passed on.
    unsafe { init_v5(ApiVersion::V6, context, comm_id, mask, comm_name, n_nodes, nranks, rank, logfn) }
}

unsafe extern "C" fn start(context: *mut c_void, handle: *mut *mut c_void, descr: *mut c_void) -> c_int {
    let start = || {
        // SAFETY: NCCL's v6 descriptor (or NULL), valid for this call.
        hooks::start(context as usize, |ids| unsafe { decode::v6(descr.cast(), ids) })
    };
    // SAFETY: NCCL's out-pointer.
    unsafe { run_start(handle, start) }
}

unsafe extern "C" fn record(handle: *mut c_void, state: c_int, args: *mut c_void) -> c_int {
    // SAFETY: NCCL's v6 state arguments (or NULL), valid for this call.
    guard(|| hooks::state(handle as usize, || unsafe { decode::state_v4(ApiVersion::V6, state, args.cast()) }))
}

/// The table NCCL 2.29 and 2.30 look for.
#[no_mangle]
#[allow(non_upper_case_globals)]
pub static ncclProfiler_v6: Exported<InitV5> = Exported(Table {
    name: NAME.as_ptr(),
    init: Some(init),
    start_event: Some(start),
    stop_event: Some(stop_event),
    record_event_state: Some(record),
    finalize: Some(finalize),
});
