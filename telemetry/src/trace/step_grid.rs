//! Whole-microsecond times for the rows HTA cuts iterations by.
//!
//! HTA reads a trace's times as µs, rounds every row's start up and its end down to a whole
//! µs (PyTorch PR 122425), and gives a call row the iteration of the `ProfilerStep#N` row with
//! `start <= call < end`. With times written to the ns, a call in the last microsecond of its
//! step, or in the microsecond two steps share, lands outside its own step. So step rows and
//! the call rows inside them are written in whole µs: a step from the µs it began in to the µs
//! after it ended (or to where the next step begins, if that is sooner, so steps never
//! overlap), and a call at the µs it began in, kept inside its step's span. A call moves by
//! less than a microsecond, and only when its step shares its first or last µs.

use super::steps::Step;

/// The steps of one file with the whole-µs span each is written with.
pub(crate) struct StepGrid {
    /// (start ns, end ns, start µs, end µs), ordered by start.
    spans: Vec<(u64, u64, u64, u64)>,
    /// Each step's index in `spans`, in the order the steps were given.
    given: Vec<usize>,
}

impl StepGrid {
    pub(crate) fn new(steps: &[Step]) -> StepGrid {
        let mut order: Vec<usize> = (0..steps.len()).collect();
        order.sort_unstable_by_key(|&i| (steps[i].start_ns, steps[i].end_ns));
        let mut spans: Vec<(u64, u64, u64, u64)> = Vec::with_capacity(steps.len());
        let mut given = vec![0; steps.len()];
        for (k, &i) in order.iter().enumerate() {
            let (s, e) = (steps[i].start_ns, steps[i].end_ns.max(steps[i].start_ns));
            let prev_end = spans.last().map_or(0, |p| p.3);
            let start = (s / 1000).max(prev_end);
            let mut end = e.div_ceil(1000);
            if let Some(&next) = order.get(k + 1) {
                end = end.min(steps[next].start_ns / 1000);
            }
            spans.push((s, e, start, end.max(start + 1)));
            given[i] = k;
        }
        StepGrid { spans, given }
    }

    /// The whole-µs span (start, end) of the `i`th step given to [`StepGrid::new`].
    pub(crate) fn step_us(&self, i: usize) -> (u64, u64) {
        self.given.get(i).map_or((0, 0), |&k| (self.spans[k].2, self.spans[k].3))
    }

    /// Where a call that began at `start_ns` is written, in ns: inside a step, a whole µs
    /// within that step's span; outside every step, as it is.
    pub(crate) fn call_ns(&self, start_ns: u64) -> u64 {
        let i = self.spans.partition_point(|&(s, ..)| s <= start_ns);
        match i.checked_sub(1).map(|i| self.spans[i]) {
            Some((_, e, a, b)) if start_ns < e => (start_ns / 1000).clamp(a, b - 1) * 1000,
            _ => start_ns,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(n: u64, start_ns: u64, end_ns: u64) -> Step {
        Step { n, start_ns, end_ns, tid: 1 }
    }

    /// HTA's rule: start rounded up, end rounded down, `start <= call < end`.
    fn hta_contains(span: (u64, u64), call_ns: u64) -> bool {
        let call_us = call_ns.div_ceil(1000);
        span.0 <= call_us && call_us < span.1
    }

    #[test]
    fn a_call_in_the_last_microsecond_of_its_step_stays_in_it() {
        // Step 1 ends 300 ns after its last call began, in the µs step 2 begins in.
        let (s1, s2) = (step(1, 100_500, 205_900), step(2, 205_950, 300_000));
        let g = StepGrid::new(&[s1, s2]);
        let last_call = 205_600;
        let first_call = 205_990;
        assert!(hta_contains(g.step_us(0), g.call_ns(last_call)));
        assert!(!hta_contains(g.step_us(1), g.call_ns(last_call)));
        assert!(hta_contains(g.step_us(1), g.call_ns(first_call)));
        assert!(!hta_contains(g.step_us(0), g.call_ns(first_call)));
        // Steps do not overlap and a call moves by less than a microsecond.
        assert!(g.step_us(0).1 <= g.step_us(1).0);
        assert!(last_call - g.call_ns(last_call) < 2000);
    }

    #[test]
    fn every_call_of_back_to_back_steps_lands_in_its_own_step() {
        // Steps of 1–3 µs, each with calls at its first and last ns.
        let mut steps = Vec::new();
        let mut t = 1_000_000_123;
        // Given newest first: the grid orders them itself.
        for n in 1..200u64 {
            let len = 1000 + (n * 337) % 2000;
            steps.push(step(n, t, t + len));
            t += len + (n % 3) * 211;
        }
        steps.reverse();
        let g = StepGrid::new(&steps);
        for (i, s) in steps.iter().enumerate() {
            for call in [s.start_ns, s.start_ns + 1, s.end_ns - 1] {
                let span = g.step_us(i);
                assert!(hta_contains(span, g.call_ns(call)), "step {} {span:?} call {call}", s.n);
                let others = (0..steps.len()).filter(|&o| o != i && hta_contains(g.step_us(o), g.call_ns(call)));
                assert_eq!(others.count(), 0, "call {call} of step {} also in another step", s.n);
            }
        }
    }

    #[test]
    fn a_call_outside_every_step_is_written_as_it_is() {
        let g = StepGrid::new(&[step(1, 10_000, 20_000)]);
        assert_eq!(g.call_ns(5_123), 5_123);
        assert_eq!(g.call_ns(20_000), 20_000);
        assert_eq!(g.call_ns(10_456), 10_000);
    }
}
