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
//! misses per rank beyond two (the one-shot's serial sends). The links' constants and the shared
//! links' corrections were fitted to occl-perf runs on a 2-core machine; the corrections of `shm`
//! and `tcp` (a core per rank) to an interleaved sweep (`occl-perf --compare`) of 2 and 4 ranks on
//! a 16-core host (bench/baselines/algos-sweep.md). `OCCL_TUNER_FILE` overrides any of them (see
//! `file.rs`).

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

/// Corrections fitted per (link, collective, algorithm, protocol): base µs and byte-term scale.
/// Anything not listed is neither (base 0, scale 1).
const FITTED: &[(Link, CollType, usize, Proto, f64, f64)] = {
    use CollType::{AllGather as AG, AllReduce as AR, Broadcast as BC, Reduce as RD, ReduceScatter as RS};
    use Link::{Shm, ShmShared, Tcp, TcpShared};
    use Proto::{Ll, Simple};
    const RING: usize = 0;
    const TREE: usize = 1;
    const PAT: usize = 2;
    const ONESHOT: usize = 3;
    &[
        // Two trees over 2 ranks are two chains of unfused primitives: 2.7× the ring's time
        // at every size measured (and 4× at 64 MiB).
        (Shm, AR, TREE, Simple, 0.0, 2.7),
        (Shm, AR, TREE, Ll, 0.2, 1.4),
        // 1.1 (was 1.2): one-shot measured ahead of the ring at 16 KiB (3.0 against 4.0 µs,
        // three rounds) and behind at 32 KiB (5.5 against 4.8).
        (Shm, AR, ONESHOT, Simple, 0.0, 1.1),
        // base 0.4 (was 0.15): since a one-shot of one slice runs straight on the FIFOs
        // (session 13, `direct::all_reduce_one_step`), Simple, whose first cache line carries
        // 32 B with the slot header, led LL at every size measured on a 16-core host,
        // interleaved: at 2 ranks 0.29-0.31 against 0.45-0.52 µs at 8-32 B and level at
        // 64-128 B; at 4 ranks by 11-35% at 8-512 B. Before that change LL was level or ahead
        // to 128 B (session 11).
        (Shm, AR, ONESHOT, Ll, 0.4, 1.15),
        // 1.05: the ring behind the one-shot at 256 KiB and 4 KiB by 12-14% (same sweep).
        (Shm, AR, RING, Simple, 0.0, 1.05),
        (ShmShared, AR, TREE, Simple, 2.2, 0.85),
        (ShmShared, AR, ONESHOT, Simple, 0.3, 1.17),
        // 28 and 1.425 (were 20 and 1.5; 30 and 1.85 before the tree of one piece swapped at the
        // top) and the one-shot's 1.12 (was 1.6): fitted to session 11's interleaved sweep of 4
        // ranks over tcp on a 16-core host, where the one-shot led the tree by 13% at 8-16 KiB.
        (Tcp, AR, TREE, Simple, 28.0, 1.425),
        (Tcp, AR, ONESHOT, Simple, 0.0, 1.12),
        (TcpShared, AR, TREE, Simple, 0.0, 0.92),
        (TcpShared, AR, ONESHOT, Simple, 8.8, 0.97),
        // 4 ranks on 2 cores: a broadcast chain beat the tree at every size to 1 MiB (by
        // 1.1-2.9x), a reduce chain to 32 KiB, with the tree ahead from 1 MiB over tcp.
        (ShmShared, BC, TREE, Simple, 3.0, 1.5),
        (ShmShared, BC, TREE, Ll, 3.0, 1.5),
        (ShmShared, RD, TREE, Simple, 1.5, 1.0),
        (ShmShared, RD, TREE, Ll, 1.5, 1.0),
        (TcpShared, BC, TREE, Simple, 12.0, 1.6),
        (TcpShared, RD, TREE, Simple, 15.0, 0.6),
        // With a core per rank (session 11, 16-core host, 2 and 4 ranks, every size 8 B-64 MiB,
        // interleaved): the chain led the tree at every size over tcp (by 10-48%) and from 4 KiB
        // over shm (by 13-52%); the tree's LL only paid at 2 ranks. Above 4 ranks nothing was
        // measured; the tree's shorter path (steps) still counts there, the byte term is what these
        // change.
        (Shm, BC, RING, Simple, 0.0, 0.175),
        (Shm, RD, RING, Simple, 0.0, 0.175),
        (Shm, BC, TREE, Ll, 0.32, 1.0),
        (Shm, RD, TREE, Ll, 0.32, 1.0),
        (Tcp, BC, RING, Simple, 0.0, 0.35),
        (Tcp, RD, RING, Simple, 0.0, 0.35),
        (Tcp, BC, TREE, Simple, 0.0, 1000.0),
        (Tcp, RD, TREE, Simple, 0.0, 500.0),
        // The ring all-gather and reduce-scatter read large blocks in place (single copy): at 4
        // ranks with a core each they led PAT at every size from 4 KiB (session 11).
        (Shm, AG, RING, Simple, 0.0, 0.5),
        (Shm, RS, RING, Simple, 0.0, 0.5),
        (Tcp, AG, RING, Simple, 0.0, 0.5),
        (Tcp, RS, RING, Simple, 0.0, 0.5),
        (Shm, AG, PAT, Ll, 0.34, 1.19),
        (Shm, RS, PAT, Ll, 0.48, 11.2),
        // PAT moves every byte through the FIFOs, where the ring reads large blocks straight
        // from the sender's buffer (single copy).
        (Shm, AG, PAT, Simple, 0.0, 1.25),
        (Shm, RS, PAT, Simple, 0.0, 1.25),
        (ShmShared, AG, PAT, Simple, 0.0, 1.25),
        (ShmShared, RS, PAT, Simple, 0.0, 1.25),
        (Tcp, AG, PAT, Simple, 0.0, 1.75),
        (Tcp, RS, PAT, Simple, 0.0, 150.0),
        (TcpShared, AG, PAT, Simple, 0.0, 1.25),
        (TcpShared, RS, PAT, Simple, 0.0, 1.25),
        // 1.9 (was 1.0): at 4 ranks with a core each the ring's LL lines move 1.7 GB/s against
        // Simple's 3.7 (session 9, 16-core host), so Simple wins from 2 KiB; at 2 ranks the
        // one-shot is picked before either.
        (Shm, AR, RING, Ll, 0.0, 1.9),
    ]
};

