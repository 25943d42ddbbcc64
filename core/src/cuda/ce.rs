//! Copy-engine collectives: all-gather, all-to-all and broadcast between the GPUs of one host
//! with no thread block at all, for `CTAPolicy` zero (`budget.rs`). Every step is a stream
//! operation the GPU's copy engines and front end run: peer copies (`cuMemcpyDtoDAsync` into a
//! peer's mapped region), and 64-bit flag writes and waits (`cuStreamWriteValue64`,
//! `cuStreamWaitValue64`), so a call is stream-ordered and a CUDA graph captures it.
//!
//! Each rank's region ends with a copy-engine area: per sender `q`, [`SLOTS`] slots of
//! [`SLOT_BYTES`] that `q` writes, the word `head(q)` (chunks `q` has put there, written by `q`)
//! and, per receiver `p`, the word `tail(p)` (chunks of mine `p` has consumed, written by `p`).
//! A call runs its chunks in rounds: round `i` sends chunk `i` to every peer (once the peer has
//! freed that slot, `tail >= i + 1 - SLOTS`) and then takes chunk `i` from every peer
//! (`head >= i + 1`, copied out, `tail` released). Every rank runs the rounds in the same order,
//! so no rank waits on a round a peer has not reached.
//!
//! The words count from 0 in every call, so a captured graph replays with the values it
//! recorded: a receiver zeroes `head(q)` before it releases `q`'s last chunk, and a sender
//! zeroes `tail(p)` once `p` has released all of its chunks; a peer's next call cannot write
//! either word before that (it needs the release that follows each reset).
//!
//! There is no device timeout: a wait for a peer that died is released by the dead-peer
//! watcher, which writes every word far ahead ([`CeArea::release_all`]) beside the error word.

use super::kernels::coll::MAX_RANKS;
use super::kernels::memops::StreamOps;
use super::kernels::Result;

/// Slots per sender in a receiver's area.
pub(crate) const SLOTS: u64 = 2;
/// Bytes of one slot: a 64 MiB share moves in 8 chunks of a few stream operations each.
pub(crate) const SLOT_BYTES: u64 = 8 << 20;
/// One word per 64-byte line.
const LINE: u64 = 64;
/// Control words (a head per sender, a tail per receiver), then the slots.
const CTRL: u64 = 4096;
/// A value every wait has passed: what the watcher writes when a peer is gone.
const RELEASED: u64 = 1 << 62;

/// Where the copy-engine area lies in every rank's region (the same offset on all ranks).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct CeArea {
    pub off: u64,
    pub nranks: u64,
}

impl CeArea {
    /// The area after `region_bytes` of the kernels' layout.
    pub(crate) fn after(region_bytes: u64, nranks: usize) -> CeArea {
        CeArea { off: region_bytes.next_multiple_of(4096), nranks: nranks as u64 }
    }

    /// The region's whole size with the area.
    pub(crate) fn end(&self) -> u64 {
        self.off + CTRL + self.nranks * SLOTS * SLOT_BYTES
    }

    /// In a receiver's region: chunks sender `q` has put.
    fn head(&self, q: usize) -> u64 {
        self.off + q as u64 * LINE
    }

    /// In a sender's region: chunks receiver `p` has consumed.
    fn tail(&self, p: usize) -> u64 {
        self.off + (MAX_RANKS + p) as u64 * LINE
    }

    /// In a receiver's region: sender `q`'s slot for chunk `i`.
    fn slot(&self, q: usize, i: u64) -> u64 {
        self.off + CTRL + (q as u64 * SLOTS + i % SLOTS) * SLOT_BYTES
    }

    /// Every word's offset and the value that releases its waits (the watcher's abort).
    pub(crate) fn release_all(&self) -> impl Iterator<Item = (usize, u64)> + '_ {
        (0..self.nranks as usize)
            .flat_map(move |r| [(self.head(r) as usize, RELEASED), (self.tail(r) as usize, RELEASED)])
    }
}

/// One collective's copies: `bytes` to each peer of `sends` from its source address, from each
/// peer of `recvs` into its destination address, and this rank's own part copied locally.
pub(crate) struct Flows {
    pub bytes: u64,
    pub sends: Vec<(usize, u64)>,
    pub recvs: Vec<(usize, u64)>,
    pub local: Option<(u64, u64)>,
}

/// Enqueues `f` on `ops`' stream for rank `me` whose peers' regions are mapped at `regions`.
///
/// # Safety
/// The addresses in `f` are device memory of this context valid for `bytes` until the stream
/// has run the call; `regions` are the communicator's mapped regions, each with `area`.
pub(crate) unsafe fn enqueue(
    ops: &StreamOps<'_>,
    regions: &[u64; MAX_RANKS],
    me: usize,
    area: CeArea,
    f: &Flows,
) -> Result<()> {
    let mine = regions[me];
    // SAFETY (every operation below): the caller's promise about `f`'s addresses; the words and
    // slots lie inside the regions, each `area.end()` bytes long.
    unsafe {
        if let Some((dst, src)) = f.local {
            if dst != src && f.bytes > 0 {
                ops.copy(dst, src, f.bytes)?;
            }
        }
        let chunks = f.bytes.div_ceil(SLOT_BYTES);
        for i in 0..chunks {
            let (o, n) = (i * SLOT_BYTES, SLOT_BYTES.min(f.bytes - i * SLOT_BYTES));
            for &(p, src) in &f.sends {
                if i >= SLOTS {
                    ops.wait_ge(mine + area.tail(p), i + 1 - SLOTS)?;
                }
                ops.copy(regions[p] + area.slot(me, i), src + o, n)?;
                ops.write(regions[p] + area.head(me), i + 1)?;
            }
            for &(q, dst) in &f.recvs {
                ops.wait_ge(mine + area.head(q), i + 1)?;
                ops.copy(dst + o, mine + area.slot(q, i), n)?;
                if i + 1 == chunks {
                    ops.write(mine + area.head(q), 0)?;
                }
                ops.write(regions[q] + area.tail(me), i + 1)?;
            }
        }
        for &(p, _) in &f.sends {
            ops.wait_ge(mine + area.tail(p), chunks)?;
            ops.write(mine + area.tail(p), 0)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_area_follows_the_region_and_its_words_do_not_overlap() {
        let a = CeArea::after(1000, 4);
        assert_eq!(a.off, 4096);
        let mut words: Vec<u64> = (0..4).flat_map(|r| [a.head(r), a.tail(r)]).collect();
        words.sort_unstable();
        words.dedup();
        assert_eq!(words.len(), 8);
        assert!(words.iter().all(|&w| w >= a.off && w + 8 <= a.off + CTRL));
        assert_eq!(a.slot(0, 0), a.off + CTRL);
        assert_eq!(a.slot(3, 5), a.off + CTRL + 7 * SLOT_BYTES);
        assert_eq!(a.end(), a.slot(3, 1) + SLOT_BYTES);
        assert_eq!(a.release_all().count(), 8);
        // MAX_RANKS tails fit in the control block after MAX_RANKS heads.
        assert!(CeArea::after(0, MAX_RANKS).tail(MAX_RANKS - 1) + LINE <= CTRL);
    }
}
