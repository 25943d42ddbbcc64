//! The two events that bracket each copy-engine call that is not captured, both on its
//! caller's stream: the start, which the call's lanes wait for (the fork), and the end, after
//! the joins, which the next call's lanes wait for (the order of calls, `streams.rs`). The
//! watcher looks at both to catch a call that stalls (`calls.rs`); when a sink wants the call's
//! device times the pair is timed, and its stamps become the call's CeColl events
//! (`spans.rs`). So a call records two events on its caller's stream, whoever reads them.
//!
//! A pair is taken again, oldest first, once its call's end has been seen complete and nothing
//! holds it: the spans hold it until they have read its times, the streams until the next call
//! waits for its end. The watcher holds none: it keeps the number of the call it watches
//! ([`Pair::call`]), and a pair taken for a later call tells it that its call ended. Nothing
//! here blocks.

use crate::cuda::kernels::cudarc::driver::CudaContext;
use crate::cuda::kernels::staging::Mark;
use crate::cuda::kernels::stamps::Stamp;
use crate::cuda::kernels::Result;
use std::sync::atomic::{fence, AtomicU64, Ordering::Acquire, Ordering::SeqCst};
use std::sync::Arc;

/// Pairs of each kind in flight at most; a call beyond them gets a pair of the other kind or
/// none.
const MAX_PAIRS: usize = 256;

enum Ends {
    Plain(Mark, Mark),
    Timed(Stamp, Stamp),
}

/// One call's start and end events.
pub(crate) struct Pair {
    ends: Ends,
    /// The call the pair brackets now, counted per pair from 1 as it is taken.
    call: AtomicU64,
    /// The last call whose end someone saw complete.
    ended: AtomicU64,
}

impl Pair {
    fn new(ctx: &Arc<CudaContext>, timed: bool) -> Result<Pair> {
        let ends = if timed {
            Ends::Timed(Stamp::new(ctx)?, Stamp::new(ctx)?)
        } else {
            Ends::Plain(Mark::new(ctx)?, Mark::new(ctx)?)
        };
        Ok(Pair { ends, call: AtomicU64::new(0), ended: AtomicU64::new(0) })
    }

    pub(crate) fn start(&self) -> &Mark {
        match &self.ends {
            Ends::Plain(s, _) => s,
            Ends::Timed(s, _) => s.mark(),
        }
    }

    pub(crate) fn end(&self) -> &Mark {
        match &self.ends {
            Ends::Plain(_, e) => e,
            Ends::Timed(_, e) => e.mark(),
        }
    }

    /// The start and end as timed stamps, for a timed pair.
    pub(crate) fn stamps(&self) -> Option<(&Stamp, &Stamp)> {
        match &self.ends {
            Ends::Plain(..) => None,
            Ends::Timed(s, e) => Some((s, e)),
        }
    }

    /// The call the pair brackets now.
    pub(crate) fn call(&self) -> u64 {
        self.call.load(SeqCst)
    }

    /// Whether call `n` of this pair has ended: its end is complete, or the pair was taken for a
    /// later call (which happens only after the end was seen complete). An end that cannot be
    /// queried (a failed context) counts as complete.
    pub(crate) fn has_ended(&self, n: u64) -> bool {
        if self.call() != n || self.ended.load(SeqCst) >= n {
            return true;
        }
        let done = query(self.end());
        // Taken again during the query: the answer may be the later call's, and n has ended.
        if self.call() != n {
            return true;
        }
        if done {
            self.ended.fetch_max(n, SeqCst);
        }
        done
    }

    /// Whether call `n` of this pair has started (its start is complete), as in
    /// [`Pair::has_ended`].
    pub(crate) fn has_started(&self, n: u64) -> bool {
        query(self.start()) || self.call() != n
    }
}

fn query(m: &Mark) -> bool {
    m.done().unwrap_or_else(|e| {
        tracing::debug!("occl: a copy-engine call's event: {e}; taken as complete");
        true
    })
}

/// What [`Ring`] needs of a pair.
pub(super) trait Reusable {
    /// Whether the call it brackets now has ended.
    fn idle(&self) -> bool;
    /// Takes it for the next call.
    fn begin(&self);
}

impl Reusable for Pair {
    fn idle(&self) -> bool {
        self.has_ended(self.call())
    }

    fn begin(&self) {
        self.call.fetch_add(1, SeqCst);
    }
}

/// Pairs of one kind, taken in turn: `all[next]` is the one taken longest ago. Calls end in the
/// order they are enqueued (`streams.rs`), so when that one is busy the others are too, and a
/// new pair goes in before it, as the newest.
pub(super) struct Ring<P> {
    all: Vec<Arc<P>>,
    next: usize,
    cap: usize,
}

