//! NCCL's text report, line for line (2.28/2.29 `rasClientRun*`), plus occl's failed- and stuck-operations
//! sections.

use std::fmt::Write;

use super::model::ResultCode;
use super::model::{
    CommGroupRow, CommRef, ErrorBreakdown, ErrorEntry, FailedOp, JobSummary, OpCountMismatch, ProcessRef, RankGroup,
    RankLoc, RankRef, Report, StuckOp, SummarySpread, VersionInfo, WarningEntry,
};

/// Renders the whole report as the text client receives it (all chunks concatenated).
pub fn render_text(r: &Report) -> String {
    let mut o = String::new();
    header(&mut o, &r.version);
    summary(&mut o, &r.summary);
    // NCCL sends `\nCommunicators...` before the gather and ` (S.SSSs)` after it; concatenated, it's one line.
    let _ = writeln!(o, "\nCommunicators... ({:.3}s)\n=============\n", r.collection_time_sec);
    comm_table(&mut o, &r.groups);
    o.push_str("\nErrors\n======\n\n");
    for e in &r.errors {
        error_entry(&mut o, e);
    }
    o.push_str("Warnings\n========\n\n");
    for w in &r.warnings {
        warning_entry(&mut o, w);
    }
    if !r.failed.is_empty() {
        failed_section(&mut o, &r.failed);
    }
    if !r.stuck.is_empty() {
        stuck_section(&mut o, &r.stuck);
    }
    o
}

fn header(o: &mut String, v: &VersionInfo) {
    match &v.cuda_compiled {
        Some(c) => _ = writeln!(o, "occl version {} compiled with CUDA {c}", v.occl_version),
        None => _ = writeln!(o, "occl version {}", v.occl_version),
    }
    let _ = writeln!(o, "CUDA runtime version {}, driver version {}\n", v.cuda_runtime, v.cuda_driver);
}

fn summary(o: &mut String, s: &JobSummary) {
    o.push_str("Job summary\n===========\n\n");
    if let Some(spread) = &s.spread {
        return summary_spread(o, s, spread);
    }
    o.push_str("  Nodes  Processes         GPUs  Processes     GPUs\n");
    o.push_str("(total)   per node  per process    (total)  (total)\n");
    let _ = writeln!(
        o,
        "{:7}  {:9}  {:11}  {:9}  {:7}",
        s.nodes, s.processes_per_node, s.gpus_per_process, s.processes_total, s.gpus_total
    );
}

/// NCCL's tables for a job whose nodes or processes differ: the distributions, the totals, and outlier nodes.
fn summary_spread(o: &mut String, s: &JobSummary, spread: &SummarySpread) {
    if let Some(gpus) = spread.uniform_gpus {
        o.push_str("  Nodes  Processes         GPUs\n          per node  per process\n");
        for (nodes, ppn) in &spread.processes_per_node {
            let _ = writeln!(o, "{nodes:7}  {ppn:9}  {gpus:11}");
        }
    } else {
        o.push_str("  Nodes  Processes\n          per node\n");
        for (nodes, ppn) in &spread.processes_per_node {
            let _ = writeln!(o, "{nodes:7}  {ppn:9}");
        }
        o.push_str("\n         Processes         GPUs\n                    per process\n");
        for (procs, gpus) in &spread.gpus_per_process {
            let _ = writeln!(o, "         {procs:9}  {gpus:11}");
        }
    }
    o.push_str("\n  Nodes  Processes         GPUs\n(total)    (total)      (total)\n");
    let _ = writeln!(o, "{:7}  {:9}  {:11}", s.nodes, s.processes_total, s.gpus_total);
    for shape in &spread.outlier_nodes {
        let _ = writeln!(o, "\nThe outlier {}:", plural(shape.len() as u32, "node", "nodes"));
        for n in shape {
            let what = plural(n.pids.len() as u32, "process", "processes");
            let _ = writeln!(o, "  Node {} running {what} {}", n.host, join(&n.pids));
        }
    }
}

