//! The GPU side of a communicator: the device it lives on, the caller's `cudaStream_t` as
//! occl's stream, and what device send/recv need to run staged through pinned host memory.
//!
//! A process is a GPU process when it has loaded the CUDA driver and its calling thread has a
//! current context at init (NCCL's rule: the current device is the communicator's). The driver
//! is never loaded here, so a host-only process (CI) never initialises CUDA.

use crate::error::{sys, usage, Result};
use occl::cuda::kernels::cudarc::driver::{sys, CudaContext, CudaStream};
use occl::cuda::kernels::staging::{Mark, Pinned};
use occl::cuda::CudaComm;
use std::ffi::c_void;
use std::sync::{Arc, Mutex, MutexGuard};

fn ok(r: sys::CUresult) -> bool {
    r == sys::CUresult::CUDA_SUCCESS
}

/// A driver failure as occl's system error, naming the call.
pub(crate) fn check(call: &'static str, r: sys::CUresult) -> Result<()> {
    if ok(r) {
        return Ok(());
    }
    Err(sys(call, format!("{r:?}")))
}

/// The ordinal of the device of the calling thread's current CUDA context, or `None` in a
/// process without the driver loaded or a thread without a current context.
pub(crate) fn current_device() -> Option<usize> {
    if !crate::device::driver_loaded() || !occl::cuda::kernels::device::driver_available() {
        return None;
    }
    let mut ctx: sys::CUcontext = std::ptr::null_mut();
    let mut dev: sys::CUdevice = 0;
    let mut n: i32 = 0;
    // SAFETY: plain driver queries into live locals; the driver is loaded (checked above).
    unsafe {
        if !ok(sys::cuCtxGetCurrent(&mut ctx)) || ctx.is_null() || !ok(sys::cuCtxGetDevice(&mut dev)) {
            return None;
        }
        if !ok(sys::cuDeviceGetCount(&mut n)) {
            return None;
        }
        // CUdevice is a handle: the ordinal is the index that maps to it.
        (0..n).find(|&i| {
            let mut d: sys::CUdevice = -1;
            ok(sys::cuDeviceGet(&mut d, i)) && d == dev
        })
    }
    .and_then(|i| usize::try_from(i).ok())
}

/// Puts the calling thread's current context back when dropped: occl binds the communicator's
/// context to the thread it runs on, and a caller driving several GPUs from one thread (NCCL's
/// ncclCommInitAll + a group) keeps the device it set.
pub(crate) struct Restore(sys::CUcontext);

impl Restore {
    /// Only in a process that has the driver loaded (a device communicator exists).
    pub(crate) fn new() -> Restore {
        let mut c: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: a live out-pointer; on failure `c` stays NULL and nothing is restored.
        let _ = unsafe { sys::cuCtxGetCurrent(&mut c) };
        Restore(c)
    }
}

impl Drop for Restore {
    fn drop(&mut self) {
        if !self.0.is_null() {
            // SAFETY: a context that was current on this thread a moment ago.
            let _ = unsafe { sys::cuCtxSetCurrent(self.0) };
        }
    }
}

/// The caller's stream (`NULL`: the legacy default stream, as in NCCL) as a borrowed stream of
/// `ctx`, refusing one of another device's context.
///
/// # Safety
/// `raw` is NULL or a live `cudaStream_t` that outlives the call's work.
pub(crate) unsafe fn stream(ctx: &Arc<CudaContext>, raw: *mut c_void, name: &str) -> Result<Arc<CudaStream>> {
    if !raw.is_null() {
        let mut owner: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: the caller's promise that `raw` is a stream.
        let r = unsafe { sys::cuStreamGetCtx(raw.cast(), &mut owner) };
        if !ok(r) {
            return Err(usage(format!("{name}: stream {raw:p} is not a live CUDA stream ({r:?})")));
        }
        if owner != ctx.cu_ctx() {
            return Err(usage(format!(
                "{name}: stream {raw:p} belongs to another CUDA context than the communicator's (the primary \
                 context of device {}); pass a stream of that device's primary context",
                ctx.ordinal()
            )));
        }
    }
    // SAFETY: the stream belongs to `ctx` (checked above, or the legacy stream) and outlives the
    // call's work (the caller's promise); the wrapper never destroys it.
    Ok(unsafe { ctx.wrap_borrowed_stream(raw.cast()) })
}

/// A device communicator: occl's `CudaComm` and the staging its point-to-point calls use.
pub(crate) struct DevComm {
    pub cc: CudaComm,
    pub staging: Staging,
}

impl DevComm {
    pub(crate) fn new(cc: CudaComm) -> Result<DevComm> {
        let staging = Staging::new(cc.context())?;
        Ok(DevComm { cc, staging })
    }

