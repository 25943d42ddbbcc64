//! Ring and chain algorithms as schedules. The ring loops over the buffer in pieces of `nranks`
//! chunks, each chunk at most half a FIFO, so a rank's send of step k never waits for its
//! neighbour to reach step k; within a chunk the primitives pipeline slice by slice (NCCL's
//! `runRing`). A chain passes the whole buffer along the ring's positions from one end to the
//! other, slice by slice.
//!
//! Every schedule here talks to its ring neighbours only: it names them once (`Exec::link`)
//! before its first primitive, so the FIFO executor (`walk::Pipe`) holds both ends open for the
//! whole operation, as one pipeline. The entry points (`all_reduce`, …, `reduce`) run them so
//! on a communicator; `plan` counts the same schedules' slices. Blocks of all-gather and
//! reduce-scatter are laid out by rank while the ring runs on positions (`Shape::order`).

use super::algo::Algo;
use super::shape::Shape;
use super::walk::{Buf, Exec, Link, Pipe, Span};
use super::Ctx;
use crate::error::Result;
use crate::record::CollType;

fn align_elems(es: usize) -> usize {
    (64 / es).max(1)
}

/// One piece of the all-reduce ring: `rem` elements from `base`, cut into `n` chunks of `per`.
#[derive(Clone, Copy)]
struct Piece {
    base: usize,
    rem: usize,
    per: usize,
}

impl Piece {
    /// The piece that starts at `base`.
    fn at(base: usize, count: usize, n: usize, chunk_elems: usize, es: usize) -> Piece {
        let rem = (n * chunk_elems).min(count - base);
        let per = rem.div_ceil(n).next_multiple_of(align_elems(es)).min(chunk_elems);
        Piece { base, rem, per }
    }

    /// Chunk `c`'s first element and length (the last chunks may be short or empty).
    fn chunk(self, c: usize) -> (usize, usize) {
        let off = (c * self.per).min(self.rem);
        (self.base + off, self.per.min(self.rem - off))
    }
}

/// All-reduce of `count` elements around the ring (`all_reduce_ring`).
pub(crate) fn all_reduce(ctx: &mut Ctx<'_>, send: *const u8, recv: *mut u8, count: usize) -> Result<()> {
    piped(ctx, CollType::AllReduce, count, 0, send, recv, |s, x| all_reduce_ring(s, x))
}

/// All-gather of `count` elements per rank around the ring (`all_gather_ring`).
pub(crate) fn all_gather(ctx: &mut Ctx<'_>, send: *const u8, recv: *mut u8, count: usize) -> Result<()> {
    piped(ctx, CollType::AllGather, count, 0, send, recv, |s, x| all_gather_ring(s, x))
}

/// Reduce-scatter of `count` elements per rank around the ring (`reduce_scatter_ring`).
pub(crate) fn reduce_scatter(ctx: &mut Ctx<'_>, send: *const u8, recv: *mut u8, count: usize) -> Result<()> {
    piped(ctx, CollType::ReduceScatter, count, 0, send, recv, |s, x| reduce_scatter_ring(s, x))
}

/// Broadcast of `bytes` from position `root` along the chain (`broadcast_chain`).
pub(crate) fn broadcast(ctx: &mut Ctx<'_>, send: *const u8, recv: *mut u8, bytes: usize, root: usize) -> Result<()> {
    let count = bytes / ctx.dt.size();
    piped(ctx, CollType::Broadcast, count, root, send, recv, |s, x| broadcast_chain(s, x))
}

/// Reduce of `bytes` to position `root` along the chain (`reduce_chain`).
pub(crate) fn reduce(ctx: &mut Ctx<'_>, send: *const u8, recv: *mut u8, bytes: usize, root: usize) -> Result<()> {
    let count = bytes / ctx.dt.size();
    piped(ctx, CollType::Reduce, count, root, send, recv, |s, x| reduce_chain(s, x))
}

