//! `Comm::shrink(exclude, mode)`, NCCL 2.27's `ncclCommShrink`: the ranks that remain build a
//! communicator of themselves, renumbered in parent order, without any help from the excluded
//! ranks (which may be dead) and without the parent's bootstrap root (which may have lived in a
//! dead process).
//!
//! Every survivor knows, from the parent's peer table, the address of every rank's transport
//! listener, which each rank keeps open for this. The lowest surviving rank serves the new
//! root on its listener; the others join it there. The new job secret is derived from the
//! parent's (a keyed PRF over the survivor list and a shrink counter), so only survivors that
//! agree on the list get in, and nothing needs to be exchanged first.

use crate::comm::Comm;
use crate::config::Config;
use crate::error::{Error, Result};
use crate::id::UniqueId;
use siphasher::sip128::{Hasher128, SipHasher24};
use std::hash::Hasher;
use std::sync::atomic::Ordering;

/// What happens to operations on the parent (NCCL's shrink flags).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ShrinkMode {
    /// `NCCL_SHRINK_DEFAULT`: the parent has no operation in flight (a call that failed has
    /// returned); it is left as it is.
    #[default]
    Default,
    /// `NCCL_SHRINK_ABORT`: abort the parent first (an operation blocked on a hung rank in
    /// another thread returns), then shrink. The parent stays aborted; destroy it.
    Abort,
}

impl Comm {
    /// Builds a communicator of every rank but `exclude` (parent ranks), with the parent's
    /// configuration. Only the remaining ranks call it, all with the same list; they keep their
    /// order. See `ShrinkMode` for the parent.
    pub fn shrink(&self, exclude: &[usize], mode: ShrinkMode) -> Result<Comm> {
        self.shrink_with(exclude, mode, self.config.clone())
    }

    /// As `shrink`, with the new communicator's configuration.
    pub fn shrink_with(&self, exclude: &[usize], mode: ShrinkMode, config: Config) -> Result<Comm> {
        crate::launch::refuse_in_group("shrink")?;
        let (n, me) = (self.nranks(), self.rank());
        let mut gone = vec![false; n];
        for &r in exclude {
            if r >= n {
                return Err(Error::usage(format!(
                    "shrink: excluded rank {r} is out of range for nranks={n} (ranks are 0..{n})"
                )));
            }
            if r == me {
                return Err(Error::usage(format!(
                    "shrink: rank {me} excludes itself; excluded ranks do not call shrink"
                )));
            }
            if std::mem::replace(&mut gone[r], true) {
                return Err(Error::usage(format!("shrink: rank {r} is excluded twice")));
            }
        }
        match mode {
            ShrinkMode::Default if self.busy() => {
                return Err(Error::usage(
                    "shrink: an operation is in flight on the parent (in another thread); use ShrinkMode::Abort to abort it first",
                ))
            }
            ShrinkMode::Default => {}
            ShrinkMode::Abort => {
                self.abort();
                // The operation in flight sees the abort within a sleep slice and returns.
                drop(self.lock_any());
            }
        }
        let survivors: Vec<usize> = (0..n).filter(|&r| !gone[r]).collect();
        let new_rank =
            survivors.iter().position(|&r| r == me).ok_or_else(|| Error::internal("shrink: not a survivor"))?;
        let epoch = self.successor.shrinks.fetch_add(1, Ordering::Relaxed);
        let secret = successor_secret(&self.successor.secret, epoch, &survivors);
        let leader = survivors[0];
        if me == leader {
            let listener = self
                .successor
                .listener
                .as_ref()
                .ok_or_else(|| Error::internal("shrink: this rank kept no listener for the new root"))?
                .try_clone()
                .map_err(|e| Error::sys("shrink: share the listener with the new root", e))?;
            crate::bootstrap::root::spawn_on(listener, secret, config.timeout)?;
        }
        let at =
            self.table.get(leader).map(|p| p.listen).ok_or_else(|| Error::internal("shrink: no peer table entry"))?;
        tracing::debug!(
            "occl: shrink of comm {:016x} without {exclude:?}: rank {me} is rank {new_rank}/{} (root on rank {leader}, {at})",
            self.id(),
            survivors.len()
        );
        Comm::init_rank(survivors.len(), &UniqueId::at(at, secret), new_rank, config)
    }
}

/// The successor's job secret: SipHash-2-4 keyed with the parent's secret (a PRF) over a
/// label, the shrink counter and the survivors.
fn successor_secret(parent: &[u8; 16], epoch: u32, survivors: &[usize]) -> [u8; 16] {
    let mut h = SipHasher24::new_with_key(parent);
    h.write(b"occl-shrink");
    h.write(&epoch.to_le_bytes());
    h.write(&(survivors.len() as u64).to_le_bytes());
    for &r in survivors {
        h.write(&(r as u64).to_le_bytes());
    }
    h.finish128().as_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn successor_secrets_differ_by_parent_list_and_epoch() {
        let a = successor_secret(&[1; 16], 0, &[0, 1, 3]);
        assert_eq!(a, successor_secret(&[1; 16], 0, &[0, 1, 3]));
        assert_ne!(a, successor_secret(&[2; 16], 0, &[0, 1, 3]));
        assert_ne!(a, successor_secret(&[1; 16], 1, &[0, 1, 3]));
        assert_ne!(a, successor_secret(&[1; 16], 0, &[0, 1, 2]));
        assert_ne!(a, [1; 16]);
    }
}
