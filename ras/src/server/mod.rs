//! The RAS thread: a tokio current-thread runtime that drives the sans-IO [`Mesh`](crate::mesh::Mesh) over real
//! sockets and serves the client port. Everything here is I/O plumbing; decisions live in the crate's
//! [`mesh`](crate::mesh), [`client`](crate::client), [`analysis`](crate::analysis) and [`report`](crate::report).
//!
//! - [`RasServer::start`] binds the mesh listener (an ephemeral port on the transport address), the client port
//!   (`OCCL_RAS_ADDR` / `NCCL_RAS_ADDR`, default `127.0.0.1:28028`) if no other process of the node owns it, and its
//!   socket among the node's jobs (`node`) before it returns, then runs the thread.
//! - [`RasServer::join`] gives it the job's processes (from a communicator's bootstrap) and its rank records.
//! - The client port tells `ncclras` and HTTP apart by the first bytes of a connection (`client`): NCCL's text
//!   protocol through [`crate::client::ClientSession`], or HTTP (`/metrics`, `/api/v1/status`, `/api/v1/events`,
//!   `/healthz`) through axum (`http`).
//!
//! Inside, a module uses only those under it. From the bottom: what holds no server state (`config`, `admission`,
//! `ending`, `timestamp`, `ask`, and over them `node_dir`, `events`, `seat`); what the tasks share (`shared`); the
//! mesh connections (`conn`), the report and the flight records (`report`, `flight`), and a job's `/metrics`
//! (`metrics`); what answers with them: the asks of the node's other processes (`node`), the client's pick among the
//! node's jobs (`jobs`), HTTP (`http`); on top, the client port (`client`) and the mesh task (`actor`), which starts
//! the rest.

mod actor;
mod admission;
mod ask;
mod client;
mod config;
mod conn;
mod ending;
mod events;
mod flight;
mod http;
mod jobs;
mod metrics;
mod node;
mod node_dir;
mod report;
mod seat;
mod shared;
mod timestamp;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{broadcast, mpsc, oneshot};

use crate::analysis::KnownComm;
use crate::mesh::{GatherResult, MonitorEvent, PeerAddr, PeerTable};
use crate::record::{CommId, CommRecord, ProcessRecords};

pub use config::{RasConfig, RasConfigError, DEFAULT_CLIENT_ADDR, JOB_VARS};
pub use flight::{set_flight_provider, FlightProvider};

/// Monotonic nanoseconds since the server started: the mesh's clock.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Clock(Instant);

impl Clock {
    pub(crate) fn now(&self) -> u64 {
        self.0.elapsed().as_nanos() as u64
    }
}

/// A monitor event with the wall-clock time it happened and the process it concerns, ready to print.
#[derive(Clone, Debug)]
pub struct Event {
    pub unix_ms: u64,
    pub event: MonitorEvent,
    /// The peer's host, pid and address, when known.
    pub peer: Option<PeerAddr>,
}

/// A finished status gather, with what the report needs besides the records.
#[derive(Clone, Debug)]
pub struct Gathered {
    pub result: GatherResult,
    pub table: PeerTable,
    /// The communicators of the answering process, with the process of each rank.
    pub known: Vec<KnownComm>,
    /// Wall-clock time when the gather finished.
    pub unix_ns: u64,
}

/// The metrics of this node's processes, as one scrape collected them.
#[derive(Clone, Debug, Default)]
pub struct NodeMetrics {
    /// Each answering process's pid and its metrics text (this process first).
    pub parts: Vec<(u32, String)>,
    /// Processes of this node that did not answer in time (skipped).
    pub timed_out: usize,
    /// Processes of this node known to be dead (not asked).
    pub dead: usize,
}

