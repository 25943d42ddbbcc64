//! Where a device communicator keeps its state in each rank's resource buffer.
//!
//! Every rank computes the same plan from the same requirements, so an offset or a handle means
//! the same place in every peer's buffer. Sections, each starting on a 128-byte unit:
//! the lsa barriers (epochs, then one inbox word per member and barrier), the rail GIN barriers'
//! epochs, the buffers of the caller's resource requirements in list order, then the signals
//! (which peers add to), the counters and the signal shadows (this rank's alone).

use super::abi::{ncclGinBarrierHandle, ncclLsaBarrierHandle, RESOURCE_UNIT};
use crate::error::{arg, Result};

/// What the requirements ask for, checked and in numbers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Want {
    pub lsa_barriers: u32,
    pub rail_barriers: u32,
    pub signals: u32,
    pub counters: u32,
    /// `resourceRequirementsList`, in list order.
    pub extra: Vec<Extra>,
}

/// One resource requirement: a buffer and signals and counters of its own.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Extra {
    pub bytes: usize,
    pub align: usize,
    pub signals: u32,
    pub counters: u32,
}

/// Where one resource requirement landed: its buffer handle, first signal and first counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Placed {
    pub buffer: u32,
    pub signal0: u32,
    pub counter0: u32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Plan {
    /// The resource buffer's size on every rank.
    pub bytes: usize,
    pub lsa_barrier: ncclLsaBarrierHandle,
    pub rail_barrier: ncclGinBarrierHandle,
    pub extra: Vec<Placed>,
    pub signals: u32,
    pub counters: u32,
    pub signal_offset: usize,
    pub counter_offset: usize,
    pub shadow_offset: usize,
}

/// The largest resource buffer a plan may ask for (a guard against absurd counts).
const MAX_BYTES: usize = 1 << 30;

fn too_big() -> occl::Error {
    arg(format!("the device communicator's requirements need more than {} MiB per rank", MAX_BYTES >> 20))
}

/// Places `n` bytes aligned to `align` (a power of two, at least a unit) after `*at`.
fn place(at: &mut usize, n: usize, align: usize) -> Result<usize> {
    let start = at.checked_next_multiple_of(align.max(RESOURCE_UNIT)).ok_or_else(too_big)?;
    *at = start.checked_add(n).filter(|&e| e <= MAX_BYTES).ok_or_else(too_big)?;
    Ok(start)
}

fn unit(offset: usize) -> Result<u32> {
    u32::try_from(offset / RESOURCE_UNIT).map_err(|_| too_big())
}

fn words(n: u32, bytes: usize) -> Result<usize> {
    (n as usize).checked_mul(bytes).ok_or_else(too_big)
}

/// The plan for `want` on a communicator whose lsa team has `lsa_size` members.
pub(crate) fn plan(lsa_size: u32, want: &Want) -> Result<Plan> {
    let mut at = 0usize;
    let lsa_words = (want.lsa_barriers as usize).checked_mul(1 + lsa_size as usize).ok_or_else(too_big)?;
    let lsa = place(&mut at, words(u32::try_from(lsa_words).map_err(|_| too_big())?, 4)?, RESOURCE_UNIT)?;
    let rail = place(&mut at, words(want.rail_barriers, 4)?, RESOURCE_UNIT)?;
    let mut signals = want.signals;
    let rail_signal0 = signals;
    signals = signals.checked_add(want.rail_barriers).ok_or_else(too_big)?;
    let mut counters = want.counters;
    let mut extra = Vec::with_capacity(want.extra.len());
    for e in &want.extra {
        if !e.align.is_power_of_two() {
            return Err(arg(format!("a resource requirement's bufferAlign is {}; it must be a power of two", e.align)));
        }
        let start = place(&mut at, e.bytes, e.align)?;
        extra.push(Placed { buffer: unit(start)?, signal0: signals, counter0: counters });
        signals = signals.checked_add(e.signals).ok_or_else(too_big)?;
        counters = counters.checked_add(e.counters).ok_or_else(too_big)?;
    }
    let signal_offset = place(&mut at, words(signals, 8)?, RESOURCE_UNIT)?;
    let counter_offset = place(&mut at, words(counters, 8)?, RESOURCE_UNIT)?;
    let shadow_offset = place(&mut at, words(signals, 8)?, RESOURCE_UNIT)?;
    let bytes = at.max(1).checked_next_multiple_of(RESOURCE_UNIT).ok_or_else(too_big)?;
    Ok(Plan {
        bytes,
        lsa_barrier: ncclLsaBarrierHandle {
            bufHandle: unit(lsa)?,
            nBarriers: i32::try_from(want.lsa_barriers).map_err(|_| too_big())?,
        },
        rail_barrier: ncclGinBarrierHandle { signal0: rail_signal0, bufHandle: unit(rail)? },
        extra,
        signals,
        counters,
        signal_offset,
        counter_offset,
        shadow_offset,
    })
}

