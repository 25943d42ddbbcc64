//! The copy-engine calls the watcher (`watch.rs`) times: each call that is not captured, by
//! the start and end events on its caller's stream (`pairs.rs`), whose completion it feeds to
//! the stall decision (`cuda/stall.rs`). A watched call holds no pair: it keeps the pair's call
//! number, and a pair taken for a later call means that call ended. Nothing here blocks but the
//! event clock's renewal, on the watcher's thread.

use super::clock::DeviceClock;
use super::pairs::Pair;
use crate::cuda::stall::{CeCall, Stalls};
use crate::cuda::watch::{Calls, Look};
use crate::sync::lock;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

/// The most calls watched at once; a call enqueued beyond them runs unwatched (logged once).
/// The watcher looks every few ms, and the host may enqueue small calls every few µs.
const MAX_WATCHED: usize = 1024;

/// A watched call's pair and the pair's call number; `None` once the tag is free.
type Slot = Option<(Weak<Pair>, u64)>;

struct Inner {
    /// By the tag the stall decision knows each call by.
    watched: Vec<Slot>,
    free: Vec<usize>,
    stalls: Stalls,
    /// Calls watched so far: the next call's `CeCall::n`.
    next: u64,
    warned: bool,
}

/// One communicator's watched copy-engine calls.
pub(crate) struct CeCalls {
    inner: Mutex<Inner>,
    /// The context's event clock, which the watcher keeps fresh while calls are timed.
    clock: Arc<DeviceClock>,
}

impl CeCalls {
    pub(crate) fn new(timeout: Duration, clock: Arc<DeviceClock>) -> CeCalls {
        let inner =
            Inner { watched: Vec::new(), free: Vec::new(), stalls: Stalls::new(timeout), next: 0, warned: false };
        CeCalls { inner: Mutex::new(inner), clock }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        lock(&self.inner)
    }

    /// Watches a call enqueued with both its events recorded in `pair` (`None`: it got no
    /// pair), as `func` moving `bytes` per rank.
    pub(super) fn watch(&self, pair: Option<&Arc<Pair>>, func: &'static str, bytes: u64) {
        let mut g = self.lock();
        let tag = match pair.map(|_| g.free.pop()) {
            Some(Some(t)) => Some(t),
            Some(None) if g.watched.len() < MAX_WATCHED => {
                g.watched.push(None);
                Some(g.watched.len() - 1)
            }
            _ => None,
        };
        let (Some(p), Some(tag)) = (pair, tag) else {
            if !std::mem::replace(&mut g.warned, true) {
                tracing::warn!(
                    "occl: too many copy-engine calls in flight: later ones run without a timeout until some end"
                );
            }
            return;
        };
        g.watched[tag] = Some((Arc::downgrade(p), p.call()));
        let n = g.next;
        g.next += 1;
        g.stalls.enqueued(CeCall { n, func, bytes }, tag);
    }
}

impl Calls for CeCalls {
    fn any(&self) -> bool {
        self.lock().stalls.any()
    }

    /// Looks at every watched call's events. A pair gone with its communicator counts as
    /// ended, as does an event that cannot be queried (`Pair::has_ended`). Renews the event
    /// clock's anchor first when it is due (`clock.rs`), off the callers' threads. The events
    /// are queried without the lock, which `watch` takes on the enqueue path: with hundreds of
    /// calls in flight the queries take hundreds of µs.
    fn look(&self, now: u64) -> Look {
        self.clock.renew_if_due();
        // Only this thread frees tags, so each one below still names its call afterwards.
        let looks: Vec<(u64, usize, bool, Slot)> = {
            let g = self.lock();
            g.stalls
                .pending()
                .into_iter()
                .filter_map(|(n, tag, started)| Some((n, tag, started, g.watched.get(tag)?.clone())))
                .collect()
        };
        let seen: Vec<(u64, usize, Option<bool>)> = looks
            .into_iter()
            .map(|(n, tag, started, call)| {
                let call = call.and_then(|(w, c)| Some((w.upgrade()?, c)));
                // Some(started now) while running; None once ended.
                let running = match call {
                    Some((p, c)) if !p.has_ended(c) => Some(!started && p.has_started(c)),
                    _ => None,
                };
                (n, tag, running)
            })
            .collect();
        let mut g = self.lock();
        let Inner { watched, free, stalls, .. } = &mut *g;
        for (n, tag, running) in seen {
            match running {
                Some(true) => stalls.started(n, now),
                Some(false) => {}
                None => {
                    stalls.ended(n);
                    if let Some(slot) = watched.get_mut(tag) {
                        *slot = None;
                        free.push(tag);
                    }
                }
            }
        }
        Look { live: stalls.any(), stall: stalls.poll(now) }
    }
}
