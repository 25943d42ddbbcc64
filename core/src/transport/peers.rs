//! The table of this rank's FIFO ends and tcp links, one entry per connected peer, kept
//! outside the communicator's operation lock (which a blocked operation holds), and what runs
//! on it from any thread.
//!
//! Abort: `fail_peers` marks every end of this rank failed, so that peers waiting on this
//! rank fail at once even when this rank is not inside a call, and a peer that fails passes
//! its failure on the same way. A wait that has blocked for a while also looks at the other
//! peers' ends (`failed_peer`), so ranks that wait on neither the aborted rank nor a rank that
//! noticed it still return: one rank's abort ends the collective on every rank.
//!
//! Every failure notice carries its `Cause`, the rank that failed first and how; a rank that
//! fails because of a peer passes the peer's cause on (`cause_of`), so however far a failure
//! travels, every rank's error names where it started.

use super::fifo::nonblocking::{alive, fail_recv_end, fail_send_end};
use super::fifo::{state, Cause, Liveness, Members, Notice, Region};
use super::{tcp, Peer};
use crate::error::{Error, Result};
use crate::sync::lock;
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

impl PeerEnds {
    fn of(peer: usize, p: &Peer) -> PeerEnds {
        PeerEnds {
            peer,
            send: p.send.region.clone(),
            recv: p.recv.region.clone(),
            tcp: p.tcp.clone(),
            liveness: p.liveness,
        }
    }
}

/// Grows as peers connect (`add`); read by abort and by waits that have blocked a while.
pub(crate) struct PeerTable {
    ends: Mutex<Vec<PeerEnds>>,
}

impl PeerTable {
    pub(crate) fn new(peers: &[Option<Peer>]) -> PeerTable {
        let ends = peers.iter().enumerate().filter_map(|(i, p)| Some(PeerEnds::of(i, p.as_ref()?))).collect();
        PeerTable { ends: Mutex::new(ends) }
    }

    /// Takes in a peer connected after init.
    pub(crate) fn add(&self, peer: usize, p: &Peer) {
        self.ends().push(PeerEnds::of(peer, p));
    }

    pub(crate) fn ends(&self) -> MutexGuard<'_, Vec<PeerEnds>> {
        lock(&self.ends)
    }

    /// Marks every FIFO end of this rank `how`, with `cause`, and tells tcp peers (an ABORT
    /// frame, sent now if the socket takes it). Only atomics and the tcp links' own locks are
    /// touched, never the communicator's operation lock, so this works while an operation is
    /// blocked.
    pub(crate) fn fail_peers(&self, how: u32, cause: Cause) {
        for e in self.ends().iter() {
            fail_send_end(&e.send, how, Some(cause));
            fail_recv_end(&e.recv, how, Some(cause));
            if let Some(t) = &e.tcp {
                lock(t).abort(how);
            }
        }
    }

    /// The cause this rank passes on when it fails with `e` (`me`: this rank): a failure of
    /// its own (a timeout, a mismatch it saw, an abort) starts with this rank; a peer's
    /// failure keeps the cause that peer's notice gave, or, for a peer that said none (its
    /// process died, its connection broke), starts with that peer.
    pub(crate) fn cause_of(&self, e: &Error, me: usize) -> Cause {
        let mine = |state| Cause { origin: me as u32, state };
        let peer = match e {
            Error::Timeout { .. } => return mine(state::TIMEOUT),
            Error::InvalidUsage(m) if m.contains("operation mismatch") => return mine(state::MISMATCH),
            Error::RemoteError { peer, .. } => *peer,
            _ => return mine(state::ABORTED),
        };
        let ends = self.ends();
        let notices = || ends.iter().flat_map(|e| [(e, e.recv.header().sender()), (e, e.send.header().receiver())]);
        // The notice the error was made from names `peer` as its origin (`Notice::error`).
        if let Some(c) = notices().find_map(|(_, n)| n.cause.filter(|c| c.origin as usize == peer)) {
            return c;
        }
        let state = match notices().find(|(e, n)| e.peer == peer && n.state != state::OPEN) {
            Some((_, n)) => n.state,
            None if ends.iter().any(|e| e.peer == peer && !alive(e.liveness)) => state::DEAD,
            None => state::ABORTED,
        };
        Cause { origin: peer as u32, state }
    }
}

impl Members for PeerTable {
    fn failed_peer(&self, except: usize) -> Result<()> {
        PeerTable::failed_peer(self, except)
    }
}

impl PeerTable {
    /// The first peer other than `except` whose end says it failed (aborted, timed out, saw a
    /// mismatch, lost its connection), as the error an operation of this communicator returns:
    /// a collective cannot complete once any member failed. A peer that merely destroyed its
    /// communicator is not a failure here.
    pub(crate) fn failed_peer(&self, except: usize) -> Result<()> {
        for e in self.ends().iter().filter(|e| e.peer != except) {
            let theirs: [Notice; 2] = [e.recv.header().sender(), e.send.header().receiver()];
            if let Some(n) = theirs.into_iter().find(|n| n.state != state::OPEN && n.state != state::CLOSED) {
                return Err(n.error(e.peer));
            }
        }
        Ok(())
    }
}
