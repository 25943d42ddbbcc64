//! Algorithms written as schedules. A schedule (`tree`, `pat`, the one-shot all-reduce) is a
//! function that walks one rank's part of an operation and calls an `Exec` once per primitive,
//! naming buffers by role and byte offset. Three executors walk the same schedule: `Run` moves
//! the data through the FIFOs, `plan::Count` counts the slices each peer sees (the profiler's
//! ProxyOps), and the unit tests' simulator runs every rank at once over bounded FIFOs, checking
//! results and deadlock freedom. So what the profiler announces is what the algorithm does.

use super::Ctx;
use crate::error::{Error, Result};
use crate::reduce;

/// A buffer of the operation, by role.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Buf {
    /// The caller's input (may be the same memory as `Recv`: in place).
    Send,
    /// The caller's output.
    Recv,
    /// Temporary memory of the communicator (`Ctx::staging`), for partial results.
    Scratch,
}

/// `len` bytes at `off` in `buf`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Span {
    pub buf: Buf,
    pub off: usize,
    pub len: usize,
}

impl Span {
    pub(crate) const fn new(buf: Buf, off: usize, len: usize) -> Span {
        Span { buf, off, len }
    }

    /// The part `[at, at + len)` of this span.
    pub(crate) fn sub(self, at: usize, len: usize) -> Span {
        Span { buf: self.buf, off: self.off + at, len }
    }
}

/// The primitives a schedule is made of (see `prims`). Every receive takes exactly the bytes the
/// matching send posted: both sides of a FIFO cut the same lengths into the same slices.
pub(crate) trait Exec {
    fn send(&mut self, to: usize, src: Span) -> Result<()>;
    fn recv(&mut self, from: usize, dst: Span) -> Result<()>;
    /// `dst = src op incoming`; `finish` completes `Avg` (divides by nranks). `src` and `dst`
    /// are the same memory or disjoint.
    fn recv_reduce(&mut self, from: usize, src: Span, dst: Span, finish: bool) -> Result<()>;
    /// Sends `src op incoming` on.
    fn recv_reduce_send(&mut self, from: usize, to: usize, src: Span) -> Result<()>;
    /// `dst = incoming`, and the same on to `to`.
    fn recv_copy_send(&mut self, from: usize, to: usize, dst: Span) -> Result<()>;
    /// A local copy (no peer); same memory is a no-op.
    fn copy(&mut self, src: Span, dst: Span) -> Result<()>;
    /// A local reduction: `dst = dst op src` (not finished for `Avg`), disjoint spans.
    fn reduce(&mut self, src: Span, dst: Span) -> Result<()>;
    /// Completes `Avg` on `dst` (no-op for other operators).
    fn finish(&mut self, dst: Span) -> Result<()>;
    /// Hints that this rank is about to send `bytes` to every peer (`send`) or receive them from
    /// every peer: the executor may start the cache misses of all of them at once (default:
    /// nothing).
    fn prepare_all(&mut self, _send: bool, _bytes: usize) {}
    /// Whether `Send` and `Recv` may be the same memory (executors that cannot tell say yes).
    fn in_place(&self) -> bool {
        true
    }
}

/// The executor that moves data: each primitive runs on the FIFOs of its peers.
pub(crate) struct Run<'r, 'c> {
    ctx: &'r mut Ctx<'c>,
    send: *const u8,
    recv: *mut u8,
    scratch: *mut u8,
    scratch_len: usize,
}

impl<'r, 'c> Run<'r, 'c> {
    /// An executor over the caller's buffers, with `scratch_bytes` of the communicator's staging
    /// memory.
    pub(crate) fn new(ctx: &'r mut Ctx<'c>, send: *const u8, recv: *mut u8, scratch_bytes: usize) -> Run<'r, 'c> {
        if scratch_bytes > 0 && ctx.staging.len() * 8 < scratch_bytes {
            *ctx.staging = vec![0u64; scratch_bytes.div_ceil(8)];
        }
        let scratch = ctx.staging.as_mut_ptr().cast::<u8>();
        Run { ctx, send, recv, scratch, scratch_len: scratch_bytes }
    }

