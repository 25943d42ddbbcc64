//! The communicator's symmetric windows: buffers every rank registered together with
//! `NCCL_WIN_COLL_SYMMETRIC` (occl-nccl's `ncclCommWindowRegister`), with every rank's buffer
//! mapped here. That flag is the user's promise that a call's buffers lie at the same offset of
//! every rank's window, so a call whose output lies in one writes each peer's part straight to
//! the same offset of that peer's buffer: on the copy engines (`ce/`) or from the kernels'
//! windowed mode (`ops.rs`, `kernel_windows`).

use super::kernels::coll::MAX_RANKS;
use crate::error::{Error, Result};
use crate::sync::lock;
use std::sync::Mutex;

/// A registered window, named for its removal.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct WindowId(u64);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Window {
    id: WindowId,
    /// This rank.
    me: usize,
    /// The bytes every rank's buffer holds (the least of theirs).
    len: u64,
    /// Every rank's buffer as this rank addresses it (this rank's own: `base`).
    bases: [u64; MAX_RANKS],
}

/// The window a span of this rank's memory lies in: every rank's buffer of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct InWindow {
    bases: [u64; MAX_RANKS],
    me: usize,
}

impl InWindow {
    /// The address in rank `r`'s buffer of this rank's `addr` (inside the span): the same
    /// offset, by symmetry.
    pub(crate) fn at(&self, r: usize, addr: u64) -> u64 {
        self.bases[r] + (addr - self.bases[self.me])
    }
}

/// The live windows, added and removed by the layer that maps them and read by every call.
#[derive(Debug, Default)]
pub(crate) struct Windows {
    live: Mutex<(u64, Vec<Window>)>,
}

impl Windows {
    /// Adds a window of `len` bytes whose buffer on rank `r` is mapped at `bases[r]`, this
    /// rank's (`me`) included.
    pub(crate) fn add(&self, me: usize, bases: &[u64], len: u64) -> Result<WindowId> {
        if bases.is_empty() || bases.len() > MAX_RANKS || me >= bases.len() {
            return Err(Error::internal(format!("a window of {} ranks, this one rank {me}", bases.len())));
        }
        if bases[me].checked_add(len).is_none() {
            return Err(Error::arg(format!("a window of {len} bytes at {:#x} runs past the address space", bases[me])));
        }
        let mut all = [0u64; MAX_RANKS];
        all[..bases.len()].copy_from_slice(bases);
        let mut live = lock(&self.live);
        live.0 += 1;
        let id = WindowId(live.0);
        live.1.push(Window { id, me, len, bases: all });
        Ok(id)
    }

    /// Removes window `id`; false when it is not live.
    pub(crate) fn remove(&self, id: WindowId) -> bool {
        let mut live = lock(&self.live);
        let before = live.1.len();
        live.1.retain(|w| w.id != id);
        live.1.len() != before
    }

    /// The window that holds all of `[start, start + len)`, if one does.
    pub(crate) fn find(&self, start: u64, len: u64) -> Option<InWindow> {
        let end = start.checked_add(len)?;
        let live = lock(&self.live);
        live.1
            .iter()
            .find(|w| w.bases[w.me] <= start && end <= w.bases[w.me] + w.len)
            .map(|w| InWindow { bases: w.bases, me: w.me })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_span_is_found_only_wholly_inside_a_live_window() {
        let w = Windows::default();
        let id = w.add(1, &[0x1000_0000, 0x2000, 0x3000_0000], 0x1000).unwrap();
        let found = w.find(0x2100, 0x100).unwrap();
        assert_eq!(found.at(0, 0x2180), 0x1000_0180, "rank 0's buffer at the same offset");
        assert_eq!(found.at(2, 0x2100), 0x3000_0100);
        assert_eq!(found.at(1, 0x2100), 0x2100, "this rank's own");
        assert!(w.find(0x2000, 0x1000).is_some(), "the whole window");
        assert!(w.find(0x2f00, 0x101).is_none(), "past its end");
        assert!(w.find(0x1f00, 0x200).is_none(), "before its start");
        assert!(w.find(u64::MAX - 1, 4).is_none(), "a span that wraps");
        let other = w.add(1, &[0x5000, 0x9000, 0x7000], 0x800).unwrap();
        assert_ne!(id, other);
        assert!(w.remove(id));
        assert!(!w.remove(id), "removed once");
        assert!(w.find(0x2100, 0x100).is_none());
        let f = w.find(0x9000, 0x800).unwrap();
        assert_eq!([0, 1, 2].map(|r| f.at(r, 0x9010)), [0x5010, 0x9010, 0x7010]);
    }

    #[test]
    fn malformed_windows_are_refused() {
        let w = Windows::default();
        assert!(w.add(0, &[], 16).is_err());
        assert!(w.add(2, &[1, 2], 16).is_err());
        assert!(w.add(0, &[0; MAX_RANKS + 1], 16).is_err());
        assert!(w.add(0, &[u64::MAX - 4, 0], 16).is_err());
        assert!(w.find(0, 1).is_none());
    }
}
