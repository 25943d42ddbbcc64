//! What a collective staged through host memory needs from CUDA, all in stream order: pinned
//! host buffers, asynchronous copies between them and the device, host functions
//! (`cuLaunchHostFunc`, which a CUDA graph captures as host nodes), an event that orders work
//! across streams, and whether a stream is being captured.

use crate::error::{check, driver, Error, Result};
use cudarc::driver::{sys, CudaContext, CudaStream};
use std::ffi::c_void;
use std::sync::Arc;

/// Page-locked host memory that the device copies to and from asynchronously.
#[derive(Debug)]
pub struct Pinned {
    ctx: Arc<CudaContext>,
    ptr: *mut u8,
    bytes: usize,
}

// SAFETY: plain host memory; who writes it when is ordered by the streams that use it.
unsafe impl Send for Pinned {}
unsafe impl Sync for Pinned {}

impl Pinned {
    pub fn alloc(ctx: &Arc<CudaContext>, bytes: usize) -> Result<Pinned> {
        if bytes == 0 {
            return Err(Error::InvalidArgument("a pinned buffer of 0 bytes".into()));
        }
        ctx.bind_to_thread().map_err(driver("cuCtxSetCurrent"))?;
        let mut p: *mut c_void = std::ptr::null_mut();
        // SAFETY: a valid out-pointer; the context is current. Portable: usable from every context.
        check("cuMemHostAlloc", unsafe { sys::cuMemHostAlloc(&mut p, bytes, sys::CU_MEMHOSTALLOC_PORTABLE) })?;
        Ok(Pinned { ctx: ctx.clone(), ptr: p.cast(), bytes })
    }

    pub fn ptr(&self) -> *mut u8 {
        self.ptr
    }

    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: allocated by cuMemHostAlloc and freed only here. A failure leaks, no more.
            let _ = unsafe { sys::cuMemFreeHost(self.ptr.cast()) };
        }
    }
}

/// Enqueues a copy of `bytes` from device address `src` to host memory `dst`.
///
/// # Safety
/// `src` is readable device memory and `dst` writable host memory of `bytes` each, both live
/// until the stream has run the copy.
pub unsafe fn copy_to_host(stream: &CudaStream, dst: *mut u8, src: u64, bytes: usize) -> Result<()> {
    stream.context().bind_to_thread().map_err(driver("cuCtxSetCurrent"))?;
    // SAFETY: the caller's promise.
    check("cuMemcpyDtoHAsync", unsafe { sys::cuMemcpyDtoHAsync_v2(dst.cast(), src, bytes, stream.cu_stream()) })
}

/// Enqueues a copy of `bytes` from host memory `src` to device address `dst`.
///
/// # Safety
/// As [`copy_to_host`], the other way round.
pub unsafe fn copy_to_device(stream: &CudaStream, dst: u64, src: *const u8, bytes: usize) -> Result<()> {
    stream.context().bind_to_thread().map_err(driver("cuCtxSetCurrent"))?;
    // SAFETY: the caller's promise.
    check("cuMemcpyHtoDAsync", unsafe { sys::cuMemcpyHtoDAsync_v2(dst, src.cast(), bytes, stream.cu_stream()) })
}

/// Enqueues `f(data)` on a driver thread once the stream's earlier work is done; later work
/// waits for it. `f` must make no CUDA call and must not unwind.
///
/// # Safety
/// `data` stays valid for every run of `f`: once for a plain stream, once per replay of a
/// graph that captured it.
pub unsafe fn host_function(
    stream: &CudaStream,
    f: unsafe extern "C" fn(*mut c_void),
    data: *mut c_void,
) -> Result<()> {
    stream.context().bind_to_thread().map_err(driver("cuCtxSetCurrent"))?;
    // SAFETY: the caller's promise about `data`; `f` is a plain function.
    check("cuLaunchHostFunc", unsafe { sys::cuLaunchHostFunc(stream.cu_stream(), Some(f), data) })
}

/// Checks this thread's CUDA calls only against graph captures it began itself: a thread that
/// watches other threads' work (queries events, writes words) then cannot break a capture that
/// another thread runs in global mode, the default, which refuses such calls from every thread.
pub fn capture_mode_thread_local() -> Result<()> {
    let mut mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
    // SAFETY: a valid in/out pointer; the mode is this thread's own.
    check("cuThreadExchangeStreamCaptureMode", unsafe { sys::cuThreadExchangeStreamCaptureMode(&mut mode) })
}

/// This thread's capture mode, relaxed until dropped: the thread may query events (never
/// recorded inside a capture) while it or another thread captures a graph, which the other
/// modes refuse and which breaks that capture.
pub struct RelaxedCapture {
    prev: sys::CUstreamCaptureMode,
}

