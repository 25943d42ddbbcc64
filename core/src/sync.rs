//! Locks taken whatever happened to their last holder.

use std::sync::{Mutex, MutexGuard, PoisonError};

/// Locks `m`, taking the data of a lock whose holder panicked as it is. No lock in occl guards
/// an invariant that a panic could leave half made, and the paths that must still run after
/// one (a communicator's abort, a destroy, the watcher) must not fail on it.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}
