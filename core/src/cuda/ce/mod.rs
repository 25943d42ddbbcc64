//! Copy-engine collectives: all-gather, all-to-all, broadcast and groups of sends and receives
//! (`group.rs`) between the GPUs of one host with no thread block of occl's, for `CTAPolicy`
//! zero, and under the other policies for a large all-gather or all-to-all into symmetric
//! windows (`budget.rs`: `CtaBudget::on_copy_engines`). Every step is a stream operation: peer copies
//! (`cuMemcpyDtoDAsync` into a peer's mapped region, which the copy
//! engines run), 64-bit flag writes and waits (`cuStreamWriteValue64`, `cuStreamWaitValue64`)
//! and same-GPU copies (out of a slot into the caller's buffer, and this rank's own part), so a
//! call is stream-ordered and a CUDA graph captures it. The driver runs a same-GPU copy as a
//! kernel of its own on the SMs, not on a copy engine (measured on H200: beside a kernel that
//! holds every SM, such a copy waits for it, `cudaMemcpyBatchAsync` with
//! `PreferOverlapWithCompute` too, while a peer copy keeps its rate), so the slot path's
//! receiving side still takes SMs for a moment per chunk. The direct path below does not: its
//! only same-GPU copy is an out-of-place call's own part.
//!
//! Two paths, chosen per call by `ops.rs::ce_flows`:
//! - **Direct** (no slot, no SM on the receiving side): when the call's output lies wholly in a
//!   window every rank registered with `NCCL_WIN_COLL_SYMMETRIC` (`windows.rs`; occl-nccl's
//!   `ncclCommWindowRegister` adds it, with every rank's buffer mapped), each share is one peer
//!   copy from the sender's input to the same offset of the receiver's window. An in-place
//!   all-to-all is never direct (each side would wait for the other's send).
//! - **Slots**: every other call, through the slots below.
//!
//! Every rank must take the same path in a call, since the two wait on different words: a
//! rank on the direct path waits for `done` words a peer on the slot path never writes, and the
//! call hangs (a copy-engine wait has no timeout, below). The direct path depends only
//! on this rank's output and its windows, which every rank registered together (a window
//! counts only when every rank passed the flag), so the ranks agree as long as every rank's
//! output lies at the same offset of its window: NCCL's contract for symmetric windows, and
//! the user's to keep, as is deregistering a window on every rank before calls on its buffers
//! resume. occl checks nothing per call (that would cost a round trip).
//!
//! Each rank's region ends with a copy-engine area: a 4096-byte control block of one word per
//! 64-byte line (lines 0..8 `head`, 8..16 `tail`, 16..24 `ready`, 24..32 `done`), then per
//! sender `q`, `slots` slots of `slot_bytes` ([`CeGeometry`], agreed by every rank at set-up)
//! that `q` writes. The word `head(q)` counts the chunks `q` has put there (written by `q`), and,
//! per receiver `p`, the word `tail(p)` the chunks of mine `p` has consumed (written by `p`), or
//! [`FREE`] once `p` has consumed a whole call's. A sender starts a call's sends to `p` once
//! every slot is free (`tail >= FREE`, which it resets to 0), puts chunk `i` into `p`'s slot
//! once `p` has freed it (`tail >= i + 1 - slots`); a receiver takes chunk `i` from `q` once it
//! is there (`head >= i + 1`), copies it out and releases it (`tail`). So a call's sends are done
//! once its chunks are in the peers' slots: a send that fits them completes before its receiver
//! has started, as a kernel's send that fits its slots does, and a lone send followed by a lone
//! receive on both ends of a pair (NCCL's contract asks them to be grouped) does not wait on
//! itself. Only a pair that moves bytes in a call touches its words.
//!
//! A call is a plan (`plan.rs`): steps on lanes, one lane per peer for the sends (copies to
//! different peers run on different copy engines), one for this rank's own part, and one for
//! every receive, issued in rounds (round `i`: chunk `i` to every peer, then chunk `i` from
//! every peer); with [`CeSends::Batch`], one lane for every send instead (below).
//! `streams.rs` runs each lane on a stream of the communicator's own, forked from
//! the caller's stream by an event and joined back by an event per lane. Each wait of round `i`
//! is met by peers' steps of round `i` or earlier (a pair's first, by its receiver's last
//! release in an earlier call), and each stream holds its steps in issue order, so the call
//! completes however the driver maps this rank's streams onto hardware queues (one queue
//! holding them all runs the rounds in order, as a single stream would). Two ranks of one
//! process on one GPU share that GPU's queues, where a wait of one can hold a step the other
//! needs: a setup NVIDIA's NCCL refuses, whose calls occl runs on its kernels whatever the
//! policy (`comm.rs`, `off_the_copy_engines`).
//!
//! The words count from 0 in every call, so a captured graph replays with the values it
//! recorded: a receiver zeroes `head(q)` before it releases `q`'s last chunk (with [`FREE`]),
//! and a sender zeroes `tail(p)` as it starts, once it has seen that release; a peer's next
//! call cannot write either word before that (it needs the release that follows each reset).
//! Each `tail` starts at [`FREE`] when the communicator is made ([`CeArea::at_rest`]). Every step that
//! touches the words of a pair (sender, receiver) runs on the same lane of that rank in every
//! call (a rank's way of sending, [`CeSends`], is fixed for the communicator's life), and the
//! lanes' streams keep their order from call to call whatever stream the caller uses, so a
//! call's first steps on a lane follow the last call's resets on it.
//!
//! A direct call has two more words per pair, `ready(p)` in a sender's area (written by
//! receiver `p`) and `done(q)` in a receiver's area (written by sender `q`). Receiver `p` writes
//! `ready` at the start of its call, as its buffer is free once the caller's earlier work is
//! done; sender `q` waits for it, resets it, copies its share into `p`'s buffer and writes
//! `done`; `p` waits for `done` and resets it. The values are only 0 and 1, so a graph replays.
//! A peer's next call cannot write a word before this call has reset it: `p`'s next `ready(p)`
//! follows on `p`'s receive lane its wait for this call's `done(q)`, which `q` writes after its
//! reset of `ready(p)` on its send lane; `q`'s next `done(q)` follows on its send lane the
//! wait for `p`'s next `ready(p)`, which follows `p`'s reset of `done(q)` on its receive lane.
//! Both paths' words are apart, so calls of either path follow each other freely.
//!
//! **Batched sends** (the default; `OCCL_CE_BATCH=0` turns them off): a rank's sends all go
//! on one lane (`plan.rs`'s `Lane::Batch`) as one driver batch (`cuMemcpyBatchAsync`), which
//! the driver spreads over more copy engines than one stream per peer gets: at 4 GPUs a direct
//! call moves 1.3-1.8× as much (`bench/baselines/gpu-overlap.md`, runs 4-5). A direct call waits for
//! (and resets) every peer's `ready`, issues every share in one batch, each share cut into
//! `OCCL_CE_BATCH_CHUNKS` pieces (1) interleaved across peers, then writes every peer's `done`;
//! a slot round waits for every peer's free slot, issues chunk `i` to every peer in one batch,
//! then writes every peer's `head`, and an in-place receive follows its round on that lane.
//! The batch lane is the send lane of every pair in each argument above: a `ready` or `tail` is
//! still reset before the `done` or `head` that lets its peer write it again, on the lane
//! that waited for it. Each rank, and each call, may choose alone: a peer sees the same words
//! written in the same order relative to the data, and the same data. So a call captured in a
//! graph (a capture refuses the batched copy) and every call on a driver before CUDA 12.8
//! (logged once) go per peer.
//!
//! Each call that is not captured records two events on its caller's stream (`pairs.rs`): its
//! start, which its lanes fork from, and its end, after the joins, which the next call's lanes
//! wait for. When a profiler sink wants the call's device times they are timed events, and
//! become its CeColl events at the device's times (`spans.rs`).
//!
//! A stream wait has no device timeout; the host gives one. The watcher (`watch.rs`) looks at
//! each call's start and end (`calls.rs`): a call still running `OCCL_TIMEOUT` after its start
//! was seen (a peer stopped calling, or skipped this call) is stopped as a call waiting for a
//! dead peer is, by writing every word far ahead ([`CeArea::release_all`]) beside the error
//! word, and the communicator reports a `Timeout` naming the call. A call captured in a CUDA graph replays without the
//! host and is not timed: only a dead peer or an abort releases it.

