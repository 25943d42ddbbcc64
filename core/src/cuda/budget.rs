//! How many SMs a device collective takes: its channels, and how many of them share a thread
//! block. A model's kernels run beside the collectives on the same SMs, and every SM a
//! collective holds is one the model's matrix multiplies wait for, so the budget is the fewest
//! channels that reach the link's bandwidth for the operation's size, under a ceiling the user
//! sets (NCCL's `minCTAs`/`maxCTAs`/`CTAPolicy` in `ncclConfig_t`, or `NCCL_MIN_CTAS`,
//! `NCCL_MAX_CTAS`, `NCCL_CTA_POLICY`; `OCCL_CUDA_CHANNELS` sizes the shared region and so
//! caps the channels).
//!
//! A thread block runs `lanes` channels (`OCCL_CUDA_LANES`, 1 or 2, default 2; `cuda/coll.cu`
//! says why), so a launch of `c` channels takes `⌈c / lanes⌉` SMs. The channels of a call must
//! be the same on every rank (both ends of a channel count its chunks), so ranks swap their
//! budgets at set-up. Without a budget the lanes are each rank's own; a budget counts SMs,
//! which [`Channels::pick`] turns into channels with the rank's lanes, so under one the set-up
//! refuses ranks whose lanes differ.

use crate::error::{Error, Result};

/// NCCL's `CTAPolicy` (`NCCL_CTA_POLICY_*`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum CtaPolicy {
    /// The fewest channels that reach the link's bandwidth, up to the region's channels.
    #[default]
    Default,
    /// Fewer SMs at some cost in bandwidth: at most [`EFFICIENT_SMS`].
    Efficiency,
    /// As few SMs as possible: all-gather, all-to-all and broadcast on the copy engines
    /// (`ce/`), the other collectives as under `Efficiency`.
    Zero,
}

impl CtaPolicy {
    /// NCCL's value (`NCCL_CTA_POLICY_DEFAULT` 0, `_EFFICIENCY` 1, `_ZERO` 2).
    pub fn from_nccl(v: i32) -> Result<CtaPolicy> {
        match v {
            0 => Ok(CtaPolicy::Default),
            1 => Ok(CtaPolicy::Efficiency),
            2 => Ok(CtaPolicy::Zero),
            v => Err(Error::arg(format!(
                "CTA policy {v}; use NCCL_CTA_POLICY_DEFAULT (0), NCCL_CTA_POLICY_EFFICIENCY (1) or \
                 NCCL_CTA_POLICY_ZERO (2)"
            ))),
        }
    }

    fn code(self) -> u32 {
        match self {
            CtaPolicy::Default => 0,
            CtaPolicy::Efficiency => 1,
            CtaPolicy::Zero => 2,
        }
    }
}

/// SMs (thread blocks) the `Efficiency` policy allows a collective: NCCL 2.28's 24 channels on
/// 2×H200 took the same share of the GPU.
pub const EFFICIENT_SMS: u32 = 24;

/// Bytes of an operation's per-rank share per channel below which it takes fewer channels.
const CHANNEL_BYTES: u64 = 32 << 10;

/// Below this per-rank share an operation takes at most [`MID_CHANNELS`]: on 2×H200 more
/// channels bought nothing there (64 MiB all-reduce: 233 GB/s on 64 channels, 220 on 128),
/// while from 256 MiB 128 channels gained 5-10% (`bench/baselines/gpu-overlap.md`).
const LARGE_BYTES: u64 = 128 << 20;
const MID_CHANNELS: u32 = 64;

/// What a communicator's collectives may take, agreed by every rank.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct CtaBudget {
    /// At least this many SMs per collective (0: no floor).
    pub min_ctas: u32,
    /// At most this many (0: no ceiling besides the region's channels).
    pub max_ctas: u32,
    pub policy: CtaPolicy,
}

impl CtaBudget {
    /// `NCCL_MIN_CTAS`, `NCCL_MAX_CTAS` and `NCCL_CTA_POLICY` (a number, or `default`,
    /// `efficiency`, `zero`).
    pub fn from_env() -> Result<CtaBudget> {
        let var = |k: &str| std::env::var(k).ok().map(|v| v.trim().to_ascii_lowercase()).filter(|v| !v.is_empty());
        let num = |k: &str| -> Result<u32> {
            match var(k) {
                Some(v) => v.parse().map_err(|_| Error::arg(format!("{k}={v:?} is not a count of CTAs"))),
                None => Ok(0),
            }
        };
        let policy = match var("NCCL_CTA_POLICY").as_deref() {
            None => CtaPolicy::Default,
            Some("default") => CtaPolicy::Default,
            Some("efficiency") => CtaPolicy::Efficiency,
            Some("zero") => CtaPolicy::Zero,
            Some(v) => CtaPolicy::from_nccl(v.parse().map_err(|_| {
                Error::arg(format!("NCCL_CTA_POLICY={v:?}: use 0, 1, 2 or default, efficiency, zero"))
            })?)?,
        };
        CtaBudget { min_ctas: num("NCCL_MIN_CTAS")?, max_ctas: num("NCCL_MAX_CTAS")?, policy }.checked()
    }

    /// Refuses a floor above the ceiling.
    pub fn checked(self) -> Result<CtaBudget> {
        if self.max_ctas != 0 && self.min_ctas > self.max_ctas {
            return Err(Error::arg(format!(
                "minCTAs {} is above maxCTAs {}; a collective cannot take both",
                self.min_ctas, self.max_ctas
            )));
        }
        Ok(self)
    }

