//! What an operation moved, for the direct metrics route (`super` module docs): the primitives
//! add each slice they post or receive, as `Steps` would sum it, without reading the clock.

use occl_telemetry::prometheus::Moved;
use std::cell::Cell;

/// Steps and bytes of one operation (or one group launch) by direction: `[send, recv]`.
#[derive(Default)]
pub(crate) struct Tally {
    steps: [Cell<u64>; 2],
    bytes: [Cell<u64>; 2],
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
}
