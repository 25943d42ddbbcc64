//! The pieces of `occl-perf` that do not talk to a communicator: the collectives it measures and
//! how each one lays out its buffers, nccl-tests' size syntax and size sweep, bus-bandwidth
//! factors, and the table and JSON formats of one result row.

pub mod bench;
pub mod compare;
pub mod events_ab;

use occl::{DataType, RedOp};

/// The median of `v` (the mean of the middle two when even; 0 when empty). Sorts `v`.
pub fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// The operations `occl-perf` measures, named as on its command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Collective {
    #[value(name = "all_reduce", alias = "allreduce")]
    AllReduce,
    #[value(name = "all_gather", alias = "allgather")]
    AllGather,
    #[value(name = "reduce_scatter", alias = "reducescatter")]
    ReduceScatter,
    #[value(name = "broadcast", alias = "bcast")]
    Broadcast,
    #[value(name = "reduce")]
    Reduce,
    #[value(name = "alltoall", alias = "all_to_all")]
    AllToAll,
    #[value(name = "sendrecv", alias = "send_recv")]
    SendRecv,
}

impl Collective {
    /// The name in JSON rows: snake case, as `anchors/nccl_bench.py` prints it (`all_to_all`).
    pub fn json_name(self) -> &'static str {
        match self {
            Collective::AllReduce => "all_reduce",
            Collective::AllGather => "all_gather",
            Collective::ReduceScatter => "reduce_scatter",
            Collective::Broadcast => "broadcast",
            Collective::Reduce => "reduce",
            Collective::AllToAll => "all_to_all",
            Collective::SendRecv => "sendrecv",
        }
    }

    /// Whether the operation reduces (and so takes `-o`).
    pub fn reduces(self) -> bool {
        matches!(self, Collective::AllReduce | Collective::ReduceScatter | Collective::Reduce)
    }

    /// Whether the operation has a root (and so takes `-r`).
    pub fn rooted(self) -> bool {
        matches!(self, Collective::Broadcast | Collective::Reduce)
    }

    /// Whether the size is the total buffer, split into one block per rank.
    pub fn blocked(self) -> bool {
        matches!(self, Collective::AllGather | Collective::ReduceScatter | Collective::AllToAll)
    }

    /// The operation occl records for it (sendrecv: its sends).
    pub fn coll_type(self) -> occl::CollType {
        match self {
            Collective::AllReduce => occl::CollType::AllReduce,
            Collective::AllGather => occl::CollType::AllGather,
            Collective::ReduceScatter => occl::CollType::ReduceScatter,
            Collective::Broadcast => occl::CollType::Broadcast,
            Collective::Reduce => occl::CollType::Reduce,
            Collective::AllToAll => occl::CollType::AllToAll,
            Collective::SendRecv => occl::CollType::Send,
        }
    }

    /// nccl-tests' bus-bandwidth factor for `n` ranks.
    pub fn bus_factor(self, n: usize) -> f64 {
        let n = n as f64;
        match self {
            Collective::AllReduce => 2.0 * (n - 1.0) / n,
            Collective::AllGather | Collective::ReduceScatter | Collective::AllToAll => (n - 1.0) / n,
            Collective::Broadcast | Collective::Reduce | Collective::SendRecv => 1.0,
        }
    }

    /// What one requested size means for `n` ranks of `dt`: the element count per call (per
    /// rank block for the blocked collectives) and the bytes reported, rounded down to whole
    /// elements (and whole blocks) as nccl-tests does.
    pub fn layout(self, size: usize, dt: DataType, n: usize) -> Layout {
        let per = if self.blocked() { dt.size() * n } else { dt.size() };
        let count = size / per;
        Layout { count, bytes: count * per }
    }
}

/// One size of a sweep, as run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    /// Elements per call (per rank block for all-gather, reduce-scatter and all-to-all).
    pub count: usize,
    /// Bytes the size column reports: the total buffer for the blocked collectives.
    pub bytes: usize,
}

