//! The α-β cost model: an operation of `bytes` per rank on `n` ranks takes
//!
//! ```text
//! base + peer · (n − 2) + steps · α + msgs · γ + max(load · bytes, steps · min(step_bytes, chunk)) · scale / bw
//! ```
//!
//! `steps` counts the messages on the critical path (ring all-reduce 2(n-1), tree 2·depth, or
//! 2·depth − 1 when a single tree's data is one piece and it swaps at the top,
//! one-shot 1, chain n-1, PAT ceil(log2 n)), `msgs` those the busiest rank handles (one-shot
//! 2(n-1), an inner tree node 6), `load` the bytes the busiest rank sends, in units of `bytes`
//! (ring all-reduce 2(n-1)/n, double tree 2, one-shot n-1, all-gather n-1), and `step_bytes`
//! what one step carries, so that an operation of one piece pays for its path (a chain of n-1
//! hops of the whole buffer) and a long one for its load. α (per step), γ (per message) and bw
//! are per link, α and bw also per protocol (LL: a shorter path, less bandwidth; `chunk` is
//! then the LL piece); `base` and `scale` per (collective, algorithm, protocol, link) correct what the
//! shape alone misses (a tree's unfused primitives, the ring's single copy), and `peer` what it
//! misses per rank beyond two (the one-shot's serial sends). The constants are `defaults.conf`
//! (an `OCCL_TUNER_FILE`, embedded), fitted with `occl-tune` to `bench/algos-sweep.sh` runs: the
//! links' own constants and the shared links' corrections on a 2-core machine, the corrections
//! of `shm` and `tcp` (a core per rank) on 16-core hosts (bench/baselines/algos-sweep.md).
//! `OCCL_TUNER_FILE` sets any of them again (see `file.rs`).

use crate::coll::algo::{Algo, Proto};
use crate::coll::tree;
use crate::config::policy::FUNCS;
use crate::record::CollType;

/// What carries the messages, as the model sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Link {
    /// Shared memory, each rank on a core of its own.
    Shm,
    /// Shared memory with more ranks on the host than cores: a wait often needs the peer to be
    /// scheduled first.
    ShmShared,
    /// TCP (also a mix of shm and tcp: the slowest link paces every algorithm).
    Tcp,
    /// TCP with more ranks on a host than cores.
    TcpShared,
}

impl Link {
    pub(crate) const ALL: [Link; 4] = [Link::Shm, Link::ShmShared, Link::Tcp, Link::TcpShared];

    pub(crate) const fn name(self) -> &'static str {
        match self {
            Link::Shm => "shm",
            Link::ShmShared => "shm-shared",
            Link::Tcp => "tcp",
            Link::TcpShared => "tcp-shared",
        }
    }
}

/// The algorithms the model prices, in policy order (`policy::ALGOS`' first four).
pub(crate) const MODELLED: [&str; 4] = ["ring", "tree", "pat", "oneshot"];

/// Latency and bandwidth of a link.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct LinkConsts {
    /// One step on an idle path: post, wake-up, consume (µs).
    pub alpha_us: f64,
    /// What one more message costs the rank that handles it (µs).
    pub gamma_us: f64,
    /// Bytes through one rank (GB/s = 1e3 bytes per µs).
    pub gbps: f64,
    /// The same for the LL protocol: a shorter path (no flag round trip), half the bandwidth
    /// (half of every line is flag) and more work per byte (line by line).
    pub ll_alpha_us: f64,
    pub ll_gbps: f64,
}

/// Corrections for one (collective, algorithm, protocol).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Adj {
    pub base_us: f64,
    pub scale: f64,
    /// µs per rank beyond two: what the shape misses as ranks are added (the one-shot's sends
    /// and receives run one after another on every rank). Nothing at 2 ranks.
    pub peer_us: f64,
}

const NONE: Adj = Adj { base_us: 0.0, scale: 1.0, peer_us: 0.0 };

/// Every constant of the model, for every link.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Consts {
    pub links: [LinkConsts; 4],
    /// [link][collective (FUNCS)][algorithm (MODELLED)][protocol (Simple, LL)].
    pub adj: [[[[Adj; 2]; 4]; 5]; 4],
}

impl Consts {
    /// No link constant set (every one 0) and no correction: what `defaults.conf` is applied over.
    pub(crate) fn blank() -> Self {
        let zero = LinkConsts { alpha_us: 0.0, gamma_us: 0.0, gbps: 0.0, ll_alpha_us: 0.0, ll_gbps: 0.0 };
        Consts { links: [zero; 4], adj: [[[[NONE; 2]; 4]; 5]; 4] }
    }

