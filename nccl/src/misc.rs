//! Version, error texts, communicator queries, memory and buffer registration.

use crate::abi::*;
use crate::error::{arg, error_string, guard, last_error_ptr, Result};
use crate::handle::{ncclComm_t, NcclComm};
use occl::HostBuf;
use std::collections::HashMap;
use std::ffi::{c_char, c_void};
use std::sync::{LazyLock, Mutex, MutexGuard};

/// Writes `v` to the caller's out-parameter.
///
/// # Safety
/// `out` is NULL or writable.
unsafe fn put<T>(what: &str, out: *mut T, v: T) -> Result<ncclResult_t> {
    if out.is_null() {
        return Err(arg(format!("{what} is NULL")));
    }
    // SAFETY: non-NULL and writable by the caller's contract.
    unsafe { out.write(v) };
    Ok(ncclSuccess)
}

export! {
    /// The NCCL version whose API this library implements (`occl_types::NCCL_VERSION_CODE`).
    fn ncclGetVersion / pncclGetVersion(version: *mut i32) -> ncclResult_t {
        // SAFETY: the caller's contract.
        guard("ncclGetVersion", || unsafe { put("version", version, VERSION_CODE) })
    }
}

export! {
    /// NCCL's short text for a result code.
    fn ncclGetErrorString / pncclGetErrorString(result: ncclResult_t) -> *const c_char {
        error_string(result).as_ptr()
    }
}

export! {
    /// The text of the last error: the communicator's own, else this thread's, else the
    /// process's. Valid until this thread's next call.
    fn ncclGetLastError / pncclGetLastError(comm: ncclComm_t) -> *const c_char {
        let own = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            // SAFETY: the caller's contract (NULL is allowed).
            let c = (!comm.is_null()).then(|| unsafe { NcclComm::from_handle(comm) }.ok()).flatten();
            c.and_then(|c| c.last_error())
        }));
        last_error_ptr(own.ok().flatten())
    }
}

export! {
    /// `ncclInProgress` while a non-blocking init runs, the init's failure, else the first
    /// fatal error a call on the communicator met (a peer died, a timeout, an abort).
    fn ncclCommGetAsyncError / pncclCommGetAsyncError(comm: ncclComm_t, asyncError: *mut ncclResult_t) -> ncclResult_t {
        guard("ncclCommGetAsyncError", || {
            // SAFETY: the caller's contract.
            let c = unsafe { NcclComm::from_handle(comm)? };
            unsafe { put("asyncError", asyncError, c.async_error()) }
        })
    }
}

export! {
    fn ncclCommCount / pncclCommCount(comm: ncclComm_t, count: *mut i32) -> ncclResult_t {
        guard("ncclCommCount", || {
            // SAFETY: the caller's contract.
            let c = unsafe { NcclComm::from_handle(comm)? };
            let n = i32::try_from(c.comm()?.nranks()).map_err(|_| arg("nranks exceeds int"))?;
            unsafe { put("count", count, n) }
        })
    }
}

export! {
    fn ncclCommUserRank / pncclCommUserRank(comm: ncclComm_t, rank: *mut i32) -> ncclResult_t {
        guard("ncclCommUserRank", || {
            // SAFETY: the caller's contract.
            let c = unsafe { NcclComm::from_handle(comm)? };
            let r = i32::try_from(c.comm()?.rank()).map_err(|_| arg("rank exceeds int"))?;
            unsafe { put("rank", rank, r) }
        })
    }
}

export! {
    /// -1: a host communicator has no CUDA device.
    fn ncclCommCuDevice / pncclCommCuDevice(comm: ncclComm_t, device: *mut i32) -> ncclResult_t {
        guard("ncclCommCuDevice", || {
            // SAFETY: the caller's contract.
            let c = unsafe { NcclComm::from_handle(comm)? };
            c.comm()?;
            // -1: a host communicator (created without a current CUDA context).
            let d = match c.device()? {
                Some(d) => i32::try_from(d.ordinal()).map_err(|_| arg("device ordinal exceeds int"))?,
                None => -1,
            };
            unsafe { put("device", device, d) }
        })
    }
}

