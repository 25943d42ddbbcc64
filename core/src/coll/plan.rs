//! How many slices each algorithm moves to and from each peer: the ProxyOps of an operation,
//! known before it runs (NCCL's ProxyOp descriptor carries `nSteps`). The schedules (`ring`,
//! `tree`, `pat`) are walked by `Count`, the same code that runs them; the one-shot all-reduce
//! and the direct exchanges (all-to-all, send, receive) are counted by formula, each checked
//! against what it runs. The profiler test checks that the steps actually seen equal these
//! counts for every collective.

use super::algo::Algo;
use super::shape::Shape;
use super::walk::{Exec, Span};
use crate::error::Result;
use crate::profile::Leg;
use crate::record::CollType;

fn slices(bytes: usize, slice: usize) -> usize {
    bytes.div_ceil(slice)
}

/// Legs with at least one step, sends before receives per peer.
pub(crate) fn legs(s: &Shape) -> Vec<Leg> {
    use super::{pat, ring, tree};
    if s.nranks == 1 {
        return Vec::new();
    }
    match (s.coll, s.algo) {
        (CollType::AllReduce, Algo::OneShot) | (CollType::AllToAll | CollType::Send | CollType::Recv, _) => direct(s),
        (CollType::AllReduce, Algo::Tree) => by_peer(walked(s, tree::all_reduce)),
        (CollType::Broadcast, Algo::Tree) => by_peer(walked(s, tree::broadcast)),
        (CollType::Reduce, Algo::Tree) => by_peer(walked(s, tree::reduce)),
        (CollType::AllGather, Algo::Pat) => by_peer(walked(s, pat::all_gather)),
        (CollType::ReduceScatter, Algo::Pat) => by_peer(walked(s, pat::reduce_scatter)),
        (CollType::AllReduce, _) => sends_first(walked(s, ring::all_reduce_ring)),
        (CollType::AllGather, _) => sends_first(walked(s, ring::all_gather_ring)),
        (CollType::ReduceScatter, _) => sends_first(walked(s, ring::reduce_scatter_ring)),
        (CollType::Broadcast, _) => sends_first(walked(s, ring::broadcast_chain)),
        (CollType::Reduce, _) => sends_first(walked(s, ring::reduce_chain)),
    }
}

/// The legs of the one-shot all-reduce and the direct exchanges (all-to-all, send, receive),
/// counted by formula: these run per call at sizes where walking would cost more than the
/// operation's own work.
fn direct(s: &Shape) -> Vec<Leg> {
    let (n, r) = (s.nranks, s.rank);
    // Sized for its legs where they are many (a profiled 8 B all-reduce is some hundreds of ns).
    let mut out = Vec::with_capacity(match s.coll {
        CollType::AllReduce | CollType::AllToAll => 2 * n.saturating_sub(1),
        _ => 1,
    });
    let mut leg = |peer: usize, send: bool, steps: usize| {
        if steps > 0 {
            out.push(Leg { peer, send, steps });
        }
    };
    let bytes = s.count * s.elem;
    match s.coll {
        CollType::AllReduce => {
            // Every piece goes to every peer and comes from every peer (the schedule,
            // `direct::all_reduce_one_shot`).
            let per_peer = super::walk::pieces(bytes, s.chunk, s.elem).map(|(_, l)| slices(l, s.slice)).sum();
            for p in (0..n).filter(|&p| p != r) {
                leg(p, true, per_peer);
                leg(p, false, per_peer);
            }
        }
        CollType::AllToAll => {
            // Each block in pieces of a chunk (`direct::all_to_all`).
            let per_peer: usize = super::walk::pieces(bytes, s.chunk, 1).map(|(_, l)| slices(l, s.slice)).sum();
            for k in 1..n {
                leg((r + k) % n, true, per_peer);
                leg((r + n - k) % n, false, per_peer);
            }
        }
        CollType::Send => leg(s.peer, true, slices(bytes, s.slice)),
        CollType::Recv => leg(s.peer, false, slices(bytes, s.slice)),
        _ => {}
    }
    out
}

/// Counts the slices of a schedule per peer and direction (an `Exec` that moves nothing).
pub(crate) struct Count {
    slice: usize,
    pub legs: Vec<Leg>,
}

impl Count {
    pub(crate) fn new(slice: usize) -> Count {
        Count { slice: slice.max(1), legs: Vec::new() }
    }

    fn add(&mut self, peer: usize, send: bool, len: usize) {
        let steps = slices(len, self.slice);
        if steps == 0 {
            return;
        }
        match self.legs.iter_mut().find(|l| l.peer == peer && l.send == send) {
            Some(l) => l.steps += steps,
            None => self.legs.push(Leg { peer, send, steps }),
        }
    }
}

