//! How a kernel that talks to peers is launched on compute capability 9.0 and later: in a memory
//! synchronization domain of its own, and in thread-block clusters. NCCL launches its kernels
//! both ways (`NCCL_MEM_SYNC_DOMAIN`, default 1; `NCCL_CGA_CLUSTER_SIZE` or
//! `ncclConfig_t.cgaClusterSize`, default 4), and so does occl, for every kernel that talks to
//! peers; its local kernels (reductions, copies, the clock probe) launch plainly.
//!
//! - **Domain.** On Hopper a system-scope fence waits for the outstanding writes of every kernel
//!   of its domain on the GPU, not only its own: in the default domain, each release of a
//!   collective's step (a `st.release.sys` before it publishes a slot) also waits for the stores
//!   of a model's kernels running beside it, so the collective holds its SMs longer for the same
//!   bytes. Kernels launched in the remote domain fence only against each other. Stream order
//!   between kernels holds across domains: a kernel still sees every write of the work before it
//!   on its stream.
//! - **Clusters.** A cluster's blocks are placed together on one processing cluster (GPC) of SMs,
//!   the clusters spread over the GPCs. A model's matrix multiplies run as clusters too (cuBLAS'
//!   sm90 GEMMs in pairs of SMs): blocks taken four to a GPC leave whole pairs to them, where
//!   single blocks may leave a lone SM in a GPC that no pair can use. On an H200, 24 SMs held for
//!   1 ms every 2 ms cost a GEMM beside them 0.85× as much in clusters of 4 as plain, and occl's
//!   own kernels move as much or slightly more in clusters (`bench/baselines/gpu-overlap.md`
//!   run 15). No occl kernel relies on a cluster's shared memory or barrier: a cluster is
//!   placement alone.

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

/// Thread blocks per cluster of a communication kernel (NCCL's CGA cluster size): 0 or 1 launch
/// no cluster. A launch whose grid it does not divide runs without clusters, as NCCL's does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClusterSize(u32);

impl Default for ClusterSize {
    /// NCCL's default on compute capability 9.0 and later.
    fn default() -> Self {
        ClusterSize(4)
    }
}

impl ClusterSize {
    /// The largest cluster every device with clusters runs (CUDA's portable size); NCCL's
    /// limit too.
    pub const MAX: u32 = 8;

    /// No clusters.
    pub const NONE: ClusterSize = ClusterSize(0);

    /// `size` blocks per cluster, at most [`ClusterSize::MAX`] (larger sizes are cut to it, as
    /// NCCL cuts `NCCL_CGA_CLUSTER_SIZE`).
    pub fn new(size: u32) -> ClusterSize {
        if size > Self::MAX {
            tracing::debug!("occl: a cluster of {size} thread blocks is cut to {}", Self::MAX);
        }
        ClusterSize(size.min(Self::MAX))
    }

    pub fn get(self) -> u32 {
        self.0
    }

    /// `NCCL_CGA_CLUSTER_SIZE`'s value, or what is wrong with it (for the caller's error).
    pub fn parse(v: &str) -> std::result::Result<ClusterSize, String> {
        v.trim().parse::<u32>().map(ClusterSize::new).map_err(|_| {
            format!(
                "NCCL_CGA_CLUSTER_SIZE={v}: thread blocks per cluster, 0 to {} (0: none; {} unless set)",
                Self::MAX,
                ClusterSize::default().0
            )
        })
    }

    /// The cluster a launch of `grid` blocks runs in: `None` when it runs without.
    fn for_grid(self, grid: u32) -> Option<u32> {
        (self.0 > 1 && grid.is_multiple_of(self.0)).then_some(self.0)
    }
}

/// How this device's communication kernels launch: `None` fields where the device has no
/// domains or clusters (before compute capability 9.0).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PeerLaunch {
    pub domain: Option<SyncDomain>,
    pub cluster: Option<ClusterSize>,
}

impl PeerLaunch {
    /// The defaults of a device of compute capability `major`.x.
    pub fn for_device(major: i32) -> PeerLaunch {
        let hopper = major >= 9;
        PeerLaunch {
            domain: hopper.then_some(SyncDomain::default()),
            cluster: hopper.then_some(ClusterSize::default()),
        }
    }

    /// These launches with `domain` and `cluster`, where the device has them.
    pub fn with(self, domain: SyncDomain, cluster: ClusterSize) -> PeerLaunch {
        PeerLaunch { domain: self.domain.map(|_| domain), cluster: self.cluster.map(|_| cluster) }
    }
}

/// Whether the driver has `cuLaunchKernelEx` (CUDA 11.8 and later); looked up once, as
/// cudarc's own lookup panics on a missing symbol.
fn has_launch_ex() -> bool {
    static HAS: OnceLock<bool> = OnceLock::new();
    // SAFETY: libcuda is loaded (a context exists); the symbol is only looked up.
    *HAS.get_or_init(|| unsafe { sys::culib().get::<*const ()>(b"cuLaunchKernelEx").is_ok() })
}

/// A launch's attributes, on the stack (every collective launch builds them).
struct Attrs {
    a: [sys::CUlaunchAttribute; 3],
    n: usize,
}

impl Attrs {
    fn none() -> Attrs {
        // SAFETY: an all-zero attribute is a valid value of the C struct; only the first `n` are
        // passed on.
        Attrs { a: unsafe { std::mem::zeroed() }, n: 0 }
    }