impl<P: Reusable> Ring<P> {
    pub(super) fn new(cap: usize) -> Ring<P> {
        Ring { all: Vec::new(), next: 0, cap }
    }

    /// A pair for the next call, made with `make` when the oldest is busy: `None` when `cap`
    /// are busy.
    pub(super) fn take<E>(&mut self, make: impl FnOnce() -> Result<P, E>) -> Result<Option<Arc<P>>, E> {
        // Held by nobody else and its call ended. Only `take` clones from `all`, so a pair
        // seen unheld stays so.
        if let Some(p) = self.all.get(self.next).filter(|p| Arc::strong_count(p) == 1 && p.idle()) {
            // The last holder's release of its clone happens before the pair is recorded again.
            fence(Acquire);
            p.begin();
            let p = p.clone();
            self.next = (self.next + 1) % self.all.len();
            return Ok(Some(p));
        }
        if self.all.len() >= self.cap {
            return Ok(None);
        }
        let p = Arc::new(make()?);
        p.begin();
        self.all.insert(self.next, p.clone());
        self.next = (self.next + 1) % self.all.len();
        Ok(Some(p))
    }
}

/// A communicator's pairs: timed ones for calls a sink wants times of, plain ones for the rest.
pub(super) struct Pairs {
    ctx: Arc<CudaContext>,
    plain: Ring<Pair>,
    timed: Ring<Pair>,
}

impl Pairs {
    pub(super) fn new(ctx: &Arc<CudaContext>) -> Pairs {
        Pairs { ctx: ctx.clone(), plain: Ring::new(MAX_PAIRS), timed: Ring::new(MAX_PAIRS) }
    }

    /// A pair for the next call, timed if `timed` and one is free (else plain); `None` when
    /// every pair it could have is in flight.
    pub(super) fn take(&mut self, timed: bool) -> Result<Option<Arc<Pair>>> {
        let ctx = &self.ctx;
        if timed {
            if let Some(p) = self.timed.take(|| Pair::new(ctx, true))? {
                return Ok(Some(p));
            }
        }
        self.plain.take(|| Pair::new(ctx, false))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;

    #[derive(Default)]
    struct Fake {
        id: usize,
        running: AtomicBool,
    }

    impl Reusable for Fake {
        fn idle(&self) -> bool {
            !self.running.load(SeqCst)
        }
        fn begin(&self) {
            assert!(self.idle(), "pair {} taken while its call runs", self.id);
            self.running.store(true, SeqCst);
        }
    }

    fn take(r: &mut Ring<Fake>, made: &mut usize) -> Option<Arc<Fake>> {
        r.take(|| {
            *made += 1;
            Ok::<_, ()>(Fake { id: *made, running: AtomicBool::new(false) })
        })
        .unwrap()
    }

    #[test]
    fn a_pair_is_reused_only_once_its_call_ended_and_nobody_holds_it() {
        let mut r = Ring::new(4);
        let mut made = 0;
        let a = take(&mut r, &mut made).unwrap();
        let b = take(&mut r, &mut made).unwrap();
        assert_eq!((a.id, b.id, made), (1, 2, 2), "the oldest is running: a new pair");
        a.running.store(false, SeqCst);
        let held = a.clone();
        drop(a);
        let c = take(&mut r, &mut made).unwrap();
        assert_eq!(c.id, 3, "a pair still held (the spans', or the last call's) is not taken");
        drop(held);
        let d = take(&mut r, &mut made).unwrap();
        assert_eq!(d.id, 1, "ended and unheld: taken again");
        drop(d);
        b.running.store(false, SeqCst);
        drop(b);
        let e = take(&mut r, &mut made).unwrap();
        assert_eq!(e.id, 2, "then the next oldest");
    }

    #[test]
    fn new_pairs_go_in_as_the_newest_and_the_cap_holds() {
        let mut r = Ring::new(3);
        let mut made = 0;
        let held: Vec<_> = (0..3).map(|_| take(&mut r, &mut made).unwrap()).collect();
        assert!(take(&mut r, &mut made).is_none(), "every pair in flight at the cap");
        assert_eq!(made, 3);
        for p in &held {
            p.running.store(false, SeqCst);
        }
        drop(held);
        let order: Vec<usize> = (0..3)
            .map(|_| {
                let p = take(&mut r, &mut made).unwrap();
                p.running.store(false, SeqCst);
                p.id
            })
            .collect();
        assert_eq!(order, [1, 2, 3], "taken again in the order they were first taken");
        assert_eq!(made, 3);
    }

    #[test]
    fn a_pair_that_cannot_be_made_fails_the_take_and_leaves_the_ring() {
        let mut r: Ring<Fake> = Ring::new(2);
        assert_eq!(r.take(|| Err("no event")).err(), Some("no event"));
        let mut made = 0;
        assert_eq!(take(&mut r, &mut made).unwrap().id, 1);
    }
}