    pub(crate) fn ordinal(&self) -> usize {
        self.cc.context().ordinal()
    }

    /// Waits for every call enqueued on this device (before the communicator goes away: staged
    /// host functions read it).
    pub(crate) fn synchronize(&self) {
        let _restore = Restore::new();
        if let Err(e) = self.cc.context().synchronize() {
            tracing::warn!("occl-nccl: synchronising device {} before freeing a communicator: {e:?}", self.ordinal());
        }
    }
}

/// The pinned buffer of a communicator's staged send/recv and the events that order them.
pub(crate) struct Staging {
    ctx: Arc<CudaContext>,
    bufs: Mutex<Bufs>,
    /// The end of this communicator's copies in, for the stream that runs the host function.
    pub ready: Mark,
    /// The end of the host function, for the other communicators' streams of the same group.
    pub done: Mark,
    /// The end of the last staged call, for a next call on another stream (same buffer).
    pub order: Mark,
}

#[derive(Default)]
pub(crate) struct Bufs {
    buf: Option<Pinned>,
    /// The current buffer's address is baked into a captured graph.
    captured: bool,
    /// Buffers and host-function data that captured graphs may still use: freed with the
    /// communicator.
    kept: Vec<Pinned>,
    pub kept_data: Vec<Box<dyn std::any::Any + Send>>,
    /// The stream (address) of the last staged call not captured.
    pub last_stream: usize,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Staging {
    fn new(ctx: &Arc<CudaContext>) -> Result<Staging> {
        let mark = || Mark::new(ctx).map_err(|e| sys("cuEventCreate", e));
        Ok(Staging { ctx: ctx.clone(), bufs: Mutex::default(), ready: mark()?, done: mark()?, order: mark()? })
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, Bufs> {
        lock(&self.bufs)
    }

    /// The pinned buffer, grown to `need` bytes. A buffer that work in flight may use is freed
    /// only once the device is idle; one that a graph captured, only with the communicator.
    pub(crate) fn buffer(&self, b: &mut Bufs, need: usize, capturing: bool) -> Result<*mut u8> {
        if let Some(p) = b.buf.as_ref().filter(|p| p.bytes() >= need) {
            b.captured |= capturing;
            return Ok(p.ptr());
        }
        let size = need.max(b.buf.as_ref().map_or(0, |p| p.bytes() * 2)).next_multiple_of(1 << 20);
        let fresh = Pinned::alloc(&self.ctx, size).map_err(|e| sys("allocate the pinned staging buffer", e))?;
        if let Some(old) = b.buf.replace(fresh) {
            if b.captured || capturing {
                b.kept.push(old);
            } else {
                check("cuCtxSynchronize", {
                    self.ctx.bind_to_thread().map_err(|e| sys("cuCtxSetCurrent", format!("{e:?}")))?;
                    // SAFETY: the context is current on this thread.
                    unsafe { sys::cuCtxSynchronize() }
                })?;
                drop(old);
            }
        }
        b.captured = capturing;
        Ok(b.buf.as_ref().map_or(std::ptr::null_mut(), Pinned::ptr))
    }
}

/// `cuMemAlloc` on the calling thread's current context (`ncclMemAlloc` in a GPU process).
pub(crate) fn mem_alloc(bytes: usize) -> Result<u64> {
    let mut p: sys::CUdeviceptr = 0;
    // SAFETY: a live out-pointer; the caller checked that a context is current.
    check("cuMemAlloc", unsafe { sys::cuMemAlloc_v2(&mut p, bytes) })?;
    Ok(p)
}

/// `cuMemFree` of an address from `mem_alloc`.
pub(crate) fn mem_free(p: u64) -> Result<()> {
    // SAFETY: `p` came from cuMemAlloc and is freed once (the caller's bookkeeping).
    check("cuMemFree", unsafe { sys::cuMemFree_v2(p) })
}

/// Enqueues a device-to-device copy of `bytes` on `stream` (the own block of gather/scatter).
///
/// # Safety
/// Both are device memory of `bytes`, live until the stream has run the copy.
pub(crate) unsafe fn copy_on(stream: &CudaStream, dst: u64, src: u64, bytes: usize) -> Result<()> {
    if bytes == 0 || dst == src {
        return Ok(());
    }
    stream.context().bind_to_thread().map_err(|e| sys("cuCtxSetCurrent", format!("{e:?}")))?;
    // SAFETY: the caller's promise.
    check("cuMemcpyDtoDAsync", unsafe { sys::cuMemcpyDtoDAsync_v2(dst, src, bytes, stream.cu_stream()) })
}
