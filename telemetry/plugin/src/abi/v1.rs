//! `ncclProfiler_v1` (NCCL 2.23): no communicator information at init; numeric codes in
//! Coll/P2p descriptors; 16-byte state arguments.

use super::{finalize, guard, run_init, run_start, stop_event, Exported, InitV1, NAME};
use crate::hooks;
use occl_telemetry::nccl::abi::Table;
use occl_telemetry::nccl::{decode, ApiVersion};
use occl_telemetry::CommInfo;
use std::ffi::{c_int, c_void};

/// v1–v3 `init` says nothing about the communicator: it is recorded with hash 0, rank 0.
pub(super) const UNKNOWN_COMM: CommInfo<'static> =
    CommInfo { comm_name: None, comm_hash: 0, n_nodes: 0, nranks: 0, rank: 0 };

unsafe extern "C" fn init(context: *mut *mut c_void, mask: *mut c_int) -> c_int {
    // SAFETY: NCCL's out-pointers and its global mask.
    unsafe { run_init(ApiVersion::V1, context, mask, UNKNOWN_COMM) }
}

unsafe extern "C" fn start(context: *mut c_void, handle: *mut *mut c_void, descr: *mut c_void) -> c_int {
    let start = || {
        // SAFETY: NCCL's v1 descriptor (or NULL), valid for this call.
        hooks::start(context as usize, |ids| unsafe { decode::v1(descr.cast(), ids) })
    };
    // SAFETY: NCCL's out-pointer.
    unsafe { run_start(handle, start) }
}

unsafe extern "C" fn record(handle: *mut c_void, state: c_int, args: *mut c_void) -> c_int {
    // SAFETY: NCCL's v1 state arguments (or NULL), valid for this call.
    guard(|| hooks::state(handle as usize, || unsafe { decode::state_v1(ApiVersion::V1, state, args.cast()) }))
}

/// The table NCCL 2.23 looks for.
#[no_mangle]
#[allow(non_upper_case_globals)]
pub static ncclProfiler_v1: Exported<InitV1> = Exported(Table {
    name: NAME.as_ptr(),
    init: Some(init),
    start_event: Some(start),
    stop_event: Some(stop_event),
    record_event_state: Some(record),
    finalize: Some(finalize),
});
