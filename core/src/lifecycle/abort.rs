//! Abort from any thread. `Comm::abort` sets the communicator's flag (which every wait of an
//! operation in flight looks at, so the blocked call returns within a sleep slice) and marks
//! every FIFO end of this rank aborted, so that peers waiting on this rank fail at once even
//! when this rank is not inside a call. A peer that fails passes its failure on the same way
//! (`Comm::poison`), and a wait that has blocked for a while also looks at the other peers'
//! ends (`failed_peer`), so ranks that wait on neither the aborted rank nor a rank that
//! noticed it still return: one rank's abort ends the collective on every rank.

use super::Lifecycle;
use crate::error::{Error, Result};
use crate::transport::fifo::nonblocking::{fail_recv_end, fail_send_end};
use crate::transport::fifo::state;
use crate::transport::tcp;
use std::sync::atomic::Ordering;

impl Lifecycle {
    /// Marks every FIFO end of this rank `how` and tells tcp peers (an ABORT frame, sent now
    /// if the socket takes it). Only atomics and the tcp links' own locks are touched, never
    /// the communicator's operation lock, so this works while an operation is blocked.
    pub(crate) fn fail_peers(&self, how: u32) {
        for e in self.ends().iter() {
            fail_send_end(&e.send, how);
            fail_recv_end(&e.recv, how);
            if let Some(t) = &e.tcp {
                tcp::lock(t).abort(how);
            }
        }
    }

    /// The first peer other than `except` whose end says it failed (aborted, timed out, saw a
    /// mismatch, lost its connection), as the error an operation of this communicator returns:
    /// a collective cannot complete once any member failed. A peer that merely destroyed its
    /// communicator is not a failure here.
    pub(crate) fn failed_peer(&self, except: usize) -> Result<()> {
        for e in self.ends().iter().filter(|e| e.peer != except) {
            let theirs = [
                e.recv.header().send_state.0.load(Ordering::Acquire),
                e.send.header().recv_state.0.load(Ordering::Acquire),
            ];
            if let Some(s) = theirs.into_iter().find(|&s| s != state::OPEN && s != state::CLOSED) {
                return Err(Error::remote(e.peer, state::describe(s)));
            }
        }
        Ok(())
    }
}
