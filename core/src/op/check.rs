//! A call checked against its collective's layout: what each buffer holds and which ranks
//! touch it. The one validation that host calls (`api`) and device calls (`cuda`) share, so a
//! bad root, peer, count or buffer gives the same typed error on either path.

use super::Op;
use crate::dtype::DataType;
use crate::error::{Error, Result};
use crate::record::CollType;

/// How much of a buffer a rank touches, in blocks of the call's `count` elements.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Extent {
    Unused,
    /// One block, on every rank.
    Block,
    /// One block, on the root only.
    AtRoot,
    /// A block per rank, on every rank.
    PerRank,
}

/// When send and recv may share memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum InPlace {
    /// As the same address.
    Same,
    /// Send is this rank's block of recv (all-gather).
    SendIsOwnBlock,
    /// Recv is this rank's block of send (reduce-scatter).
    RecvIsOwnBlock,
}

/// What a collective reads (`send`) and writes (`recv`).
#[derive(Clone, Copy, Debug)]
struct Layout {
    send: Extent,
    recv: Extent,
    in_place: InPlace,
}

const fn layout(coll: CollType) -> Layout {
    use Extent::*;
    let (send, recv, in_place) = match coll {
        CollType::AllReduce => (Block, Block, InPlace::Same),
        CollType::Broadcast => (AtRoot, Block, InPlace::Same),
        CollType::Reduce => (Block, AtRoot, InPlace::Same),
        CollType::AllGather => (Block, PerRank, InPlace::SendIsOwnBlock),
        CollType::ReduceScatter => (PerRank, Block, InPlace::RecvIsOwnBlock),
        CollType::AllToAll => (PerRank, PerRank, InPlace::Same),
        CollType::Send => (Block, Unused, InPlace::Same),
        CollType::Recv => (Unused, Block, InPlace::Same),
    };
    Layout { send, recv, in_place }
}

/// The bytes of a checked call that this rank reads from `send` and writes to `recv` (0 where
/// it does not touch the buffer).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Touched {
    pub send: usize,
    pub recv: usize,
}

impl Op {
    /// Checks the call as rank `rank` of `nranks` makes it: root and peer in range, sizes
    /// within the address space, every buffer this rank touches non-null and aligned to its
    /// element, and send and recv apart unless in place as the collective allows.
    ///
    /// Every call passes through here, so the checks are plain arithmetic and each error is
    /// built out of line, only when a check fails.
    pub(crate) fn check(&self, rank: usize, nranks: usize) -> Result<Touched> {
        if let Some(root) = self.root.filter(|&r| r >= nranks) {
            return Err(root_error(root, nranks));
        }
        if let Some(peer) = self.peer.filter(|&p| p >= nranks) {
            return Err(peer_error(peer, nranks));
        }
        let l = layout(self.coll);
        let block = bytes_of(self.count, 1, self.dt).ok_or_else(|| overflow_error(self.count, 1, self.dt))?;
        let at_root = self.root == Some(rank);
        let bytes = |e: Extent| match e {
            Extent::Unused => Some(0),
            Extent::AtRoot if !at_root => Some(0),
            Extent::Block | Extent::AtRoot => Some(block),
            Extent::PerRank => bytes_of(self.count, nranks, self.dt),
        };
        let (Some(send), Some(recv)) = (bytes(l.send), bytes(l.recv)) else {
            return Err(overflow_error(self.count, nranks, self.dt));
        };
        let t = Touched { send, recv };
        check_ptr("send", self.send, t.send, self.dt)?;
        check_ptr("recv", self.recv, t.recv, self.dt)?;
        let own = rank.wrapping_mul(block);
        let in_place = match l.in_place {
            InPlace::Same => self.send == self.recv,
            InPlace::SendIsOwnBlock => self.send == self.recv.wrapping_add(own),
            InPlace::RecvIsOwnBlock => self.recv == self.send.wrapping_add(own),
        };
        if !in_place && overlaps(self.send, t.send, self.recv, t.recv) {
            return Err(overlap_error(self.coll, l.in_place));
        }
        Ok(t)
    }
}

#[cold]
fn root_error(root: usize, nranks: usize) -> Error {
    Error::arg(format!("root {root} is out of range for nranks={nranks} (ranks are 0..{nranks})"))
}

/// A peer is one of the ranks (whether it may be this rank is the caller's rule).
#[cold]
fn peer_error(peer: usize, nranks: usize) -> Error {
    Error::arg(format!("peer {peer} is out of range for nranks={nranks}"))
}

#[cold]
fn overflow_error(count: usize, blocks: usize, dt: DataType) -> Error {
    Error::arg(format!("count {count} × {blocks} block(s) × {} bytes of {dt} overflows the address space", dt.size()))
}

#[cold]
fn overlap_error(coll: CollType, in_place: InPlace) -> Error {
    let name = coll.name();
    Error::arg(match in_place {
        InPlace::Same => format!("{name}: send and recv buffers overlap without being the same (in place)"),
        InPlace::SendIsOwnBlock => {
            format!(
                "{name}: send overlaps recv without being this rank's block of it (in place: send = recv + rank*count)"
            )
        }
        InPlace::RecvIsOwnBlock => {
            format!(
                "{name}: recv overlaps send without being this rank's block of it (in place: recv = send + rank*count)"
            )
        }
    })
}

