//! Binary trees: all-reduce over two complementary trees (reduce up, broadcast down, each tree
//! carrying half the data, as NCCL's double binary tree), and broadcast / reduce over one tree
//! rooted at the root. Every tree step moves pieces of at most half a FIFO, and a rank works
//! through its steps in one global order (up steps of piece i, then down steps of piece
//! i - lag), which every rank shares, so no rank waits on a FIFO that its reader cannot drain.
//!
//! The tree over labels 0..n: label 0 is the root, with one child (the largest power of two
//! below n); a label x > 0 at level t = trailing_zeros(x) has the children x - 2^(t-1) and the
//! largest x + 2^j < n with j < t. Leaves are the odd labels, so the mirror tree (labels
//! n-1-rank for even n, rank+1 for odd n) has them as its inner nodes: each rank does the
//! inner work in at most one of the two trees. Depth: ceil(log2 n).
//!
//! A single tree whose data is one piece (the latency case) swaps at the top: the root's only child
//! sends its subtree's partial up while the root sends its own data down, and both fold the two
//! in the same order, so the path is 2·depth − 1 messages instead of 2·depth (at 2 ranks, one).

use super::shape::Shape;
use super::walk::{pieces, Buf, Exec, Span};
use crate::error::Result;

/// Below this many bytes an all-reduce uses one tree: a second one halves each rank's bytes but
/// doubles its messages, and small messages are all latency.
pub(crate) const DOUBLE_MIN: usize = 64 << 10;

/// How ranks map to tree labels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Labels {
    /// label = (rank + k) mod n.
    Shift(usize),
    /// label = n - 1 - rank.
    Mirror,
}

impl Labels {
    fn label(self, rank: usize, n: usize) -> usize {
        match self {
            Labels::Shift(k) => (rank + k) % n,
            Labels::Mirror => n - 1 - rank,
        }
    }

    fn rank(self, label: usize, n: usize) -> usize {
        match self {
            Labels::Shift(k) => (label + n - k % n) % n,
            Labels::Mirror => n - 1 - label,
        }
    }

    /// The second tree of an all-reduce, complementary to the identity.
    pub(crate) fn second(n: usize) -> Labels {
        if n.is_multiple_of(2) {
            Labels::Mirror
        } else {
            Labels::Shift(1)
        }
    }

    /// The tree rooted at `root`.
    pub(crate) fn rooted(root: usize, n: usize) -> Labels {
        Labels::Shift((n - root % n) % n)
    }
}

/// One rank's place in a tree (ranks, not labels).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Node {
    pub parent: Option<usize>,
    pub kids: [Option<usize>; 2],
}

fn parent_label(x: usize, n: usize) -> Option<usize> {
    if x == 0 {
        return None;
    }
    let bit = 1usize << x.trailing_zeros();
    let up = (x ^ bit) | (bit << 1);
    Some(if up < n { up } else { x ^ bit })
}

fn kid_labels(y: usize, n: usize) -> [Option<usize>; 2] {
    if y == 0 {
        // The largest power of two below n.
        return [(n > 1).then(|| 1usize << (usize::BITS - 1 - (n - 1).leading_zeros())), None];
    }
    let t = y.trailing_zeros();
    if t == 0 {
        return [None, None];
    }
    let left = y - (1 << (t - 1));
    let right = (0..t).rev().map(|j| y + (1 << j)).find(|&x| x < n);
    [Some(left), right]
}

/// `rank`'s parent and children in the tree of `n` ranks labelled by `labels`.
pub(crate) fn node(rank: usize, n: usize, labels: Labels) -> Node {
    let x = labels.label(rank, n);
    let to_rank = |l: Option<usize>| l.map(|l| labels.rank(l, n));
    let [a, b] = kid_labels(x, n);
    Node { parent: to_rank(parent_label(x, n)), kids: [to_rank(a), to_rank(b)] }
}

/// Levels of the tree of `n` ranks: ceil(log2 n).
pub(crate) fn depth(n: usize) -> usize {
    n.next_power_of_two().trailing_zeros() as usize
}

/// One tree of an all-reduce: where it sits and which elements it carries.
struct Part {
    node: Node,
    /// The tree's root (a rank).
    root: usize,
    /// Byte range of the data.
    off: usize,
    len: usize,
}

impl Part {
    fn new(s: &Shape, labels: Labels, off: usize, len: usize) -> Part {
        Part { node: node(s.rank, s.nranks, labels), root: labels.rank(0, s.nranks), off, len }
    }
}

/// The tree, if the all-reduce swaps at the top (see the module's comment): one tree whose data
/// is one piece. Not with two trees: a pair of ranks would then carry one tree's swap and the
/// other's partial in opposite orders over the same FIFOs.
fn swapping<'a>(s: &Shape, parts: &'a [Part]) -> Option<&'a Part> {
    match parts {
        [p] if s.nranks > 1 && pieces(p.len, s.chunk, s.elem).count() == 1 => Some(p),
        _ => None,
    }
}

