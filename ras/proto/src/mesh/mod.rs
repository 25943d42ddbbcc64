//! The RAS mesh as an I/O-free state machine, in the style of quinn-proto: the driver feeds it inputs (`handle_*`,
//! each with the current time), carries out what [`Mesh::poll_action`] returns, and calls
//! [`Mesh::handle_timeout`] when [`Mesh::poll_timeout`] says. It reads no clock, opens no socket and draws no
//! randomness of its own (the driver passes a seed), so a test can run a thousand of them on a virtual clock.
//!
//! **Shape.** Every process derives the same ring from the sorted peer table and links to its neighbour on each
//! side; jobs of [`LONG_RANGE_MIN_PEERS`] or more also link at distances N^(1/3) and N^(2/3) (see [`strides`]). A
//! neighbour that is dead or silent is skipped and the next live peer in that direction becomes the link (the
//! fallback); the silent one's connection is kept and watched. The lower-numbered side of a link connects at once,
//! the higher one only if nothing arrived within `connect_grace`; when both connections come up, both sides keep the
//! one the lower-numbered process opened.
//!
//! **Failure detection.** Every authenticated connection carries a keep-alive when nothing else was sent for
//! `keepalive` (1 s). A peer silent for `unresponsive_after` (5 s), or unreachable that long, is UNRESPONSIVE in this
//! process's view only; a message from it makes it alive again. A peer is DEAD when its connection closes and an immediate reconnect fails
//! (a killed process: detected within one round trip), when it stays silent for `dead_timeout` (60 s; a stopped
//! process), when it cannot be reached for `dead_timeout` since the first failure, or when it says goodbye. Death
//! is news: it floods over every connection, and each process forwards a piece of news only if it changed what the
//! process believed, so the flood stops by itself. A process that learns that it has been declared dead is alive by
//! definition: it raises its epoch and floods that it is alive at the new epoch, which outranks the old death.
//! A process that notices a gap in its own inputs longer than `stall` (it was stopped or starved) restarts its
//! silence clocks instead of blaming its peers.
//!
//! **Gather.** [`Mesh::start_status`] floods a status request over the live connections; the first copy a process
//! receives makes the sender its parent, later copies get an empty duplicate reply, so the request spreads as a
//! spanning tree. Each process snapshots its own rank records, forwards with a budget shortened by two hop margins,
//! and replies to its parent once every child answered, was lost or turned silent, or its own budget ran out,
//! whichever comes first. The originator gets every reachable process's records within the budget, with the others
//! listed as missing.
//!
//! **Authentication.** Before anything else on a connection, a mutual challenge-response proves that both sides know
//! the 16-byte job secret (SipHash-2-4 keyed with it, over role labels, both nonces, both peer ids and the peer
//! table's hash). Until it succeeds, a connection changes no state at all; a failure closes it.

mod auth;
mod conn;
#[cfg(any(test, feature = "test-support"))]
mod fuzz;
mod gather;
mod links;
mod metrics;
mod news;
mod table;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use thiserror::Error;

use crate::record::ProcessRecords;
use crate::wire::{Msg, ProcessStatus};

pub use crate::wire::{PeerId, RequestId};
pub use auth::job_name;
#[cfg(any(test, feature = "test-support"))]
pub use fuzz::fuzz_mesh_bytes;
pub use gather::{MAX_BUDGET, MAX_GATHERS};
pub use metrics::{MetricsResult, MAX_FETCHES, METRICS_KEEP};
pub use table::{link_targets, strides, PeerAddr, PeerTable, LONG_RANGE_MIN_PEERS};

use auth::Rng;
use conn::Conn;
use gather::Gather;
use links::Link;
use news::NewsBook;

/// A point in time in nanoseconds, on whatever monotonic clock the driver uses (a virtual one in tests).
pub type Time = u64;

/// A connection, numbered by the driver. Numbers must not be reused while the mesh may still refer to them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ConnId(pub u64);

