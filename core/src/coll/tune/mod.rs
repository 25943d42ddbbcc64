//! The tuner: which algorithm and protocol each operation runs with. It prices every choice
//! that the communicator supports and `OCCL_ALGO` / `OCCL_PROTO` allow with the cost model
//! (`model`, constants from `OCCL_TUNER_FILE` or the defaults) and takes the cheapest. A forced
//! list that leaves a collective nothing it can run is an `InvalidUsage` error naming what it
//! supports, never a silent fallback. Every rank decides alike: the choice depends only on the
//! call's arguments and on settings that the ranks compare at init (`digest`).
//!
//! With `OCCL_DEBUG=INFO` each choice is logged once per (collective, power-of-two size class).

pub(crate) mod file;
pub(crate) mod fit;
pub(crate) mod model;

use super::algo::{Algo, Proto};
use crate::config::policy::{Policy, ALGOS, FUNCS, PROTOS};
use crate::config::{Config, TransportKind};
use crate::error::{Error, Result};
use crate::record::CollType;
use model::{Consts, Link};
use std::sync::atomic::{AtomicU64, Ordering};

/// Fits `OCCL_TUNER_FILE` constants to measured forced runs on a host of `cores` cores (the
/// `occl-tune` tool; see `fit`); `links`: the links' own constants too.
pub fn calibrate(rows: &[fit::Measured], cores: usize, links: bool) -> Result<fit::Calibration> {
    fit::fit(rows, cores, Consts::default(), links)
}

/// How the picks of a tuner file (`None`: the defaults) fare against measured forced runs.
pub fn check_file(rows: &[fit::Measured], cores: usize, file: Option<&str>) -> Result<fit::Calibration> {
    let consts = match file {
        Some(text) => file::parse(text).map_err(|e| Error::arg(format!("tuner file: {e}")))?,
        None => Consts::default(),
    };
    fit::check(rows, cores, &consts)
}

/// What an operation runs with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Choice {
    pub algo: Algo,
    pub proto: Proto,
}

/// The algorithms each of the five tuned collectives can run, by policy name.
fn candidates(coll: CollType) -> &'static [(Algo, &'static str)] {
    match coll {
        CollType::AllReduce => &[(Algo::Ring, "ring"), (Algo::Tree, "tree"), (Algo::OneShot, "oneshot")],
        CollType::Broadcast | CollType::Reduce => &[(Algo::Chain, "ring"), (Algo::Tree, "tree")],
        CollType::AllGather | CollType::ReduceScatter => &[(Algo::Ring, "ring"), (Algo::Pat, "pat")],
        _ => &[],
    }
}

/// The protocols occl runs, by policy name.
const PROTOCOLS: [(Proto, &str); 2] = [(Proto::Simple, "simple"), (Proto::Ll, "ll")];

fn bit(names: &[&str], name: &str) -> usize {
    names.iter().position(|n| *n == name).unwrap_or(usize::MAX)
}

fn upper(names: impl Iterator<Item = &'static str>) -> String {
    names.map(str::to_ascii_uppercase).collect::<Vec<_>>().join(", ")
}

pub(crate) struct Tuner {
    nranks: usize,
    /// FIFO slot bytes and slots (an algorithm's pieces follow from them and the protocol).
    slot: usize,
    nslots: usize,
    link: Link,
    policy: Policy,
    consts: Consts,
    /// Per collective, the size classes whose choice was logged.
    logged: [AtomicU64; 5],
    /// Per collective, the last choice (`memo_word`): a training loop repeats its sizes, and
    /// pricing every candidate costs more than a small operation's own work.
    memo: [AtomicU64; 5],
}

/// The algorithms and protocols a memo word can name, by index.
const MEMO_ALGOS: [Algo; 6] = [Algo::Ring, Algo::Tree, Algo::Pat, Algo::OneShot, Algo::Chain, Algo::Direct];
const MEMO_PROTOS: [Proto; 2] = [Proto::Simple, Proto::Ll];

/// `bytes`, the choice's indexes and a set low bit (0 means empty); `None` for sizes that do
/// not fit in 56 bits.
fn memo_word(bytes: usize, c: Choice) -> Option<u64> {
    let a = MEMO_ALGOS.iter().position(|&x| x == c.algo)? as u64;
    let p = MEMO_PROTOS.iter().position(|&x| x == c.proto)? as u64;
    let b = u64::try_from(bytes).ok().filter(|&b| b < 1 << 56)?;
    Some(b << 8 | a << 4 | p << 1 | 1)
}