/// The parts of an all-reduce of `bytes` (one or two trees).
fn parts(s: &Shape) -> Vec<Part> {
    let (n, es) = (s.nranks, s.elem);
    let bytes = s.count * es;
    if bytes < DOUBLE_MIN || s.count < 2 || n < 2 {
        return vec![Part::new(s, Labels::Shift(0), 0, bytes)];
    }
    let half = s.count / 2 * es;
    vec![Part::new(s, Labels::Shift(0), 0, half), Part::new(s, Labels::second(n), half, bytes - half)]
}

/// Reduce one piece up the tree: the partial result (own data and the children's) goes to the
/// parent, or at the root into `recv`, finished.
fn up(x: &mut impl Exec, t: &Node, own: Span, acc: Span) -> Result<()> {
    match (t.kids, t.parent) {
        ([None, _], Some(p)) => x.send(p, own),
        ([None, _], None) => {
            x.copy(own, acc)?;
            x.finish(acc)
        }
        ([Some(c), None], Some(p)) => x.recv_reduce_send(c, p, own),
        ([Some(c), None], None) => x.recv_reduce(c, own, acc, true),
        ([Some(c0), Some(c1)], parent) => {
            x.recv_reduce(c0, own, acc, false)?;
            match parent {
                Some(p) => x.recv_reduce_send(c1, p, acc),
                None => x.recv_reduce(c1, acc, acc, true),
            }
        }
    }
}

/// Broadcast one piece down the tree: from the parent into `dst` (the root already has it
/// there) and on to the children.
fn down(x: &mut impl Exec, t: &Node, dst: Span) -> Result<()> {
    let [k0, k1] = t.kids;
    match (t.parent, k0) {
        (Some(p), Some(c)) => x.recv_copy_send(p, c, dst)?,
        (Some(p), None) => x.recv(p, dst)?,
        (None, Some(c)) => x.send(c, dst)?,
        (None, None) => {}
    }
    match k1 {
        Some(c) => x.send(c, dst),
        None => Ok(()),
    }
}

/// The up step of a tree that swaps at the top. The root sends its data to its child before it
/// takes the child's partial P, and both compute `P op root's data`: the same operands in the
/// same order, so every rank gets the same bits. In place, the root's data is overwritten by P
/// before it is folded in: it keeps a copy in scratch.
fn up_swap(x: &mut impl Exec, part: &Part, own: Span, acc: Span) -> Result<()> {
    let t = &part.node;
    match (t.parent, t.kids) {
        (None, [Some(c), _]) => {
            x.send(c, own)?;
            let keep = if x.in_place() {
                let keep = Span::new(Buf::Scratch, own.off, own.len);
                x.copy(own, keep)?;
                keep
            } else {
                own
            };
            x.recv(c, acc)?;
            x.reduce(keep, acc)?;
            x.finish(acc)
        }
        (Some(p), [None, _]) if p == part.root => x.send(p, own),
        (Some(p), [Some(c0), k1]) if p == part.root => {
            x.recv_reduce(c0, own, acc, false)?;
            if let Some(c1) = k1 {
                x.recv_reduce(c1, acc, acc, false)?;
            }
            x.send(p, acc)
        }
        _ => up(x, t, own, acc),
    }
}

/// The down step of a tree that swaps at the top: the root's child folds the root's data into
/// its partial (`own` for a leaf, else `acc`), finished, and sends that on; the root is done.
fn down_swap(x: &mut impl Exec, part: &Part, own: Span, acc: Span) -> Result<()> {
    let t = &part.node;
    match t.parent {
        None => Ok(()),
        Some(p) if p == part.root => {
            let partial = if t.kids[0].is_some() { acc } else { own };
            x.recv_reduce(p, partial, acc, true)?;
            for c in t.kids.into_iter().flatten() {
                x.send(c, acc)?;
            }
            Ok(())
        }
        Some(_) => down(x, t, acc),
    }
}

/// Scratch bytes a tree all-reduce needs on this rank: the root of a tree that swaps at the top
/// keeps its data there when in place.
pub(crate) fn all_reduce_scratch(s: &Shape) -> usize {
    swapping(s, &parts(s)).filter(|p| p.node.parent.is_none()).map_or(0, |p| p.len)
}

