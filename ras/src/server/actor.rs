//! The task that owns the mesh: every input (a command, a connection's bytes or end, a timer) goes through one
//! channel into `Mesh::handle_*`, and every action it returns is carried out here, so the mesh needs no lock.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot};

use super::client;
use super::conn::{self, ConnHandle};
use super::shared::{Input, Shared};
use super::{unix_ns, Clock, Cmd, Event, Gathered, NodeMetrics};
use crate::analysis::{KnownComm, KnownRank};
use crate::mesh::{Action, ConnId, Mesh, MetricsResult, PeerAddr, PeerId, PeerTable};
use crate::record::CommId;

/// How often a process that does not own the client port tries to take it.
const TAKE_OVER_EVERY: Duration = Duration::from_secs(1);

/// The client side's sockets, as `RasServer::start` bound them.
pub(crate) struct Client {
    /// The client port, when this process owns it.
    pub port: Option<std::net::TcpListener>,
    /// This process's socket in the node's directory.
    pub node: Option<std::os::unix::net::UnixListener>,
    /// Whether to keep trying the port (another process of the node holds it).
    pub take_over: bool,
}

/// Connections held while this process has no mesh yet (more are refused).
const MAX_EARLY: usize = 1024;

struct State {
    sh: Shared,
    clock: Clock,
    mesh: Option<Mesh>,
    peers: Vec<PeerAddr>,
    conns: HashMap<ConnId, ConnHandle>,
    next_conn: u64,
    next_token: u64,
    pending: HashMap<u64, oneshot::Sender<Result<Gathered, String>>>,
    pending_metrics: HashMap<u64, oneshot::Sender<NodeMetrics>>,
    inputs: mpsc::UnboundedSender<Input>,
    /// Connections that arrived before the first communicator gave the mesh its table.
    early: Vec<tokio::net::TcpStream>,
    /// This process's communicators: the mesh address of each rank's process.
    comms: HashMap<CommId, (u32, Vec<(u32, String)>)>,
}

/// Runs until `Shutdown`: the mesh, its listener, and the client port.
pub(crate) async fn run(
    sh: Shared,
    mut cmds: mpsc::UnboundedReceiver<Cmd>,
    mesh_listener: std::net::TcpListener,
    client: Client,
) {
    let clock = Clock(std::time::Instant::now());
    let (inputs, mut rx) = mpsc::unbounded_channel::<Input>();
    match TcpListener::from_std(mesh_listener) {
        Ok(l) => {
            let tx = inputs.clone();
            tokio::spawn(async move {
                loop {
                    match l.accept().await {
                        Ok((s, _)) => {
                            if tx.send(Input::Incoming(s)).is_err() {
                                return;
                            }
                        }
                        Err(e) => {
                            tracing::debug!("occl-ras: mesh accept: {e}");
                            tokio::time::sleep(Duration::from_millis(50)).await;
                        }
                    }
                }
            });
        }
        Err(e) => tracing::warn!("occl-ras: mesh listener unusable: {e}; peers cannot reach this process"),
    }
    if let Some(l) = client.node {
        super::node::serve(sh.clone(), l);
    }
    match client.port {
        Some(l) => {
            sh.owner.store(true, Ordering::Relaxed);
            client::serve(sh.clone(), l);
        }
        None if client.take_over => {
            // Another process of the node owns the port: take it over once it is free.
            let sh = sh.clone();
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(TAKE_OVER_EVERY).await;
                    if let Ok(l) = client::bind(sh.cfg.client_addr) {
                        tracing::debug!("occl-ras: this process now owns the client port {}", sh.cfg.client_addr);
                        sh.owner.store(true, Ordering::Relaxed);
                        client::serve(sh, l);
                        return;
                    }
                }
            });
        }
        None => {}
    }
    let mut st = State {
        sh,
        clock,
        mesh: None,
        peers: Vec::new(),
        conns: HashMap::new(),
        next_conn: 1,
        next_token: 1,
        pending: HashMap::new(),
        pending_metrics: HashMap::new(),
        inputs,
        comms: HashMap::new(),
        early: Vec::new(),
    };
    loop {
        let deadline = st.mesh.as_ref().and_then(Mesh::poll_timeout);
        let sleep = async {
            match deadline {
                Some(t) => tokio::time::sleep(Duration::from_nanos(t.saturating_sub(st.clock.now()))).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            c = cmds.recv() => match c {
                None | Some(Cmd::Shutdown) => break,
                Some(Cmd::Leave { done }) => {
                    st.leave().await;
                    let _ = done.send(());
                }
                Some(c) => st.input(Input::Cmd(c)),
            },
            Some(i) = rx.recv() => st.input(i),
            () = sleep => {
                let now = st.clock.now();
                if let Some(m) = st.mesh.as_mut() {
                    m.handle_timeout(now);
                }
            }
        }
        st.drain();
    }
    if let Some(m) = st.mesh.as_mut() {
        m.shutdown(st.clock.now());
    }
    st.drain();
    // Give the goodbyes a moment to leave.
    let flushes: Vec<_> = st.conns.drain().map(|(_, h)| h.close()).collect();
    let _ = tokio::time::timeout(Duration::from_millis(200), futures_util::future::join_all(flushes)).await;
}

