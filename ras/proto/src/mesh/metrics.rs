//! Node metrics: the process that accepts a scrape of the node's `/metrics` asks every other process on its host (by
//! the peer table) for its metrics, directly and all at once, with one deadline; a process that has not answered by
//! then is skipped and reported as such. A same-host peer this process has no connection to gets one, kept while
//! scrapes keep coming ([`METRICS_KEEP`]) and then closed as unneeded, so the ring's shape is no limit.

use super::*;
use crate::wire::{MetricsReply, MetricsRequest, MAX_METRICS_TEXT};

/// Fetches in progress at once; a scrape beyond them gets this process's own metrics only.
pub const MAX_FETCHES: usize = 64;
/// A same-host peer's connection is kept this long after the last fetch that asked it.
pub const METRICS_KEEP: Duration = Duration::from_secs(120);

/// The outcome of [`Mesh::start_metrics`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetricsResult {
    /// The caller's token.
    pub token: u64,
    /// The processes that answered, this one first, with their metrics text.
    pub answers: Vec<(PeerId, String)>,
    /// Same-host processes that did not answer by the deadline.
    pub timed_out: Vec<PeerId>,
    /// Same-host processes known to be dead (not asked).
    pub dead: Vec<PeerId>,
}

#[derive(Debug)]
pub(super) struct Fetch {
    token: u64,
    pub deadline: Time,
    /// Peers that have not answered: the connection their request went out on, or `None` while waiting for one.
    waiting: BTreeMap<PeerId, Option<ConnId>>,
    answers: Vec<(PeerId, String)>,
    dead: Vec<PeerId>,
}

/// Cuts `text` to at most [`MAX_METRICS_TEXT`] bytes at a line end, so the reply can be sent; the families cut off
/// are missing from the scrape (said in the log).
fn bound(text: &mut String) {
    if text.len() > MAX_METRICS_TEXT {
        let cut = text[..MAX_METRICS_TEXT].rfind('\n').map_or(0, |i| i + 1);
        tracing::warn!(bytes = text.len(), kept = cut, "occl-ras: this process's metrics exceed the reply limit");
        text.truncate(cut);
    }
}

impl Mesh {
    fn own_metrics(&self) -> String {
        let mut s = String::new();
        self.records.render_metrics(&mut s);
        bound(&mut s);
        s
    }

    /// Asks every other process on this host for its metrics. [`Action::MetricsDone`] with `token` comes back once
    /// all have answered, and `timeout` (at most [`MAX_BUDGET`]) after `now` at the latest.
    pub fn start_metrics(&mut self, now: Time, token: u64, timeout: Duration) {
        let own = self.own_metrics();
        let host = self.table.get(self.me).map(|p| p.host.clone()).unwrap_or_default();
        let local: Vec<PeerId> =
            self.table.iter().filter(|(p, a)| *p != self.me && a.host == host).map(|(p, _)| p).collect();
        let mut f = Fetch {
            token,
            deadline: now.saturating_add(ns(timeout.min(MAX_BUDGET))),
            waiting: BTreeMap::new(),
            answers: vec![(self.me, own)],
            dead: Vec::new(),
        };
        if self.shut_down || self.fetches.len() >= MAX_FETCHES {
            f.waiting = local.into_iter().map(|p| (p, None)).collect();
            self.actions.push_back(Action::MetricsDone(Self::metrics_result(f)));
            return;
        }
        self.observe(now);
        self.metrics_seq = self.metrics_seq.wrapping_add(1);
        let seq = self.metrics_seq;
        for p in local {
            if self.news.is_dead(p) {
                f.dead.push(p);
                continue;
            }
            let l = self.links.entry(p).or_insert_with(|| Link::new(now));
            l.metrics_until = Some(now.saturating_add(ns(METRICS_KEEP)));
            let conn = l.conn.filter(|c| self.conns.get(c).is_some_and(Conn::is_ready));
            f.waiting.insert(p, conn);
            if let Some(c) = conn {
                self.send(now, c, Msg::MetricsRequest(MetricsRequest { seq }));
            }
        }
        tracing::debug!(me = self.me.0, seq, asked = f.waiting.len(), "RAS node metrics");
        self.fetches.insert(seq, f);
        // Connect to the peers that have no connection yet; their request goes out once it is authenticated.
        self.maintain(now);
        self.try_finish_fetch(seq, now);
    }

    /// An authenticated connection to `p` is up: send it the requests that were waiting for one.
    pub(super) fn metrics_connected(&mut self, now: Time, conn: ConnId, p: PeerId) {
        let due: Vec<u64> =
            self.fetches.iter().filter(|(_, f)| f.waiting.get(&p) == Some(&None)).map(|(s, _)| *s).collect();
        for seq in due {
            if let Some(w) = self.fetches.get_mut(&seq).and_then(|f| f.waiting.get_mut(&p)) {
                *w = Some(conn);
            }
            self.send(now, conn, Msg::MetricsRequest(MetricsRequest { seq }));
        }
    }

    /// The connection is gone: requests sent on it go out again if the peer reconnects before the deadline.
    pub(super) fn metrics_conn_gone(&mut self, conn: ConnId) {
        for f in self.fetches.values_mut() {
            for w in f.waiting.values_mut() {
                if *w == Some(conn) {
                    *w = None;
                }
            }
        }
    }

    pub(super) fn handle_metrics_request(&mut self, now: Time, conn: ConnId, q: MetricsRequest) {
        let text = self.own_metrics();
        self.send(now, conn, Msg::MetricsReply(MetricsReply { seq: q.seq, text }));
    }

    pub(super) fn handle_metrics_reply(&mut self, now: Time, conn: ConnId, p: PeerId, r: MetricsReply) {
        let Some(f) = self.fetches.get_mut(&r.seq) else {
            return; // late, or never asked
        };
        if f.waiting.get(&p) != Some(&Some(conn)) {
            return;
        }
        f.waiting.remove(&p);
        f.answers.push((p, r.text));
        self.try_finish_fetch(r.seq, now);
    }

    fn try_finish_fetch(&mut self, seq: u64, now: Time) {
        if self.fetches.get(&seq).is_some_and(|f| f.waiting.is_empty() || f.deadline <= now) {
            if let Some(f) = self.fetches.remove(&seq) {
                self.actions.push_back(Action::MetricsDone(Self::metrics_result(f)));
            }
        }
    }

    fn metrics_result(f: Fetch) -> MetricsResult {
        MetricsResult { token: f.token, answers: f.answers, timed_out: f.waiting.into_keys().collect(), dead: f.dead }
    }

    /// Finishes fetches whose deadline has come (all of them for `Time::MAX`), and lets go of same-host peers no
    /// scrape has asked for a while.
    pub(super) fn metrics_timers(&mut self, now: Time) {
        let due: Vec<u64> = self.fetches.iter().filter(|(_, f)| f.deadline <= now).map(|(s, _)| *s).collect();
        for seq in due {
            if let Some(f) = self.fetches.remove(&seq) {
                tracing::debug!(me = self.me.0, seq, missing = f.waiting.len(), "RAS node metrics: deadline");
                self.actions.push_back(Action::MetricsDone(Self::metrics_result(f)));
            }
        }
        for l in self.links.values_mut() {
            if l.metrics_until.is_some_and(|t| t <= now) {
                l.metrics_until = None;
            }
        }
    }
}
