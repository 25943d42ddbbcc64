//! The LL ("low latency") protocol on a FIFO's memory: the data carries its own flags, so a
//! receiver that sees a line's flag has that line's data, with no fence between data and flag
//! and no separate "published" word to wait for (NCCL's `prims_ll.h` idea, for CPUs).
//!
//! Each FIFO has an LL area next to its Simple slots: a ring of `STEPS` steps of `STEP_LINES`
//! lines.
//! A line is one `u64`: 4 bytes of data in the low half, the step's flag in the high half,
//! written and read with one atomic 8-byte access. NCCL's GPU lines are 16 bytes (two data
//! words, two flags); on x86-64 a 16-byte SSE store is atomic in practice but not
//! architecturally guaranteed, while an aligned 8-byte access is, on every target Rust
//! supports with 64-bit atomics. Half the line is flag either way, so 8-byte lines cost the
//! same bandwidth and need no platform assumption.
//!
//! A step holds a header of `HDR_LINES` lines (the length, then the descriptor's five words, so
//! a receiver detects a peer that runs another operation as with Simple) and then the payload.
//! The flag of step `k` is `k mod (2³²-1) + 1`: never 0, the value of memory nobody wrote. When
//! the step count reaches a multiple of 2³²-1 the sender waits for every step to be consumed and
//! clears the area, so a line written exactly one flag period ago can never pass for new.
//!
//! The sender writes the payload, then the header, the length line last; the receiver polls
//! the length line only (polling lines that the sender is still writing bounces their cache
//! lines between the two cores), then reads the rest, each line still checked for its flag, so
//! no memory-ordering assumption is needed: on x86-64 they are all there by then. It
//! acknowledges the step by its count in `acked`; the sender reuses a step only once it is
//! acknowledged, which for small messages is long done. The counters `posted` and `acked`
//! exist for waiters that went to sleep (the futex words): the fast path never reads them on
//! the receiving side. Storing them is the one sequentially consistent store per step, which the
//! sleeper handshake of `wait` needs (a receiver that sleeps must be woken).

use super::{wait, Desc, Ends, Line, Msg, RecvFifo, Region, SendFifo};
use crate::error::{Error, Result};
use crate::wait::Deadline;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// Lines of one step: one 4 KiB page, so that a hardware prefetcher streaming through the step
/// being read (prefetchers stay within a page) does not pull lines of the next step away from
/// a sender still writing them.
const STEP_LINES: usize = PAGE / 8;
const PAGE: usize = 4096;
/// Steps in the LL ring of a FIFO, whatever its Simple slot count. A 2-rank one-shot all-reduce
/// over shm, LL forced, takes 1.85 µs at 2 KiB, 6.2 at 8 KiB and 123 at 32 KiB with 8 steps (the
/// Simple default), and 1.10, 3.2 and 11 with 32 (Simple: 1.2, 2.1, 5.6): the factor of about 2
/// that LL's half-flag lines cost. 20 steps are no better than 8, and 24-28 as good as 32
/// (Simple's 2 KiB shows the same cliff with OCCL_FIFO_SLOTS), so it is the distance at which a
/// step's page is reused, not only the pieces in flight; the mechanism is not pinned down
/// (bench/baselines/algos-sweep.md).
pub(crate) const STEPS: usize = 32;
/// Lines ahead of the payload: the length, then the descriptor's five words.
const HDR_LINES: usize = 6;
/// Payload bytes of one LL step (the LL slice of every algorithm is at most this): 2024, a
/// multiple of every element size.
pub(crate) const STEP_BYTES: usize = (STEP_LINES - HDR_LINES) * 4;
/// Flags run 1..=FLAGS.
const FLAGS: u64 = u32::MAX as u64;
/// Polls of a line before a wait goes through `wait::wait_until` (which checks the peer and
/// the deadline, yields and sleeps).
const LINE_SPINS: u32 = 256;