/// What the RAS thread is asked to do.
pub(crate) enum Cmd {
    /// A communicator rank of this process was created: its communicator's processes, rank by rank (this one
    /// included), join the mesh's table.
    Join { comm: CommId, size: u32, members: Vec<(u32, PeerAddr)> },
    /// Gather the job's status within `budget`.
    Status { budget: Duration, reply: oneshot::Sender<Result<Gathered, String>> },
    /// Collect the metrics of every process of this node, waiting at most `timeout` for each.
    Metrics { timeout: Duration, reply: oneshot::Sender<NodeMetrics> },
    /// This process has no communicator left: say goodbye to the peers and forget the table (a later communicator
    /// starts a new mesh). Replies once the goodbyes are written.
    Leave { done: oneshot::Sender<()> },
    /// Say goodbye to the peers and stop.
    Shutdown,
}

/// The handle the library keeps: the RAS thread of this process.
pub struct RasServer {
    cmds: mpsc::UnboundedSender<Cmd>,
    events: broadcast::Sender<Event>,
    records: Arc<ProcessRecords>,
    mesh_addr: SocketAddr,
    client_addr: Option<SocketAddr>,
    node: Option<node_dir::NodeDir>,
    owner: Arc<std::sync::atomic::AtomicBool>,
    ending: Arc<ending::Ending>,
    exit_wait: Duration,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl RasServer {
    /// Binds the sockets and starts the RAS thread. The client port is optional: another occl process of the node
    /// may own it (this one answers through it, and takes it over when it is free), and if another program holds it
    /// RAS still runs the mesh, and a warning says what is lost.
    pub fn start(cfg: RasConfig, secret: [u8; 16]) -> std::io::Result<RasServer> {
        let mesh_listener = std::net::TcpListener::bind(SocketAddr::new(cfg.mesh_ip, 0))?;
        mesh_listener.set_nonblocking(true)?;
        let mesh_addr = mesh_listener.local_addr()?;
        // Port 0 is a port of this server's own: nothing to share.
        let node = (cfg.client_addr.port() != 0).then(|| node_dir::open(cfg.client_addr.port())).and_then(|r| {
            r.map_err(|e| {
                tracing::warn!(
                    "occl-ras: no private directory for the jobs sharing the client port {} ({e}); if another \
                         job of this node owns the port, ncclras and /metrics there cannot reach this one",
                    cfg.client_addr
                )
            })
            .ok()
        });
        let node_listener = node.as_ref().and_then(|d| {
            d.bind().map_err(|e| tracing::warn!("occl-ras: cannot listen among the node's jobs: {e}")).ok()
        });
        let node = node.filter(|_| node_listener.is_some());
        let mut take_over = false;
        let client_listener = match client::bind(cfg.client_addr) {
            Ok(l) => Some(l),
            Err(e)
                if e.kind() == std::io::ErrorKind::AddrInUse
                    && node.as_ref().is_some_and(|d| d.owner_elsewhere(Duration::from_millis(500))) =>
            {
                tracing::debug!("occl-ras: another process of this node owns the client port {}", cfg.client_addr);
                take_over = true;
                None
            }
            Err(e) => {
                // A warning, not a note: whoever watches this node (ncclras, a Prometheus scrape, a /healthz probe)
                // would otherwise see this process vanish, or reach another program, with nothing in the log.
                tracing::warn!(
                    "occl-ras: cannot listen on the RAS client address {} (OCCL_RAS_ADDR / NCCL_RAS_ADDR): {e}; \
                     ncclras, /metrics and /healthz cannot reach this process there (another program holds the port, \
                     or the address is not local). The job runs on, RAS still reports this process through the ports \
                     of the job's other processes, and it takes the port once it is free; set OCCL_RAS_ADDR to a \
                     free port",
                    cfg.client_addr
                );
                take_over = e.kind() == std::io::ErrorKind::AddrInUse && node.is_some();
                None
            }
        };
        let client_addr = client_listener.as_ref().and_then(|l| l.local_addr().ok());
        let records = Arc::new(ProcessRecords::new());
        let (cmds, rx) = mpsc::unbounded_channel();
        let (events, _) = broadcast::channel(1024);
        let job: Arc<str> = cfg.job.clone().unwrap_or_else(|| crate::mesh::job_name(&secret)).into();
        let owner = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let ending = Arc::new(ending::Ending::default());
        let exit_wait = cfg.exit_wait;
        let shared = shared::Shared {
            cfg,
            node: node.clone(),
            owner: owner.clone(),
            job,
            secret,
            records: records.clone(),
            events: events.clone(),
            cmds: cmds.clone(),
            mesh_addr,
            ending: ending.clone(),
        };
        let thread = std::thread::Builder::new().name("occl-ras".into()).spawn(move || {
            let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                Ok(rt) => rt,
                Err(e) => {
                    tracing::error!("occl-ras: cannot start the RAS runtime: {e}; RAS is off in this process");
                    return;
                }
            };
            let client = actor::Client { port: client_listener, node: node_listener, take_over };
            rt.block_on(actor::run(shared, rx, mesh_listener, client));
        })?;
        Ok(RasServer {
            cmds,
            events,
            records,
            mesh_addr,
            client_addr,
            node,
            owner,
            ending,
            exit_wait,
            thread: Some(thread),
        })
    }

