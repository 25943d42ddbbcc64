//! The kernel module of one device: built (or read from the cache) at first use for the device's
//! architecture, loaded, and its functions resolved with the grid each can fill.

use crate::cache::{self, Cache, Key};
use crate::device::DeviceInfo;
use crate::dtype::{DataType, RedOp};
use crate::error::{driver, Error, Result};
use crate::nvrtc;
use cudarc::driver::{CudaContext, CudaFunction, CudaModule};
use cudarc::nvrtc::Ptx;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The CUDA C sources, in the order they are joined into one program.
pub const SOURCES: [(&str, &str); 3] = [
    ("common.cuh", include_str!("../cuda/common.cuh")),
    ("reduce.cu", include_str!("../cuda/reduce.cu")),
    ("copy.cu", include_str!("../cuda/copy.cu")),
];

/// Threads per block of every kernel (their `__launch_bounds__`).
pub(crate) const THREADS: u32 = 512;
/// 16-byte packs each thread moves per loop turn (`OCCL_UNROLL` in the sources).
pub(crate) const UNROLL: u32 = 2;

/// The whole program: the sources joined, each under a `#line` so NVRTC's log names its file.
pub fn source() -> String {
    let mut s = String::new();
    for (name, text) in SOURCES {
        s.push_str(&format!("#line 1 \"{name}\"\n"));
        s.push_str(text);
        s.push('\n');
    }
    s
}

/// NVRTC options for `arch` (`sm_XY`). No contraction: results equal the host reference exactly.
pub fn options(arch: &str) -> Vec<String> {
    vec![format!("--gpu-architecture={arch}"), "--fmad=false".to_string(), "--std=c++17".to_string()]
}

/// Compiles the kernels for `arch` (`sm_XY`); needs NVRTC but no GPU.
pub fn compile(arch: &str) -> Result<Vec<u8>> {
    nvrtc::compile_cubin(&source(), "occl-kernels.cu", arch, &options(arch))
}

pub fn reduce_name(dt: DataType, op: RedOp) -> String {
    format!("occl_reduce_{}_{}", dt.short_name(), op.name())
}

pub fn scale_name(dt: DataType) -> String {
    format!("occl_scale_{}", dt.short_name())
}

pub const COPY_NAME: &str = "occl_copy";

/// How the module was obtained.
#[derive(Debug, Clone)]
pub struct LoadReport {
    pub device: DeviceInfo,
    pub arch: String,
    pub nvrtc: (i32, i32),
    /// Time NVRTC took, when it ran (`None`: the binary came from the cache).
    pub compile_time: Option<Duration>,
    /// The cache file used or written, if any.
    pub cache_file: Option<PathBuf>,
    pub cubin_bytes: usize,
}

/// A kernel and the most blocks that run at once on the whole device.
#[derive(Debug)]
pub(crate) struct Func {
    pub(crate) f: CudaFunction,
    pub(crate) max_blocks: u32,
}

/// The loaded kernels of one device (context).
#[derive(Debug)]
pub struct Kernels {
    pub(crate) ctx: Arc<CudaContext>,
    /// Indexed by `DataType as usize * 4 + RedOp::index()`; `None` where the device lacks the type.
    pub(crate) reduce: Vec<Option<Func>>,
    pub(crate) scale: Vec<Option<Func>>,
    pub(crate) copy: Func,
    report: LoadReport,
    _module: Arc<CudaModule>,
}

impl Kernels {
    /// Loads the kernels for `ctx`'s device, through the cache in [`cache::default_dir`]. NVRTC
    /// must be present even when the cache holds the binary: its version is part of the key.
    pub fn load(ctx: &Arc<CudaContext>) -> Result<Kernels> {
        Self::load_with(ctx, cache::default_dir().map(Cache::new).as_ref())
    }

