//! Test-only: runs every rank's schedule at once, in one thread, over bounded FIFOs of small
//! slots, moving real bytes. It checks each collective's result on every rank, that no rank can
//! block for good (a round in which nobody moves is a deadlock), that every slice sent is
//! received with the length its receiver expects, and that `plan::Count` predicts the slices
//! each peer sees (`plan::legs`).

use super::algo::Algo;
use super::shape::Shape;
use super::walk::{Buf, Exec, Span};
use crate::error::Result;
use crate::record::CollType;
use std::collections::{HashMap, VecDeque};

#[derive(Clone, Copy, Debug)]
enum Op {
    Send(usize, Span),
    Recv(usize, Span),
    RecvReduce(usize, Span, Span, bool),
    RecvReduceSend(usize, usize, Span),
    RecvReduceCopySend(usize, usize, Span, Span, bool),
    RecvCopySend(usize, usize, Span),
    Copy(Span, Span),
    Reduce(Span, Span),
    Finish(Span),
}

#[derive(Default)]
struct Log(Vec<Op>);

impl Exec for Log {
    fn send(&mut self, to: usize, src: Span) -> Result<()> {
        self.0.push(Op::Send(to, src));
        Ok(())
    }
    fn recv(&mut self, from: usize, dst: Span) -> Result<()> {
        self.0.push(Op::Recv(from, dst));
        Ok(())
    }
    fn recv_reduce(&mut self, from: usize, src: Span, dst: Span, finish: bool) -> Result<()> {
        self.0.push(Op::RecvReduce(from, src, dst, finish));
        Ok(())
    }
    fn recv_reduce_send(&mut self, from: usize, to: usize, src: Span) -> Result<()> {
        self.0.push(Op::RecvReduceSend(from, to, src));
        Ok(())
    }
    fn recv_reduce_copy_send(&mut self, from: usize, to: usize, src: Span, dst: Span, finish: bool) -> Result<()> {
        self.0.push(Op::RecvReduceCopySend(from, to, src, dst, finish));
        Ok(())
    }
    fn recv_copy_send(&mut self, from: usize, to: usize, dst: Span) -> Result<()> {
        self.0.push(Op::RecvCopySend(from, to, dst));
        Ok(())
    }
    fn copy(&mut self, src: Span, dst: Span) -> Result<()> {
        self.0.push(Op::Copy(src, dst));
        Ok(())
    }
    fn reduce(&mut self, src: Span, dst: Span) -> Result<()> {
        self.0.push(Op::Reduce(src, dst));
        Ok(())
    }
    fn finish(&mut self, dst: Span) -> Result<()> {
        self.0.push(Op::Finish(dst));
        Ok(())
    }
}

/// Elements are i64 (8 bytes); the operator is Sum or Avg.
const ES: usize = 8;

struct Rank {
    ops: Vec<Op>,
    at: usize,
    /// Slice within the current op.
    slice: usize,
    /// One arena holding the three buffers; in place, Send and Recv overlap as the API says.
    mem: Vec<i64>,
    base: [usize; 3],
}

impl Rank {
    fn at(&self, s: Span, k: usize) -> usize {
        let b = match s.buf {
            Buf::Send => self.base[0],
            Buf::Recv => self.base[1],
            Buf::Scratch => self.base[2],
        };
        assert!(s.off.is_multiple_of(ES) && s.len.is_multiple_of(ES), "span {s:?} cuts an element");
        b + s.off / ES + k
    }
    fn read(&self, s: Span) -> Vec<i64> {
        (0..s.len / ES).map(|k| self.mem[self.at(s, k)]).collect()
    }
    fn write(&mut self, s: Span, v: &[i64]) {
        for (k, x) in v.iter().enumerate() {
            let i = self.at(s, k);
            self.mem[i] = *x;
        }
    }
}

struct Sim {
    n: usize,
    avg: bool,
    slice: usize,
    nslots: usize,
    fifos: HashMap<(usize, usize), VecDeque<Vec<i64>>>,
    /// Slices moved per (peer, direction) per rank, to compare with the plan.
    seen: Vec<HashMap<(usize, bool), usize>>,
}