impl State {
    /// Goodbye to every peer, then no mesh until the next communicator joins.
    async fn leave(&mut self) {
        if let Some(m) = self.mesh.as_mut() {
            m.shutdown(self.clock.now());
        }
        self.drain();
        self.mesh = None;
        self.peers.clear();
        self.comms.clear();
        let flushes: Vec<_> = self.conns.drain().map(|(_, h)| h.close()).collect();
        let _ = tokio::time::timeout(Duration::from_millis(200), futures_util::future::join_all(flushes)).await;
    }

    fn alloc_conn(&mut self) -> ConnId {
        let c = ConnId(self.next_conn);
        self.next_conn += 1;
        c
    }

    fn input(&mut self, i: Input) {
        let now = self.clock.now();
        match i {
            Input::Cmd(Cmd::Join { comm, size, members }) => {
                self.comms.insert(comm, (size, members.iter().map(|(r, p)| (*r, p.addr.clone())).collect()));
                self.join(members.into_iter().map(|(_, p)| p).collect());
            }
            Input::Cmd(Cmd::Status { budget, reply }) => match self.mesh.as_mut() {
                Some(m) => {
                    let token = self.next_token;
                    self.next_token += 1;
                    m.start_status(now, token, budget);
                    self.pending.insert(token, reply);
                }
                None => {
                    let _ = reply.send(Err(
                        "no communicator of this process is in RAS (none has joined yet, or all have left)".into(),
                    ));
                }
            },
            Input::Cmd(Cmd::Metrics { timeout, reply }) => match self.mesh.as_mut() {
                Some(m) => {
                    let token = self.next_token;
                    self.next_token += 1;
                    m.start_metrics(now, token, timeout);
                    self.pending_metrics.insert(token, reply);
                }
                None => {
                    // No mesh yet: this process alone.
                    let mut text = String::new();
                    self.sh.records.render_metrics(&mut text);
                    let _ =
                        reply.send(NodeMetrics { parts: vec![(std::process::id(), text)], ..NodeMetrics::default() });
                }
            },
            Input::Cmd(Cmd::Shutdown | Cmd::Leave { .. }) => {}
            Input::Incoming(stream) => {
                let conn = self.alloc_conn();
                match self.mesh.as_mut() {
                    Some(m) => {
                        self.conns.insert(conn, conn::spawn(conn, stream, self.inputs.clone()));
                        m.handle_incoming(now, conn);
                    }
                    // No table yet (a peer's communicator init finished before ours): keep the connection until
                    // it exists, so the peer is not refused and does not retry or, worse, suspect us.
                    None if self.early.len() < MAX_EARLY => self.early.push(stream),
                    None => drop(stream),
                }
            }
            Input::Connected { conn, peer, stream } => {
                self.conns.insert(conn, conn::spawn(conn, stream, self.inputs.clone()));
                if let Some(m) = self.mesh.as_mut() {
                    m.handle_connected(now, conn, peer);
                }
            }
            Input::ConnectFailed { peer } => {
                if let Some(m) = self.mesh.as_mut() {
                    m.handle_connect_failed(now, peer);
                }
            }
            Input::Msg { conn, msg } => {
                if let Some(m) = self.mesh.as_mut() {
                    m.handle_msg(now, conn, msg);
                    if m.is_authenticated(conn) {
                        if let Some(h) = self.conns.get(&conn) {
                            h.authenticated();
                        }
                    }
                }
            }
            Input::Closed { conn } => {
                self.conns.remove(&conn);
                if let Some(m) = self.mesh.as_mut() {
                    m.handle_closed(now, conn);
                }
            }
        }
    }

    /// Adds processes to the table. The first join creates the mesh; one that brings new processes rebuilds it over
    /// the larger table (connections are re-established; rank records are not lost).
    fn join(&mut self, peers: Vec<PeerAddr>) {
        let before = self.peers.len();
        for p in peers {
            if !self.peers.iter().any(|q| q.addr == p.addr) {
                self.peers.push(p);
            }
        }
        if self.mesh.is_some() && self.peers.len() == before {
            return;
        }
        let table = match PeerTable::new(self.peers.clone()) {
            Ok(t) => t,
            Err(e) => {
                tracing::warn!("occl-ras: bad peer table: {e}");
                return;
            }
        };
        let now = self.clock.now();
        if let Some(mut old) = self.mesh.take() {
            old.shutdown(now);
            while let Some(a) = old.poll_action() {
                match a {
                    Action::Close(c) => {
                        self.conns.remove(&c);
                    }
                    // A scrape in progress gets what it has (at least this process's own metrics).
                    Action::MetricsDone(r) => {
                        if let Some(reply) = self.pending_metrics.remove(&r.token) {
                            let _ = reply.send(node_metrics(old.table(), r));
                        }
                    }
                    _ => {}
                }
            }
        }
        let seed = seed();
        let me = self.sh.mesh_addr.to_string();
        match Mesh::new(self.sh.cfg.mesh.clone(), table, &me, self.sh.secret, seed, self.sh.records.clone(), now) {
            Ok(mut m) => {
                tracing::debug!("occl-ras: mesh of {} processes, this one {me}", self.peers.len());
                for stream in std::mem::take(&mut self.early) {
                    let conn = ConnId(self.next_conn);
                    self.next_conn += 1;
                    self.conns.insert(conn, conn::spawn(conn, stream, self.inputs.clone()));
                    m.handle_incoming(now, conn);
                }
                self.mesh = Some(m);
            }
            Err(e) => tracing::warn!("occl-ras: cannot start the mesh: {e}"),
        }
    }

