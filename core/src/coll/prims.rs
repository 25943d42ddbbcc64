//! The step primitives every algorithm is built from, as in NCCL's `prims_simple.h`: send,
//! recv, and the fused receive-reduce-copy-send variants. Each cuts its range into slices of one
//! FIFO slot and moves slice by slice, so consecutive ranks of a ring or chain work on
//! consecutive slices at the same time (the pipeline).
//!
//! Single copy: when the receiver can read this process's memory (shm between processes with
//! `process_vm_readv`, or threads of one process) and the range is large, a slot carries the
//! address of the data instead of the data; the receiver reads it straight into its own buffer
//! and may forward the address of *that* buffer in turn. Pointed-to memory is the caller's
//! input, or output already final for this operation, so it stays unchanged; `finish` waits
//! until the receiver has read everything before the operation returns.
//!
//! Pointers, not slices: in-place collectives read and write the same user memory, and the
//! primitives build slices only for disjoint ranges (in place, they take the `*_in_place`
//! kernels instead).

use crate::dtype::{DataType, RedOp};
use crate::error::{Error, Result};
use crate::profile::{Steps, Tally};
use crate::reduce;
use crate::transport::fifo::{Desc, Direct, Ends, Msg, RecvFifo, SendFifo};
use crate::transport::shm;
use crate::wait::Deadline;

/// One direction of a primitive: the FIFO and how to tell that its other end is gone.
pub(crate) struct SendEnd<'a> {
    pub fifo: &'a mut SendFifo,
    pub ends: Ends<'a>,
}

pub(crate) struct RecvEnd<'a> {
    pub fifo: &'a mut RecvFifo,
    pub ends: Ends<'a>,
}

pub(crate) struct Prims<'a> {
    pub send: Option<SendEnd<'a>>,
    pub recv: Option<RecvEnd<'a>>,
    pub deadline: Deadline,
    pub desc: Desc,
    pub dt: DataType,
    pub op: RedOp,
    /// Divisor that finishes `Avg`.
    pub nranks: usize,
    /// Bytes per slice: one slot (Simple) or one LL step at most, whole elements.
    pub slice: usize,
    /// Slices go as LL steps (`transport::fifo::ll`) instead of Simple slots. Everything above
    /// `take_send`/`post`/`take_recv`/`release` is the same for both protocols.
    pub ll: bool,
    /// Where pointer slots are read into before a reduction (one slice, allocated on first use).
    pub scratch: Vec<u64>,
    /// Whether this algorithm sends large ranges by pointer (see `allow_direct`).
    pub direct: bool,
    /// Final writes to the user's buffer use streaming stores (a large operation: its output
    /// will not be read from cache, and skipping the read of each line before the write saves
    /// a third of the memory traffic of an out-of-place all-reduce).
    pub stream: bool,
    /// ProxyStep events, when a sink wants them.
    pub steps: Option<Steps<'a>>,
    /// The same slices counted for the direct metrics route.
    pub tally: Option<&'a Tally>,
}

/// Ranges at least this large go by pointer where the receiver can read them: below it, the
/// system call costs more than the copy it saves.
pub(crate) const DIRECT_MIN: usize = 128 << 10;

/// Checks that slice `m` from `peer` belongs to the operation `expect` and holds the `len` bytes
/// this rank's schedule takes next.
#[inline]
pub(crate) fn check_incoming(m: &Msg, expect: &Desc, len: usize, peer: usize) -> Result<()> {
    if m.desc != *expect {
        return Err(Error::usage(format!(
            "operation mismatch: this rank runs {} but rank {peer} runs {}; every rank must call the same collectives in the same order with the same count, datatype, operator and root",
            expect,
            m.desc
        )));
    }
    if m.len != len {
        return Err(Error::usage(format!(
            "operation mismatch: rank {peer} sent a {}-byte slice where this rank expected {len} bytes for {}",
            m.len, expect
        )));
    }
    Ok(())
}

