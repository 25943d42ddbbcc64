//! Work a stream does without a kernel of ours: device-to-device copies (a copy into or out of
//! a peer's mapped memory runs on the copy engines, across NVLink; one within a GPU the driver
//! runs as its own kernel on the SMs) and 64-bit flag writes and waits on device memory. Each
//! is stream-ordered and a CUDA graph captures it, except the driver's batched copy
//! (`cuMemcpyBatchAsync`, CUDA 12.8 drivers and later), which a capture refuses.

use crate::error::{check, driver, Error, Result};
use cudarc::driver::{sys, CudaContext, CudaStream};
use std::sync::{Arc, OnceLock};

/// One copy of a batch: `n` bytes from `src` to `dst`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Piece {
    pub dst: u64,
    pub src: u64,
    pub n: u64,
}

/// `cuMemcpyBatchAsync` of CUDA 12.8 drivers: destinations, sources, sizes, count, attributes,
/// each attribute's first copy, the attributes' count, where to put the index of a failed copy,
/// stream. CUDA 13 drivers add `cuMemcpyBatchAsync_v2`, the same without the failed index
/// (cudarc's binding).
type BatchV1 = unsafe extern "C" fn(
    *mut sys::CUdeviceptr,
    *mut sys::CUdeviceptr,
    *mut usize,
    usize,
    *mut sys::CUmemcpyAttributes,
    *mut usize,
    usize,
    *mut usize,
    sys::CUstream,
) -> sys::CUresult;

/// The driver's batched copy, by the newest signature it has.
#[derive(Clone, Copy)]
enum BatchEntry {
    V2,
    V1(BatchV1),
}

/// Looked up once in the loaded libcuda: `None` before CUDA 12.8.
fn batch_entry() -> Option<BatchEntry> {
    static ENTRY: OnceLock<Option<BatchEntry>> = OnceLock::new();
    *ENTRY.get_or_init(|| {
        // SAFETY: libcuda is loaded (a context exists); the symbol looked up by address only has
        // the type its name gives it in cuda.h. cudarc's own lookup panics on a missing symbol,
        // so the `_v2` entry is called through cudarc only once it is known to be there.
        unsafe {
            let lib = sys::culib();
            if lib.get::<*const ()>(b"cuMemcpyBatchAsync_v2").is_ok() {
                Some(BatchEntry::V2)
            } else {
                lib.get::<BatchV1>(b"cuMemcpyBatchAsync").ok().map(|f| BatchEntry::V1(*f))
            }
        }
    })
}

/// Whether this driver has the batched copy (CUDA 12.8 or later).
pub fn has_batch_copy() -> bool {
    batch_entry().is_some()
}

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

    /// Copies every piece in one driver call, in no order among them: each reads its source as
    /// the stream's earlier work left it, and the stream's later work sees every piece done.
    /// The driver may spread the pieces over several copy engines. Not while the stream is
    /// captured (the driver refuses it there); [`Error::MissingEntry`] on a driver before 12.8.
    ///
    /// # Safety
    /// As for [`StreamOps::copy`], for every piece.
    pub unsafe fn copy_batch(&self, pieces: &[Piece]) -> Result<()> {
        const CALL: &str = "cuMemcpyBatchAsync";
        let entry = batch_entry().ok_or(Error::MissingEntry { call: CALL, needs: "CUDA 12.8" })?;
        if pieces.is_empty() {
            return Ok(());
        }
        let mut dsts: Vec<sys::CUdeviceptr> = pieces.iter().map(|p| p.dst).collect();
        let mut srcs: Vec<sys::CUdeviceptr> = pieces.iter().map(|p| p.src).collect();
        let mut sizes: Vec<usize> = pieces.iter().map(|p| p.n as usize).collect();
        let nowhere = sys::CUmemLocation { type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_INVALID, id: 0 };
        // One attribute for every piece: sources read in stream order, on a copy engine where
        // the driver can.
        let mut attrs = [sys::CUmemcpyAttributes {
            srcAccessOrder: sys::CUmemcpySrcAccessOrder::CU_MEMCPY_SRC_ACCESS_ORDER_STREAM,
            srcLocHint: nowhere,
            dstLocHint: nowhere,
            flags: sys::CUmemcpyFlags::CU_MEMCPY_FLAG_PREFER_OVERLAP_WITH_COMPUTE as u32,
        }];
        let mut first = [0usize];
        let (d, s, z, a, i) =
            (dsts.as_mut_ptr(), srcs.as_mut_ptr(), sizes.as_mut_ptr(), attrs.as_mut_ptr(), first.as_mut_ptr());
        let stream = self.stream.cu_stream();
        // SAFETY: the caller's promise about the pieces; the arrays hold `pieces.len()` entries
        // (one attribute) and outlive the call, which copies what it needs of them.
        let r = unsafe {
            match entry {
                BatchEntry::V2 => sys::cuMemcpyBatchAsync_v2(d, s, z, pieces.len(), a, i, 1, stream),
                BatchEntry::V1(f) => {
                    let mut failed = 0usize;
                    f(d, s, z, pieces.len(), a, i, 1, &mut failed, stream)
                }
            }
        };
        check(CALL, r)
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
