//! Calibration: the model's corrections (`base_us`, `scale` per link, collective, algorithm and
//! protocol) fitted to measured forced runs, written as an `OCCL_TUNER_FILE`. The `occl-tune`
//! tool feeds it occl-perf's JSON rows from `bench/algos-sweep.sh`.
//!
//! Two passes. First each measured (link, collective, algorithm, protocol) gets the base and
//! scale that fit its own times best (least squares on relative error; the link's α, γ and
//! bandwidth stay as they are and the correction absorbs the rest). That makes every prediction
//! close, but the tuner only needs the *order* right, and near a crossover a close fit can still
//! rank two choices the wrong way round. So the second pass searches the corrections (one at a
//! time, a few factors each) for the set whose picks lose least against the best measured
//! choice at every measured point: the sum of log(picked / best) plus a penalty for every point
//! more than 10% off.

use super::model::{self, Consts, Link, MODELLED};
use crate::coll::algo::{Algo, Proto};
use crate::config::policy::FUNCS;
use crate::error::{Error, Result};
use crate::record::CollType;
use std::collections::BTreeMap;

/// One forced run: what occl-perf's `--json` row and the sweep's `forced` field say.
#[derive(Clone, Debug)]
pub struct Measured {
    /// occl-perf's name: `all_reduce`, `broadcast`, `reduce`, `all_gather`, `reduce_scatter`.
    pub collective: String,
    pub nranks: usize,
    /// `shm` or `tcp`.
    pub transport: String,
    /// The forced algorithm, `ALGO` or `ALGO/PROTO` (`ring`, `tree/ll`, `pat`, `oneshot`).
    pub forced: String,
    /// occl-perf's size: the whole buffer for all-gather and reduce-scatter.
    pub size_bytes: usize,
    pub time_us: f64,
}

/// The fitted constants and how their picks fare against the measurements.
pub struct Calibration {
    /// The `OCCL_TUNER_FILE` text.
    pub file: String,
    /// One line per measured point: the pick, the best measured choice, their ratio.
    pub report: Vec<String>,
    /// Points whose pick is more than 10% slower than the best, and all points.
    pub misses: usize,
    pub points: usize,
}

/// A configuration the model prices.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Cfg {
    link: usize,
    func: usize,
    algo: usize,
    proto: usize,
}

/// Median times per (configuration, ranks, bytes per rank).
type Table = BTreeMap<(Cfg, usize, usize), f64>;
/// Per configuration: (ranks, bytes per rank, median µs).
type ByCfg = BTreeMap<Cfg, Vec<(usize, usize, f64)>>;

const ALGOS: [Algo; 4] = [Algo::Ring, Algo::Tree, Algo::Pat, Algo::OneShot];
const PROTOS: [Proto; 2] = [Proto::Simple, Proto::Ll];

fn coll_of(func: usize) -> Option<CollType> {
    CollType::ALL.iter().copied().find(|c| *c as usize == func)
}

/// The algorithm a forced name runs for a collective (broadcast and reduce call the chain "ring").
fn algo_of(func: usize, a: usize) -> Algo {
    match (FUNCS[func], a) {
        ("broadcast" | "reduce", 0) => Algo::Chain,
        _ => ALGOS[a],
    }
}

/// The link the tuner of `nranks` ranks on one host of `cores` cores sees.
fn link_of(transport: &str, nranks: usize, cores: usize) -> Option<usize> {
    let shared = nranks > cores;
    let l = match (transport, shared) {
        ("shm", false) => Link::Shm,
        ("shm", true) => Link::ShmShared,
        ("tcp", false) => Link::Tcp,
        ("tcp", true) => Link::TcpShared,
        _ => return None,
    };
    Some(l as usize)
}

