//! The status gather: a request flooded as a spanning tree, each process answering for its subtree within the
//! budget its parent gave it.

use std::collections::BTreeSet;

use super::*;
use crate::record::MAX_COMM_RANKS;
use crate::wire::{reply_len, StatusReply, StatusRequest, HEADER_LEN, MAX_FRAME, MAX_PATH, MAX_RECORDS, MAX_STRING};

/// The longest a gather may take; longer budgets (a client's `TIMEOUT 0`, a peer's claim) are cut to this.
pub const MAX_BUDGET: Duration = Duration::from_secs(600);

/// Gathers a process takes part in at once; beyond this, requests get an empty answer.
pub const MAX_GATHERS: usize = 256;

/// One gather this process takes part in.
#[derive(Debug)]
pub(super) struct Gather {
    /// The caller's token, at the originator only.
    token: Option<u64>,
    /// Where the request came from; `None` at the originator.
    parent: Option<ConnId>,
    started: Time,
    /// Reply (or, at the originator, report) by then.
    pub deadline: Time,
    /// Children that have not answered yet.
    waiting: BTreeMap<ConnId, PeerId>,
    /// This process's status first, then the subtree's.
    statuses: Vec<ProcessStatus>,
    leg_timeouts: u32,
}

impl Mesh {
    /// Starts a job-wide status gather that must finish within `budget` (at most [`MAX_BUDGET`]). `token` comes back
    /// in [`Action::StatusDone`], at the latest `budget` after `now`.
    pub fn start_status(&mut self, now: Time, token: u64, budget: Duration) -> RequestId {
        self.req_seq = self.req_seq.wrapping_add(1);
        let id = RequestId { origin: self.me, seq: self.req_seq };
        if self.shut_down {
            return id;
        }
        self.observe(now);
        self.remember(id);
        self.open_gather(now, id, Some(token), None, ns(budget.min(MAX_BUDGET)), Vec::new());
        self.maintain(now);
        id
    }

    fn remember(&mut self, id: RequestId) {
        if self.seen_set.insert(id) {
            self.seen.push_back(id);
            if self.seen.len() > SEEN_REQUESTS {
                if let Some(old) = self.seen.pop_front() {
                    self.seen_set.remove(&old);
                }
            }
        }
    }

    /// This process's own answer, taken when the request arrives so that every process's snapshot is as close as
    /// possible to the same moment.
    fn own_status(&self) -> ProcessStatus {
        let me = self.table.get(self.me);
        let mut records = self.records.snapshot_all();
        // Only what the wire can carry: a record a peer would refuse would cost the whole reply.
        records
            .retain(|r| r.info.size <= MAX_COMM_RANKS && r.info.rank < r.info.size && r.info.host.len() <= MAX_STRING);
        records.truncate(MAX_RECORDS);
        ProcessStatus {
            peer: self.me,
            addr: me.map(|p| p.addr.clone()).unwrap_or_default(),
            host: me.map(|p| p.host.clone()).unwrap_or_default(),
            pid: me.map_or(0, |p| p.pid),
            epoch: self.epoch,
            records,
            dead: self.news.dead_peers(),
            unresponsive: self.unresponsive_peers(),
        }
    }

    fn open_gather(
        &mut self,
        now: Time,
        id: RequestId,
        token: Option<u64>,
        parent: Option<ConnId>,
        budget: u64,
        mut path: Vec<PeerId>,
    ) {
        let own = self.own_status();
        if path.len() < MAX_PATH {
            path.push(self.me);
        }
        // A child's reply has to travel back before this process's own deadline.
        let margin = ns(self.cfg.hop_margin);
        let child_budget = budget.saturating_sub(margin.saturating_mul(2));
        let mut waiting = BTreeMap::new();
        if child_budget >= margin {
            let targets: Vec<(ConnId, PeerId)> = self
                .conns
                .iter()
                .filter(|(cid, c)| c.is_ready() && Some(**cid) != parent)
                .filter_map(|(cid, c)| c.peer.map(|p| (*cid, p)))
                .filter(|(_, p)| self.health(*p) == PeerHealth::Alive && !path.contains(p))
                .collect();
            for (c, p) in targets {
                let req = StatusRequest { id, budget_ns: child_budget, path: path.clone() };
                self.send(now, c, Msg::StatusRequest(req));
                waiting.insert(c, p);
            }
        }
        tracing::debug!(me = self.me.0, origin = id.origin.0, seq = id.seq, children = waiting.len(), "RAS gather");
        let g = Gather {
            token,
            parent,
            started: now,
            deadline: now.saturating_add(budget),
            waiting,
            statuses: vec![own],
            leg_timeouts: 0,
        };
        self.gathers.insert(id, g);
        self.try_finish(now, id);
    }

    pub(super) fn handle_status_request(&mut self, now: Time, conn: ConnId, q: StatusRequest) {
        // Too many at once (only a misbehaving peer gets here): answer empty at once rather than hold state.
        let busy = self.gathers.len() >= MAX_GATHERS;
        if busy || self.gathers.contains_key(&q.id) || self.seen_set.contains(&q.id) {
            // Reached here by another path first: an empty answer, so the sender stops waiting at once.
            let dup = StatusReply { id: q.id, duplicate: true, leg_timeouts: 0, statuses: Vec::new() };
            self.send(now, conn, Msg::StatusReply(dup));
            return;
        }
        self.remember(q.id);
        self.open_gather(now, q.id, None, Some(conn), q.budget_ns.min(ns(MAX_BUDGET)), q.path);
    }

