//! How many SMs a device collective takes: its channels, and how many of them share a thread
//! block. A model's kernels run beside the collectives on the same SMs, and every SM a
//! collective holds is one the model's matrix multiplies wait for, so the budget is the fewest
//! channels that reach the link's bandwidth for the operation's size, under a ceiling the user
//! sets (NCCL's `minCTAs`/`maxCTAs`/`CTAPolicy` in `ncclConfig_t`, or `NCCL_MIN_CTAS`,
//! `NCCL_MAX_CTAS`, `NCCL_CTA_POLICY`; `OCCL_CUDA_CHANNELS` sizes the shared region and so
//! caps the channels).
//!
//! A thread block runs `lanes` channels (`OCCL_CUDA_LANES`: 1 or 2 of 512 threads, default 2, or
//! 4 of 256; a reducing collective's lanes are half as wide; `cuda/coll.cu` says why), so a
//! launch of `c` channels takes `⌈c / lanes⌉` SMs. The
//! channels of a call must be the same on every rank (both ends of a channel count its chunks),
//! so ranks swap their budgets at set-up. The lanes are each rank's own: a channel's id, its
//! slots and its chunk loop are the same whatever block holds it, so a peer cannot tell how a
//! rank packs its channels into blocks. Only the count of channels, which the lanes scale, must
//! agree: every rank counts with the fewest lanes of any rank (swapped at set-up too).
//!
//! Under the default policy a call that moves bytes through the slots takes at most [`SLOT_SMS`]
//! SMs (more moved a little more alone and cost a matrix multiply beside them more), a folding
//! one ([`Launch::Fold`]) at most [`EFFICIENT_SMS`], and a windowed kernel call
//! ([`Launch::Window`]: an all-gather, out-of-place all-to-all or direct broadcast whose output
//! lies in a symmetric window) at most [`EFFICIENT_SMS`]. A windowed call's channels take pieces
//! of the share from a counter, so none sits idle while another finishes its slice, and on
//! 4×H200 24 SMs moved as much as 32-64 (all-gather of 1 GiB per rank: 353 against 349 GB/s;
//! all-to-all of 1 GiB buffers: 327 against 324), while 64 SMs cost a matrix multiply beside a
//! 256 MiB all-gather 40% of its throughput against NCCL's 16%
//! (`bench/baselines/kernel-phases.md` run 3, `gpu-overlap.md` run 6). A user's `minCTAs` above
//! either ceiling still wins. Whether a call is windowed follows from its output's window, which
//! every rank registered alike, so every rank picks the same channels for it.
//!
//! A call may also take no SM at all: under `CTAPolicy` zero every call that only moves bytes
//! runs on the copy engines (`ce/`), and under the other policies a windowed all-gather or
//! all-to-all from [`CE_SHARE`] bytes a peer, where the copy engines moved as much as the
//! kernels ([`CtaBudget::on_copy_engines`]).
//!
//! Grouped sends and receives ([`Channels::p2p_budget`]) run their channels as lanes too. Their
//! channels are split over every connection a rank may have, so that the whole grid is resident
//! at once; a connection takes at most half of [`SLOT_SMS`]' worth, so a ring exchange (a send
//! and a receive) takes what one collective takes. On 2×H200 a ring exchange on those 32 SMs
//! moves 0.88-0.92× of what 128 one-lane blocks (128 SMs) move; at 4 ranks the region's share
//! (21 channels a connection) is the limit, and two lanes to an SM move 0.90-1.00× of what one
//! does on twice the SMs (`bench/baselines/gpu-overlap.md` run 8).

use super::kernels::coll::lane_threads;
use super::kernels::p2p::P2pBudget;
use super::parse_size;
use crate::error::{Error, Result};
use crate::CollType;

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

/// SMs (thread blocks) the `Efficiency` policy allows a collective, and the default policy a
/// windowed kernel call ([`Launch::Window`]) below a larger `minCTAs`: NCCL 2.28's 24 channels
/// on 2×H200 took the same share of the GPU, and a windowed call moves as much on 24 SMs as on
/// more (the module's doc).
pub const EFFICIENT_SMS: u32 = 24;

/// How a device call's kernel moves its data, which bounds its channels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Launch {
    /// Through the channels' slots, each channel a fixed part of the share, moving bytes
    /// (all-gather, all-to-all, broadcast, send, receive): under the default policy at most
    /// `SLOT_SMS` SMs' worth, or `minCTAs`' worth where that is more.
    Slots,
    /// Through the slots, folding (all-reduce, reduce-scatter, reduce): under the default
    /// policy at most [`EFFICIENT_SMS`] SMs' worth, or `minCTAs`' worth where that is more. With
    /// their large shares' slots paired (`Layout::steps`), 24 SMs cost a GEMM beside a 256 MiB
    /// all-reduce or reduce-scatter what NVIDIA's 24 CTAs do (2×H200: 9.7% against 9.0%, 8.6
    /// against 9.2%; 4×H200: 16.4 against 16.6%, 9.8 against 10.0%), where 32 cost it 1-2.6
    /// points more, for up to 6% less bandwidth alone (`bench/baselines/gpu-overlap.md` run 12,
    /// `kernel-phases.md` run 11).
    Fold,
    /// Straight into the peers' symmetric windows, the channels taking pieces from a counter:
    /// under the default policy at most [`EFFICIENT_SMS`] SMs' worth, or `minCTAs`' worth where
    /// that is more (the other policies hold every call to [`EFFICIENT_SMS`]).
    Window,
}

