//! Which algorithm a device all-reduce runs: one-shot (every rank receives every copy and
//! folds them all: one hop), two-shot (reduce-scatter then all-gather, both direct: two hops,
//! a 2(n-1)/n share of the bytes on each link) or the ring (2(n-1) hops, for rank counts whose
//! GPUs form a ring rather than a switch). Priced by an α-β model over the NVLink link and the
//! device memory that the folds read; `OCCL_ALGO` (NCCL's syntax, names `oneshot`, `twoshot`,
//! `ring`) restricts the choice, and a list that leaves none is an error. The other device
//! collectives are direct (every rank writes each peer's part straight into that peer's FIFO),
//! except broadcast, reduce and reduce-scatter, which go round the ring when the direct form's
//! load (the root's link; every link at once) costs more than the ring's extra hops.

use crate::config::policy::{Policy, ALGOS};
use crate::config::Config;
use crate::error::{Error, Result};
use crate::record::CollType;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DevAlgo {
    OneShot,
    TwoShot,
    Ring,
}

impl DevAlgo {
    pub const ALL: [DevAlgo; 3] = [DevAlgo::OneShot, DevAlgo::TwoShot, DevAlgo::Ring];

    /// The policy name (`OCCL_ALGO`) and what benchmarks print.
    pub const fn name(self) -> &'static str {
        match self {
            DevAlgo::OneShot => "oneshot",
            DevAlgo::TwoShot => "twoshot",
            DevAlgo::Ring => "ring",
        }
    }
}

/// The link and memory the model prices (µs and bytes per µs).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct DevModel {
    /// One flag round on the link (a chunk posted, seen, its slot freed).
    pub alpha_us: f64,
    /// Bytes per µs one GPU pushes to its peers (NVLink 4: ~350e3 achieved of 478e3).
    pub link_bpus: f64,
    /// Bytes per µs a fold reads and writes in device memory.
    pub mem_bpus: f64,
    /// How much longer a direct step's bytes take per rank beyond two: every rank writing
    /// every peer at once through the switch. On 4×H200 the two-shot all-reduce took
    /// 1.06-1.10× the ring's time at 64 MiB-1 GiB (bench/baselines/gpu-collectives.md).
    pub direct_per_rank: f64,
}

impl Default for DevModel {
    fn default() -> Self {
        DevModel { alpha_us: 2.0, link_bpus: 350e3, mem_bpus: 2000e3, direct_per_rank: 0.03 }
    }
}

impl DevModel {
    /// Predicted µs of an all-reduce of `bytes` per rank on `n` ranks.
    pub(crate) fn time(&self, algo: DevAlgo, n: usize, bytes: usize) -> f64 {
        let (nf, b) = (n as f64, bytes as f64);
        let direct = self.direct(n);
        let (hops, link, mem) = match algo {
            // Sends n-1 copies, folds n.
            DevAlgo::OneShot => (1.0, (nf - 1.0) * direct, nf + 1.0),
            // Sends 2(n-1)/n, folds n shards of 1/n, copies n-1 shards in.
            DevAlgo::TwoShot => (2.0, 2.0 * (nf - 1.0) / nf * direct, 1.0 + 2.0 * (nf - 1.0) / nf),
            DevAlgo::Ring => (2.0 * (nf - 1.0), 2.0 * (nf - 1.0) / nf, 1.0 + 2.0 * (nf - 1.0) / nf),
        };
        hops * self.alpha_us + b * link / self.link_bpus + b * mem / self.mem_bpus
    }

    /// Predicted µs of a one-hop operation that puts `link` bytes on this GPU's busiest link
    /// (through the switch: `direct`) and folds or copies `mem` bytes in device memory.
    fn one_hop(&self, n: usize, link: f64, mem: f64) -> f64 {
        self.alpha_us + link * self.direct(n) / self.link_bpus + mem / self.mem_bpus
    }

    /// The factor on a direct step's link time at `n` ranks.
    fn direct(&self, n: usize) -> f64 {
        1.0 + self.direct_per_rank * n.saturating_sub(2) as f64
    }

    /// Predicted µs of a broadcast of `bytes` (ring: false, from the root to every peer).
    fn broadcast(&self, ring: bool, n: usize, bytes: usize) -> f64 {
        let (nf, b) = (n as f64, bytes as f64 / self.link_bpus);
        match ring {
            false => self.alpha_us + (nf - 1.0) * b * self.direct(n),
            true => (nf - 1.0) * self.alpha_us + b,
        }
    }

