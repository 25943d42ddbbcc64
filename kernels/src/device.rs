//! Finding the driver and the devices, with the reason when there is none (so that GPU tests
//! and tools can say plainly why they skipped).

use crate::error::{driver, Error, Result};
use cudarc::driver::{sys, CudaContext};
use std::sync::Arc;

/// Whether libcuda can be opened. cudarc panics on a missing library, so every driver call in
/// this crate is behind this check.
pub fn driver_available() -> bool {
    // SAFETY: only tries to open the library.
    unsafe { sys::is_culib_present() }
}

/// The number of CUDA devices; an error says why there are none usable.
pub fn device_count() -> Result<usize> {
    if !driver_available() {
        return Err(Error::NoDriver);
    }
    let n = CudaContext::device_count().map_err(|e| Error::NoDevice(format!("{e:?} from cuInit/cuDeviceGetCount")))?;
    match usize::try_from(n) {
        Ok(0) | Err(_) => Err(Error::NoDevice("0 devices".into())),
        Ok(n) => Ok(n),
    }
}

/// The primary context of device `ordinal`.
pub fn context(ordinal: usize) -> Result<Arc<CudaContext>> {
    let n = device_count()?;
    if ordinal >= n {
        return Err(Error::InvalidArgument(format!("device {ordinal} requested; {n} present")));
    }
    CudaContext::new(ordinal).map_err(driver("cuDevicePrimaryCtxRetain"))
}

/// What the kernels need to know of a device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    pub ordinal: usize,
    pub name: String,
    /// Compute capability (major, minor).
    pub cc: (u32, u32),
    pub sms: u32,
    pub memory: usize,
}

impl DeviceInfo {
    pub fn of(ctx: &Arc<CudaContext>) -> Result<DeviceInfo> {
        let (major, minor) = ctx.compute_capability().map_err(driver("cuDeviceGetAttribute(compute capability)"))?;
        let sms = ctx
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_err(driver("cuDeviceGetAttribute(multiprocessor count)"))?;
        Ok(DeviceInfo {
            ordinal: ctx.ordinal(),
            name: ctx.name().map_err(driver("cuDeviceGetName"))?,
            cc: (u32::try_from(major).unwrap_or(0), u32::try_from(minor).unwrap_or(0)),
            sms: u32::try_from(sms).unwrap_or(1).max(1),
            memory: ctx.total_mem().map_err(driver("cuDeviceTotalMem"))?,
        })
    }

    /// The real architecture NVRTC builds for: `sm_90` on Hopper.
    pub fn arch(&self) -> String {
        format!("sm_{}{}", self.cc.0, self.cc.1)
    }

    /// fp8 conversions exist from sm_89 on.
    pub fn has_fp8(&self) -> bool {
        self.cc >= (8, 9)
    }
}