/// Every timer, as durations. [`MeshConfig::default`] has NCCL's values (reference `nccl-ras.md` §3.4) where NCCL
/// has them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MeshConfig {
    /// Send a keep-alive on a connection when nothing else was sent for this long.
    pub keepalive: Duration,
    /// A peer silent this long is UNRESPONSIVE (NCCL's keep-alive warning).
    pub unresponsive_after: Duration,
    /// A peer silent, or unreachable, this long is DEAD (`OCCL_RAS_DEAD_TIMEOUT`).
    pub dead_timeout: Duration,
    /// Wait between connection attempts to a peer that could not be reached.
    pub connect_retry: Duration,
    /// A connection attempt, or a handshake, that takes longer than this failed.
    pub connect_timeout: Duration,
    /// How long the higher-numbered end of a link waits for the lower one to connect before connecting itself.
    pub connect_grace: Duration,
    /// A gap this long between two inputs means this process itself was stopped or starved.
    pub stall: Duration,
    /// A connection neither side wants as a link is closed after this long.
    pub idle_close: Duration,
    /// Time set aside per hop for a status request or reply to travel.
    pub hop_margin: Duration,
    /// The budget of a status gather when the client did not set one (NCCL's 5 s leg timeout).
    pub gather_timeout: Duration,
    /// Add long-range links in jobs of [`LONG_RANGE_MIN_PEERS`] or more processes.
    pub long_range: bool,
}

impl Default for MeshConfig {
    fn default() -> Self {
        Self {
            keepalive: Duration::from_secs(1),
            unresponsive_after: Duration::from_secs(5),
            dead_timeout: Duration::from_secs(60),
            connect_retry: Duration::from_secs(1),
            connect_timeout: Duration::from_secs(5),
            connect_grace: Duration::from_secs(5),
            stall: Duration::from_secs(3),
            idle_close: Duration::from_secs(10),
            hop_margin: Duration::from_millis(20),
            gather_timeout: Duration::from_secs(5),
            long_range: true,
        }
    }
}

impl MeshConfig {
    /// The defaults adjusted by the environment, read through `var`: `OCCL_RAS_TIMEOUT_FACTOR` (or NCCL's
    /// `NCCL_RAS_TIMEOUT_FACTOR`), a positive integer that multiplies every timer, and `OCCL_RAS_DEAD_TIMEOUT`,
    /// whole seconds after which a lost peer is dead (not multiplied).
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Self, MeshError> {
        let mut cfg = Self::default();
        let factor =
            ["OCCL_RAS_TIMEOUT_FACTOR", "NCCL_RAS_TIMEOUT_FACTOR"].into_iter().find_map(|n| Some((n, var(n)?)));
        if let Some((name, f)) = factor {
            let n: u32 = f.trim().parse().ok().filter(|&n| n > 0).ok_or(MeshError::BadVar(name, f))?;
            for d in [
                &mut cfg.keepalive,
                &mut cfg.unresponsive_after,
                &mut cfg.dead_timeout,
                &mut cfg.connect_retry,
                &mut cfg.connect_timeout,
                &mut cfg.connect_grace,
                &mut cfg.stall,
                &mut cfg.idle_close,
                &mut cfg.hop_margin,
                &mut cfg.gather_timeout,
            ] {
                *d = d.saturating_mul(n);
            }
        }
        if let Some(s) = var("OCCL_RAS_DEAD_TIMEOUT") {
            let n: u64 =
                s.trim().parse().ok().filter(|&n| n > 0).ok_or(MeshError::BadVar("OCCL_RAS_DEAD_TIMEOUT", s))?;
            cfg.dead_timeout = Duration::from_secs(n);
        }
        Ok(cfg)
    }
}

