//! The text report (any NCCL with RAS, and occl), read back into a [`Snapshot`]. The table groups communicators,
//! so comms are known by `#group-index` and get a hash only where an Errors, Warnings, Failed or Stuck entry names it;
//! ranks are known only where an entry lists them.

use super::{CommView, FailedView, Proc, RankView, Snapshot, Source, StuckView, Totals};

#[derive(Clone, Copy, PartialEq)]
enum Section {
    Head,
    Summary,
    Table,
    Errors,
    Warnings,
    Failed,
    Stuck,
}

/// `… -- GPU 1 managed by process 735 on node 192.0.2.2`, `… -- host memory, process 9 on node h`.
fn whereabouts(s: &str) -> Option<(String, u32, String)> {
    let (_, w) = s.split_once(" -- ")?;
    let (gpu, rest) = if let Some(r) = w.strip_prefix("GPU ") {
        let (g, rest) = r.split_once(" managed by process ")?;
        (g.split(' ').next().unwrap_or(g).to_string(), rest)
    } else {
        ("-".to_string(), w.strip_prefix("host memory, process ")?)
    };
    let (pid, host) = rest.split_once(" on node ")?;
    Some((gpu, pid.trim().parse().ok()?, host.trim().to_string()))
}

/// `Process 735 on node 192.0.2.2 managing GPU 1`, `Process 9 on node h (host memory, no GPU)`.
fn process(line: &str) -> Option<Proc> {
    let rest = line.trim().strip_prefix("Process ")?;
    let (pid, rest) = rest.split_once(" on node ")?;
    let (host, gpus) = match rest.split_once(' ') {
        Some((h, g)) => (h, g.trim_start_matches("managing ").trim_start_matches("GPUs ").trim_start_matches("GPU ")),
        None => (rest, ""),
    };
    let gpus = if gpus.starts_with("(host memory") { "-" } else { gpus };
    Some(Proc { host: host.to_string(), pid: pid.parse().ok()?, gpus: gpus.to_string() })
}

/// `#0-1 (c41c5eeb26d2a80c) MISMATCH` → (label, hash, kind).
fn entry_head(line: &str) -> Option<(String, u64, String)> {
    let (label, rest) = line.split_once(" (")?;
    let (hash, kind) = rest.split_once(") ")?;
    label.starts_with('#').then_some(())?;
    Some((label.to_string(), u64::from_str_radix(hash, 16).ok()?, kind.trim().to_string()))
}

fn first_number(s: &str) -> Option<u64> {
    s.split(|c: char| !c.is_ascii_digit()).find(|t| !t.is_empty())?.parse().ok()
}

/// `Rank 3 …` → 3.
fn rank_no(line: &str) -> Option<u32> {
    line.trim().strip_prefix("Rank ")?.split(' ').next()?.parse().ok()
}

struct Builder {
    comms: Vec<CommView>,
}

impl Builder {
    fn comm(&mut self, label: &str, hash: u64) -> &mut CommView {
        let i = match self.comms.iter().position(|c| c.label.as_deref() == Some(label)) {
            Some(i) => i,
            None => {
                self.comms.push(CommView {
                    hash,
                    label: Some(label.to_string()),
                    size: 0,
                    status: "RUNNING".into(),
                    incomplete: false,
                    error: false,
                    mismatch: false,
                    ranks: Vec::new(),
                });
                self.comms.len() - 1
            }
        };
        let c = &mut self.comms[i];
        c.hash = hash;
        c
    }
}

fn rank<'a>(c: &'a mut CommView, line: &str) -> Option<&'a mut RankView> {
    let r = rank_no(line)?;
    let (gpu, pid, host) = whereabouts(line).unwrap_or_else(|| ("-".into(), 0, "?".into()));
    let i = match c.ranks.iter().position(|x| x.rank == r) {
        Some(i) => i,
        None => {
            c.ranks.push(RankView {
                rank: r,
                host,
                pid,
                gpu,
                launched: None,
                completed: None,
                state: c.status.clone(),
                error: None,
            });
            c.ranks.len() - 1
        }
    };
    c.ranks.get_mut(i)
}

