//! Algorithms written as schedules. A schedule (`ring`, `tree`, `pat`, the one-shot all-reduce)
//! is a function that walks one rank's part of an operation and calls an `Exec` once per
//! primitive, naming buffers by role and byte offset. Several executors walk the same schedule:
//! `Run` and `Pipe` move the data through the FIFOs (a primitive at a time on the FIFOs it
//! names, or every primitive on the one pair of neighbours the schedule linked), `plan::Count`
//! counts the slices each peer sees (the profiler's ProxyOps), and the unit tests' simulator
//! runs every rank at once over bounded FIFOs, checking results and deadlock freedom. So what
//! the profiler announces is what the algorithm does.

use super::prims::Prims;
use super::Ctx;
use crate::dtype::{DataType, RedOp};
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
    /// `dst = src op incoming` (finished for `Avg` when `finish`), and the same on to `to`.
    /// `src` and `dst` are the same memory or disjoint.
    fn recv_reduce_copy_send(&mut self, from: usize, to: usize, src: Span, dst: Span, finish: bool) -> Result<()>;
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
    /// Names the only peers the primitives after it use, for the rest of the schedule (a ring's
    /// neighbours): an executor may hold their FIFOs open as one pipeline (default: nothing).
    fn link(&mut self, _link: Link) -> Result<()> {
        Ok(())
    }
}

/// The FIFO ends a schedule keeps for all its primitives (`Exec::link`), and how they move data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Link {
    pub to: Option<usize>,
    pub from: Option<usize>,
    /// Large ranges may go by pointer (`Prims::allow_direct`).
    pub direct: bool,
    /// Final writes to the output bypass the cache (`Prims::stream`).
    pub stream: bool,
}

/// The operation's buffers by role, and the local work on them that no peer takes part in.
struct Local {
    send: *const u8,
    recv: *mut u8,
    scratch: *mut u8,
    scratch_len: usize,
    dt: DataType,
    op: RedOp,
    nranks: usize,
}

impl Local {
    #[inline]
    fn ptr(&self, s: Span) -> Result<*mut u8> {
        let base = match s.buf {
            Buf::Send => self.send as *mut u8,
            Buf::Recv => self.recv,
            Buf::Scratch => {
                if s.off + s.len > self.scratch_len {
                    return Err(past_scratch(s, self.scratch_len));
                }
                self.scratch
            }
        };
        // SAFETY: schedules address only the bytes the operation's contract gives them (the
        // caller's buffers were checked by Comm; scratch is bounded above).
        Ok(unsafe { base.add(s.off) })
    }

    #[inline]
    fn copy(&self, src: Span, dst: Span) -> Result<()> {
        let (s, d) = (self.ptr(src)?, self.ptr(dst)?);
        // SAFETY: both spans are valid for len bytes; schedules copy only between identical or
        // disjoint spans.
        unsafe { super::copy_unless_same(s, d, dst.len.min(src.len)) };
        Ok(())
    }

    fn reduce(&self, src: Span, dst: Span) -> Result<()> {
        let (s, d) = (self.ptr(src)?, self.ptr(dst)?);
        let n = dst.len.min(src.len);
        // SAFETY: both spans are valid for n bytes and disjoint (the schedule's contract).
        unsafe {
            reduce::reduce_in_place(
                self.dt,
                self.op,
                std::slice::from_raw_parts_mut(d, n),
                std::slice::from_raw_parts(s, n),
            )
        };
        Ok(())
    }

    fn finish(&self, dst: Span) -> Result<()> {
        if self.op == RedOp::Avg && dst.len > 0 {
            let d = self.ptr(dst)?;
            // SAFETY: dst is valid for len bytes and not aliased during this call.
            reduce::div_in_place(self.dt, unsafe { std::slice::from_raw_parts_mut(d, dst.len) }, self.nranks);
        }
        Ok(())
    }

    fn in_place(&self) -> bool {
        std::ptr::eq(self.send, self.recv)
    }
}

#[cold]
fn past_scratch(s: Span, scratch_len: usize) -> Error {
    Error::internal(format!("schedule used scratch bytes {}..{} of {scratch_len}", s.off, s.off + s.len))
}

