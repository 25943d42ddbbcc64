//! `occl-perf --compare LIST`: the tuner's choice against forced algorithms and protocols,
//! interleaved in one run. Each entry of LIST (`-` for the tuner, `ring`, `tree/ll`, …) gets a
//! communicator of its own, split from the job's with `OCCL_ALGO`/`OCCL_PROTO` set for this
//! collective alone, and all of them share one pair of buffers (one memory, one cache state).
//! For every size the batches rotate through the entries (batch b starts at entry b mod k), so
//! each entry's median is taken over the same minutes of the machine as every other's: separate
//! runs per forced choice, seconds apart, differ by more than the 10% the tuner is judged by.

use super::bench::{Average, Bench};
use super::{json_row, median, Layout, Measure, RowInfo};
use occl::{Comm, Config};
use std::io::Write;

/// One entry of `--compare`: the tuner's own choice, or an algorithm (and protocol) forced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Choice {
    /// As written (`-`, `ring`, `tree/ll`): the `forced` field of its rows.
    pub label: String,
    pub algo: Option<String>,
    pub proto: Option<String>,
}

impl std::str::FromStr for Choice {
    type Err = String;
    fn from_str(s: &str) -> Result<Choice, String> {
        let s = s.trim();
        let word = |w: &str| !w.is_empty() && w.chars().all(|c| c.is_ascii_alphanumeric());
        let (algo, proto) = match s.split_once('/') {
            _ if s == "-" => (None, None),
            None if word(s) => (Some(s), None),
            Some((a, p)) if word(a) && word(p) => (Some(a), Some(p)),
            _ => return Err(format!("'{s}' is not a choice: expected -, ALGO or ALGO/PROTO (ring, tree/ll, …)")),
        };
        Ok(Choice { label: s.to_string(), algo: algo.map(str::to_string), proto: proto.map(str::to_string) })
    }
}

/// Calls per batch and how many batches, as for the normal table.
#[derive(Clone, Copy, Debug)]
pub struct Plan {
    pub batches: usize,
    pub warmup: usize,
    pub iters: usize,
    pub check: bool,
    pub average: Average,
}

/// What `run` measures: the sizes, the choices, how, and the rows' fixed fields.
pub struct Sweep<'a> {
    pub layouts: &'a [Layout],
    pub choices: &'a [Choice],
    pub plan: Plan,
    pub info: &'a RowInfo,
}

/// Splits one communicator per choice off `comm` (every rank must pass the same list), runs
/// every layout out of place on buffers of `max_bytes`, and prints one JSON row per (size,
/// choice) on rank 0, with the choice in `forced`. Returns the wrong elements found by the
/// checked runs, summed over ranks.
pub fn run(comm: &Comm, max_bytes: usize, sweep: &Sweep<'_>, out: &mut dyn Write) -> anyhow::Result<u64> {
    let Sweep { choices, info, .. } = *sweep;
    let coll = info.coll;
    // NCCL's per-collective syntax, so that the benchmark's own barriers keep the tuner's choice.
    let name = coll.json_name().replace('_', "");
    let mut comms = Vec::with_capacity(choices.len());
    for c in choices {
        let mut config: Config = comm.config().clone();
        if let Some(a) = &c.algo {
            config.algo = Some(format!("{name}:{a}"));
        }
        if let Some(p) = &c.proto {
            config.proto = Some(format!("{name}:{p}"));
        }
        let child = comm
            .split_with(0, comm.rank() as i32, config)
            .map_err(|e| anyhow::anyhow!("--compare {}: {e}", c.label))?
            .ok_or_else(|| anyhow::anyhow!("--compare {}: the split gave no communicator", c.label))?;
        comms.push(child);
    }
    let res = match comms.first() {
        Some(first) => {
            let mut bench = Bench::new(first, coll, info.dtype, info.op, info.root, max_bytes);
            measure(&mut bench, &comms, sweep, out)
        }
        None => Ok(0),
    };
    for c in comms {
        c.destroy()?;
    }
    res
}

fn measure<'a>(
    bench: &mut Bench<'a>,
    comms: &'a [Comm],
    sweep: &Sweep<'_>,
    out: &mut dyn Write,
) -> anyhow::Result<u64> {
    let Sweep { layouts, choices, plan, info } = *sweep;
    let (k, lead) = (comms.len(), bench.comm.rank() == 0);
    let mut wrong_total = 0;
    for &layout in layouts {
        let mut wrong = vec![None; k];
        for (i, c) in comms.iter().enumerate() {
            bench.comm = c;
            if plan.check {
                let mine =
                    bench.check(layout, false).map_err(|e| anyhow::anyhow!("--compare {}: {e}", choices[i].label))?;
                let all = bench.sum(mine)?;
                wrong_total += all;
                wrong[i] = Some(all);
            }
        }
        let mut times = vec![Vec::with_capacity(plan.batches); k];
        for b in 0..plan.batches {
            for j in 0..k {
                let i = (b + j) % k;
                bench.comm = &comms[i];
                let warmup = if b == 0 { plan.warmup } else { 0 };
                let secs = bench
                    .time(layout, false, warmup, plan.iters)
                    .map_err(|e| anyhow::anyhow!("--compare {}: {e}", choices[i].label))?;
                times[i].push(bench.combine(secs, plan.average)?);
            }
        }
        for (i, c) in comms.iter().enumerate() {
            let secs = median(&mut times[i]);
            let m = Measure::new(info.coll, layout.bytes, info.nranks, secs * 1e6, wrong[i]);
            if lead {
                let bytes = layout.count * info.dtype.size();
                let chosen = (c.algorithm(info.coll.coll_type(), bytes), c.protocol(info.coll.coll_type(), bytes));
                let mut row = json_row(info, layout, false, &m, chosen);
                row["forced"] = serde_json::Value::from(choices[i].label.as_str());
                writeln!(out, "{row}")?;
                out.flush()?;
            }
        }
    }
    Ok(wrong_total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn choices_parse_and_bad_ones_say_what_is_expected() {
        let c: Choice = "tree/ll".parse().expect("parses");
        assert_eq!((c.algo.as_deref(), c.proto.as_deref(), c.label.as_str()), (Some("tree"), Some("ll"), "tree/ll"));
        let c: Choice = "-".parse().expect("parses");
        assert_eq!((c.algo, c.proto), (None, None));
        let c: Choice = "oneshot".parse().expect("parses");
        assert_eq!((c.algo.as_deref(), c.proto), (Some("oneshot"), None));
        for bad in ["", "ring/", "/ll", "ring/ll/x", "ring;tree", "^ring"] {
            let e = bad.parse::<Choice>().unwrap_err();
            assert!(e.contains("ALGO/PROTO"), "{bad}: {e}");
        }
    }
}
