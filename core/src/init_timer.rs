//! Init split into timed phases, logged at `OCCL_DEBUG=INFO` as one line per rank, like NCCL's
//! "Init timings" line: where the time of a slow communicator creation went.

use std::time::{Duration, Instant};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Phase {
    /// Joining the root(s): connect, authenticate, RAS start.
    Bootstrap,
    /// The bootstrap all-gather rounds (peer table, tuner agreement).
    AllGather,
    /// Topology detection and rank ordering.
    Topo,
    /// Transport connections made at init (none with lazy connection).
    Connect,
    /// Everything else (records, profiler, RAS join).
    Rest,
}

const PHASES: [Phase; 5] = [Phase::Bootstrap, Phase::AllGather, Phase::Topo, Phase::Connect, Phase::Rest];

pub(crate) struct InitTimer {
    start: Instant,
    last: Instant,
    spent: [Duration; 5],
}

impl InitTimer {
    pub(crate) fn start() -> InitTimer {
        let now = Instant::now();
        InitTimer { start: now, last: now, spent: [Duration::ZERO; 5] }
    }

    /// Charges the time since the previous lap to `phase`.
    pub(crate) fn lap(&mut self, phase: Phase) {
        let now = Instant::now();
        if let Some(i) = PHASES.iter().position(|p| *p == phase) {
            self.spent[i] += now - self.last;
        }
        self.last = now;
    }

    pub(crate) fn spent(&self, phase: Phase) -> Duration {
        PHASES.iter().position(|p| *p == phase).map_or(Duration::ZERO, |i| self.spent[i])
    }

    /// The "Init timings" line (seconds).
    pub(crate) fn line(&self, rank: usize, nranks: usize, nids: usize) -> String {
        let s = |p| self.spent(p).as_secs_f64();
        format!(
            "occl: Init timings - rank {rank} nranks {nranks} ids {nids} total {:.3} (bootstrap {:.3}, allgathers {:.3}, topo {:.3}, connections {:.3}, rest {:.3})",
            self.start.elapsed().as_secs_f64(),
            s(Phase::Bootstrap),
            s(Phase::AllGather),
            s(Phase::Topo),
            s(Phase::Connect),
            s(Phase::Rest),
        )
    }

    pub(crate) fn report(&self, rank: usize, nranks: usize, nids: usize) {
        tracing::info!("{}", self.line(rank, nranks, nids));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn laps_add_up_to_the_phases() {
        let mut t = InitTimer::start();
        std::thread::sleep(Duration::from_millis(5));
        t.lap(Phase::Bootstrap);
        t.lap(Phase::AllGather);
        std::thread::sleep(Duration::from_millis(5));
        t.lap(Phase::AllGather);
        assert!(t.spent(Phase::Bootstrap) >= Duration::from_millis(5));
        assert!(t.spent(Phase::AllGather) >= Duration::from_millis(5));
        assert_eq!(t.spent(Phase::Connect), Duration::ZERO);
        let l = t.line(3, 8, 2);
        assert!(l.starts_with("occl: Init timings - rank 3 nranks 8 ids 2 total "), "{l}");
        assert!(l.contains("connections 0.000"), "{l}");
    }
}
