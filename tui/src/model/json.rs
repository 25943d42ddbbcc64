//! The JSON report (NCCL 2.28.7+ layout; occl adds `occl_version`, per-rank `occl_operations` and
//! `stuck_operations`). NCCL 2.28 forgets a comma inside `missing_ranks`; [`repair_json`] puts it back.

use super::{CommView, FailedView, Proc, RankView, Snapshot, Source, StuckView, Totals};
use serde_json::Value;
use std::collections::BTreeSet;

/// Inserts the commas NCCL 2.28's pretty-printer leaves out: in its line-per-member layout, a line ending in a
/// value followed by a line starting with a key needs one. Valid JSON passes through unchanged.
pub fn repair_json(s: &str) -> String {
    let lines: Vec<&str> = s.lines().collect();
    let mut out = String::with_capacity(s.len() + 16);
    for (i, line) in lines.iter().enumerate() {
        out.push_str(line);
        let end = line.trim_end();
        let ends_value = end.ends_with(|c: char| c.is_ascii_digit() || matches!(c, '"' | 'e' | 'l' | '}' | ']'));
        let next_key =
            lines[i + 1..].iter().map(|l| l.trim_start()).find(|l| !l.is_empty()).is_some_and(|l| l.starts_with('"'));
        if ends_value && next_key && !end.ends_with(',') {
            out.push(',');
        }
        out.push('\n');
    }
    out
}

fn u(v: &Value) -> Option<u64> {
    v.as_u64().or_else(|| v.as_i64().map(|i| i.max(0) as u64))
}

fn hex(v: &Value) -> Option<u64> {
    let s = v.as_str()?;
    u64::from_str_radix(s.trim_start_matches("0x"), 16).ok()
}

fn gpu(v: &Value) -> String {
    match v.as_i64() {
        Some(d) if (0..i64::from(i32::MAX)).contains(&d) => d.to_string(),
        _ => "-".into(),
    }
}

/// NCCL's `ncclResult_t` names.
pub(super) fn result_name(code: i64) -> String {
    match code {
        1 => "Unhandled CUDA error".into(),
        2 => "System error".into(),
        3 => "Internal error".into(),
        4 => "Invalid argument".into(),
        5 => "Invalid usage".into(),
        6 => "Remote process error".into(),
        n => format!("error {n}"),
    }
}

const STATUS_ORDER: [&str; 5] = ["NOCOMM", "INIT", "RUNNING", "FINALIZE", "ABORT"];

fn rank_of(r: &Value) -> (RankView, [u64; 5]) {
    let st = &r["status"];
    let flag = |k: &str| st[k].as_bool().unwrap_or(false);
    let init = st["init_state"].as_i64().unwrap_or(0);
    let asy = st["async_error"].as_i64().unwrap_or(0);
    let state = if flag("abort_flag") {
        "ABORT"
    } else if flag("finalize_called") || flag("destroy_flag") {
        "FINALIZE"
    } else if init == 7 {
        "INIT"
    } else {
        "RUNNING"
    };
    let error = if init != 0 && init != 7 {
        Some(format!("init: {}", result_name(init)))
    } else if asy != 0 && asy != 7 {
        Some(format!("async: {}", result_name(asy)))
    } else {
        None
    };
    let cc = &r["collective_counts"];
    let counts = ["Broadcast", "Reduce", "AllGather", "ReduceScatter", "AllReduce"].map(|k| u(&cc[k]).unwrap_or(0));
    let ops = &r["occl_operations"];
    let launched = u(&ops["launched"]).or_else(|| Some(counts.iter().fold(0u64, |a, &n| a.saturating_add(n))));
    let view = RankView {
        rank: u(&r["rank"]).unwrap_or(0) as u32,
        host: r["host"].as_str().unwrap_or("?").to_string(),
        pid: u(&r["pid"]).unwrap_or(0) as u32,
        gpu: gpu(&r["cuda_dev"]),
        launched,
        completed: u(&ops["completed"]),
        state: state.into(),
        error,
    };
    (view, counts)
}

