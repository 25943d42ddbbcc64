//! Launching a checked operation: run it now, or, between `group_start()` and `group_end()`
//! (or inside `occl::group(|g| …)`), collect it and let the outermost `group_end` run the
//! group as one launch per communicator (`exec::group`). Consecutive sends and receives of a
//! launch progress together, so a pattern that would deadlock one call at a time (every rank
//! receiving before it sends, a ring shift, an all-to-all) completes; collectives run in the
//! order they were issued, between those batches.
//!
//! Like NCCL's `ncclGroupStart`/`ncclGroupEnd`, the nesting is per thread: the calls take no
//! communicator, so the open group is kept in a thread-local (with the enclosing-events slot of
//! `profile::group`, the only thread-local state in occl). Each thread has its own groups.
//!
//! A deferred call reads and writes its buffers when the group runs, after the call has
//! returned. So only calls whose buffers provably live that long may be deferred: the `_raw`
//! calls (their safety contract says so) and the methods of the `Group` handle, whose borrows
//! last until `occl::group` returns. The slice methods of `Comm` refuse to run inside an open
//! group instead of deferring a borrow that may end first.

use crate::comm::Comm;
use crate::error::{Error, Result};
use crate::exec;
use crate::op::Op;
use crate::profile::group::GroupProf;
use occl_events::EventId;
use std::cell::{Cell, RefCell};

/// A deferred call and the API event it emitted when it was made.
struct Task {
    comm: *const Comm,
    op: Op,
    api: Option<EventId>,
}

/// A communicator that has calls in the open group, with the group's events on it.
struct Member {
    comm: *const Comm,
    prof: GroupProf,
}

#[derive(Default)]
struct Open {
    tasks: Vec<Task>,
    members: Vec<Member>,
    /// A communicator with calls in the group was destroyed: `group_end` says so.
    lost: Option<Error>,
}

thread_local! {
    static DEPTH: Cell<usize> = const { Cell::new(0) };
    static OPEN: RefCell<Open> = RefCell::new(Open::default());
}

/// Opens a group (or one more level of nesting) on this thread. Calls made until the matching
/// `group_end` are collected and run together by the outermost `group_end`.
pub fn group_start() {
    DEPTH.with(|d| d.set(d.get() + 1));
}

/// Closes one level of nesting; the outermost level runs every call collected since the
/// outermost `group_start`, one launch per communicator, and returns the first error. A
/// `group_end` without an open group is `InvalidUsage`.
pub fn group_end() -> Result<()> {
    let Some(open) = close_level("group_end")? else { return Ok(()) };
    let mut launches: Vec<exec::group::Launch<'_>> = open
        .members
        .into_iter()
        .map(|m| exec::group::Launch {
            // SAFETY: a communicator with calls in a group lives until the group has run
            // (`occl::group` borrows it for that long; destroying one removes its calls, `forget`).
            comm: unsafe { &*m.comm },
            prof: m.prof,
            calls: Vec::new(),
        })
        .collect();
    for t in open.tasks {
        if let Some(l) = launches.iter_mut().find(|l| std::ptr::eq(l.comm, t.comm)) {
            l.calls.push((t.op, t.api));
        }
    }
    exec::group::run(launches)
}

/// Closes one level of this thread's group (`what`: the caller, for the error); at the
/// outermost level, hands over what the group collected.
fn close_level(what: &str) -> Result<Option<Open>> {
    let depth = DEPTH.with(Cell::get);
    if depth == 0 {
        return Err(Error::usage(format!("{what}() without a matching group_start() on this thread")));
    }
    DEPTH.with(|d| d.set(depth - 1));
    if depth > 1 {
        return Ok(None);
    }
    let open = OPEN.with(|o| std::mem::take(&mut *o.borrow_mut()));
    match open.lost {
        Some(e) => Err(e),
        None => Ok(Some(open)),
    }
}