/// The executors that move data: each primitive runs on FIFOs, which `P` hands out.
pub(crate) struct Fifos<P> {
    peers: P,
    bufs: Local,
}

/// Where an executor on the FIFOs gets the primitives for a pair of peers.
pub(crate) trait Peers {
    /// Runs `f` on primitives that send to `to` and receive from `from`.
    fn with(&mut self, to: Option<usize>, from: Option<usize>, f: impl FnOnce(&mut Prims) -> Result<()>) -> Result<()>;
    /// `Exec::link`.
    fn link(&mut self, link: Link) -> Result<()>;
    /// `Exec::prepare_all`.
    fn prepare_all(&mut self, send: bool, bytes: usize);
}

/// Primitives built for each call on the FIFOs it names (schedules that talk to many peers).
pub(crate) struct Each<'r, 'c>(&'r mut Ctx<'c>);

/// An executor of primitives built per call (tree, PAT, one-shot).
pub(crate) type Run<'r, 'c> = Fifos<Each<'r, 'c>>;

impl<'r, 'c> Run<'r, 'c> {
    /// An executor over the caller's buffers, with `scratch_bytes` of the communicator's staging
    /// memory.
    pub(crate) fn new(ctx: &'r mut Ctx<'c>, send: *const u8, recv: *mut u8, scratch_bytes: usize) -> Run<'r, 'c> {
        if scratch_bytes > 0 && ctx.staging.len() * 8 < scratch_bytes {
            *ctx.staging = vec![0u64; scratch_bytes.div_ceil(8)];
        }
        let scratch = ctx.staging.as_mut_ptr().cast::<u8>();
        let bufs =
            Local { send, recv, scratch, scratch_len: scratch_bytes, dt: ctx.dt, op: ctx.op, nranks: ctx.nranks };
        Fifos { peers: Each(ctx), bufs }
    }
}

impl Peers for Each<'_, '_> {
    fn with(&mut self, to: Option<usize>, from: Option<usize>, f: impl FnOnce(&mut Prims) -> Result<()>) -> Result<()> {
        f(self.0.prims(&mut None, to, from)?)
    }

    fn link(&mut self, _: Link) -> Result<()> {
        Ok(())
    }

    fn prepare_all(&mut self, send: bool, bytes: usize) {
        if self.0.proto == super::algo::Proto::Ll {
            for p in self.0.peers.iter().flatten() {
                if send {
                    p.send.ll_prepare(bytes);
                } else {
                    p.recv.ll_prepare(bytes);
                }
            }
        }
    }
}

/// One pair of FIFO ends held from the schedule's `link` to its end (ring and chain): the
/// slices of consecutive primitives form one pipeline, and each leg's profiler steps one
/// sequence.
pub(crate) struct Held<'r, 'c> {
    /// The operation, until the link opens the primitives on it.
    ctx: Option<&'r mut Ctx<'c>>,
    prims: Option<Prims<'r>>,
    link: Option<Link>,
}

#[cold]
fn outside_link(to: Option<usize>, from: Option<usize>, link: Option<Link>) -> Error {
    Error::internal(format!("a pipelined schedule used peers {to:?}/{from:?} outside its link {link:?}"))
}

/// An executor on the neighbours its schedule links (ring, chain).
pub(crate) type Pipe<'r, 'c> = Fifos<Held<'r, 'c>>;

impl<'r, 'c> Pipe<'r, 'c> {
    /// An executor over the caller's buffers (no scratch).
    pub(crate) fn new(ctx: &'r mut Ctx<'c>, send: *const u8, recv: *mut u8) -> Pipe<'r, 'c> {
        let bufs = Local {
            send,
            recv,
            scratch: std::ptr::null_mut(),
            scratch_len: 0,
            dt: ctx.dt,
            op: ctx.op,
            nranks: ctx.nranks,
        };
        Fifos { peers: Held { ctx: Some(ctx), prims: None, link: None }, bufs }
    }

