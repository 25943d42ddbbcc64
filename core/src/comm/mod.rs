//! `Comm`: one rank's membership in a communicator: what it was created with (`init.rs`), its
//! operation state behind one lock (`Inner`), and how it fails and leaves. Operations reach it
//! through the pipeline `api` → `launch` → `exec`; a communicator that failed stays failed
//! (NCCL's async error): later calls say why, and it must be destroyed.

mod init;

use crate::bootstrap::{self, PeerInfo};
use crate::coll::order::RingOrder;
use crate::coll::tune::Tuner;
use crate::config::{Config, TransportKind};
use crate::error::{Error, ErrorKind, Result};
use crate::op::nccl_func;
use crate::profile::Profiling;
use crate::record::{CollType, OpRecord};
use crate::sync::lock;
use crate::transport::fifo::{state, Cause};
use crate::transport::{self, Peer};
use occl_events::Note;
use occl_telemetry::flight::FlightRecorder;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

/// A communicator: one rank's membership in a group of `nranks` ranks.
pub struct Comm {
    pub(crate) rank: usize,
    pub(crate) nranks: usize,
    pub(crate) comm_id: u64,
    pub(crate) config: Config,
    pub(crate) table: Vec<PeerInfo>,
    pub(crate) record: Arc<OpRecord>,
    pub(crate) abort: AtomicBool,
    pub(crate) prof: Profiling,
    /// This rank joined the process's RAS mesh and has not left it yet.
    ras_joined: AtomicBool,
    /// The last operations of this rank (`OCCL_FLIGHT_RECORDER_SIZE`), for dumps and RAS.
    pub(crate) flight: Arc<FlightRecorder>,
    /// Every connected peer's ends, outside the operation lock: abort and failure propagation.
    pub(crate) ends: transport::peers::PeerTable,
    /// What a shrink needs to start a successor without the failed ranks.
    pub(crate) successor: Successor,
    /// Picks each operation's algorithm and protocol.
    pub(crate) tuner: Tuner,
    /// The ring, chain and tree order: ranks of one host next to each other.
    pub(crate) ring: RingOrder,
    /// Registered buffers (`register`), with their own lock: taken inside `inner`'s.
    pub(crate) reg: crate::register::Registry,
    /// Every rank's process id, for the registered path's liveness checks.
    pub(crate) pids: Vec<u32>,
    /// This host's ranks and the cores they share: the registered path's helper threads.
    pub(crate) host_share: (usize, usize),
    inner: Mutex<Inner>,
}

/// What a shrink needs to start its successor (`lifecycle/shrink.rs`) without a round of
/// address exchange that the failed ranks could not take part in.
pub(crate) struct Successor {
    /// The job secret of this communicator (the successor's is derived from it).
    pub secret: [u8; 16],
    /// This rank's transport listener (its address is in every peer's table), kept open so
    /// that a shrink whose new rank 0 this rank is can serve the new root on it.
    pub listener: Option<std::net::TcpListener>,
    /// Shrinks started from this communicator; part of each successor's secret.
    pub shrinks: AtomicU32,
}

pub(crate) struct Inner {
    pub(crate) peers: Vec<Option<Peer>>,
    pub(crate) boot: Option<bootstrap::Client>,
    pub(crate) slot: usize,
    pub(crate) coll_seq: u32,
    /// NCCL's per-function sequence numbers (the profiler's `seqNumber`), by `CollType`.
    pub(crate) func_seq: [u64; 8],
    pub(crate) p2p_sent: Vec<u32>,
    pub(crate) p2p_received: Vec<u32>,
    pub(crate) failed: Option<Error>,
    /// This rank's tcp links, driven by the thread that runs an operation (none without tcp).
    pub(crate) net: Option<transport::tcp::Net>,
    pub(crate) staging: Vec<u64>,
    /// Connects shm peers on first use (`None` once the communicator is shut down).
    pub(crate) lazy: Option<transport::connect::Lazy>,
    /// This rank's Prometheus series on the direct route (`profile`), bumped by the thread that
    /// runs an operation.
    pub(crate) metrics: Option<occl_telemetry::prometheus::RankMetrics<'static>>,
}

impl Inner {
    /// The transport to rank `p` by name, connected yet or not ("none" for this rank).
    pub(crate) fn kind_name(&self, p: usize) -> &'static str {
        self.lazy.as_ref().and_then(|l| l.kind(p)).map_or("none", |k| k.name())
    }
}

impl Comm {
    pub fn rank(&self) -> usize {
        self.rank
    }

    pub fn nranks(&self) -> usize {
        self.nranks
    }

    /// The communicator's id (the same on every rank), as RAS and logs print it.
    pub fn id(&self) -> u64 {
        self.comm_id
    }

    /// Whether occl's core bumps this rank's Prometheus series itself (the direct route: the
    /// process's exporter on, every peer over shm, the process's profilers); otherwise, with
    /// metrics on, they come from its events through the span collector.
    pub fn direct_metrics(&self) -> bool {
        self.inner.lock().is_ok_and(|g| g.metrics.is_some())
    }

