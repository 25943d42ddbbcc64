//! `ncclGroupStart`/`ncclGroupEnd` on occl's groups, plus what a group holds on this thread
//! until its outermost end: communicators being created inside it (one thread creating
//! several ranks, which a blocking init would deadlock), scratch buffers of deferred calls
//! (pre-multiplied inputs), windows on device memory and device communicators registered or
//! created in it (`setup`, set up first at the end), device collectives (`deferred`, enqueued
//! on their streams at the end in call order) and device sends and receives (`p2p`, which run
//! together after them). Holding everything until the end is what lets `ncclGroupSimulateEnd`
//! price a group without running any of it.

use crate::abi::*;
use crate::error::{arg, guard, usage, Result};
use crate::handle::NcclComm;
use std::cell::RefCell;
use std::sync::Arc;

#[derive(Default)]
struct Held {
    inits: Vec<Arc<NcclComm>>,
    scratch: Vec<Vec<u64>>,
}

thread_local! {
    static HELD: RefCell<Held> = RefCell::new(Held::default());
}

pub(crate) fn is_open() -> bool {
    occl::group_depth() > 0
}

/// Keeps a communicator being created inside the open group until the group ends.
pub(crate) fn hold_init(c: Arc<NcclComm>) {
    HELD.with(|h| h.borrow_mut().inits.push(c));
}

/// Keeps a buffer that a deferred call reads until the group has run.
pub(crate) fn hold_scratch(buf: Vec<u64>) {
    HELD.with(|h| h.borrow_mut().scratch.push(buf));
}

fn end() -> Result<ncclResult_t> {
    let outermost = occl::group_depth() == 1;
    let ran = occl::group_end();
    if !outermost {
        return ran.map(|()| ncclSuccess);
    }
    let held = HELD.with(|h| std::mem::take(&mut *h.borrow_mut()));
    drop(held.scratch);
    // Windows and device communicators of the group are set up whatever became of its
    // collectives: peers wait for this rank's records.
    let setups = crate::setup::flush();
    if let Err(e) = ran {
        let _ = crate::deferred::discard();
        crate::p2p::discard();
        return Err(e);
    }
    // Device collectives in call order, then the device sends and receives together.
    if let Err(e) = crate::deferred::run() {
        crate::p2p::discard();
        return Err(e);
    }
    crate::p2p::flush()?;
    setups?;
    settle(&held.inits)
}

/// Blocking inits issued in the group complete here, as NCCL's do; non-blocking ones are
/// polled through ncclCommGetAsyncError.
fn settle(inits: &[Arc<NcclComm>]) -> Result<ncclResult_t> {
    let mut code = ncclSuccess;
    for c in inits {
        if c.opts.nonblocking {
            code = ncclInProgress;
            continue;
        }
        c.settle(true);
        let e = c.async_error();
        if e != ncclSuccess {
            let text = c.last_error().unwrap_or_default();
            crate::error::set_last(format!("ncclGroupEnd: a communicator created in this group failed: {text}"));
            return Ok(e);
        }
    }
    Ok(code)
}

/// `ncclSimInfo_t`: `size`, `magic`, `version`, then the estimate (NCCL 2.22+).
#[repr(C)]
pub struct ncclSimInfo_t {
    pub size: usize,
    pub magic: u32,
    pub version: u32,
    pub estimatedTime: f32,
}

/// `NCCL_SIM_INFO_INITIALIZER`'s magic.
const SIM_MAGIC: u32 = 0x7468_5283;

/// Closes a group level without running the outermost one: every call collected since it
/// opened is dropped, and `estimatedTime` gets their predicted µs (occl's tuner models). As in
/// NCCL, NULL ends the group normally, and a bad `simInfo` still closes the group (dropping
/// its calls) before it is refused.
///
/// # Safety
/// `info` is NULL or an `ncclSimInfo_t` of at least `size` bytes whose `size` is readable.
unsafe fn simulate_end(info: *mut ncclSimInfo_t) -> Result<ncclResult_t> {
    if info.is_null() {
        return end();
    }
    if !is_open() {
        return Err(usage("ncclGroupSimulateEnd without a matching ncclGroupStart on this thread"));
    }
    if occl::group_depth() > 1 {
        return occl::group_simulate_end().map(|_| ncclSuccess);
    }
    // Only the fields inside the caller's `size` are read or written (older, smaller layouts).
    // SAFETY: `size` is the first field and always readable (the caller's contract).
    let size = unsafe { std::ptr::addr_of!((*info).size).read_unaligned() };
    let fits = |field: usize| size >= field + 4;
    // SAFETY: read only when `size` covers it.
    let magic = fits(std::mem::offset_of!(ncclSimInfo_t, magic))
        .then(|| unsafe { std::ptr::addr_of!((*info).magic).read_unaligned() });
    let host = occl::group_simulate_end();
    let held = HELD.with(|h| std::mem::take(&mut *h.borrow_mut()));
    drop(held.scratch);
    let setups = crate::setup::flush();
    let device = crate::deferred::discard();
    let p2p = crate::p2p::simulate();
    if magic != Some(SIM_MAGIC) {
        return Err(arg("simInfo was not set to NCCL_SIM_INFO_INITIALIZER (its size or magic is wrong)"));
    }
    setups?;
    let us = host? + device? + p2p?;
    if fits(std::mem::offset_of!(ncclSimInfo_t, estimatedTime)) {
        // SAFETY: inside the caller's `size`.
        unsafe { std::ptr::addr_of_mut!((*info).estimatedTime).write_unaligned(us as f32) };
    }
    // Communicators created in a simulated group are created all the same.
    settle(&held.inits)
}

export! {
    /// Opens a group (nesting counts) on this thread.
    fn ncclGroupStart / pncclGroupStart() -> ncclResult_t {
        guard("ncclGroupStart", || {
            occl::group_start();
            Ok(ncclSuccess)
        })
    }
}

export! {
    /// Closes a group level; the outermost runs every call collected since it opened.
    fn ncclGroupEnd / pncclGroupEnd() -> ncclResult_t {
        guard("ncclGroupEnd", end)
    }
}

export! {
    /// Ends a group like `ncclGroupEnd` but runs none of its operations: `simInfo.estimatedTime`
    /// gets their predicted time in µs.
    fn ncclGroupSimulateEnd / pncclGroupSimulateEnd(simInfo: *mut ncclSimInfo_t) -> ncclResult_t {
        // SAFETY: the caller's contract.
        guard("ncclGroupSimulateEnd", || unsafe { simulate_end(simInfo) })
    }
}