/// Per-rank corrections (`peer_us`), fitted at 4 ranks where each rank has a core (2-rank
/// runs cannot see them).
const PER_PEER: &[(Link, CollType, Algo, Proto, f64)] = {
    &[
        // 4 ranks over tcp, a core each (session 9, 16-core host): the one-shot took 23-24 µs at
        // 8-64 B, level with the tree's three hops and 3.3x its own 2-rank time (7.2 µs), and
        // fell behind the tree from 1 KiB (1.1-1.13x) and the ring at 64 KiB (1.2-1.3x). With the
        // tree's base lowered to 20 (FITTED), this picks the tree from 1 KiB and the ring at 64 KiB.
        (Link::Tcp, CollType::AllReduce, Algo::OneShot, Proto::Simple, 36.0),
        // 4 ranks over shm, a core each: fitted in session 11, when one-shot/LL led Simple by
        // 15-20% at 8-128 B; occl-tune fits the same value to session 13's sweep, where Simple
        // leads.
        (Link::Shm, CollType::AllReduce, Algo::OneShot, Proto::Simple, 0.1),
    ]
};

impl Default for Consts {
    /// Fitted to medians of forced runs of `bench/algos-sweep.sh`: on a 2-core machine (2 ranks:
    /// `shm`, `tcp`; 4 ranks: `shm-shared`, `tcp-shared`), then `shm` and `tcp` corrections on a
    /// 16-core host (2 and 4 ranks); bench/baselines/algos-sweep.md has the runs.
    fn default() -> Self {
        let mut c = Consts {
            links: [
                // LL: a shorter path than Simple (0.16 against 0.32 µs a step), less bandwidth
                // (half of each line is flag). 3.2 since LL got its own 32-step ring (it was
                // 1.15): 2-rank one-shot/LL measured ahead of Simple up to 2 KiB (1.05 against
                // 1.30 µs) and behind from 4 KiB (1.85 against 1.36), so the crossover is ~3 KiB.
                LinkConsts { alpha_us: 0.32, gamma_us: 0.07, gbps: 3.9, ll_alpha_us: 0.16, ll_gbps: 3.2 },
                // With more ranks than cores LL never paid in any run: its waits spin on more
                // lines while the peer it waits for needs the core.
                LinkConsts { alpha_us: 2.95, gamma_us: 1.35, gbps: 1.93, ll_alpha_us: 3.5, ll_gbps: 0.5 },
                LinkConsts { alpha_us: 23.5, gamma_us: 0.0, gbps: 2.17, ll_alpha_us: 23.5, ll_gbps: 1.0 },
                LinkConsts { alpha_us: 10.4, gamma_us: 0.66, gbps: 1.11, ll_alpha_us: 10.4, ll_gbps: 0.5 },
            ],
            adj: [[[[NONE; 2]; 4]; 5]; 4],
        };
        for &(link, coll, algo, proto, base_us, scale) in FITTED {
            c.adj[link as usize][coll as usize][algo][proto as usize] = Adj { base_us, scale, peer_us: 0.0 };
        }
        for &(link, coll, algo, proto, peer_us) in PER_PEER {
            if let Some(a) = modelled(algo) {
                c.adj[link as usize][coll as usize][a][proto as usize].peer_us = peer_us;
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