mod calls;
mod clock;
mod pairs;
mod plan;
mod spans;
mod streams;

pub(crate) use spans::{ce_coll, CeOp};
pub(crate) use streams::CeStreams;

use super::kernels::coll::MAX_RANKS;
use super::kernels::memops::Piece;
use crate::error::{Error, Result};

/// One word per 64-byte line.
const LINE: u64 = 64;
/// Control words (per peer: a head, a tail, a ready and a done word), then the slots.
const CTRL: u64 = 4096;
/// A value every wait has passed: what the watcher writes when a peer is gone.
const RELEASED: u64 = 1 << 62;
/// A `tail` whose receiver has consumed every chunk of the last call (or none was ever sent):
/// above any chunk count, below [`RELEASED`].
const FREE: u64 = 1 << 61;
/// The most bytes of slots an area may hold (each rank maps every peer's).
pub const MAX_AREA_BYTES: u64 = 1 << 30;
/// Slot sizes are whole pages, so every slot starts page-aligned.
const SLOT_ALIGN: u64 = 4096;

/// The copy-engine area's slots: how many per sender, and their size (`OCCL_CE_SLOTS`,
/// `OCCL_CE_SLOT_BYTES`). Every rank must use the same, since the area lies at the same offset
/// of every rank's region.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CeGeometry {
    pub slots: u64,
    pub slot_bytes: u64,
}

