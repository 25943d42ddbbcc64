//! Lazy connection of shared-memory peers (NCCL's runtime connect): a pair's FIFOs are made the
//! first time an operation needs the pair, by whichever side gets there first, with no
//! handshake. Init then costs O(nranks) however many ranks share the host; a ring touches two
//! peers per rank, not nranks − 1.
//!
//! Ranks in other processes meet in a named segment (`shm::attach`); ranks that are threads of
//! one process meet in anonymous memory through a process-wide registry, which costs no
//! /dev/shm name and no file descriptor.

use super::fifo::{self, Direct, Liveness, RecvFifo, Region, SendFifo};
use super::peers::PeerTable;
use super::{shm, Peer};
use crate::config::{Config, TransportKind};
use crate::error::{Error, Result};
use crate::sync::lock;
use crate::wait::Patience;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, LazyLock, Mutex, MutexGuard};
use std::time::Duration;

/// What a rank needs to connect any shm peer later, fixed at init.
pub(crate) struct Lazy {
    comm_id: u64,
    /// Keys the segment names (`shm::segment_name`).
    secret: [u8; 16],
    me: usize,
    /// Per rank: whether this rank has connected it. A peer process never connected may have
    /// made the pair's segments for this rank; they go when this rank's communicator does.
    connected: Vec<AtomicBool>,
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
        secret: [u8; 16],
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
            secret,
            me,
            connected: pids.iter().map(|_| AtomicBool::new(false)).collect(),
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
                let name = self.segment_name(from, to);
                let peer = (p, self.pids[p]);
                let r = shm::attach(&name, self.nslots, self.slot, self.pids[from], self.pids[to], peer, self.timeout)?;
                Ok((Arc::new(r), name))
            };
            let (out, a) = region(me, p)?;
            let (inn, b) = match region(p, me) {
                Ok(r) => r,
                Err(e) => {
                    // Nothing was sent yet, so a segment the peer has not mapped has no use.
                    if out.header().attached.load(Ordering::Acquire) < 2 {
                        shm::unlink(&a);
                    }
                    return Err(e);
                }
            };
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
        if let Some(c) = self.connected.get(p) {
            c.store(true, Ordering::Release);
        }
        tracing::trace!("occl: rank {me} connected to rank {p} over shm");
        Ok(Peer { send, recv, liveness, tcp: None, shm_names: names })
    }

    fn segment_name(&self, from: usize, to: usize) -> String {
        shm::segment_name(&self.secret, self.comm_id, from, to, self.pids[from])
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

impl Drop for Lazy {
    /// Removes the segments that peer processes this rank never connected made for it: nobody
    /// will map them any more. (Those of connected peers went when both sides mapped them, or
    /// go with `Peer::close` when the peer is dead; a live peer may still come for data this
    /// rank sent it, and unlinks them itself.)
    fn drop(&mut self) {
        let me = self.me;
        for p in 0..self.pids.len() {
            let other_process = self.pids[p] != self.pids[me];
            if self.kind(p) == Some(TransportKind::Shm) && other_process && !self.connected[p].load(Ordering::Acquire) {
                shm::unlink(&self.segment_name(p, me));
                shm::unlink(&self.segment_name(me, p));
            }
        }
    }
}

/// Connects shm peer `p` into `peers` if it is not yet, and lets `members` (abort, failure
/// detection) see its ends. A no-op for connected peers and without a connector.
pub(crate) fn ensure(
    peers: &mut [Option<Peer>],
    p: usize,
    lazy: Option<&Lazy>,
    members: Option<&PeerTable>,
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
    lock(&REG)
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    fn lazy(secret: [u8; 16], pids: Vec<u32>, timeout: Duration) -> Lazy {
        let config = Config { timeout, ..Config::default() };
        let kinds = vec![None, Some(TransportKind::Shm)];
        Lazy::new(&config, 0x5ec, secret, 0, pids, vec![0, 0], kinds, 4096, Patience::Share)
    }

    fn exists(name: &str) -> bool {
        std::path::Path::new("/dev/shm").join(&name[1..]).exists()
    }

    /// Rank 1's process made its FIFO to rank 0 (won the O_EXCL create) and was killed before
    /// it sized it: rank 0 learns at once, and neither segment of the pair stays behind.
    #[test]
    fn a_peer_killed_during_setup_leaves_no_segment() {
        let mut child = std::process::Command::new("true").spawn().expect("spawn");
        let dead = child.id();
        child.wait().expect("wait");
        let l =
            lazy(crate::id::random_bytes().expect("secret"), vec![std::process::id(), dead], Duration::from_secs(3));
        let theirs = l.segment_name(1, 0);
        let c = std::ffi::CString::new(theirs.as_str()).expect("name");
        // SAFETY: creating an empty segment as the killed creator left it.
        let fd = unsafe { libc::shm_open(c.as_ptr(), libc::O_CREAT | libc::O_EXCL | libc::O_RDWR, 0o600) };
        assert!(fd >= 0, "{}", std::io::Error::last_os_error());
        // SAFETY: our own descriptor.
        unsafe { libc::close(fd) };
        let t = Instant::now();
        let e = l.connect(1).err().expect("the peer is dead");
        assert_eq!(e.kind(), crate::ErrorKind::RemoteError, "{e}");
        assert!(t.elapsed() < Duration::from_secs(1), "waited {:?} for a dead peer", t.elapsed());
        assert!(!exists(&theirs), "the dead peer's segment stays");
        assert!(!exists(&l.segment_name(0, 1)), "this rank's own segment to the dead peer stays");
    }

    /// A peer process made the pair's segments for this rank, which never connected it: they
    /// go when this rank's communicator does.
    #[test]
    fn segments_made_for_a_rank_that_never_connected_go_with_it() {
        let mut peer = std::process::Command::new("sleep").arg("30").spawn().expect("spawn");
        let l = lazy(
            crate::id::random_bytes().expect("secret"),
            vec![std::process::id(), peer.id()],
            Duration::from_secs(3),
        );
        let names = [l.segment_name(1, 0), l.segment_name(0, 1)];
        for n in &names {
            shm::create(n, 2, 4096, 1, 2).expect("the peer's segment");
        }
        assert!(names.iter().all(|n| exists(n)));
        drop(l);
        let _ = peer.kill();
        let _ = peer.wait();
        for n in &names {
            assert!(!exists(n), "{n} stays after the communicator ended");
        }
    }
}