    fn push(&mut self, a: sys::CUlaunchAttribute) {
        self.a[self.n] = a;
        self.n += 1;
    }
}

impl std::ops::Deref for Attrs {
    type Target = [sys::CUlaunchAttribute];
    fn deref(&self) -> &Self::Target {
        &self.a[..self.n]
    }
}

/// The launch attributes of `how` for a grid of `grid` blocks.
fn attributes(how: PeerLaunch, grid: u32) -> Attrs {
    let mut attrs = Attrs::none();
    let attr = |id, set: &dyn Fn(&mut sys::CUlaunchAttributeValue)| {
        // SAFETY: an all-zero attribute is a valid value of the C union; `set` writes the field
        // that `id` names.
        let mut a: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
        a.id = id;
        set(&mut a.value);
        a
    };
    use sys::CUlaunchAttributeID as Id;
    if how.domain == Some(SyncDomain::Remote) {
        attrs.push(attr(Id::CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN, &|v| {
            v.memSyncDomain = sys::CUlaunchMemSyncDomain::CU_LAUNCH_MEM_SYNC_DOMAIN_REMOTE
        }));
    }
    if let Some(size) = how.cluster.and_then(|c| c.for_grid(grid)) {
        attrs.push(attr(Id::CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION, &|v| {
            v.clusterDim.x = size;
            v.clusterDim.y = 1;
            v.clusterDim.z = 1;
        }));
        attrs.push(attr(Id::CU_LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE, &|v| {
            v.clusterSchedulingPolicyPreference = sys::CUclusterSchedulingPolicy::CU_CLUSTER_SCHEDULING_POLICY_SPREAD
        }));
    }
    attrs
}

/// Enqueues `f` with its one argument `arg` (a struct the kernel takes by value) on `stream`,
/// launched as `how` says where the driver can (`cuLaunchKernelEx`); else as a plain launch.
///
/// # Safety
/// `arg` is what `f` takes, and what it names stays valid until the stream has run it.
pub unsafe fn launch<T: DeviceRepr>(
    stream: &CudaStream,
    f: &CudaFunction,
    arg: &T,
    cfg: LaunchConfig,
    how: PeerLaunch,
    call: &'static str,
) -> Result<()> {
    stream.context().bind_to_thread().map_err(crate::error::driver("cuCtxSetCurrent"))?;
    let mut params = [arg as *const T as *mut c_void];
    let (g, b) = (cfg.grid_dim, cfg.block_dim);
    let mut attrs = if has_launch_ex() { attributes(how, g.0) } else { Attrs::none() };
    if attrs.is_empty() {
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
    let config = sys::CUlaunchConfig {
        gridDimX: g.0,
        gridDimY: g.1,
        gridDimZ: g.2,
        blockDimX: b.0,
        blockDimY: b.1,
        blockDimZ: b.2,
        sharedMemBytes: cfg.shared_mem_bytes,
        hStream: stream.cu_stream(),
        attrs: attrs.a.as_mut_ptr(),
        numAttrs: attrs.n as u32,
    };
    // SAFETY: as above; `config` and `attrs` outlive the call, which copies them.
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

    #[test]
    fn the_cluster_size_is_nccls_variable() {
        assert_eq!(ClusterSize::default().get(), 4, "NCCL's default on sm90");
        assert_eq!(ClusterSize::parse(" 2").unwrap().get(), 2);
        assert_eq!(ClusterSize::parse("0").unwrap(), ClusterSize::NONE);
        assert_eq!(ClusterSize::parse("64").unwrap().get(), ClusterSize::MAX, "cut to 8, as NCCL does");
        for bad in ["-1", "four", ""] {
            let e = ClusterSize::parse(bad).unwrap_err();
            assert!(e.contains("NCCL_CGA_CLUSTER_SIZE") && e.contains("0 to 8"), "{bad}: {e}");
        }
    }

    #[test]
    fn a_grid_the_cluster_does_not_divide_launches_without_one() {
        let four = ClusterSize::new(4);
        assert_eq!(four.for_grid(24), Some(4));
        assert_eq!(four.for_grid(16), Some(4));
        assert_eq!(four.for_grid(6), None);
        assert_eq!(four.for_grid(1), None);
        assert_eq!(ClusterSize::new(1).for_grid(24), None, "a cluster of one is no cluster");
        assert_eq!(ClusterSize::NONE.for_grid(24), None);
    }

    #[test]
    fn the_attributes_name_what_the_device_has() {
        use sys::CUlaunchAttributeID as Id;
        let ids = |how, grid| attributes(how, grid).iter().map(|a| a.id).collect::<Vec<_>>();
        let hopper = PeerLaunch::for_device(9);
        assert_eq!(
            ids(hopper, 24),
            [
                Id::CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN,
                Id::CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION,
                Id::CU_LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE
            ]
        );
        let a = attributes(hopper, 24);
        // SAFETY: the field the id names.
        assert_eq!(unsafe { (a[1].value.clusterDim.x, a[1].value.clusterDim.y) }, (4, 1));
        assert_eq!(ids(hopper, 6), [Id::CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN]);
        assert!(ids(hopper.with(SyncDomain::Default, ClusterSize::NONE), 24).is_empty());
        assert!(ids(PeerLaunch::for_device(8), 24).is_empty(), "an A100 has neither");
        assert!(ids(PeerLaunch::for_device(8).with(SyncDomain::Remote, ClusterSize::new(4)), 24).is_empty());
    }
}
