//! Running a closed group: each communicator's calls as one launch, in the order they were
//! issued, with consecutive sends and receives progressed together (`p2p.rs`) and each
//! collective run through `Comm`'s own path in between (so it gets the same algorithm choice,
//! records and checks as an ungrouped call, and its events hang under the group's).
//!
//! A group over several communicators (one thread driving several ranks, NCCL's
//! one-thread-many-devices use) runs each communicator's launch on its own scoped thread, so
//! the ranks progress together; a group over one communicator runs on the calling thread.

use super::{Call, Member, Task};
use crate::comm::Comm;
use crate::error::{Error, Result};
use crate::profile::group::GroupProf;
use crate::profile::group::Running;
use crate::record::CollType;
use occl_telemetry::EventId;

/// One communicator's part of a group.
struct Launch<'c> {
    comm: &'c Comm,
    prof: GroupProf,
    calls: Vec<(Call, Option<EventId>)>,
}

// SAFETY: a launch holds the caller's buffer addresses (plain integers) and a shared reference
// to a `Sync` communicator; moving it to a scoped thread that ends before the group returns
// keeps the caller's contract (buffers valid until the group has run).
unsafe impl Send for Launch<'_> {}

/// Runs every member's calls; the first error is returned (the other members still run, as
/// their peers wait on them).
pub(super) fn run(members: Vec<Member>, tasks: Vec<Task>) -> Result<()> {
    let mut launches: Vec<Launch<'_>> = members
        .into_iter()
        .map(|m| Launch {
            // SAFETY: the caller's contract: a communicator with calls in a group lives until the
            // group has run (`occl::group` borrows it for that long; destroying one removes its
            // calls, `forget`).
            comm: unsafe { &*m.comm },
            prof: m.prof,
            calls: Vec::new(),
        })
        .collect();
    for t in tasks {
        if let Some(l) = launches.iter_mut().find(|l| std::ptr::eq(l.comm, t.comm)) {
            l.calls.push((t.call, t.api));
        }
    }
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

/// Runs `calls` on `comm` as a group of its own (an implicit group: all-to-allv, gather and
/// scatter are grouped sends and receives).
pub(super) fn run_now(comm: &Comm, calls: &[Call]) -> Result<()> {
    let prof = GroupProf::open(comm.fanout(), super::group_depth() + 1);
    let calls = calls.iter().map(|c| (*c, prof.api(&c.descr()))).collect();
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
            let _running = Running::set(&l.prof, calls[i].1);
            collective(l.comm, &calls[i].0)?;
            i += 1;
        }
    }
    Ok(())
}

/// Runs a collective call through `Comm`'s raw interface (no group is open on this thread now,
/// so it runs instead of being collected).
fn collective(comm: &Comm, c: &Call) -> Result<()> {
    let (send, recv) = (c.send as *const u8, c.recv as *mut u8);
    let op = c.op.unwrap_or(crate::RedOp::Sum);
    let root = c.root.unwrap_or(0);
    // SAFETY: the caller's contract for a grouped call: its buffers stay valid until the group
    // has run; the arguments are those the call was made with (checked then, and again now).
    unsafe {
        match c.coll {
            CollType::AllReduce => comm.all_reduce_raw(send, recv, c.count, c.dt, op),
            CollType::Broadcast => comm.broadcast_raw(send, recv, c.count, c.dt, root),
            CollType::Reduce => comm.reduce_raw(send, recv, c.count, c.dt, op, root),
            CollType::AllGather => comm.all_gather_raw(send, recv, c.count, c.dt),
            CollType::ReduceScatter => comm.reduce_scatter_raw(send, recv, c.count, c.dt, op),
            CollType::AllToAll => comm.all_to_all_raw(send, recv, c.count, c.dt),
            CollType::Send | CollType::Recv => Err(Error::internal("a send/recv outside its batch")),
        }
    }
}