/// Memory from `ncclMemAlloc`: host memory peers can map, or device memory.
enum Alloc {
    Host {
        _buf: HostBuf<u8>,
    },
    /// A `cuMemAlloc` address.
    Device(u64),
}

/// Memory from `ncclMemAlloc`, by address, alive until `ncclMemFree`.
fn allocations() -> MutexGuard<'static, HashMap<usize, Alloc>> {
    static LIVE: LazyLock<Mutex<HashMap<usize, Alloc>>> = LazyLock::new(Mutex::default);
    LIVE.lock().unwrap_or_else(|p| p.into_inner())
}

export! {
    /// With a current CUDA context (a GPU process), device memory of that device (`cuMemAlloc`)
    /// as NCCL's. Otherwise host memory that same-host peer processes can map (occl's
    /// `HostBuf`), so windows registered on it are shared and collectives on it take the
    /// single-copy path.
    fn ncclMemAlloc / pncclMemAlloc(ptr: *mut *mut c_void, size: usize) -> ncclResult_t {
        guard("ncclMemAlloc", || {
            if ptr.is_null() {
                return Err(arg("ptr is NULL"));
            }
            if size == 0 {
                return Err(arg("size is 0; ncclMemAlloc needs at least one byte"));
            }
            if crate::gpu::current_device().is_some() {
                let p = crate::gpu::mem_alloc(size)?;
                allocations().insert(p as usize, Alloc::Device(p));
                // SAFETY: non-NULL and writable.
                return unsafe { put("ptr", ptr, p as *mut c_void) };
            }
            let mut buf = HostBuf::<u8>::alloc(size)?;
            let p = buf.as_mut_ptr();
            allocations().insert(p as usize, Alloc::Host { _buf: buf });
            // SAFETY: non-NULL and writable.
            unsafe { put("ptr", ptr, p.cast()) }
        })
    }
}

export! {
    fn ncclMemFree / pncclMemFree(ptr: *mut c_void) -> ncclResult_t {
        guard("ncclMemFree", || {
            if ptr.is_null() {
                return Ok(ncclSuccess);
            }
            let a = allocations()
                .remove(&(ptr as usize))
                .ok_or_else(|| arg(format!("{ptr:p} was not returned by ncclMemAlloc (or was freed already)")))?;
            if let Alloc::Device(p) = a {
                crate::gpu::mem_free(p)?;
            }
            Ok(ncclSuccess)
        })
    }
}

/// A local registration: host collectives need none, so it only records the span.
struct Local {
    _span: (usize, usize),
}

/// A kind of registration handle; its id is the `TypeId` of the boxed value.
fn kind<T: 'static>() -> std::any::TypeId {
    std::any::TypeId::of::<T>()
}

/// Adds a live registration handle to `c`'s list and returns it.
fn track<T: 'static>(c: &NcclComm, v: T) -> *mut c_void {
    let p = Box::into_raw(Box::new(v)).cast::<c_void>();
    c.registrations.lock().unwrap_or_else(|e| e.into_inner()).push((p as usize, kind::<T>()));
    p
}

/// Takes back a handle of kind `T` from `track`, refusing one that `c` did not give out (or
/// gave out as another kind: a window passed to ncclCommDeregister).
fn untrack<T: 'static>(c: &NcclComm, p: *mut c_void, what: &str) -> Result<Box<T>> {
    let mut regs = c.registrations.lock().unwrap_or_else(|e| e.into_inner());
    let i = regs
        .iter()
        .position(|&h| h == (p as usize, kind::<T>()))
        .ok_or_else(|| arg(format!("{what} {p:p} is not a live {what} of this communicator")))?;
    regs.swap_remove(i);
    // SAFETY: made by Box::into_raw in track::<T> (the kind matched) and removed from the
    // list, so freed once.
    Ok(unsafe { Box::from_raw(p.cast::<T>()) })
}

