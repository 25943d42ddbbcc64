//! Connections: the authentication handshake, and what happens when a connection opens, fails, closes or carries a
//! message.
//!
//! Handshake (the connecting side is C, the accepting side A):
//! 1. C → A `Hello{table hash, C's id and address, C's epoch, nonce_c}`. A checks the table hash and that the id and
//!    address match its table.
//! 2. A → C `HelloAck{A's id, A's epoch, nonce_s, proof_A}`. C checks that A is the peer it dialled and the proof.
//! 3. C → A `HelloFinish{proof_C}`. C is done; A checks the proof and is done.
//!
//! Anything out of order, or a proof that does not check out, closes the connection. Nothing a connection carries
//! touches peer state before its handshake is complete.

use super::auth::{ct_eq, proof, Role, Transcript};
use super::*;
use crate::wire::{ByeReason, Hello, HelloAck, HelloFinish, KeepAlive};

#[derive(Debug, Clone)]
pub(super) enum ConnState {
    /// Outgoing: `Hello` sent.
    SentHello { nonce_c: [u8; 16] },
    /// Incoming: nothing received yet.
    AwaitHello,
    /// Incoming: `HelloAck` sent to the peer that claimed to be `Conn::peer`.
    SentAck { nonce_c: [u8; 16], nonce_s: [u8; 16] },
    /// Authenticated.
    Ready,
}

#[derive(Debug, Clone)]
pub(super) struct Conn {
    /// Who is at the other end: known at once for an outgoing connection, claimed by `Hello` for an incoming one.
    pub peer: Option<PeerId>,
    pub outgoing: bool,
    pub state: ConnState,
    /// When it was opened (handshake timeout).
    pub opened: Time,
    pub last_sent: Time,
    /// The peer's latest keep-alive said it wants this connection as a link.
    pub remote_wants: bool,
    /// Since when neither side wants the connection.
    pub unwanted_since: Option<Time>,
    /// When this process last sent its news to resynchronise the peer.
    pub last_sync: Option<Time>,
    /// The epoch the peer claimed in its handshake.
    pub remote_epoch: u32,
}

impl Conn {
    fn new(peer: Option<PeerId>, outgoing: bool, state: ConnState, now: Time) -> Self {
        Self {
            peer,
            outgoing,
            state,
            opened: now,
            last_sent: now,
            // The peer opened it because it wanted it.
            remote_wants: !outgoing,
            unwanted_since: None,
            last_sync: None,
            remote_epoch: 0,
        }
    }

    pub fn is_ready(&self) -> bool {
        matches!(self.state, ConnState::Ready)
    }

    pub fn restart_clocks(&mut self, now: Time) {
        self.opened = now;
        self.last_sent = self.last_sent.min(now);
        self.unwanted_since = self.unwanted_since.map(|_| now);
    }
}

impl Mesh {
    /// An outgoing connection asked for by `Action::Connect(peer)` is open.
    pub fn handle_connected(&mut self, now: Time, conn: ConnId, peer: PeerId) {
        if self.shut_down || self.table.get(peer).is_none() || peer == self.me || self.conns.contains_key(&conn) {
            return;
        }
        self.observe(now);
        if let Some(l) = self.links.get_mut(&peer) {
            l.connecting = None;
        }
        let nonce_c = self.rng.bytes16();
        self.conns.insert(conn, Conn::new(Some(peer), true, ConnState::SentHello { nonce_c }, now));
        let me = self.table.get(self.me).map(|p| p.addr.clone()).unwrap_or_default();
        let hello =
            Hello { table_hash: self.table.hash(), from: self.me, from_addr: me, epoch: self.epoch, nonce: nonce_c };
        self.send(now, conn, Msg::Hello(hello));
        self.maintain(now);
    }

    /// An outgoing connection asked for by `Action::Connect(peer)` was refused or found the host unreachable: nothing
    /// listens there. Right after losing a connection to the peer, that means the process is gone.
    pub fn handle_connect_failed(&mut self, now: Time, peer: PeerId) {
        self.connect_attempt_failed(now, peer, true);
    }

    /// An outgoing connection asked for by `Action::Connect(peer)` got no answer within the driver's own connect
    /// timeout. Weaker evidence than a refusal (a congested or partitioned network looks the same): the peer is
    /// retried, and dead only if it stays unreachable for the dead timeout.
    pub fn handle_connect_timed_out(&mut self, now: Time, peer: PeerId) {
        self.connect_attempt_failed(now, peer, false);
    }