impl Exec for Count {
    fn send(&mut self, to: usize, src: Span) -> Result<()> {
        self.add(to, true, src.len);
        Ok(())
    }
    fn recv(&mut self, from: usize, dst: Span) -> Result<()> {
        self.add(from, false, dst.len);
        Ok(())
    }
    fn recv_reduce(&mut self, from: usize, _: Span, dst: Span, _: bool) -> Result<()> {
        self.add(from, false, dst.len);
        Ok(())
    }
    fn recv_reduce_send(&mut self, from: usize, to: usize, src: Span) -> Result<()> {
        self.add(to, true, src.len);
        self.add(from, false, src.len);
        Ok(())
    }
    fn recv_reduce_copy_send(&mut self, from: usize, to: usize, _: Span, dst: Span, _: bool) -> Result<()> {
        self.add(to, true, dst.len);
        self.add(from, false, dst.len);
        Ok(())
    }
    fn recv_copy_send(&mut self, from: usize, to: usize, dst: Span) -> Result<()> {
        self.add(to, true, dst.len);
        self.add(from, false, dst.len);
        Ok(())
    }
    fn copy(&mut self, _: Span, _: Span) -> Result<()> {
        Ok(())
    }
    fn reduce(&mut self, _: Span, _: Span) -> Result<()> {
        Ok(())
    }
    fn finish(&mut self, _: Span) -> Result<()> {
        Ok(())
    }
}

/// The legs of a schedule, in the order it first uses them.
fn walked(s: &Shape, walk: impl FnOnce(&Shape, &mut Count) -> Result<()>) -> Vec<Leg> {
    let mut c = Count::new(s.slice);
    // Counting never fails; a schedule that did would only lose its profiler steps.
    let _ = walk(s, &mut c);
    c.legs
}

/// Legs by peer, sends before receives per peer.
fn by_peer(mut legs: Vec<Leg>) -> Vec<Leg> {
    legs.sort_by_key(|l| (l.peer, !l.send));
    legs
}

/// Sends before receives: a ring's or chain's send to the next position, then its receive from
/// the previous one.
fn sends_first(mut legs: Vec<Leg>) -> Vec<Leg> {
    legs.sort_by_key(|l| !l.send);
    legs
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(coll: CollType, algo: Algo, n: usize, r: usize, count: usize) -> Shape<'static> {
        Shape {
            coll,
            algo,
            nranks: n,
            rank: r,
            count,
            elem: 4,
            slice: 1024,
            chunk: 4096,
            root: 0,
            peer: 0,
            order: None,
        }
    }

    #[test]
    fn every_send_has_a_matching_receive() {
        // Summed over ranks, slices sent to a peer equal slices that peer receives from the sender.
        for coll in [CollType::AllReduce, CollType::AllGather, CollType::ReduceScatter, CollType::AllToAll] {
            for n in 2..6 {
                for count in [0, 1, 17, 255, 256, 1000, 5000] {
                    let all: Vec<Vec<Leg>> = (0..n).map(|r| legs(&shape(coll, Algo::Ring, n, r, count))).collect();
                    for (r, ls) in all.iter().enumerate() {
                        for l in ls.iter().filter(|l| l.send) {
                            let back = all[l.peer].iter().find(|m| !m.send && m.peer == r).map_or(0, |m| m.steps);
                            assert_eq!(l.steps, back, "{coll:?} n={n} count={count} {r}->{}", l.peer);
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn the_one_shot_legs_are_its_schedules() {
        for n in 2..6 {
            for r in 0..n {
                for count in [0, 1, 17, 255, 256, 1000, 1025, 5000] {
                    let s = shape(CollType::AllReduce, Algo::OneShot, n, r, count);
                    assert_eq!(
                        legs(&s),
                        by_peer(walked(&s, crate::coll::direct::all_reduce_one_shot)),
                        "n={n} r={r} count={count}"
                    );
                }
            }
        }
    }

    #[test]
    fn chain_ends_only_send_or_receive() {
        let b = |r| legs(&Shape { root: 2, ..shape(CollType::Broadcast, Algo::Chain, 4, r, 600) });
        assert_eq!(b(2), vec![Leg { peer: 3, send: true, steps: 3 }]);
        assert_eq!(b(1), vec![Leg { peer: 0, send: false, steps: 3 }]);
        assert_eq!(b(0).len(), 2);
        assert!(legs(&shape(CollType::AllReduce, Algo::Ring, 1, 0, 100)).is_empty());
        assert!(legs(&shape(CollType::Send, Algo::Direct, 2, 0, 0)).is_empty());
    }
}
