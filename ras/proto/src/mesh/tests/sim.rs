//! An in-memory network of meshes on a virtual clock, in the spirit of quinn-proto's test `Pair`: every process is
//! a [`Mesh`] plus the bookkeeping a driver would do, and every byte goes through the real wire encoder and a
//! streaming [`Decoder`]. Time jumps from one event to the next, so a minute of job time takes milliseconds.
//!
//! Faults: `kill` (SIGKILL: connections reset, connects refused), `freeze`/`thaw` (SIGSTOP/SIGCONT: the kernel
//! still accepts and buffers, the process handles nothing until thawed), and `cut` (a partition: connections
//! across it reset and connects refused, or, silent, everything across it dropped).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use crate::mesh::*;
use crate::record::{CollType, CommId, CommRecord, ProcessRecords, RankInfo, ResultCode};
use crate::wire::{encode, Decoder};

pub const MS: u64 = 1_000_000;
pub const SEC: u64 = 1_000_000_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    Running,
    Frozen,
    Killed,
}

#[derive(Debug)]
enum Ev {
    Timer { gen: u64 },
    Incoming { conn: ConnId },
    Connected { conn: ConnId, peer: PeerId },
    ConnectFailed { peer: PeerId },
    ConnectTimedOut { peer: PeerId },
    Data { conn: ConnId, bytes: Vec<u8> },
    Closed { conn: ConnId },
}

struct End {
    owner: usize,
    other: ConnId,
    decoder: Decoder,
}

pub struct Proc {
    pub mesh: Mesh,
    pub state: State,
    /// What arrived while frozen, handled on thaw.
    inbox: Vec<Ev>,
    timer_gen: u64,
    last_timer: Time,
    spins: u32,
    pub comm: Arc<CommRecord>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cut {
    /// Connections across are reset and connects refused.
    Reset,
    /// Everything across is dropped; connections stay open.
    Silent,
}

pub struct Sim {
    pub now: Time,
    pub procs: Vec<Proc>,
    queue: BTreeMap<(Time, u64), (usize, Ev)>,
    seq: u64,
    ends: HashMap<ConnId, End>,
    next_conn: u64,
    pub latency: Time,
    /// Messages and bytes delivered onto the network, by wire type byte.
    pub sent: [u64; 11],
    pub bytes: [u64; 11],
    pub events: Vec<(Time, usize, MonitorEvent)>,
    pub done: Vec<(Time, usize, GatherResult)>,
    pub metrics_done: Vec<(Time, usize, MetricsResult)>,
    side: Option<(Vec<u8>, Cut)>,
    steps: u64,
}

/// The table entry of process `i`: 8 processes per node, nodes numbered from 10.1.0.0.
pub fn peer_addr(i: usize) -> PeerAddr {
    let node = i / 8;
    let host = format!("10.1.{}.{}", node / 256, node % 256);
    PeerAddr {
        addr: format!("{host}:{}", 40000 + i % 8),
        host,
        pid: 1000 + i as u32,
        cuda_devs: vec![(i % 8) as u32],
        nvml_devs: vec![(i % 8) as u32],
    }
}

pub const SECRET: [u8; 16] = [7; 16];

/// What process `i`'s metrics provider renders.
pub fn metrics_text(i: usize) -> String {
    format!("# TYPE sim_ops_total counter\nsim_ops_total{{rank=\"{i}\"}} {}\n", 10 * i)
}

impl Sim {
    pub fn new(n: usize, cfg: MeshConfig) -> Self {
        Self::with_secrets(n, cfg, |_| SECRET)
    }