fn comm_table(o: &mut String, groups: &[CommGroupRow]) {
    if groups.is_empty() {
        o.push_str("No communicator data collected!\n");
        return;
    }
    o.push_str("Group     Comms     Nodes     Ranks     Ranks     Ranks    Status  Errors\n");
    o.push_str("    #  in group  per comm  per node  per comm  in group\n");
    for (i, g) in groups.iter().enumerate() {
        let (lo, hi) = g.ranks_per_node;
        let rpn = if lo == hi { lo.to_string() } else { format!("{lo}-{hi}") };
        let _ = writeln!(
            o,
            "{:5}  {:8}  {:8}  {:>8}  {:8}  {:8}  {:>8}  {:>6}",
            i,
            g.comms_in_group,
            g.nodes_per_comm,
            rpn,
            g.ranks_per_comm,
            g.ranks_in_group,
            g.status.as_str(),
            g.errors.label()
        );
    }
}

fn plural(n: u32, one: &'static str, many: &'static str) -> &'static str {
    if n == 1 {
        one
    } else {
        many
    }
}

fn comm_ref(c: &CommRef) -> String {
    format!("#{}-{} ({:016x})", c.group, c.index, c.hash)
}

fn join(v: &[u32]) -> String {
    v.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
}

fn gpu(l: &RankLoc) -> String {
    if l.nvml_dev == l.cuda_dev {
        l.cuda_dev.to_string()
    } else {
        format!("{} (NVML {})", l.cuda_dev, l.nvml_dev)
    }
}

/// `-- GPU g managed by process p on node h`, or NCCL's placeholder when the process is unknown.
fn whereabouts(r: &RankRef) -> String {
    match &r.loc {
        // A host-memory rank has no GPU (the model keeps NCCL's unsigned device field at u32::MAX).
        Some(l) if l.cuda_dev == u32::MAX => format!("-- host memory, process {} on node {}", l.pid, l.host),
        Some(l) => format!("-- GPU {} managed by process {} on node {}", gpu(l), l.pid, l.host),
        None => "-- [process information not found]".to_string(),
    }
}

fn process_line(o: &mut String, p: &ProcessRef) {
    let n = p.cuda_devs.len() as u32;
    let nvml = if p.nvml_devs == p.cuda_devs { String::new() } else { format!(" (NVML {})", join(&p.nvml_devs)) };
    if n == 0 {
        // NCCL would print "managing GPU " with nothing after it; say what the process is.
        let _ = writeln!(o, "  Process {} on node {} (host memory, no GPU)", p.pid, p.host);
        return;
    }
    // NCCL pluralizes only above one.
    let gpus = if n > 1 { "GPUs" } else { "GPU" };
    let _ = writeln!(o, "  Process {} on node {} managing {gpus} {}{nvml}", p.pid, p.host, join(&p.cuda_devs));
}

/// NCCL's rank-group shape: `k ranks <what>` then `Rank r -- ...` members, or `Rank r <what1> -- ...` for one.
fn rank_groups<V>(o: &mut String, groups: &[RankGroup<V>], many: impl Fn(&V) -> String, one: impl Fn(&V) -> String) {
    for g in groups {
        if g.count > 1 {
            let _ = writeln!(o, "  {} ranks {}", g.count, many(&g.value));
            for m in &g.members {
                let _ = writeln!(o, "  Rank {} {}", m.rank, whereabouts(m));
            }
        } else {
            for m in &g.members {
                let _ = writeln!(o, "  Rank {} {} {}", m.rank, one(&g.value), whereabouts(m));
            }
        }
    }
}

fn error_entry(o: &mut String, e: &ErrorEntry) {
    match e {
        ErrorEntry::Incomplete { processes, missing, not_found } => {
            let what = plural(*missing, "process", "processes");
            let _ = writeln!(o, "INCOMPLETE\n  Missing communicator data from {missing} job {what}");
            processes.iter().for_each(|p| process_line(o, p));
            not_found_line(o, *not_found);
        }
        ErrorEntry::Dead { processes, dead, not_found } => {
            let what = plural(*dead, "process is", "processes are");
            let _ = writeln!(o, "DEAD\n  {dead} job {what} considered dead (unreachable via the RAS network)");
            processes.iter().for_each(|p| process_line(o, p));
            not_found_line(o, *not_found);
        }
        ErrorEntry::CommIncomplete { comm, missing, ranks } => {
            let what = plural(*missing, "rank", "ranks");
            let _ = writeln!(o, "{} INCOMPLETE\n  Missing communicator data from {missing} {what}", comm_ref(comm));
            for r in ranks {
                let _ = writeln!(o, "  Rank {} {}", r.rank, whereabouts(r));
            }
        }
        ErrorEntry::CommError { comm, init, async_ } => {
            let _ = writeln!(o, "{} ERROR", comm_ref(comm));
            breakdown(o, "Initialization", init.as_ref());
            breakdown(o, "Asynchronous", async_.as_ref());
        }
    }
    o.push('\n');
}