impl Default for CeGeometry {
    /// Two slots of 8 MiB: a 64 MiB share moves in 8 chunks of a few stream operations each.
    fn default() -> Self {
        CeGeometry { slots: 2, slot_bytes: 8 << 20 }
    }
}

impl CeGeometry {
    /// The bytes of slots in each rank's area for `nranks` senders, or why they are refused.
    pub(crate) fn checked(&self, nranks: usize) -> Result<u64> {
        if self.slots == 0 {
            return Err(Error::usage("OCCL_CE_SLOTS=0: the copy engines need at least one slot per peer"));
        }
        if self.slot_bytes == 0 || !self.slot_bytes.is_multiple_of(SLOT_ALIGN) {
            return Err(Error::usage(format!(
                "OCCL_CE_SLOT_BYTES={}: a copy-engine slot is a nonzero multiple of {SLOT_ALIGN} bytes",
                self.slot_bytes
            )));
        }
        match (nranks as u64).checked_mul(self.slots).and_then(|s| s.checked_mul(self.slot_bytes)) {
            Some(b) if b <= MAX_AREA_BYTES => Ok(b),
            _ => Err(Error::usage(format!(
                "the copy-engine area of {nranks} ranks × OCCL_CE_SLOTS={} × OCCL_CE_SLOT_BYTES={} is over {} MiB \
                 per rank; lower either",
                self.slots,
                self.slot_bytes,
                MAX_AREA_BYTES >> 20
            ))),
        }
    }

    /// The bytes ranks compare at set-up.
    pub(crate) fn encode(&self) -> [u8; 16] {
        let mut b = [0u8; 16];
        b[..8].copy_from_slice(&self.slots.to_le_bytes());
        b[8..].copy_from_slice(&self.slot_bytes.to_le_bytes());
        b
    }
}

/// How a rank issues its sends (`OCCL_CE_BATCH`, `OCCL_CE_BATCH_CHUNKS`). Each rank picks its
/// own: a peer sees the same words and the same data either way.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CeSends {
    /// Each peer's share on the stream of that peer's send lane.
    Lanes,
    /// A call's (or a slot round's) sends as one driver batch on one stream: a direct call's
    /// shares each cut into `chunks` pieces, interleaved across peers. A call captured in a
    /// graph, or on a driver without the batched copy, goes as [`CeSends::Lanes`].
    Batch { chunks: u64 },
}

impl CeSends {
    /// The most pieces a direct call's share is cut into.
    pub const MAX_CHUNKS: u64 = 64;
}

impl Default for CeSends {
    /// One batch, one piece per share: at 4 GPUs it moves 1.3-1.8× what one stream per peer
    /// does (`bench/baselines/gpu-overlap.md`).
    fn default() -> CeSends {
        CeSends::Batch { chunks: 1 }
    }
}