pub fn parse_json(body: &str) -> Result<Snapshot, String> {
    let v: Value = match serde_json::from_str(body) {
        Ok(v) => v,
        Err(_) => {
            serde_json::from_str(&repair_json(body)).map_err(|e| format!("the JSON report does not parse: {e}"))?
        }
    };
    let server = match v["occl_version"].as_str() {
        Some(o) => format!("occl {o}"),
        None => format!("NCCL {}", v["nccl_version"].as_str().unwrap_or("?")),
    };
    let mut comms = Vec::new();
    let mut dead = BTreeSet::new();
    let mut unresponsive = BTreeSet::new();
    let mut hosts = BTreeSet::new();
    let mut procs = BTreeSet::new();
    let mut gpus = BTreeSet::new();
    for c in v["communicators"].as_array().map(Vec::as_slice).unwrap_or_default() {
        let mut ranks = Vec::new();
        let mut counts = Vec::new();
        for r in c["ranks"].as_array().map(Vec::as_slice).unwrap_or_default() {
            let (view, n) = rank_of(r);
            hosts.insert(view.host.clone());
            procs.insert((view.host.clone(), view.pid));
            if view.gpu != "-" {
                gpus.insert((view.host.clone(), view.pid, view.gpu.clone()));
            }
            counts.push(n);
            ranks.push(view);
        }
        let mut incomplete = false;
        for m in c["missing_ranks"].as_array().map(Vec::as_slice).unwrap_or_default() {
            incomplete = true;
            let st = &m["status"];
            let state = if st["considered_dead"].as_bool() == Some(true) {
                "DEAD"
            } else if st["unresponsive"].as_bool() == Some(true) {
                "UNRESPONSIVE"
            } else {
                "MISSING"
            };
            let host = m["host"].as_str().unwrap_or("?").to_string();
            let pid = u(&m["pid"]).unwrap_or(0) as u32;
            let p = Proc { host: host.clone(), pid, gpus: gpu(&m["cuda_dev"]) };
            match state {
                "DEAD" => {
                    dead.insert(p);
                }
                "UNRESPONSIVE" => {
                    unresponsive.insert(p);
                }
                _ => {}
            }
            hosts.insert(host.clone());
            procs.insert((host.clone(), pid));
            ranks.push(RankView {
                rank: u(&m["rank"]).unwrap_or(0) as u32,
                host,
                pid,
                gpu: gpu(&m["cuda_dev"]),
                launched: None,
                completed: None,
                state: state.into(),
                error: None,
            });
        }
        let present: Vec<&RankView> = ranks.iter().filter(|r| !r.is_missing()).collect();
        let status = present
            .iter()
            .filter_map(|r| STATUS_ORDER.iter().position(|s| *s == r.state))
            .max()
            .map_or("NOCOMM", |i| STATUS_ORDER[i]);
        let mismatch = present.windows(2).any(|w| w[0].state != w[1].state) || counts.windows(2).any(|w| w[0] != w[1]);
        let error = present.iter().any(|r| r.error.is_some());
        ranks.sort_by_key(|r| r.rank);
        comms.push(CommView {
            hash: hex(&c["hash"]).unwrap_or(0),
            label: None,
            size: u(&c["size"]).unwrap_or(ranks.len() as u64) as u32,
            status: status.into(),
            incomplete,
            error,
            mismatch,
            ranks,
        });
    }
    // A dead process is not also unresponsive.
    let unresponsive: Vec<Proc> = unresponsive.into_iter().filter(|p| !dead.contains(p)).collect();
    let stuck = v["stuck_operations"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .map(|s| StuckView {
            comm: hex(&s["comm_hash"]).unwrap_or(0),
            rank: u(&s["rank"]).unwrap_or(0) as u32,
            operation: s["operation"].as_str().unwrap_or("?").into(),
            seq: u(&s["seq"]).unwrap_or(0),
            waited_ms: u(&s["waited_ms"]).unwrap_or(0),
            peer: u(&s["peer"]).map(|p| p as u32),
            step: s["step"].as_str().unwrap_or("").into(),
        })
        .collect();
    let failed = v["failed_operations"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .map(|f| FailedView {
            comm: hex(&f["comm_hash"]).unwrap_or(0),
            rank: u(&f["rank"]).unwrap_or(0) as u32,
            operation: f["operation"].as_str().map(|op| (op.to_string(), u(&f["seq"]).unwrap_or(0))),
            ago_ms: u(&f["failed_ms_ago"]).unwrap_or(0),
            error: f["error"].as_str().unwrap_or("").into(),
        })
        .collect();
    Ok(Snapshot {
        source: Source::Json,
        server,
        totals: Some(Totals { nodes: hosts.len() as u32, processes: procs.len() as u32, gpus: gpus.len() as u32 }),
        gather_secs: v["ras"]["collection_time_sec"].as_f64(),
        timeouts: u(&v["ras"]["timeouts_count"]).unwrap_or(0) as u32,
        comms,
        dead: dead.into_iter().collect(),
        unresponsive,
        stuck,
        failed,
        raw: body.to_string(),
    })
}
