//! The phase profile of the collective kernels (`OCCL_PHASES` in `cuda/coll.cu`): where each
//! channel's time goes. A profiled launch writes one record per channel into a [`PhaseBuf`];
//! [`ChannelRecord`] decodes one, [`Summary`] sums a launch's.
//!
//! The phase counters are `clock64` cycles of the channel's SM, taken by the lane's thread 0
//! after the lane barriers that close each phase. The record also holds `%globaltimer` at the
//! channel's start and end: the cycles turn into ns by the ratio of the two over the channel's
//! life (the SM's own clock, whatever it ran at), and the start and end compare channels on one
//! clock (the skew). What no phase counts (chunk arithmetic between a post and the next wait,
//! the channel's opening and closing) is the rest, [`ChannelRecord::other_ns`].

use crate::error::{Error, Result};
use crate::timer::Words;
use cudarc::driver::CudaContext;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Words of one channel's record (`PH_WORDS`).
pub const WORDS: usize = 10;
const START_NS: usize = 0;
const END_NS: usize = 1;
const CYCLES: usize = 2;
/// The first phase counter; the phases follow in [`Phase::ALL`]'s order.
const FIRST_PHASE: usize = 3;
const CHUNKS: usize = 8;
const STEPS: usize = 9;

/// Where a channel spends its time (`PH_WAIT_SEND` .. `PH_POST`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Phase {
    /// In `wait_peers`, for a free slot in a peer's FIFO.
    WaitSend,
    /// In `wait_peers`, for a chunk in its own FIFO.
    WaitRecv,
    /// Data work whose post publishes a send: writes into peers' slots (and, with it, any local
    /// copy or fold the same call makes).
    Push,
    /// Data work whose post only frees received slots: reads its own slots into the output.
    CopyOut,
    /// In `post_peers`: the lane barrier after the data work and the release of head/tail.
    Post,
}

impl Phase {
    pub const ALL: [Phase; 5] = [Phase::WaitSend, Phase::WaitRecv, Phase::Push, Phase::CopyOut, Phase::Post];

    pub const fn name(self) -> &'static str {
        match self {
            Phase::WaitSend => "wait_send",
            Phase::WaitRecv => "wait_recv",
            Phase::Push => "push",
            Phase::CopyOut => "copy_out",
            Phase::Post => "post",
        }
    }

    const fn word(self) -> usize {
        FIRST_PHASE + self as usize
    }
}

/// One channel's record, as the kernel wrote it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ChannelRecord {
    /// `%globaltimer` as the channel opened and as it closed.
    pub start_ns: u64,
    pub end_ns: u64,
    /// SM cycles between the two.
    pub cycles: u64,
    /// Cycles in each phase, in [`Phase::ALL`]'s order.
    pub phases: [u64; 5],
    /// Turns of the chunk loop, and posts (a chunk takes one to three).
    pub chunks: u64,
    pub steps: u64,
}

impl ChannelRecord {
    /// Decodes channel `channel`'s words; a record the kernel did not finish, or whose counters
    /// exceed its own span, is an error.
    pub fn decode(channel: u32, w: &[u64]) -> Result<ChannelRecord> {
        let bad = |what: &'static str| Error::PhaseRecord { channel, what };
        let w: &[u64; WORDS] = w.try_into().map_err(|_| bad("of the wrong length"))?;
        if w[END_NS] == 0 {
            return Err(bad("not written (the channel did not run, or the launch was not profiled)"));
        }
        if w[END_NS] < w[START_NS] {
            return Err(bad("ending before it starts"));
        }
        let mut phases = [0u64; 5];
        for p in Phase::ALL {
            phases[p as usize] = w[p.word()];
        }
        if phases.iter().try_fold(0u64, |s, &c| s.checked_add(c)).is_none_or(|s| s > w[CYCLES]) {
            return Err(bad("counting more cycles in its phases than in its whole life"));
        }
        Ok(ChannelRecord {
            start_ns: w[START_NS],
            end_ns: w[END_NS],
            cycles: w[CYCLES],
            phases,
            chunks: w[CHUNKS],
            steps: w[STEPS],
        })
    }

