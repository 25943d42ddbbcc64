//! The activation mask: one bit per `EventType`, NCCL's numbering.

use crate::event::EventType;
use std::fmt;
use std::ops::{BitAnd, BitAndAssign, BitOr, BitOrAssign, Not};

/// A set of event types, as NCCL's `eActivationMask` (bits 0–14 are defined; others are kept but
/// match no event).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct EventMask(pub u64);

/// The variables read by [`EventMask::from_env`], first one set wins.
pub const MASK_ENV_VARS: [&str; 2] = ["OCCL_PROFILE_EVENT_MASK", "NCCL_PROFILE_EVENT_MASK"];

impl EventMask {
    /// No event.
    pub const NONE: EventMask = EventMask(0);
    /// Every defined event type (NCCL's "all v6 events", 0x7FFF).
    pub const ALL: EventMask = EventMask(0x7FFF);
    /// occl's own bit, above NCCL's 32-bit mask: per-ProxyOp sums of its steps
    /// ([`crate::StepTotals`]) instead of each ProxyStep. An emitter that can sum a leg's steps
    /// (occl's shm legs) does, and hands the sums at the op's end; steps it still sends as events
    /// (NCCL's, occl's tcp legs, whose NetPlugin children need a parent) reach the sink as
    /// ProxySteps, from which it sums them itself.
    pub const STEP_TOTALS: EventMask = EventMask(1 << 32);
    /// occl's own bit: one [`crate::OpTotals`] per operation (`Sink::op_totals`) instead of its
    /// events, where the emitter can sum the whole operation (occl's single calls whose legs are
    /// all summed: shm and threads). Other operations (NCCL's, tcp legs, grouped calls) still
    /// arrive as the events of the rest of the sink's interest, so a sink asks for those too.
    /// In a fan-out's combined interest the bit is set only when *every* attached sink has it:
    /// the emitter then emits nothing else for the operations it sums.
    pub const OP_TOTALS: EventMask = EventMask(1 << 33);

    /// The bits that route an event of type `t` to a sink: ProxySteps also go to sinks that want
    /// [`EventMask::STEP_TOTALS`] (the steps an emitter did not sum).
    #[inline]
    pub const fn route_bits(t: EventType) -> u64 {
        match t {
            EventType::ProxyStep => t.bit() | Self::STEP_TOTALS.0,
            _ => t.bit(),
        }
    }

    /// Whether step sums are asked for.
    #[inline]
    pub const fn wants_totals(self) -> bool {
        self.0 & Self::STEP_TOTALS.0 != 0
    }

    /// Whether whole-operation sums are asked for (by every sink, in a fan-out's interest).
    #[inline]
    pub const fn wants_op_totals(self) -> bool {
        self.0 & Self::OP_TOTALS.0 != 0
    }

    /// The mask for an emitter that sends every step as an event (NCCL): step sums become
    /// ProxySteps.
    #[inline]
    pub const fn steps_as_events(self) -> EventMask {
        if self.wants_totals() {
            EventMask(self.0 | EventType::ProxyStep.bit())
        } else {
            self
        }
    }

    /// The mask of one type.
    #[inline]
    pub const fn of(t: EventType) -> EventMask {
        EventMask(t.bit())
    }

    /// Whether `t` is in the set.
    #[inline]
    pub const fn contains(self, t: EventType) -> bool {
        self.0 & t.bit() != 0
    }

    /// Whether the set is empty.
    #[inline]
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// The set plus `t`.
    #[inline]
    pub const fn with(self, t: EventType) -> EventMask {
        EventMask(self.0 | t.bit())
    }

    /// The set plus the ancestors NCCL emits for it (reference §4): enabling a descendant also
    /// emits its parents, so every event a sink sees has its parent chain. ProxyCtrl stands
    /// alone; the copy-engine types imply CollApi.
    pub const fn with_ancestors(self) -> EventMask {
        use EventType as T;
        const fn has(m: u64, ts: &[EventType]) -> bool {
            let mut i = 0;
            while i < ts.len() {
                if m & ts[i].bit() != 0 {
                    return true;
                }
                i += 1;
            }
            false
        }
        let m = self.0;
        let mut out = m;
        // With step sums, the steps that have NetPlugin children are sent as events anyway.
        if has(m, &[T::NetPlugin]) && m & Self::STEP_TOTALS.0 == 0 {
            out |= T::ProxyStep.bit();
        }
        if has(m, &[T::ProxyOp, T::ProxyStep, T::NetPlugin]) || m & Self::STEP_TOTALS.0 != 0 {
            out |= T::ProxyOp.bit();
        }
        let below = &[T::ProxyOp, T::ProxyStep, T::KernelCh, T::NetPlugin];
        if has(m, &[T::Coll]) || has(m, below) {
            out |= T::Coll.bit();
        }
        if has(m, &[T::P2p]) || has(m, below) {
            out |= T::P2p.bit();
        }
        if has(out, &[T::Group, T::Coll, T::P2p]) {
            out |= T::Group.bit();
        }
        if has(out, &[T::CollApi, T::Coll, T::CeColl, T::CeSync, T::CeBatch]) {
            out |= T::CollApi.bit();
        }
        if has(out, &[T::P2pApi, T::P2p]) {
            out |= T::P2pApi.bit();
        }
        if out & !T::ProxyCtrl.bit() & EventMask::ALL.0 != 0 {
            out |= T::GroupApi.bit();
        }
        EventMask(out)
    }