#[repr(C)]
struct LlHeader {
    /// Steps posted (low 32 bits): what a sleeping receiver waits on.
    posted: Line<AtomicU32>,
    recv_sleepers: Line<AtomicU32>,
    /// Steps consumed (low 32 bits).
    acked: Line<AtomicU32>,
    send_sleepers: Line<AtomicU32>,
}

const _: () = assert!(std::mem::size_of::<LlHeader>() <= PAGE);

/// Bytes of the LL area: up to a page boundary, a page for the counters, then a page per step.
pub(crate) fn area_size() -> usize {
    PAGE + PAGE + STEPS * PAGE
}

/// The step slot that step `step` uses.
fn slot_of(step: u64) -> usize {
    (step % STEPS as u64) as usize
}

fn flag(step: u64) -> u32 {
    (step % FLAGS) as u32 + 1
}

fn line(flag: u32, data: u32) -> u64 {
    (u64::from(flag) << 32) | u64::from(data)
}

fn desc_words(d: &Desc) -> [u32; 5] {
    [d.opseq, d.root, d.count_lo, d.count_hi, u32::from_le_bytes([d.coll, d.dtype, d.redop, d._pad])]
}

fn desc_of(w: [u32; 5]) -> Desc {
    let [coll, dtype, redop, pad] = w[4].to_le_bytes();
    Desc { opseq: w[0], root: w[1], count_lo: w[2], count_hi: w[3], coll, dtype, redop, _pad: pad }
}

impl Region {
    /// The counters' page: the first page boundary after the slots (the mapping is
    /// page-aligned).
    fn ll_base(&self) -> *mut u8 {
        let h = self.header();
        let end = super::header_size() + h.nslots as usize * super::stride(h.slot_size as usize);
        // SAFETY: the LL area follows the slots inside the region (`region_size`).
        unsafe { self.slot(0).sub(super::header_size()).add(end.next_multiple_of(PAGE)) }
    }

    fn ll_header(&self) -> &LlHeader {
        // SAFETY: the area starts with an LlHeader of atomics (zero is a valid state).
        unsafe { &*(self.ll_base() as *const LlHeader) }
    }

    /// The lines of step slot `i` (< STEPS).
    fn ll_lines(&self, i: usize) -> &[AtomicU64] {
        // SAFETY: slot i's lines lie within the area; 64-byte aligned; atomics make shared
        // access sound.
        unsafe {
            let p = self.ll_base().add(PAGE + i * PAGE);
            std::slice::from_raw_parts(p as *const AtomicU64, STEP_LINES)
        }
    }
}

/// Wakes whoever sleeps on the LL area (a failure or an abort must reach them).
pub(crate) fn wake_all(r: &Region) {
    let h = r.ll_header();
    wait::wake(&h.posted.0, &h.recv_sleepers.0);
    wait::wake(&h.acked.0, &h.send_sleepers.0);
}

/// The sender's LL state: steps posted, and where `acquire` lets the caller build a step.
#[derive(Default)]
pub(crate) struct SendState {
    step: u64,
    /// Steps known to be consumed: `acked` is read again only when this says the next slot is
    /// still in use, so the sender does not pull the receiver's counter line over every step.
    seen: u64,
    stage: Vec<u64>,
}

/// The receiver's LL state: steps consumed, and where the last step was decoded.
#[derive(Default)]
pub(crate) struct RecvState {
    step: u64,
    stage: Vec<u64>,
}