impl<'a> Prims<'a> {
    fn tx(&mut self) -> Result<&mut SendEnd<'a>> {
        self.send.as_mut().ok_or_else(|| Error::internal("primitive needs a send peer"))
    }

    fn take_send(&mut self) -> Result<*mut u8> {
        if let Some(st) = self.steps.as_mut() {
            st.send_peer_wait();
        }
        let (d, ll) = (self.deadline, self.ll);
        let s = self.tx()?;
        if ll {
            s.fifo.ll_acquire(&s.ends, &d)
        } else {
            s.fifo.acquire(&s.ends, &d)
        }
    }

    fn post(&mut self, len: usize) -> Result<()> {
        let (desc, ll) = (self.desc, self.ll);
        let s = self.tx()?;
        if ll {
            s.fifo.ll_post(len, &desc);
        } else {
            s.fifo.post(len, &desc);
        }
        if let (Some(st), Some(s)) = (self.steps.as_mut(), self.send.as_ref()) {
            st.send_posted(len, s.fifo);
        }
        if let Some(t) = self.tally {
            t.sent(len);
        }
        Ok(())
    }

    /// A slice that will be sent begins (before the receive it waits on, if any).
    fn begin_send(&mut self) {
        if let Some(st) = self.steps.as_mut() {
            st.send_begin();
        }
    }

    /// Waits for the next slice and checks that it belongs to the same operation.
    fn take_recv(&mut self, len: usize) -> Result<Msg> {
        if let (Some(st), Some(r)) = (self.steps.as_mut(), self.recv.as_ref()) {
            st.recv_begin(r.fifo);
        }
        let d = self.deadline;
        let expect = self.desc;
        let ll = self.ll;
        let r = self.recv.as_mut().ok_or_else(|| Error::internal("primitive needs a receive peer"))?;
        let m = r.fifo.peek_as(ll, &r.ends, &d)?;
        check_incoming(&m, &expect, len, r.ends.peer)?;
        if let Some(st) = self.steps.as_mut() {
            st.recv_arrived(len);
        }
        if let Some(t) = self.tally {
            t.arrived(len);
        }
        Ok(m)
    }

    #[inline]
    fn release(&mut self) {
        if let Some(r) = self.recv.as_mut() {
            r.fifo.release_as(self.ll);
        }
        if let Some(st) = self.steps.as_mut() {
            st.recv_done();
        }
        if let Some(t) = self.tally {
            t.released();
        }
    }

    fn slices(&self, len: usize) -> impl Iterator<Item = (usize, usize)> {
        let s = self.slice;
        (0..len.div_ceil(s)).map(move |i| (i * s, s.min(len - i * s)))
    }

    /// Lets large ranges go by pointer. Worth it where every rank sends and receives at once
    /// (all-gather, all-to-all, send/recv): each pulls its peer's data with one copy while the
    /// peer does the same. In a chain (broadcast, reduce) or the all-reduce ring it is not: the
    /// FIFO splits each hop's copying between sender and receiver, so two cores share it, and
    /// measured 2-rank busbw drops by up to half with pointers there.
    pub(crate) fn allow_direct(&mut self) {
        self.direct = true;
    }

    /// Whether a `len`-byte range should go to the send peer by pointer.
    fn by_pointer(&self, len: usize) -> bool {
        self.direct && !self.ll && len >= DIRECT_MIN && self.send.as_ref().is_some_and(|s| s.fifo.may_post_ptr())
    }

    /// Copies message `m` (`n` bytes) to `dst`, reading the sender's memory for a pointer slot.
    fn fetch(&mut self, m: &Msg, dst: *mut u8, n: usize) -> Result<()> {
        let Some(addr) = m.remote else {
            // SAFETY: the slot holds n bytes until released; dst is the caller's n bytes.
            unsafe { std::ptr::copy_nonoverlapping(m.data, dst, n) };
            return Ok(());
        };
        let r = self.recv.as_ref().ok_or_else(|| Error::internal("primitive needs a receive peer"))?;
        match r.fifo.direct {
            // SAFETY: a peer thread of this process published the address of n bytes that stay
            // valid until we release the slot (it drains before returning).
            Direct::SameProcess => unsafe { std::ptr::copy_nonoverlapping(addr as *const u8, dst, n) },
            Direct::Cma(pid) => shm::read_peer(pid, addr, dst, n).map_err(|e| {
                Error::remote(r.ends.peer, format!("reading {n} bytes of its buffer (process_vm_readv) failed: {e}"))
            })?,
            Direct::No => {
                return Err(Error::internal(format!(
                    "rank {} sent a pointer on a FIFO without single-copy support",
                    r.ends.peer
                )))
            }
        }
        Ok(())
    }

    /// The incoming slice's bytes: in the slot, or read into the scratch buffer.
    fn incoming(&mut self, m: &Msg, n: usize) -> Result<*const u8> {
        if m.remote.is_none() {
            return Ok(m.data);
        }
        if self.scratch.len() * 8 < n {
            self.scratch = vec![0u64; n.div_ceil(8)];
        }
        let dst = self.scratch.as_mut_ptr().cast::<u8>();
        self.fetch(m, dst, n)?;
        Ok(dst)
    }

    /// Posts `n` bytes at `src` to the send peer: by pointer, or copied into the slot.
    fn put(&mut self, src: *const u8, n: usize, by_ptr: bool) -> Result<()> {
        let out = self.take_send()?;
        let (desc, ll) = (self.desc, self.ll);
        let s = self.tx()?;
        if ll {
            // SAFETY: src has n bytes (caller); encoded straight from there.
            unsafe { s.fifo.ll_post_from(src, n, &desc) };
        } else if by_ptr {
            s.fifo.post_ptr(src, n, &desc);
        } else {
            // SAFETY: src has n bytes (caller); the slot has slot_size >= n.
            unsafe { std::ptr::copy_nonoverlapping(src, out, n) };
            s.fifo.post(n, &desc);
        }
        if let (Some(st), Some(s)) = (self.steps.as_mut(), self.send.as_ref()) {
            st.send_posted(n, s.fifo);
        }
        if let Some(t) = self.tally {
            t.sent(n);
        }
        Ok(())
    }

    /// Posts this operation's descriptor alone, a message of no data (`coll::rooted`).
    pub(crate) fn announce(&mut self) -> Result<()> {
        self.take_send()?;
        self.post(0)
    }

    /// Makes this primitive's waits watch their own peers only (not the rest of the
    /// communicator), for at most `within`.
    pub(crate) fn only_this_peer(&mut self, within: std::time::Duration) -> &mut Self {
        self.deadline = Deadline::after(within);
        if let Some(s) = self.send.as_mut() {
            s.ends.members = None;
        }
        if let Some(r) = self.recv.as_mut() {
            r.ends.members = None;
        }
        self
    }

    /// Takes the receive peer's descriptor-only message and checks it is this operation's.
    pub(crate) fn expect_announce(&mut self) -> Result<()> {
        self.take_recv(0)?;
        self.release();
        Ok(())
    }

    /// Waits until the send peer has read every pointer this operation posted.
    pub(crate) fn finish(&mut self) -> Result<()> {
        let d = self.deadline;
        match self.send.as_mut() {
            Some(s) => s.fifo.drain(&s.ends, &d),
            None => Ok(()),
        }
    }

    pub(crate) fn send(&mut self, src: *const u8, len: usize) -> Result<()> {
        let by_ptr = self.by_pointer(len);
        for (off, n) in self.slices(len) {
            // SAFETY: src+off..+n lies in the caller's buffer.
            self.put(unsafe { src.add(off) }, n, by_ptr)?;
        }
        Ok(())
    }

    pub(crate) fn recv(&mut self, dst: *mut u8, len: usize) -> Result<()> {
        for (off, n) in self.slices(len) {
            let m = self.take_recv(n)?;
            // SAFETY: dst+off..+n is the caller's.
            let d = unsafe { dst.add(off) };
            if self.stream && m.remote.is_none() {
                // SAFETY: the slot holds n bytes until released.
                unsafe { crate::copy::stream(d, m.data, n) };
            } else {
                self.fetch(&m, d, n)?;
            }
            self.release();
        }
        Ok(())
    }

    /// dst = incoming, and the same to the next peer (by pointer to dst where it can read us).
    pub(crate) fn recv_copy_send(&mut self, dst: *mut u8, len: usize) -> Result<()> {
        let by_ptr = self.by_pointer(len);
        for (off, n) in self.slices(len) {
            self.begin_send();
            let m = self.take_recv(n)?;
            // SAFETY: dst+off..+n is the caller's; final for this operation once written.
            let d = unsafe { dst.add(off) };
            if self.stream && m.remote.is_none() && !by_ptr {
                // Forward from the slot (in cache); stream the user's copy past the cache.
                let out = self.take_send()?;
                // SAFETY: three disjoint ranges of n bytes.
                unsafe {
                    crate::copy::stream(d, m.data, n);
                    std::ptr::copy_nonoverlapping(m.data, out, n);
                }
                self.post(n)?;
                self.release();
                continue;
            }
            self.fetch(&m, d, n)?;
            self.release();
            self.put(d, n, by_ptr)?;
        }
        Ok(())
    }

    /// out slot = src op incoming.
    pub(crate) fn recv_reduce_send(&mut self, src: *const u8, len: usize) -> Result<()> {
        let (dt, op) = (self.dt, self.op);
        for (off, n) in self.slices(len) {
            self.begin_send();
            let m = self.take_recv(n)?;
            let inc = self.incoming(&m, n)?;
            let out = self.take_send()?;
            // SAFETY: disjoint ranges (a slot or scratch, a send slot, the caller's input).
            unsafe {
                reduce::reduce(
                    dt,
                    op,
                    std::slice::from_raw_parts_mut(out, n),
                    std::slice::from_raw_parts(src.add(off), n),
                    std::slice::from_raw_parts(inc, n),
                );
            }
            self.post(n)?;
            self.release();
        }
        Ok(())
    }

    /// dst = src op incoming (finished for Avg when `last`), and the same to the next peer.
    pub(crate) fn recv_reduce_copy_send(&mut self, src: *const u8, dst: *mut u8, len: usize, last: bool) -> Result<()> {
        let (dt, op, nr) = (self.dt, self.op, self.nranks);
        let avg = last && op == RedOp::Avg;
        let by_ptr = self.by_pointer(len);
        for (off, n) in self.slices(len) {
            self.begin_send();
            let m = self.take_recv(n)?;
            let inc = self.incoming(&m, n)?;
            // SAFETY: `dst` and `src` are either the same range (in place) or disjoint; slots
            // and scratch are disjoint from both.
            unsafe {
                let (s, d) = (src.add(off), dst.add(off));
                let in_place = std::ptr::eq(s, d);
                let dsl = std::slice::from_raw_parts_mut(d, n);
                let isl = std::slice::from_raw_parts(inc, n);
                if by_ptr || avg {
                    // The result goes to dst first; the peer then reads it there (or a copy).
                    if in_place {
                        reduce::reduce_in_place(dt, op, dsl, isl);
                    } else {
                        reduce::reduce(dt, op, dsl, std::slice::from_raw_parts(s, n), isl);
                    }
                    if avg {
                        reduce::div_in_place(dt, dsl, nr);
                    }
                    self.release();
                    self.put(d, n, by_ptr)?;
                    continue;
                }
                let out = std::slice::from_raw_parts_mut(self.take_send()?, n);
                if self.stream && !in_place {
                    // Reduce into the slot (in cache), then stream it to the user's buffer.
                    reduce::reduce(dt, op, out, std::slice::from_raw_parts(s, n), isl);
                    crate::copy::stream(d, out.as_ptr(), n);
                } else if in_place {
                    reduce::reduce_in_place_copy(dt, op, dsl, out, isl);
                } else {
                    reduce::reduce_copy2(dt, op, dsl, out, std::slice::from_raw_parts(s, n), isl);
                }
            }
            self.post(n)?;
            self.release();
        }
        Ok(())
    }

    /// dst = src op incoming, finished for Avg when `finish` (a partial result is not). `src`
    /// and `dst` are the same range (in place) or disjoint.
    pub(crate) fn recv_reduce_into(&mut self, src: *const u8, dst: *mut u8, len: usize, finish: bool) -> Result<()> {
        let (dt, op, nr) = (self.dt, self.op, self.nranks);
        for (off, n) in self.slices(len) {
            let m = self.take_recv(n)?;
            let inc = self.incoming(&m, n)?;
            // SAFETY: as in recv_reduce_copy_send.
            unsafe {
                let d = std::slice::from_raw_parts_mut(dst.add(off), n);
                let i = std::slice::from_raw_parts(inc, n);
                if std::ptr::eq(src.add(off), dst.add(off)) {
                    reduce::reduce_in_place(dt, op, d, i);
                } else {
                    reduce::reduce(dt, op, d, std::slice::from_raw_parts(src.add(off), n), i);
                }
                if finish && op == RedOp::Avg {
                    reduce::div_in_place(dt, d, nr);
                }
            }
            self.release();
        }
        Ok(())
    }
}