    fn connect_attempt_failed(&mut self, now: Time, peer: PeerId, refused: bool) {
        if self.shut_down {
            return;
        }
        self.observe(now);
        if let Some(l) = self.links.get_mut(&peer) {
            l.connecting = None;
        }
        self.connect_failed(now, peer, refused);
        self.maintain(now);
    }

    /// The listener accepted a connection; the peer is unknown until its `Hello`.
    pub fn handle_incoming(&mut self, now: Time, conn: ConnId) {
        if self.shut_down || self.conns.contains_key(&conn) {
            return;
        }
        self.observe(now);
        self.conns.insert(conn, Conn::new(None, false, ConnState::AwaitHello, now));
        self.maintain(now);
    }

    /// The connection closed (EOF or error) on the other side or on the way.
    pub fn handle_closed(&mut self, now: Time, conn: ConnId) {
        if self.shut_down {
            return;
        }
        self.observe(now);
        if let Some(c) = self.conns.remove(&conn) {
            self.conn_gone(now, conn, c, false);
        }
        self.maintain(now);
    }

    /// A message arrived on the connection.
    pub fn handle_msg(&mut self, now: Time, conn: ConnId, msg: Msg) {
        if self.shut_down {
            return;
        }
        self.observe(now);
        let Some(c) = self.conns.get(&conn) else {
            return;
        };
        if c.is_ready() {
            if let Some(p) = c.peer {
                self.heard_from(now, p);
                self.handle_ready_msg(now, conn, p, msg);
            }
        } else {
            self.handle_handshake_msg(now, conn, msg);
        }
        self.maintain(now);
    }

    /// Closes a connection this process gives up on, with a goodbye first when `bye` is given.
    pub(super) fn close(&mut self, now: Time, conn: ConnId, bye: Option<ByeReason>) {
        if let Some(reason) = bye {
            self.send(now, conn, Msg::Bye(reason));
        }
        if let Some(c) = self.conns.remove(&conn) {
            self.actions.push_back(Action::Close(conn));
            self.conn_gone(now, conn, c, true);
        }
    }

    /// Book-keeping once a connection is gone. `by_us`: this process closed it on purpose (never a failure).
    fn conn_gone(&mut self, now: Time, conn: ConnId, c: Conn, by_us: bool) {
        self.drop_child(now, conn, false);
        self.metrics_conn_gone(conn);
        let Some(p) = c.peer else {
            return;
        };
        if !c.is_ready() {
            // A handshake that did not finish: a failed attempt if this side dialled.
            if c.outgoing && !by_us {
                self.connect_failed(now, p, false);
            }
            return;
        }
        let Some(l) = self.links.get_mut(&p) else {
            return;
        };
        if l.conn != Some(conn) {
            return;
        }
        l.conn = None;
        if by_us || self.news.is_dead(p) {
            return;
        }
        // Lost without a goodbye: reconnect at once. If that fails, the process is gone (a killed process's port
        // refuses); if it succeeds, nothing is lost.
        tracing::info!(me = self.me.0, peer = p.0, "RAS connection to peer lost; reconnecting");
        // A peer that had already gone silent has been failing since it went silent.
        l.lost_at.get_or_insert(if l.unresponsive { l.last_heard } else { now });
        l.probe = true;
        l.retry_at = now;
        self.event(MonitorEvent::PeerDisconnected { peer: p });
    }

    /// A connection attempt to `p` failed. `confirmed`: nothing listens there (refused or unreachable), rather than an
    /// attempt or handshake that broke off or timed out.
    pub(super) fn connect_failed(&mut self, now: Time, p: PeerId, confirmed: bool) {
        let Some(l) = self.links.get_mut(&p) else {
            return;
        };
        if l.conn.is_some() || self.news.is_dead(p) {
            return;
        }
        l.retry_at = now.saturating_add(ns(self.cfg.connect_retry));
        let lost_at = *l.lost_at.get_or_insert(now);
        if confirmed && l.probe && l.ever_connected {
            // Its connection closed and it no longer accepts: the process is gone.
            self.declare_dead(now, p, DeadCause::ConnectionLost);
        } else if now.saturating_sub(lost_at) >= ns(self.cfg.dead_timeout) {
            self.declare_dead(now, p, DeadCause::Unreachable);
        }
    }

