//! Device times of stream work that runs no kernel of ours (the copy engines' calls), which
//! cannot read `%globaltimer` as a kernel does (`timer.rs`). A [`Stamp`] is a CUDA event with
//! timing: the device notes when the stream reaches it, and the driver tells only the time
//! between two such events (`cuEventElapsedTime`, in ms as an `f32`, to about 0.5 µs). An
//! [`Anchor`] ties that clock to the host's: a stamp recorded on an idle stream of its own,
//! between two host clock reads, the second once the host sees it complete. Its time is the
//! midpoint, its error half the interval; a stamp's host time is the anchor's plus the time
//! between them. The two clocks drift apart by some 10 µs a second: the anchor is measured again
//! about every second ([`Anchor::stale`]), and the drift measured between the first anchor and
//! the latest carries a stamp far from it. An idle stream may still wait behind other streams
//! that share its hardware queue; a measurement that takes too long is dropped and the last one
//! stays.

use crate::error::{check, driver, Error, Result};
use crate::memops::side_stream;
use crate::staging::Mark;
use cudarc::driver::{sys, CudaContext, CudaStream};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

/// How long an anchor is trusted before it is measured again.
pub const ANCHOR_LIFE: Duration = Duration::from_secs(1);

/// `cuEventElapsedTime` (before CUDA 12.8 drivers) and `cuEventElapsedTime_v2`: the same
/// signature.
type Elapsed = unsafe extern "C" fn(*mut f32, sys::CUevent, sys::CUevent) -> sys::CUresult;

/// Looked up once in the loaded libcuda, the newest entry first (CUDA 13 drivers dropped the
/// first; cudarc's own lookup panics on a missing symbol).
fn elapsed_entry() -> Option<Elapsed> {
    static ENTRY: OnceLock<Option<Elapsed>> = OnceLock::new();
    *ENTRY.get_or_init(|| {
        // SAFETY: libcuda is loaded (a context exists); both symbols have the type above in cuda.h.
        unsafe {
            let lib = sys::culib();
            lib.get::<Elapsed>(b"cuEventElapsedTime_v2")
                .or_else(|_| lib.get::<Elapsed>(b"cuEventElapsedTime"))
                .ok()
                .map(|f| *f)
        }
    })
}

/// A timed event: where a stream got to, on the device's event clock.
#[derive(Debug)]
pub struct Stamp(Mark);

impl Stamp {
    pub fn new(ctx: &Arc<CudaContext>) -> Result<Stamp> {
        Mark::with_timing(ctx, true).map(Stamp)
    }

    /// Stamps the point `stream`'s work has reached.
    pub fn record(&self, stream: &CudaStream) -> Result<()> {
        self.0.record(stream)
    }

    /// The event itself, which other streams may wait for as for any mark.
    pub fn mark(&self) -> &Mark {
        &self.0
    }

    /// Whether the stream has reached the last `record`; never blocks.
    pub fn done(&self) -> Result<bool> {
        self.0.done()
    }

    /// Nanoseconds from `earlier` to this stamp, negative when this one came first; both
    /// recorded and complete (`CUDA_ERROR_NOT_READY` otherwise).
    pub fn ns_since(&self, earlier: &Stamp) -> Result<i64> {
        let f = elapsed_entry().ok_or(Error::MissingEntry { call: "cuEventElapsedTime", needs: "CUDA 11" })?;
        self.0.context().bind_to_thread().map_err(driver("cuCtxSetCurrent"))?;
        let mut ms = 0f32;
        // SAFETY: two live timed events of this context and a valid out-pointer.
        check("cuEventElapsedTime", unsafe { f(&mut ms, earlier.0.raw(), self.0.raw()) })?;
        Ok((f64::from(ms) * 1e6).round() as i64)
    }
}

/// Where the event clock stood against the host's: `host_ns` (± `err_ns`) when an anchor stamp
/// was recorded, and how fast the host clock gains on the event clock (parts per billion; 0:
/// not measured yet).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AnchorTime {
    pub host_ns: u64,
    pub err_ns: u64,
    pub ppb: i64,
}

