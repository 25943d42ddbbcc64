//! Scalable bootstrap: with several unique ids, rank r joins the root of id `r * m / nranks`
//! (m ids), so each root serves a contiguous share of the ranks. The roots form a ring among
//! themselves: once every rank of its share has joined, each root passes its share's tree
//! addresses around that ring (m - 1 steps, each root forwarding what it received), so that it
//! can tell each of its ranks its parent's address, wherever the parent joined. No root talks
//! to more than its share plus two roots.

use super::wire::{self, Reader, Writer};
use crate::error::{Error, Result};
use crate::id::UniqueId;
use std::net::TcpStream;
use std::time::Instant;

/// Which id rank `rank` of `nranks` joins, with `m` ids.
pub(crate) fn id_of(rank: usize, m: usize, nranks: usize) -> usize {
    // u128: rank * m overflows no u64 for any real job, but stays exact here regardless.
    ((rank as u128 * m as u128) / nranks as u128) as usize
}

/// The ranks root `k` of `m` serves: `[lo, hi)`, those with `id_of(r) == k`.
pub(crate) fn share(k: usize, m: usize, nranks: usize) -> (usize, usize) {
    let lo = |k: usize| (k as u128 * nranks as u128).div_ceil(m as u128) as usize;
    (lo(k), lo(k + 1).min(nranks))
}

/// One root's contribution: its share's tree addresses, or a failure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Block {
    Parts(Vec<Vec<u8>>),
    Failed(String),
}

impl Block {
    fn encode(&self) -> Vec<u8> {
        let mut w = Writer::default();
        match self {
            Block::Parts(p) => {
                w.u8(wire::GATHER);
                w.u32(p.len() as u32);
                for b in p {
                    w.bytes(b);
                }
            }
            Block::Failed(why) => {
                w.u8(wire::ERROR);
                w.str(why);
            }
        }
        w.into_inner()
    }

    fn decode(b: &[u8]) -> Result<Block> {
        let mut r = Reader::new(b);
        let block = match r.u8()? {
            wire::GATHER => {
                let n = r.u32()? as usize;
                // Each part takes at least its 4-byte length: a count larger than that is a lie.
                if n > b.len() / 4 {
                    return Err(Error::internal("bootstrap: a root announced more parts than it sent"));
                }
                Block::Parts((0..n).map(|_| r.bytes().map(<[u8]>::to_vec)).collect::<Result<_>>()?)
            }
            wire::ERROR => Block::Failed(r.str()?),
            t => return Err(Error::internal(format!("bootstrap: unexpected frame type {t} between roots"))),
        };
        r.finish()?;
        Ok(block)
    }
}

/// Root `k`'s links to its ring neighbours among the `m` roots.
pub(crate) struct Tier {
    pub k: usize,
    pub m: usize,
    next: TcpStream,
    prev: TcpStream,
}

/// The hello a root sends to the next root after authenticating with that root's secret.
pub(crate) fn peer_hello(k: usize, m: usize, nranks: usize) -> Vec<u8> {
    let mut w = Writer::default();
    w.u8(wire::ROOT_PEER);
    w.u32(nranks as u32);
    w.u32(m as u32);
    w.u32(k as u32);
    w.into_inner()
}

/// Dials the next root (`next`, whose secret it proves), retrying until `deadline`: the next
/// root's id exists (its listener is bound) but its process may still be starting.
pub(crate) fn dial_next(next: &UniqueId, k: usize, m: usize, nranks: usize, deadline: Instant) -> Result<TcpStream> {
    let mut s = super::dial(next.addr, &next.secret, deadline, &format!("the next root (from root {k})"), true)?;
    wire::send(&mut s, &peer_hello(k, m, nranks))?;
    Ok(s)
}

impl Tier {
    pub(crate) fn new(k: usize, m: usize, next: TcpStream, prev: TcpStream) -> Tier {
        Tier { k, m, next, prev }
    }

    /// Passes every root's block around the ring; returns them in root order. Sends run on a
    /// helper thread so that a ring of full socket buffers cannot deadlock.
    pub(crate) fn exchange(&mut self, mine: Block) -> Result<Vec<Block>> {
        let m = self.m;
        let mut blocks: Vec<Option<Block>> = (0..m).map(|_| None).collect();
        blocks[self.k] = Some(mine);
        let mut carry = blocks[self.k].as_ref().map(Block::encode).unwrap_or_default();
        for step in 0..m - 1 {
            let from = (self.k + m - 1 - step) % m;
            let (next, prev) = (&mut self.next, &mut self.prev);
            let got = std::thread::scope(|sc| {
                let tx = sc.spawn(|| wire::send(next, &carry));
                let rx = wire::recv(prev);
                let sent = tx.join().unwrap_or_else(|_| Err(Error::internal("bootstrap: root send thread panicked")));
                sent.and(rx)
            })?;
            blocks[from] = Some(Block::decode(&got)?);
            carry = got;
        }
        blocks.into_iter().map(|b| b.ok_or_else(|| Error::internal("bootstrap: a root's block is missing"))).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_cover_every_rank_once_and_match_id_of() {
        for n in [1usize, 2, 3, 7, 8, 64, 1000, 1024] {
            for m in [1usize, 2, 3, 8] {
                if m > n {
                    continue;
                }
                let mut next = 0;
                for k in 0..m {
                    let (lo, hi) = share(k, m, n);
                    assert_eq!(lo, next, "n={n} m={m} k={k}");
                    assert!(hi > lo, "every root serves at least one rank (n={n} m={m} k={k})");
                    for r in lo..hi {
                        assert_eq!(id_of(r, m, n), k, "n={n} m={m} r={r}");
                    }
                    next = hi;
                }
                assert_eq!(next, n);
            }
        }
    }

    #[test]
    fn blocks_round_trip_and_lying_counts_are_refused() {
        for b in [Block::Parts(vec![b"a".to_vec(), vec![], b"xyz".to_vec()]), Block::Failed("x".into())] {
            assert_eq!(Block::decode(&b.encode()).unwrap(), b);
        }
        let mut w = Writer::default();
        w.u8(wire::GATHER);
        w.u32(u32::MAX);
        assert!(Block::decode(&w.into_inner()).is_err());
    }
}
