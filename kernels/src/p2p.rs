//! Grouped send/recv (`occl_p2p_group` in `cuda/coll.cu`): the sends and receives of one group
//! on one communicator run in one launch, so that a rank sending to r+1 and receiving from r-1
//! (or an all-to-all of sends and receives) makes progress on all of them at once.
//!
//! Every (peer, direction) pair is a connection with channels of its own (lanes of the launch's
//! blocks, packed as the collectives' are); its operations run in call order on those channels.
//! Both ends must split a connection alike: the channel count depends only on what both know
//! (the connection's bytes, the channel budget and the rank count), never on the other
//! connections of this rank's group, which the peer does not see.

use crate::coll::{CollArgs, CollKernels, MAX_RANKS};
use crate::error::{Error, Result};
use cudarc::driver::CudaStream;
use cudarc::driver::DeviceRepr;

/// Operations one launch can carry (`OCCL_P2P_OPS`): the whole table travels as the kernel's
/// argument, whose size CUDA caps at 4 KiB.
pub const MAX_OPS: usize = 128;
/// Connections of one launch (`OCCL_P2P_CONNS`): a send and a receive per peer.
pub const MAX_CONNS: usize = 2 * (MAX_RANKS - 1);
/// Bytes of a connection per channel below which it uses fewer channels (as the collectives).
pub const MIN_CHANNEL_BYTES: u64 = 32 << 10;

/// `P2pConn` of the source.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct P2pConn {
    pub peer: u32,
    /// 1: sends to `peer`; 0: receives from it.
    pub send: u32,
    pub first: u32,
    pub nops: u32,
    /// The connection's channels: the launch's channels in connection order.
    pub channels: u32,
    pub pad: u32,
}

/// `P2pOp` of the source: a device buffer and its bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct P2pOp {
    pub buf: u64,
    pub bytes: u64,
}

/// The kernel's argument, field for field `P2pArgs` of the source.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct P2pArgs {
    /// The communicator's regions, layout, rank and timeout (mode and buffers unused).
    pub base: CollArgs,
    pub nconns: u32,
    pub pad: [u32; 3],
    pub conns: [P2pConn; MAX_CONNS],
    pub ops: [P2pOp; MAX_OPS],
}

// SAFETY: plain old data of u64/u32 fields laid out as the kernel's struct.
unsafe impl DeviceRepr for P2pArgs {}

/// The KernelCh records of a timed launch over `conns` (a plan's, in launch order), in the order
/// the kernel writes them: per connection, per operation (its index in the connection, in call
/// order), a record per channel of the connection.
pub fn records(conns: &[P2pConn]) -> impl Iterator<Item = (&P2pConn, u32)> {
    conns.iter().flat_map(|c| (0..c.nops).map(move |i| (c, i)))
}

/// One send or receive of a group, as the caller issued it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Transfer {
    pub send: bool,
    pub peer: u32,
    pub buf: u64,
    pub bytes: u64,
}

/// What a group may launch: at most `total` channels, shared by every connection a rank may
/// have (a send and a receive per peer), so that a whole group fits one grid that the device can
/// hold at once (its channels wait on each other's peers); and at most `per_conn` for one
/// connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct P2pBudget {
    pub total: u32,
    pub per_conn: u32,
}

/// Channels a connection of `bytes` runs on: one per [`MIN_CHANNEL_BYTES`], within its share of
/// the budget. Both ends compute it from what both know.
pub fn conn_channels(bytes: u64, budget: P2pBudget, nranks: u32) -> u32 {
    let share = budget.total / (2 * nranks.saturating_sub(1)).max(1);
    let cap = share.min(budget.per_conn).max(1);
    u32::try_from(bytes.div_ceil(MIN_CHANNEL_BYTES).clamp(1, u64::from(cap))).unwrap_or(cap)
}