export! {
    /// Local buffer registration. Host collectives need none; the handle is valid until
    /// `ncclCommDeregister`.
    fn ncclCommRegister / pncclCommRegister(
        comm: ncclComm_t,
        buff: *mut c_void,
        size: usize,
        handle: *mut *mut c_void,
    ) -> ncclResult_t {
        guard("ncclCommRegister", || {
            // SAFETY: the caller's contract.
            let c = unsafe { NcclComm::from_handle(comm)? };
            c.comm()?;
            if buff.is_null() || handle.is_null() {
                return Err(arg("buff and handle must not be NULL"));
            }
            let h = track(&c, Local { _span: (buff as usize, size) });
            unsafe { put("handle", handle, h) }
        })
    }
}

export! {
    fn ncclCommDeregister / pncclCommDeregister(comm: ncclComm_t, handle: *mut c_void) -> ncclResult_t {
        guard("ncclCommDeregister", || {
            // SAFETY: the caller's contract.
            let c = unsafe { NcclComm::from_handle(comm)? };
            untrack::<Local>(&c, handle, "registration handle")?;
            Ok(ncclSuccess)
        })
    }
}

/// A window: occl's collective registration.
struct Window {
    handle: occl::Handle,
}

export! {
    /// Registers `[buff, buff+size)` as a window on every rank (collective, in the same order
    /// everywhere). On device memory the window is the device API's (`devapi`): every rank's
    /// buffer mapped into this one's kernels, set up at once or at the end of the open group;
    /// when every rank passed `NCCL_WIN_COLL_SYMMETRIC`, all-gather, all-to-all and broadcast
    /// whose output lies in it write straight into the peers' buffers: on the copy engines
    /// (`NCCL_CTA_POLICY_ZERO`, `occl::cuda`'s `ce/mod.rs`) or from the kernels (their windowed
    /// mode). On host memory, windows on memory from `ncclMemAlloc` are shared between same-host
    /// processes and make all-reduce, all-gather and reduce-scatter single-copy.
    fn ncclCommWindowRegister / pncclCommWindowRegister(
        comm: ncclComm_t,
        buff: *mut c_void,
        size: usize,
        win: *mut *mut c_void,
        winFlags: i32,
    ) -> ncclResult_t {
        guard("ncclCommWindowRegister", || {
            // SAFETY: the caller's contract.
            let c = unsafe { NcclComm::from_handle(comm)? };
            if buff.is_null() || win.is_null() {
                return Err(arg("buff and win must not be NULL"));
            }
            if winFlags & !1 != 0 {
                return Err(arg(format!(
                    "winFlags {winFlags:#x}: use NCCL_WIN_DEFAULT (0) or NCCL_WIN_COLL_SYMMETRIC (1)"
                )));
            }
            if crate::device::is_device(buff) {
                crate::devapi::register_window(&c, buff, size, win, winFlags & 1 != 0)
                    .inspect_err(|e| c.note("ncclCommWindowRegister", e))?;
                return Ok(ncclSuccess);
            }
            // SAFETY: the caller registers memory it owns for `size` bytes and keeps it until
            // ncclCommWindowDeregister (NCCL's contract).
            let span = unsafe { std::slice::from_raw_parts(buff.cast::<u8>(), size) };
            let handle = c.comm()?.register(span).inspect_err(|e| c.note("ncclCommWindowRegister", e))?;
            let h = track(&c, Window { handle });
            unsafe { put("win", win, h) }
        })
    }
}

export! {
    /// Removes a window: a host one collectively, a device one on this rank alone (a thread
    /// driving several GPUs releases them one after the other).
    fn ncclCommWindowDeregister / pncclCommWindowDeregister(comm: ncclComm_t, win: *mut c_void) -> ncclResult_t {
        guard("ncclCommWindowDeregister", || {
            // SAFETY: the caller's contract.
            let c = unsafe { NcclComm::from_handle(comm)? };
            if crate::devapi::deregister_window(&c, win) {
                return Ok(ncclSuccess);
            }
            let inner = c.comm()?;
            let w = untrack::<Window>(&c, win, "window")?;
            inner.deregister(w.handle).inspect_err(|e| c.note("ncclCommWindowDeregister", e))?;
            Ok(ncclSuccess)
        })
    }
}
