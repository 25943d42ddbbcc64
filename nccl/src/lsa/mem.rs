//! Device memory that ranks share for the device API: a caller's buffer exported for its
//! peers, the records ranks swap about it, the peers' memory opened here, and the small
//! device-resident descriptors (windows) the library writes for kernels to read.
//!
//! Sharing follows occl's device communicator: a peer in another process opens the
//! allocation's legacy CUDA IPC handle; a peer in this process (one thread driving several
//! GPUs) is reached by address, with peer access between the two GPUs enabled.

use crate::error::{arg, sys, usage, Result};
use crate::gpu::check;
use occl::cuda::kernels::cudarc::driver::{sys, CudaContext};
use occl::cuda::kernels::ipc::{IpcHandle, PeerRegion};
use occl::cuda::kernels::{device, staging};
use occl::Error;
use std::sync::Arc;

fn bind(ctx: &Arc<CudaContext>) -> Result<()> {
    ctx.bind_to_thread().map_err(|e| sys("cuCtxSetCurrent", format!("{e:?}")))
}

/// A `cuMemAlloc` allocation of this library's (a window descriptor), freed on drop.
#[derive(Debug)]
pub(crate) struct DevMem {
    ctx: Arc<CudaContext>,
    ptr: u64,
    bytes: usize,
}

impl DevMem {
    pub(crate) fn alloc(ctx: &Arc<CudaContext>, bytes: usize) -> Result<DevMem> {
        bind(ctx)?;
        let mut ptr: sys::CUdeviceptr = 0;
        // SAFETY: a live out-pointer; the context is current.
        check("cuMemAlloc", unsafe { sys::cuMemAlloc_v2(&mut ptr, bytes.max(1)) })?;
        Ok(DevMem { ctx: ctx.clone(), ptr, bytes })
    }

    pub(crate) fn ptr(&self) -> u64 {
        self.ptr
    }

    /// Copies `data` to the start of the allocation and waits for it. Through a non-blocking
    /// stream of its own: the legacy default stream would wait for kernels of this context that
    /// may be spinning until a rank this very thread drives calls in.
    pub(crate) fn upload(&self, data: &[u8]) -> Result<()> {
        if data.len() > self.bytes {
            return Err(arg(format!("{} bytes do not fit a {}-byte descriptor", data.len(), self.bytes)));
        }
        bind(&self.ctx)?;
        let mut s: sys::CUstream = std::ptr::null_mut();
        let flags = sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32;
        // SAFETY: a live out-pointer; the context is current.
        check("cuStreamCreate", unsafe { sys::cuStreamCreate(&mut s, flags) })?;
        // SAFETY: `data` outlives the copy (waited for before returning); the destination is this
        // allocation, large enough (checked above).
        let copied = check("cuMemcpyHtoDAsync", unsafe {
            sys::cuMemcpyHtoDAsync_v2(self.ptr, data.as_ptr().cast(), data.len(), s)
        })
        .and_then(|()| {
            // SAFETY: the stream created above.
            check("cuStreamSynchronize", unsafe { sys::cuStreamSynchronize(s) })
        });
        // SAFETY: created above; its work has finished or failed.
        unsafe { sys::cuStreamDestroy_v2(s) };
        copied
    }
}

impl Drop for DevMem {
    fn drop(&mut self) {
        if bind(&self.ctx).is_ok() {
            // SAFETY: allocated by cuMemAlloc and freed only here; a failure leaks, no more.
            let _ = unsafe { sys::cuMemFree_v2(self.ptr) };
        }
    }
}

/// A caller's device buffer as peers can open it: the allocation's base, the buffer's offset in
/// it and the allocation's IPC handle.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Exported {
    pub base: u64,
    pub offset: u64,
    pub handle: IpcHandle,
}

fn attribute(what: sys::CUpointer_attribute, ptr: u64) -> Result<i32> {
    // Room for 8 bytes, zeroed: the attributes asked here are ints (booleans), read from the low
    // half whatever width the driver writes.
    let mut v: u64 = 0;
    // SAFETY: the driver writes at most the attribute's size (4 bytes) into the live local.
    check("cuPointerGetAttribute", unsafe { sys::cuPointerGetAttribute((&raw mut v).cast(), what, ptr) })?;
    Ok(i32::from_ne_bytes(v.to_ne_bytes()[..4].try_into().unwrap_or_default()))
}

