//! `occl::group(|g| …)`: a group whose calls borrow slices for as long as the group takes,
//! so they may be collected and run at its end.

use crate::comm::Comm;
use crate::dtype::{Element, RedOp};
use crate::error::{Error, Result};
use crate::launch;
use std::marker::PhantomData;

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
    if launch::is_open() {
        return Err(Error::usage(
            "occl::group() inside an open group: its borrows end before the outer group runs; use Group::nested",
        ));
    }
    /// Restores an empty, closed group on every way out that does not run it.
    struct Reset;
    impl Drop for Reset {
        fn drop(&mut self) {
            launch::discard_all();
        }
    }
    let reset = Reset;
    launch::group_start();
    let mut g = Group { _borrows: PhantomData };
    let r = f(&mut g)?;
    if launch::group_depth() != 1 {
        return Err(Error::usage(
            "occl::group: the closure left group_start()/group_end() unbalanced; nothing it collected ran",
        ));
    }
    std::mem::forget(reset);
    launch::group_end()?;
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
        launch::group_start();
        let r = f(self);
        // Never the outermost level: this only closes what it opened.
        launch::group_end()?;
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