pub fn parse_text(body: &str) -> Result<Snapshot, String> {
    let mut lines = body.lines().peekable();
    let first = lines.peek().copied().unwrap_or_default();
    let server = match first.split_once(" version ") {
        Some((who, rest)) if who == "NCCL" || who == "occl" => {
            format!("{who} {}", rest.split_whitespace().next().unwrap_or("?"))
        }
        _ => return Err(format!("not a RAS report (first line: {first:?})")),
    };
    let mut sec = Section::Head;
    let mut totals = None;
    let mut gather_secs = None;
    let mut timeouts = 0u32;
    let mut b = Builder { comms: Vec::new() };
    let mut dead = Vec::new();
    let mut unresponsive = Vec::new();
    let mut stuck = Vec::new();
    let mut failed: Vec<FailedView> = Vec::new();
    // The entry being read: job-level kind, or a comm's label and kind; and the value of the rank group whose
    // members follow.
    let mut job_entry: Option<String> = None;
    let mut comm_entry: Option<(String, u64, String)> = None;
    let mut group_value: Option<String> = None;
    for line in lines {
        let t = line.trim();
        match t {
            "Job summary" => {
                sec = Section::Summary;
                continue;
            }
            "Errors" => {
                sec = Section::Errors;
                continue;
            }
            "Warnings" => {
                sec = Section::Warnings;
                continue;
            }
            "Stuck operations (occl)" => {
                sec = Section::Stuck;
                continue;
            }
            "Failed operations (occl)" => {
                sec = Section::Failed;
                continue;
            }
            _ if t.starts_with("Communicators...") => {
                sec = Section::Table;
                gather_secs = t.split_once('(').and_then(|(_, r)| r.trim_end_matches("s)").parse().ok());
                continue;
            }
            _ if !t.is_empty() && t.chars().all(|c| c == '=') => continue,
            "" => {
                job_entry = None;
                comm_entry = None;
                group_value = None;
                continue;
            }
            _ => {}
        }
        match sec {
            Section::Head => {}
            Section::Summary => {
                let nums: Vec<u32> = t.split_whitespace().filter_map(|w| w.parse().ok()).collect();
                if nums.len() == t.split_whitespace().count() {
                    totals = match nums.as_slice() {
                        [n, _, _, p, g] => Some(Totals { nodes: *n, processes: *p, gpus: *g }),
                        [n, p, g] => Some(Totals { nodes: *n, processes: *p, gpus: *g }),
                        _ => totals,
                    };
                }
            }
            Section::Table => {
                let f: Vec<&str> = t.split_whitespace().collect();
                if let [g, comms, _nodes, _per_node, per_comm, _in_group, status, errors] = f.as_slice() {
                    let (Ok(g), Ok(k), Ok(size)) = (g.parse::<u32>(), comms.parse::<u32>(), per_comm.parse::<u32>())
                    else {
                        continue;
                    };
                    for i in 0..k.min(4096) {
                        let c = b.comm(&format!("#{g}-{i}"), 0);
                        c.size = size;
                        c.status = status.to_string();
                        c.incomplete = errors.contains("INCOMPLETE");
                        c.error = errors.split(',').any(|e| e == "ERROR");
                        c.mismatch = errors.contains("MISMATCH");
                    }
                }
            }
            Section::Errors | Section::Warnings | Section::Failed | Section::Stuck => {
                if !line.starts_with(' ') {
                    // An entry's head.
                    match entry_head(t) {
                        Some(h) => comm_entry = Some(h),
                        None => job_entry = Some(t.to_string()),
                    }
                    continue;
                }
                if let Some(kind) = &job_entry {
                    if kind == "TIMEOUT" {
                        timeouts += first_number(t).unwrap_or(0) as u32;
                    } else if let Some(p) = process(t) {
                        match kind.as_str() {
                            "DEAD" => dead.push(p),
                            "INCOMPLETE" => unresponsive.push(p),
                            _ => {}
                        }
                    }
                    continue;
                }
                let Some((label, hash, kind)) = comm_entry.clone() else { continue };
                if sec == Section::Stuck {
                    stuck.extend(stuck_line(t, hash));
                    continue;
                }
                if sec == Section::Failed {
                    // `Rank 1 in AllReduce operation 6 failed after …, 1.503s ago -- …`, then the error.
                    match failed_line(t, hash) {
                        Some(f) => failed.push(f),
                        None => {
                            if let Some(f) = failed.last_mut().filter(|f| f.comm == hash && f.error.is_empty()) {
                                f.error = t.to_string();
                            }
                        }
                    }
                    continue;
                }
                let c = b.comm(&label, hash);
                match kind.as_str() {
                    "INCOMPLETE" => {
                        c.incomplete = true;
                        if let Some(r) = rank(c, t) {
                            r.state = "MISSING".into();
                        }
                    }
                    "ERROR" => {
                        c.error = true;
                        if t.starts_with("Rank ") {
                            let err = t
                                .split_once(" reported ")
                                .map(|(_, e)| e.split(" -- ").next().unwrap_or(e).to_string());
                            let err = err.or_else(|| group_value.clone());
                            if let Some(r) = rank(c, t) {
                                r.error = err;
                            }
                        } else if let Some((_, e)) = t.split_once(" ranks reported ") {
                            group_value = Some(e.to_string());
                        }
                    }
                    "MISMATCH" => {
                        c.mismatch = true;
                        if t.starts_with("Rank ") {
                            let own = t.split(" -- ").next().unwrap_or(t);
                            let value = if own.contains(" has ") {
                                own.split_once(" has ").map(|(_, v)| v.to_string())
                            } else {
                                group_value.clone()
                            };
                            if let (Some(v), Some(r)) = (value, rank(c, t)) {
                                apply_mismatch_value(r, &v);
                            }
                        } else if let Some((_, v)) = t.split_once(" ranks have ") {
                            group_value = Some(v.to_string());
                        }
                    }
                    _ => {}
                }
            }
        }
    }
    // Missing ranks of a dead process are dead; of a process that did not answer, unresponsive.
    for c in &mut b.comms {
        for r in &mut c.ranks {
            if r.state == "MISSING" {
                if dead.iter().any(|p: &Proc| p.pid == r.pid && p.host == r.host) {
                    r.state = "DEAD".into();
                } else if unresponsive.iter().any(|p: &Proc| p.pid == r.pid && p.host == r.host) {
                    r.state = "UNRESPONSIVE".into();
                }
            }
        }
        c.ranks.sort_by_key(|r| r.rank);
    }
    Ok(Snapshot {
        source: Source::Text,
        server,
        totals,
        gather_secs,
        timeouts,
        comms: b.comms,
        dead,
        unresponsive,
        stuck,
        failed,
        raw: body.to_string(),
    })
}