    pub fn with_secrets(n: usize, cfg: MeshConfig, secret: impl Fn(usize) -> [u8; 16]) -> Self {
        let table = PeerTable::new((0..n).map(peer_addr).collect()).expect("table");
        let procs = (0..n)
            .map(|i| {
                let p = peer_addr(i);
                let comm = Arc::new(CommRecord::new(RankInfo {
                    comm: CommId { hash: 0xc0ffee, root_host_hash: 1, root_pid_hash: 2 },
                    size: n as u32,
                    rank: i as u32,
                    pid: p.pid,
                    host: p.host.clone(),
                    cuda_dev: Some((i % 8) as u32),
                    nvml_dev: Some((i % 8) as u32),
                }));
                comm.live().set_init_state(ResultCode::Success);
                for _ in 0..10 {
                    comm.live().launch(CollType::AllReduce, 1024, 1);
                    comm.live().complete(CollType::AllReduce);
                }
                let records = Arc::new(ProcessRecords::new());
                records.register(&comm);
                records.set_metrics_provider(Arc::new(move |s: &mut String| s.push_str(&metrics_text(i))));
                let mut seed = [0u8; 16];
                seed[..8].copy_from_slice(&(i as u64).to_le_bytes());
                let mesh = Mesh::new(cfg.clone(), table.clone(), &p.addr, secret(i), seed, records, 0).expect("mesh");
                assert_eq!(mesh.me(), PeerId(i as u32), "table order is construction order");
                Proc { mesh, state: State::Running, inbox: Vec::new(), timer_gen: 0, last_timer: 0, spins: 0, comm }
            })
            .collect();
        let mut sim = Self {
            now: 0,
            procs,
            queue: BTreeMap::new(),
            seq: 0,
            ends: HashMap::new(),
            next_conn: 1,
            latency: 100_000, // 100 us per hop
            sent: [0; 11],
            bytes: [0; 11],
            events: Vec::new(),
            done: Vec::new(),
            metrics_done: Vec::new(),
            side: None,
            steps: 0,
        };
        for p in 0..n {
            sim.drain(p);
        }
        sim
    }

    pub fn n(&self) -> usize {
        self.procs.len()
    }

    pub fn mesh(&self, p: usize) -> &Mesh {
        &self.procs[p].mesh
    }

    fn at(&mut self, t: Time, p: usize, ev: Ev) {
        self.seq += 1;
        self.queue.insert((t, self.seq), (p, ev));
    }

    fn across(&self, a: usize, b: usize) -> Option<Cut> {
        self.side.as_ref().filter(|(s, _)| s[a] != s[b]).map(|(_, c)| *c)
    }

    /// Carries out everything process `p` asked for, then re-arms its timer.
    fn drain(&mut self, p: usize) {
        while let Some(a) = self.procs[p].mesh.poll_action() {
            match a {
                Action::Connect(peer) => {
                    let q = peer.0 as usize;
                    let refused = self.procs[q].state == State::Killed || self.across(p, q) == Some(Cut::Reset);
                    if self.across(p, q) == Some(Cut::Silent) {
                        // No answer at all: the driver's connect timeout (5 s) ends the attempt.
                        self.at(self.now + 5 * SEC, p, Ev::ConnectTimedOut { peer });
                    } else if refused {
                        self.at(self.now + 2 * self.latency, p, Ev::ConnectFailed { peer });
                    } else {
                        let (a, b) = (ConnId(self.next_conn), ConnId(self.next_conn + 1));
                        self.next_conn += 2;
                        self.ends.insert(a, End { owner: p, other: b, decoder: Decoder::handshake() });
                        self.ends.insert(b, End { owner: q, other: a, decoder: Decoder::handshake() });
                        self.at(self.now + self.latency, q, Ev::Incoming { conn: b });
                        self.at(self.now + 2 * self.latency, p, Ev::Connected { conn: a, peer });
                    }
                }
                Action::Send(conn, msg) => {
                    let mut bytes = Vec::new();
                    encode(&msg, &mut bytes).expect("the mesh sends only encodable messages");
                    let ty = usize::from(msg.type_byte());
                    self.sent[ty] += 1;
                    self.bytes[ty] += bytes.len() as u64;
                    let Some(end) = self.ends.get(&conn) else { continue };
                    let other = end.other;
                    let Some(q) = self.ends.get(&other).map(|e| e.owner) else { continue };
                    if self.across(p, q).is_some() {
                        continue;
                    }
                    self.at(self.now + self.latency, q, Ev::Data { conn: other, bytes });
                }
                Action::Close(conn) => {
                    if let Some(end) = self.ends.remove(&conn) {
                        // Across a silent partition the FIN is lost too: the other end stays open, and silent.
                        if let Some(q) = self.ends.get(&end.other).map(|e| e.owner) {
                            if self.across(p, q) != Some(Cut::Silent) {
                                self.at(self.now + self.latency, q, Ev::Closed { conn: end.other });
                            }
                        }
                    }
                }
                Action::Event(e) => self.events.push((self.now, p, e)),
                Action::StatusDone(r) => self.done.push((self.now, p, r)),
                Action::MetricsDone(r) => self.metrics_done.push((self.now, p, r)),
            }
        }
        if let Some(t) = self.procs[p].mesh.poll_timeout() {
            self.procs[p].timer_gen += 1;
            let gen = self.procs[p].timer_gen;
            self.at(t.max(self.now), p, Ev::Timer { gen });
        }
    }

