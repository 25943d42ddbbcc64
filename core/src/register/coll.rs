//! The registered collectives: all-reduce, all-gather and reduce-scatter as loads and stores on
//! every rank's buffers, mapped in this process (`Plan`, made by `Registry::plan`). One
//! operation publishes "ready" with its arguments, moves its share of the data in place, and
//! publishes "done"; between the two nobody else touches the bytes it owns. A share that is
//! large splits across the rank's helper threads (`threads`).

use super::threads;
use super::{CtrlAt, Registry, BELL, DESC, DONE, READY, SLEEPERS, STATE};
use crate::dtype::{DataType, RedOp};
use crate::error::{Error, Result};
use crate::record::CollType;
use crate::wait::{self, Deadline, Patience};
use occl_ras_proto::record::step_state;
use std::sync::atomic::{AtomicBool, Ordering};

/// One rank's view of a registered operation: the buffers of every rank, in this process.
pub(crate) struct Plan<'r> {
    pub(super) reg: &'r Registry,
    pub(super) ctrls: Vec<CtrlAt>,
    /// Per rank: its send and recv buffer as mapped here.
    pub(super) send: Vec<usize>,
    pub(super) recv: Vec<usize>,
    /// Hash of the arguments every rank must agree on.
    pub(super) desc: u64,
}

/// Where the collective runs: rank, peers' pids for liveness, abort flag and timeout.
pub(crate) struct Env<'a> {
    pub rank: usize,
    pub pids: &'a [u32],
    pub abort: &'a AtomicBool,
    pub deadline: Deadline,
    pub patience: Patience,
    /// `OCCL_REG_THREADS`, if set.
    pub threads: Option<usize>,
    /// This host's ranks of the communicator and the cores they share (from the peer table).
    pub host_share: (usize, usize),
    /// The rank record: a wait that blocks says on which peer and in which state, for RAS.
    pub record: &'a crate::record::OpRecord,
}

/// The algorithm name that flight records and profiler events give registered operations.
pub(crate) const ALGO: &str = "registered";

/// Bytes reduced per pass: the output block stays in L1 while every input is added to it. 16 KiB
/// was ahead of 64 KiB at 64 MiB and 2 ranks in both A/B runs on 16-CPU hosts (1.38 against 1.20×
/// the ring; 1.26 against 1.21×, and 1.50 against 1.39× at 4 ranks; bench/baselines/
/// registered-vs-mpi.md).
const BLOCK: usize = 16 << 10;

/// Bytes of an all-gather's block written to every rank before the next: read from memory once,
/// then from cache for the other copies.
const GATHER_PIECE: usize = 128 << 10;