    /// Moves this rank's metrics to the span route (`Profiling::metrics_to_spans`).
    #[cfg(feature = "cuda")]
    pub(crate) fn metrics_to_spans(&mut self) {
        if let Ok(inner) = self.inner.get_mut() {
            self.prof.metrics_to_spans(&mut inner.metrics);
        }
    }

    /// The ranks this rank has a connection to, in ascending order. tcp peers connect at init;
    /// shm peers on their first operation together (`OCCL_RUNTIME_CONNECT=0`: at init). Does
    /// not wait for an operation in flight.
    pub fn connected_peers(&self) -> Vec<usize> {
        let mut v: Vec<usize> = self.ends.ends().iter().map(|e| e.peer).collect();
        v.sort_unstable();
        v
    }

    /// Rank `rank`'s process id and host name, as the bootstrap exchanged them.
    pub fn peer_process(&self, rank: usize) -> Option<(u32, &str)> {
        self.table.get(rank).map(|p| (p.pid, p.hostname.as_str()))
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Launched/completed counters and the operation in flight.
    pub fn record(&self) -> &OpRecord {
        &self.record
    }

    /// This rank's flight recorder: its last operations with their state and times
    /// (`dump_to_dir`, `snapshot`, `last_in_flight`).
    pub fn flight_recorder(&self) -> &Arc<FlightRecorder> {
        &self.flight
    }

    /// The transport to `peer` (`None` for this rank itself or out of range).
    pub fn transport_to(&self, peer: usize) -> Option<TransportKind> {
        let me = self.table.get(self.rank)?;
        let p = self.table.get(peer)?;
        if peer == self.rank {
            return None;
        }
        transport::select(&self.config, me, p).ok()
    }

    /// "shm", "tcp", "ib" or a `+`-joined mix ("shm+tcp"): what this communicator's peers use.
    pub fn transport_summary(&self) -> &'static str {
        let kinds: Vec<_> = (0..self.nranks).filter_map(|p| self.transport_to(p)).collect();
        let shm = kinds.contains(&TransportKind::Shm);
        let tcp = kinds.contains(&TransportKind::Tcp);
        let ib = kinds.contains(&TransportKind::Ib);
        match (shm, tcp, ib) {
            (true, true, true) => "shm+tcp+ib",
            (true, true, false) => "shm+tcp",
            (true, false, true) => "shm+ib",
            (false, true, true) => "tcp+ib",
            (false, true, false) => "tcp",
            (false, false, true) => "ib",
            _ => "shm",
        }
    }