impl MeshConfig {
    /// The budget for [`Mesh::start_status`] from a client's `TIMEOUT` setting: the configured default, the client's
    /// seconds (absolute, as NCCL takes them), or the longest allowed for `TIMEOUT 0`. `ncclras` waits 1 + t + 5 s for
    /// a report, so a gather that keeps to t always reaches it.
    pub fn status_budget(&self, timeout: crate::client::Timeout) -> Duration {
        match timeout {
            crate::client::Timeout::Default => self.gather_timeout,
            crate::client::Timeout::Disabled => MAX_BUDGET,
            crate::client::Timeout::Seconds(s) => Duration::from_secs(s).min(MAX_BUDGET),
        }
    }
}

fn ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// Why a mesh could not be created.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum MeshError {
    #[error("a peer table must hold between 1 and 65536 processes, not {0}")]
    TableSize(usize),
    #[error("peer table entry {0}... has a string longer than 4096 bytes")]
    LongString(String),
    #[error("address {0} appears twice in the peer table")]
    DuplicateAddr(String),
    #[error("this process's address {0} is not in the peer table")]
    NotInTable(String),
    #[error("{0}={1:?}: expected a positive whole number")]
    BadVar(&'static str, String),
}

/// How a peer looks from here.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PeerHealth {
    Alive,
    /// Silent for longer than `unresponsive_after` on an open connection (this process's view only).
    Unresponsive,
    /// On the replicated dead list.
    Dead,
}

/// Why a peer was declared dead.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DeadCause {
    /// Its connection closed and reconnecting failed.
    ConnectionLost,
    /// Silent on an open connection for `dead_timeout`.
    Silent { silent_ns: u64 },
    /// Could not be reached for `dead_timeout`.
    Unreachable,
    /// It said goodbye.
    Left,
    /// News from another process.
    News { from: PeerId },
}

/// What the mesh tells its monitor (NCCL's `MONITOR` events, and more).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum MonitorEvent {
    /// An authenticated connection to the peer is up.
    PeerConnected {
        peer: PeerId,
    },
    /// The connection to the peer closed without a goodbye.
    PeerDisconnected {
        peer: PeerId,
    },
    /// Silent for `silent_ns` (NCCL's keep-alive warning).
    PeerUnresponsive {
        peer: PeerId,
        silent_ns: u64,
    },
    /// Responding again: after silence (`from_dead: false`), or after it had been declared dead and proved otherwise.
    PeerAlive {
        peer: PeerId,
        from_dead: bool,
    },
    PeerDead {
        peer: PeerId,
        cause: DeadCause,
    },
    /// A connection failed authentication and was closed; `peer` is who it claimed to be.
    AuthFailed {
        conn: ConnId,
        peer: Option<PeerId>,
    },
    /// Another process declared this one dead; it now claims `epoch`.
    DeclaredDead {
        epoch: u32,
    },
}

/// The outcome of [`Mesh::start_status`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GatherResult {
    /// The caller's token, as given to `start_status`.
    pub token: u64,
    pub id: RequestId,
    /// Every process that answered, this one first.
    pub statuses: Vec<ProcessStatus>,
    /// Peers that did not answer, in table order.
    pub missing: Vec<PeerId>,
    /// The missing peers that this process, or any that answered, considers dead.
    pub dead: Vec<PeerId>,
    /// The missing peers that are not dead but that some process finds silent.
    pub unresponsive: Vec<PeerId>,
    /// Legs that timed out across the tree (NCCL's TIMEOUT warning).
    pub leg_timeouts: u32,
    pub started: Time,
    pub finished: Time,
}

/// What the driver must do, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Open a TCP connection to the peer's address, then call `handle_connected` or `handle_connect_failed`.
    Connect(PeerId),
    /// Encode and write the message on the connection.
    Send(ConnId, Msg),
    /// Close the connection once everything queued for it before this was written; the mesh has forgotten it.
    Close(ConnId),
    Event(MonitorEvent),
    StatusDone(GatherResult),
    /// A node metrics fetch ([`Mesh::start_metrics`]) is over.
    MetricsDone(MetricsResult),
}

/// Counters for tests and metrics.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MeshStats {
    /// Messages sent, by wire type byte.
    pub sent: [u64; 11],
    pub connects: u64,
}

