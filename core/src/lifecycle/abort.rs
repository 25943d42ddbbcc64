//! Abort from any thread. `Comm::abort` sets the communicator's flag (which every wait of an
//! operation in flight looks at, so the blocked call returns within a sleep slice) and marks
//! every FIFO end of this rank aborted, so that peers waiting on this rank fail at once even
//! when this rank is not inside a call. A peer that fails passes its failure on the same way
//! (`Comm::poison`), and a wait that has blocked for a while also looks at the other peers'
//! ends (`failed_peer`), so ranks that wait on neither the aborted rank nor a rank that
//! noticed it still return: one rank's abort ends the collective on every rank.
//!
//! Every failure notice carries its `Cause`, the rank that failed first and how; a rank that
//! fails because of a peer passes the peer's cause on (`cause_of`), so however far a failure
//! travels, every rank's error names where it started.

use super::Lifecycle;
use crate::error::{Error, Result};
use crate::transport::fifo::nonblocking::{alive, fail_recv_end, fail_send_end};
use crate::transport::fifo::{state, Cause, Notice};
use crate::transport::tcp;

impl Lifecycle {
    /// Marks every FIFO end of this rank `how`, with `cause`, and tells tcp peers (an ABORT
    /// frame, sent now if the socket takes it). Only atomics and the tcp links' own locks are
    /// touched, never the communicator's operation lock, so this works while an operation is
    /// blocked.
    pub(crate) fn fail_peers(&self, how: u32, cause: Cause) {
        for e in self.ends().iter() {
            fail_send_end(&e.send, how, Some(cause));
            fail_recv_end(&e.recv, how, Some(cause));
            if let Some(t) = &e.tcp {
                tcp::lock(t).abort(how);
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
