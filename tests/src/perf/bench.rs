//! Running one collective on a communicator for `occl-perf`: filling inputs, checking results,
//! and timing batches, on byte buffers through occl's raw interface (so every datatype works
//! without generics).

use super::{Collective, Layout};
use crate::pattern::{self, bytes_of, bytes_of_mut};
use occl::{Comm, DataType, RedOp};
use std::time::Instant;

/// How the per-rank times of one batch become the reported time (nccl-tests' `-a`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Average {
    /// Rank 0's own time.
    Rank0,
    /// The mean over ranks.
    Avg,
    /// The fastest rank.
    Min,
    /// The slowest rank (the default here).
    Max,
}

impl Average {
    pub fn from_flag(v: u8) -> Average {
        match v {
            0 => Average::Rank0,
            1 => Average::Avg,
            2 => Average::Min,
            _ => Average::Max,
        }
    }

    pub fn describe(self) -> &'static str {
        match self {
            Average::Rank0 => "rank 0's time",
            Average::Avg => "mean over ranks",
            Average::Min => "min over ranks",
            Average::Max => "max over ranks",
        }
    }
}

/// Bytes written into outputs before a checked run, so that an element the collective never
/// wrote is seen as wrong: 0x7f… is NaN or far out of the patterns' range in every datatype.
const POISON: u8 = 0x7f;

/// One collective on one communicator, with buffers for the largest size.
pub struct Bench<'a> {
    pub comm: &'a Comm,
    pub coll: Collective,
    pub dt: DataType,
    pub op: RedOp,
    pub root: usize,
    send: Mem,
    recv: Mem,
    cap: usize,
}

/// A buffer: plain memory, or a `HostBuf` that peers can map (`--registered`).
type Mem = Box<dyn std::ops::DerefMut<Target = [u64]>>;

