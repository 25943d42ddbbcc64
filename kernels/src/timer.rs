//! Device timestamps of the collective kernels (NCCL's KernelCh `pTimer`s) and the map from the
//! device clock to the host's.
//!
//! Each block of a timed launch writes its channel's record, `(start, stop)` of `%globaltimer`,
//! into host-mapped pinned memory ([`TimerRing`]): the start first, then the stop with a
//! system-scope release, so a record whose stop word is non-zero is complete. The host hands a
//! launch one slot of the ring (a record per block) and reads it back after the kernel ran;
//! nothing waits on the device. `%globaltimer` is nanoseconds since an epoch of the GPU's own;
//! [`ClockMap`] moves it onto the host clock with an offset measured by a probe kernel that
//! answers the host's numbered requests (`calibrate`).

use crate::error::{check, driver, Error, Result};
use cudarc::driver::{sys, CudaContext, CudaFunction, LaunchConfig, PushKernelArg};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Words of one channel's record: start, stop.
const RECORD_WORDS: usize = 2;

/// Zeroed u64 words that the host and the device both address.
pub(crate) enum Words {
    /// `cuMemHostAlloc(DEVICEMAP)`: the device writes it over PCIe/NVLink-C2C.
    Pinned { ctx: Arc<CudaContext>, host: *mut AtomicU64, dev: u64, len: usize },
    /// Ordinary memory, for the decoding logic's tests and hosts without a GPU.
    Heap(Box<[AtomicU64]>),
}

// SAFETY: the pinned words are only accessed as atomics, and freed once, on drop.
unsafe impl Send for Words {}
// SAFETY: as above; every access is an atomic load or store.
unsafe impl Sync for Words {}

impl Words {
    pub(crate) fn pinned(ctx: &Arc<CudaContext>, len: usize) -> Result<Words> {
        ctx.bind_to_thread().map_err(driver("cuCtxSetCurrent"))?;
        let bytes = len * 8;
        let mut p: *mut std::ffi::c_void = std::ptr::null_mut();
        // SAFETY: a valid out-pointer; the context is current.
        let r = unsafe { sys::cuMemHostAlloc(&mut p, bytes, sys::CU_MEMHOSTALLOC_DEVICEMAP) };
        check("cuMemHostAlloc", r)?;
        // Owned from here: dropped (freed) on every error below.
        let mut w = Words::Pinned { ctx: ctx.clone(), host: p.cast(), dev: 0, len };
        let mut dev: sys::CUdeviceptr = 0;
        // SAFETY: `p` is the mapped allocation just made.
        check("cuMemHostGetDevicePointer", unsafe { sys::cuMemHostGetDevicePointer_v2(&mut dev, p, 0) })?;
        // SAFETY: `bytes` bytes at `p`, just allocated, not yet shared with the device.
        unsafe { std::ptr::write_bytes(p.cast::<u8>(), 0, bytes) };
        if let Words::Pinned { dev: d, .. } = &mut w {
            *d = dev;
        }
        Ok(w)
    }

    /// Zeroed words in ordinary memory (no device address).
    pub(crate) fn heap(len: usize) -> Words {
        Words::Heap((0..len).map(|_| AtomicU64::new(0)).collect())
    }

    pub(crate) fn get(&self) -> &[AtomicU64] {
        match self {
            // SAFETY: `len` zero-initialised words, alive until drop; AtomicU64 has u64's layout.
            Words::Pinned { host, len, .. } => unsafe { std::slice::from_raw_parts(*host, *len) },
            Words::Heap(b) => b,
        }
    }

    pub(crate) fn dev(&self) -> u64 {
        match self {
            Words::Pinned { dev, .. } => *dev,
            Words::Heap(_) => 0,
        }
    }
}

impl Drop for Words {
    fn drop(&mut self) {
        if let Words::Pinned { ctx, host, .. } = self {
            if ctx.bind_to_thread().is_ok() {
                // SAFETY: the allocation from cuMemHostAlloc, freed once; no kernel still
                // writes it (its owner synchronised its streams first).
                let _ = unsafe { sys::cuMemFreeHost(host.cast()) };
            }
        }
    }
}

/// `slots` slots of `records` records each, a record per block (or per work item) of a launch.
/// A launch with more records than a slot holds takes consecutive slots: its records run on
/// from one slot into the next.
pub struct TimerRing {
    words: Words,
    slots: u32,
    records: u32,
}

impl std::fmt::Debug for TimerRing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TimerRing").field("slots", &self.slots).field("records", &self.records).finish()
    }
}

