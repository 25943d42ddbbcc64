//! Direct exchanges: all-to-all as n-1 pairwise steps (step k sends to rank+k while receiving
//! from rank-k, slice by slice, so every FIFO in use is being drained by its receiver), and
//! point-to-point send/recv.

use super::{copy_unless_same, Ctx};
use crate::error::Result;

/// All-to-all: block j of `send` goes to rank j, block i of `recv` comes from rank i.
/// `send` and `recv` must be disjoint (the caller stages in-place calls).
pub(crate) fn all_to_all(ctx: &mut Ctx<'_>, send: *const u8, recv: *mut u8, block: usize) -> Result<()> {
    let (n, r) = (ctx.nranks, ctx.rank);
    // SAFETY: both buffers hold n blocks of `block` bytes.
    unsafe { copy_unless_same(send.add(r * block), recv.add(r * block), block) };
    if block == 0 {
        return Ok(());
    }
    let slice = ctx.slice();
    for k in 1..n {
        let (to, from) = ((r + k) % n, (r + n - k) % n);
        let mut p = ctx.prims(Some(to), Some(from))?;
        let mut off = 0;
        while off < block {
            let len = slice.min(block - off);
            // SAFETY: offsets within block `to` of send and block `from` of recv.
            unsafe {
                p.send(send.add(to * block + off), len)?;
                p.recv(recv.add(from * block + off), len)?;
            }
            off += len;
        }
    }
    Ok(())
}

pub(crate) fn send(ctx: &mut Ctx<'_>, buf: *const u8, bytes: usize, peer: usize) -> Result<()> {
    if bytes == 0 {
        return Ok(());
    }
    ctx.prims(Some(peer), None)?.send(buf, bytes)
}

pub(crate) fn recv(ctx: &mut Ctx<'_>, buf: *mut u8, bytes: usize, peer: usize) -> Result<()> {
    if bytes == 0 {
        return Ok(());
    }
    ctx.prims(None, Some(peer))?.recv(buf, bytes)
}
