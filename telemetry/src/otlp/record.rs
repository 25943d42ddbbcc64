//! What the emitting thread queues for the export thread: a finished span copied out of the
//! collector's borrow, with no allocation (the descriptor's names are `'static`, the state marks
//! an inline array).

use super::ids::CommKey;
use crate::event::EventDescr;
use crate::spans::{CommMeta, Span, StateMark};
use std::sync::Arc;

/// State marks a queued span keeps: a ProxyStep has three, a ProxyOp one, a GroupApi two.
pub const MARKS: usize = 4;

/// A finished span on its way to the export thread.
#[derive(Clone, Debug)]
pub struct Rec {
    pub comm: Arc<CommMeta>,
    pub id: u64,
    pub parent: Option<u64>,
    pub root: u64,
    pub start_ns: u64,
    pub end_ns: u64,
    pub descr: EventDescr<'static>,
    marks: [StateMark; MARKS],
    n_marks: u8,
    /// Marks beyond [`MARKS`], here or in the collector.
    pub marks_dropped: u32,
    pub steps_done: u32,
}

const NO_MARK: StateMark = StateMark { t_ns: 0, state: 0, value: 0 };

impl Rec {
    pub fn new(s: &Span<'_>) -> Rec {
        let mut marks = [NO_MARK; MARKS];
        let n = s.states.len().min(MARKS);
        marks[..n].copy_from_slice(&s.states[..n]);
        Rec {
            comm: s.comm.clone(),
            id: s.id.get(),
            parent: s.parent.map(|p| p.get()),
            root: s.root.get(),
            start_ns: s.start_ns,
            end_ns: s.end_ns,
            descr: s.descr,
            marks,
            n_marks: n as u8,
            marks_dropped: s.states_dropped.saturating_add((s.states.len() - n) as u32),
            steps_done: s.steps_done,
        }
    }

    pub fn marks(&self) -> &[StateMark] {
        &self.marks[..usize::from(self.n_marks)]
    }

    pub fn key(&self) -> CommKey {
        CommKey { hash: self.comm.hash, rank: self.comm.rank }
    }

    /// A ProxyOp's failure, if its finished steps fall short of the plan.
    pub fn proxy_op_error(&self) -> Option<String> {
        match self.descr {
            EventDescr::ProxyOp { n_steps, .. } if n_steps > 0 && (self.steps_done as i64) < i64::from(n_steps) => {
                Some(format!("{} of {} steps finished", self.steps_done, n_steps))
            }
            _ => None,
        }
    }
}
