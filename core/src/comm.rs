//! `Comm`: creation (bootstrap + transports), argument checking, and the collective calls.
//!
//! Every call checks its arguments, stamps the operation into the rank record, runs the
//! algorithm on the calling thread, and on failure marks every FIFO so that peers waiting on
//! this rank fail fast with the reason instead of waiting for their timeout. A communicator
//! that failed stays failed (NCCL's async error): later calls say why, and it must be destroyed.

use crate::bootstrap::{self, PeerInfo};
use crate::coll::order::RingOrder;
use crate::coll::plan::{self, Algo, Shape};
use crate::coll::tune::Tuner;
use crate::coll::{self, Ctx};
use crate::config::{Config, TransportKind};
use crate::dtype::{DataType, Element, RedOp};
use crate::error::{Error, ErrorKind, Result};
use crate::id::UniqueId;
use crate::profile::{op::OpDescr, OpProf, Profiling};
use crate::record::{self, CollType, OpRecord};
use crate::register::InPlace;
use crate::transport::fifo::{state, Cause, Desc};
use crate::transport::{self, Peer};
use crate::wait::{Deadline, Drive};
use occl_ras::mesh::PeerAddr;
use occl_ras::record::{CommId, RankInfo};
use occl_telemetry::flight::{FlightComm, FlightRecorder, OpInfo, RootOrPeer};
use occl_telemetry::Note;
use std::net::TcpListener;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

/// A communicator: one rank's membership in a group of `nranks` ranks.
pub struct Comm {
    rank: usize,
    nranks: usize,
    comm_id: u64,
    pub(crate) config: Config,
    pub(crate) table: Vec<PeerInfo>,
    pub(crate) record: Arc<OpRecord>,
    pub(crate) abort: AtomicBool,
    prof: Profiling,
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
    ring: RingOrder,
    /// Registered buffers (`register`), with their own lock: taken inside `inner`'s.
    reg: crate::register::Registry,
    /// Every rank's process id, for the registered path's liveness checks.
    pids: Vec<u32>,
    /// This host's ranks and the cores they share: the registered path's helper threads.
    host_share: (usize, usize),
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
    coll_seq: u32,
    /// NCCL's per-function sequence numbers (the profiler's `seqNumber`), by `CollType`.
    pub(crate) func_seq: [u64; 8],
    pub(crate) p2p_sent: Vec<u32>,
    pub(crate) p2p_received: Vec<u32>,
    pub(crate) failed: Option<Error>,
    /// This rank's tcp links, driven by the thread that runs an operation (none without tcp).
    pub(crate) net: Option<transport::tcp::Net>,
    staging: Vec<u64>,
    /// Connects shm peers on first use (`None` once the communicator is shut down).
    pub(crate) lazy: Option<transport::connect::Lazy>,
}

impl Inner {
    /// The transport to rank `p` by name, connected yet or not ("none" for this rank).
    pub(crate) fn kind_name(&self, p: usize) -> &'static str {
        self.lazy.as_ref().and_then(|l| l.kind(p)).map_or("none", |k| k.name())
    }
}

/// One call, as `run` stamps it: what it is, its arguments, and the bytes it moves.
struct Op {
    coll: CollType,
    count: usize,
    dt: DataType,
    op: Option<RedOp>,
    root: Option<usize>,
    bytes: usize,
    p2p_peer: Option<usize>,
    /// Buffer addresses, for the profiler's descriptors.
    send: usize,
    recv: usize,
    /// Runs on registered windows (`crate::register`): no FIFO, no legs.
    registered: bool,
}

impl Op {
    fn new(coll: CollType, count: usize, dt: DataType, bytes: usize) -> Op {
        Op { coll, count, dt, op: None, root: None, bytes, p2p_peer: None, send: 0, recv: 0, registered: false }
    }
    fn registered(self) -> Op {
        Op { registered: true, ..self }
    }
    fn bufs(self, send: *const u8, recv: *const u8) -> Op {
        Op { send: send as usize, recv: recv as usize, ..self }
    }
    fn op(self, op: RedOp) -> Op {
        Op { op: Some(op), ..self }
    }
    fn root(self, root: usize) -> Op {
        Op { root: Some(root), ..self }
    }
    fn peer(self, peer: usize) -> Op {
        Op { p2p_peer: Some(peer), ..self }
    }
}

/// Bytes an operation reads from its input and writes to its output (`per_rank` = count ×
/// element size, `total` = what `Comm` stamps).
fn io_bytes(coll: CollType, per_rank: usize, total: usize) -> (u64, u64) {
    let (i, o) = match coll {
        CollType::AllGather => (per_rank, total),
        CollType::ReduceScatter => (total, per_rank),
        CollType::Send => (per_rank, 0),
        CollType::Recv => (0, per_rank),
        _ => (total, total),
    };
    (i as u64, o as u64)
}

/// FNV-1a: the communicator id's host and pid parts (NCCL's commId has the same three parts).
fn fnv(b: &[u8]) -> u64 {
    b.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &x| (h ^ u64::from(x)).wrapping_mul(0x100_0000_01b3))
}

/// NCCL's `func` string for the profiler (NCCL spells all-to-all "AlltoAll").
pub(crate) fn nccl_func(coll: CollType) -> &'static str {
    match coll {
        CollType::AllToAll => "AlltoAll",
        c => c.name(),
    }
}

/// No reduction: the descriptor value for collectives that only move data.
pub(crate) const NO_OP: u8 = 0xff;
pub(crate) const NO_ROOT: u32 = u32::MAX;

fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most buf.len() bytes.
    if unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) } != 0 {
        return "unknown".into();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

/// Ranks share memory when they run under one kernel: hostname plus boot id, like NCCL's
/// host hash (a container with its own hostname on the same kernel still gets its own id).
fn host_identity(config: &Config) -> String {
    if let Some(h) = &config.host_id {
        return h.clone();
    }
    let boot = occl_telemetry::files::read_to_string_capped(
        std::path::Path::new("/proc/sys/kernel/random/boot_id"),
        occl_telemetry::files::MAX_SYSTEM_FILE,
    )
    .unwrap_or_default();
    format!("{}:{}", hostname(), boot.trim())
}

/// The communicator's tuner, checked to be the same on every rank: ranks that chose differently
/// would run different algorithms against each other.
fn agreed_tuner(
    config: &Config,
    me: usize,
    table: &[PeerInfo],
    (local, cores): (usize, usize),
    kinds: &[Option<TransportKind>],
    boot: &mut bootstrap::Client,
) -> Result<Tuner> {
    let kinds: Vec<TransportKind> = kinds.iter().flatten().copied().collect();
    let tuner = Tuner::new(config, table.len(), &kinds, local, cores)?;
    let all = boot.all_gather(&tuner.digest().to_le_bytes())?;
    if let Some(r) = all.iter().position(|d| d.as_slice() != tuner.digest().to_le_bytes()) {
        return Err(Error::usage(format!(
            "rank {r} tunes differently from rank {me} (OCCL_ALGO, OCCL_PROTO, OCCL_TUNER_FILE or the transports differ \
             between ranks); every rank must choose alike"
        )));
    }
    Ok(tuner)
}

impl Comm {
    /// Joins rank `rank` of an `nranks`-rank communicator whose root `id` names. Every rank
    /// calls this (each in its own process or thread) with the same `id` and `nranks`.
    pub fn init_rank(nranks: usize, id: &UniqueId, rank: usize, config: Config) -> Result<Comm> {
        Comm::init_ids(nranks, std::slice::from_ref(id), rank, config)
    }

    /// Scalable init (NCCL 2.23's `ncclCommInitRankScalable`): rank r joins the root of
    /// `ids[r * ids.len() / nranks]`, so each id's root serves a share of the ranks and the
    /// roots swap their shares among themselves. Every rank passes the same `ids` in the same
    /// order; the communicator is the same as with one id (rank order, peer table).
    pub fn init_rank_scalable(nranks: usize, ids: &[UniqueId], rank: usize, config: Config) -> Result<Comm> {
        if ids.is_empty() || ids.len() > nranks.max(1) {
            return Err(Error::arg(format!(
                "init_rank_scalable: {} unique ids for nranks={nranks}; pass between 1 and nranks ids",
                ids.len()
            )));
        }
        Comm::init_ids(nranks, ids, rank, config)
    }

    fn init_ids(nranks: usize, ids: &[UniqueId], rank: usize, config: Config) -> Result<Comm> {
        let mut timer = crate::init_timer::InitTimer::start();
        // The job's secret: every rank has every id, and the first one's secret keys the
        // transports, RAS and a later shrink.
        let id = &ids[0];
        check_nranks(nranks)?;
        config.check()?;
        if rank >= nranks {
            return Err(Error::arg(format!("rank {rank} is out of range for nranks={nranks} (ranks are 0..{nranks})")));
        }
        // Before the bootstrap, so that a forced ib that cannot work fails on every rank at once.
        let ib = transport::ib::probe(&config)?;
        let listener = TcpListener::bind((config.listen_addr, 0))
            .map_err(|e| Error::sys(format!("bind a transport listener on {}", config.listen_addr), e))?;
        // Every lower tcp peer dials at once (and a shrink's ranks join here).
        bootstrap::root::deepen_backlog(&listener);
        // Kept open after the transports connect: a shrink's new root listens on it.
        let kept_listener = listener.try_clone().ok();
        let listen = listener.local_addr().map_err(|e| Error::sys("transport listener address", e))?;
        let mut boot = bootstrap::Client::join_any(ids, rank, nranks, config.listen_addr, config.timeout)?;
        let ras = crate::ras::server(&config, &id.secret)?;
        timer.lap(crate::init_timer::Phase::Bootstrap);
        let (cpus, cpu_quota) = crate::topo::cores::this_process();
        let me = PeerInfo {
            rank,
            host_id: host_identity(&config),
            hostname: hostname(),
            pid: std::process::id(),
            listen,
            comm_id: u64::from_le_bytes(crate::id::random_bytes()?[..8].try_into().unwrap_or([0; 8])),
            probe_addr: &crate::transport::shm::PROBE as *const u64 as u64,
            ras_addr: ras.map_or(String::new(), |r| r.mesh_addr().to_string()),
            settings: config.shared(),
            ib,
            cpus,
            cpu_quota,
        };
        let table = boot.all_gather(&me.encode())?.iter().map(|b| PeerInfo::decode(b)).collect::<Result<Vec<_>>>()?;
        for (r, p) in table.iter().enumerate() {
            if p.rank != r {
                return Err(Error::internal(format!("bootstrap table entry {r} claims rank {}", p.rank)));
            }
        }
        // Before anything connects: ranks whose connections would be built differently wait
        // for each other until the timeout otherwise.
        crate::config::check_alike(table.iter().map(|p| p.settings.as_slice()))?;
        timer.lap(crate::init_timer::Phase::AllGather);
        let first_on_host = table.iter().position(|p| p.host_id == table[rank].host_id) == Some(rank);
        let host = crate::topo::Host { name: table[rank].hostname.clone(), hash: fnv(table[rank].host_id.as_bytes()) };
        crate::topo::dump_at_init(&config, host, first_on_host);
        let mut me_tab = table.clone();
        let comm_id = table[0].comm_id;
        for p in &mut me_tab {
            p.comm_id = comm_id;
        }
        let mut hosts: Vec<&str> = me_tab.iter().map(|p| p.host_id.as_str()).collect();
        hosts.sort_unstable();
        hosts.dedup();
        let prof = Profiling::init(&occl_telemetry::CommInfo {
            comm_name: None,
            comm_hash: comm_id,
            n_nodes: hosts.len() as i32,
            nranks: nranks as i32,
            rank: rank as i32,
        });
        let net_prof = transport::tcp::NetProf { fanout: prof.fanout.clone(), rank: rank as i32 };
        let transport::Connected { peers, net, slot, lazy } =
            transport::connect_all(&config, rank, &me_tab, &id.secret, listener, Some(net_prof))?;
        timer.lap(crate::init_timer::Phase::Connect);
        // This host's ranks and the cores they share: the tuner's link and the registered path's
        // helper threads.
        let host_share = bootstrap::host_share(&table, rank);
        let tuner = agreed_tuner(&config, rank, &me_tab, host_share, lazy.kinds(), &mut boot)?;
        timer.lap(crate::init_timer::Phase::AllGather);
        tracing::debug!(
            "occl: rank {rank}/{nranks} of comm {comm_id:016x} ready ({} shm peers{}, tcp to {:?}, slot {slot} B)",
            lazy.kinds().iter().filter(|k| **k == Some(TransportKind::Shm)).count(),
            if config.runtime_connect { ", connected on first use" } else { "" },
            (0..nranks).filter(|&p| lazy.kind(p) == Some(TransportKind::Tcp)).collect::<Vec<_>>(),
        );
        if let Err(e) = occl_telemetry::flight::install_config(&config.flight) {
            tracing::warn!("occl: flight recorder dumps are off: {e}");
        }
        let flight = FlightRecorder::new(
            FlightComm {
                comm_hash: comm_id,
                rank: rank as u32,
                nranks: nranks as u32,
                pid: std::process::id(),
                host: me_tab[rank].hostname.clone(),
                comm_name: None,
            },
            config.flight.capacity,
        );
        let record = Arc::new(OpRecord::new(RankInfo {
            comm: CommId {
                hash: comm_id,
                root_host_hash: fnv(me_tab[0].host_id.as_bytes()),
                root_pid_hash: fnv(&me_tab[0].pid.to_le_bytes()),
            },
            size: nranks as u32,
            rank: rank as u32,
            pid: std::process::id(),
            host: me_tab[rank].listen.ip().to_string(),
            cuda_dev: None,
            nvml_dev: None,
        }));
        if let Some(ras) = ras {
            let peers = me_tab
                .iter()
                .filter(|p| !p.ras_addr.is_empty())
                .map(|p| {
                    let addr = PeerAddr {
                        addr: p.ras_addr.clone(),
                        host: p.listen.ip().to_string(),
                        pid: p.pid,
                        cuda_devs: Vec::new(),
                        nvml_devs: Vec::new(),
                    };
                    (p.rank as u32, addr)
                })
                .collect();
            ras.join(record.shared(), peers);
            crate::ras::joined();
        }
        let ras_joined = AtomicBool::new(ras.is_some());
        let ends = transport::peers::PeerTable::new(&peers);
        let successor = Successor { secret: id.secret, listener: kept_listener, shrinks: AtomicU32::new(0) };
        record.initialized();
        timer.lap(crate::init_timer::Phase::Rest);
        timer.report(rank, nranks, ids.len());
        Ok(Comm {
            rank,
            nranks,
            comm_id,
            config,
            table: me_tab,
            flight,
            tuner,
            ring: RingOrder::host_grouped(&table.iter().map(|p| p.host_id.as_str()).collect::<Vec<_>>()),
            record,
            reg: Default::default(),
            pids: table.iter().map(|p| p.pid).collect(),
            host_share,
            abort: AtomicBool::new(false),
            ends,
            successor,
            prof,
            ras_joined,
            inner: Mutex::new(Inner {
                peers,
                boot: Some(boot),
                slot,
                coll_seq: 0,
                func_seq: [0; 8],
                p2p_sent: vec![0; nranks],
                p2p_received: vec![0; nranks],
                failed: None,
                staging: Vec::new(),
                net,
                lazy: Some(lazy),
            }),
        })
    }

    /// `nranks` ranks in this process, one per thread ("several devices per process"), with
    /// the configuration from the environment. Drive each returned `Comm` from its own thread.
    pub fn init_all(nranks: usize) -> Result<Vec<Comm>> {
        Comm::init_all_with(nranks, Config::from_env()?)
    }

    /// As `init_all`, with an explicit configuration.
    pub fn init_all_with(nranks: usize, config: Config) -> Result<Vec<Comm>> {
        Comm::init_all_scalable(nranks, 1, config)
    }

    /// As `init_all_with`, through `nids` unique ids (scalable init).
    pub fn init_all_scalable(nranks: usize, nids: usize, config: Config) -> Result<Vec<Comm>> {
        check_nranks(nranks)?;
        config.check()?;
        let ids = (0..nids).map(|_| UniqueId::new_on(config.listen_addr)).collect::<Result<Vec<_>>>()?;
        let ids = Arc::new(ids);
        let handles: Vec<_> = (0..nranks)
            .map(|r| {
                let (ids, config) = (ids.clone(), config.clone());
                std::thread::Builder::new()
                    .name(format!("occl-init-{r}"))
                    .stack_size(256 << 10)
                    .spawn(move || Comm::init_rank_scalable(nranks, &ids, r, config))
                    .map_err(|e| Error::sys("spawn an init thread", e))
            })
            .collect::<Result<_>>()?;
        let mut comms = Vec::with_capacity(nranks);
        let mut errs = Vec::new();
        for h in handles {
            match h.join() {
                Ok(Ok(c)) => comms.push(c),
                Ok(Err(e)) => errs.push(e),
                Err(_) => errs.push(Error::internal("an init thread panicked")),
            }
        }
        // One rank's failure (a refused mmap, say) makes every other rank fail with "rank r
        // closed its link in the bootstrap tree" or a timeout: report the cause, not the first consequence.
        let consequence =
            |e: &Error| matches!(e.kind(), ErrorKind::InvalidUsage | ErrorKind::RemoteError | ErrorKind::Timeout);
        match errs.iter().position(|e| !consequence(e)).or((!errs.is_empty()).then_some(0)) {
            Some(i) => Err(errs.swap_remove(i)),
            None => Ok(comms),
        }
    }

    /// Joins a job from the launcher's environment: `OCCL_RANK`/`OCCL_NRANKS`/`OCCL_UNIQUE_ID`
    /// (several ids separated by commas: scalable init),
    /// or torchrun's `RANK`/`WORLD_SIZE`/`MASTER_ADDR`/`MASTER_PORT`, Open MPI's
    /// `OMPI_COMM_WORLD_RANK`/`_SIZE` or Slurm's `SLURM_PROCID`/`SLURM_NTASKS` (the last two
    /// with `OCCL_UNIQUE_ID` or `MASTER_ADDR`/`MASTER_PORT` for the root).
    pub fn from_env() -> Result<Comm> {
        let config = Config::from_env()?;
        let launch = crate::env::detect(&config)?;
        Comm::init_rank_scalable(launch.nranks, &launch.ids, launch.rank, config)
    }

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

    /// Registers `buf` with the communicator (NCCL's `ncclCommWindowRegister`). Collective: every
    /// rank registers its buffer, in the same order. When every rank can reach every other's
    /// buffer — one host over shm, and either thread ranks of one process or buffers from
    /// [`HostBuf`](crate::HostBuf) — the window is shared ([`Handle::shared`](crate::Handle::shared))
    /// and all-reduce and all-gather whose send and recv buffers both lie in shared windows read
    /// the peers' buffers directly (one copy, not two through the FIFOs). Every rank must then
    /// pass buffers at the same offsets of its windows, and the buffers stay registered until
    /// `deregister`. Otherwise the window is inactive and the calls take the normal path.
    pub fn register<T: Element>(&self, buf: &[T]) -> Result<crate::Handle> {
        crate::group::refuse_borrowed("register")?;
        let shm_only = (0..self.nranks).all(|p| p == self.rank || self.transport_to(p) == Some(TransportKind::Shm));
        let span = (buf.as_ptr() as usize, std::mem::size_of_val(buf));
        let comm = self.comm_id;
        self.reg.register(comm, self.rank, &self.pids, span, shm_only, |mine| self.boot_all_gather(mine))
    }

    /// Removes a window that `register` returned. Collective, in the same order on every rank.
    /// Afterwards collectives on the buffer take the normal path.
    pub fn deregister(&self, handle: crate::Handle) -> Result<()> {
        crate::group::refuse_borrowed("deregister")?;
        self.reg.deregister(self.comm_id, handle, |mine| self.boot_all_gather(mine))
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
    /// `occl_telemetry::profiler` reach every communicator). It sees operations that start
    /// after this call; `detach_sink` or `destroy` finalizes it.
    pub fn attach_sink(
        &self,
        sink: Arc<dyn occl_telemetry::Sink>,
    ) -> std::result::Result<occl_telemetry::SinkHandle, occl_telemetry::TooManySinks> {
        self.prof.attach(sink)
    }

    /// Detaches and finalizes a sink from `attach_sink`; `false` if the handle is not this
    /// communicator's. An operation in flight on another thread sends its events to the sinks
    /// it started with, so this waits for it to end.
    pub fn detach_sink(&self, h: occl_telemetry::SinkHandle) -> bool {
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

    /// Leaves the communicator: peers learn that this rank is done, tcp sends are flushed, and
    /// every resource is released.
    pub fn destroy(self) -> Result<()> {
        self.shutdown();
        Ok(())
    }

    fn shutdown(&self) {
        crate::group::forget(self);
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
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether another thread is running an operation (or a lifecycle call) on this
    /// communicator right now.
    pub(crate) fn busy(&self) -> bool {
        matches!(self.inner.try_lock(), Err(std::sync::TryLockError::WouldBlock))
    }

    pub(crate) fn fanout(&self) -> &Arc<occl_telemetry::Fanout> {
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
        let reason = if e.kind() == ErrorKind::Timeout { "timeout" } else { "error" };
        if let Some(Err(de)) = self.flight.dump(reason) {
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
                transport::tcp::lock(l).sweep_steps();
            }
        }
        g.failed = Some(e.duplicate());
        e
    }

    /// Runs one operation: checks the sticky error, stamps the record, runs `f`, and on failure
    /// tells every peer.
    fn run(&self, o: Op, f: impl FnOnce(&mut Ctx<'_>, Algo) -> Result<()>) -> Result<()> {
        let Op { coll, count, dt, op, root, bytes, p2p_peer, send, recv, registered } = o;
        if crate::group::is_open() {
            let call = crate::group::Call { coll, count, dt, op, root, peer: p2p_peer, send, recv };
            return crate::group::defer(self, call);
        }
        // Before anything is stamped: a forced choice that is not supported fails the call alone,
        // on every rank alike, and leaves the communicator usable.
        let choice = self.tuner.choose(coll, count * dt.size())?;
        let algo = choice.algo;
        let algo_name = if registered { crate::register::ALGO } else { algo.name() };
        let mut g = self.lock_usable()?;
        let opseq = match (coll, p2p_peer) {
            (CollType::Send, Some(p)) => {
                g.p2p_sent[p] = g.p2p_sent[p].wrapping_add(1);
                g.p2p_sent[p]
            }
            (CollType::Recv, Some(p)) => {
                g.p2p_received[p] = g.p2p_received[p].wrapping_add(1);
                g.p2p_received[p]
            }
            _ => {
                g.coll_seq = g.coll_seq.wrapping_add(1);
                g.coll_seq
            }
        };
        // A receive checks against what the sender stamps: a Send.
        let wire_coll = if coll == CollType::Recv { CollType::Send } else { coll };
        let desc = Desc::new(
            wire_coll as u8,
            opseq,
            count as u64,
            dt as u8,
            op.map_or(NO_OP, |o| o as u8),
            root.map_or(NO_ROOT, |r| r as u32),
        );
        let t0 = record::now_ns();
        let seq = self.record.launch(coll, bytes as u64, t0);
        g.func_seq[coll as usize] += 1;
        let (in_bytes, out_bytes) = io_bytes(coll, count * dt.size(), bytes);
        let flight = self.flight.enqueue(
            &OpInfo {
                seq,
                coll_seq: g.func_seq[coll as usize],
                op: nccl_func(coll),
                dtype: dt.nccl_name(),
                redop: op.map(RedOp::name),
                count: count as u64,
                in_bytes,
                out_bytes,
                root_or_peer: match (root, p2p_peer) {
                    (Some(r), _) => Some(RootOrPeer::Root(r as u32)),
                    (_, Some(p)) => Some(RootOrPeer::Peer(p as u32)),
                    _ => None,
                },
                algo: algo_name,
                proto: choice.proto.name(),
            },
            t0,
        );
        // The calling thread runs the operation at once: enqueued and started together.
        self.flight.started(flight, t0);
        let inner = &mut *g;
        let (slot, func_seq) = (inner.slot, inner.func_seq[coll as usize]);
        let geo = coll::geometry(algo, choice.proto, slot, self.config.fifo_slots, dt);
        // Rings, chains and trees run on positions in the host-grouped order (`coll::order`).
        let order =
            (matches!(algo, Algo::Ring | Algo::Chain | Algo::Tree) && !self.ring.is_identity()).then_some(&self.ring);
        let prof = OpProf::begin(
            &self.prof.fanout,
            self.rank,
            || OpDescr {
                func: nccl_func(coll),
                p2p: matches!(coll, CollType::Send | CollType::Recv),
                seq_number: func_seq,
                send_buff: send,
                recv_buff: recv,
                count,
                root: root.unwrap_or(0) as i32,
                peer: p2p_peer.map_or(-1, |p| p as i32),
                datatype: dt.nccl_name(),
                algo: if registered { crate::register::ALGO } else { algo.nccl_name() },
                proto: choice.proto.nccl_name(),
                chunk_size: geo.0,
                n_channels: 1,
            },
            || {
                if registered {
                    return Vec::new(); // peers' memory is read directly: no proxy operation
                }
                // Planned in the order the algorithm runs in, reported with real peers.
                let pos = |r: usize| order.map_or(r, |o| o.pos(r));
                let mut legs = plan::legs(&Shape {
                    coll,
                    algo,
                    nranks: self.nranks,
                    rank: pos(self.rank),
                    // Per rank or per block, as each algorithm takes it.
                    count,
                    elem: dt.size(),
                    slice: geo.0,
                    chunk: geo.1,
                    root: pos(root.unwrap_or(0)),
                    peer: p2p_peer.unwrap_or(0),
                });
                for l in &mut legs {
                    l.peer = order.map_or(l.peer, |o| o.rank(l.peer));
                }
                legs
            },
            |p| inner.kind_name(p),
        );
        let res = {
            let mut ctx = Ctx {
                rank: order.map_or(self.rank, |o| o.pos(self.rank)),
                nranks: self.nranks,
                peers: &mut inner.peers,
                lazy: inner.lazy.as_ref(),
                abort: &self.abort,
                deadline: Deadline::after(self.config.timeout),
                desc,
                dt,
                op: op.unwrap_or(RedOp::Sum),
                proto: choice.proto,
                geo,
                staging: &mut inner.staging,
                drive: inner.net.as_ref().map(|n| n as &dyn Drive),
                prof: prof.as_ref(),
                record: &self.record,
                members: Some(&self.ends),
                order,
            };
            f(&mut ctx, algo)
        };
        // Sends still in tcp FIFOs must reach their sockets before the call returns: nothing
        // would move them until the next operation.
        let res = res.and_then(|()| match &inner.net {
            Some(n) => n.flush(&self.abort, &Deadline::after(self.config.timeout)),
            None => Ok(()),
        });
        if let Some(p) = prof {
            p.end();
        }
        match res {
            Ok(()) => {
                self.record.complete(coll);
                self.flight.completed(flight, record::now_ns());
                Ok(())
            }
            Err(e) => {
                let e = if registered { e } else { self.reg.explain(e) };
                self.flight.failed(flight, record::now_ns(), &e.to_string());
                Err(self.poison(&mut g, coll, e))
            }
        }
    }

    /// The registered path of a call whose `send` and `recv` (address, bytes) lie in active
    /// windows; `None` for the normal path (also inside a group, which plans its calls itself).
    fn reg_plan(
        &self,
        send: (usize, usize),
        recv: (usize, usize),
        layout: InPlace,
        desc: &[u64],
    ) -> Result<Option<crate::register::Plan<'_>>> {
        if crate::group::is_open() {
            return Ok(None);
        }
        self.reg.plan(self.rank, send, recv, layout, desc)
    }

    fn reg_env(&self) -> crate::register::Env<'_> {
        // Registered windows are active only with every rank on this host: the tuner's "shared"
        // link is this host's verdict (decided at init).
        crate::register::Env {
            rank: self.rank,
            pids: &self.pids,
            abort: &self.abort,
            deadline: Deadline::after(self.config.timeout),
            patience: if self.tuner.oversubscribed() {
                crate::wait::Patience::Share
            } else {
                crate::wait::Patience::Eager
            },
            threads: self.config.reg_threads,
            host_share: self.host_share,
            record: &self.record,
        }
    }

    fn check_root(&self, root: usize) -> Result<()> {
        if root >= self.nranks {
            return Err(Error::arg(format!(
                "root {root} is out of range for nranks={} (ranks are 0..{})",
                self.nranks, self.nranks
            )));
        }
        Ok(())
    }

    fn check_peer(&self, peer: usize) -> Result<()> {
        if peer >= self.nranks {
            return Err(Error::arg(format!("peer {peer} is out of range for nranks={}", self.nranks)));
        }
        if peer == self.rank && !crate::group::is_open() {
            return Err(Error::usage(format!(
                "rank {peer} sends to or receives from itself; a self send/recv needs a group so both halves can run together"
            )));
        }
        Ok(())
    }

    fn bytes_of(&self, count: usize, blocks: usize, dt: DataType) -> Result<usize> {
        count
            .checked_mul(blocks)
            .and_then(|c| c.checked_mul(dt.size()))
            .filter(|b| *b <= isize::MAX as usize)
            .ok_or_else(|| {
                Error::arg(format!(
                    "count {count} × {blocks} block(s) × {} bytes of {dt} overflows the address space",
                    dt.size()
                ))
            })
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

fn check_ptr(what: &str, p: *const u8, bytes: usize, dt: DataType) -> Result<()> {
    if bytes > 0 && p.is_null() {
        return Err(Error::arg(format!("{what} buffer is null")));
    }
    if bytes > 0 && !(p as usize).is_multiple_of(dt.size()) {
        return Err(Error::arg(format!("{what} buffer {p:p} is not aligned to the {}-byte {dt} element", dt.size())));
    }
    Ok(())
}

/// Ranges [a, a+la) and [b, b+lb) share memory.
fn overlaps(a: *const u8, la: usize, b: *const u8, lb: usize) -> bool {
    let (a, b) = (a as usize, b as usize);
    la > 0 && lb > 0 && a < b + lb && b < a + la
}

/// The raw interface: NCCL's argument order, pointers and an element count. The safe methods
/// below check slice lengths and call these.
impl Comm {
    /// # Safety
    /// `send` must be readable and `recv` writable for `count` elements of `dt`; they may be
    /// the same pointer (in place) but must not otherwise overlap.
    pub unsafe fn all_reduce_raw(
        &self,
        send: *const u8,
        recv: *mut u8,
        count: usize,
        dt: DataType,
        op: RedOp,
    ) -> Result<()> {
        let bytes = self.bytes_of(count, 1, dt)?;
        check_ptr("send", send, bytes, dt)?;
        check_ptr("recv", recv, bytes, dt)?;
        if !std::ptr::eq(send, recv) && overlaps(send, bytes, recv, bytes) {
            return Err(Error::arg("all_reduce: send and recv buffers overlap without being the same (in place)"));
        }
        let o = Op::new(CollType::AllReduce, count, dt, bytes).op(op).bufs(send, recv as *const u8);
        let desc = [CollType::AllReduce as u64, count as u64, dt as u64, op as u64];
        if let Some(plan) = self.reg_plan((send as usize, bytes), (recv as usize, bytes), InPlace::No, &desc)? {
            return self.run(o.registered(), |_, _| plan.all_reduce(&self.reg_env(), count, dt, op));
        }
        self.run(o, |c, algo| coll::all_reduce(c, algo, send, recv, count))
    }

    /// # Safety
    /// At the root `send` is readable for `count` elements; `recv` is writable for `count`
    /// elements on every rank (it may equal `send`).
    pub unsafe fn broadcast_raw(
        &self,
        send: *const u8,
        recv: *mut u8,
        count: usize,
        dt: DataType,
        root: usize,
    ) -> Result<()> {
        self.check_root(root)?;
        let bytes = self.bytes_of(count, 1, dt)?;
        if self.rank == root {
            check_ptr("send", send, bytes, dt)?;
            if !std::ptr::eq(send, recv) && overlaps(send, bytes, recv, bytes) {
                return Err(Error::arg("broadcast: send and recv buffers overlap without being the same (in place)"));
            }
        }
        check_ptr("recv", recv, bytes, dt)?;
        self.run(Op::new(CollType::Broadcast, count, dt, bytes).root(root).bufs(send, recv as *const u8), |c, algo| {
            coll::broadcast(c, algo, send, recv, count, root)
        })
    }

    /// # Safety
    /// `send` readable for `count` elements on every rank; at the root `recv` writable for
    /// `count` elements (it may equal `send`); elsewhere `recv` is not touched.
    pub unsafe fn reduce_raw(
        &self,
        send: *const u8,
        recv: *mut u8,
        count: usize,
        dt: DataType,
        op: RedOp,
        root: usize,
    ) -> Result<()> {
        self.check_root(root)?;
        let bytes = self.bytes_of(count, 1, dt)?;
        check_ptr("send", send, bytes, dt)?;
        if self.rank == root {
            check_ptr("recv", recv, bytes, dt)?;
            if !std::ptr::eq(send, recv) && overlaps(send, bytes, recv, bytes) {
                return Err(Error::arg("reduce: send and recv buffers overlap without being the same (in place)"));
            }
        }
        self.run(
            Op::new(CollType::Reduce, count, dt, bytes).op(op).root(root).bufs(send, recv as *const u8),
            |c, algo| coll::reduce(c, algo, send, recv, count, root),
        )
    }

    /// # Safety
    /// `send` readable for `count` elements, `recv` writable for `nranks * count`; in place
    /// when `send == recv + rank * count` elements.
    pub unsafe fn all_gather_raw(&self, send: *const u8, recv: *mut u8, count: usize, dt: DataType) -> Result<()> {
        let bytes = self.bytes_of(count, 1, dt)?;
        let total = self.bytes_of(count, self.nranks, dt)?;
        check_ptr("send", send, bytes, dt)?;
        check_ptr("recv", recv, total, dt)?;
        let own = recv.wrapping_add(self.rank * bytes) as *const u8;
        if !std::ptr::eq(send, own) && overlaps(send, bytes, recv, total) {
            return Err(Error::arg(
                "all_gather: send overlaps recv without being this rank's block of it (in place: send = recv + rank*count)",
            ));
        }
        let o = Op::new(CollType::AllGather, count, dt, total).bufs(send, recv as *const u8);
        let desc = [CollType::AllGather as u64, count as u64, dt as u64];
        let layout = if std::ptr::eq(send, own) { InPlace::Gather(bytes) } else { InPlace::No };
        if let Some(plan) = self.reg_plan((send as usize, bytes), (recv as usize, total), layout, &desc)? {
            return self.run(o.registered(), |_, _| plan.all_gather(&self.reg_env(), bytes));
        }
        self.run(o, |c, algo| coll::all_gather(c, algo, send, recv, count))
    }

    /// # Safety
    /// `send` readable for `nranks * count` elements, `recv` writable for `count`; in place when
    /// `recv == send + rank * count` elements.
    pub unsafe fn reduce_scatter_raw(
        &self,
        send: *const u8,
        recv: *mut u8,
        count: usize,
        dt: DataType,
        op: RedOp,
    ) -> Result<()> {
        let bytes = self.bytes_of(count, 1, dt)?;
        let total = self.bytes_of(count, self.nranks, dt)?;
        check_ptr("send", send, total, dt)?;
        check_ptr("recv", recv, bytes, dt)?;
        let own = send.wrapping_add(self.rank * bytes);
        if !std::ptr::eq(recv, own) && overlaps(send, total, recv, bytes) {
            return Err(Error::arg(
                "reduce_scatter: recv overlaps send without being this rank's block of it (in place: recv = send + rank*count)",
            ));
        }
        let o = Op::new(CollType::ReduceScatter, count, dt, total).op(op).bufs(send, recv as *const u8);
        let desc = [CollType::ReduceScatter as u64, count as u64, dt as u64, op as u64];
        let layout = if std::ptr::eq(recv, own) { InPlace::Scatter(bytes) } else { InPlace::No };
        if let Some(plan) = self.reg_plan((send as usize, total), (recv as usize, bytes), layout, &desc)? {
            return self.run(o.registered(), |_, _| plan.reduce_scatter(&self.reg_env(), count, dt, op));
        }
        self.run(o, |c, algo| coll::reduce_scatter(c, algo, send, recv, count))
    }

    /// # Safety
    /// `send` readable and `recv` writable for `nranks * count` elements; in place when equal.
    pub unsafe fn all_to_all_raw(&self, send: *const u8, recv: *mut u8, count: usize, dt: DataType) -> Result<()> {
        let total = self.bytes_of(count, self.nranks, dt)?;
        let block = self.bytes_of(count, 1, dt)?;
        check_ptr("send", send, total, dt)?;
        check_ptr("recv", recv, total, dt)?;
        let in_place = std::ptr::eq(send, recv);
        if !in_place && overlaps(send, total, recv, total) {
            return Err(Error::arg("all_to_all: send and recv buffers overlap without being the same (in place)"));
        }
        self.run(Op::new(CollType::AllToAll, count, dt, total).bufs(send, recv as *const u8), |c, _| {
            coll::direct::all_to_all(c, send, recv, block)
        })
    }

    /// # Safety
    /// `buf` readable for `count` elements of `dt`.
    pub unsafe fn send_raw(&self, buf: *const u8, count: usize, dt: DataType, peer: usize) -> Result<()> {
        self.check_peer(peer)?;
        let bytes = self.bytes_of(count, 1, dt)?;
        check_ptr("send", buf, bytes, dt)?;
        self.run(Op::new(CollType::Send, count, dt, bytes).peer(peer).bufs(buf, std::ptr::null()), |c, _| {
            coll::direct::send(c, buf, bytes, peer)
        })
    }

    /// # Safety
    /// `buf` writable for `count` elements of `dt`.
    pub unsafe fn recv_raw(&self, buf: *mut u8, count: usize, dt: DataType, peer: usize) -> Result<()> {
        self.check_peer(peer)?;
        let bytes = self.bytes_of(count, 1, dt)?;
        check_ptr("recv", buf, bytes, dt)?;
        self.run(
            Op::new(CollType::Recv, count, dt, bytes).peer(peer).bufs(std::ptr::null(), buf as *const u8),
            |c, _| coll::direct::recv(c, buf, bytes, peer),
        )
    }
}

fn same_len(what: &str, a: usize, b: usize) -> Result<()> {
    if a != b {
        return Err(Error::arg(format!("{what}: send has {a} elements but recv has {b}; they must be equal")));
    }
    Ok(())
}

fn blocks(what: &str, total: usize, n: usize) -> Result<usize> {
    if !total.is_multiple_of(n) {
        return Err(Error::arg(format!("{what}: {total} elements do not split into {n} equal blocks (one per rank)")));
    }
    Ok(total / n)
}

/// The safe interface on typed slices. Lengths are element counts.
impl Comm {
    /// `recv[i] = op over all ranks of send[i]`.
    pub fn all_reduce<T: Element>(&self, send: &[T], recv: &mut [T], op: RedOp) -> Result<()> {
        crate::group::refuse_borrowed("all_reduce")?;
        same_len("all_reduce", send.len(), recv.len())?;
        // SAFETY: the slices are valid and, being a shared and a mutable borrow, disjoint.
        unsafe { self.all_reduce_raw(send.as_ptr().cast(), recv.as_mut_ptr().cast(), send.len(), T::DTYPE, op) }
    }

    pub fn all_reduce_in_place<T: Element>(&self, buf: &mut [T], op: RedOp) -> Result<()> {
        crate::group::refuse_borrowed("all_reduce_in_place")?;
        let p = buf.as_mut_ptr().cast::<u8>();
        // SAFETY: one valid buffer used as both input and output.
        unsafe { self.all_reduce_raw(p, p, buf.len(), T::DTYPE, op) }
    }

    /// Copies the root's `send` into every rank's `recv`. Off the root `send` is ignored (pass
    /// an empty slice).
    pub fn broadcast<T: Element>(&self, send: &[T], recv: &mut [T], root: usize) -> Result<()> {
        crate::group::refuse_borrowed("broadcast")?;
        if self.rank == root {
            same_len("broadcast", send.len(), recv.len())?;
        }
        // SAFETY: valid slices; send is only read at the root, where its length was checked.
        unsafe { self.broadcast_raw(send.as_ptr().cast(), recv.as_mut_ptr().cast(), recv.len(), T::DTYPE, root) }
    }

    pub fn broadcast_in_place<T: Element>(&self, buf: &mut [T], root: usize) -> Result<()> {
        crate::group::refuse_borrowed("broadcast_in_place")?;
        let p = buf.as_mut_ptr().cast::<u8>();
        // SAFETY: one valid buffer.
        unsafe { self.broadcast_raw(p, p, buf.len(), T::DTYPE, root) }
    }

    /// Reduces every rank's `send` into the root's `recv`. Off the root `recv` is ignored (pass
    /// an empty slice).
    pub fn reduce<T: Element>(&self, send: &[T], recv: &mut [T], op: RedOp, root: usize) -> Result<()> {
        crate::group::refuse_borrowed("reduce")?;
        if self.rank == root {
            same_len("reduce", send.len(), recv.len())?;
        }
        // SAFETY: valid slices; recv is only written at the root, where its length was checked.
        unsafe { self.reduce_raw(send.as_ptr().cast(), recv.as_mut_ptr().cast(), send.len(), T::DTYPE, op, root) }
    }

    pub fn reduce_in_place<T: Element>(&self, buf: &mut [T], op: RedOp, root: usize) -> Result<()> {
        crate::group::refuse_borrowed("reduce_in_place")?;
        let p = buf.as_mut_ptr().cast::<u8>();
        // SAFETY: one valid buffer.
        unsafe { self.reduce_raw(p, p, buf.len(), T::DTYPE, op, root) }
    }

    /// `recv` (nranks × send.len()) gets every rank's `send`, in rank order.
    pub fn all_gather<T: Element>(&self, send: &[T], recv: &mut [T]) -> Result<()> {
        crate::group::refuse_borrowed("all_gather")?;
        let want = send.len().checked_mul(self.nranks).ok_or_else(|| Error::arg("all_gather: count overflows"))?;
        if recv.len() != want {
            return Err(Error::arg(format!(
                "all_gather: recv has {} elements but needs nranks × send = {} × {} = {want}",
                recv.len(),
                self.nranks,
                send.len()
            )));
        }
        // SAFETY: valid, disjoint slices of the checked lengths.
        unsafe { self.all_gather_raw(send.as_ptr().cast(), recv.as_mut_ptr().cast(), send.len(), T::DTYPE) }
    }

    /// In place: this rank's contribution is already at `buf[rank * len/nranks ..]`.
    pub fn all_gather_in_place<T: Element>(&self, buf: &mut [T]) -> Result<()> {
        crate::group::refuse_borrowed("all_gather_in_place")?;
        let count = blocks("all_gather_in_place", buf.len(), self.nranks)?;
        let p = buf.as_mut_ptr();
        // SAFETY: block `rank` lies within buf.
        unsafe {
            let own = p.add(self.rank * count).cast::<u8>();
            self.all_gather_raw(own, p.cast(), count, T::DTYPE)
        }
    }

    /// `recv` (send.len() / nranks) gets the reduction of every rank's block `rank` of `send`.
    pub fn reduce_scatter<T: Element>(&self, send: &[T], recv: &mut [T], op: RedOp) -> Result<()> {
        crate::group::refuse_borrowed("reduce_scatter")?;
        let want = recv.len().checked_mul(self.nranks).ok_or_else(|| Error::arg("reduce_scatter: count overflows"))?;
        if send.len() != want {
            return Err(Error::arg(format!(
                "reduce_scatter: send has {} elements but needs nranks × recv = {} × {} = {want}",
                send.len(),
                self.nranks,
                recv.len()
            )));
        }
        // SAFETY: valid, disjoint slices of the checked lengths.
        unsafe { self.reduce_scatter_raw(send.as_ptr().cast(), recv.as_mut_ptr().cast(), recv.len(), T::DTYPE, op) }
    }

    /// In place: the result lands in `buf[rank * len/nranks ..][..len/nranks]`.
    pub fn reduce_scatter_in_place<T: Element>(&self, buf: &mut [T], op: RedOp) -> Result<()> {
        crate::group::refuse_borrowed("reduce_scatter_in_place")?;
        let count = blocks("reduce_scatter_in_place", buf.len(), self.nranks)?;
        let p = buf.as_mut_ptr();
        // SAFETY: block `rank` lies within buf.
        unsafe {
            let own = p.add(self.rank * count).cast::<u8>();
            self.reduce_scatter_raw(p.cast(), own, count, T::DTYPE, op)
        }
    }

    /// Block j of `send` goes to rank j; block i of `recv` comes from rank i.
    pub fn all_to_all<T: Element>(&self, send: &[T], recv: &mut [T]) -> Result<()> {
        crate::group::refuse_borrowed("all_to_all")?;
        same_len("all_to_all", send.len(), recv.len())?;
        let count = blocks("all_to_all", send.len(), self.nranks)?;
        // SAFETY: valid, disjoint slices.
        unsafe { self.all_to_all_raw(send.as_ptr().cast(), recv.as_mut_ptr().cast(), count, T::DTYPE) }
    }

    pub fn all_to_all_in_place<T: Element>(&self, buf: &mut [T]) -> Result<()> {
        crate::group::refuse_borrowed("all_to_all_in_place")?;
        let count = blocks("all_to_all_in_place", buf.len(), self.nranks)?;
        let p = buf.as_mut_ptr().cast::<u8>();
        // SAFETY: one valid buffer.
        unsafe { self.all_to_all_raw(p, p, count, T::DTYPE) }
    }

    /// Sends `buf` to `peer`, which must call `recv` with the same count and type.
    pub fn send<T: Element>(&self, buf: &[T], peer: usize) -> Result<()> {
        crate::group::refuse_borrowed("send")?;
        // SAFETY: a valid slice.
        unsafe { self.send_raw(buf.as_ptr().cast(), buf.len(), T::DTYPE, peer) }
    }

    pub fn recv<T: Element>(&self, buf: &mut [T], peer: usize) -> Result<()> {
        crate::group::refuse_borrowed("recv")?;
        // SAFETY: a valid slice.
        unsafe { self.recv_raw(buf.as_mut_ptr().cast(), buf.len(), T::DTYPE, peer) }
    }
}

impl Drop for Comm {
    fn drop(&mut self) {
        self.shutdown();
    }
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
