//! One operation as the pipeline carries it: what the API built from a checked call, what a
//! group queues and what the executor runs. A value with the caller's buffer addresses, so it
//! can wait in a group until `group_end` (the `_raw` calls' contract keeps the buffers alive).
//! `check` validates a call against its collective's layout, for the host and device paths.

mod check;

#[cfg(feature = "cuda")]
pub(crate) use check::{check_ptr, Touched};

use crate::dtype::{DataType, RedOp};
use crate::profile::op::OpDescr;
use crate::record::CollType;

/// A checked call.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Op {
    pub coll: CollType,
    /// Elements of `dt` per rank (per block for all-gather, reduce-scatter and all-to-all), as
    /// NCCL counts.
    pub count: usize,
    pub dt: DataType,
    pub op: Option<RedOp>,
    pub root: Option<usize>,
    pub peer: Option<usize>,
    /// Buffer addresses (valid until the operation has run: the caller's contract).
    pub send: usize,
    pub recv: usize,
}

impl Op {
    /// `send` and `recv` are addresses, host or device (0: no buffer).
    pub(crate) fn new(coll: CollType, count: usize, dt: DataType, send: usize, recv: usize) -> Op {
        Op { coll, count, dt, op: None, root: None, peer: None, send, recv }
    }

    pub(crate) fn op(self, op: RedOp) -> Op {
        Op { op: Some(op), ..self }
    }

    pub(crate) fn root(self, root: usize) -> Op {
        Op { root: Some(root), ..self }
    }

    pub(crate) fn peer(self, peer: usize) -> Op {
        Op { peer: Some(peer), ..self }
    }

    pub(crate) fn is_p2p(&self) -> bool {
        matches!(self.coll, CollType::Send | CollType::Recv)
    }

    /// The descriptor of the call's API event (and, with the run's details, its Coll/P2p).
    pub(crate) fn descr(&self) -> OpDescr<'static> {
        OpDescr {
            func: nccl_func(self.coll),
            p2p: self.is_p2p(),
            seq_number: 0,
            send_buff: self.send,
            recv_buff: self.recv,
            count: self.count,
            root: self.root.unwrap_or(0) as i32,
            peer: self.peer.map_or(-1, |p| p as i32),
            datatype: self.dt.nccl_name(),
            algo: "",
            proto: "",
            chunk_size: 0,
            n_channels: 1,
        }
    }
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