/// SMs a call through the slots ([`Launch::Slots`]) takes at most under the default policy, or
/// `minCTAs` where that is more. On 4×H100 64 SMs moved 7-10% more alone from 1 GiB than 32,
/// but a matrix multiply beside a 256 MiB all-gather lost 40% of its throughput to them against
/// 25% to 32 (NCCL's 24 CTAs: 22%; on 4×H200 42% against NCCL's 22%), and beside all-reduce and
/// reduce-scatter they moved no more (189 against 199 GB/s, 121 against 118)
/// (`bench/baselines/gpu-overlap.md` run 7).
pub const SLOT_SMS: u32 = 32;

/// Bytes of an operation's per-rank share per 512-thread channel below which it takes fewer
/// channels (a 256-thread channel takes half).
const CHANNEL_BYTES: u64 = 32 << 10;

/// Bytes a windowed all-gather or all-to-all sends each peer from which it runs on the copy
/// engines under the default and efficiency policies ([`CtaBudget::on_copy_engines`]). Straight
/// into the peers' windows, batched, the copy engines moved as much alone as the kernels from
/// there, with no SM (`bench/baselines/gpu-overlap.md`, busbw alone):
/// - 4×H200, run 5, against NVIDIA's 24-CTA kernels into the same windows in the same run:
///   all-gather of 64 and 256 MiB per rank 338 and 373 GB/s against 334 and 335; all-to-all of
///   256 MiB buffers (64 MiB a peer) 342 against 336, but of 64 MiB buffers (16 MiB a peer) 253
///   against 284, the one case below this share;
/// - 2×H200, runs 4 and 10: all-gather of 64 and 256 MiB 317-322 and 368-369, all-to-all of 64
///   and 256 MiB buffers (32 and 128 MiB a peer) 280 and 351-354, where NVIDIA's kernels moved
///   224-229 and 213-253, 224-243 and 212-278 in runs 1 and 2.
///
/// Beside a matrix multiply they cost it 3.9% of its throughput or less (run 5), where occl's
/// windowed kernels on 24 SMs cost it 8.6-19% and NVIDIA's 6-18%. A call being captured in a
/// CUDA graph chooses alike (a rank cannot know whether its peers capture), and its copies go
/// one stream per peer (a capture refuses the batch): at 4 GPUs 0.6× of the batch (run 4).
pub const CE_SHARE: u64 = 32 << 20;

/// What a communicator's collectives may take, agreed by every rank.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CtaBudget {
    /// At least this many SMs per collective (0: no floor).
    pub min_ctas: u32,
    /// At most this many (0: no ceiling besides the region's channels).
    pub max_ctas: u32,
    pub policy: CtaPolicy,
    /// Under the default and efficiency policies, a windowed all-gather or all-to-all that sends
    /// each peer this many bytes or more takes the copy engines (`OCCL_CE_MIN_SHARE`, default
    /// [`CE_SHARE`]; 0: never).
    pub ce_share: u64,
}

impl Default for CtaBudget {
    fn default() -> Self {
        CtaBudget { min_ctas: 0, max_ctas: 0, policy: CtaPolicy::Default, ce_share: CE_SHARE }
    }
}

impl CtaBudget {
    /// `NCCL_MIN_CTAS`, `NCCL_MAX_CTAS` and `NCCL_CTA_POLICY` (a number, or `default`,
    /// `efficiency`, `zero`), and occl's `OCCL_CE_MIN_SHARE` (bytes, `K`/`M`/`G` allowed).
    pub fn from_env() -> Result<CtaBudget> {
        CtaBudget::default().under_env()
    }

    /// This budget (a communicator's `ncclConfig_t` fields) with each field the environment sets
    /// in its place, as NCCL resets a config's `minCTAs`, `maxCTAs` and `CTAPolicy` to
    /// `NCCL_MIN_CTAS`, `NCCL_MAX_CTAS` and `NCCL_CTA_POLICY`.
    pub fn under_env(self) -> Result<CtaBudget> {
        self.under_vars(|k| std::env::var(k).ok())
    }