fn memo_choice(word: u64, bytes: usize) -> Option<Choice> {
    if word & 1 == 0 || word >> 8 != bytes as u64 {
        return None;
    }
    Some(Choice {
        algo: *MEMO_ALGOS.get((word >> 4 & 0xf) as usize)?,
        proto: *MEMO_PROTOS.get((word >> 1 & 7) as usize)?,
    })
}

impl Tuner {
    /// The tuner of a communicator of `nranks` whose peers use `kinds`, with `local` ranks on
    /// this host sharing `cores` cores.
    pub(crate) fn new(
        config: &Config,
        nranks: usize,
        kinds: &[TransportKind],
        local: usize,
        cores: usize,
    ) -> Result<Tuner> {
        let policy = Policy::new(config.algo.as_deref(), config.proto.as_deref())?;
        let consts = match &config.tuner_file {
            Some(p) => file::load(p)?,
            None => Consts::default(),
        };
        // Every rank must see the same link: across hosts the ranks per host and the cores
        // differ, so only a one-host job (where all ranks count alike) can be "shared".
        let shared = local == nranks && local > cores;
        // ib (when it carries data) is modelled as a network link, like tcp.
        let network = kinds.iter().any(|k| *k != TransportKind::Shm);
        let link = match (network, shared) {
            (true, false) => Link::Tcp,
            (true, true) => Link::TcpShared,
            (false, true) => Link::ShmShared,
            (false, false) => Link::Shm,
        };
        let slot = if network { config.tcp_slot_size } else { config.shm_slot_size };
        Ok(Tuner {
            nranks,
            slot,
            nslots: config.fifo_slots,
            link,
            policy,
            consts,
            logged: Default::default(),
            memo: Default::default(),
        })
    }

    /// Whether this host runs more of the communicator's ranks than it has cores (decided once,
    /// at init: asking the OS costs system calls and cgroup file reads).
    pub(crate) fn oversubscribed(&self) -> bool {
        matches!(self.link, Link::ShmShared | Link::TcpShared)
    }