impl TimerRing {
    /// A ring in host-mapped pinned memory of `ctx`.
    pub fn alloc(ctx: &Arc<CudaContext>, slots: u32, records: u32) -> Result<TimerRing> {
        let len = Self::len(slots, records)?;
        Ok(TimerRing { words: Words::pinned(ctx, len)?, slots, records })
    }

    /// A ring in ordinary memory that no device can write (tests; [`TimerRing::device_slot`] is 0).
    pub fn in_memory(slots: u32, records: u32) -> Result<TimerRing> {
        let len = Self::len(slots, records)?;
        Ok(TimerRing { words: Words::heap(len), slots, records })
    }

    fn len(slots: u32, records: u32) -> Result<usize> {
        if slots == 0 || records == 0 {
            return Err(Error::InvalidArgument(format!("a timer ring of {slots} slots × {records} records")));
        }
        Ok(slots as usize * records as usize * RECORD_WORDS)
    }

    pub fn slots(&self) -> u32 {
        self.slots
    }

    /// Records a slot holds.
    pub fn records(&self) -> u32 {
        self.records
    }

    /// Record `block` counted from `slot`'s first, which may lie in a later slot.
    fn at(&self, slot: u32, block: u32) -> Option<usize> {
        let i = slot as usize * self.records as usize + block as usize;
        (i < self.slots as usize * self.records as usize).then_some(i * RECORD_WORDS)
    }

    /// The device address of `slot`'s records (the kernel argument `timers`), 0 for an
    /// in-memory ring or a slot out of range.
    pub fn device_slot(&self, slot: u32) -> u64 {
        match (self.words.dev(), self.at(slot, 0)) {
            (0, _) | (_, None) => 0,
            (d, Some(i)) => d + (i * 8) as u64,
        }
    }

    /// The records `0..blocks` from `slot`'s first once every one is complete (its stop word
    /// set): `(start, stop)` in device ns. `None` while a block has not finished, or when they
    /// would run past the ring's last slot.
    pub fn read(&self, slot: u32, blocks: u32) -> Option<Vec<(u64, u64)>> {
        let w = self.words.get();
        let mut out = Vec::with_capacity(blocks as usize);
        for b in 0..blocks {
            let i = self.at(slot, b)?;
            // Acquire: the start word, written before the stop's release, is visible.
            let stop = w[i + 1].load(Ordering::Acquire);
            if stop == 0 {
                return None;
            }
            out.push((w[i].load(Ordering::Relaxed), stop));
        }
        Some(out)
    }

    /// Zeroes `slot`'s records before it is handed to another launch.
    pub fn clear(&self, slot: u32) {
        let w = self.words.get();
        for b in 0..self.records {
            if let Some(i) = self.at(slot, b) {
                w[i].store(0, Ordering::Relaxed);
                w[i + 1].store(0, Ordering::Release);
            }
        }
    }

    /// Writes a record as a block would (tests of the decoding).
    pub fn write(&self, slot: u32, block: u32, start: u64, stop: u64) {
        if let Some(i) = self.at(slot, block) {
            let w = self.words.get();
            w[i].store(start, Ordering::Relaxed);
            w[i + 1].store(stop, Ordering::Release);
        }
    }
}

/// Device time to host time: `host = device + offset_ns + (device - device_ns) × ppb / 10^9`,
/// known to within `err_ns` at `device_ns` (the calibration's moment).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ClockMap {
    pub offset_ns: i64,
    /// Half the round trip of the tightest sample: the offset's error bound.
    pub err_ns: u64,
    /// The device time the offset was measured at.
    pub device_ns: u64,
    /// How fast the host clock gains on the device's, in parts per billion (0: unknown). The
    /// two run from different crystals: some 10 ppm apart, 10 µs a second.
    pub ppb: i64,
}

/// The shortest baseline a drift is measured over: the offsets' errors (µs) over it stay
/// below a few ppm.
const MIN_DRIFT_BASELINE_NS: u64 = 500_000_000;

impl ClockMap {
    /// From samples `(host before, device, host after)` of one request each: the tightest
    /// round trip's midpoint. `None` without a usable sample.
    pub fn from_samples(samples: &[(u64, u64, u64)]) -> Option<ClockMap> {
        let &(h0, d, h1) = samples.iter().filter(|s| s.2 >= s.0 && s.1 != 0).min_by_key(|s| s.2 - s.0)?;
        let mid = h0 + (h1 - h0) / 2;
        let offset_ns = i64::try_from(i128::from(mid) - i128::from(d)).ok()?;
        Some(ClockMap { offset_ns, err_ns: (h1 - h0).div_ceil(2), device_ns: d, ppb: 0 })
    }