impl Sim {
    fn room(&self, from: usize, to: usize) -> bool {
        self.fifos.get(&(from, to)).map_or(0, VecDeque::len) < self.nslots
    }
    fn ready(&self, from: usize, to: usize) -> bool {
        self.fifos.get(&(from, to)).is_some_and(|q| !q.is_empty())
    }
    fn push(&mut self, me: usize, to: usize, v: Vec<i64>) {
        *self.seen[me].entry((to, true)).or_default() += 1;
        self.fifos.entry((me, to)).or_default().push_back(v);
    }
    fn pop(&mut self, me: usize, from: usize, want: usize) -> Vec<i64> {
        *self.seen[me].entry((from, false)).or_default() += 1;
        let v = self.fifos.get_mut(&(from, me)).and_then(VecDeque::pop_front).expect("ready");
        assert_eq!(v.len() * ES, want, "rank {me} expected a {want}-byte slice from {from}");
        v
    }

    /// `own + incoming`, divided by n for a finished `Avg`.
    fn fold(&self, own: Vec<i64>, inc: &[i64], finish: bool) -> Vec<i64> {
        let n = self.n as i64;
        own.iter().zip(inc).map(|(a, b)| if finish && self.avg { (a + b) / n } else { a + b }).collect()
    }

    /// Advances rank `me` by one slice (or one local op); false when it must wait.
    fn step(&mut self, me: usize, r: &mut Rank) -> bool {
        let Some(&op) = r.ops.get(r.at) else { return false };
        let span = match op {
            Op::Send(_, s) | Op::Recv(_, s) | Op::RecvReduceSend(_, _, s) | Op::RecvCopySend(_, _, s) => s,
            Op::RecvReduce(_, _, d, _) | Op::RecvReduceCopySend(_, _, _, d, _) => d,
            Op::Copy(..) | Op::Reduce(..) | Op::Finish(_) => Span::new(Buf::Send, 0, 0),
        };
        let nsl = span.len.div_ceil(self.slice);
        let (o, l) = (r.slice * self.slice, self.slice.min(span.len.saturating_sub(r.slice * self.slice)));
        let piece = |s: Span| s.sub(o, l);
        let n = self.n as i64;
        match op {
            Op::Send(to, s) => {
                if !self.room(me, to) {
                    return false;
                }
                let v = r.read(piece(s));
                self.push(me, to, v);
            }
            Op::Recv(from, d) => {
                if !self.ready(from, me) {
                    return false;
                }
                let v = self.pop(me, from, l);
                r.write(piece(d), &v);
            }
            Op::RecvReduce(from, s, d, fin) => {
                if !self.ready(from, me) {
                    return false;
                }
                let inc = self.pop(me, from, l);
                let v = self.fold(r.read(piece(s)), &inc, fin);
                r.write(piece(d), &v);
            }
            Op::RecvReduceSend(from, to, s) => {
                if !self.ready(from, me) || !self.room(me, to) {
                    return false;
                }
                let inc = self.pop(me, from, l);
                let v = self.fold(r.read(piece(s)), &inc, false);
                self.push(me, to, v);
            }
            Op::RecvReduceCopySend(from, to, s, d, fin) => {
                if !self.ready(from, me) || !self.room(me, to) {
                    return false;
                }
                let inc = self.pop(me, from, l);
                let v = self.fold(r.read(piece(s)), &inc, fin);
                r.write(piece(d), &v);
                self.push(me, to, v);
            }
            Op::RecvCopySend(from, to, d) => {
                if !self.ready(from, me) || !self.room(me, to) {
                    return false;
                }
                let v = self.pop(me, from, l);
                r.write(piece(d), &v);
                self.push(me, to, v);
            }
            Op::Copy(s, d) => {
                let v = r.read(s);
                r.write(d, &v);
            }
            Op::Reduce(s, d) => {
                let v: Vec<i64> = r.read(d).iter().zip(r.read(s)).map(|(a, b)| a + b).collect();
                r.write(d, &v);
            }
            Op::Finish(d) => {
                if self.avg {
                    let v: Vec<i64> = r.read(d).iter().map(|x| x / n).collect();
                    r.write(d, &v);
                }
            }
        }
        r.slice += 1;
        if r.slice >= nsl {
            r.at += 1;
            r.slice = 0;
        }
        true
    }
}