    /// As [`CtaBudget::under_env`] with the variables `var` gives. A count of 0 sets nothing
    /// (NCCL leaves the config's there too).
    fn under_vars(self, var: impl Fn(&str) -> Option<String>) -> Result<CtaBudget> {
        let var = |k: &str| var(k).map(|v| v.trim().to_ascii_lowercase()).filter(|v| !v.is_empty());
        let num = |k: &str, base: u32| -> Result<u32> {
            match var(k) {
                Some(v) => match v.parse::<u32>() {
                    Ok(0) => Ok(base),
                    Ok(n) => Ok(n),
                    Err(_) => Err(Error::arg(format!("{k}={v:?} is not a count of CTAs"))),
                },
                None => Ok(base),
            }
        };
        let policy = match var("NCCL_CTA_POLICY").as_deref() {
            None => self.policy,
            Some("default") => CtaPolicy::Default,
            Some("efficiency") => CtaPolicy::Efficiency,
            Some("zero") => CtaPolicy::Zero,
            Some(v) => CtaPolicy::from_nccl(v.parse().map_err(|_| {
                Error::arg(format!("NCCL_CTA_POLICY={v:?}: use 0, 1, 2 or default, efficiency, zero"))
            })?)?,
        };
        let ce_share = match var("OCCL_CE_MIN_SHARE") {
            Some(v) => parse_size(&v).ok_or_else(|| {
                Error::arg(format!("OCCL_CE_MIN_SHARE={v:?} is not a size in bytes (32M, 1G; 0 never)"))
            })?,
            None => self.ce_share,
        };
        CtaBudget {
            min_ctas: num("NCCL_MIN_CTAS", self.min_ctas)?,
            max_ctas: num("NCCL_MAX_CTAS", self.max_ctas)?,
            policy,
            ce_share,
        }
        .checked()
    }

    /// Whether a call of `coll` that sends each peer `share` bytes runs on the copy engines
    /// (`ce/`) rather than a kernel, `windowed` when its output lies in a symmetric window so
    /// that the copies go straight into the peers' (`ops.rs::in_window`). Under `CTAPolicy`
    /// zero every call that moves bytes does: all-gather, all-to-all, broadcast, sends and
    /// receives. Under the other policies, with no `minCTAs` asking for SMs, a windowed
    /// all-gather or all-to-all whose share reaches [`CtaBudget::ce_share`]: there the copy
    /// engines move as much as the kernels with none ([`CE_SHARE`]). Broadcasts stay on the kernels
    /// (the root would send every peer the whole buffer at once, where the kernels' ring sends
    /// it once), as do calls outside windows (through the slots the copy engines move 0.6× as
    /// much, `gpu-overlap.md` run 5). Every input is the same on every rank for the same call.
    pub(crate) fn on_copy_engines(&self, coll: CollType, share: u64, windowed: bool) -> bool {
        match self.policy {
            CtaPolicy::Zero => matches!(
                coll,
                CollType::AllGather | CollType::AllToAll | CollType::Broadcast | CollType::Send | CollType::Recv
            ),
            CtaPolicy::Default | CtaPolicy::Efficiency => {
                self.min_ctas == 0
                    && self.ce_share != 0
                    && windowed
                    && share >= self.ce_share
                    && matches!(coll, CollType::AllGather | CollType::AllToAll)
            }
        }
    }

    /// Whether any call may run on the copy engines: a communicator makes their streams then.
    pub fn may_use_copy_engines(&self) -> bool {
        self.policy == CtaPolicy::Zero || (self.min_ctas == 0 && self.ce_share != 0)
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
    pub(crate) fn encode(&self) -> [u8; 20] {
        let mut b = [0u8; 20];
        b[..4].copy_from_slice(&self.min_ctas.to_le_bytes());
        b[4..8].copy_from_slice(&self.max_ctas.to_le_bytes());
        b[8..12].copy_from_slice(&self.policy.code().to_le_bytes());
        b[12..].copy_from_slice(&self.ce_share.to_le_bytes());
        b
    }
}

/// A communicator's channel choice: the region's channels, the lanes per block and the budget.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Channels {
    pub region: u32,
    /// This rank's channels per thread block: its launches' shape and SMs.
    pub lanes: u32,
    /// The fewest lanes of any rank: the channel count of a call follows it, so that every rank
    /// picks the same.
    pub common_lanes: u32,
    pub budget: CtaBudget,
}

