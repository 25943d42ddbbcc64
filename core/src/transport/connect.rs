//! Lazy connection of shared-memory peers (NCCL's runtime connect): a pair's FIFOs are made the
//! first time an operation needs the pair, by whichever side gets there first, with no
//! handshake. Init then costs O(nranks) however many ranks share the host; a ring touches two
//! peers per rank, not nranks − 1.
//!
//! Ranks in other processes meet in a named segment (`shm::attach`); ranks that are threads of
//! one process meet in anonymous memory through a process-wide registry, which costs no
//! /dev/shm name and no file descriptor.

use super::fifo::{self, Direct, Liveness, RecvFifo, Region, SendFifo};
use super::wait::Patience;
use super::{shm, Peer};
use crate::config::{Config, TransportKind};
use crate::error::{Error, Result};
use crate::lifecycle::Lifecycle;
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, LazyLock, Mutex, MutexGuard};
use std::time::Duration;

/// What a rank needs to connect any shm peer later, fixed at init.
pub(crate) struct Lazy {
    comm_id: u64,
    me: usize,
    /// Per rank: its process id and the address of its `shm::PROBE` (for the CMA test).
    pids: Vec<u32>,
    probes: Vec<u64>,
    /// Per rank: the transport to it (`None` for this rank).
    kinds: Vec<Option<TransportKind>>,
    nslots: usize,
    slot: usize,
    patience: Patience,
    pointers: bool,
    timeout: Duration,
    /// Membership of this communicator's in-process registry entries (thread ranks).
    _local: Option<LocalRank>,
}

impl Lazy {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        config: &Config,
        comm_id: u64,
        me: usize,
        pids: Vec<u32>,
        probes: Vec<u64>,
        kinds: Vec<Option<TransportKind>>,
        slot: usize,
        patience: Patience,
    ) -> Lazy {
        let my_pid = pids[me];
        let local =
            pids.iter().enumerate().any(|(p, &pid)| p != me && pid == my_pid && kinds[p] == Some(TransportKind::Shm));
        if kinds.contains(&Some(TransportKind::Shm)) {
            super::shm_reap::reap_once();
        }
        Lazy {
            comm_id,
            me,
            pids,
            probes,
            kinds,
            nslots: config.fifo_slots,
            slot,
            patience,
            pointers: config.shm_direct,
            timeout: config.timeout,
            _local: local.then(|| LocalRank::join(comm_id)),
        }
    }

    /// The transport to rank `p` (connected or not); `None` for this rank or out of range.
    pub(crate) fn kind(&self, p: usize) -> Option<TransportKind> {
        self.kinds.get(p).copied().flatten()
    }

    pub(crate) fn kinds(&self) -> &[Option<TransportKind>] {
        &self.kinds
    }

    /// Makes the FIFOs to and from shm peer `p`. The peer does the same whenever it first
    /// needs this rank; data sent before it comes waits in the FIFO.
    pub(crate) fn connect(&self, p: usize) -> Result<Peer> {
        if self.kind(p) != Some(TransportKind::Shm) {
            return Err(Error::internal(format!("no connection to rank {p} (its transport connects at init)")));
        }
        let me = self.me;
        let same_process = self.pids[p] == self.pids[me];
        let (out, inn, names) = if same_process {
            (self.local_region(me, p)?, self.local_region(p, me)?, Vec::new())
        } else {
            let region = |from: usize, to: usize| -> Result<(Arc<Region>, String)> {
                let name = shm::segment_name(self.comm_id, from, to, self.pids[from]);
                let r = shm::attach(&name, self.nslots, self.slot, self.pids[from], self.pids[to], self.timeout)?;
                Ok((Arc::new(r), name))
            };
            let (out, a) = region(me, p)?;
            let (inn, b) = region(p, me)?;
            (out, inn, vec![a, b])
        };
        let direct = if !self.pointers {
            Direct::No
        } else if same_process {
            Direct::SameProcess
        } else if shm::can_read(self.pids[p], self.probes[p]) {
            Direct::Cma(self.pids[p])
        } else {
            tracing::info!("occl: cannot read rank {p}'s memory (process_vm_readv refused); large messages from it go through the FIFO");
            Direct::No
        };
        // Tell the sender whether it may post pointers to this rank.
        inn.header().reader_direct.store((direct != Direct::No) as u32, Ordering::Release);
        let mut send = SendFifo::new(out, self.patience);
        send.pointers = self.pointers;
        let mut recv = RecvFifo::new(inn, self.patience);
        recv.direct = direct;
        let liveness = if same_process { Liveness::Local } else { Liveness::Process(self.pids[p]) };
        tracing::trace!("occl: rank {me} connected to rank {p} over shm");
        Ok(Peer { send, recv, liveness, tcp: None, shm_names: names })
    }

    /// The FIFO from `from` to `to` between two thread ranks: the first to ask makes it, the
    /// second takes it out of the registry.
    fn local_region(&self, from: usize, to: usize) -> Result<Arc<Region>> {
        let key = (self.comm_id, from, to);
        let mut reg = registry();
        if let Some(r) = reg.fifos.remove(&key) {
            return Ok(r);
        }
        let r = Arc::new(Region::map(-1, fifo::region_size(self.nslots, self.slot))?);
        r.init(self.nslots, self.slot, self.pids[from], self.pids[to]);
        reg.fifos.insert(key, r.clone());
        Ok(r)
    }
}

/// Connects shm peer `p` into `peers` if it is not yet, and lets `members` (abort, failure
/// detection) see its ends. A no-op for connected peers and without a connector.
pub(crate) fn ensure(
    peers: &mut [Option<Peer>],
    p: usize,
    lazy: Option<&Lazy>,
    members: Option<&Lifecycle>,
) -> Result<()> {
    let (Some(slot), Some(lazy)) = (peers.get_mut(p), lazy) else { return Ok(()) };
    if slot.is_some() {
        return Ok(());
    }
    let peer = lazy.connect(p)?;
    if let Some(m) = members {
        m.add(p, &peer);
    }
    *slot = Some(peer);
    Ok(())
}

/// In-process FIFOs made by one thread rank and not yet taken by its peer, and how many ranks
/// of each communicator live in this process: when the last one goes, whatever its peers never
/// took is freed.
#[derive(Default)]
struct Registry {
    fifos: HashMap<(u64, usize, usize), Arc<Region>>,
    live: HashMap<u64, usize>,
}

fn registry() -> MutexGuard<'static, Registry> {
    static REG: LazyLock<Mutex<Registry>> = LazyLock::new(Mutex::default);
    REG.lock().unwrap_or_else(|e| e.into_inner())
}

/// One thread rank's membership of its communicator in the registry.
struct LocalRank(u64);

impl LocalRank {
    fn join(comm: u64) -> LocalRank {
        *registry().live.entry(comm).or_insert(0) += 1;
        LocalRank(comm)
    }
}

impl Drop for LocalRank {
    fn drop(&mut self) {
        let mut reg = registry();
        let left = reg.live.get_mut(&self.0).map(|n| {
            *n -= 1;
            *n
        });
        if left == Some(0) {
            reg.live.remove(&self.0);
            reg.fifos.retain(|k, _| k.0 != self.0);
        }
    }
}