    /// A stable digest of every constant (ranks compare them at init).
    pub(crate) fn digest(&self) -> u64 {
        let mut h = 0xcbf2_9ce4_8422_2325u64;
        let mut eat = |x: f64| h = (h ^ x.to_bits()).wrapping_mul(0x100_0000_01b3);
        for l in &self.links {
            eat(l.alpha_us);
            eat(l.gamma_us);
            eat(l.gbps);
            eat(l.ll_alpha_us);
            eat(l.ll_gbps);
        }
        for a in self.adj.iter().flatten().flatten().flatten() {
            eat(a.base_us);
            eat(a.scale);
            eat(a.peer_us);
        }
        h
    }
}

fn modelled(algo: Algo) -> Option<usize> {
    Some(match algo {
        Algo::Ring | Algo::Chain => 0,
        Algo::Tree => 1,
        Algo::Pat => 2,
        Algo::OneShot => 3,
        Algo::Direct => return None,
    })
}

/// The shape of an algorithm on `n` ranks for `bytes` per rank.
struct Shape {
    steps: f64,
    msgs: f64,
    /// Bytes one step carries, and bytes the busiest rank sends, in units of `bytes`.
    step: f64,
    load: f64,
}

fn shape(coll: CollType, algo: Algo, n: usize, bytes: usize, chunk: usize) -> Shape {
    let nf = n as f64;
    let depth = tree::depth(n) as f64;
    let sh = |steps: f64, msgs: f64, step: f64, load: f64| Shape { steps, msgs, step, load };
    if n < 2 {
        return sh(0.0, 0.0, 0.0, 0.0);
    }
    match (coll, algo) {
        (CollType::AllReduce, Algo::Ring) => sh(2.0 * (nf - 1.0), 4.0, 1.0 / nf, 2.0 * (nf - 1.0) / nf),
        (CollType::AllReduce, Algo::Tree) => {
            // A node sends its partial up once and the result down once per child: a chain node
            // (n = 3) twice the data, a node with two children three times; two trees give each
            // rank inner work in one of them only, on half the data.
            let double = bytes >= tree::DOUBLE_MIN;
            let (msgs, load) = match (n, double) {
                (2, _) => (2.0, 1.0),
                (3, false) => (4.0, 2.0),
                (3, true) => (4.0, 1.5),
                (_, false) => (6.0, 3.0),
                (_, true) => (6.0, 2.0),
            };
            let swap = if !double && bytes <= chunk { 1.0 } else { 0.0 };
            sh(2.0 * depth - swap, msgs, if double { 0.5 } else { 1.0 }, load)
        }
        // Every rank sends its data to each of n-1 peers before it can finish.
        (CollType::AllReduce, _) => sh(1.0, 2.0 * (nf - 1.0), nf - 1.0, nf - 1.0),
        (CollType::Broadcast | CollType::Reduce, Algo::Tree) => {
            let big = n > 3;
            sh(depth, if big { 3.0 } else { 2.0 }, 1.0, if big { 2.0 } else { 1.0 })
        }
        (CollType::Broadcast | CollType::Reduce, _) => sh(nf - 1.0, 2.0, 1.0, 1.0),
        (CollType::AllGather | CollType::ReduceScatter, Algo::Pat) => {
            sh(depth, 2.0 * depth, (nf - 1.0) / depth, nf - 1.0)
        }
        (CollType::AllGather | CollType::ReduceScatter, _) => sh(nf - 1.0, 2.0 * (nf - 1.0), 1.0, nf - 1.0),
        _ => sh(1.0, 2.0, 1.0, 1.0),
    }
}

/// What the model needs to know about one operation.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Op {
    pub coll: CollType,
    pub algo: Algo,
    pub proto: Proto,
    pub nranks: usize,
    /// Bytes per rank (per block for all-gather and reduce-scatter).
    pub bytes: usize,
    /// The most bytes one step moves before the next can start (half a FIFO, or of the LL area).
    pub chunk: usize,
}

/// Predicted µs of `op` over `link`.
pub(crate) fn time(c: &Consts, link: Link, op: &Op) -> f64 {
    let l = c.links[link as usize];
    let adj = match (modelled(op.algo), (op.coll as usize) < FUNCS.len()) {
        (Some(a), true) => c.adj[link as usize][op.coll as usize][a][op.proto as usize],
        _ => NONE,
    };
    let (alpha, gbps) = match op.proto {
        Proto::Simple => (l.alpha_us, l.gbps),
        Proto::Ll => (l.ll_alpha_us, l.ll_gbps),
    };
    let s = shape(op.coll, op.algo, op.nranks, op.bytes, op.chunk);
    let b = op.bytes as f64;
    let path = s.steps * (s.step * b).min(op.chunk as f64);
    let moved = (s.load * b).max(path);
    let peers = op.nranks.saturating_sub(2) as f64;
    adj.base_us + adj.peer_us * peers + s.steps * alpha + s.msgs * l.gamma_us + moved * adj.scale / (gbps * 1e3)
}