/// The launch of a group: `base` with the transfers grouped into connections (peer order, sends
/// first; each connection's operations in call order) and the channels it launches. Empty
/// transfers are left out; `None` when nothing is left to move.
pub fn plan(base: CollArgs, transfers: &[Transfer], budget: P2pBudget) -> Result<Option<(Box<P2pArgs>, u32)>> {
    let (rank, nranks) = (base.rank, base.nranks);
    for t in transfers {
        if t.peer >= nranks || t.peer == rank {
            return Err(Error::InvalidArgument(format!(
                "grouped p2p: peer {} of rank {rank} (of {nranks}) is not another rank",
                t.peer
            )));
        }
        if t.bytes > 0 && t.buf == 0 {
            return Err(Error::InvalidArgument("grouped p2p: a null device buffer".into()));
        }
    }
    let live: Vec<&Transfer> = transfers.iter().filter(|t| t.bytes > 0).collect();
    if live.is_empty() {
        return Ok(None);
    }
    if live.len() > MAX_OPS {
        return Err(Error::InvalidArgument(format!(
            "{} device sends/receives on one communicator in one group; occl runs at most {MAX_OPS} per group and \
             communicator: split the group",
            live.len()
        )));
    }
    let mut g = Box::new(P2pArgs {
        base,
        nconns: 0,
        pad: [0; 3],
        conns: [P2pConn::default(); MAX_CONNS],
        ops: [P2pOp::default(); MAX_OPS],
    });
    let (mut nops, mut nconns, mut total) = (0usize, 0usize, 0u32);
    for peer in 0..nranks {
        for send in [true, false] {
            let mine: Vec<&&Transfer> = live.iter().filter(|t| t.peer == peer && t.send == send).collect();
            if mine.is_empty() {
                continue;
            }
            let bytes = mine.iter().fold(0u64, |s, t| s.saturating_add(t.bytes));
            let c = conn_channels(bytes, budget, nranks);
            g.conns[nconns] = P2pConn {
                peer,
                send: u32::from(send),
                first: nops as u32,
                nops: mine.len() as u32,
                channels: c,
                pad: 0,
            };
            for t in mine {
                g.ops[nops] = P2pOp { buf: t.buf, bytes: t.bytes };
                nops += 1;
            }
            nconns += 1;
            total += c;
        }
    }
    g.nconns = nconns as u32;
    Ok(Some((g, total)))
}