    /// A fresh measurement `now`, with the drift since `base` (an earlier one) when they are far
    /// enough apart to tell it.
    pub fn with_drift_since(now: ClockMap, base: &ClockMap) -> ClockMap {
        let span = now.device_ns.saturating_sub(base.device_ns);
        if span < MIN_DRIFT_BASELINE_NS {
            return ClockMap { ppb: base.ppb, ..now };
        }
        let gained = i128::from(now.offset_ns) - i128::from(base.offset_ns);
        let ppb = i64::try_from(gained * 1_000_000_000 / i128::from(span)).unwrap_or(0);
        ClockMap { ppb, ..now }
    }

    /// A device time on the host clock (saturating at the clock's ends).
    pub fn to_host(&self, device_ns: u64) -> u64 {
        let since = i128::from(device_ns) - i128::from(self.device_ns);
        let t = i128::from(device_ns) + i128::from(self.offset_ns) + since * i128::from(self.ppb) / 1_000_000_000;
        u64::try_from(t.max(0)).unwrap_or(u64::MAX)
    }
}

/// Requests the first calibration makes of the probe kernel; a later one makes
/// [`RECALIBRATE_SAMPLES`].
pub const PROBE_SAMPLES: u32 = 64;
pub const RECALIBRATE_SAMPLES: u32 = 16;

/// The clock probe: `occl_clock_probe` (`cuda/coll.cu`) answers numbered requests with the
/// device time, and each answer is bracketed by two host readings. Request numbers run on from
/// probe to probe, so a probe the host gave up on finishes at once (the host posts its last
/// number) and the next one is not confused by it; nothing ever synchronises a stream, so a
/// probe can run while the caller's stream is busy.
pub struct Probe {
    ctx: Arc<CudaContext>,
    func: CudaFunction,
    stream: Arc<cudarc::driver::CudaStream>,
    /// [request number, device time, answered number]
    words: Words,
    /// The last number the previous probe was given: it has finished when it answered it.
    last: u64,
}

impl std::fmt::Debug for Probe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Probe").field("last", &self.last).finish()
    }
}

impl Probe {
    pub(crate) fn new(ctx: &Arc<CudaContext>, func: CudaFunction) -> Result<Probe> {
        let words = Words::pinned(ctx, 3)?;
        let stream = ctx.new_stream().map_err(driver("cuStreamCreate"))?;
        Ok(Probe { ctx: ctx.clone(), func, stream, words, last: 0 })
    }

    /// Whether the last probe kernel has finished (its box may be freed).
    pub fn idle(&self) -> bool {
        self.words.get()[2].load(Ordering::Acquire) >= self.last
    }

    /// Measures the offset of `%globaltimer` from `host_clock` (ns) with `n` requests, waiting at
    /// most `patience` for the probe kernel. `Ok(None)`: the previous probe is still running, or
    /// this one did not answer in time (it is told to finish).
    pub fn measure(&mut self, host_clock: &dyn Fn() -> u64, n: u32, patience: Duration) -> Result<Option<ClockMap>> {
        if !self.idle() {
            return Ok(None);
        }
        self.ctx.bind_to_thread().map_err(driver("cuCtxSetCurrent"))?;
        let (first, dev) = (self.last + 1, self.words.dev());
        let mut l = self.stream.launch_builder(&self.func);
        l.arg(&dev).arg(&first).arg(&n);
        let cfg = LaunchConfig { grid_dim: (1, 1, 1), block_dim: (32, 1, 1), shared_mem_bytes: 0 };
        // SAFETY: occl_clock_probe(u64 box, u64 first, unsigned n); `box` is 3 mapped words,
        // freed only once the probe has answered its last number (`idle`).
        unsafe { l.launch(cfg) }.map_err(driver("cuLaunchKernel(occl_clock_probe)"))?;
        let end = first + u64::from(n) - 1;
        self.last = end;
        let w = self.words.get();
        let mut samples = Vec::with_capacity(n as usize);
        let since = Instant::now();
        for i in first..=end {
            let h0 = host_clock();
            w[0].store(i, Ordering::Release);
            while w[2].load(Ordering::Acquire) < i {
                if since.elapsed() > patience {
                    // Let the probe run through the rest of its numbers and exit.
                    w[0].store(end, Ordering::Release);
                    return Ok(None);
                }
                std::hint::spin_loop();
            }
            let h1 = host_clock();
            samples.push((h0, w[1].load(Ordering::Relaxed), h1));
        }
        Ok(ClockMap::from_samples(&samples))
    }
}

impl Drop for Probe {
    fn drop(&mut self) {
        // The box must outlive the kernel: tell it to finish and wait (bounded by its own
        // one-second silence limit).
        self.words.get()[0].store(self.last, Ordering::Release);
        let _ = self.stream.synchronize();
    }
}

