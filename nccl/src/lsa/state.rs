//! The device-API memory a communicator holds: its live device windows and device
//! communicators, found again by the address the caller was given.

use super::mem::{DevMem, Mapped};
use occl::cuda::kernels::ipc::DeviceRegion;
use occl::cuda::WindowId;

/// A window on device memory: its descriptor (whose address is the caller's `ncclWindow_t`)
/// and the peers' buffers opened for it.
#[derive(Debug)]
pub(crate) struct Window {
    pub desc: DevMem,
    /// Its entry among the device communicator's symmetric windows, which copy-engine calls
    /// write through: removed (`devapi::deregister_window`) before the peers are unmapped.
    pub ce: Option<WindowId>,
    /// Held open while the window lives.
    pub _peers: Mapped,
}

/// A device communicator's memory: this rank's resource buffer (zeroed, shared), the
/// descriptor of every rank's (its address is `ncclDevComm.resourceWindow`) and the mappings.
#[derive(Debug)]
pub(crate) struct DevCommMem {
    pub desc: DevMem,
    /// Held open, and this rank's buffer held, while the device communicator lives.
    pub _peers: Mapped,
    pub _region: DeviceRegion,
}

#[derive(Debug, Default)]
pub(crate) struct State {
    windows: Vec<Window>,
    comms: Vec<DevCommMem>,
}

impl State {
    pub(crate) fn add_window(&mut self, w: Window) {
        self.windows.push(w);
    }

    /// The window whose descriptor is at `addr`, removed.
    pub(crate) fn take_window(&mut self, addr: u64) -> Option<Window> {
        let i = self.windows.iter().position(|w| w.desc.ptr() == addr)?;
        Some(self.windows.swap_remove(i))
    }

    pub(crate) fn add_comm(&mut self, c: DevCommMem) {
        self.comms.push(c);
    }

    /// The device communicator whose resource window is at `addr`, removed.
    pub(crate) fn take_comm(&mut self, addr: u64) -> Option<DevCommMem> {
        let i = self.comms.iter().position(|c| c.desc.ptr() == addr)?;
        Some(self.comms.swap_remove(i))
    }
}