/// The shortest interval a drift is measured over: the anchors' errors (µs) over it stay below a
/// few ppm.
const MIN_DRIFT_BASELINE_NS: i64 = 500_000_000;

impl AnchorTime {
    /// From the host clock before the record and after the host saw it complete.
    pub fn from_bracket(before: u64, after: u64) -> AnchorTime {
        let width = after.saturating_sub(before);
        AnchorTime { host_ns: before + width / 2, err_ns: width.div_ceil(2), ppb: 0 }
    }

    /// This measurement with the drift since `base`, an earlier one whose stamp lies
    /// `event_ns` before this one's on the event clock; `base`'s drift when they are too close
    /// to tell.
    pub fn with_drift_since(self, base: &AnchorTime, event_ns: i64) -> AnchorTime {
        if event_ns < MIN_DRIFT_BASELINE_NS {
            return AnchorTime { ppb: base.ppb, ..self };
        }
        let gained = i128::from(self.host_ns) - i128::from(base.host_ns) - i128::from(event_ns);
        let ppb = i64::try_from(gained * 1_000_000_000 / i128::from(event_ns)).unwrap_or(0);
        AnchorTime { ppb, ..self }
    }

    /// A stamp `ns_after` the anchor (negative: before it) on the host clock, saturating.
    pub fn to_host(&self, ns_after: i64) -> u64 {
        let drift = i128::from(ns_after) * i128::from(self.ppb) / 1_000_000_000;
        let t = i128::from(self.host_ns) + i128::from(ns_after) + drift;
        u64::try_from(t.max(0)).unwrap_or(u64::MAX)
    }
}

/// One measurement of an anchor: its stamp, and where that stamp stood on the host clock.
/// Cheap to clone; a reader keeps its stamp alive while a later measurement goes into another.
#[derive(Clone, Debug)]
pub struct Reading {
    stamp: Arc<Stamp>,
    time: AnchorTime,
}

impl Reading {
    pub fn time(&self) -> AnchorTime {
        self.time
    }

    /// A complete stamp's time on the host clock.
    pub fn host_ns(&self, s: &Stamp) -> Result<u64> {
        Ok(self.time.to_host(s.ns_since(&self.stamp)?))
    }
}

/// The event clock tied to the host's, for one context: unmeasured until a measurement
/// succeeds.
pub struct Anchor {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    /// The first measurement: the far end of every drift measurement.
    base: Option<Reading>,
    /// The latest one, once there are two.
    latest: Option<Reading>,
    /// A stamp to measure into.
    spare: Option<Stamp>,
    /// When the last measurement was tried.
    tried: Option<Instant>,
}

impl Anchor {
    /// Makes the anchor's stream and measures it ([`Anchor::renew`]): a communicator being made
    /// has nothing in flight, so the first measurement is as tight as any.
    pub fn new(ctx: &Arc<CudaContext>, now: &dyn Fn() -> u64, patience: Duration, tries: u32) -> Result<Anchor> {
        let stream = side_stream(ctx)?;
        let mut a = Anchor { ctx: ctx.clone(), stream, base: None, latest: None, spare: None, tried: None };
        a.renew(now, patience, tries)?;
        Ok(a)
    }

    /// Whether a measurement is due: none tried, or the last tried [`ANCHOR_LIFE`] ago.
    pub fn stale(&self) -> bool {
        self.untried_for(ANCHOR_LIFE)
    }

    /// Whether no measurement was tried in the last `d`.
    pub fn untried_for(&self, d: Duration) -> bool {
        self.tried.is_none_or(|t| t.elapsed() >= d)
    }