    fn transcript(&self, connector: PeerId, acceptor: PeerId, nonce_c: [u8; 16], nonce_s: [u8; 16]) -> Transcript {
        Transcript { connector, acceptor, nonce_c, nonce_s, table_hash: self.table.hash() }
    }

    fn auth_failed(&mut self, now: Time, conn: ConnId, peer: Option<PeerId>, why: &str) {
        tracing::warn!(me = self.me.0, conn = conn.0, claimed = ?peer, "RAS peer connection refused: {why}");
        self.event(MonitorEvent::AuthFailed { conn, peer });
        if let Some(c) = self.conns.remove(&conn) {
            self.actions.push_back(Action::Close(conn));
            // Only an attempt of our own counts as a failed attempt to reach the peer; never a stranger's claim.
            if c.outgoing {
                if let Some(p) = c.peer {
                    self.connect_failed(now, p, false);
                }
            }
        }
    }

    fn handle_handshake_msg(&mut self, now: Time, conn: ConnId, msg: Msg) {
        let Some(c) = self.conns.get(&conn) else {
            return;
        };
        let claimed = c.peer;
        match (c.state.clone(), msg) {
            (ConnState::AwaitHello, Msg::Hello(h)) => {
                let known = self.table.get(h.from).is_some_and(|p| p.addr == h.from_addr);
                if h.table_hash != self.table.hash() || !known || h.from == self.me {
                    tracing::warn!(me = self.me.0, from = h.from.0, addr = %h.from_addr, "RAS hello from a process with another peer table");
                    self.close(now, conn, Some(ByeReason::Refused));
                    return;
                }
                let nonce_s = self.rng.bytes16();
                let t = self.transcript(h.from, self.me, h.nonce, nonce_s);
                let ack = HelloAck {
                    from: self.me,
                    epoch: self.epoch,
                    nonce: nonce_s,
                    proof: proof(&self.secret, Role::Acceptor, &t),
                };
                if let Some(c) = self.conns.get_mut(&conn) {
                    c.peer = Some(h.from);
                    c.remote_epoch = h.epoch;
                    c.state = ConnState::SentAck { nonce_c: h.nonce, nonce_s };
                }
                self.send(now, conn, Msg::HelloAck(ack));
            }
            (ConnState::SentHello { nonce_c }, Msg::HelloAck(a)) => {
                let Some(p) = claimed else {
                    return;
                };
                let t = self.transcript(self.me, p, nonce_c, a.nonce);
                if a.from != p || !ct_eq(&a.proof, &proof(&self.secret, Role::Acceptor, &t)) {
                    self.auth_failed(now, conn, Some(p), "the acceptor does not know the job secret");
                    return;
                }
                let finish = HelloFinish { proof: proof(&self.secret, Role::Connector, &t) };
                self.send(now, conn, Msg::HelloFinish(finish));
                if let Some(c) = self.conns.get_mut(&conn) {
                    c.remote_epoch = a.epoch;
                }
                self.on_ready(now, conn, p);
            }
            (ConnState::SentAck { nonce_c, nonce_s }, Msg::HelloFinish(f)) => {
                let Some(p) = claimed else {
                    return;
                };
                let t = self.transcript(p, self.me, nonce_c, nonce_s);
                if !ct_eq(&f.proof, &proof(&self.secret, Role::Connector, &t)) {
                    self.auth_failed(now, conn, Some(p), "the connector does not know the job secret");
                    return;
                }
                self.on_ready(now, conn, p);
            }
            (_, Msg::Bye(reason)) => {
                tracing::debug!(me = self.me.0, conn = conn.0, ?reason, "RAS connection refused by peer");
                if let Some(c) = self.conns.remove(&conn) {
                    self.actions.push_back(Action::Close(conn));
                    if c.outgoing {
                        if let Some(p) = c.peer {
                            self.connect_failed(now, p, false);
                        }
                    }
                }
            }
            (_, other) => {
                self.auth_failed(now, conn, claimed, &format!("{} before the handshake finished", other.name()));
            }
        }
    }