/// Parses a byte count as nccl-tests does: a number with an optional `K`, `M` or `G` suffix
/// (binary multiples; a trailing `B` or `iB` is also accepted: `64M`, `64MiB`, `1k`, `8`).
pub fn parse_size(text: &str) -> Result<usize, String> {
    let t = text.trim();
    let lower = t.to_ascii_lowercase();
    let stem = lower.strip_suffix("ib").or_else(|| lower.strip_suffix('b')).unwrap_or(&lower);
    let (digits, shift) = match stem.chars().last() {
        Some('k') => (&stem[..stem.len() - 1], 10),
        Some('m') => (&stem[..stem.len() - 1], 20),
        Some('g') => (&stem[..stem.len() - 1], 30),
        Some('t') => (&stem[..stem.len() - 1], 40),
        _ => (stem, 0),
    };
    let n: usize = digits.trim().parse().map_err(|_| {
        format!("'{text}' is not a size: expected a number with an optional K, M or G suffix (e.g. 8, 1K, 64M)")
    })?;
    n.checked_mul(1usize << shift).ok_or_else(|| format!("size '{text}' is too large"))
}

/// nccl-tests' sweep: from `min` to `max` inclusive, multiplying by `factor` when it is above 1
/// and otherwise adding `step`.
pub fn sweep(min: usize, max: usize, factor: u64, step: usize) -> Result<Vec<usize>, String> {
    if min > max {
        return Err(format!("minbytes ({min}) is larger than maxbytes ({max})"));
    }
    if factor <= 1 && step == 0 && min != max {
        return Err("stepbytes must be above 0 when stepfactor is 1".into());
    }
    let mut sizes = Vec::new();
    let mut s = min;
    loop {
        sizes.push(s);
        let next = if factor > 1 {
            if s == 0 {
                1
            } else {
                s.saturating_mul(factor as usize)
            }
        } else {
            s.saturating_add(step)
        };
        if next > max || next == s {
            break;
        }
        s = next;
    }
    Ok(sizes)
}

/// The result of one timed run (one half of a table row).
#[derive(Debug, Clone, Copy)]
pub struct Measure {
    pub time_us: f64,
    pub algbw: f64,
    pub busbw: f64,
    /// Wrong elements summed over ranks; `None` when not checked.
    pub wrong: Option<u64>,
}

impl Measure {
    pub fn new(coll: Collective, bytes: usize, nranks: usize, time_us: f64, wrong: Option<u64>) -> Measure {
        let algbw = if time_us > 0.0 { bytes as f64 / (time_us * 1e-6) / 1e9 } else { 0.0 };
        Measure { time_us, algbw, busbw: algbw * coll.bus_factor(nranks), wrong }
    }
}

/// What every row shares.
#[derive(Debug, Clone)]
pub struct RowInfo {
    pub coll: Collective,
    pub nranks: usize,
    pub dtype: DataType,
    pub op: RedOp,
    pub root: usize,
    pub transport: &'static str,
}

impl RowInfo {
    pub fn redop_name(&self) -> &'static str {
        if self.coll.reduces() {
            self.op.name()
        } else {
            "none"
        }
    }

    pub fn root_value(&self) -> i64 {
        if self.coll.rooted() {
            self.root as i64
        } else {
            -1
        }
    }
}

/// The widths of nccl-tests' columns: size, count, type, redop, root; then per half time,
/// algbw, busbw, #wrong.
pub fn table_header(out_of_place: &str, in_place: &str) -> String {
    let lead = format!("#{:>11}  {:>12}  {:>8}  {:>6}  {:>6}", "", "", "", "", "");
    let half = |title: &str| format!("{title:^32}");
    let names = format!(
        "#{:>11}  {:>12}  {:>8}  {:>6}  {:>6}{}{}",
        "size",
        "count",
        "type",
        "redop",
        "root",
        half_cols("time", "algbw", "busbw", "#wrong"),
        half_cols("time", "algbw", "busbw", "#wrong")
    );
    let units = format!(
        "#{:>11}  {:>12}  {:>8}  {:>6}  {:>6}{}{}",
        "(B)",
        "(elements)",
        "",
        "",
        "",
        half_cols("(us)", "(GB/s)", "(GB/s)", ""),
        half_cols("(us)", "(GB/s)", "(GB/s)", "")
    );
    format!("{lead}{}{}\n{names}\n{units}", half(out_of_place), half(in_place))
}

fn half_cols(a: &str, b: &str, c: &str, d: &str) -> String {
    format!("  {a:>7}  {b:>6}  {c:>6} {d:>6}")
}

/// nccl-tests' time format: fewer decimals as the time grows.
fn time_str(us: f64) -> String {
    if us >= 10000.0 {
        format!("{us:.0}")
    } else if us >= 100.0 {
        format!("{us:.1}")
    } else {
        format!("{us:.2}")
    }
}