fn parse(m: &Measured, cores: usize) -> Option<((Cfg, usize, usize), f64)> {
    let func = FUNCS.iter().position(|f| *f == m.collective.replace('_', ""))?;
    let (a, p) = m.forced.split_once('/').unwrap_or((&m.forced, "simple"));
    let algo = MODELLED.iter().position(|x| *x == a)?;
    let proto = ["simple", "ll"].iter().position(|x| *x == p)?;
    let link = link_of(&m.transport, m.nranks, cores)?;
    let per_rank = match FUNCS[func] {
        "allgather" | "reducescatter" => m.size_bytes / m.nranks.max(1),
        _ => m.size_bytes,
    };
    (m.time_us.is_finite() && m.time_us > 0.0)
        .then_some(((Cfg { link, func, algo, proto }, m.nranks, per_rank), m.time_us))
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// The model's µs for a configuration (the chunk as a communicator with `geometry`'s defaults
/// has it: the fitted file is for the default slot sizes).
fn price(c: &Consts, cfg: Cfg, n: usize, bytes: usize) -> f64 {
    let link = Link::ALL[cfg.link];
    let slot = match link {
        Link::Shm | Link::ShmShared => crate::Config::default().shm_slot_size,
        Link::Tcp | Link::TcpShared => crate::Config::default().tcp_slot_size,
    };
    let (algo, proto) = (algo_of(cfg.func, cfg.algo), PROTOS[cfg.proto]);
    let chunk = crate::coll::geometry(algo, proto, slot, crate::Config::default().fifo_slots, crate::DataType::U8).1;
    let Some(coll) = coll_of(cfg.func) else { return f64::INFINITY };
    model::time(c, link, &model::Op { coll, algo, proto, nranks: n, bytes, chunk })
}

/// Least-squares base and scale of one configuration (relative error), clipped to what a
/// tuner file accepts.
fn least_squares(c: &Consts, cfg: Cfg, pts: &[(usize, usize, f64)]) -> (f64, f64) {
    let mut probe = c.clone();
    let adj = |p: &mut Consts, base: f64, scale: f64| {
        let a = &mut p.adj[cfg.link][cfg.func][cfg.algo][cfg.proto];
        (a.base_us, a.scale) = (base, scale);
    };
    // t = base + a + scale·b, with a and b read off the model at (0, 0) and (0, 1).
    let (mut s11, mut s12, mut s22, mut r1, mut r2) = (0.0, 0.0, 0.0, 0.0, 0.0);
    let mut rows = Vec::new();
    for &(n, bytes, t) in pts {
        adj(&mut probe, 0.0, 0.0);
        let a = price(&probe, cfg, n, bytes);
        adj(&mut probe, 0.0, 1.0);
        let b = price(&probe, cfg, n, bytes) - a;
        let (x1, x2, y) = (1.0 / t, b / t, (t - a) / t);
        s11 += x1 * x1;
        s12 += x1 * x2;
        s22 += x2 * x2;
        r1 += x1 * y;
        r2 += x2 * y;
        rows.push((x1, x2, y));
    }
    const MIN_SCALE: f64 = 0.05;
    let det = s11 * s22 - s12 * s12;
    let (mut base, mut scale) =
        if det.abs() > 1e-12 { ((r1 * s22 - r2 * s12) / det, (r2 * s11 - r1 * s12) / det) } else { (0.0, 1.0) };
    if base < 0.0 {
        base = 0.0;
        scale = if s22 > 0.0 { r2 / s22 } else { 1.0 };
    }
    if scale < MIN_SCALE || !scale.is_finite() {
        scale = MIN_SCALE;
        let fit: f64 = rows.iter().map(|(x1, x2, y)| x1 * (y - scale * x2)).sum();
        base = if s11 > 0.0 { (fit / s11).max(0.0) } else { 0.0 };
    }
    (base, scale)
}

/// Per measured point (link, collective, ranks, bytes): each measured configuration's time.
type Points = BTreeMap<(usize, usize, usize, usize), Vec<(Cfg, f64)>>;

/// The configuration the model picks at a point among those measured there.
fn pick(c: &Consts, key: (usize, usize, usize, usize), cands: &[(Cfg, f64)]) -> (Cfg, f64) {
    let (_, _, n, bytes) = key;
    let mut best = cands[0];
    let mut best_t = f64::INFINITY;
    for &(cfg, t) in cands {
        let p = price(c, cfg, n, bytes);
        if p < best_t {
            (best, best_t) = ((cfg, t), p);
        }
    }
    best
}

/// Regret of the model's picks: Σ log(picked / best) + 0.1 per point more than 10% off, and
/// the count of such points.
fn regret(c: &Consts, points: &Points) -> (f64, usize) {
    let (mut r, mut misses) = (0.0, 0);
    for (&key, cands) in points {
        let best = cands.iter().map(|x| x.1).fold(f64::INFINITY, f64::min);
        let ratio = pick(c, key, cands).1 / best;
        r += ratio.ln();
        if ratio > 1.10 {
            misses += 1;
            r += 0.1;
        }
    }
    (r, misses)
}

fn name(cfg: Cfg) -> String {
    format!("{}.{}.{}.{}", Link::ALL[cfg.link].name(), FUNCS[cfg.func], MODELLED[cfg.algo], ["simple", "ll"][cfg.proto])
}

/// The measurements by configuration, and the points (link, collective, ranks, bytes) where
/// more than one configuration was measured.
fn tables(rows: &[Measured], cores: usize) -> Result<(ByCfg, Points)> {
    let mut raw: BTreeMap<(Cfg, usize, usize), Vec<f64>> = BTreeMap::new();
    for m in rows {
        if let Some((k, t)) = parse(m, cores) {
            raw.entry(k).or_default().push(t);
        }
    }
    if raw.is_empty() {
        return Err(Error::arg("no forced run in the input that the model prices (need the sweep's \"forced\" rows)"));
    }
    let table: Table = raw.into_iter().map(|(k, mut v)| (k, median(&mut v))).collect();
    let mut by_cfg: ByCfg = BTreeMap::new();
    let mut points: Points = BTreeMap::new();
    for (&(cfg, n, bytes), &t) in &table {
        by_cfg.entry(cfg).or_default().push((n, bytes, t));
        points.entry((cfg.link, cfg.func, n, bytes)).or_default().push((cfg, t));
    }
    points.retain(|_, v| v.len() > 1);
    Ok((by_cfg, points))
}

/// Per point, the pick of `c` against the best measured choice; and the count over 10%.
fn report(c: &Consts, points: &Points) -> (Vec<String>, usize) {
    let mut lines = Vec::new();
    let mut misses = 0;
    for (&key, cands) in points {
        let (l, f, n, bytes) = key;
        let (bcfg, bt) = cands.iter().copied().min_by(|a, b| a.1.total_cmp(&b.1)).unwrap_or(cands[0]);
        let (pcfg, pt) = pick(c, key, cands);
        let ratio = pt / bt;
        misses += usize::from(ratio > 1.10);
        let short = |x: Cfg| format!("{}/{}", MODELLED[x.algo], ["simple", "ll"][x.proto]);
        lines.push(format!(
            "{:<10} {:<13} n={n} {bytes:>9} B/rank: pick {:<14} {pt:>10.2} µs, best {:<14} {bt:>10.2} µs, ratio {ratio:.2}{}",
            Link::ALL[l].name(),
            FUNCS[f],
            short(pcfg),
            short(bcfg),
            if ratio > 1.10 { " **" } else { "" }
        ));
    }
    (lines, misses)
}

/// How the picks of constants `c` fare against `rows` (a file held out from the fit, or the
/// defaults).
pub(crate) fn check(rows: &[Measured], cores: usize, c: &Consts) -> Result<Calibration> {
    let (_, points) = tables(rows, cores)?;
    let (report, misses) = report(c, &points);
    Ok(Calibration { file: String::new(), report, misses, points: points.len() })
}

/// Factors a search step tries on one constant.
const FACTORS: [f64; 8] = [0.5, 0.7, 0.85, 0.95, 1.05, 1.2, 1.4, 2.0];

/// The constants one search step may change: a correction's base or scale, or (with
/// `--links`) one of a link's five.
#[derive(Clone, Copy)]
enum Knob {
    Base(Cfg),
    Scale(Cfg),
    Link(usize, usize),
}

fn turn(c: &mut Consts, k: Knob, f: f64) {
    match k {
        // A base of 0 cannot grow by a factor: start it from 0.1 µs.
        Knob::Base(cfg) => {
            let a = &mut c.adj[cfg.link][cfg.func][cfg.algo][cfg.proto];
            a.base_us = if a.base_us == 0.0 { 0.1 * f } else { a.base_us * f };
        }
        Knob::Scale(cfg) => c.adj[cfg.link][cfg.func][cfg.algo][cfg.proto].scale *= f,
        Knob::Link(l, i) => {
            let x = &mut c.links[l];
            *[&mut x.alpha_us, &mut x.gamma_us, &mut x.gbps, &mut x.ll_alpha_us, &mut x.ll_gbps][i] *= f;
        }
    }
}

/// Coordinate search on the regret from `c`, one constant and factor at a time: the best
/// constants found and their regret.
fn search(mut c: Consts, knobs: &[Knob], points: &Points) -> (Consts, f64) {
    let (mut best, _) = regret(&c, points);
    for _round in 0..20 {
        let mut improved = false;
        for &k in knobs {
            for f in FACTORS {
                let mut t = c.clone();
                turn(&mut t, k, f);
                let (r, _) = regret(&t, points);
                if r < best - 1e-9 {
                    (best, c, improved) = (r, t, true);
                }
            }
        }
        if !improved {
            break;
        }
    }
    (c, best)
}

const LINK_PARAMS: [&str; 5] = ["alpha_us", "gamma_us", "gbps", "ll.alpha_us", "ll.gbps"];

/// Fits the corrections to `rows` (forced runs on a host of `cores` cores) over `start`;
/// with `links`, the measured links' α, γ and bandwidths too (they price every collective on
/// the link, so only for a sweep of every collective).
pub(crate) fn fit(rows: &[Measured], cores: usize, start: Consts, links: bool) -> Result<Calibration> {
    let (by_cfg, points) = tables(rows, cores)?;
    let mut ls = start.clone();
    for (&cfg, pts) in &by_cfg {
        let (base_us, scale) = least_squares(&ls, cfg, pts);
        let a = &mut ls.adj[cfg.link][cfg.func][cfg.algo][cfg.proto];
        (a.base_us, a.scale) = (base_us, scale);
    }
    let mut knobs: Vec<Knob> = by_cfg.keys().flat_map(|&cfg| [Knob::Base(cfg), Knob::Scale(cfg)]).collect();
    let mut measured: Vec<usize> = by_cfg.keys().map(|c| c.link).collect();
    measured.dedup();
    if links {
        knobs.extend(measured.iter().flat_map(|&l| (0..LINK_PARAMS.len()).map(move |i| Knob::Link(l, i))));
    }
    // The search runs from the least-squares fit and from the constants it started with (a
    // close fit can rank worse than cruder constants); the lower regret wins.
    let (a, b) = (search(ls, &knobs, &points), search(start, &knobs, &points));
    let c = if a.1 <= b.1 { a.0 } else { b.0 };
    let mut file = String::from(
        "# occl tuner constants fitted by occl-tune to forced occl-perf runs (base µs and byte-term\n\
         # scale per link, collective, algorithm, protocol; see core/src/coll/tune/file.rs)\n",
    );
    if links {
        for &l in &measured {
            let x = c.links[l];
            let v = [x.alpha_us, x.gamma_us, x.gbps, x.ll_alpha_us, x.ll_gbps];
            for (p, v) in LINK_PARAMS.iter().zip(v) {
                file += &format!("{}.{p} = {v:.4}\n", Link::ALL[l].name());
            }
        }
    }
    for &cfg in by_cfg.keys() {
        let a = c.adj[cfg.link][cfg.func][cfg.algo][cfg.proto];
        file += &format!("{}.base_us = {:.3}\n{}.scale = {:.4}\n", name(cfg), a.base_us, name(cfg), a.scale);
        if a.peer_us != 0.0 {
            file += &format!("{}.peer_us = {:.3}\n", name(cfg), a.peer_us);
        }
    }
    let (report, misses) = report(&c, &points);
    Ok(Calibration { file, report, misses, points: points.len() })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(forced: &str, size: usize, t: f64) -> Measured {
        Measured {
            collective: "all_reduce".into(),
            nranks: 2,
            transport: "shm".into(),
            forced: forced.into(),
            size_bytes: size,
            time_us: t,
        }
    }

    /// Measurements in which the ring wins small sizes and the one-shot large ones (the reverse
    /// of the defaults' shape): the fitted file must make the tuner pick accordingly, and the
    /// file must load.
    #[test]
    fn the_fit_follows_the_measurements() {
        let mut rows = Vec::new();
        for (i, &size) in [8usize, 1024, 65536, 1 << 20, 16 << 20].iter().enumerate() {
            let ring = 1.0 + size as f64 / 1000.0;
            let oneshot = if i < 2 { 3.0 * ring } else { 0.5 * ring };
            for _ in 0..3 {
                rows.push(row("ring", size, ring));
                rows.push(row("oneshot", size, oneshot));
                rows.push(row("tree", size, 5.0 * ring));
            }
        }
        let cal = fit(&rows, 2, Consts::default(), false).expect("fits");
        assert_eq!((cal.misses, cal.points), (0, 5), "{}", cal.report.join("\n"));
        let c = super::super::file::parse(&cal.file).expect("the file loads");
        assert_eq!(check(&rows, 2, &c).expect("checks").misses, 0);
        assert!(check(&rows, 2, &Consts::default()).expect("checks").misses > 0, "the defaults pick the other way");
        let pick = |bytes| {
            let cands = [Cfg { link: 0, func: 4, algo: 0, proto: 0 }, Cfg { link: 0, func: 4, algo: 3, proto: 0 }];
            let p = |cfg| price(&c, cfg, 2, bytes);
            if p(cands[0]) < p(cands[1]) {
                "ring"
            } else {
                "oneshot"
            }
        };
        assert_eq!([pick(8), pick(1024), pick(65536), pick(16 << 20)], ["ring", "ring", "oneshot", "oneshot"]);
    }

    #[test]
    fn rows_it_cannot_use_are_an_error() {
        let e =
            fit(&[row("-", 8, 1.0), row("nvls", 8, 1.0)], 2, Consts::default(), false).err().expect("nothing to fit");
        assert_eq!(e.kind(), crate::ErrorKind::InvalidArgument);
    }
}
