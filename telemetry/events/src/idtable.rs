//! Event id → a small value, per sink: the ids' side tables of sinks that need one.
//!
//! A value is needed for the event's own states and stop, and when a child starts (its parent's
//! plugin handle, its parent's trace root). Children can start after their parent's stop
//! (reference §10): ProxyOp and KernelCh after Coll/P2p, Coll/P2p after CollApi/P2pApi. So the
//! entry of a type that can have such late children (Group, Coll, P2p, GroupApi, CollApi, P2pApi,
//! CeColl: per operation, not per step) is kept after its stop, in a FIFO of the last
//! [`RETIRED_CAP`] stopped ones; older entries are forgotten and a child that starts later finds
//! no parent. Everything else (ProxyOp, ProxyStep, ProxyCtrl, KernelCh, NetPlugin, KernelLaunch,
//! CeSync, CeBatch: their children start while they run) is forgotten at its stop, so the
//! per-step path leaves nothing behind.
//!
//! Maps are sharded like the fan-out, so threads rarely meet on a lock; the FIFO's lock is
//! taken only at the stop of a kept event.

use crate::event::{EventId, EventType};
use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::{Mutex, MutexGuard, PoisonError};

/// Folded multiply of an event id (FxHash-like): SipHash would cost more than the event itself.
#[derive(Default)]
struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(self.0 ^ u64::from(b));
        }
    }
    fn write_u64(&mut self, n: u64) {
        let p = u128::from(n) * 0x9E37_79B9_7F4A_7C15;
        self.0 = (p as u64) ^ ((p >> 64) as u64);
    }
}

/// Stopped per-operation events whose entries stay available to late children. Roughly the last
/// thousand operations (about four kept events each); in-flight proxy work is far shorter.
pub const RETIRED_CAP: usize = 4096;

const SHARDS: usize = 16;

type Map<V> = HashMap<u64, V, BuildHasherDefault<IdHasher>>;

#[repr(align(64))]
struct Shard<V>(Mutex<Map<V>>);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Nothing panics while holding these locks but HashMap internals; the data stays usable.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A sharded map keyed by event id. Ids must be unique for the map's life (one fan-out issues
/// them, never reusing one).
pub struct IdMap<V> {
    shards: [Shard<V>; SHARDS],
}

impl<V> Default for IdMap<V> {
    fn default() -> Self {
        IdMap { shards: std::array::from_fn(|_| Shard(Mutex::new(Map::default()))) }
    }
}

impl<V> IdMap<V> {
    fn shard(&self, id: u64) -> MutexGuard<'_, Map<V>> {
        lock(&self.shards[id as usize % SHARDS].0)
    }

    pub fn insert(&self, id: EventId, v: V) {
        self.shard(id.get()).insert(id.get(), v);
    }

    /// Runs `f` on the entry of `id`, if there is one, under its shard's lock.
    pub fn with<R>(&self, id: EventId, f: impl FnOnce(&mut V) -> R) -> Option<R> {
        self.shard(id.get()).get_mut(&id.get()).map(f)
    }

    /// Entries held.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.shards.iter().map(|s| lock(&s.0).len()).sum()
    }
}

#[derive(Clone, Copy)]
struct Entry<V> {
    value: V,
    keep: bool,
}

/// Whether events of type `t` may get children after their stop.
pub fn kept_after_stop(t: EventType) -> bool {
    use EventType as T;
    matches!(t, T::Group | T::Coll | T::P2p | T::GroupApi | T::CollApi | T::P2pApi | T::CeColl)
}

/// The id → value table of one sink, keeping per-operation entries a while after their stop.
pub struct IdTable<V: Copy> {
    map: IdMap<Entry<V>>,
    retired: Mutex<VecDeque<u64>>,
}

impl<V: Copy> Default for IdTable<V> {
    fn default() -> Self {
        IdTable { map: IdMap::default(), retired: Mutex::new(VecDeque::new()) }
    }
}

impl<V: Copy> IdTable<V> {
    /// Records the value of a started event.
    pub fn insert(&self, id: EventId, t: EventType, value: V) {
        self.map.insert(id, Entry { value, keep: kept_after_stop(t) });
    }

    /// The value of a started event, also of a recently stopped one of a kept type.
    pub fn get(&self, id: EventId) -> Option<V> {
        self.map.with(id, |e| e.value)
    }

    /// The value at the stop; the entry is forgotten now, or retired if its type is kept.
    pub fn stop(&self, id: EventId) -> Option<V> {
        let key = id.get();
        let entry = {
            let mut shard = self.map.shard(key);
            let e = *shard.get(&key)?;
            if !e.keep {
                shard.remove(&key);
            }
            e
        };
        if entry.keep {
            let evicted = {
                let mut r = lock(&self.retired);
                r.push_back(key);
                if r.len() > RETIRED_CAP {
                    r.pop_front()
                } else {
                    None
                }
            };
            if let Some(old) = evicted {
                self.map.shard(old).remove(&old);
            }
        }
        Some(entry.value)
    }

    /// Entries held (live events plus retired ones).
    #[cfg(test)]
    fn len(&self) -> usize {
        self.map.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::num::NonZeroU64;

    fn id(n: u64) -> EventId {
        EventId(NonZeroU64::new(n).expect("non-zero"))
    }

    #[test]
    fn per_step_entries_go_at_stop_and_per_operation_ones_stay() {
        let h = IdTable::<usize>::default();
        h.insert(id(1), EventType::Coll, 0x10);
        h.insert(id(2), EventType::ProxyOp, 0x20);
        h.insert(id(3), EventType::ProxyStep, 0);
        assert_eq!(h.get(id(3)), Some(0));
        assert_eq!(h.stop(id(3)), Some(0));
        assert_eq!(h.get(id(3)), None);
        assert_eq!(h.stop(id(1)), Some(0x10));
        // A ProxyOp starting after its Coll stopped still finds the Coll's handle.
        assert_eq!(h.get(id(1)), Some(0x10));
        assert_eq!(h.stop(id(2)), Some(0x20));
        assert_eq!(h.get(id(2)), None);
        assert_eq!(h.stop(id(2)), None);
        assert_eq!(h.len(), 1);
    }

    #[test]
    fn retired_entries_are_bounded() {
        let h = IdTable::<usize>::default();
        let n = RETIRED_CAP as u64 + 10;
        for i in 1..=n {
            h.insert(id(i), EventType::CollApi, i as usize);
            h.stop(id(i));
        }
        assert_eq!(h.len(), RETIRED_CAP);
        assert_eq!(h.get(id(1)), None);
        assert_eq!(h.get(id(10)), None);
        assert_eq!(h.get(id(11)), Some(11));
        assert_eq!(h.get(id(n)), Some(n as usize));
    }
}
