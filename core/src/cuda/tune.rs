//! Which algorithm a device all-reduce runs: one-shot (every rank receives every copy and
//! folds them all: one hop), two-shot (reduce-scatter then all-gather, both direct: two hops,
//! a 2(n-1)/n share of the bytes on each link) or the ring (2(n-1) hops, for rank counts whose
//! GPUs form a ring rather than a switch). Priced by an α-β model over the NVLink link and the
//! device memory that the folds read; `OCCL_ALGO` (NCCL's syntax, names `oneshot`, `twoshot`,
//! `ring`) restricts the choice, and a list that leaves none is an error. The other device
//! collectives have one algorithm each (direct: every rank writes each peer's part straight
//! into that peer's FIFO).

use crate::coll::tune::policy::{Policy, ALGOS};
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
}

impl Default for DevModel {
    fn default() -> Self {
        DevModel { alpha_us: 2.0, link_bpus: 350e3, mem_bpus: 2000e3 }
    }
}

impl DevModel {
    /// Predicted µs of an all-reduce of `bytes` per rank on `n` ranks.
    pub(crate) fn time(&self, algo: DevAlgo, n: usize, bytes: usize) -> f64 {
        let (nf, b) = (n as f64, bytes as f64);
        let (hops, link, mem) = match algo {
            // Sends n-1 copies, folds n.
            DevAlgo::OneShot => (1.0, nf - 1.0, nf + 1.0),
            // Sends 2(n-1)/n, folds n shards of 1/n, copies n-1 shards in.
            DevAlgo::TwoShot => (2.0, 2.0 * (nf - 1.0) / nf, 1.0 + 2.0 * (nf - 1.0) / nf),
            DevAlgo::Ring => (2.0 * (nf - 1.0), 2.0 * (nf - 1.0) / nf, 1.0 + 2.0 * (nf - 1.0) / nf),
        };
        hops * self.alpha_us + b * link / self.link_bpus + b * mem / self.mem_bpus
    }
}

pub(crate) struct DevTuner {
    nranks: usize,
    allowed: Vec<DevAlgo>,
    model: DevModel,
}

impl DevTuner {
    pub(crate) fn new(config: &Config, nranks: usize) -> Result<DevTuner> {
        let policy = Policy::new(config.algo.as_deref(), None)?;
        let func = CollType::AllReduce as usize;
        let allowed: Vec<DevAlgo> = DevAlgo::ALL
            .into_iter()
            .filter(|a| {
                let bit = ALGOS.iter().position(|n| *n == a.name()).unwrap_or(usize::MAX);
                policy.algos.allows(func, bit)
            })
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
        Ok(DevTuner { nranks, allowed, model: DevModel::default() })
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
        assert_eq!(t8.choose(64 << 20), DevAlgo::TwoShot, "one-shot sends 7 copies");
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