/// Where the copy-engine area lies in every rank's region (the same offset on all ranks).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct CeArea {
    pub off: u64,
    pub nranks: u64,
    pub geo: CeGeometry,
}

impl CeArea {
    /// The area after `region_bytes` of the kernels' layout.
    pub(crate) fn after(region_bytes: u64, nranks: usize, geo: CeGeometry) -> CeArea {
        CeArea { off: region_bytes.next_multiple_of(4096), nranks: nranks as u64, geo }
    }

    /// The region's whole size with the area.
    pub(crate) fn end(&self) -> u64 {
        self.off + CTRL + self.nranks * self.geo.slots * self.geo.slot_bytes
    }

    /// In a receiver's region: chunks sender `q` has put.
    fn head(&self, q: usize) -> u64 {
        self.off + q as u64 * LINE
    }

    /// In a sender's region: chunks receiver `p` has consumed.
    fn tail(&self, p: usize) -> u64 {
        self.off + (MAX_RANKS + p) as u64 * LINE
    }

    /// In a sender's region, for a direct call: receiver `p` has started its call (1) or not.
    fn ready(&self, p: usize) -> u64 {
        self.off + (2 * MAX_RANKS + p) as u64 * LINE
    }

    /// In a receiver's region, for a direct call: sender `q`'s data is in place (1) or not.
    fn done(&self, q: usize) -> u64 {
        self.off + (3 * MAX_RANKS + q) as u64 * LINE
    }

    /// Every control word of rank `r`'s pairs in this rank's region.
    fn words(&self, r: usize) -> [u64; 4] {
        [self.head(r), self.tail(r), self.ready(r), self.done(r)]
    }

    /// In a receiver's region: sender `q`'s slot for chunk `i`.
    fn slot(&self, q: usize, i: u64) -> u64 {
        self.off + CTRL + (q as u64 * self.geo.slots + i % self.geo.slots) * self.geo.slot_bytes
    }

    /// The words that do not start at zero, with their values, in this rank's region: every
    /// `tail`, [`FREE`] (written before any peer can map the region).
    pub(crate) fn at_rest(&self) -> impl Iterator<Item = (usize, u64)> + '_ {
        (0..self.nranks as usize).map(move |p| (self.tail(p) as usize, FREE))
    }

    /// Every word's offset and the value that releases its waits (the watcher's abort).
    pub(crate) fn release_all(&self) -> impl Iterator<Item = (usize, u64)> + '_ {
        (0..self.nranks as usize).flat_map(move |r| self.words(r).map(|w| (w as usize, RELEASED)))
    }
}

/// One call's copies: each send's bytes to its peer from its source, each receive's from its
/// peer into its destination, and this rank's own part copied locally. A collective has a
/// share of one size per peer; a group of sends and receives may have several of any size per
/// peer, which follow each other through that pair's slots in call order, as the peer's
/// matching operations do.
pub(crate) struct Flows {
    pub sends: Vec<Share>,
    pub recvs: Vec<Share>,
    pub local: Option<Piece>,
    /// How the data travels; with [`Route::Direct`] the receives' destinations are where the
    /// senders write, and this rank only waits for them.
    pub route: Route,
}

impl Flows {
    /// The largest share: what the watcher names a stalled call by.
    pub(crate) fn largest(&self) -> u64 {
        self.sends.iter().chain(&self.recvs).map(|s| s.bytes).chain(self.local.map(|l| l.n)).max().unwrap_or(0)
    }
}

/// `bytes` to or from `peer` at device address `at` (a send's source, a receive's destination).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Share {
    pub peer: usize,
    pub at: u64,
    pub bytes: u64,
}

