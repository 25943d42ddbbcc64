//! Bootstrap: every rank connects to the root named by the `UniqueId`, proves it knows the job
//! secret, and the root runs all-gather rounds over those connections — first the peer table
//! (address, host, pid), then whatever transports need to exchange during setup.

pub(crate) mod root;
pub(crate) mod tier;
pub(crate) mod wire;

use crate::auth;
use crate::error::{Error, Result};
use crate::id::UniqueId;
use std::net::{SocketAddr, TcpStream};
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
    /// The rank offers the ib transport (a usable RDMA port, feature `ib`).
    pub ib: bool,
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
        w.u32(u32::from(self.ib));
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
            ib: match r.u32()? {
                0 => false,
                1 => true,
                x => return Err(Error::internal(format!("bootstrap: a peer sent ib={x}"))),
            },
        };
        r.finish()?;
        Ok(info)
    }
}

/// A rank's connection to the bootstrap root.
pub(crate) struct Client {
    stream: TcpStream,
    rank: usize,
    nranks: usize,
    /// The read timeout set on `stream`, named in the error when a round does not complete.
    timeout: Duration,
}

impl Client {
    /// Connects (retrying while the root is not up yet, until `timeout`), authenticates and
    /// joins as `rank` of `nranks`.
    /// With several `ids` (scalable init) it joins the root of id `rank * ids.len() / nranks`
    /// and tells it which id that is and the next root's id.
    pub(crate) fn join_any(ids: &[UniqueId], rank: usize, nranks: usize, timeout: Duration) -> Result<Client> {
        let m = ids.len();
        let k = tier::id_of(rank, m, nranks);
        let id = ids.get(k).ok_or_else(|| Error::arg("no unique id for this rank"))?;
        let deadline = Instant::now() + timeout;
        let mut backoff = Duration::from_millis(5);
        let mut stream = loop {
            match TcpStream::connect_timeout(&id.addr, Duration::from_secs(5)) {
                Ok(s) => break s,
                Err(e) if Instant::now() < deadline => {
                    tracing::debug!("bootstrap: root {} not reachable yet ({e}); retrying", id.addr);
                    std::thread::sleep(backoff);
                    backoff = (backoff * 2).min(Duration::from_millis(500));
                }
                Err(e) => return Err(Error::sys(format!("bootstrap: connect to the root at {}", id.addr), e)),
            }
        };
        stream.set_nodelay(true).map_err(|e| Error::sys("bootstrap: set TCP_NODELAY", e))?;
        auth::client(&mut stream, &id.secret)?;
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
        wire::send(&mut stream, &w.into_inner())?;
        Ok(Client { stream, rank, nranks, timeout })
    }

    /// Every rank contributes `mine`; returns all contributions in rank order.
    pub(crate) fn all_gather(&mut self, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
        let mut w = Writer::default();
        w.u8(wire::GATHER);
        w.bytes(mine);
        wire::send(&mut self.stream, &w.into_inner())?;
        let secs = self.timeout.as_secs_f64();
        let frame = wire::recv(&mut self.stream).map_err(|e| match e {
            Error::SystemError { source, .. }
                if matches!(source.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) =>
            {
                Error::Timeout { what: "bootstrap all-gather (waiting for the other ranks to join)".into(), secs }
            }
            e => e,
        })?;
        let mut r = Reader::new(&frame);
        match r.u8()? {
            wire::RESULT => {
                let n = r.u32()? as usize;
                if n != self.nranks {
                    return Err(Error::internal(format!(
                        "bootstrap: root returned {n} entries for {} ranks",
                        self.nranks
                    )));
                }
                let out = (0..n).map(|_| r.bytes().map(|b| b.to_vec())).collect::<Result<Vec<_>>>()?;
                r.finish()?;
                Ok(out)
            }
            wire::ERROR => Err(Error::usage(format!("bootstrap root refused rank {}: {}", self.rank, r.str()?))),
            t => Err(Error::internal(format!("bootstrap: unexpected frame type {t} from the root"))),
        }
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        let mut w = Writer::default();
        w.u8(wire::BYE);
        let _ = wire::send(&mut self.stream, &w.into_inner());
    }
}