    /// The words of this record (what the kernel writes).
    pub fn encode(&self) -> [u64; WORDS] {
        let mut w = [0u64; WORDS];
        (w[START_NS], w[END_NS], w[CYCLES], w[CHUNKS], w[STEPS]) =
            (self.start_ns, self.end_ns, self.cycles, self.chunks, self.steps);
        for p in Phase::ALL {
            w[p.word()] = self.phases[p as usize];
        }
        w
    }

    /// The channel's life in ns.
    pub fn ns(&self) -> u64 {
        self.end_ns - self.start_ns
    }

    /// `cycles` of this channel's SM in ns (0 when the record has no cycles).
    fn cycles_ns(&self, cycles: u64) -> f64 {
        if self.cycles == 0 {
            return 0.0;
        }
        cycles as f64 * self.ns() as f64 / self.cycles as f64
    }

    pub fn phase_ns(&self, p: Phase) -> f64 {
        self.cycles_ns(self.phases[p as usize])
    }

    /// The time no phase counts.
    pub fn other_ns(&self) -> f64 {
        self.cycles_ns(self.cycles - self.phases.iter().sum::<u64>())
    }
}

/// A launch's records summed over its channels.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Summary {
    pub channels: usize,
    /// The channels' lives, summed.
    pub channel_ns: f64,
    /// Each phase's ns summed over the channels, in [`Phase::ALL`]'s order.
    pub phase_ns: [f64; 5],
    pub other_ns: f64,
    pub chunks: u64,
    pub steps: u64,
    /// From the first channel's start to the last one's, and the same of their ends.
    pub start_skew_ns: u64,
    pub end_skew_ns: u64,
    /// From the first start to the last end: the kernel's time on this rank.
    pub span_ns: u64,
}

impl Summary {
    /// `None` for no records.
    pub fn of(recs: &[ChannelRecord]) -> Option<Summary> {
        let first = recs.first()?;
        let (mut s0, mut s1, mut e0, mut e1) = (first.start_ns, first.start_ns, first.end_ns, first.end_ns);
        let mut s = Summary {
            channels: recs.len(),
            channel_ns: 0.0,
            phase_ns: [0.0; 5],
            other_ns: 0.0,
            chunks: 0,
            steps: 0,
            start_skew_ns: 0,
            end_skew_ns: 0,
            span_ns: 0,
        };
        for r in recs {
            (s0, s1, e0, e1) = (s0.min(r.start_ns), s1.max(r.start_ns), e0.min(r.end_ns), e1.max(r.end_ns));
            s.channel_ns += r.ns() as f64;
            for p in Phase::ALL {
                s.phase_ns[p as usize] += r.phase_ns(p);
            }
            s.other_ns += r.other_ns();
            s.chunks += r.chunks;
            s.steps += r.steps;
        }
        (s.start_skew_ns, s.end_skew_ns, s.span_ns) = (s1 - s0, e1 - e0, e1 - s0);
        Some(s)
    }

    /// A phase's ns per channel.
    pub fn mean_ns(&self, p: Phase) -> f64 {
        self.phase_ns[p as usize] / self.channels as f64
    }

    /// A phase's share of the channels' time (0 to 1).
    pub fn share(&self, p: Phase) -> f64 {
        Self::ratio(self.phase_ns[p as usize], self.channel_ns)
    }

    pub fn other_share(&self) -> f64 {
        Self::ratio(self.other_ns, self.channel_ns)
    }

    fn ratio(a: f64, b: f64) -> f64 {
        if b > 0.0 {
            a / b
        } else {
            0.0
        }
    }
}