/// `launched up to operation 20003` adds to the rank's launched count (one block per collective);
/// `not launched any operations` adds nothing; `status NOCOMM` sets its state.
fn apply_mismatch_value(r: &mut RankView, v: &str) {
    if let Some(n) = v.strip_prefix("launched up to operation ").and_then(|n| n.trim().parse::<u64>().ok()) {
        r.launched = Some(r.launched.unwrap_or(0).saturating_add(n));
    } else if v.starts_with("not launched any operations") {
        r.launched = Some(r.launched.unwrap_or(0));
    } else if let Some(s) = v.strip_prefix("status ") {
        r.state = s.trim().to_string();
    }
}

/// `Rank 1 in AllReduce operation 6 failed after 0.004s, 1.503s ago -- …` or `Rank 1 failed outside an operation, …`;
/// the error follows on the next line.
fn failed_line(t: &str, comm: u64) -> Option<FailedView> {
    let rank = rank_no(t)?;
    let (head, rest) = t.split_once(" failed ")?;
    let operation = match head.split_once(" in ") {
        Some((_, op)) => {
            let (name, seq) = op.split_once(" operation ")?;
            Some((name.to_string(), seq.parse().ok()?))
        }
        None => None,
    };
    let ago = rest.split(" ago").next()?.rsplit(", ").next()?;
    let ago_ms = ago.strip_suffix('s')?.parse::<f64>().map(|s| (s * 1000.0).round() as u64).ok()?;
    Some(FailedView { comm, rank, operation, ago_ms, error: String::new() })
}

/// `Rank 1 in AllReduce operation 6 for 3.004s, waiting on rank 0 (recv step 0/1) -- …`
fn stuck_line(t: &str, comm: u64) -> Option<StuckView> {
    let rank = rank_no(t)?;
    let rest = t.split_once(" in ")?.1;
    let (operation, rest) = rest.split_once(" operation ")?;
    let (seq, rest) = rest.split_once(" for ")?;
    let (secs, rest) = rest.split_once("s, waiting on ")?;
    let waited_ms = secs.parse::<f64>().map(|s| (s * 1000.0).round() as u64).ok()?;
    let (peer, rest) = match rest.strip_prefix("rank ") {
        Some(r) => {
            let (p, rest) = r.split_once(' ')?;
            (p.parse().ok(), rest)
        }
        None => (None, rest.strip_prefix("unknown peer ").unwrap_or(rest)),
    };
    let step = rest.strip_prefix('(').and_then(|r| r.split_once(')')).map_or("", |(s, _)| s);
    Some(StuckView {
        comm,
        rank,
        operation: operation.to_string(),
        seq: seq.parse().ok()?,
        waited_ms,
        peer,
        step: step.to_string(),
    })
}
