//! Ring and chain algorithms. The ring loops over the buffer in pieces of `nranks` chunks, each
//! chunk at most half a FIFO, so a rank's send of step k never waits for its neighbour to reach
//! step k; within a chunk the primitives pipeline slice by slice (NCCL's `runRing`).

use super::{copy_unless_same, Ctx};
use crate::dtype::RedOp;
use crate::error::Result;
use crate::reduce;

fn align_elems(es: usize) -> usize {
    (64 / es).max(1)
}

/// One piece of the all-reduce ring: `rem` elements from `base`, cut into `n` chunks of `per`.
#[derive(Clone, Copy)]
pub(super) struct Piece {
    pub base: usize,
    pub rem: usize,
    pub per: usize,
}

impl Piece {
    /// The piece that starts at `base`.
    pub(super) fn at(base: usize, count: usize, n: usize, chunk_elems: usize, es: usize) -> Piece {
        let rem = (n * chunk_elems).min(count - base);
        let per = rem.div_ceil(n).next_multiple_of(align_elems(es)).min(chunk_elems);
        Piece { base, rem, per }
    }

    /// Chunk `c`'s first element and length (the last chunks may be short or empty).
    pub(super) fn chunk(self, c: usize) -> (usize, usize) {
        let off = (c * self.per).min(self.rem);
        (self.base + off, self.per.min(self.rem - off))
    }
}

/// All-reduce: reduce-scatter then all-gather around the ring, 2(n-1) steps per piece.
pub(crate) fn all_reduce(ctx: &mut Ctx<'_>, send: *const u8, recv: *mut u8, count: usize) -> Result<()> {
    let (n, r, es) = (ctx.nranks, ctx.rank, ctx.dt.size());
    if n == 1 {
        // SAFETY: send/recv hold count elements each, identical or disjoint (checked by Comm).
        unsafe { copy_unless_same(send, recv, count * es) };
        return Ok(());
    }
    let chunk_elems = (ctx.chunk() / es).max(1);
    let (next, prev) = ((r + 1) % n, (r + n - 1) % n);
    let mut p = ctx.prims(Some(next), Some(prev))?;
    p.stream = crate::copy::streams(count * es);
    let mut base = 0;
    while base < count {
        let piece = Piece::at(base, count, n, chunk_elems, es);
        let chunk = |c: usize| piece.chunk(c);
        // SAFETY (all pointer arithmetic below): chunk() stays within [0, count).
        let at = |ptr: *const u8, o: usize| unsafe { ptr.add(o * es) };
        let at_mut = |ptr: *mut u8, o: usize| unsafe { ptr.add(o * es) };
        let (o, l) = chunk((r + n - 1) % n);
        if l > 0 {
            p.send(at(send, o), l * es)?;
        }
        for k in 2..n {
            let (o, l) = chunk((r + n - k) % n);
            if l > 0 {
                p.recv_reduce_send(at(send, o), l * es)?;
            }
        }
        let (o, l) = chunk(r);
        if l > 0 {
            p.recv_reduce_copy_send(at(send, o), at_mut(recv, o), l * es, true)?;
        }
        for j in 1..n - 1 {
            let (o, l) = chunk((r + n - j) % n);
            if l > 0 {
                p.recv_copy_send(at_mut(recv, o), l * es)?;
            }
        }
        let (o, l) = chunk((r + 1) % n);
        if l > 0 {
            p.recv(at_mut(recv, o), l * es)?;
        }
        base += piece.rem;
    }
    p.finish()
}

/// All-gather: each rank's `count` elements land at `recv[rank * count..]` on every rank.
pub(crate) fn all_gather(ctx: &mut Ctx<'_>, send: *const u8, recv: *mut u8, count: usize) -> Result<()> {
    let (n, r, es) = (ctx.nranks, ctx.rank, ctx.dt.size());
    // Blocks are laid out by rank; the ring runs on positions (`Ctx::order`).
    let order = ctx.order;
    let owner = |p: usize| order.map_or(p, |o| o.rank(p));
    // SAFETY: recv holds n*count elements; send is either recv's own block or disjoint.
    unsafe { copy_unless_same(send, recv.add(owner(r) * count * es), count * es) };
    if n == 1 {
        return Ok(());
    }
    let chunk_elems = (ctx.chunk() / es).max(1);
    let mut p = ctx.prims(Some((r + 1) % n), Some((r + n - 1) % n))?;
    p.allow_direct();
    p.stream = crate::copy::streams(n * count * es);
    let mut base = 0;
    while base < count {
        let len = chunk_elems.min(count - base);
        // SAFETY: block c, elements base..base+len, is within recv; likewise for send.
        let block = |c: usize| unsafe { recv.add((owner(c) * count + base) * es) };
        p.send(unsafe { send.add(base * es) }, len * es)?;
        for k in 1..n - 1 {
            p.recv_copy_send(block((r + n - k) % n), len * es)?;
        }
        p.recv(block((r + 1) % n), len * es)?;
        base += len;
    }
    p.finish()
}