impl Plan {
    /// A digest every rank compares: ranks that asked for different things cannot share one
    /// layout.
    pub(crate) fn fingerprint(&self) -> u64 {
        // FNV-1a over the numbers that place things.
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        let mut mix = |v: u64| {
            for b in v.to_le_bytes() {
                h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
            }
        };
        for v in [self.bytes, self.signal_offset, self.counter_offset, self.shadow_offset] {
            mix(v as u64);
        }
        for v in [self.signals, self.counters, self.lsa_barrier.bufHandle, self.rail_barrier.bufHandle] {
            mix(u64::from(v));
        }
        mix(u64::from(self.lsa_barrier.nBarriers.unsigned_abs()));
        for p in &self.extra {
            mix(u64::from(p.buffer));
        }
        h
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sections_are_unit_aligned_and_do_not_overlap() {
        let want = Want {
            lsa_barriers: 16,
            rail_barriers: 16,
            signals: 16,
            counters: 2,
            extra: vec![Extra { bytes: 1000, align: 4096, signals: 3, counters: 1 }],
        };
        let p = plan(4, &want).unwrap();
        // 16 barriers × (1 epoch + 4 inbox words) × 4 bytes = 320 bytes from 0.
        assert_eq!(p.lsa_barrier, ncclLsaBarrierHandle { bufHandle: 0, nBarriers: 16 });
        assert_eq!(p.rail_barrier.bufHandle, 3, "after 320 bytes, at 384");
        assert_eq!(p.rail_barrier.signal0, 16, "after the requirements' signals");
        assert_eq!(p.extra, vec![Placed { buffer: 4096 / 128, signal0: 32, counter0: 2 }]);
        assert_eq!((p.signals, p.counters), (35, 3));
        assert_eq!(p.signal_offset, 4096 + 1024);
        assert_eq!(p.counter_offset, p.signal_offset + 384, "280 bytes of signals take 3 units");
        assert_eq!(p.shadow_offset, p.counter_offset + 128);
        assert_eq!(p.bytes, p.shadow_offset + 384);
        assert_eq!(p.bytes % RESOURCE_UNIT, 0);
    }

    #[test]
    fn an_empty_plan_still_has_a_buffer() {
        let p = plan(2, &Want::default()).unwrap();
        assert_eq!(p.bytes, RESOURCE_UNIT);
        assert_eq!((p.signals, p.counters), (0, 0));
    }

    #[test]
    fn absurd_requests_are_refused() {
        let big = Want { signals: u32::MAX, ..Want::default() };
        assert!(plan(2, &big).is_err());
        let odd = Want { extra: vec![Extra { bytes: 8, align: 24, signals: 0, counters: 0 }], ..Want::default() };
        assert!(plan(2, &odd).unwrap_err().to_string().contains("power of two"));
        let huge =
            Want { extra: vec![Extra { bytes: usize::MAX - 10, align: 128, ..Extra::default() }], ..Want::default() };
        assert!(plan(2, &huge).is_err());
    }

    #[test]
    fn the_fingerprint_follows_the_layout() {
        let a = plan(2, &Want { lsa_barriers: 4, ..Want::default() }).unwrap();
        let b = plan(2, &Want { lsa_barriers: 4, ..Want::default() }).unwrap();
        let c = plan(2, &Want { lsa_barriers: 5, ..Want::default() }).unwrap();
        assert_eq!(a.fingerprint(), b.fingerprint());
        assert_ne!(a.fingerprint(), c.fingerprint());
    }
}