impl SendFifo {
    /// Waits until the next LL step may be written and returns a buffer of `STEP_BYTES` for
    /// its payload (post it with `ll_post`, or post other memory with `ll_post_from`).
    pub(crate) fn ll_acquire(&mut self, ends: &Ends<'_>, deadline: &Deadline) -> Result<*mut u8> {
        let n = STEPS as u64;
        let step = self.ll.step;
        if step >= self.ll.seen + n {
            // Step `step - n` used this slot; it must be consumed.
            self.ll.seen = self.ll_wait_acked(step - n + 1, ends, deadline, "waiting for a free LL step")?;
        }
        if step > 0 && step.is_multiple_of(FLAGS) {
            self.ll.seen = self.ll_wait_acked(step, ends, deadline, "waiting to renew the LL flags")?;
            for i in 0..STEPS {
                for l in self.region.ll_lines(i) {
                    l.store(0, Ordering::Relaxed);
                }
            }
        }
        if self.ll.stage.is_empty() {
            self.ll.stage = vec![0u64; STEP_BYTES.div_ceil(8)];
        }
        Ok(self.ll.stage.as_mut_ptr().cast())
    }

    /// Waits until the receiver has consumed `want` steps; returns how many it has (≥ want).
    fn ll_wait_acked(&self, want: u64, ends: &Ends<'_>, deadline: &Deadline, what: &str) -> Result<u64> {
        let lh = self.region.ll_header();
        // The counter holds the low 32 bits; the receiver is never more than STEPS behind.
        let ahead = || lh.acked.0.load(Ordering::Acquire).wrapping_sub(want as u32) as i32;
        let done = || ahead() >= 0;
        if done() {
            return Ok(want + ahead() as u64);
        }
        let h = self.region.header();
        let peer = ends.peer;
        ends.waits(super::SEND_PEER_WAIT);
        let _timed = ends.timed(super::SEND_PEER_WAIT);
        wait::wait_until(
            wait::driven(ends.drive, done),
            &lh.acked.0,
            &lh.send_sleepers.0,
            &mut |slow| ends.check(|| h.receiver(), slow),
            deadline,
            self.patience,
            &|| format!("sending to rank {peer} ({what})"),
            ends.sleeper,
        )?;
        Ok(want + ahead().max(0) as u64)
    }

    /// Posts the step built in the buffer from `ll_acquire`: `len` (≤ STEP_BYTES) bytes.
    pub(crate) fn ll_post(&mut self, len: usize, desc: &Desc) {
        let src = self.ll.stage.as_ptr().cast::<u8>();
        // SAFETY: the stage holds STEP_BYTES ≥ len bytes.
        unsafe { self.ll_post_from(src, len, desc) };
    }

    /// Posts `len` (≤ STEP_BYTES) bytes at `src` as the next step (after `ll_acquire`).
    ///
    /// # Safety
    /// `src` must be readable for `len` bytes.
    pub(crate) unsafe fn ll_post_from(&mut self, src: *const u8, len: usize, desc: &Desc) {
        let len = len.min(STEP_BYTES);
        let step = self.ll.step;
        let f = flag(step);
        let lines = self.region.ll_lines(slot_of(step));
        let whole = len / 4;
        for (k, l) in lines[HDR_LINES..HDR_LINES + whole].iter().enumerate() {
            // SAFETY: word k lies within src's len bytes; the caller's memory may be unaligned.
            let w = unsafe { std::ptr::read_unaligned(src.add(4 * k) as *const u32) };
            l.store(line(f, w), Ordering::Relaxed);
        }
        if !len.is_multiple_of(4) {
            let mut b = [0u8; 4];
            // SAFETY: the last len % 4 bytes of src.
            unsafe { std::ptr::copy_nonoverlapping(src.add(4 * whole), b.as_mut_ptr(), len % 4) };
            lines[HDR_LINES + whole].store(line(f, u32::from_le_bytes(b)), Ordering::Relaxed);
        }
        // The header last, the length line at the very end: the receiver polls that one line,
        // so it does not pull cache lines away from a sender still writing them.
        for (l, w) in lines[1..HDR_LINES].iter().zip(desc_words(desc)) {
            l.store(line(f, w), Ordering::Relaxed);
        }
        // Release: the compiler (and a weakly ordered CPU) must not move the payload's stores
        // after it. The flags alone would still make a reader correct, but a reader that finds
        // the length early chases the sender line by line.
        lines[0].store(line(f, len as u32), Ordering::Release);
        self.ll.step = step + 1;
        let lh = self.region.ll_header();
        lh.posted.0.store(self.ll.step as u32, Ordering::SeqCst);
        wait::wake(&lh.posted.0, &lh.recv_sleepers.0);
    }
}