impl MeshStats {
    pub fn total_sent(&self) -> u64 {
        self.sent.iter().sum()
    }
}

/// Request ids a process remembers having served, so that a late copy of a finished request gets a duplicate reply
/// rather than starting the gather anew.
const SEEN_REQUESTS: usize = 1024;

/// One process's RAS mesh. Methods by kind, as in quinn-proto: getters (`me`, `health`, …), inputs (`handle_*`,
/// `start_status`, `shutdown`), and outputs (`poll_action`, `poll_timeout`). After any input, drain `poll_action`
/// until `None`, then sleep until `poll_timeout`.
#[derive(Debug)]
pub struct Mesh {
    cfg: MeshConfig,
    table: PeerTable,
    me: PeerId,
    secret: [u8; 16],
    rng: Rng,
    records: Arc<ProcessRecords>,
    strides: Vec<usize>,
    /// This process's incarnation (raised when it refutes its own death).
    epoch: u32,
    news: NewsBook,
    links: BTreeMap<PeerId, Link>,
    conns: BTreeMap<ConnId, Conn>,
    /// The peers this process wants links to now, from the ring over the live peers.
    desired: Vec<PeerId>,
    gathers: BTreeMap<RequestId, Gather>,
    /// Node metrics fetches this process started, by their sequence number.
    fetches: BTreeMap<u64, metrics::Fetch>,
    metrics_seq: u64,
    seen: VecDeque<RequestId>,
    seen_set: HashSet<RequestId>,
    actions: VecDeque<Action>,
    last_input: Time,
    news_seq: u64,
    req_seq: u64,
    stats: MeshStats,
    shut_down: bool,
}

impl Mesh {
    /// A mesh for the process at `self_addr` in `table`, whose records are `records`. `secret` is the job secret,
    /// and `seed` fresh randomness for this process (nonces and ids).
    pub fn new(
        cfg: MeshConfig,
        table: PeerTable,
        self_addr: &str,
        secret: [u8; 16],
        seed: [u8; 16],
        records: Arc<ProcessRecords>,
        now: Time,
    ) -> Result<Self, MeshError> {
        let me = table.find(self_addr).ok_or_else(|| MeshError::NotInTable(self_addr.to_owned()))?;
        let mut rng = Rng::new(seed);
        // Sequence numbers start at random points so that a restarted process does not repeat its predecessor's ids.
        let news_seq = rng.u64() >> 16;
        let req_seq = rng.u64() >> 16;
        let mut mesh = Self {
            strides: strides(table.len(), cfg.long_range),
            news: NewsBook::new(table.len()),
            cfg,
            table,
            me,
            secret,
            rng,
            records,
            epoch: 0,
            links: BTreeMap::new(),
            conns: BTreeMap::new(),
            desired: Vec::new(),
            gathers: BTreeMap::new(),
            fetches: BTreeMap::new(),
            metrics_seq: 0,
            seen: VecDeque::new(),
            seen_set: HashSet::new(),
            actions: VecDeque::new(),
            last_input: now,
            news_seq,
            req_seq,
            stats: MeshStats::default(),
            shut_down: false,
        };
        tracing::debug!(me = me.0, peers = mesh.table.len(), strides = ?mesh.strides, "RAS mesh starts");
        mesh.maintain(now);
        Ok(mesh)
    }

    // ---- getters ----

    pub fn me(&self) -> PeerId {
        self.me
    }

    pub fn table(&self) -> &PeerTable {
        &self.table
    }

    pub fn config(&self) -> &MeshConfig {
        &self.cfg
    }

    /// This process's incarnation: 0, raised each time it refutes news of its own death.
    pub fn epoch(&self) -> u32 {
        self.epoch
    }

    pub fn health(&self, p: PeerId) -> PeerHealth {
        if self.news.is_dead(p) {
            PeerHealth::Dead
        } else if self.links.get(&p).is_some_and(|l| l.unresponsive) {
            PeerHealth::Unresponsive
        } else {
            PeerHealth::Alive
        }
    }