    /// Waits until the send neighbour has read every pointer the schedule posted (`Prims::finish`).
    /// By reference: the executor holds the primitives inline, and moving it costs a copy of
    /// them per operation.
    pub(crate) fn drain(&mut self) -> Result<()> {
        self.peers.prims.as_mut().map_or(Ok(()), Prims::finish)
    }
}

impl Peers for Held<'_, '_> {
    #[inline]
    fn with(&mut self, to: Option<usize>, from: Option<usize>, f: impl FnOnce(&mut Prims) -> Result<()>) -> Result<()> {
        let linked = |want: Option<usize>, have: Option<usize>| want.is_none() || want == have;
        match (self.prims.as_mut(), self.link) {
            (Some(p), Some(l)) if linked(to, l.to) && linked(from, l.from) => f(p),
            _ => Err(outside_link(to, from, self.link)),
        }
    }

    #[inline]
    fn link(&mut self, link: Link) -> Result<()> {
        let ctx = self.ctx.take().ok_or_else(|| Error::internal("a pipelined schedule linked twice"))?;
        let p = ctx.prims(&mut self.prims, link.to, link.from)?;
        p.stream = link.stream;
        if link.direct {
            p.allow_direct();
        }
        self.link = Some(link);
        Ok(())
    }

    fn prepare_all(&mut self, _: bool, _: usize) {}
}

impl<P: Peers> Exec for Fifos<P> {
    #[inline]
    fn send(&mut self, to: usize, src: Span) -> Result<()> {
        let p = self.bufs.ptr(src)?;
        self.peers.with(Some(to), None, |x| x.send(p, src.len))
    }

    #[inline]
    fn recv(&mut self, from: usize, dst: Span) -> Result<()> {
        let p = self.bufs.ptr(dst)?;
        self.peers.with(None, Some(from), |x| x.recv(p, dst.len))
    }

    fn recv_reduce(&mut self, from: usize, src: Span, dst: Span, finish: bool) -> Result<()> {
        let (s, d) = (self.bufs.ptr(src)?, self.bufs.ptr(dst)?);
        self.peers.with(None, Some(from), |x| x.recv_reduce_into(s, d, dst.len, finish))
    }

    fn recv_reduce_send(&mut self, from: usize, to: usize, src: Span) -> Result<()> {
        let p = self.bufs.ptr(src)?;
        self.peers.with(Some(to), Some(from), |x| x.recv_reduce_send(p, src.len))
    }

    fn recv_reduce_copy_send(&mut self, from: usize, to: usize, src: Span, dst: Span, finish: bool) -> Result<()> {
        let (s, d) = (self.bufs.ptr(src)?, self.bufs.ptr(dst)?);
        self.peers.with(Some(to), Some(from), |x| x.recv_reduce_copy_send(s, d, dst.len, finish))
    }

    fn recv_copy_send(&mut self, from: usize, to: usize, dst: Span) -> Result<()> {
        let p = self.bufs.ptr(dst)?;
        self.peers.with(Some(to), Some(from), |x| x.recv_copy_send(p, dst.len))
    }

    #[inline]
    fn copy(&mut self, src: Span, dst: Span) -> Result<()> {
        self.bufs.copy(src, dst)
    }

    fn reduce(&mut self, src: Span, dst: Span) -> Result<()> {
        self.bufs.reduce(src, dst)
    }

    fn finish(&mut self, dst: Span) -> Result<()> {
        self.bufs.finish(dst)
    }

    fn prepare_all(&mut self, send: bool, bytes: usize) {
        self.peers.prepare_all(send, bytes);
    }

    fn in_place(&self) -> bool {
        self.bufs.in_place()
    }

    #[inline]
    fn link(&mut self, link: Link) -> Result<()> {
        self.peers.link(link)
    }
}

/// Cuts `total` bytes into pieces of at most `piece` bytes (whole elements of `elem` bytes),
/// as (offset, length). Both ends of a FIFO cut alike.
pub(crate) fn pieces(total: usize, piece: usize, elem: usize) -> impl Iterator<Item = (usize, usize)> {
    let piece = (piece / elem * elem).max(elem);
    (0..total.div_ceil(piece)).map(move |i| (i * piece, piece.min(total - i * piece)))
}
