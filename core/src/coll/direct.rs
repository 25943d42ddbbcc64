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