impl Channels {
    /// Channels for an operation whose busiest per-rank share is `bytes`: one per
    /// [`CHANNEL_BYTES`], within the budget. The same on every rank for the same call. A
    /// 256-thread channel (4 lanes) does half a 512-thread one's work per turn, so it takes
    /// half the bytes: a size takes the same SMs with 4 lanes as with 2, with twice the
    /// channels in flight on each.
    ///
    /// The ceiling under the default policy: [`SLOT_SMS`] SMs' worth for a call that moves
    /// bytes through the slots, [`EFFICIENT_SMS`] for a folding or windowed one (`launch`), or
    /// `minCTAs`' worth where that is more; [`EFFICIENT_SMS`] under the other policies;
    /// `maxCTAs` and the region cap below any.
    /// Every rank passes the same `launch` for the same call (its output's window is symmetric),
    /// so the count stays the same on every rank.
    pub(crate) fn pick(&self, bytes: u64, launch: Launch) -> u32 {
        let lanes = self.common_lanes.max(1);
        let per = lane_threads(2) / lane_threads(lanes);
        let hi = self.ceiling(launch);
        let lo = self.budget.min_ctas.saturating_mul(lanes).min(hi).max(1);
        let want = u32::try_from(bytes.div_ceil(CHANNEL_BYTES / u64::from(per))).unwrap_or(u32::MAX);
        want.clamp(lo, hi)
    }

    /// The most channels a call launched as `launch` may take ([`Channels::pick`]'s ceiling).
    fn ceiling(&self, launch: Launch) -> u32 {
        let lanes = self.common_lanes.max(1);
        let sms = match (self.budget.policy, launch) {
            (CtaPolicy::Default, Launch::Slots) => SLOT_SMS.max(self.budget.min_ctas),
            (CtaPolicy::Default, Launch::Window | Launch::Fold) => EFFICIENT_SMS.max(self.budget.min_ctas),
            _ => EFFICIENT_SMS,
        };
        let mut hi = self.region.max(1).min(sms.saturating_mul(lanes));
        if self.budget.max_ctas != 0 {
            hi = hi.min(self.budget.max_ctas.saturating_mul(lanes)).max(1);
        }
        hi
    }

    /// What a group of sends and receives may launch ([`P2pBudget`]; packed `lanes` to a block
    /// as the collectives are). A group's channels are split over every connection a rank may
    /// have, so that the whole grid is resident at once; under the default policy that is the
    /// region's channels, and one connection takes at most half of [`SLOT_SMS`]' worth (a send
    /// and a receive together: one collective's SMs). So a ring exchange takes at most 32 SMs,
    /// and a group with every peer at 4 or 8 ranks at most the region's channels. Under the
    /// other policies the whole group takes [`EFFICIENT_SMS`]' worth; `maxCTAs` caps both.
    pub(crate) fn p2p_budget(&self) -> P2pBudget {
        let lanes = self.common_lanes.max(1);
        let mut total = self.region.max(1);
        let mut per_conn = SLOT_SMS.max(self.budget.min_ctas).saturating_mul(lanes) / 2;
        if self.budget.policy != CtaPolicy::Default {
            total = total.min(EFFICIENT_SMS.saturating_mul(lanes));
            per_conn = total;
        }
        if self.budget.max_ctas != 0 {
            total = total.min(self.budget.max_ctas.saturating_mul(lanes)).max(1);
        }
        P2pBudget { total, per_conn: per_conn.clamp(1, total) }
    }