    fn apply(&mut self, p: usize, ev: Ev) {
        let now = self.now;
        match ev {
            Ev::Timer { gen } => {
                if gen != self.procs[p].timer_gen {
                    return;
                }
                // A timer that fires again and again at one instant means a deadline nothing clears.
                let proc = &mut self.procs[p];
                proc.spins = if proc.last_timer == now { proc.spins + 1 } else { 0 };
                proc.last_timer = now;
                assert!(proc.spins < 100, "process {p} spins on a timer at {now}");
                proc.mesh.handle_timeout(now);
            }
            Ev::Incoming { conn } => {
                if !self.ends.contains_key(&conn) {
                    return;
                }
                self.procs[p].mesh.handle_incoming(now, conn);
            }
            Ev::Connected { conn, peer } => {
                if self.ends.contains_key(&conn) {
                    self.procs[p].mesh.handle_connected(now, conn, peer);
                } else {
                    self.procs[p].mesh.handle_connect_failed(now, peer);
                }
            }
            Ev::ConnectFailed { peer } => self.procs[p].mesh.handle_connect_failed(now, peer),
            Ev::ConnectTimedOut { peer } => self.procs[p].mesh.handle_connect_timed_out(now, peer),
            Ev::Data { conn, bytes } => {
                let Some(end) = self.ends.get_mut(&conn) else { return };
                end.decoder.push(&bytes).expect("within bounds");
                let mut msgs = Vec::new();
                while let Some(m) = end.decoder.next().expect("the mesh sends only valid frames") {
                    msgs.push(m);
                }
                for m in msgs {
                    self.procs[p].mesh.handle_msg(now, conn, m);
                    if self.procs[p].mesh.is_authenticated(conn) {
                        if let Some(end) = self.ends.get_mut(&conn) {
                            end.decoder.set_max_frame(crate::wire::MAX_FRAME);
                        }
                    }
                }
            }
            Ev::Closed { conn } => {
                if self.ends.remove(&conn).is_some() {
                    self.procs[p].mesh.handle_closed(now, conn);
                }
            }
        }
    }

    fn dispatch(&mut self, p: usize, ev: Ev) {
        match self.procs[p].state {
            State::Killed => {}
            State::Frozen => {
                if !matches!(ev, Ev::Timer { .. }) {
                    self.procs[p].inbox.push(ev);
                }
            }
            State::Running => {
                // A timer re-armed since is stale; draining for it would re-arm again and stale the live one.
                if matches!(ev, Ev::Timer { gen } if gen != self.procs[p].timer_gen) {
                    return;
                }
                self.apply(p, ev);
                self.drain(p);
            }
        }
    }

    /// Runs every event up to `t`, then sets the clock to `t`.
    pub fn run_until(&mut self, t: Time) {
        while let Some(entry) = self.queue.first_entry() {
            if entry.key().0 > t {
                break;
            }
            let ((when, _), (p, ev)) = entry.remove_entry();
            self.now = when;
            self.steps += 1;
            assert!(self.steps < 100_000_000, "runaway simulation at {when} ns: process {p} {ev:?}");
            self.dispatch(p, ev);
        }
        self.now = t;
    }

    pub fn run_for(&mut self, d: Time) {
        self.run_until(self.now + d);
    }