/// Reduce-scatter: rank r gets the reduction of every rank's block r (`count` elements).
pub(crate) fn reduce_scatter(ctx: &mut Ctx<'_>, send: *const u8, recv: *mut u8, count: usize) -> Result<()> {
    let (n, r, es) = (ctx.nranks, ctx.rank, ctx.dt.size());
    if n == 1 {
        // SAFETY: as in all_reduce.
        unsafe { copy_unless_same(send, recv, count * es) };
        return Ok(());
    }
    let chunk_elems = (ctx.chunk() / es).max(1);
    let order = ctx.order;
    let owner = |p: usize| order.map_or(p, |o| o.rank(p));
    let mut p = ctx.prims(Some((r + 1) % n), Some((r + n - 1) % n))?;
    let mut base = 0;
    while base < count {
        let len = chunk_elems.min(count - base);
        // SAFETY: block c of send, elements base..base+len (blocks by rank, the ring by position).
        let block = |c: usize| unsafe { send.add((owner(c) * count + base) * es) };
        p.send(block((r + n - 1) % n), len * es)?;
        for k in 2..n {
            p.recv_reduce_send(block((r + n - k) % n), len * es)?;
        }
        // SAFETY: recv holds count elements.
        p.recv_reduce_copy(block(r), unsafe { recv.add(base * es) }, len * es)?;
        base += len;
    }
    p.finish()
}

/// Broadcast as a pipelined chain root → root+1 → … → root-1.
pub(crate) fn broadcast(ctx: &mut Ctx<'_>, send: *const u8, recv: *mut u8, bytes: usize, root: usize) -> Result<()> {
    let (n, r) = (ctx.nranks, ctx.rank);
    let pos = (r + n - root) % n;
    if r == root {
        // SAFETY: both hold `bytes` at the root; identical or disjoint.
        unsafe { copy_unless_same(send, recv, bytes) };
    }
    if n == 1 || bytes == 0 {
        return Ok(());
    }
    let (next, prev) = ((r + 1) % n, (r + n - 1) % n);
    if pos == 0 {
        let mut p = ctx.prims(Some(next), None)?;
        p.send(send, bytes)?;
        p.finish()
    } else if pos == n - 1 {
        let mut p = ctx.prims(None, Some(prev))?;
        p.stream = crate::copy::streams(bytes);
        p.recv(recv, bytes)
    } else {
        let mut p = ctx.prims(Some(next), Some(prev))?;
        p.stream = crate::copy::streams(bytes);
        p.recv_copy_send(recv, bytes)?;
        p.finish()
    }
}

/// Reduce as a pipelined chain root+1 → root+2 → … → root.
pub(crate) fn reduce(ctx: &mut Ctx<'_>, send: *const u8, recv: *mut u8, bytes: usize, root: usize) -> Result<()> {
    let (n, r) = (ctx.nranks, ctx.rank);
    if n == 1 {
        // SAFETY: as in broadcast.
        unsafe { copy_unless_same(send, recv, bytes) };
        if ctx.op == RedOp::Avg && bytes > 0 {
            // SAFETY: recv holds `bytes`.
            reduce::div_in_place(ctx.dt, unsafe { std::slice::from_raw_parts_mut(recv, bytes) }, 1);
        }
        return Ok(());
    }
    if bytes == 0 {
        return Ok(());
    }
    let pos = (r + 2 * n - root - 1) % n;
    let (next, prev) = ((r + 1) % n, (r + n - 1) % n);
    if pos == 0 {
        let mut p = ctx.prims(Some(next), None)?;
        p.send(send, bytes)?;
        p.finish()
    } else if pos == n - 1 {
        ctx.prims(None, Some(prev))?.recv_reduce_copy(send, recv, bytes)
    } else {
        ctx.prims(Some(next), Some(prev))?.recv_reduce_send(send, bytes)
    }
}
