//! Direct exchanges: all-to-all as n-1 pairwise steps (step k sends to rank+k while receiving
//! from rank-k, half a FIFO at a time, so every FIFO in use is being drained by its receiver),
//! the one-shot all-reduce (a schedule, and for one slice a path straight on the FIFOs), and
//! point-to-point send/recv.

use super::algo::Proto;
use super::prims::check_incoming;
use super::shape::Shape;
use super::walk::{pieces, Buf, Exec, Span};
use super::{copy_unless_same, Ctx};
use crate::dtype::RedOp;
use crate::error::{Error, Result};
use crate::profile::op::Steps;
use crate::reduce;
use crate::transport::fifo::ll;

/// All-to-all: block j of `send` goes to rank j, block i of `recv` comes from rank i. In place
/// (`send == recv`), blocks received early would overwrite blocks not yet sent, so the input
/// is staged first.
pub(crate) fn all_to_all(ctx: &mut Ctx<'_>, send: *const u8, recv: *mut u8, block: usize) -> Result<()> {
    let (n, r) = (ctx.nranks, ctx.rank);
    let total = n * block;
    let send = if std::ptr::eq(send, recv) && n > 1 && block > 0 {
        if ctx.staging.len() * 8 < total {
            *ctx.staging = vec![0u64; total.div_ceil(8)];
        }
        let stage = ctx.staging.as_mut_ptr().cast::<u8>();
        // SAFETY: recv holds `total` bytes; the staging buffer was just sized for them.
        unsafe { std::ptr::copy_nonoverlapping(send, stage, total) };
        stage as *const u8
    } else {
        send
    };
    // SAFETY: both buffers hold n blocks of `block` bytes.
    unsafe { copy_unless_same(send.add(r * block), recv.add(r * block), block) };
    if block == 0 {
        return Ok(());
    }
    // Pieces of half a FIFO: the send never waits on more than the receiver drains meanwhile.
    let piece = ctx.chunk();
    for k in 1..n {
        let (to, from) = ((r + k) % n, (r + n - k) % n);
        let mut slot = None;
        let p = ctx.prims(&mut slot, Some(to), Some(from))?;
        p.allow_direct();
        let mut off = 0;
        while off < block {
            let len = piece.min(block - off);
            // SAFETY: offsets within block `to` of send and block `from` of recv.
            unsafe {
                p.send(send.add(to * block + off), len)?;
                p.recv(recv.add(from * block + off), len)?;
            }
            off += len;
        }
        p.finish()?;
    }
    Ok(())
}

/// Small all-reduce in one step: every rank sends its buffer to every peer, then reduces all n
/// contributions itself. One message latency instead of the ring's 2(n-1) steps; the
/// contributions are combined in rank order on every rank, so all ranks get the same bits.
/// Pieces of half a FIFO: a rank sends a piece to everyone, then takes everyone's piece, so
/// every FIFO holds at most two pieces and no send waits on a rank that is sending too.
pub(crate) fn all_reduce_one_shot(s: &Shape, x: &mut impl Exec) -> Result<()> {
    let (n, r) = (s.nranks, s.rank);
    let bytes = s.count * s.elem;
    for (o, l) in pieces(bytes, s.chunk, s.elem) {
        let (mine, out) = (Span::new(Buf::Send, o, l), Span::new(Buf::Recv, o, l));
        x.prepare_all(true, l);
        for k in 1..n {
            x.send((r + k) % n, mine)?;
        }
        x.prepare_all(false, l);
        // In place, rank 0's piece overwrites this rank's own before it is folded in: keep a copy.
        let own = if r == 0 || !x.in_place() {
            mine
        } else {
            let keep = Span::new(Buf::Scratch, 0, l);
            x.copy(mine, keep)?;
            keep
        };
        for j in 0..n {
            match (j == r, j == 0) {
                (true, true) => x.copy(own, out)?,
                (true, false) => x.reduce(own, out)?,
                (false, true) => x.recv(j, out)?,
                (false, false) => x.recv_reduce(j, out, out, false)?,
            }
        }
        x.finish(out)?;
    }
    Ok(())
}

/// The most bytes `all_reduce_one_step` takes with `proto` and slices of `slice` bytes: one LL
/// step, or one Simple slot of at most as much (the fold's stack buffer).
pub(crate) fn one_step_max(proto: Proto, slice: usize) -> usize {
    match proto {
        Proto::Ll => ll::STEP_BYTES,
        Proto::Simple => slice.min(ll::STEP_BYTES),
    }
}

