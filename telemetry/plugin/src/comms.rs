//! The communicators the plugin serves, and the values it gives NCCL for them.
//!
//! NCCL's `stopEvent` and `recordEventState` get only the event handle, not the context, so a
//! handle must name its communicator. Both are integers, never pointers to our memory: an event
//! handle is `key << SEQ_BITS | seq` (an occl [`EventId`]: `seq` counts from 1 per
//! communicator), a context is `key << SEQ_BITS`. `key` is a slot of the table below with a
//! generation, so a value from a finalized communicator, another process (PXN passes foreign
//! `context` and `parentObj`, reference §10) or plain garbage finds no communicator, or one whose
//! sink does not know the id, and is dropped; nothing NCCL hands back is ever dereferenced.
//!
//! The table is read on every event (a shared lock, no allocation) and written only at `init`
//! and `finalize`; a sink is called under the read lock, so once `remove` returns no event
//! reaches it.

use crate::inflight::InFlight;
use occl_telemetry::nccl::ApiVersion;
use occl_telemetry::{EventId, EventMask, Sink};
use std::num::NonZeroU64;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, PoisonError, RwLock, RwLockReadGuard};

/// Bits of a handle below the communicator key: 2^40 events per communicator before the
/// sequence wraps (over a day at ten million events a second).
pub const SEQ_BITS: u32 = 40;
const SEQ_MASK: u64 = (1 << SEQ_BITS) - 1;
/// Slot bits of a key; 8 more bits are the slot's generation.
const SLOT_BITS: u32 = 16;
/// Communicators served at once.
pub const MAX_COMMS: usize = 1 << SLOT_BITS;

/// One communicator: its sink and the counter its handles come from.
pub struct Comm {
    key: u64,
    pub version: ApiVersion,
    pub sink: Arc<dyn Sink>,
    /// What the sink wants, in the version's types (asked once, at init).
    pub interest: EventMask,
    /// NCCL's communicator hash and this rank (v1–v3 give neither: 0).
    pub hash: u64,
    pub rank: i32,
    /// Its operations in flight.
    pub flight: InFlight,
    next: AtomicU64,
}

impl Comm {
    /// A fresh event id (the handle NCCL gets).
    pub fn issue(&self) -> EventId {
        loop {
            let seq = self.next.fetch_add(1, Relaxed) & SEQ_MASK;
            // Skipped after a wrap: seq 0 is the context's own value.
            if let Some(id) = NonZeroU64::new(self.key << SEQ_BITS | seq).filter(|_| seq != 0) {
                return EventId(id);
            }
        }
    }

    /// `h` as an event id of this communicator, if it could be one.
    pub fn own(&self, h: usize) -> Option<EventId> {
        let h = h as u64;
        (h >> SEQ_BITS == self.key && h & SEQ_MASK != 0).then(|| NonZeroU64::new(h).map(EventId)).flatten()
    }

    /// The value NCCL keeps as `context`.
    pub fn context(&self) -> usize {
        (self.key << SEQ_BITS) as usize
    }
}

struct Slot {
    generation: u8,
    comm: Option<Arc<Comm>>,
}

static TABLE: RwLock<Vec<Slot>> = RwLock::new(Vec::new());

fn read() -> RwLockReadGuard<'static, Vec<Slot>> {
    TABLE.read().unwrap_or_else(PoisonError::into_inner)
}

/// The communicator a context or handle names, if it is live.
fn lookup(table: &[Slot], value: usize) -> Option<&Comm> {
    let key = value as u64 >> SEQ_BITS;
    let (slot, generation) = ((key >> 8) as usize, key as u8);
    let s = table.get(slot)?;
    s.comm.as_deref().filter(|_| s.generation == generation)
}