impl RelaxedCapture {
    pub fn new() -> Result<RelaxedCapture> {
        let mut prev = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
        // SAFETY: a valid in/out pointer; the mode is this thread's own.
        check("cuThreadExchangeStreamCaptureMode", unsafe { sys::cuThreadExchangeStreamCaptureMode(&mut prev) })?;
        Ok(RelaxedCapture { prev })
    }
}

impl Drop for RelaxedCapture {
    fn drop(&mut self) {
        // SAFETY: as in `new`; puts back the mode `new` found.
        let _ = unsafe { sys::cuThreadExchangeStreamCaptureMode(&mut self.prev) };
    }
}

/// Whether the stream is being captured into a graph (its work is recorded, not run).
pub fn capturing(stream: &CudaStream) -> Result<bool> {
    stream.context().bind_to_thread().map_err(driver("cuCtxSetCurrent"))?;
    let mut s = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    // SAFETY: a live stream and a valid out-pointer.
    check("cuStreamIsCapturing", unsafe { sys::cuStreamIsCapturing(stream.cu_stream(), &mut s) })?;
    Ok(s != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE)
}

/// An event that marks where a stream's work got to, so another stream can wait for it.
#[derive(Debug)]
pub struct Mark {
    ctx: Arc<CudaContext>,
    event: sys::CUevent,
}

// SAFETY: a CUDA event handle may be used from any thread.
unsafe impl Send for Mark {}
unsafe impl Sync for Mark {}

impl Mark {
    pub fn new(ctx: &Arc<CudaContext>) -> Result<Mark> {
        Mark::with_timing(ctx, false)
    }

    /// A mark that also notes the device's time when the stream reaches it (`stamps.rs`).
    pub(crate) fn with_timing(ctx: &Arc<CudaContext>, timed: bool) -> Result<Mark> {
        ctx.bind_to_thread().map_err(driver("cuCtxSetCurrent"))?;
        let mut event: sys::CUevent = std::ptr::null_mut();
        let flags =
            if timed { sys::CUevent_flags::CU_EVENT_DEFAULT } else { sys::CUevent_flags::CU_EVENT_DISABLE_TIMING };
        // SAFETY: a valid out-pointer; the context is current.
        check("cuEventCreate", unsafe { sys::cuEventCreate(&mut event, flags as u32) })?;
        Ok(Mark { ctx: ctx.clone(), event })
    }

    pub(crate) fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    pub(crate) fn raw(&self) -> sys::CUevent {
        self.event
    }

    /// Marks the end of the work enqueued on `stream` so far.
    pub fn record(&self, stream: &CudaStream) -> Result<()> {
        self.ctx.bind_to_thread().map_err(driver("cuCtxSetCurrent"))?;
        // SAFETY: a live event and stream of this context.
        check("cuEventRecord", unsafe { sys::cuEventRecord(self.event, stream.cu_stream()) })
    }

    /// Makes `stream`'s later work wait for the last `record`.
    pub fn wait_on(&self, stream: &CudaStream) -> Result<()> {
        self.ctx.bind_to_thread().map_err(driver("cuCtxSetCurrent"))?;
        // SAFETY: a live event and stream of this context.
        check("cuStreamWaitEvent", unsafe { sys::cuStreamWaitEvent(stream.cu_stream(), self.event, 0) })
    }

    /// Whether the work before the last `record` has run (true before any `record`); never
    /// blocks.
    pub fn done(&self) -> Result<bool> {
        self.ctx.bind_to_thread().map_err(driver("cuCtxSetCurrent"))?;
        // SAFETY: a live event of this context.
        match unsafe { sys::cuEventQuery(self.event) } {
            sys::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            r => check("cuEventQuery", r).map(|()| true),
        }
    }
}

impl Drop for Mark {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: created by cuEventCreate and destroyed only here.
            let _ = unsafe { sys::cuEventDestroy_v2(self.event) };
        }
    }
}

/// Lets `ctx` read and write memory of `peer`'s device (for ranks of one process on different
/// GPUs, which share pointers instead of IPC handles). Enabling it twice is not an error.
pub fn enable_peer_access(ctx: &Arc<CudaContext>, peer: &Arc<CudaContext>) -> Result<()> {
    if ctx.cu_device() == peer.cu_device() {
        return Ok(());
    }
    ctx.bind_to_thread().map_err(driver("cuCtxSetCurrent"))?;
    // SAFETY: two live primary contexts.
    let r = unsafe { sys::cuCtxEnablePeerAccess(peer.cu_ctx(), 0) };
    if r == sys::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED {
        return Ok(());
    }
    check("cuCtxEnablePeerAccess", r)
}