/// The first calibration: [`PROBE_SAMPLES`] requests, waiting up to a second for the probe.
pub(crate) fn calibrate(probe: &mut Probe, host_clock: &dyn Fn() -> u64) -> Result<ClockMap> {
    probe
        .measure(host_clock, PROBE_SAMPLES, Duration::from_secs(1))?
        .ok_or_else(|| Error::InvalidArgument("the clock probe kernel did not answer within 1 s".into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_is_read_only_when_every_block_stopped() {
        let r = TimerRing::in_memory(4, 3).expect("ring");
        assert_eq!(r.device_slot(0), 0, "no device address in memory");
        assert_eq!(r.read(1, 2), None, "nothing written");
        r.write(1, 0, 100, 200);
        assert_eq!(r.read(1, 2), None, "block 1 still runs");
        assert_eq!(r.read(1, 1), Some(vec![(100, 200)]), "a 1-block launch is done");
        r.write(1, 1, 110, 190);
        assert_eq!(r.read(1, 2), Some(vec![(100, 200), (110, 190)]));
        assert_eq!(r.read(0, 1), None, "other slots are apart");
        assert_eq!(r.read(4, 1), None, "a slot past the ring");
        r.clear(1);
        assert_eq!(r.read(1, 1), None, "cleared for the next launch");
        assert!(TimerRing::in_memory(0, 1).is_err());
    }

    #[test]
    fn a_launch_of_more_records_than_a_slot_runs_on_into_the_next() {
        let r = TimerRing::in_memory(3, 2).expect("ring");
        for b in 0..3 {
            r.write(1, b, 10 + u64::from(b), 20 + u64::from(b));
        }
        assert_eq!(r.read(1, 3), Some(vec![(10, 20), (11, 21), (12, 22)]), "slot 1's two and slot 2's first");
        assert_eq!(r.read(2, 1), Some(vec![(12, 22)]), "the third record is slot 2's first");
        assert_eq!(r.read(2, 3), None, "past the ring's last slot");
        r.clear(2);
        assert_eq!(r.read(1, 3), None, "slot 2 cleared");
        assert_eq!(r.read(1, 2), Some(vec![(10, 20), (11, 21)]), "slot 1 kept");
    }

    #[test]
    fn the_tightest_sample_sets_the_offset_and_its_bound() {
        // Device clock = host clock - 1_000_000 (+ noise inside each bracket).
        let s = [(5_000_000, 4_000_900, 5_004_000), (6_000_000, 5_000_040, 6_000_100), (7_000_000, 0, 7_000_002)];
        let m = ClockMap::from_samples(&s).expect("a sample");
        // The zero device reading is unusable; the 100 ns round trip wins: mid 6_000_050.
        assert_eq!(m, ClockMap { offset_ns: 1_000_010, err_ns: 50, device_ns: 5_000_040, ppb: 0 });
        assert_eq!(m.to_host(5_000_040), 6_000_050);
        assert!(m.to_host(5_000_040).abs_diff(6_000_040) <= m.err_ns);
        assert_eq!(ClockMap::from_samples(&[]), None);
        assert_eq!(ClockMap::from_samples(&[(10, 5, 9)]), None, "a bracket that runs backwards");
        let back = ClockMap { offset_ns: -10, ..ClockMap::default() };
        assert_eq!(back.to_host(5), 0, "saturates");
    }

    #[test]
    fn a_later_calibration_measures_the_drift_and_maps_with_it() {
        let s = 1_000_000_000u64;
        // At device time 10 s the host led by 1 ms; at 12 s by 1 ms + 20 µs: 10 ppm.
        let base = ClockMap { offset_ns: 1_000_000, err_ns: 500, device_ns: 10 * s, ppb: 0 };
        let near = ClockMap { offset_ns: 1_000_001, err_ns: 500, device_ns: 10 * s + 1_000, ppb: 0 };
        assert_eq!(ClockMap::with_drift_since(near, &base).ppb, 0, "too close to tell a drift");
        let later = ClockMap { offset_ns: 1_020_000, err_ns: 500, device_ns: 12 * s, ppb: 0 };
        let m = ClockMap::with_drift_since(later, &base);
        assert_eq!(m.ppb, 10_000);
        assert_eq!(m.to_host(12 * s), 12 * s + 1_020_000);
        // One second on, the host has gained another 10 µs.
        assert_eq!(m.to_host(13 * s), 13 * s + 1_030_000);
        // A recalibration too close for a drift of its own keeps the last one.
        let next = ClockMap { offset_ns: 1_030_000, err_ns: 500, device_ns: 12 * s + 1_000, ppb: 0 };
        assert_eq!(ClockMap::with_drift_since(next, &m).ppb, 10_000);
    }
}