impl Plan<'_> {
    /// Runs `coll` of `count` elements of `dt` (per rank's block for all-gather and
    /// reduce-scatter): the collectives with a registered form.
    pub(crate) fn run(&self, env: &Env<'_>, coll: CollType, count: usize, dt: DataType, op: RedOp) -> Result<()> {
        match coll {
            CollType::AllReduce => self.all_reduce(env, count, dt, op),
            CollType::AllGather => self.all_gather(env, count * dt.size()),
            CollType::ReduceScatter => self.reduce_scatter(env, count, dt, op),
            c => Err(Error::internal(format!("no registered path for {}", c.name()))),
        }
    }

    fn n(&self) -> usize {
        self.send.len()
    }

    /// Waits until rank `q`'s word `off` reaches `k`; if it must wait, the rank record says so,
    /// with the ProxyStep `state` that names the wait for RAS.
    fn wait(&self, env: &Env<'_>, q: usize, off: usize, k: u64, what: &str, state: u32) -> Result<()> {
        let c = &self.ctrls[q];
        let pid = env.pids[q];
        let foreign = pid != env.pids[env.rank];
        let mut check = |slow: bool| -> Result<()> {
            if env.abort.load(Ordering::Relaxed) {
                return Err(Error::usage("the communicator was aborted"));
            }
            if c.u64(STATE).load(Ordering::Acquire) != 0 {
                return Err(Error::remote(q, "failed or aborted during a registered collective"));
            }
            if slow && foreign && !crate::transport::fifo::pid_alive(pid) {
                return Err(Error::remote(q, format!("process {pid} died during a registered collective")));
            }
            Ok(())
        };
        let word = c.u64(off);
        if word.load(Ordering::Acquire) < k {
            env.record.waiting_on(q, state);
        }
        let name = || {
            format!(
                "registered {what} (operation {k}): waiting for rank {q}; if rank {q} passed a buffer outside its \
                 registered windows while this rank passed registered ones, every rank must pass registered buffers \
                 (at the same window offsets) or none"
            )
        };
        wait::wait_until(
            || word.load(Ordering::Acquire) >= k,
            c.u32(BELL),
            c.u32(SLEEPERS),
            &mut check,
            &env.deadline,
            env.patience,
            &name,
            None,
        )
    }

    /// Publishes "ready" with the arguments and waits for every peer's, checking they agree.
    fn start(&self, env: &Env<'_>, what: &str) -> Result<u64> {
        let k = self.reg.seq.fetch_add(1, Ordering::Relaxed) + 1;
        let me = &self.ctrls[env.rank];
        me.u64(DESC).store(self.desc, Ordering::Relaxed);
        me.publish(READY, k);
        for q in (0..self.n()).filter(|&q| q != env.rank) {
            // Its buffers are not posted yet: NCCL's "waiting for the peer" of a send.
            self.wait(env, q, READY, k, what, step_state::SEND_PEER_WAIT)?;
            // The peer cannot start operation k+1 before this rank's "done" of k.
            if self.ctrls[q].u64(DESC).load(Ordering::Acquire) != self.desc {
                return Err(Error::usage(format!(
                    "operation mismatch: rank {q} called a different registered collective, or other arguments or \
                     buffer offsets, than rank {} in {what}",
                    env.rank
                )));
            }
        }
        Ok(k)
    }

    /// Publishes "done" and waits for every peer's: then nobody reads this rank's buffers.
    /// `state`: what a peer that is not done still owes this rank, for RAS (`RECV_WAIT` where it
    /// writes this rank's output, `SEND_WAIT` where it only reads this rank's input).
    fn finish(&self, env: &Env<'_>, k: u64, what: &str, state: u32) -> Result<()> {
        self.ctrls[env.rank].publish(DONE, k);
        for q in (0..self.n()).filter(|&q| q != env.rank) {
            self.wait(env, q, DONE, k, what, state)?;
        }
        Ok(())
    }

    /// All-reduce of `count` elements: rank r reduces chunk r of every rank's send buffer, a
    /// cache-sized block at a time, and writes each reduced block into chunk r of every rank's
    /// recv buffer. Each input is read once and each output written once: no second pass.
    fn all_reduce(&self, env: &Env<'_>, count: usize, dt: DataType, op: RedOp) -> Result<()> {
        let (n, me, es) = (self.n(), env.rank, dt.size());
        let (lo, hi) = (me * count / n * es, (me + 1) * count / n * es);
        let k = self.start(env, "all_reduce")?;
        // Far larger than the caches: stream the outputs (they are not read back soon).
        let stream = crate::copy::streams(count * es);
        // This rank's output first, then the others in ring order (spreads the writes).
        let outputs: Vec<usize> = (0..n).map(|s| self.recv[(me + s) % n]).collect();
        let ran = self.split(env, lo, hi, |a, b| {
            let (send, outputs) = (self.send.clone(), outputs.clone());
            // SAFETY: as below, for a part of this rank's chunk that no other part touches.
            Box::new(move || unsafe { reduce_range(&send, &outputs, me, (a, b), dt, op, stream) })
        });
        match ran {
            Some(r) => r?,
            // SAFETY: every rank's send and recv buffers hold `count` elements (checked against
            // the windows in `plan`). Chunk `me` of every send buffer is read by this rank alone,
            // and chunk `me` of every recv buffer written by this rank alone; in place, this rank
            // overwrites a block only after reading it. Nobody touches them before READY or
            // after DONE.
            None => unsafe { reduce_range(&self.send, &outputs, me, (lo, hi), dt, op, stream) },
        }
        self.finish(env, k, "all_reduce", step_state::RECV_WAIT)
    }

    /// Reduce-scatter into `count` elements per rank: rank r reduces block r of every rank's
    /// send buffer into its own recv buffer, reading its peers' buffers in place. Each input
    /// byte is read once, by the one rank whose block it is, and only this rank's output is
    /// written: no FIFO, no second pass.
    fn reduce_scatter(&self, env: &Env<'_>, count: usize, dt: DataType, op: RedOp) -> Result<()> {
        let (me, bytes) = (env.rank, count * dt.size());
        let k = self.start(env, "reduce_scatter")?;
        let stream = crate::copy::streams(bytes);
        // Block `me` of every rank's send buffer, as one buffer per rank from offset 0.
        let inputs: Vec<usize> = self.send.iter().map(|&s| s + me * bytes).collect();
        let output = [self.recv[me]];
        let ran = self.split(env, 0, bytes, |a, b| {
            let inputs = inputs.clone();
            // SAFETY: as below, for a part of this rank's block that no other part touches.
            Box::new(move || unsafe { reduce_range(&inputs, &output, me, (a, b), dt, op, stream) })
        });
        match ran {
            Some(r) => r?,
            // SAFETY: every rank's send buffer holds n blocks of `bytes` and this rank's recv
            // buffer one (checked against the windows in `plan`). Block `me` of every send buffer
            // is read by this rank alone, and its recv buffer written by it alone; in place (recv
            // is block `me` of its send), a piece is written only after it is read. Nobody
            // touches them before READY or after DONE.
            None => unsafe { reduce_range(&inputs, &output, me, (0, bytes), dt, op, stream) },
        }
        self.finish(env, k, "reduce_scatter", step_state::SEND_WAIT)
    }

    /// All-gather of `block` bytes per rank: this rank writes its send block into block `rank`
    /// of every rank's recv buffer, a cache-sized piece at a time, so each input is read from
    /// memory once; pulling every peer's block read each input n times.
    fn all_gather(&self, env: &Env<'_>, block: usize) -> Result<()> {
        let me = env.rank;
        let k = self.start(env, "all_gather")?;
        let stream = crate::copy::streams(block);
        let ran = self.split(env, 0, block, |a, b| {
            let (src, recv) = (self.send[me], self.recv.clone());
            // SAFETY: as below, for a part of this rank's block that no other part touches.
            Box::new(move || unsafe { gather_range(src, &recv, me, block, (a, b), stream) })
        });
        match ran {
            Some(r) => r?,
            // SAFETY: block `me` of every rank's recv buffer is written by this rank alone and
            // read by nobody before DONE; this rank's send block is unchanged until then (in
            // place it is block `me` of its own recv buffer, which is skipped).
            None => unsafe { gather_range(self.send[me], &self.recv, me, block, (0, block), stream) },
        }
        self.finish(env, k, "all_gather", step_state::RECV_WAIT)
    }

    /// Runs this rank's byte range `[lo, hi)` in parts on its helper threads and itself, `part`
    /// making the work of each; `None` when the range is too small to split or the rank has no
    /// helpers (the caller then runs it whole).
    fn split(
        &self,
        env: &Env<'_>,
        lo: usize,
        hi: usize,
        part: impl Fn(usize, usize) -> threads::Part,
    ) -> Option<Result<()>> {
        if hi.saturating_sub(lo) < 2 * threads::PART_MIN {
            return None;
        }
        let helpers = self.reg.threads.get_or_init(|| {
            let mine = crate::topo::cpuset::process_affinity().map_or(1, |s| s.len());
            let (local, cores) = env.host_share;
            threads::Threads::start(threads::wanted(env.threads, local, cores, mine), env.rank)
        });
        if helpers.len() == 0 {
            return None;
        }
        let mut parts = threads::split(lo, hi, helpers.len() + 1);
        let (a, b) = parts.pop()?;
        let mine = part(a, b);
        Some(helpers.run(parts.into_iter().map(|(a, b)| part(a, b)).collect(), mine))
    }
}