    /// Predicted µs of a reduce of `bytes` (ring: false, every peer's copy into the root's link,
    /// which folds them all; ring: passed on towards the root, each rank folding two sources).
    fn reduce(&self, ring: bool, n: usize, bytes: usize) -> f64 {
        let (nf, b) = (n as f64, bytes as f64);
        match ring {
            false => self.one_hop(n, (nf - 1.0) * b, nf * b),
            true => (nf - 1.0) * self.alpha_us + b / self.link_bpus + 2.0 * b / self.mem_bpus,
        }
    }

    /// Predicted µs of a reduce-scatter of `bytes` of input per rank.
    fn reduce_scatter(&self, ring: bool, n: usize, bytes: usize) -> f64 {
        let (nf, b) = (n as f64, bytes as f64);
        let share = (nf - 1.0) / nf * b / self.link_bpus;
        let fold = b / self.mem_bpus;
        match ring {
            false => self.alpha_us + share * self.direct(n) + fold,
            true => (nf - 1.0) * self.alpha_us + share + fold,
        }
    }
}

/// A collective with a direct form (one hop; `oneshot` in `OCCL_ALGO`) and a ring form, and
/// which of them the policy allows.
#[derive(Clone, Copy, Debug)]
struct DirectOrRing {
    what: &'static str,
    direct: bool,
    ring: bool,
}

/// Whether `policy` lets `func` run the algorithm called `name`.
fn allows(policy: &Policy, func: CollType, name: &str) -> bool {
    ALGOS.iter().position(|n| *n == name).is_some_and(|bit| policy.algos.allows(func as usize, bit))
}

impl DirectOrRing {
    fn new(policy: &Policy, func: CollType, what: &'static str, nranks: usize) -> DirectOrRing {
        DirectOrRing { what, direct: allows(policy, func, "oneshot"), ring: nranks > 1 && allows(policy, func, "ring") }
    }

    /// Whether to go round the ring, given both forms' predicted times.
    fn ring(&self, nranks: usize, direct_us: f64, ring_us: f64) -> Result<bool> {
        match (self.direct, self.ring) {
            (true, true) => Ok(ring_us < direct_us),
            (direct, ring) if direct || ring => Ok(ring),
            _ => Err(Error::usage(format!(
                "OCCL_ALGO leaves no algorithm for device {} on {nranks} rank(s); it runs ONESHOT (straight to \
                 every peer) or RING (RING needs 2 ranks or more)",
                self.what
            ))),
        }
    }
}

pub(crate) struct DevTuner {
    nranks: usize,
    allowed: Vec<DevAlgo>,
    bcast: DirectOrRing,
    reduce: DirectOrRing,
    rs: DirectOrRing,
    model: DevModel,
}

impl DevTuner {
    pub(crate) fn new(config: &Config, nranks: usize) -> Result<DevTuner> {
        let policy = Policy::new(config.algo.as_deref(), None)?;
        let allowed: Vec<DevAlgo> = DevAlgo::ALL
            .into_iter()
            .filter(|a| allows(&policy, CollType::AllReduce, a.name()))
            // One rank has no ring to go round; one-shot is its copy.
            .filter(|a| nranks > 1 || *a == DevAlgo::OneShot)
            .collect();
        if allowed.is_empty() {
            return Err(Error::usage(format!(
                "{} leaves no algorithm for device all-reduce on {nranks} rank(s); it runs ONESHOT, TWOSHOT, RING \
                 (RING and TWOSHOT need 2 ranks or more)",
                policy.algos.describe()
            )));
        }
        let bcast = DirectOrRing::new(&policy, CollType::Broadcast, "broadcast", nranks);
        let reduce = DirectOrRing::new(&policy, CollType::Reduce, "reduce", nranks);
        let rs = DirectOrRing::new(&policy, CollType::ReduceScatter, "reduce-scatter", nranks);
        Ok(DevTuner { nranks, allowed, bcast, reduce, rs, model: DevModel::default() })
    }