/// Through the receiver's slots, or straight into the receiver's buffer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Route {
    Slots,
    /// Where each send lands in its peer's buffer, in the order of `sends`.
    Direct(Vec<u64>),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_area_follows_the_region_and_its_words_do_not_overlap() {
        let a = CeArea::after(1000, 4, CeGeometry::default());
        let sb = CeGeometry::default().slot_bytes;
        assert_eq!(a.off, 4096);
        let mut words: Vec<u64> = (0..4).flat_map(|r| a.words(r)).collect();
        words.sort_unstable();
        words.dedup();
        assert_eq!(words.len(), 16);
        assert!(words.iter().all(|&w| w >= a.off && w + 8 <= a.off + CTRL));
        assert_eq!(a.slot(0, 0), a.off + CTRL);
        assert_eq!(a.slot(3, 5), a.off + CTRL + 7 * sb);
        assert_eq!(a.end(), a.slot(3, 1) + sb);
        assert_eq!(a.release_all().count(), 16);
        // MAX_RANKS of each kind of word, a line each, in the order head, tail, ready, done.
        let full = CeArea::after(0, MAX_RANKS, CeGeometry::default());
        let last = MAX_RANKS - 1;
        assert_eq!(full.head(last) + LINE, full.tail(0));
        assert_eq!(full.tail(last) + LINE, full.ready(0));
        assert_eq!(full.ready(0), full.off + 16 * LINE, "ready words from line 16");
        assert_eq!(full.ready(last) + LINE, full.done(0));
        assert_eq!(full.done(0), full.off + 24 * LINE, "done words from line 24");
        assert!(full.done(last) + LINE <= full.off + CTRL);
    }

    #[test]
    fn other_geometries_keep_slots_apart_from_each_other_and_the_words() {
        for (n, slots, slot_bytes) in [(2, 1, 4096), (3, 4, 16 << 20), (8, 3, 1 << 20), (MAX_RANKS, 7, 12288)] {
            let geo = CeGeometry { slots, slot_bytes };
            let a = CeArea::after(12345, n, geo);
            let mut spans: Vec<(u64, u64)> =
                (0..n).flat_map(|q| (0..slots).map(move |i| (a.slot(q, i), a.slot(q, i) + slot_bytes))).collect();
            spans.extend((0..n).flat_map(|r| a.words(r).map(|w| (w, w + 8))));
            spans.sort_unstable();
            assert_eq!(spans.len(), n * (slots as usize + 4));
            assert!(spans.windows(2).all(|w| w[0].1 <= w[1].0), "{n} ranks, {geo:?}: overlap");
            assert_eq!(spans.first().map(|s| s.0), Some(a.off));
            assert_eq!(spans.last().map(|s| s.1), Some(a.end()), "the last slot ends the area");
            assert!((0..n).all(|q| (0..slots).all(|i| a.slot(q, i).is_multiple_of(SLOT_ALIGN))));
            // Chunk i reuses slot i mod slots.
            assert_eq!(a.slot(n - 1, slots), a.slot(n - 1, 0));
            // Every word is released, and nothing else is written.
            let mut released: Vec<u64> = a.release_all().map(|(at, _)| at as u64).collect();
            released.sort_unstable();
            let mut words: Vec<u64> = (0..n).flat_map(|r| a.words(r)).collect();
            words.sort_unstable();
            assert_eq!(released, words);
            assert!(a.release_all().all(|(_, v)| v == RELEASED));
        }
    }

    #[test]
    fn geometry_bounds() {
        assert_eq!(CeGeometry::default().checked(8).ok(), Some(8 * 2 * (8 << 20)));
        let g = |slots, slot_bytes| CeGeometry { slots, slot_bytes };
        assert_eq!(g(8, 16 << 20).checked(8).ok(), Some(MAX_AREA_BYTES), "exactly the bound");
        let e = g(16, 16 << 20).checked(8).unwrap_err().to_string();
        assert!(e.contains("over 1024 MiB") && e.contains("OCCL_CE_SLOTS=16"), "{e}");
        assert!(g(u64::MAX, 1 << 20).checked(2).is_err(), "overflow is refused, not wrapped");
        assert!(g(0, 4096).checked(2).unwrap_err().to_string().contains("OCCL_CE_SLOTS=0"));
        assert!(g(2, 1000).checked(2).unwrap_err().to_string().contains("multiple of 4096"));
        assert!(g(2, 0).checked(2).is_err());
        assert_ne!(g(2, 8 << 20).encode(), g(4, 8 << 20).encode());
        assert_ne!(g(2, 8 << 20).encode(), g(2, 16 << 20).encode());
    }
}
