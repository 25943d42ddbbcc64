//! Groups: operations issued between `group_start()` and `group_end()` (or inside
//! `occl::group(|g| …)`) are not run when called but collected, and the outermost `group_end`
//! runs them as one launch per communicator. Consecutive sends and receives of a launch progress
//! together (`p2p.rs`), so a pattern that would deadlock one call at a time (every rank
//! receiving before it sends, a ring shift, an all-to-all) completes; collectives run in the
//! order they were issued, between those batches.
//!
//! Like NCCL's `ncclGroupStart`/`ncclGroupEnd`, the nesting is per thread: the calls take no
//! communicator, so the open group is kept in a thread-local (the one piece of thread-local
//! state in occl). Each thread has its own groups.
//!
//! A deferred call reads and writes its buffers when the group runs, after the call has
//! returned. So only calls whose buffers provably live that long may be deferred: the `_raw`
//! calls (their safety contract says so) and the methods of the [`Group`] handle, whose borrows
//! last until `occl::group` returns. The slice methods of `Comm` refuse to run inside an open
//! group instead of deferring a borrow that may end first.

mod exec;
mod p2p;
mod vector;

use crate::comm::Comm;
use crate::dtype::{DataType, Element, RedOp};
use crate::error::{Error, Result};
use crate::profile::group::GroupProf;
use crate::profile::op::OpDescr;
use crate::record::CollType;
use occl_telemetry::EventId;
use std::cell::{Cell, RefCell};
use std::marker::PhantomData;

/// One deferred call: what `Comm`'s raw call was given, enough to run it later.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Call {
    pub coll: CollType,
    pub count: usize,
    pub dt: DataType,
    pub op: Option<RedOp>,
    pub root: Option<usize>,
    pub peer: Option<usize>,
    /// Buffer addresses (valid until the group has run: the caller's contract).
    pub send: usize,
    pub recv: usize,
}

impl Call {
    pub(crate) fn is_p2p(&self) -> bool {
        matches!(self.coll, CollType::Send | CollType::Recv)
    }

    /// The descriptor of the call's API event (and, with the run's details, its Coll/P2p).
    pub(crate) fn descr(&self) -> OpDescr<'static> {
        OpDescr {
            func: crate::comm::nccl_func(self.coll),
            p2p: self.is_p2p(),
            seq_number: 0,
            send_buff: self.send,
            recv_buff: self.recv,
            count: self.count,
            root: self.root.unwrap_or(0) as i32,
            peer: self.peer.map_or(-1, |p| p as i32),
            datatype: self.dt.nccl_name(),
            algo: "",
            proto: "",
            chunk_size: 0,
            n_channels: 1,
        }
    }
}

/// A deferred call and the API event it emitted when it was made.
struct Task {
    comm: *const Comm,
    call: Call,
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
    let depth = DEPTH.with(Cell::get);
    if depth == 0 {
        return Err(Error::usage("group_end() without a matching group_start() on this thread"));
    }
    DEPTH.with(|d| d.set(depth - 1));
    if depth > 1 {
        return Ok(());
    }
    let open = OPEN.with(|o| std::mem::take(&mut *o.borrow_mut()));
    if let Some(e) = open.lost {
        return Err(e);
    }
    exec::run(open.members, open.tasks)
}