/// Prefetches the cache lines of `lines` (a step) that a payload of `bytes` fills, at most four
/// (a 64 B message fills three; past a few the hardware prefetcher streams the rest, and more
/// software prefetches would only queue behind each other).
fn prefetch_step(lines: &[AtomicU64], bytes: usize, write: bool) {
    const CACHE_LINE: usize = 64 / std::mem::size_of::<AtomicU64>();
    let used = (HDR_LINES + bytes.div_ceil(4)).min(STEP_LINES);
    for line in lines[..used].iter().step_by(CACHE_LINE).take(4) {
        super::prefetch(line.as_ptr() as *const u8, write);
    }
}

impl SendFifo {
    /// Hints that the next LL step, carrying `bytes`, will be posted soon (see `prefetch`).
    pub(crate) fn ll_prepare(&self, bytes: usize) {
        prefetch_step(self.region.ll_lines(slot_of(self.ll.step)), bytes, true);
    }
}

impl RecvFifo {
    /// Hints that the next LL step, carrying `bytes`, will be read soon (see `prefetch`).
    pub(crate) fn ll_prepare(&self, bytes: usize) {
        prefetch_step(self.region.ll_lines(slot_of(self.ll.step)), bytes, false);
    }

    /// Waits for line `i` of step slot `slot` to carry flag `f` and returns its data.
    #[inline]
    fn ll_line(&self, slot: usize, i: usize, f: u32, ends: &Ends<'_>, deadline: &Deadline) -> Result<u32> {
        let l = &self.region.ll_lines(slot)[i];
        // Acquire pairs with the length line's Release (see `ll_post_from`).
        let v = l.load(Ordering::Acquire);
        if (v >> 32) as u32 == f {
            return Ok(v as u32);
        }
        self.ll_line_wait(l, f, ends, deadline)
    }

    /// `ll_line` once its first look found the line not there yet: spins on it a while, then
    /// waits. Out of line, so that the look that finds it stays small.
    #[cold]
    #[inline(never)]
    fn ll_line_wait(&self, l: &AtomicU64, f: u32, ends: &Ends<'_>, deadline: &Deadline) -> Result<u32> {
        let _timed = ends.timed(super::RECV_WAIT);
        // Oversubscribed, one look (the caller's) before `wait_until` yields (see
        // `Patience::Share`).
        let spins = if self.patience == wait::Patience::Share { 1 } else { LINE_SPINS };
        for _ in 1..spins {
            std::hint::spin_loop();
            let v = l.load(Ordering::Acquire);
            if (v >> 32) as u32 == f {
                return Ok(v as u32);
            }
        }
        let lh = self.region.ll_header();
        let h = self.region.header();
        let peer = ends.peer;
        let arrived = || (l.load(Ordering::Acquire) >> 32) as u32 == f;
        ends.waits(super::RECV_WAIT);
        let mut check = |slow: bool| -> Result<()> {
            // Data posted before the sender went away is still delivered.
            if arrived() {
                return Ok(());
            }
            self.simple_instead(peer)?;
            ends.check(|| h.sender(), slow)
        };
        wait::wait_until(
            wait::driven(ends.drive, arrived),
            &lh.posted.0,
            &lh.recv_sleepers.0,
            &mut check,
            deadline,
            self.patience,
            &|| format!("receiving from rank {peer} (LL)"),
            ends.sleeper,
        )?;
        Ok(l.load(Ordering::Acquire) as u32)
    }

