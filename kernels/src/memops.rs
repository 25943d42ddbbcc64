//! Work a stream does without a kernel of ours: device-to-device copies (a copy into or out of
//! a peer's mapped memory runs on the copy engines, across NVLink; one within a GPU the driver
//! runs as its own kernel on the SMs) and 64-bit flag writes and waits on device memory. Each
//! is stream-ordered and a CUDA graph captures it.

use crate::error::{check, driver, Result};
use cudarc::driver::{sys, CudaContext, CudaStream};
use std::sync::Arc;

/// The raw stream operations on one stream, with its context current on this thread.
pub struct StreamOps<'a> {
    stream: &'a CudaStream,
}

impl<'a> StreamOps<'a> {
    /// Makes the stream's context current (the raw calls below act on the current context).
    pub fn new(stream: &'a CudaStream) -> Result<StreamOps<'a>> {
        stream.context().bind_to_thread().map_err(driver("cuCtxSetCurrent"))?;
        Ok(StreamOps { stream })
    }

    /// Copies `n` bytes from `src` to `dst`.
    ///
    /// # Safety
    /// Both are device memory this context can reach, valid for `n` bytes until the stream has
    /// run the copy.
    pub unsafe fn copy(&self, dst: u64, src: u64, n: u64) -> Result<()> {
        // SAFETY: the caller's promise.
        check("cuMemcpyDtoDAsync", unsafe { sys::cuMemcpyDtoDAsync_v2(dst, src, n as usize, self.stream.cu_stream()) })
    }

    /// Holds the stream until the u64 at `addr` is at least `v`.
    ///
    /// # Safety
    /// `addr` is an 8-byte-aligned u64 of device memory this context can reach, valid until the
    /// stream has passed the wait.
    pub unsafe fn wait_ge(&self, addr: u64, v: u64) -> Result<()> {
        let geq = sys::CUstreamWaitValue_flags::CU_STREAM_WAIT_VALUE_GEQ as u32;
        // SAFETY: the caller's promise.
        check("cuStreamWaitValue64", unsafe { sys::cuStreamWaitValue64_v2(self.stream.cu_stream(), addr, v, geq) })
    }

    /// Writes `v` to the u64 at `addr` once the stream's earlier work is done, after a fence:
    /// whoever sees the value sees what that work wrote.
    ///
    /// # Safety
    /// As for [`StreamOps::wait_ge`].
    pub unsafe fn write(&self, addr: u64, v: u64) -> Result<()> {
        let fenced = sys::CUstreamWriteValue_flags::CU_STREAM_WRITE_VALUE_DEFAULT as u32;
        // SAFETY: the caller's promise.
        check("cuStreamWriteValue64", unsafe { sys::cuStreamWriteValue64_v2(self.stream.cu_stream(), addr, v, fenced) })
    }
}

/// A stream of `ctx` for work a caller's stream forks off and joins back by events
/// (`staging::Mark`): non-blocking, so it never waits for the legacy default stream.
pub fn side_stream(ctx: &Arc<CudaContext>) -> Result<Arc<CudaStream>> {
    ctx.new_stream().map_err(driver("cuStreamCreate"))
}