    pub(super) fn handle_status_reply(&mut self, now: Time, conn: ConnId, r: StatusReply) {
        let Some(g) = self.gathers.get_mut(&r.id) else {
            return; // late: that gather is over here
        };
        if g.waiting.remove(&conn).is_none() {
            return;
        }
        g.leg_timeouts = g.leg_timeouts.saturating_add(r.leg_timeouts);
        if !r.duplicate {
            // Bounded: a peer could claim to answer for more processes than the job has.
            let room = self.table.len().saturating_sub(g.statuses.len());
            g.statuses.extend(r.statuses.into_iter().take(room));
        }
        self.try_finish(now, r.id);
    }

    /// A child connection is gone or its peer went silent: stop waiting for it (a silent one counts as a timeout).
    pub(super) fn drop_child(&mut self, now: Time, conn: ConnId, timed_out: bool) {
        let ids: Vec<RequestId> =
            self.gathers.iter().filter(|(_, g)| g.waiting.contains_key(&conn)).map(|(id, _)| *id).collect();
        for id in ids {
            if let Some(g) = self.gathers.get_mut(&id) {
                g.waiting.remove(&conn);
                g.leg_timeouts = g.leg_timeouts.saturating_add(u32::from(timed_out));
            }
            self.try_finish(now, id);
        }
    }

    pub(super) fn finish_due_gathers(&mut self, now: Time) {
        let due: Vec<RequestId> = self.gathers.iter().filter(|(_, g)| g.deadline <= now).map(|(id, _)| *id).collect();
        for id in due {
            self.finish(now, id);
        }
    }

    fn try_finish(&mut self, now: Time, id: RequestId) {
        if self.gathers.get(&id).is_some_and(|g| g.waiting.is_empty() || g.deadline <= now) {
            self.finish(now, id);
        }
    }

    fn finish(&mut self, now: Time, id: RequestId) {
        let Some(mut g) = self.gathers.remove(&id) else {
            return;
        };
        // Children still outstanding at the deadline are the legs that timed out.
        g.leg_timeouts = g.leg_timeouts.saturating_add(g.waiting.len() as u32);
        match g.parent {
            Some(conn) => {
                if !self.conns.get(&conn).is_some_and(Conn::is_ready) {
                    return; // the parent is gone; its own parent counts this subtree as missing
                }
                let mut reply =
                    StatusReply { id, duplicate: false, leg_timeouts: g.leg_timeouts, statuses: g.statuses };
                fit_frame(&mut reply);
                self.send(now, conn, Msg::StatusReply(reply));
            }
            None => {
                let result = self.result(now, id, g);
                tracing::debug!(
                    me = self.me.0,
                    answered = result.statuses.len(),
                    missing = result.missing.len(),
                    ms = (result.finished - result.started) / 1_000_000,
                    "RAS gather done"
                );
                self.actions.push_back(Action::StatusDone(result));
            }
        }
    }

    /// The originator's summary: who answered and what is known about everyone who did not.
    fn result(&self, now: Time, id: RequestId, g: Gather) -> GatherResult {
        let mut statuses = g.statuses;
        // A process may be reached twice only through a confused peer; keep its first answer.
        let mut seen = BTreeSet::new();
        statuses.retain(|s| seen.insert(s.peer));
        let mut dead: BTreeSet<PeerId> = self.news.dead_peers().into_iter().collect();
        let mut silent: BTreeSet<PeerId> = self.unresponsive_peers().into_iter().collect();
        for s in &statuses {
            dead.extend(s.dead.iter().copied());
            silent.extend(s.unresponsive.iter().copied());
        }
        let missing: Vec<PeerId> = self.table.ids().filter(|p| !seen.contains(p)).collect();
        GatherResult {
            token: g.token.unwrap_or(0),
            id,
            dead: missing.iter().copied().filter(|p| dead.contains(p)).collect(),
            unresponsive: missing.iter().copied().filter(|p| !dead.contains(p) && silent.contains(p)).collect(),
            missing,
            statuses,
            leg_timeouts: g.leg_timeouts,
            started: g.started,
            finished: now,
        }
    }
}

/// Drops statuses from the end of a reply until it fits in a frame (only a job with tens of thousands of ranks gets
/// near); the processes dropped show up as missing at the originator.
fn fit_frame(reply: &mut StatusReply) {
    let fits = |r: &StatusReply| reply_len(r).is_ok_and(|n| n <= HEADER_LEN + MAX_FRAME);
    if fits(reply) {
        return;
    }
    while !reply.statuses.is_empty() && !fits(reply) {
        let drop = reply.statuses.len().div_ceil(8);
        reply.statuses.truncate(reply.statuses.len() - drop);
    }
    tracing::warn!(kept = reply.statuses.len(), "RAS status reply too large for one frame; dropped processes");
}
