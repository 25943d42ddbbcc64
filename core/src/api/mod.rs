//! The public calls of a communicator, top of the pipeline: each checks its arguments once
//! and builds an `Op`, which `launch` runs now or keeps for the open group, and `exec` runs.
//! Registration and leaving are here too: both must refuse to run inside an open group or
//! drop what the group holds of this communicator.

mod coll;
mod group;
mod vector;

pub use group::{group, Group};

use crate::comm::Comm;
use crate::config::TransportKind;
use crate::dtype::Element;
use crate::error::Result;
use crate::launch;

impl Comm {
    /// Registers `buf` with the communicator (NCCL's `ncclCommWindowRegister`). Collective: every
    /// rank registers its buffer, in the same order. When every rank can reach every other's
    /// buffer — one host over shm, and either thread ranks of one process or buffers from
    /// [`HostBuf`](crate::HostBuf) — the window is shared ([`Handle::shared`](crate::Handle::shared))
    /// and all-reduce and all-gather whose send and recv buffers both lie in shared windows read
    /// the peers' buffers directly (one copy, not two through the FIFOs). Every rank must then
    /// pass buffers at the same offsets of its windows, and the buffers stay registered until
    /// `deregister`. Otherwise the window is inactive and the calls take the normal path.
    pub fn register<T: Element>(&self, buf: &[T]) -> Result<crate::Handle> {
        launch::refuse_borrowed("register")?;
        let shm_only = (0..self.nranks).all(|p| p == self.rank || self.transport_to(p) == Some(TransportKind::Shm));
        let span = (buf.as_ptr() as usize, std::mem::size_of_val(buf));
        let comm = self.comm_id;
        self.reg.register(comm, self.rank, &self.pids, span, shm_only, |mine| self.boot_all_gather(mine))
    }

    /// Removes a window that `register` returned. Collective, in the same order on every rank.
    /// Afterwards collectives on the buffer take the normal path.
    pub fn deregister(&self, handle: crate::Handle) -> Result<()> {
        launch::refuse_borrowed("deregister")?;
        self.reg.deregister(self.comm_id, handle, |mine| self.boot_all_gather(mine))
    }

    /// Leaves the communicator: peers learn that this rank is done, tcp sends are flushed, and
    /// every resource is released.
    pub fn destroy(self) -> Result<()> {
        launch::forget(&self);
        self.shutdown();
        Ok(())
    }
}

impl Drop for Comm {
    fn drop(&mut self) {
        launch::forget(self);
        self.shutdown();
    }
}