/// Runs the ring or chain schedule `walk` of `coll` on `ctx`, on the neighbours it links, held
/// for the whole operation.
fn piped(
    ctx: &mut Ctx<'_>,
    coll: CollType,
    count: usize,
    root: usize,
    send: *const u8,
    recv: *mut u8,
    walk: impl FnOnce(&Shape, &mut Pipe<'_, '_>) -> Result<()>,
) -> Result<()> {
    let algo = match coll {
        CollType::Broadcast | CollType::Reduce => Algo::Chain,
        _ => Algo::Ring,
    };
    let s = ctx.shape(coll, algo, count, root);
    let mut x = Pipe::new(ctx, send, recv);
    walk(&s, &mut x)?;
    x.drain()
}

/// The ring's neighbours of `s.rank`: (next, previous).
fn neighbours(s: &Shape) -> (usize, usize) {
    let (n, r) = (s.nranks, s.rank);
    ((r + 1) % n, (r + n - 1) % n)
}

/// Both neighbours, held for a ring whose output is `out` bytes.
fn ring_link(s: &Shape, out: usize) -> Link {
    let (next, prev) = neighbours(s);
    Link { to: Some(next), from: Some(prev), direct: false, stream: crate::copy::streams(out) }
}

/// The rank whose block sits at ring position `p`.
fn owner(s: &Shape, p: usize) -> usize {
    s.order.map_or(p, |o| o.rank(p))
}

/// All-reduce: reduce-scatter then all-gather around the ring, 2(n-1) steps per piece.
pub(crate) fn all_reduce_ring(s: &Shape, x: &mut impl Exec) -> Result<()> {
    let (n, es, count) = (s.nranks, s.elem, s.count);
    if n == 1 {
        return x.copy(Span::new(Buf::Send, 0, count * es), Span::new(Buf::Recv, 0, count * es));
    }
    let r = s.rank;
    let (next, prev) = neighbours(s);
    x.link(ring_link(s, count * es))?;
    let chunk_elems = (s.chunk / es).max(1);
    let mut base = 0;
    while base < count {
        let piece = Piece::at(base, count, n, chunk_elems, es);
        // Chunk c of the input and of the output, `None` where it is empty.
        let chunk = |c: usize| {
            let (o, l) = piece.chunk(c);
            (l > 0).then(|| (Span::new(Buf::Send, o * es, l * es), Span::new(Buf::Recv, o * es, l * es)))
        };
        if let Some((src, _)) = chunk((r + n - 1) % n) {
            x.send(next, src)?;
        }
        for k in 2..n {
            if let Some((src, _)) = chunk((r + n - k) % n) {
                x.recv_reduce_send(prev, next, src)?;
            }
        }
        if let Some((src, dst)) = chunk(r) {
            x.recv_reduce_copy_send(prev, next, src, dst, true)?;
        }
        for j in 1..n - 1 {
            if let Some((_, dst)) = chunk((r + n - j) % n) {
                x.recv_copy_send(prev, next, dst)?;
            }
        }
        if let Some((_, dst)) = chunk((r + 1) % n) {
            x.recv(prev, dst)?;
        }
        base += piece.rem;
    }
    Ok(())
}

/// All-gather: each rank's `count` elements land in its block of `recv` on every rank.
pub(crate) fn all_gather_ring(s: &Shape, x: &mut impl Exec) -> Result<()> {
    let (n, r, es, count) = (s.nranks, s.rank, s.elem, s.count);
    let blk = count * es;
    x.copy(Span::new(Buf::Send, 0, blk), Span::new(Buf::Recv, owner(s, r) * blk, blk))?;
    if n == 1 {
        return Ok(());
    }
    let (next, prev) = neighbours(s);
    // Every rank sends and receives at once: large ranges may go by pointer.
    x.link(Link { direct: true, ..ring_link(s, n * blk) })?;
    let chunk_elems = (s.chunk / es).max(1);
    let mut base = 0;
    while base < count {
        let len = chunk_elems.min(count - base) * es;
        let block = |p: usize| Span::new(Buf::Recv, owner(s, p) * blk + base * es, len);
        x.send(next, Span::new(Buf::Send, base * es, len))?;
        for k in 1..n - 1 {
            x.recv_copy_send(prev, next, block((r + n - k) % n))?;
        }
        x.recv(prev, block((r + 1) % n))?;
        base += chunk_elems.min(count - base);
    }
    Ok(())
}

