//! `ncclProfiler_v5` (NCCL 2.28): 64-bit type, the API events (GroupApi, CollApi, P2pApi,
//! KernelLaunch) with Coll/P2p under them and `parentGroup`; init takes the comm id second and
//! the mask third.

use super::{finalize, guard, run_init, run_start, stop_event, Exported, InitV5, NAME};
use crate::{hooks, nccl_log};
use occl_telemetry::nccl::abi::{DebugLogger, Table};
use occl_telemetry::nccl::{decode, ApiVersion};
use occl_telemetry::CommInfo;
use std::ffi::{c_char, c_int, c_void};

/// v5 and v6 `init` (same signature).
///
/// # Safety
/// NCCL's init arguments.
#[allow(clippy::too_many_arguments)] // NCCL's signature
pub(super) unsafe fn init_v5(
    version: ApiVersion,
    context: *mut *mut c_void,
    comm_id: u64,
    mask: *mut c_int,
    comm_name: *const c_char,
    n_nodes: c_int,
    nranks: c_int,
    rank: c_int,
    logfn: Option<DebugLogger>,
) -> c_int {
    nccl_log::set_logger(logfn);
    // SAFETY: NULL or the communicator's name, which lives as long as the communicator.
    let comm_name = unsafe { decode::comm_name(comm_name) };
    let info = CommInfo { comm_name, comm_hash: comm_id, n_nodes, nranks, rank };
    // SAFETY: NCCL's out-pointers and its global mask.
    unsafe { run_init(version, context, mask, info) }
}

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
    unsafe { init_v5(ApiVersion::V5, context, comm_id, mask, comm_name, n_nodes, nranks, rank, logfn) }
}

unsafe extern "C" fn start(context: *mut c_void, handle: *mut *mut c_void, descr: *mut c_void) -> c_int {
    let start = || {
        // SAFETY: NCCL's v5 descriptor (or NULL), valid for this call.
        hooks::start(context as usize, |ids| unsafe { decode::v5(descr.cast(), ids) })
    };
    // SAFETY: NCCL's out-pointer.
    unsafe { run_start(handle, start) }
}

unsafe extern "C" fn record(handle: *mut c_void, state: c_int, args: *mut c_void) -> c_int {
    // SAFETY: NCCL's v5 state arguments (or NULL), valid for this call.
    guard(|| hooks::state(handle as usize, || unsafe { decode::state_v4(ApiVersion::V5, state, args.cast()) }))
}

/// The table NCCL 2.28 looks for.
#[no_mangle]
#[allow(non_upper_case_globals)]
pub static ncclProfiler_v5: Exported<InitV5> = Exported(Table {
    name: NAME.as_ptr(),
    init: Some(init),
    start_event: Some(start),
    stop_event: Some(stop_event),
    record_event_state: Some(record),
    finalize: Some(finalize),
});
