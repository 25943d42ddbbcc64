//! Running a closed group: each communicator's calls as one launch, in the order they were
//! issued, with consecutive sends and receives progressed together (`p2p.rs`) and each
//! collective run by the same executor as an ungrouped call (`exec::run`: the same algorithm
//! choice, records and checks), its events hung under the group's.
//!
//! A group over several communicators (one thread driving several ranks, NCCL's
//! one-thread-many-devices use) runs each communicator's launch on its own scoped thread, so
//! the ranks progress together; a group over one communicator runs on the calling thread.

use crate::comm::Comm;
use crate::error::{Error, Result};
use crate::op::Op;
use crate::profile::group::GroupProf;
use occl_events::EventId;

/// One communicator's part of a group: its calls with the API events they emitted.
pub(crate) struct Launch<'c> {
    pub comm: &'c Comm,
    pub prof: GroupProf,
    pub calls: Vec<(Op, Option<EventId>)>,
}

// SAFETY: a launch holds the caller's buffer addresses (plain integers) and a shared reference
// to a `Sync` communicator; moving it to a scoped thread that ends before the group returns
// keeps the caller's contract (buffers valid until the group has run).
unsafe impl Send for Launch<'_> {}

/// Runs every launch; the first error is returned (the other launches still run, as their
/// peers wait on them).
pub(crate) fn run(launches: Vec<Launch<'_>>) -> Result<()> {
    let mut launches = launches.into_iter();
    let Some(first) = launches.next() else { return Ok(()) };
    let rest: Vec<Launch<'_>> = launches.collect();
    if rest.is_empty() {
        return launch(first);
    }
    std::thread::scope(|s| {
        let handles: Vec<_> = rest.into_iter().map(|l| s.spawn(move || launch(l))).collect();
        let mut res = launch(first);
        for h in handles {
            let r = h.join().unwrap_or_else(|_| Err(Error::internal("a group launch thread panicked")));
            if res.is_ok() {
                res = r;
            }
        }
        res
    })
}

/// Runs `ops` on `comm` as a group of its own (an implicit group: all-to-allv, gather and
/// scatter are grouped sends and receives).
pub(crate) fn run_now(comm: &Comm, ops: &[Op]) -> Result<()> {
    // No user group is open: these calls refuse to run inside one.
    let prof = GroupProf::open(comm.fanout(), 1);
    let calls = ops.iter().map(|o| (*o, prof.api(&o.descr()))).collect();
    launch(Launch { comm, prof, calls })
}

fn launch(mut l: Launch<'_>) -> Result<()> {
    l.prof.launch();
    let calls = &l.calls;
    let mut i = 0;
    while i < calls.len() {
        if calls[i].0.is_p2p() {
            let j = calls[i..].iter().position(|(c, _)| !c.is_p2p()).map_or(calls.len(), |k| i + k);
            super::p2p::run(l.comm, &l.prof, &calls[i..j])?;
            i = j;
        } else {
            let _running = l.prof.running(calls[i].1);
            super::run(l.comm, &calls[i].0)?;
            i += 1;
        }
    }
    Ok(())
}