    /// The defined types in the set, in bit order.
    pub fn types(self) -> impl Iterator<Item = EventType> {
        EventType::ALL.into_iter().filter(move |t| self.contains(*t))
    }

    /// Parses the `*_PROFILE_EVENT_MASK` syntax: a decimal or `0x`/`0X` hexadecimal u64,
    /// surrounding whitespace allowed. NCCL's example plugin uses `atoi`, which silently turns
    /// garbage into 0; we refuse it instead, so a typo does not switch profiling off unnoticed.
    pub fn parse(s: &str) -> Result<EventMask, ParseMaskError> {
        let t = s.trim();
        let err = |reason| Err(ParseMaskError { input: s.to_owned(), reason });
        if t.is_empty() {
            return err("empty");
        }
        let (digits, radix) = match t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
            Some(h) => (h, 16),
            None => (t, 10),
        };
        // from_str_radix accepts a leading '+'; we do not, so "0x+1" and "+5" are refused too.
        if digits.is_empty() || !digits.chars().all(|c| c.is_digit(radix)) {
            return err(if radix == 16 {
                "expected hexadecimal digits after 0x"
            } else {
                "expected a decimal number or 0x-prefixed hexadecimal (no sign)"
            });
        }
        match u64::from_str_radix(digits, radix) {
            Ok(v) => Ok(EventMask(v)),
            Err(_) => err("does not fit in 64 bits"),
        }
    }

    /// Reads `OCCL_PROFILE_EVENT_MASK`, else `NCCL_PROFILE_EVENT_MASK`; `Ok(None)` when neither
    /// is set.
    pub fn from_env() -> Result<Option<EventMask>, ParseMaskError> {
        for var in MASK_ENV_VARS {
            if let Ok(v) = std::env::var(var) {
                return Self::parse(&v).map(Some);
            }
        }
        Ok(None)
    }
}

impl From<EventType> for EventMask {
    fn from(t: EventType) -> Self {
        EventMask::of(t)
    }
}

impl BitOr for EventMask {
    type Output = EventMask;
    fn bitor(self, rhs: EventMask) -> EventMask {
        EventMask(self.0 | rhs.0)
    }
}

impl BitOr<EventType> for EventMask {
    type Output = EventMask;
    fn bitor(self, rhs: EventType) -> EventMask {
        self.with(rhs)
    }
}

impl BitOrAssign for EventMask {
    fn bitor_assign(&mut self, rhs: EventMask) {
        self.0 |= rhs.0;
    }
}

impl BitAnd for EventMask {
    type Output = EventMask;
    fn bitand(self, rhs: EventMask) -> EventMask {
        EventMask(self.0 & rhs.0)
    }
}

impl BitAndAssign for EventMask {
    fn bitand_assign(&mut self, rhs: EventMask) {
        self.0 &= rhs.0;
    }
}

impl Not for EventMask {
    type Output = EventMask;
    fn not(self) -> EventMask {
        EventMask(!self.0)
    }
}

impl fmt::Display for EventMask {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#x}", self.0)
    }
}

/// A mask string that is neither decimal nor `0x` hexadecimal.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParseMaskError {
    /// The text as given.
    pub input: String,
    /// Why it was refused.
    pub reason: &'static str,
}

impl fmt::Display for ParseMaskError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "invalid profile event mask {:?}: {} (e.g. 6 or 0x6 for Coll|P2p, 0x7fff for all)",
            self.input, self.reason
        )
    }
}