    /// Waits for the next LL step and decodes it; its data stays valid until `ll_release`.
    pub(crate) fn ll_peek(&mut self, ends: &Ends<'_>, deadline: &Deadline) -> Result<Msg> {
        let step = self.ll.step;
        let f = flag(step);
        let slot = slot_of(step);
        let len = self.ll_line(slot, 0, f, ends, deadline)? as usize;
        if len > STEP_BYTES {
            return Err(Error::internal(format!(
                "rank {} posted a {len}-byte LL step; steps hold {STEP_BYTES}",
                ends.peer
            )));
        }
        if self.ll.stage.is_empty() {
            self.ll.stage = vec![0u64; STEP_LINES / 2];
        }
        // The stage holds the step's words at their line numbers: the header's, then the payload.
        let out = self.ll.stage.as_mut_ptr().cast::<u32>();
        let lines = &self.region.ll_lines(slot)[..HDR_LINES + len.div_ceil(4)];
        // One pass without a branch per line, so the loads of many cache lines are in flight
        // at once (a loop that tests each line before loading the next one pays a full
        // cross-core miss per cache line). The length line was written last (Release), so the
        // lines are normally all there; any that are not are waited for. Every line carries
        // `f` when the AND and the OR of all the flags both equal `f` (two operations a line).
        let (mut all, mut any) = (u64::MAX, 0u64);
        for (k, l) in lines.iter().enumerate().skip(1) {
            let v = l.load(Ordering::Acquire);
            all &= v;
            any |= v;
            // SAFETY: k < lines.len() ≤ STEP_LINES, within the stage.
            unsafe { out.add(k).write(v as u32) };
        }
        if (all >> 32) as u32 != f || (any >> 32) as u32 != f {
            for k in 1..lines.len() {
                let v = self.ll_line(slot, k, f, ends, deadline)?;
                // SAFETY: as above.
                unsafe { out.add(k).write(v) };
            }
        }
        // SAFETY: the header's words are the stage's first HDR_LINES.
        let w = unsafe { [1, 2, 3, 4, 5].map(|k| out.add(k).read()) };
        // SAFETY: the payload starts after the header, inside the stage.
        let out = unsafe { out.add(HDR_LINES) };
        Ok(Msg { data: out.cast(), len, desc: desc_of(w), remote: None })
    }

    /// Acknowledges the step returned by the last `ll_peek`, freeing it for the sender.
    pub(crate) fn ll_release(&mut self) {
        self.ll.step += 1;
        let lh = self.region.ll_header();
        lh.acked.0.store(self.ll.step as u32, Ordering::SeqCst);
        wait::wake(&lh.acked.0, &lh.send_sleepers.0);
    }

    /// Fails when the peer posted a Simple message where this rank waits for an LL step: the
    /// ranks run different operations (the protocol follows from the operation).
    fn simple_instead(&self, peer: usize) -> Result<()> {
        let i = self.tail as usize % self.nslots;
        let hdr = self.region.slot_hdr(i);
        if hdr.seq.load(Ordering::Acquire) != self.tail.wrapping_add(1) {
            return Ok(());
        }
        Err(Error::usage(format!(
            "operation mismatch: rank {peer} sent {} with the Simple protocol where this rank waits for an LL message; every rank must call the same collectives in the same order with the same count, datatype, operator and root",
            hdr.desc
        )))
    }

