//! What an operation moved, for the direct metrics route (`super` module docs): the primitives
//! add each slice they post or receive, as `Steps` would sum it, without reading the clock; the
//! transport adds the time of each wait that blocked (`fifo::Timed`), by step state.

use crate::transport::fifo::WaitSums;
use occl_events::StepTotals;
use occl_telemetry::prometheus::{Moved, RankMetrics};
use std::cell::Cell;

/// Steps and bytes of one operation (or one group launch) by direction (`[send, recv]`), and the
/// ns its waits blocked, by state.
#[derive(Default)]
pub(crate) struct Tally {
    steps: [Cell<u64>; 2],
    bytes: [Cell<u64>; 2],
    waits: WaitSums,
}

fn add(c: &Cell<u64>, v: u64) {
    c.set(c.get().wrapping_add(v));
}

impl Tally {
    /// A slice of `n` bytes was posted: a send step.
    #[inline]
    pub(crate) fn sent(&self, n: usize) {
        add(&self.steps[0], 1);
        add(&self.bytes[0], n as u64);
    }

    /// A slice of `n` bytes arrived.
    #[inline]
    pub(crate) fn arrived(&self, n: usize) {
        add(&self.bytes[1], n as u64);
    }

    /// The slice was consumed and released: a receive step.
    #[inline]
    pub(crate) fn released(&self) {
        add(&self.steps[1], 1);
    }

    pub(crate) fn moved(&self) -> Moved {
        Moved { steps: [self.steps[0].get(), self.steps[1].get()], bytes: [self.bytes[0].get(), self.bytes[1].get()] }
    }

    /// Adds what the operation moved over shm and the time its waits blocked to `m`.
    #[inline]
    pub(crate) fn report(&self, m: &mut RankMetrics<'_>) {
        m.moved(crate::config::TransportKind::Shm.name(), &self.moved());
        if let Some(w) = self.waits() {
            m.waited(&w);
        }
    }

    /// Where the operation's waits add the time they blocked (`fifo::Ends::waited`).
    #[inline]
    pub(crate) fn wait_sums(&self) -> &WaitSums {
        &self.waits
    }

    /// The ns its waits blocked, by state (`StepTotals::STATES`), if any wait blocked.
    #[inline]
    pub(crate) fn waits(&self) -> Option<[u64; StepTotals::STATES.len()]> {
        self.waits.get()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::fifo::Timed;
    use occl_events::event::ProxyStepState;

    #[test]
    fn waits_add_up_by_state_beside_steps_and_bytes() {
        let t = Tally::default();
        t.sent(8);
        t.arrived(8);
        t.released();
        assert!(t.waits().is_none(), "no wait blocked, nothing to add");
        let w = t.wait_sums();
        w.add(ProxyStepState::RecvWait as u32, 1_000);
        w.add(ProxyStepState::RecvWait as u32, 234);
        w.add(ProxyStepState::SendPeerWait as u32, 50);
        w.add(ProxyStepState::SendWait as u32, 7);
        let m = t.moved();
        assert_eq!((m.steps, m.bytes), ([1, 1], [8, 8]));
        let w = t.waits().expect("waits blocked");
        let at = |s: ProxyStepState| w[StepTotals::index(s)];
        assert_eq!(at(ProxyStepState::RecvWait), 1_234);
        assert_eq!(at(ProxyStepState::SendPeerWait), 50);
        assert_eq!(at(ProxyStepState::SendWait), 7);
        assert_eq!(w.iter().sum::<u64>(), 1_291, "no other state: {w:?}");
    }

    #[test]
    fn unknown_states_count_nowhere_and_sums_saturate() {
        let t = Tally::default();
        t.wait_sums().add(9999, 5);
        assert_eq!(t.waits(), Some([0; 6]));
        t.wait_sums().add(ProxyStepState::RecvWait as u32, u64::MAX);
        t.wait_sums().add(ProxyStepState::RecvWait as u32, 1);
        assert_eq!(t.waits().map(|w| w[StepTotals::index(ProxyStepState::RecvWait)]), Some(u64::MAX));
    }

    #[test]
    fn a_timed_wait_adds_its_time_when_it_ends() {
        let t = Tally::default();
        {
            let _w = Timed::start(Some(t.wait_sums()), ProxyStepState::RecvWait as u32);
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let ns = t.waits().map_or(0, |w| w[StepTotals::index(ProxyStepState::RecvWait)]);
        assert!((20_000_000..2_000_000_000).contains(&ns), "{ns} ns");
        assert!(Timed::start(None, 10).is_none(), "no tally, no clock");
    }
}