    /// What every rank must agree on: the lists and the constants (the link follows from the
    /// peer table, which every rank shares, except the core count, which is included).
    pub(crate) fn digest(&self) -> u64 {
        let parts = [self.policy.algos.digest(), self.policy.protos.digest(), self.consts.digest(), self.link as u64];
        parts.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &x| (h ^ x).wrapping_mul(0x100_0000_01b3))
    }

    /// The choice for `coll` with `bytes` per rank (per block for all-gather and
    /// reduce-scatter).
    pub(crate) fn choose(&self, coll: CollType, bytes: usize) -> Result<Choice> {
        let func = coll as usize;
        if let Some(c) = self.memo.get(func).and_then(|m| memo_choice(m.load(Ordering::Relaxed), bytes)) {
            return Ok(c);
        }
        let cands = candidates(coll);
        if cands.is_empty() || func >= FUNCS.len() {
            return Ok(Choice { algo: Algo::Direct, proto: Proto::Simple });
        }
        let algos: Vec<Algo> =
            cands.iter().filter(|(_, name)| self.policy.algos.allows(func, bit(&ALGOS, name))).map(|c| c.0).collect();
        if algos.is_empty() {
            return Err(Error::usage(format!(
                "{} leaves no algorithm that occl runs for {}; it supports {} (set OCCL_ALGO to include one)",
                self.policy.algos.describe(),
                coll.name(),
                upper(cands.iter().map(|c| c.1))
            )));
        }
        let runs = self.protocols();
        let protos: Vec<Proto> =
            runs.iter().filter(|(_, name)| self.policy.protos.allows(func, bit(&PROTOS, name))).map(|p| p.0).collect();
        if protos.is_empty() {
            return Err(Error::usage(format!(
                "{} leaves no protocol that occl runs for {} over {}; it supports {} (set OCCL_PROTO to include one)",
                self.policy.protos.describe(),
                coll.name(),
                self.link.name(),
                upper(runs.iter().map(|p| p.1))
            )));
        }
        let price = |c: &Choice| self.price(coll, *c, bytes);
        let mut best: Option<(Choice, f64)> = None;
        for &algo in &algos {
            for &proto in &protos {
                let c = Choice { algo, proto };
                let t = price(&c);
                if best.is_none_or(|(_, bt)| t < bt) {
                    best = Some((c, t));
                }
            }
        }
        let (choice, _) = best.ok_or_else(|| Error::internal("the tuner priced no choice"))?;
        self.log_once(coll, bytes, choice, &algos, &protos);
        if let (Some(m), Some(w)) = (self.memo.get(func), memo_word(bytes, choice)) {
            m.store(w, Ordering::Relaxed);
        }
        Ok(choice)
    }

    /// The model's µs for `coll` with `bytes` per rank, run as `choose` would run it: what
    /// `ncclGroupSimulateEnd` reports.
    pub(crate) fn predict(&self, coll: CollType, bytes: usize) -> Result<f64> {
        let c = self.choose(coll, bytes)?;
        Ok(self.price(coll, c, bytes))
    }

    /// The protocols this communicator's links run: LL needs shared memory on every link.
    fn protocols(&self) -> &'static [(Proto, &'static str)] {
        match self.link {
            Link::Shm | Link::ShmShared => &PROTOCOLS,
            Link::Tcp | Link::TcpShared => &PROTOCOLS[..1],
        }
    }

    /// The model's µs for `coll` with `c` and `bytes` per rank.
    fn price(&self, coll: CollType, c: Choice, bytes: usize) -> f64 {
        let chunk = crate::coll::geometry(c.algo, c.proto, self.slot, self.nslots, crate::DataType::U8).1;
        let op = model::Op { coll, algo: c.algo, proto: c.proto, nranks: self.nranks, bytes, chunk };
        model::time(&self.consts, self.link, &op)
    }

    /// Logs a choice at INFO the first time its (collective, size class) comes up.
    fn log_once(&self, coll: CollType, bytes: usize, c: Choice, algos: &[Algo], protos: &[Proto]) {
        if !tracing::enabled!(tracing::Level::INFO) {
            return;
        }
        let class = (usize::BITS - bytes.leading_zeros()).min(63);
        let Some(seen) = self.logged.get(coll as usize) else { return };
        if seen.fetch_or(1 << class, Ordering::Relaxed) & (1 << class) != 0 {
            return;
        }
        let n = self.nranks;
        let priced: Vec<String> = algos
            .iter()
            .flat_map(|&a| protos.iter().map(move |&p| (a, p)))
            .map(|(a, p)| {
                let t = self.price(coll, Choice { algo: a, proto: p }, bytes);
                format!("{}/{} {t:.1} µs", a.name(), p.name())
            })
            .collect();
        let lo = if class == 0 { 0 } else { 1usize << (class - 1) };
        tracing::info!(
            "occl: tuner: {} of {lo}..{} B per rank on {n} ranks over {}: {}/{} (model: {})",
            coll.name(),
            lo.saturating_mul(2).max(1) - 1,
            self.link.name(),
            c.algo.name(),
            c.proto.name(),
            priced.join(", ")
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tuner(algo: Option<&str>, proto: Option<&str>, n: usize, kind: TransportKind) -> Tuner {
        let config = Config { algo: algo.map(str::to_string), proto: proto.map(str::to_string), ..Config::default() };
        Tuner::new(&config, n, &vec![kind; n.saturating_sub(1)], 1, 1).expect("tuner")
    }

    #[test]
    fn forced_choices_are_obeyed_or_refused() {
        let t = tuner(Some("allreduce:tree"), None, 4, TransportKind::Tcp);
        for bytes in [0, 8, 1 << 20, 1 << 30] {
            assert_eq!(t.choose(CollType::AllReduce, bytes).expect("tree").algo, Algo::Tree);
        }
        assert_eq!(t.choose(CollType::AllToAll, 8).expect("direct").algo, Algo::Direct);
        let t = tuner(Some("tree"), None, 4, TransportKind::Shm);
        assert_eq!(t.choose(CollType::Broadcast, 8).expect("tree").algo, Algo::Tree);
        let e = t.choose(CollType::AllGather, 8).expect_err("no tree all-gather");
        assert_eq!(e.kind(), crate::ErrorKind::InvalidUsage);
        assert!(e.to_string().contains("OCCL_ALGO=\"tree\"") && e.to_string().contains("RING, PAT"), "{e}");
        let e = tuner(Some("nvls,collnetdirect"), None, 2, TransportKind::Shm).choose(CollType::AllReduce, 8);
        assert!(e.expect_err("nothing runnable").to_string().contains("RING, TREE, ONESHOT"));
        let e = tuner(None, Some("ll128"), 2, TransportKind::Shm).choose(CollType::AllReduce, 8);
        assert!(e.expect_err("no ll128").to_string().contains("supports SIMPLE, LL"));
        let e =
            tuner(None, Some("ll"), 4, TransportKind::Tcp).choose(CollType::Broadcast, 8).expect_err("no LL on tcp");
        assert_eq!(e.kind(), crate::ErrorKind::InvalidUsage);
        assert!(e.to_string().contains("over tcp; it supports SIMPLE ("), "{e}");
        assert_eq!(
            tuner(None, Some("ll"), 4, TransportKind::Shm).choose(CollType::Broadcast, 8).expect("LL").proto,
            Proto::Ll
        );
        let t = tuner(None, Some("^ll"), 2, TransportKind::Shm);
        assert_eq!(t.choose(CollType::ReduceScatter, 8).expect("simple").proto, Proto::Simple);
    }

    /// A remembered choice is the one pricing gives, for repeated and alternating sizes, and a
    /// memo word names only its own size.
    #[test]
    fn remembered_choices_match_priced_ones() {
        let t = tuner(None, None, 4, TransportKind::Shm);
        for round in 0..3 {
            for bytes in [8, 8, 4096, 8, 1 << 20, 64 << 20, 1 << 20, 0] {
                let fresh = tuner(None, None, 4, TransportKind::Shm).choose(CollType::AllReduce, bytes).expect("fresh");
                assert_eq!(t.choose(CollType::AllReduce, bytes).expect("memo"), fresh, "round {round}, {bytes} B");
            }
        }
        let word = t.memo[CollType::AllReduce as usize].load(Ordering::Relaxed);
        assert_eq!(memo_choice(word, 0).map(|c| c.algo), Some(t.choose(CollType::AllReduce, 0).expect("0").algo));
        assert_eq!(memo_choice(word, 8), None);
        for algo in MEMO_ALGOS {
            for proto in MEMO_PROTOS {
                let c = Choice { algo, proto };
                assert_eq!(memo_word(12345, c).and_then(|w| memo_choice(w, 12345)), Some(c));
            }
        }
        assert_eq!(memo_word(usize::MAX, Choice { algo: Algo::Ring, proto: Proto::Simple }), None);
        assert_eq!(memo_choice(0, 0), None);
    }

    /// The defaults' shape: latency-bound algorithms for small messages, the ring for large ones.
    #[test]
    fn the_defaults_pick_short_paths_small_and_the_ring_large() {
        let pick = |n, kind, coll, bytes| tuner(None, None, n, kind).choose(coll, bytes).expect("choice").algo;
        use TransportKind::{Shm, Tcp};
        assert_eq!(pick(2, Shm, CollType::AllReduce, 8), Algo::OneShot);
        for n in [2, 4, 8] {
            for kind in [Shm, Tcp] {
                assert_eq!(pick(n, kind, CollType::AllReduce, 64 << 20), Algo::Ring, "n={n} {kind:?}");
                assert_eq!(pick(n, kind, CollType::AllGather, 64 << 20), Algo::Ring, "n={n} {kind:?}");
                assert_eq!(pick(n, kind, CollType::Broadcast, 64 << 20), Algo::Chain, "n={n} {kind:?}");
            }
        }
        assert_eq!(pick(8, Tcp, CollType::AllGather, 8), Algo::Pat);
        assert_eq!(pick(8, Tcp, CollType::ReduceScatter, 8), Algo::Pat);
        assert_eq!(pick(8, Tcp, CollType::Broadcast, 8), Algo::Tree);
        assert_eq!(pick(8, Tcp, CollType::Reduce, 8), Algo::Tree);
    }

    /// The all-reduce choices the measured runs call for (bench/baselines/algos-sweep.md): medians of
    /// forced runs of every algorithm and protocol at 2 ranks (shm, tcp) and 4 ranks on 2 cores
    /// (shm-shared, tcp-shared). Where two were within noise either is accepted.
    #[test]
    fn the_defaults_follow_the_measured_all_reduce_choices() {
        use TransportKind::{Shm, Tcp};
        // One host of 2 cores (the measured machine), or one rank per host.
        let at = |n: usize, kind, shared: bool| {
            let local = if shared { n } else { 1 };
            Tuner::new(&Config::default(), n, &vec![kind; n - 1], local, 2).expect("tuner")
        };
        let name = |c: Choice| format!("{}/{}", c.algo.name(), c.proto.name());
        // (ranks, transport, more ranks than cores, [(bytes, acceptable choices)]).
        type Sizes = &'static [(usize, &'static [&'static str])];
        type Case = (usize, TransportKind, bool, Sizes);
        let cases: [Case; 4] = [
            (
                2,
                Shm,
                false,
                &[
                    // The one-step path: Simple ahead of LL at 8 B here (0.18 against
                    // 0.22 µs) and on a 16-core host (0.31 against 0.45); at 128 B level there
                    // with LL and 7% behind the 2-rank tree/LL, ahead here.
                    (8, &["one-shot/simple"]),
                    (128, &["one-shot/ll", "one-shot/simple", "tree/ll"]),
                    (512, &["one-shot/simple"]),
                    // One-shot/Simple led LL by 13-40% at 1-2 KiB in the interleaved sweeps, on
                    // this machine and on a 16-core host.
                    (2 << 10, &["one-shot/simple"]),
                    (4 << 10, &["one-shot/simple"]),
                    (8 << 10, &["one-shot/simple"]),
                    (16 << 10, &["one-shot/simple"]),
                    // Interleaved: the one-shot (or the 2-rank tree, the same
                    // exchange) led the ring at 32 KiB by 7% here and 20% on a 16-core host.
                    (32 << 10, &["one-shot/simple", "tree/simple"]),
                    (1 << 20, &["ring/simple"]),
                    (64 << 20, &["ring/simple"]),
                ],
            ),
            (
                4,
                Shm,
                true,
                &[
                    (8, &["one-shot/simple"]),
                    (8 << 10, &["one-shot/simple"]),
                    (32 << 10, &["ring/simple"]),
                    (64 << 20, &["ring/simple"]),
                ],
            ),
            (
                2,
                Tcp,
                false,
                &[
                    (8, &["one-shot/simple"]),
                    (32 << 10, &["one-shot/simple"]),
                    // Level (interleaved: ring 5-9% ahead here, one-shot 6% on a 16-core host).
                    (256 << 10, &["ring/simple", "one-shot/simple"]),
                    (64 << 20, &["ring/simple"]),
                ],
            ),
            (
                4,
                Tcp,
                true,
                &[
                    (8, &["one-shot/simple"]),
                    (8 << 10, &["one-shot/simple"]),
                    (32 << 10, &["one-shot/simple", "tree/simple"]),
                    (256 << 10, &["ring/simple"]),
                    (64 << 20, &["ring/simple"]),
                ],
            ),
        ];
        for (n, kind, shared, sizes) in cases {
            let t = at(n, kind, shared);
            for &(bytes, ok) in sizes {
                let c = name(t.choose(CollType::AllReduce, bytes).expect("choice"));
                assert!(
                    ok.contains(&c.as_str()),
                    "n={n} {kind:?} shared={shared} {bytes} B: {c}, measured best {ok:?}"
                );
            }
        }
        // 4 ranks on a 16-core host (a core each): the choices within 10% of the best in every
        // round of the separate and of the interleaved sweeps (bench/baselines/algos-sweep.md).
        // Over tcp the tree of one piece (three hops) is level with the one-shot at 8-64 B.
        let on_16_cores: [(TransportKind, Sizes); 2] = [
            (
                Shm,
                &[
                    // The one-step path: Simple 1.45 against LL 1.93 µs.
                    (512, &["one-shot/simple"]),
                    (1 << 10, &["one-shot/simple"]),
                    (2 << 10, &["one-shot/simple", "ring/simple"]),
                    (4 << 10, &["one-shot/simple", "ring/simple"]),
                    (8 << 10, &["ring/simple"]),
                    (16 << 10, &["ring/simple"]),
                ],
            ),
            (
                Tcp,
                &[
                    (8, &["one-shot/simple", "tree/simple"]),
                    (64, &["one-shot/simple", "tree/simple"]),
                    (1 << 10, &["one-shot/simple", "tree/simple"]),
                    // Separate runs had the tree ahead at 8-32 KiB by 10-13%, the interleaved
                    // sweeps the one-shot by 9-11%: level within the spread of runs.
                    (8 << 10, &["tree/simple", "one-shot/simple"]),
                    (32 << 10, &["tree/simple", "one-shot/simple"]),
                    (64 << 10, &["ring/simple"]),
                ],
            ),
        ];
        for (kind, sizes) in on_16_cores {
            let t = Tuner::new(&Config::default(), 4, &[kind; 3], 4, 16).expect("tuner");
            for &(bytes, ok) in sizes {
                let c = name(t.choose(CollType::AllReduce, bytes).expect("choice"));
                assert!(ok.contains(&c.as_str()), "n=4 {kind:?}, 16 cores, {bytes} B: {c}, measured best {ok:?}");
            }
        }
    }

    #[test]
    fn every_rank_count_and_size_gets_a_choice() {
        for kind in [TransportKind::Shm, TransportKind::Tcp] {
            for n in 1..=9 {
                let t = tuner(None, None, n, kind);
                for coll in CollType::ALL {
                    for shift in 0..34 {
                        let c = t.choose(coll, (1usize << shift) - 1).expect("a choice");
                        assert!(candidates(coll).iter().any(|x| x.0 == c.algo) || c.algo == Algo::Direct);
                    }
                }
            }
        }
    }
}
