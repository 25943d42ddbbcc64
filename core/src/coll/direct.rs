//! Direct exchanges: all-to-all as n-1 pairwise steps (step k sends to rank+k while receiving
//! from rank-k, half a FIFO at a time, so every FIFO in use is being drained by its receiver),
//! and point-to-point send/recv.

use super::{copy_unless_same, Ctx};
use crate::error::Result;

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
        let mut p = ctx.prims(Some(to), Some(from))?;
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

/// Small all-reduce in one step: every rank sends its whole buffer to every peer, then reduces
/// all n contributions itself. One message latency instead of the ring's 2(n-1) steps; the
/// contributions are combined in rank order on every rank, so all ranks get the same bits.
pub(crate) fn all_reduce_one_shot(ctx: &mut Ctx<'_>, send: *const u8, recv: *mut u8, count: usize) -> Result<()> {
    let (n, r) = (ctx.nranks, ctx.rank);
    let bytes = count * ctx.dt.size();
    for k in 1..n {
        ctx.prims(Some((r + k) % n), None)?.send(send, bytes)?;
    }
    // In place, the accumulator overwrites this rank's contribution: keep a copy.
    let mut own = Vec::new();
    let mine = if std::ptr::eq(send, recv) {
        own = vec![0u64; bytes.div_ceil(8)];
        // SAFETY: send holds `bytes`; `own` was sized for them.
        unsafe { std::ptr::copy_nonoverlapping(send, own.as_mut_ptr().cast::<u8>(), bytes) };
        own.as_ptr().cast::<u8>()
    } else {
        send
    };
    for j in 0..n {
        match (j == r, j == 0) {
            // SAFETY: recv holds `bytes`; mine is the separate copy or the disjoint send buffer.
            (true, true) => unsafe { std::ptr::copy_nonoverlapping(mine, recv, bytes) },
            (true, false) => unsafe {
                crate::reduce::reduce_in_place(
                    ctx.dt,
                    ctx.op,
                    std::slice::from_raw_parts_mut(recv, bytes),
                    std::slice::from_raw_parts(mine, bytes),
                )
            },
            (false, true) => ctx.prims(None, Some(j))?.recv(recv, bytes)?,
            (false, false) => ctx.prims(None, Some(j))?.recv_reduce(recv, bytes)?,
        }
    }
    drop(own);
    if ctx.op == crate::dtype::RedOp::Avg && bytes > 0 {
        // SAFETY: recv holds `bytes`.
        crate::reduce::div_in_place(ctx.dt, unsafe { std::slice::from_raw_parts_mut(recv, bytes) }, n);
    }
    Ok(())
}

pub(crate) fn send(ctx: &mut Ctx<'_>, buf: *const u8, bytes: usize, peer: usize) -> Result<()> {
    if bytes == 0 {
        return Ok(());
    }
    let mut p = ctx.prims(Some(peer), None)?;
    p.allow_direct();
    p.send(buf, bytes)?;
    p.finish()
}

pub(crate) fn recv(ctx: &mut Ctx<'_>, buf: *mut u8, bytes: usize, peer: usize) -> Result<()> {
    if bytes == 0 {
        return Ok(());
    }
    ctx.prims(None, Some(peer))?.recv(buf, bytes)
}
