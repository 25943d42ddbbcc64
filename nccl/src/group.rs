//! `ncclGroupStart`/`ncclGroupEnd` on occl's groups, plus what a group holds on this thread
//! until its outermost end: communicators being created inside it (one thread creating
//! several ranks, which a blocking init would deadlock) and scratch buffers of deferred calls
//! (pre-multiplied inputs), and device sends and receives (`p2p`), which run together at the
//! outermost end. Device collectives are enqueued on their streams as they are called, so they
//! run in call order; a group only makes one thread's calls on several GPUs progress together,
//! which stream-ordered kernels already do. Windows on device memory and device communicators
//! registered or created in a group are set up at its outermost end (`setup`).

use crate::abi::*;
use crate::error::{guard, Result};
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
        crate::p2p::discard();
        return Err(e);
    }
    // Device sends and receives of the group run together, after its collectives.
    crate::p2p::flush()?;
    setups?;
    // Blocking inits issued in the group complete here, as NCCL's do; non-blocking ones are
    // polled through ncclCommGetAsyncError.
    let mut code = ncclSuccess;
    for c in &held.inits {
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
