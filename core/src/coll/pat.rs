//! PAT all-gather and reduce-scatter as Bruck-style exchanges: ceil(log2 n) steps at any rank
//! count, where the ring needs n-1. At step k (d = 2^k) of the all-gather a rank holds the d
//! blocks from its own on, hands them to rank - d and takes the next d from rank + d (fewer at
//! the last step, when n is not a power of two). The reduce-scatter runs the same exchanges
//! backwards, with partial sums flowing towards each block's owner: at step k a rank passes
//! its partials of blocks rank+d.. to rank + d and folds in those of blocks rank.. from rank - d.
//!
//! Each step sends and receives the same number of bytes; the two streams are cut into pieces
//! of at most half a FIFO and alternate (send a piece, receive a piece), so a rank's sends
//! never wait on a reader that is itself stuck sending.

use super::shape::Shape;
use super::walk::{pieces, Buf, Exec, Span};
use crate::error::Result;

/// The exchange distances, smallest first: 1, 2, 4, … below n.
fn distances(n: usize) -> impl DoubleEndedIterator<Item = usize> {
    let steps = n.next_power_of_two().trailing_zeros();
    (0..steps).map(|k| 1usize << k)
}

/// Appends `s` to a list of spans, merging it with the last one when they are adjacent.
fn push(v: &mut Vec<Span>, s: Span) {
    if let Some(last) = v.last_mut() {
        if last.buf == s.buf && last.off + last.len == s.off {
            last.len += s.len;
            return;
        }
    }
    v.push(s);
}

/// Cuts a list of spans into pieces of at most `piece` bytes, never across a span boundary.
fn cut(spans: &[Span], piece: usize, elem: usize) -> Vec<Span> {
    spans.iter().flat_map(|s| pieces(s.len, piece, elem).map(move |(o, l)| s.sub(o, l))).collect()
}

/// Cuts paired (source, destination) spans of equal lengths alike.
fn cut_pairs(pairs: &[(Span, Span)], piece: usize, elem: usize) -> Vec<(Span, Span)> {
    pairs.iter().flat_map(|&(a, b)| pieces(a.len, piece, elem).map(move |(o, l)| (a.sub(o, l), b.sub(o, l)))).collect()
}

/// All-gather: `count` elements per rank; block j of `recv` ends up holding rank j's.
pub(crate) fn all_gather(s: &Shape, x: &mut impl Exec) -> Result<()> {
    let (n, r) = (s.nranks, s.rank);
    let blk = s.count * s.elem;
    x.copy(Span::new(Buf::Send, 0, blk), Span::new(Buf::Recv, r * blk, blk))?;
    if blk == 0 {
        return Ok(());
    }
    let blocks = |first: usize, m: usize| {
        let mut v = Vec::new();
        for j in 0..m {
            push(&mut v, Span::new(Buf::Recv, (first + j) % n * blk, blk));
        }
        v
    };
    for d in distances(n) {
        let m = d.min(n - d);
        let out = cut(&blocks(r, m), s.chunk, s.elem);
        let inc = cut(&blocks(r + d, m), s.chunk, s.elem);
        let (to, from) = ((r + n - d) % n, (r + d) % n);
        for i in 0..out.len().max(inc.len()) {
            if let Some(&o) = out.get(i) {
                x.send(to, o)?;
            }
            if let Some(&v) = inc.get(i) {
                x.recv(from, v)?;
            }
        }
    }
    Ok(())
}

/// Where a reduce-scatter keeps its partial results of `len` blocks from block `rank + rel`:
/// block 0 (its own) in `recv`, the others in scratch (a run never holds both).
fn acc_run(rel: usize, len: usize, blk: usize) -> Span {
    if rel == 0 {
        Span::new(Buf::Recv, 0, len * blk)
    } else {
        Span::new(Buf::Scratch, (rel - 1) * blk, len * blk)
    }
}

/// Splits blocks 0..m at `cuts` into runs (a, b).
fn runs(m: usize, cuts: &[usize]) -> Vec<(usize, usize)> {
    let mut at: Vec<usize> = cuts.iter().copied().filter(|&c| c > 0 && c < m).collect();
    at.extend([0, m]);
    at.sort_unstable();
    at.dedup();
    at.windows(2).map(|w| (w[0], w[1])).collect()
}

/// The most blocks of partial results a rank holds at once (its own included).
fn held(n: usize) -> usize {
    distances(n).map(|d| d.min(n - d)).max().unwrap_or(1)
}

/// Scratch bytes the reduce-scatter needs.
pub(crate) fn reduce_scatter_scratch(s: &Shape) -> usize {
    (held(s.nranks) - 1) * s.count * s.elem
}

/// Reduce-scatter: rank r gets the reduction of every rank's block r (`count` elements each).
pub(crate) fn reduce_scatter(s: &Shape, x: &mut impl Exec) -> Result<()> {
    let (n, r) = (s.nranks, s.rank);
    let blk = s.count * s.elem;
    let own = Span::new(Buf::Recv, 0, blk);
    if n == 1 {
        x.copy(Span::new(Buf::Send, 0, blk), own)?;
        return x.finish(own);
    }
    if blk == 0 {
        return Ok(());
    }
    // Block `rel` of this rank's input, and `len` blocks from there (no wrap past block n-1).
    let input = |rel: usize, len: usize| Span::new(Buf::Send, (r + rel) % n * blk, len * blk);
    // Blocks rel < folded already have a partial result in `acc`; the others are still only
    // this rank's input.
    let mut folded = 0;
    for d in distances(n).rev() {
        let m = d.min(n - d);
        // Both ends of a FIFO must cut the stream of m blocks alike, though each lays the blocks
        // out differently: cut at every place where either side's memory is discontiguous.
        let runs = |receiver: usize| runs(m, &[1, folded, folded.saturating_sub(d), (n - receiver) % n]);
        let mut out = Vec::new();
        for (a, b) in runs((r + d) % n) {
            let rel = d + a;
            out.push(if rel < folded { acc_run(rel, b - a, blk) } else { input(rel, b - a) });
        }
        let mut inc = Vec::new();
        for (a, b) in runs(r) {
            let src = if a < folded { acc_run(a, b - a, blk) } else { input(a, b - a) };
            inc.push((src, acc_run(a, b - a, blk)));
        }
        let out = cut(&out, s.chunk, s.elem);
        let inc = cut_pairs(&inc, s.chunk, s.elem);
        let (to, from) = ((r + d) % n, (r + n - d) % n);
        for i in 0..out.len().max(inc.len()) {
            if let Some(&o) = out.get(i) {
                x.send(to, o)?;
            }
            if let Some(&(a, b)) = inc.get(i) {
                x.recv_reduce(from, a, b, false)?;
            }
        }
        folded = folded.max(m);
    }
    x.finish(own)
}