/// The records of profiled launches, one per channel, in host-mapped memory the kernels write
/// (the argument `phases`) and the host reads once the launch has run.
pub struct PhaseBuf {
    words: Words,
    channels: u32,
}

impl std::fmt::Debug for PhaseBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PhaseBuf").field("channels", &self.channels).finish()
    }
}

impl PhaseBuf {
    /// Records for up to `channels` channels, in host-mapped pinned memory of `ctx`.
    pub fn alloc(ctx: &Arc<CudaContext>, channels: u32) -> Result<PhaseBuf> {
        Ok(PhaseBuf { words: Words::pinned(ctx, Self::len(channels)?)?, channels })
    }

    /// Records in ordinary memory that no device can write (tests; the device address is 0).
    pub fn in_memory(channels: u32) -> Result<PhaseBuf> {
        Ok(PhaseBuf { words: Words::heap(Self::len(channels)?), channels })
    }

    fn len(channels: u32) -> Result<usize> {
        if channels == 0 {
            return Err(Error::InvalidArgument("phase records for 0 channels".into()));
        }
        Ok(channels as usize * WORDS)
    }

    pub fn channels(&self) -> u32 {
        self.channels
    }

    /// The kernel argument `phases` (0 in memory).
    pub fn device_ptr(&self) -> u64 {
        self.words.dev()
    }

    /// Zeroes every record, so that a channel that does not write its own is seen.
    pub fn clear(&self) {
        for w in self.words.get() {
            w.store(0, Ordering::Relaxed);
        }
    }

    /// Channel `channel`'s words as a kernel would write them (tests of the decoding).
    pub fn write(&self, channel: u32, rec: &ChannelRecord) {
        if channel < self.channels {
            let at = channel as usize * WORDS;
            for (w, v) in self.words.get()[at..at + WORDS].iter().zip(rec.encode()) {
                w.store(v, Ordering::Relaxed);
            }
        }
    }