/// Runs `op` now, or collects it into this thread's open group.
pub(crate) fn submit(comm: &Comm, op: Op) -> Result<()> {
    if is_open() {
        return defer(comm, op);
    }
    exec::run(comm, &op)
}

/// Closes one level like `group_end`, but the outermost level runs nothing: it drops every
/// collected call and returns the tuner's predicted µs for them, summed
/// (`ncclGroupSimulateEnd`). Inner levels return 0.
pub fn group_simulate_end() -> Result<f64> {
    let Some(open) = close_level("group_simulate_end")? else { return Ok(0.0) };
    let mut us = 0.0;
    for t in &open.tasks {
        // SAFETY: as in `group_end`: a communicator with calls in the open group lives until the
        // group ends (destroying one removes its calls).
        let comm = unsafe { &*t.comm };
        us += comm.predicted_us(t.op.coll, t.op.count.saturating_mul(t.op.dt.size()))?;
    }
    // The members' events stop as they drop, with nothing launched under them.
    Ok(us)
}

/// The nesting depth of this thread's open group (0: none).
pub fn group_depth() -> usize {
    DEPTH.with(Cell::get)
}

/// Whether calls on this thread are being collected into a group.
#[inline]
pub(crate) fn is_open() -> bool {
    DEPTH.with(Cell::get) > 0
}

/// Refuses a slice method inside an open group: its borrow ends when it returns, before the
/// group would run it.
#[inline]
pub(crate) fn refuse_borrowed(what: &str) -> Result<()> {
    if is_open() {
        return Err(Error::usage(format!(
            "{what}: called inside group_start()/group_end(); a call on borrowed slices cannot be deferred past its \
             return. Use occl::group(|g| …) and the Group handle's methods, or the _raw call"
        )));
    }
    Ok(())
}

/// Refuses a call that must run at once (init, split, shrink) inside an open group.
pub(crate) fn refuse_in_group(what: &str) -> Result<()> {
    if is_open() {
        return Err(Error::usage(format!("{what} cannot be called inside group_start()/group_end()")));
    }
    Ok(())
}

/// Collects `op` on `comm` into the open group and emits its API event.
fn defer(comm: &Comm, op: Op) -> Result<()> {
    let depth = DEPTH.with(Cell::get);
    OPEN.with(|o| {
        let mut o = o.try_borrow_mut().map_err(|_| {
            Error::usage("a profiler sink called back into occl while a group call was being collected")
        })?;
        let ptr = comm as *const Comm;
        let i = match o.members.iter().position(|m| std::ptr::eq(m.comm, ptr)) {
            Some(i) => i,
            None => {
                o.members.push(Member { comm: ptr, prof: GroupProf::open(comm.fanout(), depth + 1) });
                o.members.len() - 1
            }
        };
        let api = o.members[i].prof.api(&op.descr());
        o.tasks.push(Task { comm: ptr, op, api });
        Ok(())
    })
}

/// Drops the calls of a communicator that is being destroyed with calls in this thread's open
/// group (they could only fail later); `group_end` then reports it.
pub(crate) fn forget(comm: &Comm) {
    let ptr = comm as *const Comm;
    let _ = OPEN.try_with(|o| {
        if let Ok(mut o) = o.try_borrow_mut() {
            if o.members.iter().any(|m| std::ptr::eq(m.comm, ptr)) {
                o.tasks.retain(|t| !std::ptr::eq(t.comm, ptr));
                o.members.retain(|m| !std::ptr::eq(m.comm, ptr));
                o.lost.get_or_insert_with(|| {
                    Error::usage(format!(
                        "communicator {:016x} was destroyed while it had calls in an open group; they were dropped",
                        comm.id()
                    ))
                });
            }
        }
    });
}

/// Discards every collected call and closes the group (an `occl::group` closure failed or
/// unwound).
pub(crate) fn discard_all() {
    let _ = DEPTH.try_with(|d| d.set(0));
    let _ = OPEN.try_with(|o| {
        if let Ok(mut o) = o.try_borrow_mut() {
            *o = Open::default();
        }
    });
}
