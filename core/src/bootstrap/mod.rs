//! Bootstrap: every rank connects to the root named by the `UniqueId`, proves it knows the job
//! secret and learns its parent's address; then the ranks form a binary tree, and every
//! all-gather (the peer table, the tuner's digest, split's colours, registrations) runs over
//! it.

mod gather;
pub(crate) mod root;
pub(crate) mod tier;
mod tree;
pub(crate) mod wire;

use crate::auth;
use crate::error::{Error, Result};
use crate::id::UniqueId;
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};
use wire::{Reader, Writer};

/// What every rank tells every other rank at init.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PeerInfo {
    pub rank: usize,
    /// Ranks with equal host ids share memory.
    pub host_id: String,
    pub hostname: String,
    pub pid: u32,
    /// Where the rank accepts transport connections.
    pub listen: SocketAddr,
    /// Rank 0's proposal becomes the communicator's id (names shm segments, checks TCP hellos).
    pub comm_id: u64,
    /// Address of this process's probe word, for peers to test single-copy reads.
    pub probe_addr: u64,
    /// This process's RAS mesh address (`ip:port`), empty when RAS is off.
    pub ras_addr: String,
    /// The settings every rank must have alike, as (variable, value) text, checked against
    /// every other rank's before any transport connects (`config::check_alike`).
    pub settings: Vec<(String, String)>,
    /// The rank offers the ib transport (a usable RDMA port, feature `ib`).
    pub ib: bool,
    /// The CPUs the rank may run on, and a CPU quota below them (0: none): with its host's
    /// other ranks', how many cores they share (`topo::cores`).
    pub cpus: crate::topo::CpuSet,
    pub cpu_quota: u32,
}

impl PeerInfo {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut w = Writer::default();
        w.u32(self.rank as u32);
        w.str(&self.host_id);
        w.str(&self.hostname);
        w.u32(self.pid);
        w.str(&self.listen.to_string());
        w.u64(self.comm_id);
        w.u64(self.probe_addr);
        w.str(&self.ras_addr);
        w.u32(self.settings.len() as u32);
        for (name, value) in &self.settings {
            w.str(name);
            w.str(value);
        }
        w.u32(u32::from(self.ib));
        w.str(&self.cpus.to_string());
        w.u32(self.cpu_quota);
        w.into_inner()
    }

    pub(crate) fn decode(b: &[u8]) -> Result<PeerInfo> {
        let mut r = Reader::new(b);
        let info = PeerInfo {
            rank: r.u32()? as usize,
            host_id: r.str()?,
            hostname: r.str()?,
            pid: r.u32()?,
            listen: r
                .str()?
                .parse()
                .map_err(|_| Error::internal("bootstrap: a peer sent a malformed listen address"))?,
            comm_id: r.u64()?,
            probe_addr: r.u64()?,
            ras_addr: r.str()?,
            settings: {
                // Bounded by the frame it came in: each pair takes at least 8 bytes.
                let n = r.u32()? as usize;
                let mut v = Vec::with_capacity(n.min(b.len() / 8));
                for _ in 0..n {
                    v.push((r.str()?, r.str()?));
                }
                v
            },
            ib: match r.u32()? {
                0 => false,
                1 => true,
                x => return Err(Error::internal(format!("bootstrap: a peer sent ib={x}"))),
            },
            cpus: crate::topo::CpuSet::parse_list(&r.str()?)
                .map_err(|e| Error::internal(format!("bootstrap: a peer sent a malformed cpu set: {e}")))?,
            cpu_quota: r.u32()?,
        };
        r.finish()?;
        Ok(info)
    }
}

/// Rank `me`'s host in the peer `table`: how many of the ranks run there, and how many cores
/// they share (the union of their affinity sets, `topo::cores`). Every rank of the host computes
/// the same from the same table.
pub(crate) fn host_share(table: &[PeerInfo], me: usize) -> (usize, usize) {
    let here = || table.iter().filter(|p| p.host_id == table[me].host_id);
    (here().count(), crate::topo::cores::shared_cores(here().map(|p| (&p.cpus, p.cpu_quota))))
}