    /// The handshake on `conn` succeeded: `p` is who it claims.
    fn on_ready(&mut self, now: Time, conn: ConnId, p: PeerId) {
        let Some(c) = self.conns.get_mut(&conn) else {
            return;
        };
        c.state = ConnState::Ready;
        let (outgoing, remote_epoch) = (c.outgoing, c.remote_epoch);
        // Two connections between the same pair: both ends keep the one the lower-numbered process opened (the
        // newer one if the same process opened both), and close the other.
        if let Some(old) = self.links.get(&p).and_then(|l| l.conn).filter(|&o| o != conn) {
            let old_out = self.conns.get(&old).is_some_and(|c| c.outgoing);
            let low = self.me.min(p);
            let me = self.me;
            let opener = |out: bool| if out { me } else { p };
            let keep_new = opener(outgoing) == low || opener(old_out) != low;
            let (kept, loser) = if keep_new { (conn, old) } else { (old, conn) };
            tracing::debug!(me = me.0, peer = p.0, kept = kept.0, "RAS duplicate connection");
            if let Some(l) = self.links.get_mut(&p) {
                l.conn = Some(kept);
            }
            self.close(now, loser, Some(ByeReason::Duplicate));
            if !keep_new {
                return;
            }
        }
        let link = self.links.entry(p).or_insert_with(|| Link::new(now));
        let was_unresponsive = link.unresponsive;
        link.conn = Some(conn);
        link.connecting = None;
        link.ever_connected = true;
        link.probe = false;
        link.lost_at = None;
        link.last_heard = now;
        link.unresponsive = false;
        tracing::debug!(me = self.me.0, peer = p.0, conn = conn.0, "RAS peer connected");
        self.event(MonitorEvent::PeerConnected { peer: p });
        if was_unresponsive {
            self.event(MonitorEvent::PeerAlive { peer: p, from_dead: false });
            self.links_changed(now);
        }
        // An authenticated process vouches for its own epoch.
        self.apply_news(now, None, None, &[crate::wire::NewsItem { peer: p, epoch: remote_epoch, dead: false }], None);
        // Compare views at once rather than a keep-alive interval later.
        self.send_keepalive(now, conn);
        self.metrics_connected(now, conn, p);
    }

    pub(super) fn send_keepalive(&mut self, now: Time, conn: ConnId) {
        let Some(p) = self.conns.get(&conn).and_then(|c| c.peer) else {
            return;
        };
        let ka = KeepAlive {
            table_hash: self.table.hash(),
            news_digest: self.news.digest(),
            dead: self.news.dead_count(),
            unresponsive: self.unresponsive_peers().len() as u32,
            link: self.wants_conn(p),
        };
        self.send(now, conn, Msg::KeepAlive(ka));
    }

    fn handle_ready_msg(&mut self, now: Time, conn: ConnId, p: PeerId, msg: Msg) {
        match msg {
            Msg::KeepAlive(k) => {
                let mut sync = false;
                if let Some(c) = self.conns.get_mut(&conn) {
                    c.remote_wants = k.link;
                    let quiet = c.last_sync.is_none_or(|t| now.saturating_sub(t) >= ns(self.cfg.unresponsive_after));
                    if k.news_digest != self.news.digest() && quiet {
                        c.last_sync = Some(now);
                        sync = true;
                    }
                }
                let items = self.news.items();
                if sync && !items.is_empty() {
                    // Views differ: send everything this process knows; the peer keeps what is newer and floods it.
                    let id = self.next_news_id();
                    self.send(now, conn, Msg::PeerNews(crate::wire::PeerNews { id, items }));
                }
            }
            Msg::PeerNews(n) => self.apply_news(now, Some(conn), Some(n.id), &n.items, None),
            Msg::StatusRequest(q) => self.handle_status_request(now, conn, q),
            Msg::StatusReply(r) => self.handle_status_reply(now, conn, r),
            Msg::MetricsRequest(q) => self.handle_metrics_request(now, conn, q),
            Msg::MetricsReply(r) => self.handle_metrics_reply(now, conn, p, r),
            Msg::Bye(reason) => {
                tracing::debug!(me = self.me.0, peer = p.0, ?reason, "RAS peer said goodbye");
                if let Some(c) = self.conns.remove(&conn) {
                    self.actions.push_back(Action::Close(conn));
                    self.conn_gone(now, conn, c, true);
                }
                if reason == ByeReason::Shutdown && !self.news.is_dead(p) {
                    self.declare_dead(now, p, DeadCause::Left);
                }
            }
            other @ (Msg::Hello(_) | Msg::HelloAck(_) | Msg::HelloFinish(_)) => {
                tracing::warn!(me = self.me.0, peer = p.0, "RAS peer sent {} after the handshake", other.name());
                self.close(now, conn, None);
            }
        }
    }
}