    /// As `simple_instead`, the other way round: an LL step arrived where this rank waits for
    /// a Simple message.
    pub(super) fn ll_instead(&self, peer: usize) -> Result<()> {
        let step = self.ll.step;
        let f = flag(step);
        let lines = self.region.ll_lines(slot_of(step));
        let got: Vec<u64> = lines[..HDR_LINES].iter().map(|l| l.load(Ordering::Relaxed)).collect();
        if (got[0] >> 32) as u32 != f {
            return Ok(());
        }
        let what = if got.iter().all(|v| (v >> 32) as u32 == f) {
            let w = [got[1] as u32, got[2] as u32, got[3] as u32, got[4] as u32, got[5] as u32];
            desc_of(w).to_string()
        } else {
            "an operation".to_string()
        };
        Err(Error::usage(format!(
            "operation mismatch: rank {peer} sent {what} with the LL protocol where this rank waits for a Simple message; every rank must call the same collectives in the same order with the same count, datatype, operator and root"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::fifo::{state, Liveness};
    use crate::wait::Patience;
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;
    use std::time::Duration;

    fn pair(nslots: usize) -> (SendFifo, RecvFifo) {
        let r = Arc::new(Region::map(-1, super::super::region_size(nslots, 4096)).expect("map"));
        r.init(nslots, 4096, 0, 0);
        (SendFifo::new(r.clone(), Patience::Eager), RecvFifo::new(r, Patience::Eager))
    }

    fn ends(abort: &AtomicBool) -> Ends<'_> {
        Ends {
            peer: 1,
            liveness: Liveness::Local,
            abort,
            drive: None,
            sleeper: None,
            record: None,
            waited: None,
            members: None,
        }
    }

    /// Steps of every length, across the flag renewal, arrive whole and in order from a
    /// sender thread that runs ahead by up to the FIFO's depth.
    #[test]
    fn steps_arrive_whole_across_the_flag_renewal() {
        let (mut tx, mut rx) = pair(4);
        // Start just below the end of a flag period: the renewal runs in this test.
        let start = FLAGS - 5;
        tx.ll.step = start;
        rx.ll.step = start;
        tx.region.ll_header().acked.0.store(start as u32, Ordering::SeqCst);
        let lens: Vec<usize> = (0..40).map(|i| [0, 1, 3, 4, 5, 8, STEP_BYTES - 1, STEP_BYTES][i % 8]).collect();
        let desc = Desc::new(4, 7, 99, 1, 0, u32::MAX);
        let sent = lens.clone();
        let t = std::thread::spawn(move || {
            let abort = AtomicBool::new(false);
            let d = Deadline::after(Duration::from_secs(10));
            for (i, &n) in sent.iter().enumerate() {
                let buf = tx.ll_acquire(&ends(&abort), &d).expect("acquire");
                for k in 0..n {
                    // SAFETY: the stage holds STEP_BYTES bytes.
                    unsafe { buf.add(k).write((i * 31 + k) as u8) };
                }
                tx.ll_post(n, &desc);
            }
        });
        let abort = AtomicBool::new(false);
        let d = Deadline::after(Duration::from_secs(10));
        for (i, &n) in lens.iter().enumerate() {
            let m = rx.ll_peek(&ends(&abort), &d).expect("peek");
            assert_eq!((m.len, m.desc), (n, desc), "step {i}");
            // SAFETY: m.data holds m.len bytes until release.
            let got = unsafe { std::slice::from_raw_parts(m.data, m.len) };
            assert!(got.iter().enumerate().all(|(k, &b)| b == (i * 31 + k) as u8), "step {i} data");
            rx.ll_release();
        }
        t.join().expect("sender");
    }

    /// A receiver waiting for an LL step fails, naming the operation, when the peer posts a
    /// Simple message instead; and a peer that left ends the wait.
    #[test]
    fn a_simple_message_or_a_closed_peer_ends_an_ll_wait() {
        let abort = AtomicBool::new(false);
        let d = Deadline::after(Duration::from_secs(10));
        let (mut tx, mut rx) = pair(4);
        tx.acquire(&ends(&abort), &d).expect("slot");
        tx.post(0, &Desc::new(4, 3, 5, 1, 0, u32::MAX));
        let e = rx.ll_peek(&ends(&abort), &d).expect_err("mismatch");
        assert!(e.to_string().contains("operation mismatch") && e.to_string().contains("#3"), "{e}");
        let (tx, mut rx) = pair(4);
        tx.set_state(state::CLOSED, None);
        let e = rx.ll_peek(&ends(&abort), &d).expect_err("closed");
        assert_eq!(e.kind(), crate::ErrorKind::RemoteError, "{e}");
    }
}