/// All-reduce: each tree reduces its half up to its root and broadcasts it back down, piece by
/// piece; a rank's down steps trail its up steps by `depth + 1` pieces so both directions flow.
pub(crate) fn all_reduce(s: &Shape, x: &mut impl Exec) -> Result<()> {
    let bytes = s.count * s.elem;
    if bytes == 0 {
        return Ok(());
    }
    let parts = parts(s);
    if let Some(p) = swapping(s, &parts) {
        let (own, acc) = (Span::new(Buf::Send, 0, p.len), Span::new(Buf::Recv, 0, p.len));
        up_swap(x, p, own, acc)?;
        return down_swap(x, p, own, acc);
    }
    let cut: Vec<Vec<(usize, usize)>> =
        parts.iter().map(|p| pieces(p.len, s.chunk, s.elem).map(|(o, l)| (p.off + o, l)).collect()).collect();
    let lag = depth(s.nranks) + 1;
    let most = cut.iter().map(Vec::len).max().unwrap_or(0);
    for i in 0..most + lag {
        for (p, c) in parts.iter().zip(&cut) {
            if let Some(&(o, l)) = c.get(i) {
                up(x, &p.node, Span::new(Buf::Send, o, l), Span::new(Buf::Recv, o, l))?;
            }
        }
        if let Some(j) = i.checked_sub(lag) {
            for (p, c) in parts.iter().zip(&cut) {
                if let Some(&(o, l)) = c.get(j) {
                    down(x, &p.node, Span::new(Buf::Recv, o, l))?;
                }
            }
        }
    }
    Ok(())
}

/// Broadcast down the tree rooted at `s.root`, piece by piece.
pub(crate) fn broadcast(s: &Shape, x: &mut impl Exec) -> Result<()> {
    let bytes = s.count * s.elem;
    let t = node(s.rank, s.nranks, Labels::rooted(s.root, s.nranks));
    if t.parent.is_none() {
        x.copy(Span::new(Buf::Send, 0, bytes), Span::new(Buf::Recv, 0, bytes))?;
    }
    for (o, l) in pieces(bytes, s.chunk, s.elem) {
        down(x, &t, Span::new(Buf::Recv, o, l))?;
    }
    Ok(())
}

/// Reduce up the tree rooted at `s.root`. Off the root `recv` is not the caller's to write, so
/// an inner node keeps its partial result in scratch (one piece, reused).
pub(crate) fn reduce(s: &Shape, x: &mut impl Exec) -> Result<()> {
    let bytes = s.count * s.elem;
    let t = node(s.rank, s.nranks, Labels::rooted(s.root, s.nranks));
    for (o, l) in pieces(bytes, s.chunk, s.elem) {
        let acc = if t.parent.is_none() { Span::new(Buf::Recv, o, l) } else { Span::new(Buf::Scratch, 0, l) };
        up(x, &t, Span::new(Buf::Send, o, l), acc)?;
    }
    Ok(())
}

/// Scratch bytes a tree reduce needs on this rank.
pub(crate) fn reduce_scratch(s: &Shape) -> usize {
    let t = node(s.rank, s.nranks, Labels::rooted(s.root, s.nranks));
    if t.parent.is_some() && t.kids[1].is_some() {
        s.chunk.min(s.count * s.elem)
    } else {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every rank but the root has one parent, parents list it as a child, and the depth bound
    /// holds, for both trees and rooted trees.
    #[test]
    fn trees_are_trees() {
        for n in 1..70 {
            let mut shapes = vec![Labels::Shift(0), Labels::second(n)];
            shapes.extend((0..n).map(|root| Labels::rooted(root, n)));
            for labels in shapes {
                let nodes: Vec<Node> = (0..n).map(|r| node(r, n, labels)).collect();
                let roots: Vec<usize> = (0..n).filter(|&r| nodes[r].parent.is_none()).collect();
                assert_eq!(roots.len(), 1, "n={n} {labels:?}");
                for (r, t) in nodes.iter().enumerate() {
                    if let Some(p) = t.parent {
                        assert!(nodes[p].kids.contains(&Some(r)), "n={n} {labels:?}: {p} does not list {r}");
                    }
                    for k in t.kids.iter().flatten() {
                        assert_eq!(nodes[*k].parent, Some(r), "n={n} {labels:?}");
                    }
                    let mut d = 0;
                    let mut at = r;
                    while let Some(p) = nodes[at].parent {
                        at = p;
                        d += 1;
                        assert!(d <= depth(n), "n={n} {labels:?}: rank {r} deeper than {}", depth(n));
                    }
                }
            }
        }
    }

    /// The two all-reduce trees share the inner work: no rank is inner in both, but for at most one.
    #[test]
    fn the_two_trees_are_complementary() {
        for n in 2..70 {
            let inner = |l: Labels, r: usize| node(r, n, l).kids[0].is_some();
            let both = (0..n).filter(|&r| inner(Labels::Shift(0), r) && inner(Labels::second(n), r)).count();
            assert!(both <= 1, "n={n}: {both} ranks are inner nodes of both trees");
        }
    }
}
