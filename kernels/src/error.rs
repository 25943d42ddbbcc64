//! The crate's one error type.

use cudarc::driver::DriverError;

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// libcuda could not be opened: no NVIDIA driver on this machine.
    #[error("no CUDA driver: libcuda.so could not be loaded (no NVIDIA driver on this machine)")]
    NoDriver,
    /// The driver loaded but reports no device.
    #[error("no CUDA device: the driver reports {0}")]
    NoDevice(String),
    /// libnvrtc could not be opened.
    #[error(
        "no NVRTC: libnvrtc.so could not be loaded (install the CUDA toolkit or the nvidia-cuda-nvrtc wheel and put its lib/ on LD_LIBRARY_PATH)"
    )]
    NoNvrtc,
    #[error("CUDA driver call {call} failed: {source:?}")]
    Driver {
        call: &'static str,
        #[source]
        source: DriverError,
    },
    #[error("NVRTC call {call} failed: {code}")]
    Nvrtc { call: &'static str, code: String },
    /// The kernel source did not compile; `log` is NVRTC's own.
    #[error("NVRTC could not compile {name} for {arch} (options {options:?}):\n{log}")]
    Compile { name: String, arch: String, options: Vec<String>, log: String },
    #[error("NVRTC {nvrtc} cannot build for {arch}; it supports {supported}")]
    ArchUnsupported { arch: String, nvrtc: String, supported: String },
    /// A kernel that this device's architecture lacks (fp8 needs sm_89 or later).
    #[error("{what} needs {needs}; this device is {arch}")]
    Unsupported { what: String, needs: &'static str, arch: String },
    /// A profiled launch's record (`phases`) that cannot be read.
    #[error("the phase record of channel {channel} is {what}")]
    PhaseRecord { channel: u32, what: &'static str },
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// A driver entry point this driver lacks (an older driver than the call needs).
    #[error("the CUDA driver has no {call} (it needs a driver of {needs} or later)")]
    MissingEntry { call: &'static str, needs: &'static str },
    /// A kernel cache directory that could not be written (`prebuild`).
    #[error("cannot write the kernel cache {}: {source} (a directory of this user that others cannot write)", dir.display())]
    CacheWrite { dir: std::path::PathBuf, source: std::io::Error },
}

/// Wraps a driver error with the call that returned it.
pub(crate) fn driver(call: &'static str) -> impl FnOnce(DriverError) -> Error {
    move |source| Error::Driver { call, source }
}

/// A raw driver call's result as this crate's error, naming the call.
pub(crate) fn check(call: &'static str, r: cudarc::driver::sys::CUresult) -> Result<()> {
    if r == cudarc::driver::sys::CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(Error::Driver { call, source: DriverError(r) })
    }
}
