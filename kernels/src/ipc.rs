//! Device memory shared between the processes of one host through CUDA IPC: a region this
//! process allocates and exports, and peers' regions opened from their handles (with peer
//! access enabled lazily by the driver).

use crate::error::{check, driver, Error, Result};
use cudarc::driver::{sys, CudaContext};
use std::sync::Arc;

/// The 64 opaque bytes of a `CUipcMemHandle`, as sent to peers.
pub type IpcHandle = [u8; 64];

/// A zeroed allocation of this process, exportable to peers.
#[derive(Debug)]
pub struct DeviceRegion {
    ctx: Arc<CudaContext>,
    ptr: sys::CUdeviceptr,
    bytes: usize,
    /// A non-blocking stream of its own for the host's reads and writes of control words: the
    /// legacy default stream would wait for every blocking stream of the context, including
    /// kernels that spin until this very write (abort), or until a rank of this process that is
    /// blocked in this very read launches its part (thread ranks on one GPU).
    side: sys::CUstream,
}

// SAFETY: a stream handle may be used from any thread; the region's memory is device memory.
unsafe impl Send for DeviceRegion {}
unsafe impl Sync for DeviceRegion {}

impl DeviceRegion {
    /// Allocates `bytes` with `cuMemAlloc` (IPC needs a plain allocation) and zeroes them.
    pub fn alloc(ctx: &Arc<CudaContext>, bytes: usize) -> Result<DeviceRegion> {
        if bytes == 0 {
            return Err(Error::InvalidArgument("a shared region of 0 bytes".into()));
        }
        ctx.bind_to_thread().map_err(driver("cuCtxSetCurrent"))?;
        let mut side: sys::CUstream = std::ptr::null_mut();
        let flags = sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32;
        // SAFETY: a valid out-pointer; the context is current.
        check("cuStreamCreate", unsafe { sys::cuStreamCreate(&mut side, flags) })?;
        let mut ptr: sys::CUdeviceptr = 0;
        // SAFETY: a valid out-pointer; the context is current.
        if let Err(e) = check("cuMemAlloc", unsafe { sys::cuMemAlloc_v2(&mut ptr, bytes) }) {
            // SAFETY: created above, used by nobody.
            unsafe { sys::cuStreamDestroy_v2(side) };
            return Err(e);
        }
        let region = DeviceRegion { ctx: ctx.clone(), ptr, bytes, side };
        // SAFETY: the allocation just made, `bytes` long, zeroed before anyone sees it.
        check("cuMemsetD8Async", unsafe { sys::cuMemsetD8Async(ptr, 0, bytes, side) })?;
        region.settle()?;
        Ok(region)
    }

    /// Waits for the side stream's work.
    fn settle(&self) -> Result<()> {
        // SAFETY: the region's own live stream.
        check("cuStreamSynchronize", unsafe { sys::cuStreamSynchronize(self.side) })
    }

    pub fn ptr(&self) -> u64 {
        self.ptr
    }

    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// The handle peers open this region with.
    pub fn ipc_handle(&self) -> Result<IpcHandle> {
        self.ctx.bind_to_thread().map_err(driver("cuCtxSetCurrent"))?;
        let mut h = sys::CUipcMemHandle { reserved: [0; 64] };
        // SAFETY: a valid out-pointer and a live cuMemAlloc allocation.
        check("cuIpcGetMemHandle", unsafe { sys::cuIpcGetMemHandle(&mut h, self.ptr) })?;
        Ok(h.reserved.map(|b| b as u8))
    }

    /// Reads the u64 at byte `offset` (synchronously).
    pub fn read_u64(&self, offset: usize) -> Result<u64> {
        if offset + 8 > self.bytes {
            return Err(Error::InvalidArgument(format!("offset {offset} past the region's {} bytes", self.bytes)));
        }
        self.ctx.bind_to_thread().map_err(driver("cuCtxSetCurrent"))?;
        let mut v = 0u64;
        // SAFETY: 8 bytes inside the allocation into a local u64, which outlives the copy
        // (waited for below).
        check("cuMemcpyDtoHAsync", unsafe {
            sys::cuMemcpyDtoHAsync_v2((&mut v as *mut u64).cast(), self.ptr + offset as u64, 8, self.side)
        })?;
        self.settle()?;
        Ok(v)
    }

    /// Writes the u64 at byte `offset` (synchronously; kernels spinning on it see it).
    pub fn write_u64(&self, offset: usize, v: u64) -> Result<()> {
        if offset + 8 > self.bytes {
            return Err(Error::InvalidArgument(format!("offset {offset} past the region's {} bytes", self.bytes)));
        }
        self.ctx.bind_to_thread().map_err(driver("cuCtxSetCurrent"))?;
        // SAFETY: 8 bytes inside the allocation from a local u64, which outlives the copy
        // (waited for below).
        check("cuMemcpyHtoDAsync", unsafe {
            sys::cuMemcpyHtoDAsync_v2(self.ptr + offset as u64, (&v as *const u64).cast(), 8, self.side)
        })?;
        self.settle()
    }
}

impl Drop for DeviceRegion {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: allocated by cuMemAlloc and freed only here, the stream destroyed only
            // here. A failure leaks, no more.
            unsafe {
                let _ = sys::cuStreamSynchronize(self.side);
                let _ = sys::cuMemFree_v2(self.ptr);
                let _ = sys::cuStreamDestroy_v2(self.side);
            }
        }
    }
}

/// A peer's region mapped into this context.
#[derive(Debug)]
pub struct PeerRegion {
    ctx: Arc<CudaContext>,
    ptr: sys::CUdeviceptr,
}

impl PeerRegion {
    /// Opens a peer's handle (`cuIpcOpenMemHandle`, peer access enabled on first use).
    pub fn open(ctx: &Arc<CudaContext>, handle: &IpcHandle) -> Result<PeerRegion> {
        ctx.bind_to_thread().map_err(driver("cuCtxSetCurrent"))?;
        let h = sys::CUipcMemHandle { reserved: handle.map(|b| b as std::ffi::c_char) };
        let mut ptr: sys::CUdeviceptr = 0;
        let flags = sys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as u32;
        // SAFETY: a valid out-pointer; the handle's bytes came from a peer's cuIpcGetMemHandle.
        check("cuIpcOpenMemHandle", unsafe { sys::cuIpcOpenMemHandle_v2(&mut ptr, h, flags) })?;
        Ok(PeerRegion { ctx: ctx.clone(), ptr })
    }

    pub fn ptr(&self) -> u64 {
        self.ptr
    }
}

impl Drop for PeerRegion {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: opened by cuIpcOpenMemHandle and closed only here.
            let _ = unsafe { sys::cuIpcCloseMemHandle(self.ptr) };
        }
    }
}

/// Whether device `a` can map device `b`'s memory (NVLink or PCIe peer access).
pub fn can_access_peer(a: &Arc<CudaContext>, b: i32) -> Result<bool> {
    let mut v = 0i32;
    // SAFETY: a valid out-pointer and device handles.
    check("cuDeviceCanAccessPeer", unsafe { sys::cuDeviceCanAccessPeer(&mut v, a.cu_device(), b) })?;
    Ok(v != 0)
}
