//! What the exporter keeps of one finished span: a fixed-size copy, so the hot path allocates
//! nothing but the log's chunks.

use crate::event::EventDescr;
use crate::spans::Span;

/// State marks kept per record: a ProxyStep has three, a ProxyOp one.
pub(crate) const MARKS: usize = 4;

#[derive(Clone, Copy, Debug)]
pub(crate) struct Rec {
    /// The communicator's ordinal within its rank file.
    pub comm: u16,
    /// The thread that stopped the event ([`super::threads`]).
    pub tid: u32,
    pub id: u64,
    /// 0 when the event has no parent.
    pub parent: u64,
    pub start_ns: u64,
    pub end_ns: u64,
    pub descr: EventDescr<'static>,
    /// The largest byte count a state reported (a step's transfer size).
    pub bytes: u64,
    pub n_marks: u8,
    /// (NCCL state number, ns after the start), in arrival order.
    pub marks: [(u8, u32); MARKS],
}

impl Rec {
    pub fn from_span(s: &Span<'_>, comm: u16, tid: u32) -> Rec {
        let mut marks = [(0u8, 0u32); MARKS];
        let mut n = 0;
        let mut bytes = 0;
        for m in s.states {
            bytes = bytes.max(m.value);
            if n < MARKS {
                let after = m.t_ns.saturating_sub(s.start_ns).min(u64::from(u32::MAX)) as u32;
                marks[n] = (m.state.min(255) as u8, after);
                n += 1;
            }
        }
        Rec {
            comm,
            tid,
            id: s.id.get(),
            parent: s.parent.map_or(0, |p| p.get()),
            start_ns: s.start_ns,
            end_ns: s.end_ns.max(s.start_ns),
            descr: s.descr,
            bytes,
            n_marks: n as u8,
            marks,
        }
    }

    pub fn marks(&self) -> &[(u8, u32)] {
        &self.marks[..usize::from(self.n_marks).min(MARKS)]
    }
}
