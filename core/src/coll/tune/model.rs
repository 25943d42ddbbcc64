//! The α-β cost model: the time of an operation of `bytes` per rank on `n` ranks is
//!
//! ```text
//! base(coll, algo, proto) + steps(coll, algo, n) · α(link) + bytes · load(coll, algo, n) · scale(coll, algo, proto) / bw(link)
//! ```
//!
//! where `steps` counts the messages on the critical path (ring all-reduce 2(n-1), tree 2·depth,
//! one-shot 1, chain n-1, PAT ceil(log2 n)) and `load` the bytes that pass through the busiest
//! rank, in units of `bytes` (ring all-reduce 2(n-1)/n, double tree 2, one-shot 2(n-1) as it
//! both sends and reduces n-1 copies, all-gather n-1). α and bw are per link; `base` and `scale` correct what the shape alone misses (a
//! tree's extra primitives, a reduction's arithmetic). The defaults were fitted to occl-perf
//! runs on a 2-core machine (tests/results/algos.md); `OCCL_TUNER_FILE` overrides any of them
//! (see `file.rs`).

use super::policy::FUNCS;
use crate::coll::plan::{Algo, Proto};
use crate::coll::tree;
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
}

impl Link {
    pub(crate) const ALL: [Link; 3] = [Link::Shm, Link::ShmShared, Link::Tcp];

    pub(crate) const fn name(self) -> &'static str {
        match self {
            Link::Shm => "shm",
            Link::ShmShared => "shm-shared",
            Link::Tcp => "tcp",
        }
    }
}

/// The algorithms the model prices, in policy order (`policy::ALGOS`' first four).
pub(crate) const MODELLED: [&str; 4] = ["ring", "tree", "pat", "oneshot"];

/// Latency and bandwidth of a link.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct LinkConsts {
    /// One message on an idle path: post, wake-up, consume (µs).
    pub alpha_us: f64,
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
}

const NONE: Adj = Adj { base_us: 0.0, scale: 1.0 };

/// Every constant of the model, for every link.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Consts {
    pub links: [LinkConsts; 3],
    /// [link][collective (FUNCS)][algorithm (MODELLED)][protocol (Simple, LL)].
    pub adj: [[[[Adj; 2]; 4]; 5]; 3],
}

impl Default for Consts {
    fn default() -> Self {
        let mut c = Consts {
            links: [
                LinkConsts { alpha_us: 0.3, gbps: 4.0, ll_alpha_us: 0.2, ll_gbps: 1.0 },
                LinkConsts { alpha_us: 3.0, gbps: 2.0, ll_alpha_us: 2.0, ll_gbps: 0.5 },
                LinkConsts { alpha_us: 8.0, gbps: 1.5, ll_alpha_us: 8.0, ll_gbps: 0.75 },
            ],
            adj: [[[[NONE; 2]; 4]; 5]; 3],
        };
        for link in &mut c.adj {
            // PAT moves every byte through the FIFOs, where the ring reads large blocks
            // straight from the sender's buffer (single copy).
            for f in [CollType::AllGather, CollType::ReduceScatter] {
                link[f as usize][2][0].scale = 1.25;
            }
        }
        c
    }
}

impl Consts {
    /// A stable digest of every constant (ranks compare them at init).
    pub(crate) fn digest(&self) -> u64 {
        let mut h = 0xcbf2_9ce4_8422_2325u64;
        let mut eat = |x: f64| h = (h ^ x.to_bits()).wrapping_mul(0x100_0000_01b3);
        for l in &self.links {
            eat(l.alpha_us);
            eat(l.gbps);
            eat(l.ll_alpha_us);
            eat(l.ll_gbps);
        }
        for a in self.adj.iter().flatten().flatten().flatten() {
            eat(a.base_us);
            eat(a.scale);
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

/// Messages on the critical path and bytes through the busiest rank (in units of `bytes`).
fn shape(coll: CollType, algo: Algo, n: usize, bytes: usize) -> (f64, f64) {
    let nf = n as f64;
    let depth = tree::depth(n) as f64;
    match (coll, algo) {
        (CollType::AllReduce, Algo::Ring) => (2.0 * (nf - 1.0), 2.0 * (nf - 1.0) / nf),
        (CollType::AllReduce, Algo::Tree) => {
            // A node sends its partial up once and the result down once per child: a chain node
            // (n = 3) twice the data, a node with two children three times; two trees give each
            // rank inner work in one of them only, on half the data.
            let double = bytes >= tree::DOUBLE_MIN;
            let load = match (n, double) {
                (0..=2, _) => 1.0,
                (3, false) => 2.0,
                (3, true) => 1.5,
                (_, false) => 3.0,
                (_, true) => 2.0,
            };
            (2.0 * depth, load)
        }
        // Every rank sends its data to n-1 peers and folds in n-1 contributions.
        (CollType::AllReduce, _) => (1.0, 2.0 * (nf - 1.0)),
        (CollType::Broadcast | CollType::Reduce, Algo::Tree) => (depth, if n <= 3 { 1.0 } else { 2.0 }),
        (CollType::Broadcast | CollType::Reduce, _) => (nf - 1.0, 1.0),
        (CollType::AllGather | CollType::ReduceScatter, Algo::Pat) => (depth, nf - 1.0),
        (CollType::AllGather | CollType::ReduceScatter, _) => (nf - 1.0, nf - 1.0),
        _ => (1.0, 1.0),
    }
}

/// Predicted µs of `coll` with `algo`/`proto` for `bytes` per rank on `n` ranks over `link`.
pub(crate) fn time(c: &Consts, link: Link, coll: CollType, algo: Algo, proto: Proto, n: usize, bytes: usize) -> f64 {
    let l = c.links[link as usize];
    let adj = match (modelled(algo), (coll as usize) < FUNCS.len()) {
        (Some(a), true) => c.adj[link as usize][coll as usize][a][proto as usize],
        _ => NONE,
    };
    let (alpha, gbps) = match proto {
        Proto::Simple => (l.alpha_us, l.gbps),
        Proto::Ll => (l.ll_alpha_us, l.ll_gbps),
    };
    let (steps, load) = shape(coll, algo, n, bytes);
    adj.base_us + steps * alpha + bytes as f64 * load * adj.scale / (gbps * 1e3)
}
