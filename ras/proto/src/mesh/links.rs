//! Links and timers: which peers this process keeps connections to, when it connects, when a silent peer becomes
//! unresponsive or dead, keep-alives, and how news of deaths and resurrections spreads.

use super::*;
use crate::wire::{ByeReason, NewsId, NewsItem, PeerNews};

/// This process's relation to one peer it links to, watches or is reconnecting to.
#[derive(Debug, Clone)]
pub(super) struct Link {
    /// The authenticated connection in use.
    pub conn: Option<ConnId>,
    /// `Action::Connect` went out at this time and the driver has not answered yet.
    pub connecting: Option<Time>,
    /// The last message from the peer.
    pub last_heard: Time,
    pub unresponsive: bool,
    /// A connection to the peer was authenticated at least once.
    pub ever_connected: bool,
    /// The connection closed without a goodbye: reconnect, and a refused reconnect means the peer is dead.
    pub probe: bool,
    /// The first failure since the peer was last connected.
    pub lost_at: Option<Time>,
    /// The earliest time for the next connection attempt.
    pub retry_at: Time,
    /// Since when the ring wants this link (`None`: not wanted).
    pub wanted_since: Option<Time>,
    /// A node metrics fetch wants a connection to this same-host peer until then.
    pub metrics_until: Option<Time>,
}

impl Link {
    pub fn new(now: Time) -> Self {
        Self {
            conn: None,
            connecting: None,
            last_heard: now,
            unresponsive: false,
            ever_connected: false,
            probe: false,
            lost_at: None,
            retry_at: now,
            wanted_since: None,
            metrics_until: None,
        }
    }

    /// After this process itself did not run for `gap`: nothing it failed to hear in that time counts.
    pub fn restart_clocks(&mut self, now: Time, gap: u64) {
        self.last_heard = self.last_heard.max(now);
        self.lost_at = self.lost_at.map(|t| t.saturating_add(gap).min(now));
        self.connecting = self.connecting.map(|_| now);
        self.retry_at = self.retry_at.min(now);
    }
}

impl Mesh {
    /// A message from `p` arrived on an authenticated connection.
    pub(super) fn heard_from(&mut self, now: Time, p: PeerId) {
        let Some(l) = self.links.get_mut(&p) else {
            return;
        };
        l.last_heard = now;
        if l.unresponsive {
            l.unresponsive = false;
            tracing::info!(me = self.me.0, peer = p.0, "RAS peer responds again");
            self.event(MonitorEvent::PeerAlive { peer: p, from_dead: false });
        }
    }

    /// Whether this process wants its connection to `p` kept: a link of the ring, a silent peer being watched, or a
    /// same-host peer that scrapes ask for its metrics.
    pub(super) fn wants_conn(&self, p: PeerId) -> bool {
        self.desired.contains(&p) || self.links.get(&p).is_some_and(|l| l.unresponsive || l.metrics_until.is_some())
    }

    /// Recomputes the wanted links from who is dead or silent now, and forgets peers it has nothing to do with.
    pub(super) fn links_changed(&mut self, now: Time) {
        let news = &self.news;
        let links = &self.links;
        let live = |p: PeerId| !news.is_dead(p) && !links.get(&p).is_some_and(|l| l.unresponsive);
        let mut wanted = link_targets(self.table.len(), self.me, &self.strides, live);
        wanted.sort();
        if wanted != self.desired {
            tracing::debug!(me = self.me.0, links = ?wanted.iter().map(|p| p.0).collect::<Vec<_>>(), "RAS links");
        }
        for &p in &wanted {
            let l = self.links.entry(p).or_insert_with(|| Link::new(now));
            l.wanted_since.get_or_insert(now);
        }
        for (p, l) in self.links.iter_mut() {
            if wanted.binary_search(p).is_err() {
                l.wanted_since = None;
            }
        }
        self.desired = wanted;
        self.links.retain(|_, l| {
            l.conn.is_some()
                || l.wanted_since.is_some()
                || l.connecting.is_some()
                || l.probe
                || l.unresponsive
                || l.metrics_until.is_some()
        });
    }

    /// Whether a handshake with `p` is under way on some connection (then no new attempt is started).
    fn handshaking_with(&self, p: PeerId) -> bool {
        self.conns.values().any(|c| c.peer == Some(p) && !c.is_ready())
    }

    /// When this process should next try to connect to `p`, if it should.
    fn connect_due(&self, p: PeerId, l: &Link) -> Option<Time> {
        if l.conn.is_some() || l.connecting.is_some() || self.news.is_dead(p) {
            return None;
        }
        // Wanted by the ring or a metrics fetch, lost without a goodbye, or silent and watched: keep trying.
        if l.wanted_since.is_none() && !l.probe && !l.unresponsive && l.metrics_until.is_none() {
            return None;
        }
        match l.wanted_since {
            // The lower-numbered end opens a link; this end steps in only if that did not happen in time.
            Some(since) if !l.probe && !l.ever_connected && !l.unresponsive && p < self.me => {
                Some(l.retry_at.max(since.saturating_add(ns(self.cfg.connect_grace))))
            }
            _ => Some(l.retry_at),
        }
    }