    fn drain(&mut self) {
        loop {
            let Some(a) = self.mesh.as_mut().and_then(Mesh::poll_action) else { return };
            match a {
                Action::Connect(peer) => self.connect(peer),
                Action::Send(conn, msg) => {
                    if let Some(h) = self.conns.get(&conn) {
                        h.send(&msg);
                    }
                }
                Action::Close(conn) => {
                    if let Some(h) = self.conns.remove(&conn) {
                        tokio::spawn(h.close());
                    }
                }
                Action::Event(event) => {
                    let peer = self.event_peer(&event);
                    let _ = self.sh.events.send(Event { unix_ms: unix_ns() / 1_000_000, event, peer });
                }
                Action::MetricsDone(r) => {
                    if let (Some(reply), Some(m)) = (self.pending_metrics.remove(&r.token), self.mesh.as_ref()) {
                        let _ = reply.send(node_metrics(m.table(), r));
                    }
                }
                Action::StatusDone(result) => {
                    if let (Some(reply), Some(m)) = (self.pending.remove(&result.token), self.mesh.as_ref()) {
                        let table = m.table().clone();
                        let known = self.known(&table);
                        let _ = reply.send(Ok(Gathered { result, table, known, unix_ns: unix_ns() }));
                    }
                }
            }
        }
    }

    /// This process's communicators with each rank's process, for the analysis (who an absent rank is).
    fn known(&self, table: &PeerTable) -> Vec<KnownComm> {
        self.comms
            .iter()
            .map(|(id, (size, addrs))| KnownComm {
                id: *id,
                size: *size,
                members: addrs
                    .iter()
                    .filter_map(|(r, a)| {
                        Some(KnownRank { rank: *r, peer: table.find(a)?, cuda_dev: None, nvml_dev: None })
                    })
                    .collect(),
            })
            .collect()
    }

    fn event_peer(&self, e: &crate::mesh::MonitorEvent) -> Option<PeerAddr> {
        use crate::mesh::MonitorEvent as E;
        let p = match e {
            E::PeerConnected { peer }
            | E::PeerDisconnected { peer }
            | E::PeerUnresponsive { peer, .. }
            | E::PeerAlive { peer, .. }
            | E::PeerDead { peer, .. } => *peer,
            E::AuthFailed { peer: Some(peer), .. } => *peer,
            _ => return None,
        };
        self.mesh.as_ref().and_then(|m| m.table().get(p)).cloned()
    }

    fn connect(&mut self, peer: PeerId) {
        let Some(addr) = self.mesh.as_ref().and_then(|m| m.table().get(peer)).map(|p| p.addr.clone()) else { return };
        let conn = self.alloc_conn();
        let tx = self.inputs.clone();
        let limit = self.sh.cfg.mesh.connect_timeout;
        tokio::spawn(async move {
            let res = tokio::time::timeout(limit, tokio::net::TcpStream::connect(addr.as_str())).await;
            let _ = match res {
                Ok(Ok(stream)) => tx.send(Input::Connected { conn, peer, stream }),
                Ok(Err(e)) => {
                    tracing::debug!("occl-ras: connecting to {addr}: {e}");
                    tx.send(Input::ConnectFailed { peer })
                }
                Err(_) => tx.send(Input::ConnectFailed { peer }),
            };
        });
    }
}

/// A node metrics fetch's outcome with each process named by its pid.
fn node_metrics(table: &PeerTable, r: MetricsResult) -> NodeMetrics {
    let pid = |p| table.get(p).map_or(0, |a| a.pid);
    let parts = r.answers.into_iter().map(|(p, text)| (pid(p), text)).collect();
    NodeMetrics { parts, timed_out: r.timed_out.len(), dead: r.dead.len() }
}

/// Fresh randomness for the mesh's nonces and ids.
fn seed() -> [u8; 16] {
    let mut s = [0u8; 16];
    match std::fs::File::open("/dev/urandom").and_then(|mut f| std::io::Read::read_exact(&mut f, &mut s)) {
        Ok(()) => s,
        Err(_) => {
            // Unpredictability matters only for nonces; mix what the process has.
            let t = unix_ns().to_le_bytes();
            let p = u64::from(std::process::id()).to_le_bytes();
            s[..8].copy_from_slice(&t);
            s[8..].copy_from_slice(&p);
            s
        }
    }
}