/// What rank `r` contributes at element `i`: a multiple of n so that Avg is exact.
fn value(n: usize, r: usize, i: usize) -> i64 {
    ((r * 7 + i * 3) % 11 + 1) as i64 * n as i64
}

/// Runs `coll` with `algo` on n simulated ranks and checks the result and the plan.
fn run(coll: CollType, algo: Algo, n: usize, count: usize, root: usize, in_place: bool, avg: bool) {
    run_sliced(coll, algo, n, count, root, in_place, avg, 16);
}

/// `run` over FIFOs of four slots of `slice` bytes (pieces of two).
#[allow(clippy::too_many_arguments)] // run's arguments and the slot size
fn run_sliced(
    coll: CollType,
    algo: Algo,
    n: usize,
    count: usize,
    root: usize,
    in_place: bool,
    avg: bool,
    slice: usize,
) {
    let nslots = 4;
    let chunk = slice * nslots / 2;
    let what = format!("{coll:?} {algo:?} n={n} count={count} root={root} in_place={in_place} avg={avg}");
    let shape = |rank| Shape { coll, algo, nranks: n, rank, count, elem: ES, slice, chunk, root, peer: 0, order: None };
    let (in_blocks, out_blocks) = match coll {
        CollType::AllGather => (1, n),
        CollType::ReduceScatter => (n, 1),
        _ => (1, 1),
    };
    let mut ranks: Vec<Rank> = (0..n)
        .map(|r| {
            let s = shape(r);
            let mut log = Log::default();
            let scratch = match (coll, algo) {
                (_, Algo::Ring | Algo::Chain) => 0,
                (CollType::ReduceScatter, _) => super::pat::reduce_scatter_scratch(&s),
                (CollType::Reduce, _) => super::tree::reduce_scratch(&s),
                (CollType::AllReduce, Algo::OneShot) => super::direct::one_shot_scratch(&s),
                (CollType::AllReduce, Algo::Tree) => super::tree::all_reduce_scratch(&s),
                _ => 0,
            } / ES;
            let walk = match (coll, algo) {
                (CollType::AllReduce, Algo::Ring) => super::ring::all_reduce_ring(&s, &mut log),
                (CollType::AllGather, Algo::Ring) => super::ring::all_gather_ring(&s, &mut log),
                (CollType::ReduceScatter, Algo::Ring) => super::ring::reduce_scatter_ring(&s, &mut log),
                (CollType::Broadcast, Algo::Chain) => super::ring::broadcast_chain(&s, &mut log),
                (CollType::Reduce, Algo::Chain) => super::ring::reduce_chain(&s, &mut log),
                (CollType::AllReduce, Algo::Tree) => super::tree::all_reduce(&s, &mut log),
                (CollType::AllReduce, _) => super::direct::all_reduce_one_shot(&s, &mut log),
                (CollType::Broadcast, _) => super::tree::broadcast(&s, &mut log),
                (CollType::Reduce, _) => super::tree::reduce(&s, &mut log),
                (CollType::AllGather, _) => super::pat::all_gather(&s, &mut log),
                _ => super::pat::reduce_scatter(&s, &mut log),
            };
            walk.expect("walk");
            let (ilen, olen) = (in_blocks * count, out_blocks * count);
            // Arena: [send | recv | scratch], or overlapping send/recv in place.
            let (sb, rb, total) = match (in_place, coll) {
                (false, _) => (0, ilen, ilen + olen),
                (true, CollType::AllGather) => (r * count, 0, olen),
                (true, CollType::ReduceScatter) => (0, r * count, ilen),
                (true, _) => (0, 0, ilen),
            };
            let mut mem = vec![-1; total + scratch];
            for i in 0..ilen {
                mem[sb + i] = value(n, r, i);
            }
            Rank { ops: log.0, at: 0, slice: 0, mem, base: [sb, rb, total] }
        })
        .collect();
    let mut sim = Sim { n, avg, slice, nslots, fifos: HashMap::new(), seen: vec![HashMap::new(); n] };
    loop {
        let mut moved = false;
        for (me, r) in ranks.iter_mut().enumerate() {
            while sim.step(me, r) {
                moved = true;
            }
        }
        if ranks.iter().all(|r| r.at == r.ops.len()) {
            break;
        }
        assert!(moved, "{what}: deadlock: ranks at ops {:?}", ranks.iter().map(|r| r.at).collect::<Vec<_>>());
    }
    assert!(sim.fifos.values().all(VecDeque::is_empty), "{what}: slices left unreceived");
    let total = |i: usize| -> i64 {
        let s: i64 = (0..n).map(|r| value(n, r, i)).sum();
        if avg {
            s / n as i64
        } else {
            s
        }
    };
    for (r, rk) in ranks.iter().enumerate() {
        let out = |k: usize| rk.mem[rk.base[1] + k];
        for k in 0..out_blocks * count {
            let want = match coll {
                CollType::AllReduce => total(k),
                CollType::Broadcast => value(n, root, k),
                CollType::Reduce if r == root => total(k),
                CollType::Reduce => continue,
                CollType::AllGather => value(n, k / count, k % count),
                _ => total(r * count + k),
            };
            assert_eq!(out(k), want, "{what}: rank {r} element {k}");
        }
        let plan = super::plan::legs(&shape(r));
        for l in &plan {
            assert_eq!(sim.seen[r].get(&(l.peer, l.send)).copied().unwrap_or(0), l.steps, "{what}: rank {r} leg {l:?}");
        }
        let planned: usize = plan.iter().map(|l| l.steps).sum();
        let moved: usize = sim.seen[r].values().sum();
        assert_eq!(planned, moved, "{what}: rank {r}: the plan misses legs");
    }
}