/// One table row: out-of-place and in-place halves (`None`: not run, printed as N/A).
pub fn table_row(info: &RowInfo, layout: Layout, out: Option<&Measure>, inp: Option<&Measure>) -> String {
    let half = |m: Option<&Measure>| match m {
        Some(m) => format!(
            "  {:>7}  {:>6.2}  {:>6.2} {:>6}",
            time_str(m.time_us),
            m.algbw,
            m.busbw,
            m.wrong.map_or_else(|| "N/A".to_string(), |w| w.to_string())
        ),
        None => half_cols("N/A", "N/A", "N/A", "N/A"),
    };
    format!(
        "{:>12}  {:>12}  {:>8}  {:>6}  {:>6}{}{}",
        layout.bytes,
        layout.count,
        info.dtype.name(),
        info.redop_name(),
        info.root_value(),
        half(out),
        half(inp)
    )
}

/// One JSON row (one line) for `--json`.
/// `algo` and `proto` are what the communicator ran for this size (`Comm::algorithm`, `Comm::protocol`).
pub fn json_row(
    info: &RowInfo,
    layout: Layout,
    inplace: bool,
    m: &Measure,
    (algo, proto): (&str, &str),
) -> serde_json::Value {
    let round = |x: f64| (x * 1000.0).round() / 1000.0;
    serde_json::json!({
        "collective": info.coll.json_name(),
        "nranks": info.nranks,
        "size_bytes": layout.bytes,
        "count": layout.count,
        "dtype": info.dtype.name(),
        "redop": info.redop_name(),
        "root": info.root_value(),
        "inplace": inplace,
        "time_us": round(m.time_us),
        "algbw_gbps": round(m.algbw),
        "busbw_gbps": round(m.busbw),
        "wrong": m.wrong,
        "algo": algo,
        "proto": proto,
        "transport": info.transport,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_like_nccl_tests() {
        assert_eq!(parse_size("8"), Ok(8));
        assert_eq!(parse_size("1K"), Ok(1024));
        assert_eq!(parse_size("64M"), Ok(64 << 20));
        assert_eq!(parse_size("2g"), Ok(2 << 30));
        assert_eq!(parse_size("64MiB"), Ok(64 << 20));
        assert_eq!(parse_size("16KB"), Ok(16 << 10));
        assert!(parse_size("x").is_err());
        assert!(parse_size("").is_err());
        assert!(parse_size("1.5M").is_err());
    }

    #[test]
    fn sweeps() {
        assert_eq!(sweep(8, 64, 2, 0), Ok(vec![8, 16, 32, 64]));
        assert_eq!(sweep(8, 100, 4, 0), Ok(vec![8, 32]));
        assert_eq!(sweep(1, 4, 1, 1), Ok(vec![1, 2, 3, 4]));
        assert_eq!(sweep(32, 32, 1, 0), Ok(vec![32]));
        assert!(sweep(64, 8, 2, 0).is_err());
    }

    #[test]
    fn layouts_and_factors() {
        let l = Collective::AllGather.layout(64 << 20, DataType::F32, 2);
        assert_eq!(l, Layout { count: 8 << 20, bytes: 64 << 20 });
        let l = Collective::AllReduce.layout(10, DataType::F32, 2);
        assert_eq!(l, Layout { count: 2, bytes: 8 });
        assert_eq!(Collective::AllToAll.layout(8, DataType::F32, 4).count, 0);
        assert!((Collective::AllReduce.bus_factor(4) - 1.5).abs() < 1e-12);
        assert!((Collective::ReduceScatter.bus_factor(2) - 0.5).abs() < 1e-12);
        assert!((Collective::Broadcast.bus_factor(8) - 1.0).abs() < 1e-12);
    }

    #[test]
    fn header_and_rows_line_up() {
        let info = RowInfo {
            coll: Collective::AllReduce,
            nranks: 2,
            dtype: DataType::F32,
            op: RedOp::Sum,
            root: 0,
            transport: "shm",
        };
        let l = Collective::AllReduce.layout(1 << 20, DataType::F32, 2);
        let m = Measure::new(Collective::AllReduce, l.bytes, 2, 215.0, Some(0));
        let row = table_row(&info, l, Some(&m), Some(&m));
        let header = table_header("out-of-place", "in-place");
        let names = header.lines().nth(1).unwrap_or_default();
        assert_eq!(row.len(), names.len(), "\n{names}\n{row}");
        assert!(row.contains("float") && row.contains("sum") && row.contains("-1"));
        let j = json_row(&info, l, false, &m, ("ring", "simple"));
        let keys: Vec<_> = j.as_object().map(|o| o.keys().cloned().collect()).unwrap_or_default();
        assert_eq!(keys.len(), 15);
    }
}
