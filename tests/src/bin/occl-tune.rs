//! Writes an `OCCL_TUNER_FILE` fitted to a sweep of forced runs:
//!
//! ```text
//! bash bench/algos-sweep.sh > sweep.jsonl
//! occl-tune sweep.jsonl -o tuner.conf [--cores N]
//! OCCL_TUNER_FILE=tuner.conf my-job
//! ```
//!
//! `--check FILE` (or `--check default`) fits nothing: it reports how the picks of that file (or
//! of the built-in constants) fare against the input, e.g. a sweep held out from the fit.
//!
//! Input: occl-perf `--json` rows with the sweep's `forced` field (`ring`, `tree/ll`, …; the
//! tuner's own rows, `-`, and failed or in-place rows are skipped), median over repeats. Prints,
//! per measured point, the fitted model's pick against the best measured choice.

use anyhow::Context;
use clap::Parser;
use occl::tuning::{calibrate, check_file, Measured};

#[derive(Parser)]
#[command(about = "Fit the tuner's constants to forced occl-perf runs and write an OCCL_TUNER_FILE")]
struct Args {
    /// JSON-lines files from bench/algos-sweep.sh.
    #[arg(required = true)]
    inputs: Vec<std::path::PathBuf>,
    /// Where to write the tuner file (default: print it).
    #[arg(short, long)]
    output: Option<std::path::PathBuf>,
    /// Cores of the host the runs took place on (it decides which runs had more ranks than
    /// cores); default: this host's.
    #[arg(long)]
    cores: Option<usize>,
    /// Judge this tuner file (or `default`: the built-in constants) instead of fitting one.
    #[arg(long, value_name = "FILE")]
    check: Option<std::path::PathBuf>,
    /// Fit the links' α, γ and bandwidths too, not only the per-algorithm corrections. They
    /// price every collective on the link: use it with a sweep of every collective.
    #[arg(long)]
    links: bool,
    /// Print the file only, not the per-point report.
    #[arg(short, long)]
    quiet: bool,
}

fn field<'a>(v: &'a serde_json::Value, k: &str) -> Option<&'a serde_json::Value> {
    v.get(k)
}

fn main() -> anyhow::Result<()> {
    let a = Args::parse();
    let mut rows = Vec::new();
    for path in &a.inputs {
        let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        for (i, line) in text.lines().enumerate() {
            if !line.starts_with('{') {
                continue;
            }
            let v: serde_json::Value =
                serde_json::from_str(line).with_context(|| format!("{}:{}: not JSON", path.display(), i + 1))?;
            let flag = |k| field(&v, k).and_then(serde_json::Value::as_bool).unwrap_or(false);
            if flag("failed") || flag("inplace") {
                continue;
            }
            let s = |k| field(&v, k).and_then(serde_json::Value::as_str).map(str::to_string);
            let u = |k| field(&v, k).and_then(serde_json::Value::as_u64).map(|x| x as usize);
            let (Some(collective), Some(transport), Some(forced), Some(nranks), Some(size_bytes), Some(time_us)) = (
                s("collective"),
                s("transport"),
                s("forced"),
                u("nranks"),
                u("size_bytes"),
                field(&v, "time_us").and_then(serde_json::Value::as_f64),
            ) else {
                continue;
            };
            if forced != "-" {
                rows.push(Measured { collective, nranks, transport, forced, size_bytes, time_us });
            }
        }
    }
    let cores = a.cores.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let cal = match &a.check {
        None => calibrate(&rows, cores, a.links)?,
        Some(p) if p.as_os_str() == "default" => check_file(&rows, cores, None)?,
        Some(p) => {
            let text = std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
            check_file(&rows, cores, Some(&text))?
        }
    };
    if !a.quiet {
        for l in &cal.report {
            eprintln!("{l}");
        }
        eprintln!(
            "occl-tune: {} forced rows, {} points; the picks are within 10% of the best measured choice at {} of them",
            rows.len(),
            cal.points,
            cal.points - cal.misses
        );
    }
    match &a.output {
        _ if a.check.is_some() => {}
        Some(p) => std::fs::write(p, &cal.file).with_context(|| format!("writing {}", p.display()))?,
        None => print!("{}", cal.file),
    }
    Ok(())
}
