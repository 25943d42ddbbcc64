//! A communicator's life beyond one init and one destroy: `abort()` from any thread
//! (`abort.rs`), `split(color, key)` into sub-communicators (`split.rs`), `shrink(exclude)` to
//! carry on without failed ranks (`shrink.rs`), and init that does not block the caller
//! (`pending.rs`).
//!
//! `Lifecycle` is what these need outside the communicator's operation lock, which a blocked
//! operation holds: the FIFO ends and tcp links to mark failed, the job secret and the
//! transport listener kept open for a shrink's new root.

mod abort;
mod pending;
mod shrink;
mod split;

pub use pending::{InitState, PendingComm};
pub use shrink::ShrinkMode;
pub use split::OCCL_SPLIT_NOCOLOR;

use crate::transport::fifo::{Liveness, Region};
use crate::transport::{tcp, Peer};
use std::net::TcpListener;
use std::sync::atomic::AtomicU32;
use std::sync::{Arc, Mutex, MutexGuard};

/// One peer's FIFO regions (this rank sends into `send`, receives from `recv`), tcp link, and
/// how to tell that its process is gone.
pub(crate) struct PeerEnds {
    pub peer: usize,
    pub send: Arc<Region>,
    pub recv: Arc<Region>,
    pub tcp: Option<tcp::SharedLink>,
    pub liveness: Liveness,
}

pub(crate) struct Lifecycle {
    /// The job secret of this communicator (a shrink derives its successor's from it).
    secret: [u8; 16],
    /// This rank's transport listener (its address is in every peer's table), kept open so
    /// that a shrink whose new rank 0 this rank is can serve the new root on it without a
    /// round of address exchange the failed ranks could not take part in.
    listener: Option<TcpListener>,
    /// Grows as peers connect (`add`); read by abort and by waits that have blocked a while.
    ends: Mutex<Vec<PeerEnds>>,
    /// Shrinks started from this communicator; part of each successor's secret.
    shrinks: AtomicU32,
}

impl Lifecycle {
    pub(crate) fn new(secret: [u8; 16], listener: Option<TcpListener>, peers: &[Option<Peer>]) -> Lifecycle {
        let ends = peers
            .iter()
            .enumerate()
            .filter_map(|(i, p)| {
                let p = p.as_ref()?;
                Some(PeerEnds {
                    peer: i,
                    send: p.send.region.clone(),
                    recv: p.recv.region.clone(),
                    tcp: p.tcp.clone(),
                    liveness: p.liveness,
                })
            })
            .collect();
        Lifecycle { secret, listener, ends: Mutex::new(ends), shrinks: AtomicU32::new(0) }
    }

    /// Takes in a peer connected after init.
    pub(crate) fn add(&self, peer: usize, p: &Peer) {
        self.ends().push(PeerEnds {
            peer,
            send: p.send.region.clone(),
            recv: p.recv.region.clone(),
            tcp: p.tcp.clone(),
            liveness: p.liveness,
        });
    }

    pub(crate) fn ends(&self) -> MutexGuard<'_, Vec<PeerEnds>> {
        self.ends.lock().unwrap_or_else(|e| e.into_inner())
    }
}