    /// Measures the anchor again (reading the host clock with `now`), `tries` times, keeping
    /// the tightest bracket: another thread's driver calls can widen one. A try whose stamp
    /// takes longer than `patience` (other work held the stream's hardware queue) ends the
    /// tries; when none succeeds the last measurement stays and false is returned. The next
    /// is due [`ANCHOR_LIFE`] later either way.
    pub fn renew(&mut self, now: &dyn Fn() -> u64, patience: Duration, tries: u32) -> Result<bool> {
        self.tried = Some(Instant::now());
        let mut best: Option<(Stamp, AnchorTime)> = None;
        for _ in 0..tries.max(1) {
            // The spare is empty here: each turn puts back at most one stamp.
            let stamp = match self.spare.take() {
                Some(s) => s,
                None => Stamp::new(&self.ctx)?,
            };
            match measure(&self.stream, &stamp, now, patience)? {
                Some(t) if best.as_ref().is_none_or(|b| t.err_ns < b.1.err_ns) => {
                    self.spare = best.replace((stamp, t)).map(|b| b.0);
                }
                Some(_) => self.spare = Some(stamp),
                // The queue is busy: another try would wait as long.
                None => {
                    self.spare = Some(stamp);
                    break;
                }
            }
        }
        let Some((stamp, t)) = best else { return Ok(false) };
        match &self.base {
            None => self.base = Some(Reading { stamp: Arc::new(stamp), time: t }),
            Some(b) => {
                let time = t.with_drift_since(&b.time, stamp.ns_since(&b.stamp)?);
                let old = self.latest.replace(Reading { stamp: Arc::new(stamp), time });
                // A reader still holding the old stamp keeps it; the next measurement makes one.
                if self.spare.is_none() {
                    self.spare = old.and_then(|r| Arc::try_unwrap(r.stamp).ok());
                }
            }
        }
        Ok(true)
    }

    /// The latest measurement, if one succeeded.
    pub fn reading(&self) -> Option<Reading> {
        self.latest.as_ref().or(self.base.as_ref()).cloned()
    }
}

/// Records `stamp` on the idle `stream` and spins until the host sees it: the bracket, or
/// `None` past `patience`.
fn measure(
    stream: &CudaStream,
    stamp: &Stamp,
    now: &dyn Fn() -> u64,
    patience: Duration,
) -> Result<Option<AnchorTime>> {
    let limit = u64::try_from(patience.as_nanos()).unwrap_or(u64::MAX);
    let before = now();
    stamp.record(stream)?;
    loop {
        let done = stamp.done()?;
        let after = now();
        if done {
            return Ok(Some(AnchorTime::from_bracket(before, after)));
        }
        if after.saturating_sub(before) > limit {
            return Ok(None);
        }
        std::hint::spin_loop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_anchor_sits_at_the_middle_of_its_bracket() {
        let a = AnchorTime::from_bracket(1_000, 1_007);
        assert_eq!(a, AnchorTime { host_ns: 1_003, err_ns: 4, ppb: 0 });
        assert_eq!(a.to_host(2_000), 3_003);
        assert_eq!(a.to_host(-3), 1_000, "a stamp before the anchor");
        assert_eq!(a.to_host(-5_000), 0, "saturates at the clock's start");
        assert_eq!(
            AnchorTime::from_bracket(9, 5),
            AnchorTime { host_ns: 9, err_ns: 0, ppb: 0 },
            "a clock read backwards"
        );
    }

    #[test]
    fn the_drift_between_two_anchors_carries_later_stamps() {
        let base = AnchorTime { host_ns: 1_000_000_000, err_ns: 3, ppb: 0 };
        // Two seconds later on the event clock the host clock has gained 20 µs: 10 ppm.
        let later = AnchorTime { host_ns: 3_000_020_000, err_ns: 4, ppb: 0 }.with_drift_since(&base, 2_000_000_000);
        assert_eq!(later.ppb, 10_000);
        assert_eq!(later.to_host(1_000_000_000), 4_000_030_000, "a second on: the host gains 10 µs more");
        assert_eq!(later.to_host(-500_000_000), 2_500_015_000);
        let close = AnchorTime { host_ns: 1_100_000_000, err_ns: 4, ppb: 0 }.with_drift_since(&later, 100_000_000);
        assert_eq!(close.ppb, 10_000, "too close to tell: the last drift stays");
    }
}