    /// As [`Kernels::load`], with the given cache (`None`: always compile).
    pub fn load_with(ctx: &Arc<CudaContext>, cache: Option<&Cache>) -> Result<Kernels> {
        let (module, report) = build_module(ctx, cache, "occl-kernels.cu", &source())?;
        let device = report.device.clone();
        let func = |name: &str| function(&module, &device, name);
        let mut reduce = Vec::with_capacity(DataType::ALL.len() * RedOp::ALL.len());
        let mut scale = Vec::with_capacity(DataType::ALL.len());
        for dt in DataType::ALL {
            let present = !dt.is_fp8() || device.has_fp8();
            for op in RedOp::ALL {
                reduce.push(if present { Some(func(&reduce_name(dt, op))?) } else { None });
            }
            scale.push(if present { Some(func(&scale_name(dt))?) } else { None });
        }
        let copy = func(COPY_NAME)?;
        Ok(Kernels { ctx: ctx.clone(), reduce, scale, copy, report, _module: module })
    }

    pub fn report(&self) -> &LoadReport {
        &self.report
    }

    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// Whether the device has kernels for `dt` (the fp8 ones need sm_89 or later).
    pub fn supports(&self, dt: DataType) -> bool {
        self.scale[dt as usize].is_some()
    }

    pub(crate) fn unsupported(&self, dt: DataType) -> Error {
        Error::Unsupported {
            what: format!("{} kernels", dt.short_name()),
            needs: "sm_89 or later",
            arch: self.report.arch.clone(),
        }
    }
}

/// Builds (or reads from `cache`) the program `src` for `ctx`'s device and loads it. NVRTC must
/// be present even when the cache holds the binary: its version is part of the key.
pub(crate) fn build_module(
    ctx: &Arc<CudaContext>,
    cache: Option<&Cache>,
    name: &str,
    src: &str,
) -> Result<(Arc<CudaModule>, LoadReport)> {
    let device = DeviceInfo::of(ctx)?;
    let arch = device.arch();
    let nvrtc_version = nvrtc::version()?;
    let supported = nvrtc::supported_archs()?;
    if !supported.contains(&(device.cc.0 * 10 + device.cc.1)) {
        return Err(Error::ArchUnsupported {
            arch,
            nvrtc: format!("{}.{}", nvrtc_version.0, nvrtc_version.1),
            supported: supported.iter().map(|a| format!("sm_{a}")).collect::<Vec<_>>().join(" "),
        });
    }
    let opts = options(&arch);
    let key = Key { source: src, options: &opts, arch: &arch, nvrtc: nvrtc_version };

    let mut cache_file = None;
    let mut module = None;
    if let Some(bin) = cache.and_then(|c| c.load(&key)) {
        let n = bin.len();
        match ctx.load_module(Ptx::from_binary(bin)) {
            Ok(m) => {
                cache_file = cache.map(|c| c.path(&key));
                module = Some((m, n));
            }
            Err(e) => tracing::warn!(target: "occl_kernels", "the cached {name} did not load ({e:?}); rebuilding"),
        }
    }
    let mut compile_time = None;
    let (module, cubin_bytes) = match module {
        Some(m) => m,
        None => {
            let t = Instant::now();
            let bin = nvrtc::compile_cubin(src, name, &arch, &opts)?;
            compile_time = Some(t.elapsed());
            tracing::info!(target: "occl_kernels", %arch, ms = t.elapsed().as_millis() as u64, bytes = bin.len(), "compiled {name} with NVRTC");
            if let Some(c) = cache {
                match c.store(&key, &bin) {
                    Ok(p) => cache_file = Some(p),
                    Err(e) => {
                        tracing::warn!(target: "occl_kernels", dir = %c.dir().display(), "cannot write the kernel cache: {e}")
                    }
                }
            }
            let n = bin.len();
            (ctx.load_module(Ptx::from_binary(bin)).map_err(driver("cuModuleLoadData"))?, n)
        }
    };
    Ok((module, LoadReport { device, arch, nvrtc: nvrtc_version, compile_time, cache_file, cubin_bytes }))
}

/// Resolves `name` in `module` with the blocks of `THREADS` threads that fit on the device.
pub(crate) fn function(module: &Arc<CudaModule>, device: &DeviceInfo, name: &str) -> Result<Func> {
    let f = module.load_function(name).map_err(driver("cuModuleGetFunction"))?;
    let per_sm = f
        .occupancy_max_active_blocks_per_multiprocessor(THREADS, 0, None)
        .map_err(driver("cuOccupancyMaxActiveBlocksPerMultiprocessor"))?;
    Ok(Func { f, max_blocks: per_sm.max(1) * device.sms })
}
