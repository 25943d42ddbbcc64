//! What a bridge holds between an event's start and its stop (an OpenTelemetry span, a `tracing`
//! span), by communicator rank and event id: the bridges' one open-span table.

use crate::spans::CommMeta;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

/// An event of one communicator rank of this process (the communicator's address is unique
/// while it lives).
pub type Key = (usize, u64);

pub fn key(comm: &Arc<CommMeta>, id: u64) -> Key {
    (Arc::as_ptr(comm) as usize, id)
}

/// Values held per open event, under one mutex (held for a map operation only).
pub struct Held<T> {
    map: Mutex<HashMap<Key, T>>,
}

impl<T> Default for Held<T> {
    fn default() -> Self {
        Held { map: Mutex::new(HashMap::new()) }
    }
}

impl<T> Held<T> {
    fn lock(&self) -> MutexGuard<'_, HashMap<Key, T>> {
        self.map.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub fn insert(&self, k: Key, v: T) {
        self.lock().insert(k, v);
    }

    pub fn remove(&self, k: Key) -> Option<T> {
        self.lock().remove(&k)
    }

    /// `f` of the value held for `k`, if any.
    pub fn with<R>(&self, k: Key, f: impl FnOnce(&T) -> R) -> Option<R> {
        self.lock().get(&k).map(f)
    }

    /// Values held now.
    pub fn count(&self) -> usize {
        self.lock().len()
    }

    /// Everything still held for `comm` (a communicator destroyed mid-operation), taken out.
    pub fn take_comm(&self, comm: &Arc<CommMeta>) -> Vec<T> {
        let me = Arc::as_ptr(comm) as usize;
        let mut m = self.lock();
        let keys: Vec<Key> = m.keys().filter(|k| k.0 == me).copied().collect();
        keys.into_iter().filter_map(|k| m.remove(&k)).collect()
    }
}