    /// Whether a broadcast of `bytes` goes along the ring rather than from the root to every
    /// peer: the ring pays a hop per rank, the direct form a copy per peer on the root's link
    /// (at 4×H200 it held broadcast at a third of NCCL's busbw). `OCCL_ALGO` may force either
    /// (`broadcast:oneshot`, `broadcast:ring`); a list that leaves neither is an error of the call.
    pub(crate) fn broadcast_ring(&self, bytes: usize) -> Result<bool> {
        let (m, n) = (&self.model, self.nranks);
        self.bcast.ring(n, m.broadcast(false, n, bytes), m.broadcast(true, n, bytes))
    }

    /// Whether a reduce of `bytes` goes along the ring towards the root rather than every peer
    /// writing into the root's link (at 4×H200 that held reduce at a third of NCCL's busbw);
    /// `reduce:oneshot|ring` force one.
    pub(crate) fn reduce_ring(&self, bytes: usize) -> Result<bool> {
        let (m, n) = (&self.model, self.nranks);
        self.reduce.ring(n, m.reduce(false, n, bytes), m.reduce(true, n, bytes))
    }

    /// Whether a reduce-scatter of `bytes` of input per rank goes round the ring rather than
    /// every rank writing each peer its block (`reducescatter:oneshot|ring` force one).
    pub(crate) fn reduce_scatter_ring(&self, bytes: usize) -> Result<bool> {
        let (m, n) = (&self.model, self.nranks);
        self.rs.ring(n, m.reduce_scatter(false, n, bytes), m.reduce_scatter(true, n, bytes))
    }

    /// Predicted µs of `coll` with `bytes` per rank as NCCL counts them (per block for
    /// all-gather, reduce-scatter and all-to-all), run the way this tuner chooses.
    pub(crate) fn predict(&self, coll: CollType, bytes: usize) -> Result<f64> {
        let (m, n) = (&self.model, self.nranks);
        let (peers, b) = (n.saturating_sub(1) as f64, bytes as f64);
        Ok(match coll {
            CollType::AllReduce => m.time(self.choose(bytes), n, bytes),
            CollType::Broadcast => m.broadcast(self.broadcast_ring(bytes)?, n, bytes),
            CollType::ReduceScatter => {
                let input = bytes.saturating_mul(n);
                m.reduce_scatter(self.reduce_scatter_ring(input)?, n, input)
            }
            CollType::Reduce => m.reduce(self.reduce_ring(bytes)?, n, bytes),
            CollType::AllGather | CollType::AllToAll => m.one_hop(n, peers * b, 0.0),
            _ => m.one_hop(2, b, 0.0),
        })
    }