    /// SMs a launch of `channels` takes.
    pub(crate) fn sms(&self, channels: u32) -> u32 {
        channels.div_ceil(self.lanes.clamp(1, channels.max(1)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A config's budget under the environment: each variable set replaces its field, as NCCL
    /// resets a config's fields to its variables; a count of 0 leaves the config's.
    #[test]
    fn the_environment_overrides_the_configs_fields() {
        let vars = |v: &'static [(&'static str, &'static str)]| {
            move |k: &str| v.iter().find(|(n, _)| *n == k).map(|(_, x)| x.to_string())
        };
        let config = CtaBudget { min_ctas: 4, max_ctas: 16, policy: CtaPolicy::Efficiency, ..CtaBudget::default() };
        assert_eq!(config.under_vars(vars(&[])).unwrap(), config);
        let b = config.under_vars(vars(&[("NCCL_MAX_CTAS", "8"), ("NCCL_CTA_POLICY", "zero")])).unwrap();
        assert_eq!(b, CtaBudget { min_ctas: 4, max_ctas: 8, policy: CtaPolicy::Zero, ..CtaBudget::default() });
        let b = config.under_vars(vars(&[("NCCL_MIN_CTAS", "0"), ("NCCL_CTA_POLICY", "0")])).unwrap();
        assert_eq!(b, CtaBudget { min_ctas: 4, max_ctas: 16, policy: CtaPolicy::Default, ..CtaBudget::default() });
        let e = config.under_vars(vars(&[("NCCL_MAX_CTAS", "2")])).unwrap_err().to_string();
        assert!(e.contains("minCTAs 4 is above maxCTAs 2"), "{e}");
        let e = config.under_vars(vars(&[("NCCL_MIN_CTAS", "many")])).unwrap_err().to_string();
        assert!(e.contains("NCCL_MIN_CTAS=\"many\" is not a count of CTAs"), "{e}");
    }

    fn ch(region: u32, lanes: u32, min: u32, max: u32, policy: CtaPolicy) -> Channels {
        Channels {
            region,
            lanes,
            common_lanes: lanes,
            budget: CtaBudget { min_ctas: min, max_ctas: max, policy, ..CtaBudget::default() },
        }
    }

    /// Every power of two from 1 byte to 4 GiB, and one byte past each.
    fn sizes() -> impl Iterator<Item = u64> {
        (0..=32).flat_map(|k| [1u64 << k, (1u64 << k) + 1])
    }

    #[test]
    fn four_lanes_take_the_sms_two_lanes_take_with_twice_the_channels() {
        // Wherever the region holds both: at every size and budget, 4 lanes of 256 threads
        // take the SMs that 2 lanes of 512 take, and run twice the channels on them (the
        // same threads per byte).
        let budgets = [(0, 0, CtaPolicy::Default), (0, 24, CtaPolicy::Default), (4, 0, CtaPolicy::Default)];
        for (min, max, p) in budgets.into_iter().chain([(0, 0, CtaPolicy::Efficiency), (2, 8, CtaPolicy::Zero)]) {
            let (two, four) = (ch(256, 2, min, max, p), ch(256, 4, min, max, p));
            for (b, launch) in sizes().flat_map(|b| [(b, Launch::Slots), (b, Launch::Window)]) {
                let (c2, c4) = (two.pick(b, launch), four.pick(b, launch));
                if 2 * c2 > 256 {
                    assert_eq!(c4, 256, "{b} bytes: the region caps");
                    continue;
                }
                assert_eq!(four.sms(c4), two.sms(c2), "{b} bytes, {launch:?}, budget {min}/{max}/{p:?}");
                // One channel per 16 KiB against one per 32 KiB: twice, or one short of it.
                assert!(c4 == 2 * c2 || c4 + 1 == 2 * c2, "{b} bytes: {c4} vs {c2} channels");
            }
        }
        let c = ch(128, 4, 0, 0, CtaPolicy::Default);
        assert_eq!(c.pick(16 << 10, Launch::Slots), 1);
        assert_eq!(c.pick((16 << 10) + 1, Launch::Slots), 2, "a 256-thread channel per 16 KiB");
        assert_eq!(c.pick(1 << 20, Launch::Slots), 64);
        assert_eq!(c.sms(64), 16);
        assert_eq!(c.pick(64 << 20, Launch::Slots), 128, "mid sizes stop at 128 (32 SMs, as with 2 lanes)");
        assert_eq!(c.sms(128), 32);
        assert_eq!(c.sms(3), 1, "a short last block");
        assert_eq!(c.sms(5), 2);
    }

    #[test]
    fn nccl_max_ctas_24_with_four_lanes_is_96_channels_within_the_default_region() {
        let c = ch(128, 4, 0, 24, CtaPolicy::Default);
        for b in [64u64 << 20, 256 << 20, 1 << 30] {
            assert_eq!(c.pick(b, Launch::Slots), 96, "{b}");
            assert_eq!(c.sms(96), 24);
        }
        assert_eq!(ch(128, 2, 0, 24, CtaPolicy::Default).pick(1 << 30, Launch::Slots), 48);
        // The region caps the channels, and so the SMs: 64 channels on 16 SMs.
        let c = ch(64, 4, 0, 24, CtaPolicy::Default);
        assert_eq!((c.pick(1 << 30, Launch::Slots), c.sms(c.pick(1 << 30, Launch::Slots))), (64, 16));
        // Uncapped, a large call takes the region's 128 channels: 32 SMs with 4 lanes (64 with 2).
        let c = ch(128, 4, 0, 0, CtaPolicy::Default);
        assert_eq!((c.pick(1 << 30, Launch::Slots), c.sms(128)), (128, 32));
        // Efficiency: 24 SMs' worth, 96 channels.
        assert_eq!(ch(128, 4, 0, 0, CtaPolicy::Efficiency).pick(1 << 30, Launch::Slots), 96);
    }

    #[test]
    fn ranks_with_other_lanes_pick_the_same_channels() {
        // Each rank launches with its own lanes; the count follows the fewest of any rank.
        for common in [1, 2, 4] {
            for (min, max, launch) in [(0, 0), (0, 16), (0, 24), (4, 0), (32, 0)].into_iter().flat_map(|(min, max)| {
                [(min, max, Launch::Slots), (min, max, Launch::Window), (min, max, Launch::Fold)]
            }) {
                let budget =
                    CtaBudget { min_ctas: min, max_ctas: max, policy: CtaPolicy::Default, ..CtaBudget::default() };
                let ranks: Vec<Channels> = [1, 2, 4]
                    .into_iter()
                    .filter(|&l| l >= common)
                    .map(|lanes| Channels { region: 128, lanes, common_lanes: common, budget })
                    .collect();
                // A windowed or folding call's ceiling: 24 SMs, or the floor where that is more.
                let ceiling = match (max, launch) {
                    (0, Launch::Slots) => u32::MAX,
                    (0, Launch::Window | Launch::Fold) => EFFICIENT_SMS.max(min),
                    (max, _) => max,
                };
                for b in sizes() {
                    let picks: Vec<u32> = ranks.iter().map(|c| c.pick(b, launch)).collect();
                    assert!(picks.windows(2).all(|w| w[0] == w[1]), "{b} bytes, {launch:?}: {picks:?}");
                    // No rank goes past the ceiling: one with more lanes takes fewer SMs.
                    for c in &ranks {
                        assert!(c.sms(picks[0]) <= ceiling, "{b} bytes, {launch:?}, {} lanes", c.lanes);
                    }
                }
            }
        }
        // A 2-lane peer holds a 4-lane rank to 2-lane counts: 48 channels on 12 SMs at 24 CTAs.
        let mixed = Channels { common_lanes: 2, ..ch(128, 4, 0, 24, CtaPolicy::Default) };
        assert_eq!((mixed.pick(1 << 30, Launch::Slots), mixed.sms(48)), (48, 12));
        // Grouped p2p packs its channels as the collectives do: 24 CTAs hold 96 4-lane ones.
        assert_eq!(ch(128, 4, 0, 24, CtaPolicy::Default).p2p_budget().total, 96);
    }

    #[test]
    fn a_windowed_or_folding_call_takes_at_most_24_sms_by_default() {
        for lanes in [2, 4] {
            let c = ch(128, lanes, 0, 0, CtaPolicy::Default);
            for launch in [Launch::Window, Launch::Fold] {
                for b in sizes() {
                    let (slots, got) = (c.pick(b, Launch::Slots), c.pick(b, launch));
                    // The size rule is the slots' one, under a ceiling of 24 SMs' worth.
                    assert_eq!(got, slots.min(EFFICIENT_SMS * lanes), "{b} bytes, {lanes} lanes, {launch:?}");
                    assert!(c.sms(got) <= EFFICIENT_SMS, "{b} bytes, {lanes} lanes, {launch:?}");
                }
                assert_eq!(c.sms(c.pick(1 << 30, launch)), EFFICIENT_SMS, "{launch:?}");
            }
            // minCTAs 32 lifts a folding call's ceiling as it lifts the others'.
            let floor = ch(128, lanes, 32, 0, CtaPolicy::Default);
            assert_eq!(floor.sms(floor.pick(1 << 30, Launch::Fold)), 32, "{lanes} lanes");
        }
        // 48 channels on 24 SMs with 2 lanes, 96 with 4; the slots keep 32 SMs.
        let (two, four) = (ch(128, 2, 0, 0, CtaPolicy::Default), ch(128, 4, 0, 0, CtaPolicy::Default));
        for b in [64u64 << 20, 256 << 20, 1 << 30, 4 << 30] {
            assert_eq!(two.pick(b, Launch::Window), 48, "{b}");
            assert_eq!(four.pick(b, Launch::Window), 96, "{b}");
        }
        assert_eq!((two.pick(1 << 30, Launch::Slots), four.pick(1 << 30, Launch::Slots)), (64, 128));
        assert_eq!((two.pick(64 << 20, Launch::Slots), four.pick(64 << 20, Launch::Slots)), (64, 128));
        // Small calls take what they took: the ceiling is above their channels.
        assert_eq!(two.pick(1 << 20, Launch::Window), 32);
        assert_eq!(four.pick(1 << 20, Launch::Window), 64);
    }

    #[test]
    fn a_users_floor_above_24_wins_and_max_ctas_caps_a_windowed_call() {
        // minCTAs 32: 32 SMs' worth at every size, as for the slots.
        for lanes in [2, 4] {
            let c = ch(128, lanes, 32, 0, CtaPolicy::Default);
            for b in sizes() {
                assert_eq!(c.pick(b, Launch::Window), c.pick(b, Launch::Slots).min(32 * lanes), "{b} bytes");
                assert_eq!(c.sms(c.pick(b, Launch::Window)), 32, "{b} bytes, {lanes} lanes");
            }
        }
        // minCTAs below 24 is a floor only: large calls still take 24 SMs.
        let c = ch(128, 2, 4, 0, CtaPolicy::Default);
        assert_eq!((c.pick(8, Launch::Window), c.pick(1 << 30, Launch::Window)), (8, 48));
        // maxCTAs 16 caps below the 24.
        for lanes in [2, 4] {
            let c = ch(128, lanes, 0, 16, CtaPolicy::Default);
            for b in sizes() {
                assert_eq!(c.pick(b, Launch::Window), c.pick(b, Launch::Slots), "{b} bytes");
            }
            assert_eq!(c.pick(1 << 30, Launch::Window), 16 * lanes);
            assert_eq!(c.sms(16 * lanes), 16);
        }
        // The region caps below too: 64 channels are 16 SMs with 4 lanes.
        assert_eq!(ch(64, 4, 0, 0, CtaPolicy::Default).pick(1 << 30, Launch::Window), 64);
        // The other policies hold every call to 24 SMs, windowed or not.
        for p in [CtaPolicy::Efficiency, CtaPolicy::Zero] {
            for (min, max) in [(0, 0), (32, 0), (0, 16)] {
                let c = ch(128, 4, min, max, p);
                for b in sizes() {
                    assert_eq!(c.pick(b, Launch::Window), c.pick(b, Launch::Slots), "{b} bytes, {p:?}");
                }
            }
        }
    }

    #[test]
    fn channels_grow_with_size_up_to_the_region() {
        let c = ch(128, 2, 0, 0, CtaPolicy::Default);
        assert_eq!(c.pick(8, Launch::Slots), 1);
        assert_eq!(c.pick(32 << 10, Launch::Slots), 1);
        assert_eq!(c.pick((32 << 10) + 1, Launch::Slots), 2);
        assert_eq!(c.pick(1 << 20, Launch::Slots), 32);
        assert_eq!(c.pick(2 << 20, Launch::Slots), 64);
        assert_eq!(c.pick(1 << 30, Launch::Slots), 64, "32 SMs from there");
        assert_eq!(ch(48, 2, 0, 0, CtaPolicy::Default).pick(1 << 30, Launch::Slots), 48, "the region caps");
        assert_eq!(c.sms(64), 32);
        assert_eq!(c.sms(128), 64);
        assert_eq!(c.sms(1), 1);
        assert_eq!(c.sms(3), 2);
    }

    #[test]
    fn the_budget_bounds_the_sms_not_the_channels() {
        // maxCTAs 8 with two lanes: 16 channels on 8 SMs.
        let c = ch(64, 2, 0, 8, CtaPolicy::Default);
        assert_eq!(c.pick(1 << 30, Launch::Slots), 16);
        assert_eq!(c.sms(c.pick(1 << 30, Launch::Slots)), 8);
        // minCTAs 4: even an 8-byte call takes 4 SMs' channels.
        let c = ch(64, 2, 4, 0, CtaPolicy::Default);
        assert_eq!(c.pick(8, Launch::Slots), 8);
        // With one lane per block, CTAs are channels.
        assert_eq!(ch(64, 1, 0, 8, CtaPolicy::Default).pick(1 << 30, Launch::Slots), 8);
        // A floor above the region's channels is cut to the region.
        assert_eq!(ch(8, 2, 16, 0, CtaPolicy::Default).pick(8, Launch::Slots), 8);
    }

    #[test]
    fn efficiency_and_zero_cap_the_sms() {
        for p in [CtaPolicy::Efficiency, CtaPolicy::Zero] {
            let c = ch(128, 2, 0, 0, p);
            assert_eq!(c.sms(c.pick(1 << 30, Launch::Slots)), EFFICIENT_SMS);
        }
        // The default: 32 SMs for a call through the slots.
        assert_eq!(ch(128, 2, 0, 0, CtaPolicy::Default).pick(1 << 30, Launch::Slots), 64);
    }

    #[test]
    fn a_slot_call_takes_at_most_32_sms_by_default_unless_min_ctas_asks_for_more() {
        for lanes in [1, 2, 4] {
            let c = ch(256, lanes, 0, 0, CtaPolicy::Default);
            for b in sizes() {
                assert!(c.sms(c.pick(b, Launch::Slots)) <= SLOT_SMS, "{b} bytes, {lanes} lanes");
            }
            assert_eq!(c.sms(c.pick(1 << 30, Launch::Slots)), SLOT_SMS, "{lanes} lanes");
            // minCTAs 64 (NCCL_MIN_CTAS=64): the 64 SMs the region holds with two lanes.
            let floor = ch(128, lanes, 64, 0, CtaPolicy::Default);
            assert_eq!(floor.sms(floor.pick(1 << 30, Launch::Slots)), (128 / lanes).min(64), "{lanes} lanes");
        }
        // Grouped send/recv: a connection takes half the slots' SMs, a group the region's
        // channels (64 SMs with two lanes); 24 SMs under the other policies.
        let c = ch(128, 2, 0, 0, CtaPolicy::Default);
        assert_eq!(c.p2p_budget(), P2pBudget { total: 128, per_conn: SLOT_SMS });
        assert_eq!(c.sms(2 * c.p2p_budget().per_conn), SLOT_SMS, "a send and a receive");
        assert_eq!(ch(128, 2, 64, 0, CtaPolicy::Default).p2p_budget().per_conn, 64, "minCTAs 64");
        let e = ch(128, 2, 0, 0, CtaPolicy::Efficiency);
        assert_eq!(e.p2p_budget(), P2pBudget { total: 48, per_conn: 48 });
        assert_eq!(e.sms(e.p2p_budget().total), EFFICIENT_SMS);
    }

    /// Under `CTAPolicy` zero every call that moves bytes takes the copy engines; under the
    /// others a windowed all-gather or all-to-all from `ce_share` bytes a peer, unless a
    /// `minCTAs` asks for SMs or `OCCL_CE_MIN_SHARE=0` turns the choice off.
    #[test]
    fn the_copy_engines_take_large_windowed_gathers_and_all_to_alls() {
        use CollType::*;
        let all = [AllReduce, ReduceScatter, Reduce, Broadcast, AllGather, AllToAll, Send, Recv];
        let zero = CtaBudget { policy: CtaPolicy::Zero, ..CtaBudget::default() };
        for c in all {
            let moves = matches!(c, AllGather | AllToAll | Broadcast | Send | Recv);
            for (share, windowed) in [(0, false), (1, true), (1 << 30, false), (1 << 30, true)] {
                assert_eq!(zero.on_copy_engines(c, share, windowed), moves, "{c:?} {share} {windowed}");
            }
        }
        for policy in [CtaPolicy::Default, CtaPolicy::Efficiency] {
            let b = CtaBudget { policy, ..CtaBudget::default() };
            assert!(b.may_use_copy_engines());
            for c in all {
                let gathers = matches!(c, AllGather | AllToAll);
                assert_eq!(b.on_copy_engines(c, CE_SHARE, true), gathers, "{c:?} {policy:?}");
                assert_eq!(b.on_copy_engines(c, 4 << 30, true), gathers, "{c:?} {policy:?}");
                assert!(!b.on_copy_engines(c, CE_SHARE - 1, true), "{c:?} {policy:?}: below the share");
                assert!(!b.on_copy_engines(c, 4 << 30, false), "{c:?} {policy:?}: through the slots");
            }
            let floor = CtaBudget { min_ctas: 1, ..b };
            assert!(!floor.on_copy_engines(AllGather, 1 << 30, true), "minCTAs asks for SMs");
            assert!(!floor.may_use_copy_engines());
            let off = CtaBudget { ce_share: 0, ..b };
            assert!(!off.on_copy_engines(AllGather, 1 << 30, true), "OCCL_CE_MIN_SHARE=0");
            assert!(!off.may_use_copy_engines());
            let low = CtaBudget { ce_share: 1, ..b };
            assert!(low.on_copy_engines(AllToAll, 1, true));
            let capped = CtaBudget { max_ctas: 8, ..b };
            assert!(capped.on_copy_engines(AllGather, 1 << 30, true), "a ceiling is no floor");
        }
        // minCTAs does not hold back what CTAPolicy zero asks for.
        assert!(CtaBudget { min_ctas: 4, ..zero }.on_copy_engines(Send, 1, false));
        assert!(CtaBudget { min_ctas: 4, ce_share: 0, ..zero }.may_use_copy_engines());
    }

    #[test]
    fn the_copy_engines_share_is_a_size_in_bytes() {
        let with = |v: &'static str| {
            CtaBudget::default().under_vars(move |k: &str| (k == "OCCL_CE_MIN_SHARE").then(|| v.to_string()))
        };
        assert_eq!(CtaBudget::default().ce_share, 32 << 20);
        assert_eq!(with("64M").unwrap().ce_share, 64 << 20);
        assert_eq!(with(" 1g ").unwrap().ce_share, 1 << 30);
        assert_eq!(with("4096").unwrap().ce_share, 4096);
        assert_eq!(with("0").unwrap().ce_share, 0);
        let e = with("big").unwrap_err().to_string();
        assert!(e.contains("OCCL_CE_MIN_SHARE=\"big\" is not a size in bytes"), "{e}");
        assert_ne!(with("64M").unwrap().encode(), CtaBudget::default().encode(), "ranks compare it");
    }

    #[test]
    fn nccl_policy_values_and_bad_budgets() {
        assert_eq!(CtaPolicy::from_nccl(0).ok(), Some(CtaPolicy::Default));
        assert_eq!(CtaPolicy::from_nccl(1).ok(), Some(CtaPolicy::Efficiency));
        assert_eq!(CtaPolicy::from_nccl(2).ok(), Some(CtaPolicy::Zero));
        let e = CtaPolicy::from_nccl(7).unwrap_err().to_string();
        assert!(e.contains("NCCL_CTA_POLICY_EFFICIENCY"), "{e}");
        let e = CtaBudget { min_ctas: 9, max_ctas: 4, policy: CtaPolicy::Default, ..CtaBudget::default() }
            .checked()
            .unwrap_err();
        assert!(e.to_string().contains("minCTAs 9 is above maxCTAs 4"), "{e}");
        let a = CtaBudget { min_ctas: 1, max_ctas: 2, policy: CtaPolicy::Zero, ..CtaBudget::default() };
        assert_ne!(a.encode(), CtaBudget::default().encode());
    }
}