/// Checks that `[ptr, ptr+bytes)` is memory of device `ordinal` that CUDA IPC can share and
/// exports its allocation.
pub(crate) fn export(ctx: &Arc<CudaContext>, ordinal: usize, ptr: u64, bytes: usize) -> Result<Exported> {
    bind(ctx)?;
    use sys::CUpointer_attribute as A;
    let on = attribute(A::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, ptr)?;
    if usize::try_from(on).ok() != Some(ordinal) {
        return Err(usage(format!(
            "buffer {ptr:#x} is memory of GPU {on}, but the communicator lives on GPU {ordinal}; register memory \
             of the communicator's GPU"
        )));
    }
    if attribute(A::CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, ptr)? == 0 {
        return Err(usage(format!(
            "buffer {ptr:#x} cannot be shared through CUDA IPC (virtual memory management or a memory pool \
             allocated it); occl maps windows with legacy CUDA IPC: allocate the buffer with ncclMemAlloc (or \
             cudaMalloc)"
        )));
    }
    let (mut base, mut len): (sys::CUdeviceptr, usize) = (0, 0);
    // SAFETY: live out-pointers; `ptr` is device memory (asked above).
    check("cuMemGetAddressRange", unsafe { sys::cuMemGetAddressRange_v2(&mut base, &mut len, ptr) })?;
    let offset = ptr - base;
    if offset.checked_add(bytes as u64).is_none_or(|end| end > len as u64) {
        return Err(arg(format!(
            "[{ptr:#x}, +{bytes}) runs past the end of its allocation ({len} bytes from {base:#x})"
        )));
    }
    let mut h = sys::CUipcMemHandle { reserved: [0; 64] };
    // SAFETY: a live out-pointer and the base of a live allocation.
    check("cuIpcGetMemHandle", unsafe { sys::cuIpcGetMemHandle(&mut h, base) })?;
    Ok(Exported { base, offset, handle: h.reserved.map(|b| b as u8) })
}

/// What each rank tells the others about the memory it shares in one setup.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Record {
    /// The rank's own part went well; when false the rest is meaningless.
    pub ok: bool,
    pub pid: u32,
    pub device: u32,
    pub base: u64,
    pub offset: u64,
    /// What must be equal on every rank (the device communicator's plan); 0 for windows.
    pub fingerprint: u64,
    pub handle: IpcHandle,
    /// A window's bytes on this rank (0 for a device communicator).
    pub size: u64,
    /// A window registered with `NCCL_WIN_COLL_SYMMETRIC` on this rank.
    pub symmetric: bool,
}

const RECORD: usize = 40 + 64 + 8;

impl Record {
    /// The record of a rank whose own part failed: peers stop too, naming it.
    pub(crate) fn failed() -> Record {
        Record {
            ok: false,
            pid: 0,
            device: 0,
            base: 0,
            offset: 0,
            fingerprint: 0,
            handle: [0; 64],
            size: 0,
            symmetric: false,
        }
    }

    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; RECORD];
        b[0] = u8::from(self.ok);
        b[1] = u8::from(self.symmetric);
        b[4..8].copy_from_slice(&self.pid.to_le_bytes());
        b[8..12].copy_from_slice(&self.device.to_le_bytes());
        b[16..24].copy_from_slice(&self.base.to_le_bytes());
        b[24..32].copy_from_slice(&self.offset.to_le_bytes());
        b[32..40].copy_from_slice(&self.fingerprint.to_le_bytes());
        b[40..104].copy_from_slice(&self.handle);
        b[104..].copy_from_slice(&self.size.to_le_bytes());
        b
    }

    pub(crate) fn decode(rank: usize, b: &[u8]) -> Result<Record> {
        if b.len() != RECORD {
            return Err(Error::InternalError(format!(
                "rank {rank} sent a {}-byte sharing record, not {RECORD}",
                b.len()
            )));
        }
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let u64_at = |i: usize| u64::from(u32_at(i)) | (u64::from(u32_at(i + 4)) << 32);
        let mut handle = [0u8; 64];
        handle.copy_from_slice(&b[40..104]);
        Ok(Record {
            ok: b[0] == 1,
            pid: u32_at(4),
            device: u32_at(8),
            base: u64_at(16),
            offset: u64_at(24),
            fingerprint: u64_at(32),
            handle,
            size: u64_at(104),
            symmetric: b[1] == 1,
        })
    }
}