/// Processes missing from the peer table, bracketed as NCCL prints it.
fn not_found_line(o: &mut String, not_found: u32) {
    if not_found > 0 {
        let what = plural(not_found, "process", "processes");
        let _ = writeln!(o, "  [could not find information on {not_found} {what}]");
    }
}

fn breakdown(o: &mut String, kind: &str, b: Option<&ErrorBreakdown>) {
    let Some(b) = b else { return };
    let errs = plural(b.ranks, "error", "errors");
    let _ = writeln!(o, "  {kind} {errs} on {} {}", b.ranks, plural(b.ranks, "rank", "ranks"));
    rank_groups(o, &b.groups, |n| format!("reported {n}"), |n| format!("reported {n}"));
}

fn warning_entry(o: &mut String, w: &WarningEntry) {
    match w {
        WarningEntry::Timeout { count } => {
            let what = plural(*count, "timeout", "timeouts");
            let _ =
                writeln!(o, "TIMEOUT\n  Encountered {count} communication {what} while gathering communicator data\n");
        }
        WarningEntry::CommMismatch { comm, status, counts } => {
            let _ = writeln!(o, "{} MISMATCH", comm_ref(comm));
            if !status.is_empty() {
                // NCCL ends the status block without a blank line; kept for byte compatibility.
                o.push_str("  Communicator ranks have different status\n");
                let st = |s: &super::model::CommStatus| format!("have status {}", s.as_str());
                rank_groups(o, status, st, |s| format!("has status {}", s.as_str()));
            }
            counts.iter().for_each(|c| op_counts(o, c));
        }
    }
}

fn op_counts(o: &mut String, c: &OpCountMismatch) {
    let _ = writeln!(o, "  Communicator ranks have different {} operation counts", c.collective);
    let many = |v: &u64| {
        if *v > 0 {
            format!("have launched up to operation {v}")
        } else {
            "have not launched any operations".into()
        }
    };
    let one = |v: &u64| {
        if *v > 0 {
            format!("has launched up to operation {v}")
        } else {
            "has not launched any operations".into()
        }
    };
    rank_groups(o, &c.groups, many, one);
    o.push('\n');
}

/// Milliseconds as NCCL prints durations, `S.SSSs`.
fn secs(ms: u64) -> String {
    format!("{}.{:03}s", ms / 1000, ms % 1000)
}

/// occl-only, after Warnings (as the stuck section): each rank whose last call failed, and its error.
fn failed_section(o: &mut String, ops: &[FailedOp]) {
    o.push_str("Failed operations (occl)\n========================\n\n");
    for f in ops {
        let what = match &f.operation {
            Some((name, seq)) => format!("in {name} operation {seq} failed after {}", secs(f.ran_ms)),
            None => "failed outside an operation".to_string(),
        };
        // occl's error text names its kind already; NCCL's name of the code stands in for a missing one.
        let error = if f.error.is_empty() { ResultCode::report_name(f.result) } else { &f.error };
        let _ = writeln!(
            o,
            "{} FAILED\n  Rank {} {what}, {} ago {}\n  {error}\n",
            comm_ref(&f.comm),
            f.rank.rank,
            secs(f.ago_ms),
            whereabouts(&f.rank),
        );
    }
}

/// occl-only, after Warnings so NCCL-format parsers that stop at Warnings' entries still work.
fn stuck_section(o: &mut String, ops: &[StuckOp]) {
    o.push_str("Stuck operations (occl)\n=======================\n\n");
    for s in ops {
        let peer = s.peer.map_or_else(|| "unknown peer".to_string(), |p| format!("rank {p}"));
        let _ = writeln!(
            o,
            "{} STUCK\n  Rank {} in {} operation {} for {}.{:03}s, waiting on {peer} ({}) {}\n",
            comm_ref(&s.comm),
            s.rank.rank,
            s.operation,
            s.seq,
            s.waited_ms / 1000,
            s.waited_ms % 1000,
            s.step,
            whereabouts(&s.rank)
        );
    }
}