    /// Brings links in line with the current view: connect where due. Runs after every input.
    pub(super) fn maintain(&mut self, now: Time) {
        if self.shut_down {
            return;
        }
        self.links_changed(now);
        let due: Vec<PeerId> = self
            .links
            .iter()
            .filter(|(p, l)| self.connect_due(**p, l).is_some_and(|t| t <= now) && !self.handshaking_with(**p))
            .map(|(p, _)| *p)
            .collect();
        for p in due {
            if let Some(l) = self.links.get_mut(&p) {
                l.connecting = Some(now);
            }
            self.stats.connects += 1;
            tracing::debug!(me = self.me.0, peer = p.0, "RAS connecting");
            self.actions.push_back(Action::Connect(p));
        }
    }

    /// The earliest time anything is due.
    pub(super) fn next_deadline(&self) -> Time {
        let cfg = &self.cfg;
        let mut t = self.last_input.saturating_add(ns(cfg.keepalive));
        let mut at = |x: Time| t = t.min(x);
        for c in self.conns.values() {
            if c.is_ready() {
                at(c.last_sent.saturating_add(ns(cfg.keepalive)));
                if let Some(u) = c.unwanted_since {
                    at(u.saturating_add(ns(cfg.idle_close)));
                }
            } else {
                at(c.opened.saturating_add(ns(cfg.connect_timeout)));
            }
        }
        for (&p, l) in &self.links {
            if l.conn.is_some() {
                if !l.unresponsive {
                    at(l.last_heard.saturating_add(ns(cfg.unresponsive_after)));
                }
                at(l.last_heard.saturating_add(ns(cfg.dead_timeout)));
            }
            if let Some(c) = l.connecting {
                at(c.saturating_add(ns(cfg.connect_timeout)));
            }
            if let Some(lost) = l.lost_at.filter(|_| l.conn.is_none()) {
                if !l.unresponsive {
                    at(lost.saturating_add(ns(cfg.unresponsive_after)));
                }
                at(lost.saturating_add(ns(cfg.dead_timeout)));
            }
            if let Some(d) = self.connect_due(p, l).filter(|_| !self.handshaking_with(p)) {
                at(d);
            }
        }
        for g in self.gathers.values() {
            at(g.deadline);
        }
        for f in self.fetches.values() {
            at(f.deadline);
        }
        t
    }

    /// Runs every timer due at `now`.
    pub(super) fn run_timers(&mut self, now: Time) {
        let cfg = self.cfg.clone();
        // Handshakes that take too long.
        let stale: Vec<ConnId> = self
            .conns
            .iter()
            .filter(|(_, c)| !c.is_ready() && now >= c.opened.saturating_add(ns(cfg.connect_timeout)))
            .map(|(id, _)| *id)
            .collect();
        for id in stale {
            tracing::debug!(me = self.me.0, conn = id.0, "RAS handshake timed out");
            if let Some(c) = self.conns.remove(&id) {
                self.actions.push_back(Action::Close(id));
                if let (true, Some(p)) = (c.outgoing, c.peer) {
                    self.connect_failed(now, p, false);
                }
            }
        }
        // Connection attempts the driver never answered.
        let stuck: Vec<PeerId> = self
            .links
            .iter()
            .filter(|(_, l)| l.connecting.is_some_and(|t| now >= t.saturating_add(ns(cfg.connect_timeout))))
            .map(|(p, _)| *p)
            .collect();
        for p in stuck {
            if let Some(l) = self.links.get_mut(&p) {
                l.connecting = None;
            }
            self.connect_failed(now, p, false);
        }
        // Silence on open connections, and peers that cannot be reached: unresponsive first (so that links route
        // around them), dead if it lasts.
        let mut dead = Vec::new();
        let mut silent = Vec::new();
        for (&p, l) in &self.links {
            let quiet = match (l.conn, l.lost_at) {
                (Some(_), _) => now.saturating_sub(l.last_heard),
                (None, Some(t)) => now.saturating_sub(t),
                (None, None) => continue,
            };
            if quiet >= ns(cfg.dead_timeout) {
                let cause =
                    if l.conn.is_some() { DeadCause::Silent { silent_ns: quiet } } else { DeadCause::Unreachable };
                dead.push((p, cause));
            } else if !l.unresponsive && quiet >= ns(cfg.unresponsive_after) {
                silent.push((p, l.conn, quiet));
            }
        }
        for (p, conn, quiet) in silent {
            if let Some(l) = self.links.get_mut(&p) {
                l.unresponsive = true;
            }
            tracing::warn!(me = self.me.0, peer = p.0, silent_ms = quiet / 1_000_000, "RAS peer not responding");
            self.event(MonitorEvent::PeerUnresponsive { peer: p, silent_ns: quiet });
            if let Some(c) = conn {
                self.drop_child(now, c, true);
            }
        }
        for (p, cause) in dead {
            self.declare_dead(now, p, cause);
        }
        // Keep-alives, and connections nobody wants any more.
        let ready: Vec<(ConnId, PeerId)> =
            self.conns.iter().filter(|(_, c)| c.is_ready()).filter_map(|(id, c)| c.peer.map(|p| (*id, p))).collect();
        for (id, p) in ready {
            let wanted = self.wants_conn(p);
            let Some(c) = self.conns.get_mut(&id) else {
                continue;
            };
            if wanted || c.remote_wants {
                c.unwanted_since = None;
            } else if now.saturating_sub(*c.unwanted_since.get_or_insert(now)) >= ns(cfg.idle_close) {
                self.close(now, id, Some(ByeReason::Unneeded));
                continue;
            }
            if now >= c.last_sent.saturating_add(ns(cfg.keepalive)) {
                self.send_keepalive(now, id);
            }
        }
        self.finish_due_gathers(now);
        self.metrics_timers(now);
    }