/// Connects to `addr` (`what` names it in errors), retrying with back-off until `deadline`
/// (a refused connection too when `retry_refused`: the listener may not be up yet), then sets
/// TCP_NODELAY and proves the job's `secret`. Every bootstrap connection starts here: a rank to
/// its root, a root to the next root, a rank to its tree parent.
pub(crate) fn dial(
    addr: SocketAddr,
    secret: &[u8; 16],
    deadline: Instant,
    what: &str,
    retry_refused: bool,
) -> Result<TcpStream> {
    let mut backoff = Duration::from_millis(5);
    let mut s = loop {
        match TcpStream::connect_timeout(&addr, Duration::from_secs(5)) {
            Ok(s) => break s,
            Err(e)
                if Instant::now() < deadline
                    && (retry_refused || e.kind() != std::io::ErrorKind::ConnectionRefused) =>
            {
                tracing::debug!("bootstrap: {what} at {addr} not reachable yet ({e}); retrying");
                std::thread::sleep(backoff);
                backoff = (backoff * 2).min(Duration::from_millis(500));
            }
            Err(e) => return Err(Error::sys(format!("bootstrap: connect to {what} at {addr}"), e)),
        }
    };
    s.set_nodelay(true).map_err(|e| Error::sys("bootstrap: set TCP_NODELAY", e))?;
    auth::client(&mut s, secret)?;
    Ok(s)
}

/// A rank's place in the bootstrap: its tree links once the root phase is over.
pub(crate) struct Client {
    /// None for a communicator of one rank, which has nobody to exchange with.
    tree: Option<tree::Tree>,
}

/// The root's answer to a join, read until `timeout` (the other ranks may join late): the
/// parent's tree address, none for rank 0.
fn await_parent(stream: &mut TcpStream, rank: usize, timeout: Duration) -> Result<Option<SocketAddr>> {
    let frame = wire::recv(stream).map_err(|e| match e {
        Error::SystemError { source, .. }
            if matches!(source.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) =>
        {
            Error::Timeout {
                what: "bootstrap (waiting for the other ranks to join the root)".into(),
                secs: timeout.as_secs_f64(),
            }
        }
        e => e,
    })?;
    let mut r = Reader::new(&frame);
    let parent = match r.u8()? {
        wire::PARENT => r.str()?,
        wire::ERROR => return Err(Error::usage(format!("the bootstrap root stopped rank {rank}: {}", r.str()?))),
        t => return Err(Error::internal(format!("bootstrap: unexpected frame type {t} from the root"))),
    };
    r.finish()?;
    if rank == 0 {
        return Ok(None);
    }
    parent
        .parse()
        .map(Some)
        .map_err(|_| Error::internal(format!("bootstrap: the root sent a malformed tree address {parent:?}")))
}

impl Client {
    /// Connects to the root (retrying while it is not up yet, until `timeout`), authenticates,
    /// joins as `rank` of `nranks` with the address of a tree listener bound on `bind`, learns
    /// its parent's address, and links into the tree.
    /// With several `ids` (scalable init) it joins the root of id `rank * ids.len() / nranks`
    /// and tells it which id that is and the next root's id.
    pub(crate) fn join_any(
        ids: &[UniqueId],
        rank: usize,
        nranks: usize,
        bind: IpAddr,
        timeout: Duration,
    ) -> Result<Client> {
        let m = ids.len();
        // A rank out of range (one that joins only to tell the root so) goes to the last root.
        let k = tier::id_of(rank, m, nranks).min(m.saturating_sub(1));
        let id = ids.get(k).ok_or_else(|| Error::arg("no unique id for this rank"))?;
        let listener = TcpListener::bind((bind, 0))
            .map_err(|e| Error::sys(format!("bootstrap: bind a tree listener on {bind}"), e))?;
        root::deepen_backlog(&listener);
        let tree_addr = listener.local_addr().map_err(|e| Error::sys("bootstrap: tree listener address", e))?;
        let mut stream = dial(id.addr, &id.secret, Instant::now() + timeout, "the root", true)?;
        stream.set_read_timeout(Some(timeout)).map_err(|e| Error::sys("bootstrap: set read timeout", e))?;
        let mut w = Writer::default();
        if m == 1 {
            w.u8(wire::JOIN);
            w.u32(nranks as u32);
            w.u32(rank as u32);
        } else {
            w.u8(wire::JOIN_MULTI);
            w.u32(nranks as u32);
            w.u32(rank as u32);
            w.u32(m as u32);
            w.u32(k as u32);
            w.str(&ids[(k + 1) % m].to_string());
        }
        w.str(&tree_addr.to_string());
        wire::send(&mut stream, &w.into_inner())?;
        let parent = await_parent(&mut stream, rank, timeout)?;
        drop(stream);
        if nranks == 1 {
            return Ok(Client { tree: None });
        }
        // The job's secret is the first id's, as the transports use.
        let tree = tree::Tree::connect(listener, parent, &ids[0].secret, rank, nranks, timeout)?;
        Ok(Client { tree: Some(tree) })
    }

    /// Every rank contributes `mine`; returns all contributions in rank order.
    pub(crate) fn all_gather(&mut self, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
        match self.tree.as_mut() {
            Some(r) => r.all_gather(mine),
            None => Ok(vec![mine.to_vec()]),
        }
    }
}