    pub fn dead_peers(&self) -> Vec<PeerId> {
        self.news.dead_peers()
    }

    pub fn unresponsive_peers(&self) -> Vec<PeerId> {
        self.links.iter().filter(|(p, l)| l.unresponsive && !self.news.is_dead(**p)).map(|(p, _)| *p).collect()
    }

    /// The peers this process wants links to, given who is dead or silent.
    pub fn desired_links(&self) -> &[PeerId] {
        &self.desired
    }

    /// Peers with an authenticated connection open.
    pub fn connected_peers(&self) -> Vec<PeerId> {
        let mut v: Vec<PeerId> = self.conns.values().filter(|c| c.is_ready()).filter_map(|c| c.peer).collect();
        v.sort();
        v.dedup();
        v
    }

    /// Whether the connection passed authentication; the driver may raise its decoder's frame limit from
    /// [`crate::wire::HANDSHAKE_MAX_FRAME`] to [`crate::wire::MAX_FRAME`] then.
    pub fn is_authenticated(&self, conn: ConnId) -> bool {
        self.conns.get(&conn).is_some_and(Conn::is_ready)
    }

    /// Connections the mesh knows (any state).
    pub fn connection_count(&self) -> usize {
        self.conns.len()
    }

    /// Gathers in progress here (as originator or on the way).
    pub fn gathers_in_flight(&self) -> usize {
        self.gathers.len()
    }

    pub fn stats(&self) -> &MeshStats {
        &self.stats
    }

    // ---- outputs ----

    /// The next thing to do, in order; `None` when everything queued so far has been taken.
    pub fn poll_action(&mut self) -> Option<Action> {
        self.actions.pop_front()
    }

    /// When to call `handle_timeout` next: never more than a keep-alive interval away while the mesh runs (so that a
    /// long gap can only mean this process was stopped).
    pub fn poll_timeout(&self) -> Option<Time> {
        if self.shut_down {
            return None;
        }
        Some(self.next_deadline())
    }

    // ---- inputs ----

    /// Time passed; run every timer that is due.
    pub fn handle_timeout(&mut self, now: Time) {
        if self.shut_down {
            return;
        }
        self.observe(now);
        self.run_timers(now);
        self.maintain(now);
    }

    /// Leaves the job: a goodbye on every authenticated connection, then every connection closed. The mesh does
    /// nothing after this.
    pub fn shutdown(&mut self, now: Time) {
        let ids: Vec<ConnId> = self.conns.keys().copied().collect();
        for c in ids {
            let bye = self.conns.get(&c).is_some_and(Conn::is_ready).then_some(crate::wire::ByeReason::Shutdown);
            self.close(now, c, bye);
        }
        self.gathers.clear();
        self.metrics_timers(Time::MAX);
        self.shut_down = true;
    }

    // ---- shared helpers ----

    fn event(&mut self, e: MonitorEvent) {
        self.actions.push_back(Action::Event(e));
    }

    fn send(&mut self, now: Time, conn: ConnId, msg: Msg) {
        if let Some(c) = self.conns.get_mut(&conn) {
            c.last_sent = now;
            self.stats.sent[usize::from(msg.type_byte())] += 1;
            self.actions.push_back(Action::Send(conn, msg));
        }
    }

    /// Notes an input at `now`. A gap longer than `stall` since the previous one means this process did not run
    /// (stopped, swapped out, a debugger): silence clocks restart rather than blame peers for a pause that was ours.
    fn observe(&mut self, now: Time) {
        let gap = now.saturating_sub(self.last_input);
        if gap > ns(self.cfg.stall) {
            tracing::warn!(
                me = self.me.0,
                gap_ms = gap / 1_000_000,
                "RAS thread did not run for a while; restarting peer timers"
            );
            for l in self.links.values_mut() {
                l.restart_clocks(now, gap);
            }
            for c in self.conns.values_mut() {
                c.restart_clocks(now);
            }
        }
        self.last_input = self.last_input.max(now);
    }
}
