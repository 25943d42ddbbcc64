//! Histograms on atomics: one relaxed increment per observation into its own bucket, and the sum
//! in integer base sub-units (ns, bytes) so it is exact; cumulative `le` counts are made when
//! rendering.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Upper bounds of the duration buckets, in ns: 1-2.5-5 steps from 1 µs to 100 s.
pub(crate) const DURATION_NS: [u64; 25] = [
    1_000,
    2_500,
    5_000,
    10_000,
    25_000,
    50_000,
    100_000,
    250_000,
    500_000,
    1_000_000,
    2_500_000,
    5_000_000,
    10_000_000,
    25_000_000,
    50_000_000,
    100_000_000,
    250_000_000,
    500_000_000,
    1_000_000_000,
    2_500_000_000,
    5_000_000_000,
    10_000_000_000,
    25_000_000_000,
    50_000_000_000,
    100_000_000_000,
];

/// Upper bounds of the message-size buckets, in bytes: powers of 4 from 1 B to 4 GiB.
pub(crate) const SIZE_BYTES: [u64; 17] = {
    let mut b = [0u64; 17];
    let mut i = 0;
    while i < 17 {
        b[i] = 1 << (2 * i);
        i += 1;
    }
    b
};

/// Adds `v` to a counter that only the calling thread writes: a relaxed load and store (readers
/// see the old or the new total, never a torn one), no locked read-modify-write.
#[inline]
pub(crate) fn bump(c: &AtomicU64, v: u64) {
    c.store(c.load(Relaxed).wrapping_add(v), Relaxed);
}

/// A histogram over `bounds` (N bounds, plus the +Inf bucket).
pub(crate) struct Histogram<const N: usize> {
    bounds: &'static [u64; N],
    /// Observations per bucket (not cumulative); the last is above every bound.
    counts: [AtomicU64; N],
    over: AtomicU64,
    sum: AtomicU64,
}

/// What rendering reads: cumulative counts per bound, the total and the sum (sub-units).
pub(crate) struct Snapshot<'a> {
    pub bounds: &'a [u64],
    pub cumulative: Vec<u64>,
    pub count: u64,
    pub sum: u64,
}

impl<const N: usize> Histogram<N> {
    pub(crate) fn new(bounds: &'static [u64; N]) -> Self {
        Histogram {
            bounds,
            counts: std::array::from_fn(|_| AtomicU64::new(0)),
            over: AtomicU64::new(0),
            sum: AtomicU64::new(0),
        }
    }

    #[inline]
    pub(crate) fn observe(&self, v: u64) {
        // The first bound at or above v: Prometheus buckets are `le`.
        let i = self.bounds.partition_point(|&b| b < v);
        match self.counts.get(i) {
            Some(c) => c.fetch_add(1, Relaxed),
            None => self.over.fetch_add(1, Relaxed),
        };
        self.sum.fetch_add(v, Relaxed);
    }

    /// [`Histogram::observe`] for a histogram only one thread writes (a direct series, see
    /// `direct.rs`): a load and a store per counter, no locked add. The bucket is found from the
    /// bottom: a small operation's size and time are in the first few.
    #[inline]
    pub(crate) fn observe_owned(&self, v: u64) {
        let i = self.bounds.iter().position(|&b| v <= b).unwrap_or(N);
        bump(self.counts.get(i).unwrap_or(&self.over), 1);
        bump(&self.sum, v);
    }

    /// Observations and their sum (sub-units), as `snapshot` would give them.
    pub(crate) fn totals(&self) -> (u64, u64) {
        let count = self.counts.iter().fold(self.over.load(Relaxed), |a, c| a.wrapping_add(c.load(Relaxed)));
        (count, self.sum.load(Relaxed))
    }

    /// Counts as they are now; `count` is the +Inf bucket, so the two always agree.
    pub(crate) fn snapshot(&self) -> Snapshot<'static> {
        let mut acc = 0u64;
        let cumulative = self
            .counts
            .iter()
            .map(|c| {
                acc = acc.wrapping_add(c.load(Relaxed));
                acc
            })
            .collect();
        let count = acc.wrapping_add(self.over.load(Relaxed));
        Snapshot { bounds: self.bounds, cumulative, count, sum: self.sum.load(Relaxed) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_le_and_cumulative() {
        let h = Histogram::new(&SIZE_BYTES);
        for v in [0, 1, 2, 4, 5, 1 << 20, u64::MAX] {
            h.observe(v);
        }
        let s = h.snapshot();
        assert_eq!(s.count, 7);
        // le=1: 0 and 1; le=4: + 2 and 4; le=16: + 5; le=1Mi: + 1Mi; +Inf: + MAX.
        assert_eq!(&s.cumulative[..3], &[2, 4, 5]);
        assert_eq!(s.cumulative[10], 6);
        assert_eq!(*s.cumulative.last().expect("bounds"), 6);
        // The series' operation and byte totals: the same count, and the sum (wrapping on
        // overflow, as a u64 counter does).
        assert_eq!(h.totals(), (7, s.sum));
        assert_eq!(s.sum, 12u64.wrapping_add(1 << 20).wrapping_add(u64::MAX));
        assert_eq!(SIZE_BYTES[16], 1 << 32);
        assert!(DURATION_NS.windows(2).all(|w| w[0] < w[1]));
    }
}