/// Reduce-scatter: rank r gets the reduction of every rank's block r (`count` elements).
pub(crate) fn reduce_scatter_ring(s: &Shape, x: &mut impl Exec) -> Result<()> {
    let (n, r, es, count) = (s.nranks, s.rank, s.elem, s.count);
    let blk = count * es;
    if n == 1 {
        return x.copy(Span::new(Buf::Send, 0, blk), Span::new(Buf::Recv, 0, blk));
    }
    let (next, prev) = neighbours(s);
    x.link(ring_link(s, blk))?;
    let chunk_elems = (s.chunk / es).max(1);
    let mut base = 0;
    while base < count {
        let len = chunk_elems.min(count - base) * es;
        let block = |p: usize| Span::new(Buf::Send, owner(s, p) * blk + base * es, len);
        x.send(next, block((r + n - 1) % n))?;
        for k in 2..n {
            x.recv_reduce_send(prev, next, block((r + n - k) % n))?;
        }
        x.recv_reduce(prev, block(r), Span::new(Buf::Recv, base * es, len), true)?;
        base += chunk_elems.min(count - base);
    }
    Ok(())
}

/// Broadcast as a pipelined chain root → root+1 → … → root-1.
pub(crate) fn broadcast_chain(s: &Shape, x: &mut impl Exec) -> Result<()> {
    let (n, r, bytes) = (s.nranks, s.rank, s.count * s.elem);
    let (src, dst) = (Span::new(Buf::Send, 0, bytes), Span::new(Buf::Recv, 0, bytes));
    if r == s.root {
        x.copy(src, dst)?;
    }
    if n == 1 || bytes == 0 {
        return Ok(());
    }
    let link = chain_link(s, (r + n - s.root) % n, bytes);
    x.link(link)?;
    match (link.to, link.from) {
        (Some(next), Some(prev)) => x.recv_copy_send(prev, next, dst),
        (Some(next), None) => x.send(next, src),
        (None, Some(prev)) => x.recv(prev, dst),
        (None, None) => Ok(()),
    }
}

/// Reduce as a pipelined chain root+1 → root+2 → … → root.
pub(crate) fn reduce_chain(s: &Shape, x: &mut impl Exec) -> Result<()> {
    let (n, r, bytes) = (s.nranks, s.rank, s.count * s.elem);
    let (src, dst) = (Span::new(Buf::Send, 0, bytes), Span::new(Buf::Recv, 0, bytes));
    if n == 1 {
        x.copy(src, dst)?;
        return x.finish(dst);
    }
    if bytes == 0 {
        return Ok(());
    }
    // Only the root writes its output, and it reduces into it (no streamed copy).
    let link = chain_link(s, (r + 2 * n - s.root - 1) % n, 0);
    x.link(link)?;
    match (link.to, link.from) {
        (Some(next), Some(prev)) => x.recv_reduce_send(prev, next, src),
        (Some(next), None) => x.send(next, src),
        (None, Some(prev)) => x.recv_reduce(prev, src, dst, true),
        (None, None) => Ok(()),
    }
}

/// The neighbours a rank at position `pos` of a chain uses (0 only sends, n-1 only
/// receives), for an output of `out` bytes.
fn chain_link(s: &Shape, pos: usize, out: usize) -> Link {
    let (next, prev) = neighbours(s);
    Link { to: (pos != s.nranks - 1).then_some(next), from: (pos != 0).then_some(prev), ..ring_link(s, out) }
}