    /// The records of channels `0..channels` of the launch that ran last (its stream
    /// synchronised first).
    pub fn read(&self, channels: u32) -> Result<Vec<ChannelRecord>> {
        if channels > self.channels {
            return Err(Error::InvalidArgument(format!(
                "phase records of {channels} channels; the buffer holds {}",
                self.channels
            )));
        }
        let w = self.words.get();
        (0..channels)
            .map(|c| {
                let at = c as usize * WORDS;
                let rec: Vec<u64> = w[at..at + WORDS].iter().map(|x| x.load(Ordering::Acquire)).collect();
                ChannelRecord::decode(c, &rec)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A channel of 10 µs at 2 cycles per ns, its phases in cycles.
    fn rec(start_ns: u64, phases: [u64; 5]) -> ChannelRecord {
        ChannelRecord { start_ns, end_ns: start_ns + 10_000, cycles: 20_000, phases, chunks: 4, steps: 8 }
    }

    #[test]
    fn the_record_layout_is_the_kernels() {
        // PH_* in cuda/coll.cu, word for word.
        let src = include_str!("../cuda/coll.cu");
        for (name, at) in [
            ("PH_START_NS", START_NS),
            ("PH_END_NS", END_NS),
            ("PH_CYCLES", CYCLES),
            ("PH_WAIT_SEND", Phase::WaitSend.word()),
            ("PH_WAIT_RECV", Phase::WaitRecv.word()),
            ("PH_PUSH", Phase::Push.word()),
            ("PH_COPY", Phase::CopyOut.word()),
            ("PH_POST", Phase::Post.word()),
            ("PH_CHUNKS", CHUNKS),
            ("PH_STEPS", STEPS),
            ("PH_WORDS", WORDS),
        ] {
            assert!(src.contains(&format!("{name} = {at},")), "{name} is word {at} in coll.cu");
        }
        let r = rec(5, [1, 2, 3, 4, 5]);
        assert_eq!(r.encode(), [5, 10_005, 20_000, 1, 2, 3, 4, 5, 4, 8]);
        assert_eq!(ChannelRecord::decode(0, &r.encode()).unwrap(), r);
    }

    #[test]
    fn cycles_turn_into_ns_at_the_channels_own_clock() {
        let r = rec(100, [2_000, 4_000, 8_000, 0, 1_000]);
        assert_eq!(r.ns(), 10_000);
        assert_eq!(r.phase_ns(Phase::WaitSend), 1_000.0);
        assert_eq!(r.phase_ns(Phase::Push), 4_000.0);
        assert_eq!(r.phase_ns(Phase::CopyOut), 0.0);
        assert_eq!(r.other_ns(), 2_500.0, "20_000 - 15_000 cycles");
        let none = ChannelRecord { cycles: 0, phases: [0; 5], ..r };
        assert_eq!((none.phase_ns(Phase::Post), none.other_ns()), (0.0, 0.0));
    }

    #[test]
    fn broken_records_are_errors_that_name_the_channel() {
        let ok = rec(100, [1; 5]).encode();
        let e = ChannelRecord::decode(3, &ok[..WORDS - 1]).unwrap_err();
        assert!(e.to_string().contains("channel 3") && e.to_string().contains("wrong length"), "{e}");
        let mut w = ok;
        w[END_NS] = 0;
        assert!(ChannelRecord::decode(0, &w).unwrap_err().to_string().contains("not written"));
        w[END_NS] = 50;
        assert!(ChannelRecord::decode(0, &w).unwrap_err().to_string().contains("ending before"));
        let mut w = ok;
        w[Phase::Push.word()] = 30_000;
        assert!(ChannelRecord::decode(0, &w).unwrap_err().to_string().contains("more cycles"));
        w[Phase::Push.word()] = u64::MAX;
        assert!(ChannelRecord::decode(0, &w).is_err(), "an overflowing sum");
    }

    #[test]
    fn a_launch_sums_its_channels_and_measures_their_skew() {
        let recs = [rec(1_000, [2_000, 0, 10_000, 4_000, 2_000]), rec(1_300, [6_000, 0, 10_000, 0, 2_000])];
        let s = Summary::of(&recs).unwrap();
        assert_eq!(s.channels, 2);
        assert_eq!(s.channel_ns, 20_000.0);
        assert_eq!(s.phase_ns, [4_000.0, 0.0, 10_000.0, 2_000.0, 2_000.0]);
        assert_eq!(s.other_ns, 2_000.0);
        assert_eq!(s.phase_ns.iter().sum::<f64>() + s.other_ns, s.channel_ns, "the phases and the rest fill it");
        assert_eq!(s.mean_ns(Phase::WaitSend), 2_000.0);
        assert_eq!(s.share(Phase::Push), 0.5);
        assert_eq!(s.other_share(), 0.1);
        assert_eq!((s.chunks, s.steps), (8, 16));
        assert_eq!((s.start_skew_ns, s.end_skew_ns, s.span_ns), (300, 300, 10_300));
        assert_eq!(Summary::of(&[]), None);
    }

    #[test]
    fn the_buffer_reads_what_the_channels_wrote() {
        let b = PhaseBuf::in_memory(4).unwrap();
        assert_eq!((b.channels(), b.device_ptr()), (4, 0));
        let r0 = rec(10, [1, 2, 3, 4, 5]);
        let r1 = rec(20, [5, 4, 3, 2, 1]);
        b.write(0, &r0);
        b.write(1, &r1);
        b.write(9, &r1); // past the buffer: ignored
        assert_eq!(b.read(2).unwrap(), vec![r0, r1]);
        let e = b.read(3).unwrap_err();
        assert!(e.to_string().contains("channel 2") && e.to_string().contains("not written"), "{e}");
        assert!(b.read(5).is_err(), "more channels than the buffer");
        b.clear();
        assert!(b.read(1).is_err(), "cleared");
        assert!(PhaseBuf::in_memory(0).is_err());
    }
}