    /// The bytes ranks compare at set-up.
    pub(crate) fn encode(&self) -> [u8; 12] {
        let mut b = [0u8; 12];
        b[..4].copy_from_slice(&self.min_ctas.to_le_bytes());
        b[4..8].copy_from_slice(&self.max_ctas.to_le_bytes());
        b[8..].copy_from_slice(&self.policy.code().to_le_bytes());
        b
    }
}

/// A communicator's channel choice: the region's channels, the lanes per block and the budget.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Channels {
    pub region: u32,
    pub lanes: u32,
    pub budget: CtaBudget,
}

impl Channels {
    /// Channels for an operation whose busiest per-rank share is `bytes`: one per
    /// [`CHANNEL_BYTES`], within the budget. The same on every rank for the same call.
    pub(crate) fn pick(&self, bytes: u64) -> u32 {
        let lanes = self.lanes.max(1);
        let mut hi = self.region.max(1);
        if bytes < LARGE_BYTES {
            hi = hi.min(MID_CHANNELS);
        }
        if self.budget.policy != CtaPolicy::Default {
            hi = hi.min(EFFICIENT_SMS * lanes);
        }
        if self.budget.max_ctas != 0 {
            hi = hi.min(self.budget.max_ctas.saturating_mul(lanes)).max(1);
        }
        let lo = self.budget.min_ctas.saturating_mul(lanes).min(hi).max(1);
        let want = u32::try_from(bytes.div_ceil(CHANNEL_BYTES)).unwrap_or(u32::MAX);
        want.clamp(lo, hi)
    }

    /// The most blocks of one channel each (grouped send/recv) the budget allows.
    pub(crate) fn one_lane_ceiling(&self) -> u32 {
        Channels { lanes: 1, ..*self }.pick(u64::MAX)
    }

    /// SMs a launch of `channels` takes.
    pub(crate) fn sms(&self, channels: u32) -> u32 {
        channels.div_ceil(self.lanes.clamp(1, channels.max(1)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ch(region: u32, lanes: u32, min: u32, max: u32, policy: CtaPolicy) -> Channels {
        Channels { region, lanes, budget: CtaBudget { min_ctas: min, max_ctas: max, policy } }
    }

    #[test]
    fn channels_grow_with_size_up_to_the_region() {
        let c = ch(128, 2, 0, 0, CtaPolicy::Default);
        assert_eq!(c.pick(8), 1);
        assert_eq!(c.pick(32 << 10), 1);
        assert_eq!(c.pick((32 << 10) + 1), 2);
        assert_eq!(c.pick(1 << 20), 32);
        assert_eq!(c.pick(64 << 20), 64, "mid sizes stop at 64");
        assert_eq!(c.pick(128 << 20), 128);
        assert_eq!(ch(96, 2, 0, 0, CtaPolicy::Default).pick(1 << 30), 96, "the region caps");
        assert_eq!(c.sms(64), 32);
        assert_eq!(c.sms(128), 64);
        assert_eq!(c.sms(1), 1);
        assert_eq!(c.sms(3), 2);
    }

    #[test]
    fn the_budget_bounds_the_sms_not_the_channels() {
        // maxCTAs 8 with two lanes: 16 channels on 8 SMs.
        let c = ch(64, 2, 0, 8, CtaPolicy::Default);
        assert_eq!(c.pick(1 << 30), 16);
        assert_eq!(c.sms(c.pick(1 << 30)), 8);
        // minCTAs 4: even an 8-byte call takes 4 SMs' channels.
        let c = ch(64, 2, 4, 0, CtaPolicy::Default);
        assert_eq!(c.pick(8), 8);
        // With one lane per block, CTAs are channels.
        assert_eq!(ch(64, 1, 0, 8, CtaPolicy::Default).pick(1 << 30), 8);
        // A floor above the region's channels is cut to the region.
        assert_eq!(ch(8, 2, 16, 0, CtaPolicy::Default).pick(8), 8);
    }

    #[test]
    fn efficiency_and_zero_cap_the_sms() {
        for p in [CtaPolicy::Efficiency, CtaPolicy::Zero] {
            let c = ch(128, 2, 0, 0, p);
            assert_eq!(c.sms(c.pick(1 << 30)), EFFICIENT_SMS);
        }
        assert_eq!(ch(128, 2, 0, 0, CtaPolicy::Default).pick(1 << 30), 128);
    }

    #[test]
    fn nccl_policy_values_and_bad_budgets() {
        assert_eq!(CtaPolicy::from_nccl(0).ok(), Some(CtaPolicy::Default));
        assert_eq!(CtaPolicy::from_nccl(1).ok(), Some(CtaPolicy::Efficiency));
        assert_eq!(CtaPolicy::from_nccl(2).ok(), Some(CtaPolicy::Zero));
        let e = CtaPolicy::from_nccl(7).unwrap_err().to_string();
        assert!(e.contains("NCCL_CTA_POLICY_EFFICIENCY"), "{e}");
        let e = CtaBudget { min_ctas: 9, max_ctas: 4, policy: CtaPolicy::Default }.checked().unwrap_err();
        assert!(e.to_string().contains("minCTAs 9 is above maxCTAs 4"), "{e}");
        let a = CtaBudget { min_ctas: 1, max_ctas: 2, policy: CtaPolicy::Zero };
        assert_ne!(a.encode(), CtaBudget::default().encode());
    }
}
