//! Creating a communicator: the bootstrap, the peer table, the transports, the tuner every
//! rank agrees on, the record, the flight recorder and the RAS mesh; from one id, several
//! (scalable), threads of one process, or the launcher's environment.

use super::{check_nranks, Comm, Inner, Successor};
use crate::bootstrap::{self, PeerInfo};
use crate::coll::order::RingOrder;
use crate::coll::tune::Tuner;
use crate::config::{Config, TransportKind};
use crate::error::{Error, ErrorKind, Result};
use crate::id::UniqueId;
use crate::profile::Profiling;
use crate::record::OpRecord;
use crate::transport;
use occl_ras_proto::mesh::PeerAddr;
use occl_ras_proto::record::{CommId, RankInfo};
use occl_telemetry::flight::{FlightComm, FlightRecorder};
use std::net::{IpAddr, Ipv4Addr, TcpListener};
use std::sync::atomic::{AtomicBool, AtomicU32};
use std::sync::{Arc, Mutex};

/// FNV-1a: the communicator id's host and pid parts (NCCL's commId has the same three parts).
fn fnv(b: &[u8]) -> u64 {
    b.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &x| (h ^ u64::from(x)).wrapping_mul(0x100_0000_01b3))
}

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
    let boot = occl_events::files::read_to_string_capped(
        std::path::Path::new("/proc/sys/kernel/random/boot_id"),
        occl_events::files::MAX_SYSTEM_FILE,
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

    fn init_ids(nranks: usize, ids: &[UniqueId], rank: usize, mut config: Config) -> Result<Comm> {
        crate::log::init(Some(crate::log::DebugLevel::Warn));
        let mut timer = crate::init_timer::InitTimer::start();
        // The span clock measures its TSC rate over its first milliseconds; start it now, so that
        // the bootstrap's time covers them and the first operation reads the calibrated clock.
        let _ = crate::record::now_ns();
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
        // Every listener of the rank binds one address, which the communicator keeps (a split's
        // root listens there too).
        let bind = crate::netif::listen_ip(config.listen_addr, config.socket_ifname.as_deref(), id.addr)?;
        config.listen_addr = Some(bind);
        let listener =
            TcpListener::bind((bind, 0)).map_err(|e| Error::sys(format!("bind a transport listener on {bind}"), e))?;
        // Every lower tcp peer dials at once (and a shrink's ranks join here).
        bootstrap::root::deepen_backlog(&listener);
        // Kept open after the transports connect: a shrink's new root listens on it.
        let kept_listener = listener.try_clone().ok();
        let listen = listener.local_addr().map_err(|e| Error::sys("transport listener address", e))?;
        let mut boot = bootstrap::Client::join_any(ids, rank, nranks, bind, config.timeout)?;
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
        dump_topology(&config, host, first_on_host);
        let mut me_tab = table.clone();
        let comm_id = table[0].comm_id;
        for p in &mut me_tab {
            p.comm_id = comm_id;
        }
        let mut hosts: Vec<&str> = me_tab.iter().map(|p| p.host_id.as_str()).collect();
        hosts.sort_unstable();
        hosts.dedup();
        let info = occl_events::CommInfo {
            comm_name: None,
            comm_hash: comm_id,
            n_nodes: hosts.len() as i32,
            nranks: nranks as i32,
            rank: rank as i32,
        };
        let mut prof = Profiling::new();
        let net_prof = transport::tcp::NetProf { fanout: prof.fanout.clone(), rank: rank as i32 };
        let transport::Connected { peers, net, slot, lazy } =
            transport::connect_all(&config, rank, &me_tab, &id.secret, listener, Some(net_prof))?;
        timer.lap(crate::init_timer::Phase::Connect);
        // The metrics route depends on the transports (`profile`): sinks are made once they are
        // known, before the first operation.
        let all_shm = lazy.kinds().iter().all(|k| matches!(k, None | Some(TransportKind::Shm)));
        let metrics = prof.attach_profilers(&info, &config.profilers, all_shm);
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
                metrics,
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
        // Threads of one process: loopback, unless OCCL_SOCKET_ADDR says otherwise.
        let ip = config.listen_addr.unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST));
        let ids = (0..nids).map(|_| UniqueId::new_on(ip)).collect::<Result<Vec<_>>>()?;
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
    /// Without `OCCL_SOCKET_ADDR`, a job whose launcher says all its ranks run on this host
    /// (torchrun's `LOCAL_WORLD_SIZE`, Open MPI's `OMPI_COMM_WORLD_LOCAL_SIZE`) binds loopback;
    /// any other binds the interface that reaches the root (`OCCL_SOCKET_IFNAME` to choose).
    pub fn from_env() -> Result<Comm> {
        let mut config = Config::from_env()?;
        let launch = crate::env::detect(&config)?;
        if launch.all_local && config.listen_addr.is_none() {
            config.listen_addr = Some(IpAddr::V4(Ipv4Addr::LOCALHOST));
        }
        let timeout = config.timeout;
        let comm = Comm::init_rank_scalable(launch.nranks, &launch.ids, launch.rank, config);
        if comm.is_err() {
            // A root this process serves may be telling the other ranks why the job failed.
            if let Some(root) = &launch.root {
                root.linger(timeout);
            }
        }
        comm
    }
}

/// `OCCL_TOPO_DUMP_FILE` at init, on the first rank of each host. Best effort: the dump is a
/// diagnostic and nothing in the communicator depends on it, so a failure (an unwritable path,
/// a force-merge group that names no NIC here) is a warning, not a failed init.
fn dump_topology(config: &Config, host: crate::topo::Host, first_on_host: bool) {
    let Some(path) = config.topo_dump_file.as_deref() else { return };
    if !first_on_host {
        return;
    }
    let topo = crate::topo::Topology::detect(host);
    let fusion = match topo.fuse(config.net_merge_level, config.net_force_merge.as_ref()) {
        Ok(f) => Some(f),
        Err(e) => {
            tracing::warn!("occl: topo: NIC fusion left out of the dump: {e}");
            None
        }
    };
    if let Err(e) = crate::topo::dump::write(path, &topo, fusion.as_ref()) {
        tracing::warn!("occl: topo: {e}");
    }
}
