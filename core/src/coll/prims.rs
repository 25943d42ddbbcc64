//! The step primitives every algorithm is built from, as in NCCL's `prims_simple.h`: send,
//! recv, and the fused receive-reduce-copy-send variants. Each cuts its range into slices of one
//! FIFO slot and moves slice by slice, so consecutive ranks of a ring or chain work on
//! consecutive slices at the same time (the pipeline).
//!
//! Pointers, not slices: in-place collectives read and write the same user memory, and the
//! primitives build slices only for disjoint ranges (in place, they take the `*_in_place`
//! kernels instead).

use crate::dtype::{DataType, RedOp};
use crate::error::{Error, Result};
use crate::record::CollType;
use crate::reduce;
use crate::transport::fifo::{Desc, Ends, Msg, RecvFifo, SendFifo};
use crate::transport::wait::Deadline;

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
    /// Bytes per slice: one slot, whole elements.
    pub slice: usize,
}

fn describe(d: &Desc) -> String {
    let coll = CollType::from_u8(d.coll).map_or("unknown operation", |c| c.name());
    let dt = DataType::from_u8(d.dtype).map_or("?", |t| t.name());
    let op = RedOp::from_u8(d.redop).map_or("?", |o| o.name());
    let root = if d.root == u32::MAX { String::new() } else { format!(", root {}", d.root) };
    format!("#{} {coll}(count {}, {dt}, {op}{root})", d.opseq, d.count())
}

impl<'a> Prims<'a> {
    fn tx(&mut self) -> Result<&mut SendEnd<'a>> {
        self.send.as_mut().ok_or_else(|| Error::internal("primitive needs a send peer"))
    }

    fn take_send(&mut self) -> Result<*mut u8> {
        let d = self.deadline;
        let s = self.tx()?;
        s.fifo.acquire(&s.ends, &d)
    }

    fn post(&mut self, len: usize) -> Result<()> {
        let desc = self.desc;
        self.tx()?.fifo.post(len, &desc);
        Ok(())
    }

    /// Waits for the next slice and checks that it belongs to the same operation.
    fn take_recv(&mut self, len: usize) -> Result<Msg> {
        let d = self.deadline;
        let expect = self.desc;
        let r = self.recv.as_mut().ok_or_else(|| Error::internal("primitive needs a receive peer"))?;
        let m = r.fifo.peek(&r.ends, &d)?;
        if m.desc != expect {
            return Err(Error::usage(format!(
                "operation mismatch: this rank runs {} but rank {} runs {}; every rank must call the same collectives in the same order with the same count, datatype, operator and root",
                describe(&expect),
                r.ends.peer,
                describe(&m.desc)
            )));
        }
        if m.len != len {
            return Err(Error::usage(format!(
                "operation mismatch: rank {} sent a {}-byte slice where this rank expected {len} bytes for {}",
                r.ends.peer,
                m.len,
                describe(&expect)
            )));
        }
        Ok(m)
    }

    fn release(&mut self) {
        if let Some(r) = self.recv.as_mut() {
            r.fifo.release();
        }
    }

    fn slices(&self, len: usize) -> impl Iterator<Item = (usize, usize)> {
        let s = self.slice;
        (0..len.div_ceil(s)).map(move |i| (i * s, s.min(len - i * s)))
    }

    pub(crate) fn send(&mut self, src: *const u8, len: usize) -> Result<()> {
        for (off, n) in self.slices(len) {
            let out = self.take_send()?;
            // SAFETY: src+off..+n lies in the caller's buffer; out has slot_size >= n bytes.
            unsafe { std::ptr::copy_nonoverlapping(src.add(off), out, n) };
            self.post(n)?;
        }
        Ok(())
    }

    pub(crate) fn recv(&mut self, dst: *mut u8, len: usize) -> Result<()> {
        for (off, n) in self.slices(len) {
            let m = self.take_recv(n)?;
            // SAFETY: the message holds n bytes until released; dst+off..+n is the caller's.
            unsafe { std::ptr::copy_nonoverlapping(m.data, dst.add(off), n) };
            self.release();
        }
        Ok(())
    }

    pub(crate) fn recv_copy_send(&mut self, dst: *mut u8, len: usize) -> Result<()> {
        for (off, n) in self.slices(len) {
            let m = self.take_recv(n)?;
            let out = self.take_send()?;
            // SAFETY: three disjoint ranges of n bytes (a received slot, a send slot, the user's).
            unsafe {
                std::ptr::copy_nonoverlapping(m.data, dst.add(off), n);
                std::ptr::copy_nonoverlapping(m.data, out, n);
            }
            self.post(n)?;
            self.release();
        }
        Ok(())
    }

    /// out slot = src op incoming.
    pub(crate) fn recv_reduce_send(&mut self, src: *const u8, len: usize) -> Result<()> {
        let (dt, op) = (self.dt, self.op);
        for (off, n) in self.slices(len) {
            let m = self.take_recv(n)?;
            let out = self.take_send()?;
            // SAFETY: disjoint ranges as above; src is only read.
            unsafe {
                reduce::reduce(
                    dt,
                    op,
                    std::slice::from_raw_parts_mut(out, n),
                    std::slice::from_raw_parts(src.add(off), n),
                    std::slice::from_raw_parts(m.data, n),
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
        for (off, n) in self.slices(len) {
            let m = self.take_recv(n)?;
            let out = self.take_send()?;
            // SAFETY: `dst` and `src` are either the same range (in place) or disjoint; the
            // slots are disjoint from both.
            unsafe {
                let (d, o, inc) = (
                    std::slice::from_raw_parts_mut(dst.add(off), n),
                    std::slice::from_raw_parts_mut(out, n),
                    std::slice::from_raw_parts(m.data, n),
                );
                let in_place = std::ptr::eq(src.add(off), dst.add(off));
                match (in_place, avg) {
                    (true, false) => reduce::reduce_in_place_copy(dt, op, d, o, inc),
                    (false, false) => {
                        reduce::reduce_copy2(dt, op, d, o, std::slice::from_raw_parts(src.add(off), n), inc)
                    }
                    (true, true) => {
                        reduce::reduce_in_place(dt, op, d, inc);
                        reduce::div_in_place(dt, d, nr);
                        o.copy_from_slice(d);
                    }
                    (false, true) => {
                        reduce::reduce(dt, op, d, std::slice::from_raw_parts(src.add(off), n), inc);
                        reduce::div_in_place(dt, d, nr);
                        o.copy_from_slice(d);
                    }
                }
            }
            self.post(n)?;
            self.release();
        }
        Ok(())
    }

    /// dst = src op incoming (finished for Avg).
    pub(crate) fn recv_reduce_copy(&mut self, src: *const u8, dst: *mut u8, len: usize) -> Result<()> {
        let (dt, op, nr) = (self.dt, self.op, self.nranks);
        for (off, n) in self.slices(len) {
            let m = self.take_recv(n)?;
            // SAFETY: as in recv_reduce_copy_send.
            unsafe {
                let d = std::slice::from_raw_parts_mut(dst.add(off), n);
                let inc = std::slice::from_raw_parts(m.data, n);
                if std::ptr::eq(src.add(off), dst.add(off)) {
                    reduce::reduce_in_place(dt, op, d, inc);
                } else {
                    reduce::reduce(dt, op, d, std::slice::from_raw_parts(src.add(off), n), inc);
                }
                if op == RedOp::Avg {
                    reduce::div_in_place(dt, d, nr);
                }
            }
            self.release();
        }
        Ok(())
    }
}