/// Closes one level like `group_end`, but the outermost level runs nothing: it drops every
/// collected call and returns the tuner's predicted µs for them, summed
/// (`ncclGroupSimulateEnd`). Inner levels return 0.
pub fn group_simulate_end() -> Result<f64> {
    let depth = DEPTH.with(Cell::get);
    if depth == 0 {
        return Err(Error::usage("group_simulate_end() without a matching group_start() on this thread"));
    }
    DEPTH.with(|d| d.set(depth - 1));
    if depth > 1 {
        return Ok(0.0);
    }
    let open = OPEN.with(|o| std::mem::take(&mut *o.borrow_mut()));
    if let Some(e) = open.lost {
        return Err(e);
    }
    let mut us = 0.0;
    for t in &open.tasks {
        // SAFETY: as in `exec::run`: a communicator with calls in the open group lives until the
        // group ends (destroying one removes its calls).
        let comm = unsafe { &*t.comm };
        us += comm.predicted_us(t.call.coll, t.call.count.saturating_mul(t.call.dt.size()))?;
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

/// Collects `call` on `comm` into the open group and emits its API event.
pub(crate) fn defer(comm: &Comm, call: Call) -> Result<()> {
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
        let api = o.members[i].prof.api(&call.descr());
        o.tasks.push(Task { comm: ptr, call, api });
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

/// Discards every collected call (an `occl::group` closure failed or unwound).
fn discard_all() {
    let _ = OPEN.try_with(|o| {
        if let Ok(mut o) = o.try_borrow_mut() {
            *o = Open::default();
        }
    });
}

/// The closure form of a group: every call made through `g` (and every `_raw` call on this
/// thread) inside `f` is collected and run together when `f` returns `Ok`. The buffers and
/// communicators given to `g` are borrowed for `'b`, which outlasts this call, so they are
/// still there when the group runs.
///
/// ```no_run
/// # fn f(comm: &occl::Comm) -> occl::Result<()> {
/// let (next, prev) = ((comm.rank() + 1) % comm.nranks(), (comm.rank() + comm.nranks() - 1) % comm.nranks());
/// let out = vec![comm.rank() as f32; 1 << 20];
/// let mut inp = vec![0f32; 1 << 20];
/// occl::group(|g| {
///     g.recv(comm, &mut inp, prev)?; // every rank receives first: fine inside a group
///     g.send(comm, &out, next)
/// })?;
/// # Ok(()) }
/// ```
///
/// If `f` fails, panics, or leaves the nesting unbalanced, nothing it collected runs. It may
/// not be called inside an open group (its borrows would end before the outer group runs);
/// nest with [`Group::nested`] instead.
pub fn group<'b, R>(f: impl FnOnce(&mut Group<'b>) -> Result<R>) -> Result<R> {
    if is_open() {
        return Err(Error::usage(
            "occl::group() inside an open group: its borrows end before the outer group runs; use Group::nested",
        ));
    }
    /// Restores an empty, closed group on every way out that does not run it.
    struct Reset;
    impl Drop for Reset {
        fn drop(&mut self) {
            DEPTH.with(|d| d.set(0));
            discard_all();
        }
    }
    let reset = Reset;
    group_start();
    let mut g = Group { _borrows: PhantomData };
    let r = f(&mut g)?;
    if DEPTH.with(Cell::get) != 1 {
        return Err(Error::usage(
            "occl::group: the closure left group_start()/group_end() unbalanced; nothing it collected ran",
        ));
    }
    std::mem::forget(reset);
    group_end()?;
    Ok(r)
}

/// The handle of an `occl::group` closure: calls on slices that live for `'b`, collected into
/// the group. The same checks as `Comm`'s methods apply when each call is made.
pub struct Group<'b> {
    /// Invariant in `'b`: a handle for longer borrows must not become one for shorter ones.
    _borrows: PhantomData<fn(&'b ()) -> &'b ()>,
}

impl<'b> Group<'b> {
    /// One more level of nesting (the profiler's GroupApi depth counts it).
    pub fn nested<R>(&mut self, f: impl FnOnce(&mut Group<'b>) -> Result<R>) -> Result<R> {
        group_start();
        let r = f(self);
        // Never the outermost level: this only closes what it opened.
        group_end()?;
        r
    }

    pub fn send<T: Element>(&mut self, comm: &'b Comm, buf: &'b [T], peer: usize) -> Result<()> {
        // SAFETY: the slice lives for 'b, past the end of the group.
        unsafe { comm.send_raw(buf.as_ptr().cast(), buf.len(), T::DTYPE, peer) }
    }

    pub fn recv<T: Element>(&mut self, comm: &'b Comm, buf: &'b mut [T], peer: usize) -> Result<()> {
        // SAFETY: as in `send`; the mutable borrow keeps the caller off the buffer until then.
        unsafe { comm.recv_raw(buf.as_mut_ptr().cast(), buf.len(), T::DTYPE, peer) }
    }

    pub fn all_reduce<T: Element>(
        &mut self,
        comm: &'b Comm,
        send: &'b [T],
        recv: &'b mut [T],
        op: RedOp,
    ) -> Result<()> {
        if send.len() != recv.len() {
            return Err(Error::arg(format!(
                "all_reduce: send has {} elements but recv has {}; they must be equal",
                send.len(),
                recv.len()
            )));
        }
        // SAFETY: valid, disjoint slices that live for 'b.
        unsafe { comm.all_reduce_raw(send.as_ptr().cast(), recv.as_mut_ptr().cast(), send.len(), T::DTYPE, op) }
    }

    /// Off the root `send` is ignored (pass an empty slice).
    pub fn broadcast<T: Element>(
        &mut self,
        comm: &'b Comm,
        send: &'b [T],
        recv: &'b mut [T],
        root: usize,
    ) -> Result<()> {
        if comm.rank() == root && send.len() != recv.len() {
            return Err(Error::arg(format!(
                "broadcast: send has {} elements but recv has {}; they must be equal",
                send.len(),
                recv.len()
            )));
        }
        // SAFETY: valid slices that live for 'b; send is read only at the root.
        unsafe { comm.broadcast_raw(send.as_ptr().cast(), recv.as_mut_ptr().cast(), recv.len(), T::DTYPE, root) }
    }

    /// `recv` (nranks × send.len()) gets every rank's `send`, in rank order.
    pub fn all_gather<T: Element>(&mut self, comm: &'b Comm, send: &'b [T], recv: &'b mut [T]) -> Result<()> {
        if Some(recv.len()) != send.len().checked_mul(comm.nranks()) {
            return Err(Error::arg(format!(
                "all_gather: recv has {} elements but needs nranks × send = {} × {}",
                recv.len(),
                comm.nranks(),
                send.len()
            )));
        }
        // SAFETY: valid, disjoint slices of the checked lengths that live for 'b.
        unsafe { comm.all_gather_raw(send.as_ptr().cast(), recv.as_mut_ptr().cast(), send.len(), T::DTYPE) }
    }
}