impl<'a> Bench<'a> {
    /// `max_bytes`: the largest `Layout::bytes` that will be run (both buffers get that many).
    pub fn new(comm: &'a Comm, coll: Collective, dt: DataType, op: RedOp, root: usize, max_bytes: usize) -> Bench<'a> {
        Bench {
            comm,
            coll,
            dt,
            op,
            root,
            send: Box::new(pattern::aligned(max_bytes)),
            recv: Box::new(pattern::aligned(max_bytes)),
            cap: max_bytes,
        }
    }

    /// Moves both buffers to `HostBuf`s and registers them with the communicator (collective):
    /// all-reduce, all-gather and reduce-scatter then take the registered path. Returns whether the windows are
    /// shared (active).
    pub fn register(&mut self) -> occl::Result<bool> {
        let words = self.send.len();
        let send = occl::HostBuf::<u64>::alloc(words)?;
        let recv = occl::HostBuf::<u64>::alloc(words)?;
        let hs = self.comm.register(&send[..])?;
        let hr = self.comm.register(&recv[..])?;
        self.send = Box::new(send);
        self.recv = Box::new(recv);
        Ok(hs.shared() && hr.shared())
    }

    /// Whether this collective has an in-place form here. Send/recv does not: without groups
    /// occl's send and recv are blocking calls run one after the other (see `launch`), so a rank
    /// that receives first would overwrite what it has yet to send.
    pub fn has_in_place(&self) -> bool {
        self.coll != Collective::SendRecv
    }

    /// A barrier: an all-reduce of one element.
    pub fn barrier(&self) -> occl::Result<()> {
        let mut one = [0u64];
        self.comm.all_reduce_in_place(&mut one, RedOp::Sum)
    }

    /// One call of the collective on `count` elements (per block for the blocked ones).
    ///
    /// Send/recv is a ring: rank r sends to r+1 and receives from r-1. occl has no groups, and
    /// a send blocks until the peer has taken the data (beyond what the FIFO holds), so the
    /// ring runs as a chain that closes: rank 0 sends then receives; every other rank receives
    /// then sends. It is deadlock-free for every size, and its time is that of n transfers one
    /// after another (for 2 ranks: a ping-pong), not of n concurrent ones.
    pub fn launch(&mut self, layout: Layout, inplace: bool) -> occl::Result<()> {
        let (n, r, count, dt) = (self.comm.nranks(), self.comm.rank(), layout.count, self.dt);
        let block = count * dt.size();
        debug_assert!(layout.bytes <= self.cap);
        let s = self.send.as_mut_ptr().cast::<u8>();
        let d = self.recv.as_mut_ptr().cast::<u8>();
        let c = self.comm;
        // SAFETY: both buffers hold `cap` ≥ layout.bytes bytes, which is what every call below
        // reads or writes (count elements, or n blocks of count for the blocked collectives);
        // the in-place forms pass the pointer pairs that the raw calls document as in place.
        unsafe {
            match (self.coll, inplace) {
                (Collective::AllReduce, false) => c.all_reduce_raw(s, d, count, dt, self.op),
                (Collective::AllReduce, true) => c.all_reduce_raw(d, d, count, dt, self.op),
                (Collective::Broadcast, false) => c.broadcast_raw(s, d, count, dt, self.root),
                (Collective::Broadcast, true) => c.broadcast_raw(d, d, count, dt, self.root),
                (Collective::Reduce, false) => c.reduce_raw(s, d, count, dt, self.op, self.root),
                (Collective::Reduce, true) => c.reduce_raw(d, d, count, dt, self.op, self.root),
                (Collective::AllGather, false) => c.all_gather_raw(s, d, count, dt),
                (Collective::AllGather, true) => c.all_gather_raw(d.add(r * block), d, count, dt),
                (Collective::ReduceScatter, false) => c.reduce_scatter_raw(s, d, count, dt, self.op),
                (Collective::ReduceScatter, true) => c.reduce_scatter_raw(d, d.add(r * block), count, dt, self.op),
                (Collective::AllToAll, false) => c.all_to_all_raw(s, d, count, dt),
                (Collective::AllToAll, true) => c.all_to_all_raw(d, d, count, dt),
                (Collective::SendRecv, _) => {
                    let (next, prev) = ((r + 1) % n, (r + n - 1) % n);
                    if r == 0 {
                        c.send_raw(s, count, dt, next)?;
                        c.recv_raw(d, count, dt, prev)
                    } else {
                        c.recv_raw(d, count, dt, prev)?;
                        c.send_raw(s, count, dt, next)
                    }
                }
            }
        }
    }

    /// Fills the inputs with the test pattern, poisons the outputs, runs the collective once,
    /// and returns how many elements this rank got wrong.
    pub fn check(&mut self, layout: Layout, inplace: bool) -> occl::Result<u64> {
        self.prepare(layout, inplace);
        self.launch(layout, inplace)?;
        Ok(self.count_wrong(layout, inplace) as u64)
    }

    fn prepare(&mut self, layout: Layout, inplace: bool) {
        let (n, r, dt, op) = (self.comm.nranks(), self.comm.rank(), self.dt, self.op);
        let block = layout.count * dt.size();
        let cap = self.cap;
        let send = bytes_of_mut(&mut self.send, cap);
        let recv = bytes_of_mut(&mut self.recv, cap);
        // Inputs of collectives that only move data use the Sum pattern (any values do).
        let data = if self.coll.reduces() { op } else { RedOp::Sum };
        match self.coll {
            Collective::AllReduce | Collective::Reduce => {
                recv[..block].fill(POISON);
                let input = if inplace { &mut recv[..block] } else { &mut send[..block] };
                pattern::fill(dt, data, r, 0, input);
            }
            Collective::Broadcast => {
                recv[..block].fill(POISON);
                if r == self.root {
                    let input = if inplace { &mut recv[..block] } else { &mut send[..block] };
                    pattern::fill(dt, data, r, 0, input);
                }
            }
            Collective::AllGather => {
                recv[..n * block].fill(POISON);
                let input = if inplace { &mut recv[r * block..(r + 1) * block] } else { &mut send[..block] };
                pattern::fill(dt, data, r, r * layout.count, input);
            }
            Collective::ReduceScatter | Collective::AllToAll => {
                recv[..n * block].fill(POISON);
                let input = if inplace { &mut recv[..n * block] } else { &mut send[..n * block] };
                pattern::fill(dt, data, r, 0, input);
            }
            Collective::SendRecv => {
                recv[..block].fill(POISON);
                pattern::fill(dt, data, r, 0, &mut send[..block]);
            }
        }
    }

    fn count_wrong(&self, layout: Layout, inplace: bool) -> usize {
        let (n, r, dt, op) = (self.comm.nranks(), self.comm.rank(), self.dt, self.op);
        let count = layout.count.max(1);
        let block = layout.count * dt.size();
        let recv = bytes_of(&self.recv, self.cap);
        let sum = RedOp::Sum;
        match self.coll {
            Collective::AllReduce => pattern::wrong_reduced(dt, op, n, &recv[..block], 0),
            Collective::Reduce if r == self.root => pattern::wrong_reduced(dt, op, n, &recv[..block], 0),
            Collective::Reduce => 0,
            Collective::Broadcast => {
                pattern::wrong_exact(dt, &recv[..block], |i| pattern::value(dt, sum, self.root, i))
            }
            // Element k of the result is element k of rank k/count's contribution.
            Collective::AllGather => {
                pattern::wrong_exact(dt, &recv[..n * block], |k| pattern::value(dt, sum, k / count, k))
            }
            Collective::ReduceScatter => {
                let out = if inplace { &recv[r * block..(r + 1) * block] } else { &recv[..block] };
                pattern::wrong_reduced(dt, op, n, out, r * count)
            }
            // Block `from` of the result is block r of rank `from`'s input.
            Collective::AllToAll => pattern::wrong_exact(dt, &recv[..n * block], |k| {
                let (from, e) = (k / count, k % count);
                pattern::value(dt, sum, from, r * count + e)
            }),
            Collective::SendRecv => {
                let prev = (r + n - 1) % n;
                pattern::wrong_exact(dt, &recv[..block], |i| pattern::value(dt, sum, prev, i))
            }
        }
    }

    /// The same benchmark on `comm` (a communicator of the same ranks), on buffers of its own.
    pub fn on<'c>(&self, comm: &'c Comm) -> Bench<'c> {
        Bench::new(comm, self.coll, self.dt, self.op, self.root, self.cap)
    }

    /// `warmup` untimed calls, a barrier, then `iters` calls timed as one batch: this rank's
    /// seconds per call.
    pub fn time(&mut self, layout: Layout, inplace: bool, warmup: usize, iters: usize) -> occl::Result<f64> {
        for _ in 0..warmup {
            self.launch(layout, inplace)?;
        }
        self.barrier()?;
        let t0 = Instant::now();
        for _ in 0..iters {
            self.launch(layout, inplace)?;
        }
        Ok(t0.elapsed().as_secs_f64() / iters.max(1) as f64)
    }

    /// Combines every rank's time as `how` says (a collective call: every rank must make it).
    pub fn combine(&self, secs: f64, how: Average) -> occl::Result<f64> {
        let n = self.comm.nranks() as f64;
        let mut out = [0f64];
        match how {
            Average::Rank0 => Ok(secs),
            Average::Avg => {
                self.comm.all_reduce(&[secs], &mut out, RedOp::Sum)?;
                Ok(out[0] / n)
            }
            Average::Min => {
                self.comm.all_reduce(&[secs], &mut out, RedOp::Min)?;
                Ok(out[0])
            }
            Average::Max => {
                self.comm.all_reduce(&[secs], &mut out, RedOp::Max)?;
                Ok(out[0])
            }
        }
    }

    /// The sum over ranks of a count (wrong elements).
    pub fn sum(&self, v: u64) -> occl::Result<u64> {
        let mut out = [0u64];
        self.comm.all_reduce(&[v], &mut out, RedOp::Sum)?;
        Ok(out[0])
    }
}
