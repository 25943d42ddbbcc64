//! What the live view shows, built from either report form: a JSON document (occl, NCCL ≥ 2.28.7) or the text
//! report (any NCCL with RAS). Both parsers fill the same [`Snapshot`], so the view never knows which it got.

mod json;
mod text;

pub use json::parse_json;
#[cfg(test)]
pub use json::repair_json;
pub use text::parse_text;

/// Where a snapshot came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    Json,
    Text,
}

/// A job process (for the dead and unresponsive lists).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Proc {
    pub host: String,
    pub pid: u32,
    /// GPUs as the report prints them (empty for host-memory ranks).
    pub gpus: String,
}

/// One rank of a communicator.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RankView {
    pub rank: u32,
    pub host: String,
    pub pid: u32,
    pub gpu: String,
    /// Operations launched (NCCL's collective counts summed, or occl's total of every kind), when known.
    pub launched: Option<u64>,
    /// Operations completed (occl only).
    pub completed: Option<u64>,
    /// RUNNING, INIT, FINALIZE, ABORT, NOCOMM, or why it is missing: DEAD, UNRESPONSIVE, MISSING.
    pub state: String,
    /// An error the rank reported, if any.
    pub error: Option<String>,
}

impl RankView {
    pub fn is_missing(&self) -> bool {
        matches!(self.state.as_str(), "DEAD" | "UNRESPONSIVE" | "MISSING")
    }
}

/// One communicator.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CommView {
    pub hash: u64,
    /// NCCL's `#group-index` where the report gave one.
    pub label: Option<String>,
    pub size: u32,
    /// Highest status (RUNNING, INIT, …).
    pub status: String,
    pub incomplete: bool,
    pub error: bool,
    pub mismatch: bool,
    /// Ranks the report lists (all of them in JSON; in text, only those an entry names).
    pub ranks: Vec<RankView>,
}

impl CommView {
    /// NCCL's Errors column.
    pub fn verdict(&self) -> String {
        let parts: Vec<&str> = [(self.incomplete, "INCOMPLETE"), (self.error, "ERROR"), (self.mismatch, "MISMATCH")]
            .into_iter()
            .filter_map(|(on, s)| on.then_some(s))
            .collect();
        if parts.is_empty() {
            "OK".into()
        } else {
            parts.join(",")
        }
    }

    pub fn healthy(&self) -> bool {
        !(self.incomplete || self.error || self.mismatch)
    }

    /// Ranks ordered for triage: missing first, then the least progress first, then by rank.
    pub fn laggards_first(&self) -> Vec<&RankView> {
        let mut v: Vec<&RankView> = self.ranks.iter().collect();
        v.sort_by_key(|r| (!r.is_missing(), r.completed.or(r.launched).unwrap_or(u64::MAX), r.rank));
        v
    }

    /// The most operations any rank launched (the bar's full length).
    pub fn max_launched(&self) -> u64 {
        self.ranks.iter().filter_map(|r| r.launched).max().unwrap_or(0)
    }

    /// Ranks behind the leader (fewer launched, or missing).
    pub fn lagging(&self) -> usize {
        let max = self.max_launched();
        self.ranks.iter().filter(|r| r.is_missing() || r.launched.is_some_and(|l| l < max)).count()
    }
}

/// An operation a rank has been waiting in (occl's stuck-operation report).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StuckView {
    pub comm: u64,
    pub rank: u32,
    pub operation: String,
    pub seq: u64,
    pub waited_ms: u64,
    pub peer: Option<u32>,
    pub step: String,
}

/// A rank whose last call failed, with its error (occl's failed-operation report). Its operation is over: it is not
/// stuck, however long ago it failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FailedView {
    pub comm: u64,
    pub rank: u32,
    /// The operation and its sequence number; `None` when none was in flight.
    pub operation: Option<(String, u64)>,
    pub ago_ms: u64,
    pub error: String,
}

/// Job totals.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Totals {
    pub nodes: u32,
    pub processes: u32,
    pub gpus: u32,
}

/// One report, parsed.
#[derive(Clone, Debug, PartialEq)]
pub struct Snapshot {
    pub source: Source,
    /// The server's version line (`occl 0.1.0`, `NCCL 2.28.9`).
    pub server: String,
    pub totals: Option<Totals>,
    pub gather_secs: Option<f64>,
    pub timeouts: u32,
    pub comms: Vec<CommView>,
    pub dead: Vec<Proc>,
    pub unresponsive: Vec<Proc>,
    pub stuck: Vec<StuckView>,
    /// Earliest failure first.
    pub failed: Vec<FailedView>,
    /// The report as the server sent it.
    pub raw: String,
}

impl Snapshot {
    /// Lines for the event log: what changed from `before` to `self`.
    pub fn changes_since(&self, before: &Snapshot) -> Vec<String> {
        let mut out = Vec::new();
        for p in &self.dead {
            if !before.dead.contains(p) {
                out.push(format!("DEAD: process {} on {}", p.pid, p.host));
            }
        }
        for p in &self.unresponsive {
            if !before.unresponsive.contains(p) && !self.dead.contains(p) {
                out.push(format!("UNRESPONSIVE: process {} on {}", p.pid, p.host));
            }
        }
        for p in &before.unresponsive {
            if !self.unresponsive.contains(p) && !self.dead.contains(p) {
                out.push(format!("RECOVERED: process {} on {}", p.pid, p.host));
            }
        }
        for c in &self.comms {
            let old = before.comms.iter().find(|o| o.hash == c.hash);
            match old {
                None => out.push(format!("NEW comm {:016x}: {} ranks, {}", c.hash, c.size, c.verdict())),
                Some(o) if o.verdict() != c.verdict() || o.status != c.status => out.push(format!(
                    "comm {:016x}: {} {} -> {} {}",
                    c.hash,
                    o.status,
                    o.verdict(),
                    c.status,
                    c.verdict()
                )),
                Some(_) => {}
            }
        }
        for c in &before.comms {
            if !self.comms.iter().any(|n| n.hash == c.hash) {
                out.push(format!("GONE comm {:016x}", c.hash));
            }
        }
        for s in &self.stuck {
            if !before.stuck.iter().any(|o| o.comm == s.comm && o.rank == s.rank && o.seq == s.seq) {
                out.push(format!("STUCK: rank {} in {} #{} on comm {:016x}", s.rank, s.operation, s.seq, s.comm));
            }
        }
        for f in &self.failed {
            if !before.failed.iter().any(|o| o.comm == f.comm && o.rank == f.rank && o.operation == f.operation) {
                let what = f.operation.as_ref().map_or_else(String::new, |(op, seq)| format!(" in {op} #{seq}"));
                out.push(format!("FAILED: rank {}{what} on comm {:016x}: {}", f.rank, f.comm, f.error));
            }
        }
        out
    }
}

/// Parses a status body: JSON when it looks like JSON, else the text report.
pub fn parse(body: &str) -> Result<Snapshot, String> {
    if body.trim_start().starts_with('{') {
        parse_json(body)
    } else {
        parse_text(body)
    }
}

#[cfg(test)]
mod tests;
