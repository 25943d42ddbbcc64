//! The job's peer table (one entry per process, in the same order on every process) and the network shape over it.

use std::cmp::Ordering;
use std::hash::Hasher;
use std::net::SocketAddr;

use siphasher::sip::SipHasher24;

use super::MeshError;
use crate::wire::{PeerId, MAX_PEERS, MAX_STRING};

/// One process of the job, as bootstrap tells every rank.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PeerAddr {
    /// The RAS listening address (`ip:port`), unique per process.
    pub addr: String,
    /// The node as reports print it (an IP address).
    pub host: String,
    pub pid: u32,
    /// CUDA devices of the process's ranks (empty for host-only ranks).
    pub cuda_devs: Vec<u32>,
    pub nvml_devs: Vec<u32>,
}

/// The peer table, sorted by address (IPv4 before IPv6, then IP, then port; addresses that do not parse last, by
/// text), so that processes on one node sit next to each other and every process derives the same ring.
#[derive(Debug, Clone)]
pub struct PeerTable {
    peers: Vec<PeerAddr>,
    hash: u64,
}

fn order(a: &str, b: &str) -> Ordering {
    match (a.parse::<SocketAddr>(), b.parse::<SocketAddr>()) {
        (Ok(x), Ok(y)) => x.cmp(&y),
        (Ok(_), Err(_)) => Ordering::Less,
        (Err(_), Ok(_)) => Ordering::Greater,
        (Err(_), Err(_)) => a.cmp(b),
    }
}

impl PeerTable {
    /// Sorts `peers`; fails on an empty table, a repeated address, or more entries or longer strings than the wire
    /// can carry.
    pub fn new(mut peers: Vec<PeerAddr>) -> Result<Self, MeshError> {
        if peers.is_empty() || peers.len() > MAX_PEERS {
            return Err(MeshError::TableSize(peers.len()));
        }
        if let Some(p) = peers.iter().find(|p| p.addr.len() > MAX_STRING || p.host.len() > MAX_STRING) {
            return Err(MeshError::LongString(p.addr.chars().take(64).collect()));
        }
        peers.sort_by(|a, b| order(&a.addr, &b.addr));
        if let Some(w) = peers.windows(2).find(|w| w[0].addr == w[1].addr) {
            return Err(MeshError::DuplicateAddr(w[0].addr.clone()));
        }
        // Fixed key: the hash only has to tell tables apart, and it must be the same in every process.
        let mut h = SipHasher24::new_with_keys(0x6f63_636c_2d72_6173, 0x7065_6572_7461_626c);
        for p in &peers {
            h.write(p.addr.as_bytes());
            h.write_u8(0);
            h.write_u32(p.pid);
        }
        Ok(Self { peers, hash: h.finish() })
    }

    pub fn len(&self) -> usize {
        self.peers.len()
    }

    pub fn is_empty(&self) -> bool {
        self.peers.is_empty()
    }

    /// Identifies the table: peers refuse each other when their tables differ.
    pub fn hash(&self) -> u64 {
        self.hash
    }

    pub fn get(&self, id: PeerId) -> Option<&PeerAddr> {
        self.peers.get(id.0 as usize)
    }

    /// The id of the process listening at `addr`.
    pub fn find(&self, addr: &str) -> Option<PeerId> {
        self.peers.binary_search_by(|p| order(&p.addr, addr)).ok().map(|i| PeerId(i as u32))
    }

    pub fn iter(&self) -> impl Iterator<Item = (PeerId, &PeerAddr)> {
        self.peers.iter().enumerate().map(|(i, p)| (PeerId(i as u32), p))
    }

    pub fn ids(&self) -> impl Iterator<Item = PeerId> {
        (0..self.peers.len() as u32).map(PeerId)
    }
}

/// Below this many processes the ring alone is short enough; from here on, long-range links are added.
pub const LONG_RANGE_MIN_PEERS: usize = 16;

/// Distances, in table positions, at which a process links in each direction: 1 (the ring), plus, for larger jobs,
/// N^(1/3) and N^(2/3), which bring the diameter from N/2 down to about 1.5 · N^(1/3) hops (15 for 1,024
/// processes) for 6 links per process instead of 2.
pub fn strides(n: usize, long_range: bool) -> Vec<usize> {
    let mut s = vec![1];
    if long_range && n >= LONG_RANGE_MIN_PEERS {
        let c = (n as f64).cbrt();
        for k in [c, c * c] {
            let k = k.round() as usize;
            if k > 1 && k <= n / 2 && !s.contains(&k) {
                s.push(k);
            }
        }
    }
    s
}

/// The peers `me` links to: for each stride, the first peer at or beyond that distance in each direction that
/// `live` accepts (so a dead or silent neighbour is skipped and the next live one becomes the link).
pub fn link_targets(n: usize, me: PeerId, strides: &[usize], live: impl Fn(PeerId) -> bool) -> Vec<PeerId> {
    let me = me.0 as usize;
    let mut out = Vec::new();
    for &s in strides {
        for dir in [1usize, n - 1] {
            // Walk from the stride's position, skipping peers that are not live, at most once round the ring.
            let mut pos = (me + s * dir) % n;
            for _ in 0..n {
                if pos == me {
                    break;
                }
                let p = PeerId(pos as u32);
                if live(p) {
                    if !out.contains(&p) {
                        out.push(p);
                    }
                    break;
                }
                pos = (pos + dir) % n;
            }
        }
    }
    out
}