impl CollKernels {
    /// Enqueues a group's sends and receives (a [`plan`]) as one launch of `channels` on
    /// `stream`, as many to a block as the collectives run.
    ///
    /// # Safety
    /// As [`CollKernels::launch`]: every buffer of `args` is live device memory of its bytes
    /// until the stream has run it, and every peer launches its side of each connection.
    pub unsafe fn launch_p2p(&self, stream: &CudaStream, args: &P2pArgs, channels: u32) -> Result<()> {
        if stream.context() != &self.ctx {
            return Err(Error::InvalidArgument("the stream belongs to another device context".into()));
        }
        if channels == 0 {
            return Err(Error::InvalidArgument("a p2p launch of 0 channels".into()));
        }
        let prog = self.program(None, false, self.lane())?;
        let f = prog.funcs.get(2).ok_or_else(|| Error::InvalidArgument("no grouped p2p kernel".into()))?;
        let cfg = self.grid(channels);
        // SAFETY: one argument, the struct the kernel takes by value; the caller vouches for it.
        unsafe { self.launch_peers(stream, &f.f, args, cfg, "cuLaunchKernel(occl_p2p_group)") }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base(rank: u32, nranks: u32) -> CollArgs {
        CollArgs { rank, nranks, ..CollArgs::default() }
    }

    fn t(send: bool, peer: u32, buf: u64, bytes: u64) -> Transfer {
        Transfer { send, peer, buf, bytes }
    }

    /// A budget with no cap on one connection besides its share.
    fn all(total: u32) -> P2pBudget {
        P2pBudget { total, per_conn: total }
    }

    #[test]
    fn one_connection_takes_at_most_its_cap_and_its_share() {
        let b = P2pBudget { total: 128, per_conn: 32 };
        // Two ranks: a share of 64, held to 32; four: 21; eight: 9.
        assert_eq!([2, 4, 8].map(|n| conn_channels(1 << 30, b, n)), [32, 21, 9]);
        assert_eq!(conn_channels(100 << 10, b, 2), 4, "small connections take a channel per 32 KiB");
        let (g, total) =
            plan(base(0, 2), &[t(true, 1, 0x10, 1 << 30), t(false, 1, 0x20, 1 << 30)], b).unwrap().unwrap();
        assert_eq!((g.conns[0].channels, g.conns[1].channels, total), (32, 32, 64));
    }

    #[test]
    fn the_argument_block_has_the_kernels_layout_and_fits_a_launch() {
        let size = std::mem::size_of::<P2pArgs>();
        assert_eq!(size, std::mem::size_of::<CollArgs>() + 16 + MAX_CONNS * 24 + MAX_OPS * 16);
        // CUDA's kernel parameter limit on every architecture and driver.
        assert!(size <= 4096, "{size} bytes");
    }

    #[test]
    fn a_ring_exchange_splits_into_a_send_and_a_receive_connection() {
        // Rank 1 of 4 sends to 2 and receives from 0: two connections, each with its own channels.
        let (g, total) =
            plan(base(1, 4), &[t(true, 2, 0x1000, 1 << 20), t(false, 0, 0x2000, 1 << 20)], all(128)).unwrap().unwrap();
        assert_eq!(g.nconns, 2);
        let recv = g.conns[0];
        let send = g.conns[1];
        assert_eq!((recv.peer, recv.send, recv.first, recv.nops), (0, 0, 0, 1));
        assert_eq!((send.peer, send.send, send.first, send.nops), (2, 1, 1, 1));
        assert_eq!(g.ops[0], P2pOp { buf: 0x2000, bytes: 1 << 20 });
        assert_eq!(g.ops[1], P2pOp { buf: 0x1000, bytes: 1 << 20 });
        // 128 channels shared by 6 possible connections: 21 each; 1 MiB wants 32.
        assert_eq!((recv.channels, send.channels, total), (21, 21, 42));
    }

    #[test]
    fn timer_records_run_per_connection_then_per_operation_then_per_channel() {
        // Rank 0 of 2: two sends to rank 1 and a receive from it.
        let ops = [t(true, 1, 0x10, 1 << 20), t(false, 1, 0x20, 1 << 20), t(true, 1, 0x30, 1 << 20)];
        let (g, _) = plan(base(0, 2), &ops, all(16)).unwrap().unwrap();
        let conns = &g.conns[..g.nconns as usize];
        let rec: Vec<_> = records(conns).map(|(c, i)| (c.send, i, c.channels)).collect();
        assert_eq!(rec, vec![(1, 0, 8), (1, 1, 8), (0, 0, 8)], "the send connection first, its two operations");
    }

    #[test]
    fn both_ends_of_a_connection_agree_whatever_else_their_groups_hold() {
        // Rank 0 sends 3 MiB then 5 KiB to rank 1 among other work; rank 1 only receives them.
        let sender = [t(true, 1, 0x10, 3 << 20), t(false, 2, 0x20, 7 << 20), t(true, 1, 0x30, 5 << 10)];
        let receiver = [t(false, 0, 0x40, 3 << 20), t(false, 0, 0x50, 5 << 10)];
        let (a, _) = plan(base(0, 3), &sender, all(64)).unwrap().unwrap();
        let (b, total) = plan(base(1, 3), &receiver, all(64)).unwrap().unwrap();
        let to1 = a.conns[..a.nconns as usize].iter().find(|c| c.peer == 1 && c.send == 1).unwrap();
        let from0 = b.conns[0];
        assert_eq!(b.nconns, 1);
        assert_eq!(to1.channels, from0.channels, "the two ends split the connection alike");
        assert_eq!(total, from0.channels);
        // The same operations in the same (call) order, byte for byte.
        let sizes = |g: &P2pArgs, c: &P2pConn| -> Vec<u64> {
            (c.first..c.first + c.nops).map(|i| g.ops[i as usize].bytes).collect()
        };
        assert_eq!(sizes(&a, to1), vec![3 << 20, 5 << 10]);
        assert_eq!(sizes(&a, to1), sizes(&b, &from0));
        assert_eq!(a.ops[to1.first as usize].buf, 0x10);
    }

    #[test]
    fn the_grid_never_exceeds_the_channel_budget() {
        // An 8-rank all-to-all: 14 connections, all large.
        let mut ops = Vec::new();
        for p in 1..8 {
            ops.push(t(true, p, 0x1000 * u64::from(p), 1 << 30));
            ops.push(t(false, p, 0x100000 * u64::from(p), 1 << 30));
        }
        for channels in [1, 7, 14, 32, 128, 1024] {
            let (g, total) = plan(base(0, 8), &ops, all(channels)).unwrap().unwrap();
            assert_eq!(g.nconns, 14);
            assert!(total <= channels.max(14), "{channels}: {total}");
            assert!(g.conns.iter().take(14).all(|c| c.channels >= 1 && c.channels <= channels.max(1)));
        }
        assert_eq!(conn_channels(1, all(128), 2), 1);
        assert_eq!(conn_channels(1 << 30, all(128), 2), 64);
        assert_eq!(conn_channels(1 << 30, all(128), 1), 128);
    }

    #[test]
    fn empty_transfers_are_dropped_and_bad_ones_refused() {
        assert!(plan(base(0, 2), &[], all(8)).unwrap().is_none());
        assert!(plan(base(0, 2), &[t(true, 1, 0, 0)], all(8)).unwrap().is_none());
        let (g, _) = plan(base(0, 2), &[t(true, 1, 0, 0), t(true, 1, 0x40, 64)], all(8)).unwrap().unwrap();
        assert_eq!((g.nconns, g.conns[0].nops, g.ops[0].buf), (1, 1, 0x40));
        let msg = |r: Result<Option<(Box<P2pArgs>, u32)>>| r.unwrap_err().to_string();
        assert!(msg(plan(base(0, 2), &[t(true, 2, 0x40, 64)], all(8))).contains("peer 2"));
        assert!(msg(plan(base(0, 2), &[t(false, 0, 0x40, 64)], all(8))).contains("peer 0"));
        assert!(msg(plan(base(0, 2), &[t(true, 1, 0, 64)], all(8))).contains("null"));
        let many = vec![t(true, 1, 0x40, 64); MAX_OPS + 1];
        assert!(msg(plan(base(0, 2), &many, all(8))).contains("split the group"));
        assert!(plan(base(0, 2), &many[..MAX_OPS], all(8)).unwrap().is_some());
    }
}