    fn ptr(&self, s: Span) -> Result<*mut u8> {
        let base = match s.buf {
            Buf::Send => self.send as *mut u8,
            Buf::Recv => self.recv,
            Buf::Scratch => {
                if s.off + s.len > self.scratch_len {
                    return Err(Error::internal(format!(
                        "schedule used scratch bytes {}..{} of {}",
                        s.off,
                        s.off + s.len,
                        self.scratch_len
                    )));
                }
                self.scratch
            }
        };
        // SAFETY: schedules address only the bytes the operation's contract gives them (the
        // caller's buffers were checked by Comm; scratch is bounded above).
        Ok(unsafe { base.add(s.off) })
    }
}

impl Exec for Run<'_, '_> {
    fn send(&mut self, to: usize, src: Span) -> Result<()> {
        let p = self.ptr(src)?;
        self.ctx.prims(Some(to), None)?.send(p, src.len)
    }

    fn recv(&mut self, from: usize, dst: Span) -> Result<()> {
        let p = self.ptr(dst)?;
        self.ctx.prims(None, Some(from))?.recv(p, dst.len)
    }

    fn recv_reduce(&mut self, from: usize, src: Span, dst: Span, finish: bool) -> Result<()> {
        let (s, d) = (self.ptr(src)?, self.ptr(dst)?);
        self.ctx.prims(None, Some(from))?.recv_reduce_into(s, d, dst.len, finish)
    }

    fn recv_reduce_send(&mut self, from: usize, to: usize, src: Span) -> Result<()> {
        let p = self.ptr(src)?;
        self.ctx.prims(Some(to), Some(from))?.recv_reduce_send(p, src.len)
    }

    fn recv_copy_send(&mut self, from: usize, to: usize, dst: Span) -> Result<()> {
        let p = self.ptr(dst)?;
        self.ctx.prims(Some(to), Some(from))?.recv_copy_send(p, dst.len)
    }

    fn copy(&mut self, src: Span, dst: Span) -> Result<()> {
        let (s, d) = (self.ptr(src)?, self.ptr(dst)?);
        // SAFETY: both spans are valid for len bytes; schedules copy only between identical or
        // disjoint spans.
        unsafe { super::copy_unless_same(s, d, dst.len.min(src.len)) };
        Ok(())
    }

    fn reduce(&mut self, src: Span, dst: Span) -> Result<()> {
        let (s, d) = (self.ptr(src)?, self.ptr(dst)?);
        let n = dst.len.min(src.len);
        // SAFETY: both spans are valid for n bytes and disjoint (the schedule's contract).
        unsafe {
            reduce::reduce_in_place(
                self.ctx.dt,
                self.ctx.op,
                std::slice::from_raw_parts_mut(d, n),
                std::slice::from_raw_parts(s, n),
            )
        };
        Ok(())
    }

    fn finish(&mut self, dst: Span) -> Result<()> {
        if self.ctx.op == crate::dtype::RedOp::Avg && dst.len > 0 {
            let d = self.ptr(dst)?;
            // SAFETY: dst is valid for len bytes and not aliased during this call.
            reduce::div_in_place(self.ctx.dt, unsafe { std::slice::from_raw_parts_mut(d, dst.len) }, self.ctx.nranks);
        }
        Ok(())
    }

    fn in_place(&self) -> bool {
        std::ptr::eq(self.send, self.recv)
    }

    fn prepare_all(&mut self, send: bool, bytes: usize) {
        if self.ctx.proto == super::plan::Proto::Ll {
            for p in self.ctx.peers.iter().flatten() {
                if send {
                    p.send.ll_prepare(bytes);
                } else {
                    p.recv.ll_prepare(bytes);
                }
            }
        }
    }
}

/// Cuts `total` bytes into pieces of at most `piece` bytes (whole elements of `elem` bytes),
/// as (offset, length). Both ends of a FIFO cut alike.
pub(crate) fn pieces(total: usize, piece: usize, elem: usize) -> impl Iterator<Item = (usize, usize)> {
    let piece = (piece / elem * elem).max(elem);
    (0..total.div_ceil(piece)).map(move |i| (i * piece, piece.min(total - i * piece)))
}