    /// SIGKILL: the process is gone, its connections reset (the peers read EOF), connects to it are refused.
    pub fn kill(&mut self, p: usize) {
        self.procs[p].state = State::Killed;
        self.procs[p].inbox.clear();
        let mine: Vec<ConnId> = self.ends.iter().filter(|(_, e)| e.owner == p).map(|(c, _)| *c).collect();
        for c in mine {
            if let Some(end) = self.ends.remove(&c) {
                if let Some(q) = self.ends.get(&end.other).map(|e| e.owner) {
                    self.at(self.now + self.latency, q, Ev::Closed { conn: end.other });
                }
            }
        }
    }

    /// SIGSTOP.
    pub fn freeze(&mut self, p: usize) {
        self.procs[p].state = State::Frozen;
    }

    /// SIGCONT: what arrived meanwhile is handled in order, then the timers run.
    pub fn thaw(&mut self, p: usize) {
        self.procs[p].state = State::Running;
        let inbox = std::mem::take(&mut self.procs[p].inbox);
        for ev in inbox {
            self.apply(p, ev);
        }
        let now = self.now;
        self.procs[p].mesh.handle_timeout(now);
        self.drain(p);
    }

    /// Partitions the job into `side[i]` groups.
    pub fn cut(&mut self, side: Vec<u8>, how: Cut) {
        if how == Cut::Reset {
            let across: Vec<(ConnId, usize)> = self
                .ends
                .iter()
                .filter(|(_, e)| self.ends.get(&e.other).is_some_and(|o| side[o.owner] != side[e.owner]))
                .map(|(c, e)| (*c, e.owner))
                .collect();
            for (c, owner) in across {
                self.at(self.now + self.latency, owner, Ev::Closed { conn: c });
            }
        }
        self.side = Some((side, how));
    }

    /// A process leaves cleanly: its goodbyes go out, then it exits.
    pub fn shutdown(&mut self, p: usize) {
        let now = self.now;
        self.procs[p].mesh.shutdown(now);
        self.drain(p);
        self.procs[p].state = State::Killed;
    }

    /// Starts a gather at `p` and runs until it is done (or `budget` plus a second has passed).
    pub fn gather(&mut self, p: usize, budget: Duration) -> (Time, GatherResult) {
        let token = self.done.len() as u64 + 1000;
        let now = self.now;
        self.procs[p].mesh.start_status(now, token, budget);
        self.drain(p);
        let limit = self.now + budget.as_nanos() as u64 + SEC;
        loop {
            if let Some(i) = self.done.iter().position(|(_, q, r)| *q == p && r.token == token) {
                let (t, _, r) = self.done.remove(i);
                return (t - now, r);
            }
            let Some((&(t, _), _)) = self.queue.first_key_value() else { break };
            assert!(t <= limit, "gather at {p} not done by {limit}");
            self.run_until(t);
        }
        panic!("gather at {p} never finished");
    }

    /// Starts a node metrics fetch at `p` and runs until it is done; returns how long it took.
    pub fn fetch_metrics(&mut self, p: usize, timeout: Duration) -> (Time, MetricsResult) {
        let token = self.metrics_done.len() as u64 + 5000;
        let now = self.now;
        self.procs[p].mesh.start_metrics(now, token, timeout);
        self.drain(p);
        let limit = self.now + timeout.as_nanos() as u64 + SEC;
        loop {
            if let Some(i) = self.metrics_done.iter().position(|(_, q, r)| *q == p && r.token == token) {
                let (t, _, r) = self.metrics_done.remove(i);
                return (t - now, r);
            }
            let Some((&(t, _), _)) = self.queue.first_key_value() else { break };
            assert!(t <= limit, "metrics fetch at {p} not done by {limit}");
            self.run_until(t);
        }
        panic!("metrics fetch at {p} never finished");
    }

    /// Events of one kind, as (time, process, event).
    pub fn events_where(&self, f: impl Fn(&MonitorEvent) -> bool) -> Vec<(Time, usize, MonitorEvent)> {
        self.events.iter().filter(|(_, _, e)| f(e)).cloned().collect()
    }

    pub fn total_sent(&self) -> u64 {
        self.sent.iter().sum()
    }

    pub fn reset_counters(&mut self) {
        self.sent = [0; 11];
        self.bytes = [0; 11];
    }

    pub fn alive(&self) -> Vec<usize> {
        (0..self.n()).filter(|&p| self.procs[p].state != State::Killed).collect()
    }
}