const COUNTS: [usize; 9] = [0, 1, 2, 3, 5, 8, 13, 33, 100];

#[test]
fn tree_all_reduce_any_rank_count() {
    for n in 1..=12 {
        for count in COUNTS {
            for in_place in [false, true] {
                run(CollType::AllReduce, Algo::Tree, n, count, 0, in_place, n % 2 == 1);
            }
        }
    }
}

#[test]
fn tree_all_reduce_two_trees() {
    // Past DOUBLE_MIN the data splits over both trees.
    let count = super::tree::DOUBLE_MIN / ES + 37;
    for n in [2, 3, 4, 5, 7, 8] {
        run(CollType::AllReduce, Algo::Tree, n, count, 0, n == 5, n == 7);
    }
}

#[test]
fn tree_all_reduce_two_trees_of_one_piece_each() {
    // Pieces as large as each tree's half: both trees' messages between a pair of ranks share
    // its FIFOs in one order.
    let count = super::tree::DOUBLE_MIN / ES + 37;
    for n in [2, 3, 4, 5] {
        for in_place in [false, true] {
            run_sliced(CollType::AllReduce, Algo::Tree, n, count, 0, in_place, n == 3, count.div_ceil(4) * ES);
        }
    }
}

#[test]
fn tree_and_chain_broadcast_and_reduce_any_root() {
    for algo in [Algo::Tree, Algo::Chain] {
        for n in 1..=10 {
            for root in 0..n {
                for count in [0, 1, 4, 13, 40] {
                    run(CollType::Broadcast, algo, n, count, root, root % 2 == 0, false);
                    run(CollType::Reduce, algo, n, count, root, root % 2 == 1, count % 2 == 0);
                }
            }
        }
    }
}

#[test]
fn pat_all_gather_and_reduce_scatter_any_rank_count() {
    for n in 1..=17 {
        for count in COUNTS {
            for in_place in [false, true] {
                run(CollType::AllGather, Algo::Pat, n, count, 0, in_place, false);
                run(CollType::ReduceScatter, Algo::Pat, n, count, 0, in_place, count % 2 == 1);
            }
        }
    }
}

#[test]
fn one_shot_all_reduce_in_pieces() {
    for n in 1..=9 {
        for count in COUNTS {
            run(CollType::AllReduce, Algo::OneShot, n, count, 0, count % 2 == 0, n % 3 == 0);
        }
    }
}

#[test]
fn ring_all_reduce_all_gather_and_reduce_scatter_any_rank_count() {
    for n in 1..=9 {
        for count in COUNTS.iter().copied().chain([200, 333]) {
            for in_place in [false, true] {
                run(CollType::AllReduce, Algo::Ring, n, count, 0, in_place, n % 3 == 0);
                run(CollType::AllGather, Algo::Ring, n, count, 0, in_place, false);
                run(CollType::ReduceScatter, Algo::Ring, n, count, 0, in_place, count % 2 == 1);
            }
        }
    }
}