impl std::error::Error for ParseMaskError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_decimal_and_hex() {
        assert_eq!(EventMask::parse("6"), Ok(EventMask(6)));
        assert_eq!(EventMask::parse("0"), Ok(EventMask::NONE));
        assert_eq!(EventMask::parse(" 4095\n"), Ok(EventMask(0xFFF)));
        assert_eq!(EventMask::parse("0x7fff"), Ok(EventMask::ALL));
        assert_eq!(EventMask::parse("0X7FFF"), Ok(EventMask::ALL));
        assert_eq!(EventMask::parse("0x0"), Ok(EventMask::NONE));
        assert_eq!(EventMask::parse("007"), Ok(EventMask(7)));
        assert_eq!(EventMask::parse("18446744073709551615"), Ok(EventMask(u64::MAX)));
        assert_eq!(EventMask::parse("0xFFFFFFFFFFFFFFFF"), Ok(EventMask(u64::MAX)));
    }

    #[test]
    fn refuses_garbage_with_a_clear_message() {
        for bad in
            ["", "  ", "-1", "+6", "0x", "0x+1", "0xg", "6a", "1e3", "Coll", "0b11", "6 7", "18446744073709551616"]
        {
            let e = EventMask::parse(bad).expect_err(bad);
            let msg = e.to_string();
            assert!(msg.contains("invalid profile event mask"), "{msg}");
            assert_eq!(e.input, bad);
        }
        let e = EventMask::parse("0x1FFFFFFFFFFFFFFFF").expect_err("overflow");
        assert!(e.to_string().contains("64 bits"), "{e}");
    }

    #[test]
    fn bit_ops() {
        let m = EventMask::of(EventType::Coll) | EventType::P2p;
        assert_eq!(m, EventMask(6));
        assert!(m.contains(EventType::Coll) && !m.contains(EventType::Group));
        assert_eq!(m & EventMask::of(EventType::P2p), EventMask(4));
        assert_eq!((!m & EventMask::ALL).0, 0x7FFF & !6);
        let mut n = EventMask::NONE;
        assert!(n.is_empty());
        n |= m;
        n &= EventMask(2);
        assert_eq!(n.types().collect::<Vec<_>>(), vec![EventType::Coll]);
        assert_eq!(EventMask::ALL.types().count(), 15);
        assert_eq!(EventMask(6).to_string(), "0x6");
    }

    #[test]
    fn ancestors_follow_nccls_rules() {
        use EventType as T;
        let anc = |ts: &[EventType]| ts.iter().fold(EventMask::NONE, |m, t| m.with(*t)).with_ancestors();
        assert_eq!(EventMask::NONE.with_ancestors(), EventMask::NONE);
        assert_eq!(anc(&[T::ProxyCtrl]), EventMask::of(T::ProxyCtrl));
        assert_eq!(anc(&[T::GroupApi]), EventMask::of(T::GroupApi));
        let coll = anc(&[T::Coll]);
        assert_eq!(coll, EventMask::NONE.with(T::Coll).with(T::Group).with(T::CollApi).with(T::GroupApi));
        let step = anc(&[T::NetPlugin]);
        for t in [T::ProxyStep, T::ProxyOp, T::Coll, T::P2p, T::Group, T::CollApi, T::P2pApi, T::GroupApi] {
            assert!(step.contains(t), "{}", t.name());
        }
        assert!(!step.contains(T::ProxyCtrl) && !step.contains(T::KernelCh));
        let kch = anc(&[T::KernelCh]);
        assert!(kch.contains(T::Coll) && kch.contains(T::P2p) && !kch.contains(T::ProxyOp));
        assert_eq!(anc(&[T::P2pApi]), EventMask::NONE.with(T::P2pApi).with(T::GroupApi));
        assert_eq!(anc(&[T::CeSync]), EventMask::NONE.with(T::CeSync).with(T::CollApi).with(T::GroupApi));
        assert_eq!(EventMask::ALL.with_ancestors(), EventMask::ALL);
    }

    #[test]
    fn step_totals_imply_the_op_not_each_step() {
        use EventType as T;
        let m = (EventMask::STEP_TOTALS | EventType::NetPlugin).with_ancestors();
        assert!(m.wants_totals() && m.contains(T::ProxyOp) && m.contains(T::Coll) && m.contains(T::GroupApi));
        assert!(!m.contains(T::ProxyStep), "sums replace the steps an emitter can sum");
        assert!(m.steps_as_events().contains(T::ProxyStep), "NCCL sends every step");
        assert_eq!(EventMask::of(T::Coll).steps_as_events(), EventMask::of(T::Coll));
        assert_eq!(EventMask::route_bits(T::ProxyStep) & m.0, EventMask::STEP_TOTALS.0);
        assert_eq!(EventMask::route_bits(T::Coll), T::Coll.bit());
        assert!(EventMask::STEP_TOTALS.0 > u64::from(u32::MAX), "never in NCCL's int mask");
    }
}
