//! The exported function tables, `ncclProfiler_v1` … `ncclProfiler_v6` (reference §6), and the
//! only `unsafe` code of the crate: reading NCCL's arguments and writing its out-parameters.
//! Everything else happens in `hooks`, in safe Rust. One set of callbacks serves every version:
//! `startEvent` and `recordEventState` are generic over the version's descriptor (its
//! [`Layout`]), and `init` comes in NCCL's three signatures (v1–v3, v4, v5–v6).
//!
//! Every callback returns success and never unwinds into NCCL: a panic is caught and counted (an
//! unwinding `extern "C"` function would abort the process). Out-parameters are written NULL
//! before anything else runs, so NCCL never keeps a stale value.

mod step;

pub use step::{occlProfilerStepBegin, occlProfilerStepEnd};

use crate::hooks::{self, Init};
use crate::nccl_log;
use crate::stats::{self, Reason};
use occl_telemetry::nccl::abi::{
    DebugLogger, DescrV1, DescrV2, DescrV3, DescrV4, DescrV5, DescrV6, InitV1, InitV4, InitV5, Layout, Table,
};
use occl_telemetry::nccl::{decode, ApiVersion};
use occl_telemetry::CommInfo;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr;
use std::sync::atomic::{AtomicI32, Ordering::Relaxed};

/// The plugin's `name`, as NCCL logs it.
pub const NAME: &CStr = c"occl";

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

/// v1–v3 `init` says nothing about the communicator: it is recorded with hash 0, rank 0.
const UNKNOWN_COMM: CommInfo<'static> = CommInfo { comm_name: None, comm_hash: 0, n_nodes: 0, nranks: 0, rank: 0 };

/// v1–v3 `init(context, eActivationMask)`.
unsafe extern "C" fn init_v1<D: Layout>(context: *mut *mut c_void, mask: *mut c_int) -> c_int {
    // SAFETY: NCCL's out-pointers and its global mask.
    unsafe { run_init(D::VERSION, context, mask, UNKNOWN_COMM) }
}

/// v4 `init`: the mask second, the communicator's hash fourth.
#[allow(clippy::too_many_arguments)] // NCCL's signature
unsafe extern "C" fn init_v4<D: Layout>(
    context: *mut *mut c_void,
    mask: *mut c_int,
    comm_name: *const c_char,
    comm_hash: u64,
    n_nodes: c_int,
    nranks: c_int,
    rank: c_int,
    logfn: Option<DebugLogger>,
) -> c_int {
    // SAFETY: NCCL's init arguments, passed on in v5's order.
    unsafe { init_v5::<D>(context, comm_hash, mask, comm_name, n_nodes, nranks, rank, logfn) }
}

/// v5/v6 `init`: the communicator's id second, the mask third; also v4's, reordered. The
/// communicator and NCCL's logger are recorded.
#[allow(clippy::too_many_arguments)] // NCCL's signature
unsafe extern "C" fn init_v5<D: Layout>(
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
    unsafe { run_init(D::VERSION, context, mask, info) }
}

/// `startEvent` of version `D`.
unsafe extern "C" fn start<D: Layout>(context: *mut c_void, handle: *mut *mut c_void, descr: *mut c_void) -> c_int {
    let start = || {
        // SAFETY: NCCL's descriptor of version `D` (or NULL), valid for this call.
        hooks::start(context as usize, |ids| unsafe { decode::descr::<D>(descr.cast(), ids) })
    };
    // SAFETY: NCCL's out-pointer.
    unsafe { run_start(handle, start) }
}

/// `recordEventState` of version `D`.
unsafe extern "C" fn record<D: Layout>(handle: *mut c_void, state: c_int, args: *mut c_void) -> c_int {
    // SAFETY: NCCL's state arguments of version `D` (or NULL), valid for this call.
    guard(|| hooks::state(handle as usize, || unsafe { decode::state(D::VERSION, state, args) }))
}

/// `stopEvent` (every version). The handle is an integer of ours, never dereferenced.
unsafe extern "C" fn stop_event(handle: *mut c_void) -> c_int {
    guard(|| hooks::stop(handle as usize))
}

/// `finalize` (every version). The context is an integer of ours, never dereferenced.
unsafe extern "C" fn finalize(context: *mut c_void) -> c_int {
    guard(|| hooks::finalize(context as usize))
}

/// Version `D`'s table: its `init` and the callbacks every version shares.
const fn table<D: Layout, I: Copy>(init: I) -> Exported<I> {
    Exported(Table {
        name: NAME.as_ptr(),
        init: Some(init),
        start_event: Some(start::<D>),
        stop_event: Some(stop_event),
        record_event_state: Some(record::<D>),
        finalize: Some(finalize),
    })
}

/// The exported tables: symbol, descriptor, `init` type and `init` function.
macro_rules! exports {
    ($( $(#[$doc:meta])* $sym:ident: $D:ident, $I:ident, $init:ident; )*) => {
        $(
            $(#[$doc])*
            #[no_mangle]
            #[allow(non_upper_case_globals)]
            pub static $sym: Exported<$I> = table::<$D, $I>($init::<$D>);
        )*
    };
}

exports! {
    /// The table NCCL 2.23 looks for: numeric codes in Coll/P2p descriptors; 16-byte state
    /// arguments.
    ncclProfiler_v1: DescrV1, InitV1, init_v1;
    /// The table NCCL 2.24 and 2.25 look for: v1 with strings instead of codes.
    ncclProfiler_v2: DescrV2, InitV1, init_v1;
    /// The table NCCL 2.26 looks for: v2 plus KernelCh (no timestamps) and NetPlugin events.
    ncclProfiler_v3: DescrV3, InitV1, init_v1;
    /// The table NCCL 2.27 looks for: init gets the communicator and NCCL's logger; KernelCh
    /// timestamps; 8-byte state arguments.
    ncclProfiler_v4: DescrV4, InitV4, init_v4;
    /// The table NCCL 2.28 looks for: 64-bit type, the API events (GroupApi, CollApi, P2pApi,
    /// KernelLaunch) with Coll/P2p under them and `parentGroup`.
    ncclProfiler_v5: DescrV5, InitV5, init_v5;
    /// The table NCCL 2.29 and 2.30 look for: v5 plus the copy-engine events (CeColl, CeSync,
    /// CeBatch) and their states.
    ncclProfiler_v6: DescrV6, InitV5, init_v5;
}

// NCCL reads 48 bytes: a name and five function pointers (reference §6).
const _: () = {
    assert!(std::mem::size_of::<Exported<InitV1>>() == 48);
    assert!(std::mem::size_of::<Exported<InitV4>>() == 48);
    assert!(std::mem::size_of::<Exported<InitV5>>() == 48);
};