/// Registers a communicator; `None` when [`MAX_COMMS`] are live.
pub fn add(version: ApiVersion, sink: Arc<dyn Sink>, interest: EventMask, hash: u64, rank: i32) -> Option<Arc<Comm>> {
    let mut t = TABLE.write().unwrap_or_else(PoisonError::into_inner);
    let slot = match t.iter().position(|s| s.comm.is_none()) {
        Some(i) => i,
        None if t.len() < MAX_COMMS => {
            t.push(Slot { generation: 0, comm: None });
            t.len() - 1
        }
        None => return None,
    };
    let s = &mut t[slot];
    // Never 0, so a key (and a context) is never 0 either.
    s.generation = s.generation.wrapping_add(1).max(1);
    let key = (slot as u64) << 8 | u64::from(s.generation);
    let comm = Arc::new(Comm {
        key,
        version,
        sink,
        interest,
        hash,
        rank,
        flight: InFlight::default(),
        next: AtomicU64::new(1),
    });
    s.comm = Some(comm.clone());
    Some(comm)
}

/// Runs `f` on the live communicator that `value` (a context or a handle) names.
#[inline]
pub fn with<R>(value: usize, f: impl FnOnce(&Comm) -> R) -> Option<R> {
    if value == 0 {
        return None;
    }
    let t = read();
    lookup(&t, value).map(f)
}

/// Runs `f` on the live communicator whose context is `context` (not a handle).
#[inline]
pub fn with_context<R>(context: usize, f: impl FnOnce(&Comm) -> R) -> Option<R> {
    if context as u64 & SEQ_MASK != 0 {
        return None;
    }
    with(context, f)
}

/// Unregisters the communicator of `context`; no event reaches its sink afterwards.
pub fn remove(context: usize) -> Option<Arc<Comm>> {
    if context as u64 & SEQ_MASK != 0 {
        return None;
    }
    let mut t = TABLE.write().unwrap_or_else(PoisonError::into_inner);
    lookup(&t, context)?;
    let slot = (context as u64 >> SEQ_BITS >> 8) as usize;
    t.get_mut(slot)?.comm.take()
}

/// The OR of every live communicator's interest: the one process-wide mask NCCL reads.
pub fn interest() -> EventMask {
    read().iter().filter_map(|s| s.comm.as_ref()).fold(EventMask::NONE, |m, c| m | c.interest)
}

/// Runs `f` on every live communicator.
pub fn each(mut f: impl FnMut(&Comm)) {
    for c in read().iter().filter_map(|s| s.comm.as_deref()) {
        f(c);
    }
}

/// Live communicators per API version, newest first (versions without any omitted).
pub fn census() -> Vec<(ApiVersion, usize)> {
    let t = read();
    ApiVersion::NEWEST_FIRST
        .into_iter()
        .map(|v| (v, t.iter().filter_map(|s| s.comm.as_ref()).filter(|c| c.version == v).count()))
        .filter(|(_, n)| *n > 0)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Quiet;
    impl Sink for Quiet {
        fn interest(&self) -> EventMask {
            EventMask(2)
        }
    }

    #[test]
    fn handles_name_their_communicator_and_nothing_else() {
        let a = add(ApiVersion::V5, Arc::new(Quiet), EventMask(2), 1, 0).expect("room");
        let b = add(ApiVersion::V5, Arc::new(Quiet), EventMask(4), 1, 1).expect("room");
        assert_ne!(a.context(), 0);
        let (ha, hb) = (a.issue(), b.issue());
        assert_ne!(ha, hb);
        assert_eq!(a.own(ha.get() as usize), Some(ha));
        assert_eq!(a.own(hb.get() as usize), None, "another communicator's handle");
        assert_eq!(a.own(a.context()), None, "a context is not a handle");
        assert_eq!(with(ha.get() as usize, |c| c.context()), Some(a.context()));
        assert_eq!(with(b.context(), |c| c.context()), Some(b.context()));
        assert_eq!(with(0xdead_beef, |c| c.context()), None);
        assert!(interest().contains(occl_telemetry::EventType::P2p));

        let (ctx, stale) = (a.context(), a.issue());
        assert!(remove(stale.get() as usize).is_none(), "a handle is not a context");
        assert!(remove(ctx).is_some());
        assert!(remove(ctx).is_none());
        assert_eq!(with(stale.get() as usize, |_| ()), None, "finalized");
        // The slot is reused with a new generation: old values still find nothing.
        let c = add(ApiVersion::V4, Arc::new(Quiet), EventMask(1), 2, 0).expect("room");
        assert_ne!(c.context(), ctx);
        assert_eq!(with(stale.get() as usize, |_| ()), None);
        assert!(remove(b.context()).is_some() && remove(c.context()).is_some());
    }
}