    /// The algorithm this communicator runs for `coll` when each rank contributes `bytes` (per
    /// block for all-gather and reduce-scatter): `"ring"`, `"tree"`, `"pat"`, `"one-shot"`,
    /// `"chain"` or `"direct"` (what benchmarks and logs report), or `"none"` where `OCCL_ALGO` /
    /// `OCCL_PROTO` leave nothing supported (the call then fails with `InvalidUsage`).
    pub fn algorithm(&self, coll: CollType, bytes: usize) -> &'static str {
        self.tuner.choose(coll, bytes).map_or("none", |c| c.algo.name())
    }

    /// The protocol this communicator runs for `coll` with `bytes` per rank: `"simple"` or `"ll"`, or
    /// `"none"` as for `algorithm`.
    pub fn protocol(&self, coll: CollType, bytes: usize) -> &'static str {
        self.tuner.choose(coll, bytes).map_or("none", |c| c.proto.name())
    }

    /// The tuner's predicted µs for `coll` with `bytes` per rank (per block for all-gather and
    /// reduce-scatter), priced for the algorithm and protocol it would choose; `InvalidUsage`
    /// where `OCCL_ALGO`/`OCCL_PROTO` leave nothing, as for the call itself.
    pub fn predicted_us(&self, coll: CollType, bytes: usize) -> Result<f64> {
        self.tuner.predict(coll, bytes)
    }

    /// Attaches a profiler sink to this communicator alone (the registered profilers of
    /// `occl_events::profiler` reach every communicator). It sees operations that start
    /// after this call; `detach_sink` or `destroy` finalizes it.
    pub fn attach_sink(
        &self,
        sink: Arc<dyn occl_events::Sink>,
    ) -> std::result::Result<occl_events::SinkHandle, occl_events::TooManySinks> {
        self.prof.attach(sink)
    }

    /// Detaches and finalizes a sink from `attach_sink`; `false` if the handle is not this
    /// communicator's. An operation in flight on another thread sends its events to the sinks
    /// it started with, so this waits for it to end.
    pub fn detach_sink(&self, h: occl_events::SinkHandle) -> bool {
        self.prof.detach(h)
    }

    /// Makes every operation in flight on this communicator, and every later one, fail. Safe to
    /// call from another thread while a collective runs.
    /// Peers learn it at once, whether or not this rank is inside a call: every FIFO end of
    /// this rank is marked aborted, so a peer waiting on this rank fails too.
    pub fn abort(&self) {
        self.abort.store(true, Ordering::SeqCst);
        self.reg.fail();
        self.record.aborted();
        let cause = Cause { origin: self.rank as u32, state: state::ABORTED };
        self.ends.fail_peers(state::ABORTED, cause);
    }

    /// Closes every link (peers learn that this rank is done, tcp sends are flushed) and
    /// releases every resource; the API's `destroy` and `Drop` call it.
    pub(crate) fn shutdown(&self) {
        let mut g = self.lock_any();
        let how = if g.failed.is_some() || self.abort.load(Ordering::Relaxed) { state::ABORTED } else { state::CLOSED };
        self.record.destroyed();
        for p in g.peers.iter_mut().flatten() {
            p.close(how);
        }
        g.peers.clear();
        g.boot = None;
        drop(g);
        self.prof.finalize();
        if self.ras_joined.swap(false, Ordering::SeqCst) {
            crate::ras::left();
        }
    }

    /// Every rank's `mine`, through the bootstrap (a collective call: every rank makes it).
    pub(crate) fn boot_all_gather(&self, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
        let mut g = self.lock_usable()?;
        match g.boot.as_mut() {
            Some(b) => b.all_gather(mine),
            None => Err(Error::usage("the communicator's bootstrap connection is closed")),
        }
    }

    pub(crate) fn lock_any(&self) -> MutexGuard<'_, Inner> {
        lock(&self.inner)
    }

    /// Whether another thread is running an operation (or a lifecycle call) on this
    /// communicator right now.
    pub(crate) fn busy(&self) -> bool {
        matches!(self.inner.try_lock(), Err(std::sync::TryLockError::WouldBlock))
    }

    pub(crate) fn fanout(&self) -> &Arc<occl_events::Fanout> {
        &self.prof.fanout
    }

    /// Locks the operation state of a communicator that can run operations: not failed,
    /// aborted or destroyed.
    pub(crate) fn lock_usable(&self) -> Result<MutexGuard<'_, Inner>> {
        let g = self
            .inner
            .lock()
            .map_err(|_| Error::internal("the communicator was poisoned by a panic in another thread; destroy it"))?;
        if let Some(e) = &g.failed {
            return Err(Error::usage(format!("the communicator failed earlier and must be destroyed: {e}")));
        }
        if self.abort.load(Ordering::Relaxed) {
            return Err(Error::usage("the communicator was aborted"));
        }
        if g.boot.is_none() {
            return Err(Error::usage("the communicator was destroyed"));
        }
        Ok(g)
    }

    /// The communicator failed with `e` in an operation of type `coll`: the record says so, the
    /// flight recorder dumps, every peer learns why (so nobody waits on this rank for its
    /// timeout), and later calls get the error. Returns `e`.
    pub(crate) fn poison(&self, g: &mut Inner, coll: CollType, e: Error) -> Error {
        self.record.failed(&e);
        self.prof.fanout.note(&Note::OpFailed { func: nccl_func(coll), kind: e.kind().name() });
        if let Some(m) = &g.metrics {
            m.failed(nccl_func(coll), e.kind().name());
        }
        // The reason names the failure (and so the dead or failing peer); the last entry is the
        // operation.
        let kind = if e.kind() == ErrorKind::Timeout { "timeout" } else { "error" };
        if let Some(Err(de)) = self.flight.dump(&format!("{kind}: {e}")) {
            tracing::warn!("occl: writing the flight recorder dump failed: {de}");
        }
        // This rank's own state is its failure when it started here, else ABORTED (it failed
        // because of another rank, which the cause names).
        let cause = self.ends.cause_of(&e, self.rank);
        let how = if cause.origin as usize == self.rank { cause.state } else { state::ABORTED };
        tracing::error!("occl: rank {} {} failed: {e}", self.rank, coll.name());
        self.reg.fail();
        for p in g.peers.iter().flatten() {
            p.fail(how, cause);
            if let Some(l) = &p.tcp {
                lock(l).sweep_steps();
            }
        }
        g.failed = Some(e.duplicate());
        e
    }
}

/// A communicator size init accepts: 1 to [`crate::config::MAX_NRANKS`].
pub(crate) fn check_nranks(nranks: usize) -> Result<()> {
    if !(1..=crate::config::MAX_NRANKS).contains(&nranks) {
        return Err(Error::arg(format!(
            "nranks={nranks}: a communicator has between 1 and {} ranks",
            crate::config::MAX_NRANKS
        )));
    }
    Ok(())
}

impl std::fmt::Debug for Comm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Comm")
            .field("rank", &self.rank)
            .field("nranks", &self.nranks)
            .field("id", &format_args!("{:016x}", self.comm_id))
            .finish()
    }
}
