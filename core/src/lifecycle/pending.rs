//! Non-blocking init, NCCL's `ncclCommInitRankConfig` with `blocking = 0`: the call checks its
//! arguments and returns at once; the bootstrap and transport setup run on a thread of their
//! own, and the caller asks how far it got (`ncclCommGetAsyncError`: `ncclInProgress` until
//! the communicator is ready) or waits for it.

use crate::comm::Comm;
use crate::config::Config;
use crate::error::{Error, Result};
use crate::id::UniqueId;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, TryRecvError};
use std::time::Duration;

/// Where a non-blocking init is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InitState {
    /// Still connecting (NCCL's `ncclInProgress`).
    InProgress,
    /// The communicator is ready: `wait` returns it at once.
    Ready,
}

/// A communicator being created in the background (`Comm::init_rank_nonblocking`). Dropping it
/// before it is ready lets the init finish on its thread and destroys the result.
#[derive(Debug)]
pub struct PendingComm {
    state: Pending,
}

#[derive(Debug)]
enum Pending {
    Running(Receiver<Result<Box<Comm>>>),
    Done(Result<Box<Comm>>),
    /// `wait` took the result.
    Taken,
}

impl Comm {
    /// Starts joining rank `rank` of `nranks` without blocking: bad arguments fail now; the rest
    /// of the init (which waits for the other ranks) runs in the background. Poll or wait on
    /// the returned handle.
    pub fn init_rank_nonblocking(nranks: usize, id: &UniqueId, rank: usize, config: Config) -> Result<PendingComm> {
        crate::launch::refuse_in_group("init_rank_nonblocking")?;
        crate::comm::check_nranks(nranks)?;
        config.check()?;
        if rank >= nranks {
            return Err(Error::arg(format!("rank {rank} is out of range for nranks={nranks} (ranks are 0..{nranks})")));
        }
        let (tx, rx) = mpsc::channel();
        let id = id.clone();
        std::thread::Builder::new()
            .name(format!("occl-init-{rank}"))
            .spawn(move || {
                let _ = tx.send(Comm::init_rank(nranks, &id, rank, config).map(Box::new));
            })
            .map_err(|e| Error::sys("spawn the init thread", e))?;
        Ok(PendingComm { state: Pending::Running(rx) })
    }
}

impl PendingComm {
    /// Takes the init thread's result if it has one.
    fn settle(&mut self, limit: Option<Duration>) {
        let Pending::Running(rx) = &self.state else { return };
        let got = match limit {
            None => match rx.try_recv() {
                Ok(r) => Some(r),
                Err(TryRecvError::Empty) => None,
                Err(TryRecvError::Disconnected) => Some(Err(Error::internal("the init thread ended without a result"))),
            },
            Some(d) => match rx.recv_timeout(d) {
                Ok(r) => Some(r),
                Err(RecvTimeoutError::Timeout) => None,
                Err(RecvTimeoutError::Disconnected) => {
                    Some(Err(Error::internal("the init thread ended without a result")))
                }
            },
        };
        if let Some(r) = got {
            self.state = Pending::Done(r);
        }
    }

    /// The init's state now, without blocking; its error if it failed (every later poll and
    /// `wait` return the same error).
    pub fn poll(&mut self) -> Result<InitState> {
        self.settle(None);
        match &self.state {
            Pending::Running(_) => Ok(InitState::InProgress),
            Pending::Done(Ok(_)) => Ok(InitState::Ready),
            Pending::Done(Err(e)) => Err(e.duplicate()),
            Pending::Taken => Err(Error::usage("the communicator was already taken from this handle")),
        }
    }

    /// Blocks until the init is done and returns the communicator (or the init's error).
    pub fn wait(mut self) -> Result<Comm> {
        while matches!(self.state, Pending::Running(_)) {
            self.settle(Some(Duration::from_secs(3600)));
        }
        match std::mem::replace(&mut self.state, Pending::Taken) {
            Pending::Done(r) => r.map(|c| *c),
            _ => Err(Error::usage("the communicator was already taken from this handle")),
        }
    }

    /// As `wait`, giving up after `limit`: `Ok(None)` while still in progress (the handle stays
    /// usable).
    pub fn wait_timeout(&mut self, limit: Duration) -> Result<Option<Comm>> {
        self.settle(Some(limit));
        match std::mem::replace(&mut self.state, Pending::Taken) {
            Pending::Running(rx) => {
                self.state = Pending::Running(rx);
                Ok(None)
            }
            Pending::Done(r) => r.map(|c| Some(*c)),
            Pending::Taken => Err(Error::usage("the communicator was already taken from this handle")),
        }
    }
}