/// The one-shot all-reduce of a message of one slice (`one_step_max`), straight on the FIFOs:
/// the exchange `all_reduce_one_shot` schedules (one message to every peer, contributions
/// folded in rank order, so every rank gets the same bits), without a primitive built per peer
/// and message. At 8 B the call's own work is most of its latency (bench/baselines/algos-sweep.md).
/// Its steps are the schedule's, and reported through the same hooks.
pub(crate) fn all_reduce_one_step(ctx: &mut Ctx<'_>, send: *const u8, recv: *mut u8, bytes: usize) -> Result<()> {
    const WORDS: usize = ll::STEP_BYTES.div_ceil(8);
    // Real ranks: contributions are folded in rank order.
    let (n, r) = (ctx.nranks, ctx.real(ctx.rank));
    let ll = ctx.proto == Proto::Ll;
    if bytes > one_step_max(ctx.proto, ctx.geo.0) {
        return Err(Error::internal(format!("one-step all-reduce of {bytes} bytes over {}-byte slices", ctx.geo.0)));
    }
    if bytes == 0 {
        return Ok(()); // as the schedule: no pieces, no messages
    }
    let (deadline, desc, dt, op, prof, tally) = (ctx.deadline, ctx.desc, ctx.dt, ctx.op, ctx.prof, ctx.tally);
    // LL: start the cache misses of every line this call writes at once (see `ll_prepare`): the
    // store that publishes a step waits for its lines to be owned. Not for a Simple slot, whose
    // first line the receiver polls: fetching it for writing early made 64 B 10% slower.
    if ll {
        for k in 1..n {
            ctx.peer((r + k) % n)?.0.send.ll_prepare(bytes);
        }
    }
    // Every peer's message first, so all of them are on their way before this rank waits. Each
    // step begins where the one before ended (`Steps::chained`; the first has none before it
    // and reads the clock).
    for k in 1..n {
        let to = (r + k) % n;
        let mut steps = prof.and_then(|p| p.steps(Some(to), None)).map(Steps::chained);
        if let Some(st) = steps.as_mut() {
            st.send_peer_wait();
        }
        let (peer, ends) = ctx.peer(to)?;
        let fifo = &mut peer.send;
        if ll {
            fifo.ll_acquire(&ends, &deadline)?;
            // SAFETY: `send` holds `bytes` bytes (checked by Comm).
            unsafe { fifo.ll_post_from(send, bytes, &desc) };
        } else {
            let slot = fifo.acquire(&ends, &deadline)?;
            // SAFETY: `send` holds `bytes` bytes (checked by Comm); the slot at least a slice.
            unsafe { std::ptr::copy_nonoverlapping(send, slot, bytes) };
            fifo.post(bytes, &desc);
        }
        if let Some(st) = steps.as_mut() {
            st.send_posted(bytes, fifo);
        }
        if let Some(t) = tally {
            t.sent(bytes);
        }
    }
    for k in 1..n {
        ctx.peer((r + k) % n)?.0.recv.prepare(ll, bytes);
    }
    // Folded in a stack buffer, as `recv` may be `send` (in place), which is read until the end;
    // only its first `bytes` are ever used, and rank 0's contribution fills them first.
    let mut buf = std::mem::MaybeUninit::<[u64; WORDS]>::uninit();
    let acc = buf.as_mut_ptr().cast::<u8>();
    for j in 0..n {
        let mine = j == r;
        let mut steps = None;
        let input = if mine {
            send
        } else {
            steps = prof.and_then(|p| p.steps(None, Some(j))).map(Steps::chained);
            let (peer, ends) = ctx.peer(j)?;
            let fifo = &mut peer.recv;
            if let Some(st) = steps.as_mut() {
                st.recv_begin(fifo);
            }
            let m = fifo.peek_as(ll, &ends, &deadline)?;
            check_incoming(&m, &desc, bytes, j)?;
            if m.remote.is_some() {
                return Err(Error::internal(format!("rank {j} sent a pointer for a {bytes}-byte one-shot all-reduce")));
            }
            if let Some(st) = steps.as_mut() {
                st.recv_arrived(bytes);
            }
            if let Some(t) = tally {
                t.arrived(bytes);
            }
            m.data
        };
        // SAFETY: `input` holds `bytes` bytes: the caller's input, or the peer's message, which
        // stays put until it is released just below. `acc` holds WORDS * 8 >= bytes bytes,
        // initialised by the copy at j = 0 before any read.
        unsafe {
            if j == 0 {
                std::ptr::copy_nonoverlapping(input, acc, bytes);
            } else {
                reduce::reduce_in_place(
                    dt,
                    op,
                    std::slice::from_raw_parts_mut(acc, bytes),
                    std::slice::from_raw_parts(input, bytes),
                );
            }
        }
        if !mine {
            ctx.peer(j)?.0.recv.release_as(ll);
            if let Some(st) = steps.as_mut() {
                st.recv_done();
            }
            if let Some(t) = tally {
                t.released();
            }
        }
    }
    // SAFETY: the first `bytes` of `acc` are initialised; `recv` holds `bytes` bytes (checked
    // by Comm) and is not `acc`.
    unsafe {
        if op == RedOp::Avg {
            reduce::div_in_place(dt, std::slice::from_raw_parts_mut(acc, bytes), n);
        }
        std::ptr::copy_nonoverlapping(acc, recv, bytes);
    }
    Ok(())
}

/// Scratch bytes the one-shot all-reduce needs (a copy of one piece of this rank's input).
pub(crate) fn one_shot_scratch(s: &Shape) -> usize {
    if s.rank == 0 {
        0
    } else {
        s.chunk.min(s.count * s.elem)
    }
}

pub(crate) fn send(ctx: &mut Ctx<'_>, buf: *const u8, bytes: usize, peer: usize) -> Result<()> {
    if bytes == 0 {
        return Ok(());
    }
    let mut slot = None;
    let p = ctx.prims(&mut slot, Some(peer), None)?;
    p.allow_direct();
    p.send(buf, bytes)?;
    p.finish()
}

pub(crate) fn recv(ctx: &mut Ctx<'_>, buf: *mut u8, bytes: usize, peer: usize) -> Result<()> {
    if bytes == 0 {
        return Ok(());
    }
    ctx.prims(&mut None, None, Some(peer))?.recv(buf, bytes)
}
