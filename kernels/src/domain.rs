//! The memory synchronization domain a communication kernel runs in (compute capability 9.0
//! and later). On Hopper a system-scope fence waits for the outstanding writes of every kernel
//! of its domain on the GPU, not only its own: in the default domain, each release of a
//! collective's step (a `st.release.sys` before it publishes a slot) also waits for the stores
//! of a model's kernels running beside it, so the collective holds its SMs longer for the same
//! bytes. Kernels launched in the remote domain fence only against each other. NCCL launches
//! its kernels there (`NCCL_MEM_SYNC_DOMAIN`, default 1), and so does occl, for every kernel
//! that talks to peers; its local kernels (reductions, copies, the clock probe) stay in the
//! default one. Stream order between kernels holds across domains: a kernel still sees every
//! write of the work before it on its stream.

use crate::error::{check, Result};
use cudarc::driver::{sys, CudaFunction, CudaStream, DeviceRepr, LaunchConfig};
use std::ffi::c_void;
use std::sync::OnceLock;

/// Which domain occl's communication kernels run in (`NCCL_MEM_SYNC_DOMAIN`: 0 or 1, as
/// CUDA numbers `cudaLaunchMemSyncDomain`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SyncDomain {
    /// CUDA's default domain, shared with the application's kernels.
    Default,
    /// The remote domain, NCCL's: fences wait only for the kernels of that domain.
    #[default]
    Remote,
}

impl SyncDomain {
    /// `NCCL_MEM_SYNC_DOMAIN`'s value, or what is wrong with it (for the caller's error).
    pub fn parse(v: &str) -> std::result::Result<SyncDomain, String> {
        match v.trim() {
            "0" => Ok(SyncDomain::Default),
            "1" => Ok(SyncDomain::Remote),
            other => Err(format!(
                "NCCL_MEM_SYNC_DOMAIN={other}: 0 (CUDA's default domain) or 1 (the remote domain, the default)"
            )),
        }
    }
}

/// Whether the driver has `cuLaunchKernelEx` (CUDA 11.8 and later); looked up once, as
/// cudarc's own lookup panics on a missing symbol.
fn has_launch_ex() -> bool {
    static HAS: OnceLock<bool> = OnceLock::new();
    // SAFETY: libcuda is loaded (a context exists); the symbol is only looked up.
    *HAS.get_or_init(|| unsafe { sys::culib().get::<*const ()>(b"cuLaunchKernelEx").is_ok() })
}

/// Enqueues `f` with its one argument `arg` (a struct the kernel takes by value) on `stream`,
/// in `domain` where the device has domains (`domain` is `None` where it has not) and the
/// driver can name one; else as a plain launch.
///
/// # Safety
/// `arg` is what `f` takes, and what it names stays valid until the stream has run it.
pub(crate) unsafe fn launch<T: DeviceRepr>(
    stream: &CudaStream,
    f: &CudaFunction,
    arg: &T,
    cfg: LaunchConfig,
    domain: Option<SyncDomain>,
    call: &'static str,
) -> Result<()> {
    stream.context().bind_to_thread().map_err(crate::error::driver("cuCtxSetCurrent"))?;
    let mut params = [arg as *const T as *mut c_void];
    let (g, b) = (cfg.grid_dim, cfg.block_dim);
    let remote = domain == Some(SyncDomain::Remote) && has_launch_ex();
    if !remote {
        // SAFETY: the caller's promise about `arg`; the function and stream are live handles.
        return check(call, unsafe {
            sys::cuLaunchKernel(
                f.cu_function(),
                g.0,
                g.1,
                g.2,
                b.0,
                b.1,
                b.2,
                cfg.shared_mem_bytes,
                stream.cu_stream(),
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        });
    }
    // SAFETY: an all-zero attribute is a valid value of the C union; the field set is the one
    // the attribute's id names.
    let mut attr: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
    attr.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN;
    attr.value.memSyncDomain = sys::CUlaunchMemSyncDomain::CU_LAUNCH_MEM_SYNC_DOMAIN_REMOTE;
    let config = sys::CUlaunchConfig {
        gridDimX: g.0,
        gridDimY: g.1,
        gridDimZ: g.2,
        blockDimX: b.0,
        blockDimY: b.1,
        blockDimZ: b.2,
        sharedMemBytes: cfg.shared_mem_bytes,
        hStream: stream.cu_stream(),
        attrs: &mut attr,
        numAttrs: 1,
    };
    // SAFETY: as above; `config` and `attr` outlive the call, which copies them.
    check(call, unsafe { sys::cuLaunchKernelEx(&config, f.cu_function(), params.as_mut_ptr(), std::ptr::null_mut()) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_domain_is_nccls_variable() {
        assert_eq!(SyncDomain::default(), SyncDomain::Remote, "NCCL's default");
        assert_eq!(SyncDomain::parse("0").unwrap(), SyncDomain::Default);
        assert_eq!(SyncDomain::parse(" 1").unwrap(), SyncDomain::Remote);
        for bad in ["2", "remote", ""] {
            let e = SyncDomain::parse(bad).unwrap_err().to_string();
            assert!(e.contains("NCCL_MEM_SYNC_DOMAIN") && e.contains("0 (CUDA's default domain)"), "{bad}: {e}");
        }
    }
}