    /// The mesh listener's address: what this process advertises to its peers.
    pub fn mesh_addr(&self) -> SocketAddr {
        self.mesh_addr
    }

    /// The client port, if it could be bound.
    pub fn client_addr(&self) -> Option<SocketAddr> {
        self.client_addr
    }

    /// The rank records this process reports.
    pub fn records(&self) -> &Arc<ProcessRecords> {
        &self.records
    }

    /// Sets what renders this process's own metrics (occl's telemetry). `/metrics` on the client port serves them,
    /// with every other process's of this node, each labelled with its `pid`.
    pub fn set_metrics_provider(&self, p: crate::record::MetricsProvider) {
        self.records.set_metrics_provider(p);
    }

    /// Registers a communicator rank's record, with the process of each rank of its communicator that runs RAS
    /// (`(rank, process)`, this process included).
    pub fn join(&self, record: &Arc<CommRecord>, members: Vec<(u32, PeerAddr)>) {
        self.records.register(record);
        let _ = self.cmds.send(Cmd::Join { comm: record.info().comm, size: record.info().size, members });
    }

    /// Gathers the job's status (what a client's `STATUS` does), waiting at most `budget` plus a margin.
    pub fn status_blocking(&self, budget: Duration) -> Result<Gathered, String> {
        let (tx, rx) = oneshot::channel();
        self.cmds.send(Cmd::Status { budget, reply: tx }).map_err(|_| "the RAS thread has stopped".to_string())?;
        rx.blocking_recv().map_err(|_| "the RAS thread dropped the request".to_string())?
    }

    /// Says goodbye to the peers (they record that this process left, instead of losing it) and forgets the
    /// table; waits at most `limit` for the goodbyes to be written. Call when the last communicator goes away.
    pub fn leave(&self, limit: Duration) {
        self.ending.left(&self.records);
        let (tx, rx) = oneshot::channel();
        if self.cmds.send(Cmd::Leave { done: tx }).is_ok() {
            let t = Instant::now();
            let mut rx = rx;
            while t.elapsed() < limit {
                match rx.try_recv() {
                    Err(oneshot::error::TryRecvError::Empty) => std::thread::sleep(Duration::from_millis(1)),
                    _ => return,
                }
            }
        }
    }

    /// Call at process exit (an `atexit` handler): unless a communicator of this process failed, the job has ended
    /// here, and a process that owns the client port and has been scraped waits, at most `OCCL_RAS_EXIT_WAIT`, for
    /// a scrape to see `occl_ras_job_running` at 0 (see `ending`). Returns how long it waited.
    pub fn exit_wait(&self) -> Duration {
        let owner = self.owner.load(std::sync::atomic::Ordering::SeqCst);
        self.ending.exit(&self.records, owner, self.exit_wait)
    }

    /// Monitor events as they happen.
    pub fn subscribe(&self) -> broadcast::Receiver<Event> {
        self.events.subscribe()
    }
}

impl Drop for RasServer {
    fn drop(&mut self) {
        let _ = self.cmds.send(Cmd::Shutdown);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        if let Some(d) = &self.node {
            d.unlink();
        }
    }
}

/// Wall-clock milliseconds since the Unix epoch.
pub(crate) fn unix_ns() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
}