/// Bytes of `blocks` blocks of `count` elements of `dt`, if within the address space.
#[inline]
fn bytes_of(count: usize, blocks: usize, dt: DataType) -> Option<usize> {
    count.checked_mul(blocks).and_then(|c| c.checked_mul(dt.size())).filter(|b| *b <= isize::MAX as usize)
}

/// A buffer of `bytes` at address `p` (host or device) is non-null and aligned to `dt`.
#[inline]
pub(crate) fn check_ptr(what: &str, p: usize, bytes: usize, dt: DataType) -> Result<()> {
    if bytes > 0 && (p == 0 || !p.is_multiple_of(dt.size())) {
        return Err(ptr_error(what, p, dt));
    }
    Ok(())
}

#[cold]
fn ptr_error(what: &str, p: usize, dt: DataType) -> Error {
    if p == 0 {
        Error::arg(format!("{what} buffer is null"))
    } else {
        Error::arg(format!("{what} buffer {p:#x} is not aligned to the {}-byte {dt} element", dt.size()))
    }
}

/// Ranges [a, a+la) and [b, b+lb) share memory.
fn overlaps(a: usize, la: usize, b: usize, lb: usize) -> bool {
    la > 0 && lb > 0 && a < b.saturating_add(lb) && b < a.saturating_add(la)
}

#[cfg(test)]
mod tests {
    use super::*;

    const N: usize = 4;

    fn call(coll: CollType, send: usize, recv: usize) -> Op {
        let op = Op::new(coll, 4, DataType::F32, send, recv);
        match coll {
            CollType::Broadcast | CollType::Reduce => op.root(1),
            CollType::Send | CollType::Recv => op.peer(2),
            _ => op,
        }
    }

    #[test]
    fn each_collective_touches_its_blocks_on_its_ranks() {
        let t = |coll, rank| call(coll, 0x1000, 0x9000).check(rank, N).expect("valid");
        let (b, all) = (16, 16 * N);
        assert_eq!(t(CollType::AllReduce, 0), Touched { send: b, recv: b });
        assert_eq!(t(CollType::AllGather, 0), Touched { send: b, recv: all });
        assert_eq!(t(CollType::ReduceScatter, 0), Touched { send: all, recv: b });
        assert_eq!(t(CollType::AllToAll, 0), Touched { send: all, recv: all });
        assert_eq!(t(CollType::Broadcast, 1), Touched { send: b, recv: b });
        assert_eq!(t(CollType::Broadcast, 0), Touched { send: 0, recv: b });
        assert_eq!(t(CollType::Reduce, 1), Touched { send: b, recv: b });
        assert_eq!(t(CollType::Reduce, 0), Touched { send: b, recv: 0 });
        assert_eq!(t(CollType::Send, 0), Touched { send: b, recv: 0 });
        assert_eq!(t(CollType::Recv, 0), Touched { send: 0, recv: b });
    }

    #[test]
    fn in_place_is_what_the_collective_allows() {
        let ok = |coll, send, recv, rank| call(coll, send, recv).check(rank, N).is_ok();
        assert!(ok(CollType::AllReduce, 0x1000, 0x1000, 0));
        assert!(!ok(CollType::AllReduce, 0x1000, 0x1004, 0));
        assert!(ok(CollType::AllGather, 0x1000 + 2 * 16, 0x1000, 2));
        assert!(!ok(CollType::AllGather, 0x1000, 0x1000, 2));
        assert!(ok(CollType::ReduceScatter, 0x1000, 0x1000 + 3 * 16, 3));
        assert!(!ok(CollType::ReduceScatter, 0x1000, 0x1010, 3));
        // Off the root a broadcast reads nothing and a reduce writes nothing: no overlap there.
        assert!(ok(CollType::Broadcast, 0x1000, 0x1004, 0));
        assert!(ok(CollType::Reduce, 0x1000, 0x1004, 0));
        assert!(!ok(CollType::Reduce, 0x1000, 0x1004, 1));
    }

    #[test]
    fn bad_arguments_are_invalid_arguments_that_say_why() {
        let e = |op: Op| op.check(0, N).expect_err("refused");
        let root = e(Op::new(CollType::Broadcast, 4, DataType::F32, 8, 8).root(N));
        assert!(root.to_string().contains("root 4 is out of range"), "{root}");
        let peer = e(Op::new(CollType::Send, 4, DataType::F32, 8, 0).peer(N));
        assert!(peer.to_string().contains("peer 4 is out of range"), "{peer}");
        let big = e(Op::new(CollType::AllGather, usize::MAX / 8, DataType::F64, 8, 8));
        assert!(big.to_string().contains("overflows"), "{big}");
        let null = e(Op::new(CollType::AllReduce, 4, DataType::F32, 0, 8));
        assert!(null.to_string().contains("send buffer is null"), "{null}");
        let odd = e(Op::new(CollType::AllReduce, 4, DataType::F32, 8, 0x1002));
        assert!(odd.to_string().contains("not aligned"), "{odd}");
        for x in [root, peer, big, null, odd] {
            assert_eq!(x.kind(), crate::ErrorKind::InvalidArgument);
        }
        assert!(Op::new(CollType::AllReduce, 0, DataType::F32, 0, 3).check(0, N).is_ok(), "nothing to touch");
    }
}