    /// The all-reduce algorithm for `bytes` per rank.
    pub(crate) fn choose(&self, bytes: usize) -> DevAlgo {
        let mut best = (self.allowed[0], f64::INFINITY);
        for &a in &self.allowed {
            let t = self.model.time(a, self.nranks, bytes);
            if t < best.1 {
                best = (a, t);
            }
        }
        best.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tuner(algo: Option<&str>, n: usize) -> Result<DevTuner> {
        let config = Config { algo: algo.map(String::from), ..Config::default() };
        DevTuner::new(&config, n)
    }

    #[test]
    fn small_messages_take_one_hop_and_large_ones_the_lighter_load() {
        let t = tuner(None, 2).expect("tuner");
        assert_eq!(t.choose(8), DevAlgo::OneShot);
        assert_eq!(t.choose(64 << 10), DevAlgo::OneShot);
        assert_eq!(t.choose(1 << 30), DevAlgo::TwoShot);
        let t8 = tuner(None, 8).expect("tuner");
        assert_eq!(t8.choose(8), DevAlgo::OneShot);
        assert_ne!(t8.choose(64 << 20), DevAlgo::OneShot, "one-shot sends 7 copies");
    }

    #[test]
    fn large_broadcasts_go_round_the_ring_beyond_two_ranks() {
        let ring = |t: &DevTuner, b: usize| t.broadcast_ring(b).expect("allowed");
        let t2 = tuner(None, 2).expect("tuner");
        assert!(!ring(&t2, 1 << 30), "two ranks have one link");
        let t4 = tuner(None, 4).expect("tuner");
        assert!(!ring(&t4, 64 << 10), "a hop per rank costs more than two extra copies");
        assert!(ring(&t4, 4 << 20));
        assert!(ring(&t4, 1 << 30));
        assert!(ring(&tuner(Some("broadcast:ring"), 4).expect("tuner"), 8));
        assert!(!ring(&tuner(Some("broadcast:oneshot"), 4).expect("tuner"), 1 << 30));
        let none = tuner(Some("broadcast:tree"), 4).expect("all-reduce keeps its choice");
        let e = none.broadcast_ring(8).expect_err("tree has no device broadcast");
        assert!(e.to_string().contains("device broadcast") && e.to_string().contains("ONESHOT"), "{e}");
    }

    #[test]
    fn large_all_reduces_and_reduce_scatters_go_round_the_ring_beyond_two_ranks() {
        // 4×H200: two-shot ahead at 16 MiB, the ring from 64 MiB; reduce-scatter likewise.
        let t4 = tuner(None, 4).expect("tuner");
        assert_eq!(t4.choose(16 << 20), DevAlgo::TwoShot);
        assert_eq!(t4.choose(64 << 20), DevAlgo::Ring);
        assert!(!t4.reduce_scatter_ring(4 << 20).expect("allowed"));
        assert!(t4.reduce_scatter_ring(256 << 20).expect("allowed"));
        let t2 = tuner(None, 2).expect("tuner");
        assert_eq!(t2.choose(1 << 30), DevAlgo::TwoShot, "two ranks: the same bytes in fewer hops");
        assert!(!t2.reduce_scatter_ring(1 << 30).expect("allowed"));
        assert!(tuner(Some("reducescatter:ring"), 2).expect("tuner").reduce_scatter_ring(8).expect("forced"));
        let e = tuner(Some("reducescatter:pat"), 4).expect("tuner").reduce_scatter_ring(8).expect_err("no pat");
        assert!(e.to_string().contains("device reduce-scatter"), "{e}");
    }

    #[test]
    fn large_reduces_go_round_the_ring_beyond_two_ranks() {
        let t2 = tuner(None, 2).expect("tuner");
        for bytes in [8, 1 << 20, 1 << 30] {
            assert!(!t2.reduce_ring(bytes).unwrap(), "two ranks: the ring is one hop too, direct at {bytes} B");
        }
        let t4 = tuner(None, 4).expect("tuner");
        assert!(!t4.reduce_ring(8).unwrap(), "a small reduce takes one hop");
        assert!(t4.reduce_ring(64 << 20).unwrap(), "a large one spares the root's link");
        assert!(tuner(Some("reduce:ring"), 4).unwrap().reduce_ring(8).unwrap());
        assert!(!tuner(Some("reduce:oneshot"), 4).unwrap().reduce_ring(1 << 30).unwrap());
        assert!(tuner(Some("reduce:tree"), 4).unwrap().reduce_ring(8).is_err());
    }

    #[test]
    fn predictions_follow_the_choice_and_grow_with_size() {
        let t = tuner(None, 4).unwrap();
        for bytes in [8, 1 << 20, 1 << 30] {
            let ar = t.predict(CollType::AllReduce, bytes).unwrap();
            assert_eq!(ar, t.model.time(t.choose(bytes), 4, bytes));
        }
        for coll in [
            CollType::AllReduce,
            CollType::Broadcast,
            CollType::Reduce,
            CollType::AllGather,
            CollType::ReduceScatter,
            CollType::AllToAll,
            CollType::Send,
        ] {
            let (small, big) = (t.predict(coll, 8).unwrap(), t.predict(coll, 64 << 20).unwrap());
            assert!(small > 0.0 && big > 10.0 * small, "{coll:?}: {small} µs at 8 B, {big} µs at 64 MiB");
        }
        // A forced algorithm that leaves nothing for a collective fails its prediction as the call.
        let neither = tuner(Some("broadcast:tree"), 4).unwrap();
        assert!(neither.predict(CollType::Broadcast, 1 << 20).is_err());
    }

    #[test]
    fn forced_choices_are_obeyed_or_refused() {
        for a in DevAlgo::ALL {
            let t = tuner(Some(a.name()), 4).expect("tuner");
            assert_eq!(t.choose(8), a);
            assert_eq!(t.choose(1 << 30), a);
        }
        assert_eq!(tuner(Some("allreduce:^oneshot"), 2).expect("tuner").choose(8), DevAlgo::TwoShot);
        let e = tuner(Some("allreduce:tree"), 2).err().expect("tree has no device form");
        assert!(e.to_string().contains("ONESHOT, TWOSHOT, RING"), "{e}");
        assert!(tuner(Some("ring"), 1).is_err(), "one rank has no ring");
        assert_eq!(tuner(None, 1).expect("tuner").choose(1 << 30), DevAlgo::OneShot);
    }
}