/// Reduces bytes `[lo, hi)` of every rank's input (`inputs`, by rank, as mapped here) into the
/// same bytes of each of `outputs`, a block at a time, starting with rank `me`'s input and
/// folding the others in ring order from it (every element on every rank alike).
///
/// # Safety
/// Every buffer holds `hi` bytes; nothing else reads or writes `[lo, hi)` of the outputs or
/// writes it in the inputs meanwhile, except in place, where a block is written only after it
/// is read.
unsafe fn reduce_range(
    inputs: &[usize],
    outputs: &[usize],
    me: usize,
    (lo, hi): (usize, usize),
    dt: DataType,
    op: RedOp,
    stream: bool,
) {
    let n = inputs.len();
    let mut scratch = vec![0u64; BLOCK / 8];
    let mut at = lo;
    while at < hi {
        let len = BLOCK.min(hi - at);
        // SAFETY: the caller's contract; `acc` is this call's scratch.
        unsafe {
            let acc = std::slice::from_raw_parts_mut(scratch.as_mut_ptr().cast::<u8>(), len);
            let input = |q: usize| std::slice::from_raw_parts((inputs[q] + at) as *const u8, len);
            let mut others = (1..n).map(|s| (me + s) % n);
            match others.next() {
                Some(q) => crate::reduce::reduce(dt, op, acc, input(me), input(q)),
                None => acc.copy_from_slice(input(me)),
            }
            for q in others {
                crate::reduce::reduce_in_place(dt, op, acc, input(q));
            }
            if op == RedOp::Avg {
                crate::reduce::div_in_place(dt, acc, n);
            }
            for &out in outputs {
                crate::copy::piece((out + at) as *mut u8, acc.as_ptr(), len, stream);
            }
        }
        at += len;
    }
}

/// Copies bytes `[lo, hi)` of rank `me`'s send block (at `src`) into block `me` of every rank's
/// recv buffer (`recv`, by rank), a cache-sized piece at a time, so the input is read from
/// memory once; a destination that is the source (in place) is skipped.
///
/// # Safety
/// `src` holds `hi` bytes, every recv buffer `(me + 1) * block`; nothing else writes `[lo, hi)`
/// of block `me` of the recv buffers or of the source meanwhile.
unsafe fn gather_range(src: usize, recv: &[usize], me: usize, block: usize, (lo, hi): (usize, usize), stream: bool) {
    let n = recv.len();
    let mut at = lo;
    while at < hi {
        let len = GATHER_PIECE.min(hi - at);
        for s in 0..n {
            let dst = recv[(me + s) % n] + me * block + at;
            if dst == src + at {
                continue; // in place on this rank
            }
            // SAFETY: the caller's contract.
            unsafe { crate::copy::piece(dst as *mut u8, (src + at) as *const u8, len, stream) };
        }
        at += len;
    }
}