/// Every rank's records from raw bytes, failing when a rank's own part failed (`what` names
/// the setup) or its fingerprint differs from this rank's.
pub(crate) fn records(all: &[Vec<u8>], me: usize, what: &str) -> Result<Vec<Record>> {
    let recs = all.iter().enumerate().map(|(r, b)| Record::decode(r, b)).collect::<Result<Vec<_>>>()?;
    let mine = recs.get(me).ok_or_else(|| Error::InternalError(format!("no record of rank {me}")))?.fingerprint;
    for (r, rec) in recs.iter().enumerate() {
        if !rec.ok {
            return Err(Error::RemoteError {
                peer: r,
                what: format!("{what} failed on that rank (its own error says why)"),
            });
        }
        if rec.fingerprint != mine {
            return Err(usage(format!(
                "{what}: rank {r} passed other requirements than this rank; every rank must pass the same"
            )));
        }
    }
    Ok(recs)
}

/// The bytes a window holds on every rank when every rank registered it with
/// `NCCL_WIN_COLL_SYMMETRIC` (the least of their sizes), else `None`: copy-engine calls and
/// kernels write straight into it only then, so every rank's view of it is the same.
pub(crate) fn symmetric_len(recs: &[Record]) -> Option<u64> {
    if recs.iter().all(|r| r.symmetric) {
        recs.iter().map(|r| r.size).min()
    } else {
        None
    }
}

/// The peers' shared memory as this rank addresses it (`ptrs[r]`: rank r's buffer, this rank's
/// own included), and the IPC mappings that keep it open.
#[derive(Debug)]
pub(crate) struct Mapped {
    pub ptrs: Vec<u64>,
    _open: Vec<PeerRegion>,
}

impl Mapped {
    /// Only this rank's buffer (a window on a communicator with peers on other hosts).
    pub(crate) fn own(ptr: u64) -> Mapped {
        Mapped { ptrs: vec![ptr], _open: Vec::new() }
    }
}

/// Opens every other rank's record: by address for a rank of this process (enabling peer
/// access between the two GPUs), through its IPC handle for another process's.
pub(crate) fn map_peers(ctx: &Arc<CudaContext>, me: usize, recs: &[Record]) -> Result<Mapped> {
    let pid = std::process::id();
    let mut ptrs = Vec::with_capacity(recs.len());
    let mut open = Vec::new();
    for (r, rec) in recs.iter().enumerate() {
        if r == me || rec.pid == pid {
            if r != me {
                let theirs = device::context(rec.device as usize).map_err(|e| sys("open a peer's GPU", e))?;
                staging::enable_peer_access(ctx, &theirs)
                    .map_err(|e| sys("enable peer access to a GPU of this process", e))?;
            }
            ptrs.push(rec.base + rec.offset);
        } else {
            let p = PeerRegion::open(ctx, &rec.handle)
                .map_err(|e| sys(&format!("open rank {r}'s memory (cuIpcOpenMemHandle)"), e))?;
            ptrs.push(p.ptr() + rec.offset);
            open.push(p);
        }
    }
    Ok(Mapped { ptrs, _open: open })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip() {
        let r = Record {
            ok: true,
            pid: 42,
            device: 1,
            base: 1 << 40,
            offset: 4096,
            fingerprint: 7,
            handle: [9; 64],
            size: 3 << 30,
            symmetric: true,
        };
        let b = r.encode();
        assert_eq!(Record::decode(0, &b).unwrap(), r);
        let plain = Record { symmetric: false, ..r };
        assert_eq!(Record::decode(0, &plain.encode()).unwrap(), plain);
        assert!(Record::decode(3, &b[..10]).unwrap_err().to_string().contains("rank 3"));
        assert!(!Record::decode(0, &Record::failed().encode()).unwrap().ok);
    }

    #[test]
    fn a_failed_or_different_rank_stops_everyone() {
        let ok = Record { ok: true, fingerprint: 5, pid: 1, ..Record::failed() };
        let all = vec![ok.encode(), Record::failed().encode()];
        let e = records(&all, 0, "ncclCommWindowRegister").unwrap_err();
        assert_eq!(e.kind(), occl::ErrorKind::RemoteError);
        assert!(e.to_string().contains("ncclCommWindowRegister"), "{e}");
        let other = Record { fingerprint: 6, ..ok };
        let e = records(&[ok.encode(), other.encode()], 0, "ncclDevCommCreate").unwrap_err();
        assert!(e.to_string().contains("rank 1 passed other requirements"), "{e}");
        assert_eq!(records(&[ok.encode(), ok.encode()], 1, "x").unwrap().len(), 2);
    }

    #[test]
    fn a_window_is_symmetric_only_when_every_rank_says_so() {
        let sym = |size| Record { ok: true, size, symmetric: true, ..Record::failed() };
        assert_eq!(symmetric_len(&[sym(4096), sym(8192), sym(8192)]), Some(4096), "the least size");
        assert_eq!(symmetric_len(&[sym(4096), Record { symmetric: false, ..sym(4096) }]), None);
    }
}