    /// This process declares `p` dead and tells everyone.
    pub(super) fn declare_dead(&mut self, now: Time, p: PeerId, cause: DeadCause) {
        if p == self.me {
            return;
        }
        if self.news.is_dead(p) {
            // Already dead here (it reconnected since and went quiet again): just let go of it.
            self.forget_peer(now, p);
            return;
        }
        let item = NewsItem { peer: p, epoch: self.news.get(p).epoch, dead: true };
        self.apply_news(now, None, None, &[item], Some(cause));
    }

    pub(super) fn next_news_id(&mut self) -> NewsId {
        self.news_seq = self.news_seq.wrapping_add(1);
        NewsId { origin: self.me, seq: self.news_seq }
    }

    /// Applies news that arrived on `src` (or was made here), acts on what changed, and floods the changes on every
    /// other authenticated connection. `cause` is set when this process made the news itself.
    pub(super) fn apply_news(
        &mut self,
        now: Time,
        src: Option<ConnId>,
        id: Option<NewsId>,
        items: &[NewsItem],
        cause: Option<DeadCause>,
    ) {
        let mut changed = Vec::new();
        let mut refuted = false;
        let origin = id.map_or(self.me, |i| i.origin);
        for &item in items {
            if item.peer == self.me {
                // Only this process knows for sure that it is alive: news of its death is refuted at a higher epoch.
                if item.dead && item.epoch >= self.epoch || !item.dead && item.epoch > self.epoch {
                    self.epoch = if item.dead { item.epoch.saturating_add(1) } else { item.epoch };
                    let mine = NewsItem { peer: self.me, epoch: self.epoch, dead: false };
                    self.news.apply(mine);
                    changed.push(mine);
                    if item.dead {
                        refuted = true;
                        tracing::warn!(
                            me = self.me.0,
                            epoch = self.epoch,
                            "RAS peers declared this process dead; refuting"
                        );
                        self.event(MonitorEvent::DeclaredDead { epoch: self.epoch });
                    }
                }
                continue;
            }
            let was_dead = self.news.is_dead(item.peer);
            if !self.news.apply(item) {
                continue;
            }
            changed.push(item);
            if item.dead {
                let cause = cause.unwrap_or(DeadCause::News { from: origin });
                self.on_peer_dead(now, item.peer, cause);
            } else if was_dead {
                tracing::info!(me = self.me.0, peer = item.peer.0, epoch = item.epoch, "RAS peer is alive again");
                self.event(MonitorEvent::PeerAlive { peer: item.peer, from_dead: true });
            }
        }
        if changed.is_empty() {
            return;
        }
        let id = match id {
            Some(id) => id,
            None => self.next_news_id(),
        };
        let targets: Vec<ConnId> = self
            .conns
            .iter()
            .filter(|(cid, c)| c.is_ready() && (refuted || Some(**cid) != src))
            .map(|(cid, _)| *cid)
            .collect();
        for c in targets {
            self.send(now, c, Msg::PeerNews(PeerNews { id, items: changed.clone() }));
        }
    }

    /// `p` is now dead: drop every connection to it and stop waiting for it.
    fn on_peer_dead(&mut self, now: Time, p: PeerId, cause: DeadCause) {
        // A goodbye (or news that can stem from one) is how a job ends; only an unannounced loss is a warning.
        match cause {
            DeadCause::Left | DeadCause::News { .. } => {
                tracing::debug!(me = self.me.0, peer = p.0, ?cause, "RAS peer is gone")
            }
            _ => tracing::warn!(me = self.me.0, peer = p.0, ?cause, "RAS peer is dead"),
        }
        self.event(MonitorEvent::PeerDead { peer: p, cause });
        self.forget_peer(now, p);
    }

    /// Drops every connection to `p` and stops waiting for it.
    fn forget_peer(&mut self, now: Time, p: PeerId) {
        let conns: Vec<ConnId> = self.conns.iter().filter(|(_, c)| c.peer == Some(p)).map(|(id, _)| *id).collect();
        for c in conns {
            self.close(now, c, None);
        }
        self.links.remove(&p);
    }
}
