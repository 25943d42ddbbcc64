//! The collective calls of `Comm`: the raw interface (NCCL's pointers and counts) checks its
//! arguments and submits an `Op`; the safe interface checks slice lengths and calls it.

use crate::comm::Comm;
use crate::dtype::{DataType, Element, RedOp};
use crate::error::{Error, Result};
use crate::launch;
use crate::op::Op;
use crate::record::CollType;

/// The collectives of the raw interface: each takes NCCL's `send`, `recv`, `count` and `dt`,
/// then its own arguments (`op`, `root`), which name the `Op` builder methods that record them.
macro_rules! raw_collectives {
    ($($(#[$attr:meta])* $name:ident => $coll:ident($($arg:ident: $ty:ty),*);)*) => {$(
        $(#[$attr])*
        pub unsafe fn $name(&self, send: *const u8, recv: *mut u8, count: usize, dt: DataType $(, $arg: $ty)*) -> Result<()> {
            let call = Op::new(CollType::$coll, count, dt, send as usize, recv as usize)$(.$arg($arg))*;
            // SAFETY: the caller's promise.
            unsafe { self.run_raw(call) }
        }
    )*};
}

/// The raw interface: NCCL's argument order, pointers and an element count. Each call becomes
/// an `Op`, checked once against its collective's layout (`Op::check`, which the device calls
/// share), that runs now or waits in the open group. The safe methods below check slice
/// lengths and call these.
impl Comm {
    raw_collectives! {
        /// # Safety
        /// `send` must be readable and `recv` writable for `count` elements of `dt`; they may be
        /// the same pointer (in place) but must not otherwise overlap.
        all_reduce_raw => AllReduce(op: RedOp);
        /// # Safety
        /// At the root `send` is readable for `count` elements; `recv` is writable for `count`
        /// elements on every rank (it may equal `send`).
        broadcast_raw => Broadcast(root: usize);
        /// # Safety
        /// `send` readable for `count` elements on every rank; at the root `recv` writable for
        /// `count` elements (it may equal `send`); elsewhere `recv` is not touched.
        reduce_raw => Reduce(op: RedOp, root: usize);
        /// # Safety
        /// `send` readable for `count` elements, `recv` writable for `nranks * count`; in place
        /// when `send == recv + rank * count` elements.
        all_gather_raw => AllGather();
        /// # Safety
        /// `send` readable for `nranks * count` elements, `recv` writable for `count`; in place when
        /// `recv == send + rank * count` elements.
        reduce_scatter_raw => ReduceScatter(op: RedOp);
        /// # Safety
        /// `send` readable and `recv` writable for `nranks * count` elements; in place when equal.
        all_to_all_raw => AllToAll();
    }

    /// # Safety
    /// `buf` readable for `count` elements of `dt`.
    pub unsafe fn send_raw(&self, buf: *const u8, count: usize, dt: DataType, peer: usize) -> Result<()> {
        // SAFETY: the caller's promise.
        unsafe { self.run_raw(Op::new(CollType::Send, count, dt, buf as usize, 0).peer(peer)) }
    }

    /// # Safety
    /// `buf` writable for `count` elements of `dt`.
    pub unsafe fn recv_raw(&self, buf: *mut u8, count: usize, dt: DataType, peer: usize) -> Result<()> {
        // SAFETY: the caller's promise.
        unsafe { self.run_raw(Op::new(CollType::Recv, count, dt, 0, buf as usize).peer(peer)) }
    }

    /// Checks `call` and runs it now or keeps it for the open group. A send to or receive
    /// from this rank itself needs a group, where both halves run together.
    ///
    /// # Safety
    /// The call's buffers are valid as its `_raw` method documents, until it has run.
    pub(crate) unsafe fn run_raw(&self, call: Op) -> Result<()> {
        if call.is_p2p() && call.peer == Some(self.rank) && !launch::is_open() {
            return Err(Error::usage(format!(
                "rank {} sends to or receives from itself; a self send/recv needs a group so both halves can run together",
                self.rank
            )));
        }
        call.check(self.rank, self.nranks)?;
        launch::submit(self, call)
    }
}

fn same_len(what: &str, a: usize, b: usize) -> Result<()> {
    if a != b {
        return Err(Error::arg(format!("{what}: send has {a} elements but recv has {b}; they must be equal")));
    }
    Ok(())
}

fn blocks(what: &str, total: usize, n: usize) -> Result<usize> {
    if !total.is_multiple_of(n) {
        return Err(Error::arg(format!("{what}: {total} elements do not split into {n} equal blocks (one per rank)")));
    }
    Ok(total / n)
}

/// The safe interface on typed slices. Lengths are element counts.
impl Comm {
    /// `recv[i] = op over all ranks of send[i]`.
    pub fn all_reduce<T: Element>(&self, send: &[T], recv: &mut [T], op: RedOp) -> Result<()> {
        launch::refuse_borrowed("all_reduce")?;
        same_len("all_reduce", send.len(), recv.len())?;
        // SAFETY: the slices are valid and, being a shared and a mutable borrow, disjoint.
        unsafe { self.all_reduce_raw(send.as_ptr().cast(), recv.as_mut_ptr().cast(), send.len(), T::DTYPE, op) }
    }

    pub fn all_reduce_in_place<T: Element>(&self, buf: &mut [T], op: RedOp) -> Result<()> {
        launch::refuse_borrowed("all_reduce_in_place")?;
        let p = buf.as_mut_ptr().cast::<u8>();
        // SAFETY: one valid buffer used as both input and output.
        unsafe { self.all_reduce_raw(p, p, buf.len(), T::DTYPE, op) }
    }

    /// Copies the root's `send` into every rank's `recv`. Off the root `send` is ignored (pass
    /// an empty slice).
    pub fn broadcast<T: Element>(&self, send: &[T], recv: &mut [T], root: usize) -> Result<()> {
        launch::refuse_borrowed("broadcast")?;
        if self.rank == root {
            same_len("broadcast", send.len(), recv.len())?;
        }
        // SAFETY: valid slices; send is only read at the root, where its length was checked.
        unsafe { self.broadcast_raw(send.as_ptr().cast(), recv.as_mut_ptr().cast(), recv.len(), T::DTYPE, root) }
    }

    pub fn broadcast_in_place<T: Element>(&self, buf: &mut [T], root: usize) -> Result<()> {
        launch::refuse_borrowed("broadcast_in_place")?;
        let p = buf.as_mut_ptr().cast::<u8>();
        // SAFETY: one valid buffer.
        unsafe { self.broadcast_raw(p, p, buf.len(), T::DTYPE, root) }
    }

    /// Reduces every rank's `send` into the root's `recv`. Off the root `recv` is ignored (pass
    /// an empty slice).
    pub fn reduce<T: Element>(&self, send: &[T], recv: &mut [T], op: RedOp, root: usize) -> Result<()> {
        launch::refuse_borrowed("reduce")?;
        if self.rank == root {
            same_len("reduce", send.len(), recv.len())?;
        }
        // SAFETY: valid slices; recv is only written at the root, where its length was checked.
        unsafe { self.reduce_raw(send.as_ptr().cast(), recv.as_mut_ptr().cast(), send.len(), T::DTYPE, op, root) }
    }

    pub fn reduce_in_place<T: Element>(&self, buf: &mut [T], op: RedOp, root: usize) -> Result<()> {
        launch::refuse_borrowed("reduce_in_place")?;
        let p = buf.as_mut_ptr().cast::<u8>();
        // SAFETY: one valid buffer.
        unsafe { self.reduce_raw(p, p, buf.len(), T::DTYPE, op, root) }
    }

    /// `recv` (nranks × send.len()) gets every rank's `send`, in rank order.
    pub fn all_gather<T: Element>(&self, send: &[T], recv: &mut [T]) -> Result<()> {
        launch::refuse_borrowed("all_gather")?;
        let want = send.len().checked_mul(self.nranks).ok_or_else(|| Error::arg("all_gather: count overflows"))?;
        if recv.len() != want {
            return Err(Error::arg(format!(
                "all_gather: recv has {} elements but needs nranks × send = {} × {} = {want}",
                recv.len(),
                self.nranks,
                send.len()
            )));
        }
        // SAFETY: valid, disjoint slices of the checked lengths.
        unsafe { self.all_gather_raw(send.as_ptr().cast(), recv.as_mut_ptr().cast(), send.len(), T::DTYPE) }
    }

    /// In place: this rank's contribution is already at `buf[rank * len/nranks ..]`.
    pub fn all_gather_in_place<T: Element>(&self, buf: &mut [T]) -> Result<()> {
        launch::refuse_borrowed("all_gather_in_place")?;
        let count = blocks("all_gather_in_place", buf.len(), self.nranks)?;
        let p = buf.as_mut_ptr();
        // SAFETY: block `rank` lies within buf.
        unsafe {
            let own = p.add(self.rank * count).cast::<u8>();
            self.all_gather_raw(own, p.cast(), count, T::DTYPE)
        }
    }

    /// `recv` (send.len() / nranks) gets the reduction of every rank's block `rank` of `send`.
    pub fn reduce_scatter<T: Element>(&self, send: &[T], recv: &mut [T], op: RedOp) -> Result<()> {
        launch::refuse_borrowed("reduce_scatter")?;
        let want = recv.len().checked_mul(self.nranks).ok_or_else(|| Error::arg("reduce_scatter: count overflows"))?;
        if send.len() != want {
            return Err(Error::arg(format!(
                "reduce_scatter: send has {} elements but needs nranks × recv = {} × {} = {want}",
                send.len(),
                self.nranks,
                recv.len()
            )));
        }
        // SAFETY: valid, disjoint slices of the checked lengths.
        unsafe { self.reduce_scatter_raw(send.as_ptr().cast(), recv.as_mut_ptr().cast(), recv.len(), T::DTYPE, op) }
    }

    /// In place: the result lands in `buf[rank * len/nranks ..][..len/nranks]`.
    pub fn reduce_scatter_in_place<T: Element>(&self, buf: &mut [T], op: RedOp) -> Result<()> {
        launch::refuse_borrowed("reduce_scatter_in_place")?;
        let count = blocks("reduce_scatter_in_place", buf.len(), self.nranks)?;
        let p = buf.as_mut_ptr();
        // SAFETY: block `rank` lies within buf.
        unsafe {
            let own = p.add(self.rank * count).cast::<u8>();
            self.reduce_scatter_raw(p.cast(), own, count, T::DTYPE, op)
        }
    }

    /// Block j of `send` goes to rank j; block i of `recv` comes from rank i.
    pub fn all_to_all<T: Element>(&self, send: &[T], recv: &mut [T]) -> Result<()> {
        launch::refuse_borrowed("all_to_all")?;
        same_len("all_to_all", send.len(), recv.len())?;
        let count = blocks("all_to_all", send.len(), self.nranks)?;
        // SAFETY: valid, disjoint slices.
        unsafe { self.all_to_all_raw(send.as_ptr().cast(), recv.as_mut_ptr().cast(), count, T::DTYPE) }
    }

    pub fn all_to_all_in_place<T: Element>(&self, buf: &mut [T]) -> Result<()> {
        launch::refuse_borrowed("all_to_all_in_place")?;
        let count = blocks("all_to_all_in_place", buf.len(), self.nranks)?;
        let p = buf.as_mut_ptr().cast::<u8>();
        // SAFETY: one valid buffer.
        unsafe { self.all_to_all_raw(p, p, count, T::DTYPE) }
    }

    /// Sends `buf` to `peer`, which must call `recv` with the same count and type.
    pub fn send<T: Element>(&self, buf: &[T], peer: usize) -> Result<()> {
        launch::refuse_borrowed("send")?;
        // SAFETY: a valid slice.
        unsafe { self.send_raw(buf.as_ptr().cast(), buf.len(), T::DTYPE, peer) }
    }

    pub fn recv<T: Element>(&self, buf: &mut [T], peer: usize) -> Result<()> {
        launch::refuse_borrowed("recv")?;
        // SAFETY: a valid slice.
        unsafe { self.recv_raw(buf.as_mut_ptr().cast(), buf.len(), T::DTYPE, peer) }
    }
}

#[cfg(test)]
mod tests {
    use crate::{group_end, group_start, Comm, Config, Profilers, RedOp};
    use occl_telemetry::{CommInfo, EventDescr, EventId, EventMask, Profiler, Sink};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex};

    /// Counts the communicators it is asked about and the events its sinks see.
    #[derive(Default)]
    struct Counting {
        comms: Mutex<Vec<u64>>,
        events: Arc<AtomicUsize>,
    }

    struct CountSink(Arc<AtomicUsize>);

    impl Sink for CountSink {
        fn interest(&self) -> EventMask {
            EventMask::ALL
        }
        fn start(&self, _id: EventId, _parent: Option<EventId>, _ev: &EventDescr<'_>) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    impl Profiler for Counting {
        fn name(&self) -> &str {
            "counting"
        }
        fn init(&self, comm: &CommInfo<'_>) -> Option<Arc<dyn Sink>> {
            self.comms.lock().unwrap_or_else(|p| p.into_inner()).push(comm.comm_hash);
            Some(Arc::new(CountSink(self.events.clone())))
        }
    }

    /// A communicator handed its profilers reports to those and to no process-wide one.
    #[test]
    fn handed_in_profilers_replace_the_process_ones() {
        let global = Arc::new(Counting::default());
        occl_telemetry::profiler::register(global.clone());
        let mine = Arc::new(Counting::default());
        let given = Config { profilers: Profilers::Given(vec![mine.clone()]), ..Config::default() };
        let with = Comm::init_all_with(2, given).expect("two ranks with a profiler");
        let none = Comm::init_all_with(2, Config { profilers: Profilers::Given(Vec::new()), ..Config::default() })
            .expect("two ranks with none");
        let process = Comm::init_all_with(2, Config::default()).expect("two ranks with the process's");
        let g: Arc<dyn Profiler> = global.clone();
        occl_telemetry::profiler::unregister(&g);
        for set in [&with, &none, &process] {
            std::thread::scope(|s| {
                for c in set.iter() {
                    s.spawn(move || c.all_reduce(&[1f32; 64], &mut [0f32; 64], RedOp::Sum).expect("all_reduce"));
                }
            });
        }
        let seen = global.comms.lock().unwrap_or_else(|p| p.into_inner()).clone();
        assert_eq!(*mine.comms.lock().unwrap_or_else(|p| p.into_inner()), vec![with[0].id(); 2]);
        assert!(mine.events.load(Ordering::Relaxed) > 0, "the handed-in profiler saw the all-reduce");
        assert!(!seen.contains(&with[0].id()) && !seen.contains(&none[0].id()), "{seen:x?}");
        assert_eq!(seen.iter().filter(|h| **h == process[0].id()).count(), 2, "the default reaches the process's");
        for c in with.into_iter().chain(none).chain(process) {
            c.destroy().expect("destroy");
        }
    }

    /// The pipeline end to end on thread ranks (what `--no-default-features` must still run): a
    /// plain all-reduce, then a group whose collectives and exchange run at its end.
    #[test]
    fn thread_ranks_run_collectives_and_groups() {
        let comms = Comm::init_all_with(3, Config::default()).expect("three thread ranks");
        std::thread::scope(|s| {
            for c in &comms {
                s.spawn(move || {
                    let (r, n) = (c.rank(), c.nranks());
                    let send: Vec<f32> = (0..1000).map(|i| (r * 1000 + i) as f32).collect();
                    let mut sum = vec![0f32; 1000];
                    c.all_reduce(&send, &mut sum, RedOp::Sum).expect("all_reduce");
                    assert!(sum.iter().enumerate().all(|(i, v)| *v == (3000 + 3 * i) as f32));
                    let mut got = vec![0u64; 64];
                    let mine = vec![r as u64; 64];
                    let mut b = vec![0i32; 16];
                    group_start();
                    // SAFETY: the buffers outlive the group, which ends below.
                    unsafe {
                        c.recv_raw(got.as_mut_ptr().cast(), 64, crate::DataType::U64, (r + n - 1) % n).expect("recv");
                        c.send_raw(mine.as_ptr().cast(), 64, crate::DataType::U64, (r + 1) % n).expect("send");
                        let p = b.as_mut_ptr().cast::<u8>();
                        if r == 0 {
                            b.iter_mut().enumerate().for_each(|(i, x)| *x = i as i32);
                        }
                        c.broadcast_raw(p, p, 16, crate::DataType::I32, 0).expect("broadcast");
                    }
                    group_end().expect("group_end");
                    assert!(got.iter().all(|v| *v == ((r + n - 1) % n) as u64));
                    assert!(b.iter().enumerate().all(|(i, x)| *x == i as i32));
                });
            }
        });
        for c in comms {
            c.destroy().expect("destroy");
        }
    }
}
