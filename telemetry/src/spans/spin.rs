//! The lock of one open event's entry: taken by that event's own start, state and stop (which
//! its emitter already orders) and, rarely, by a child that starts while its trace root's entry
//! has been evicted, so it is practically never contended. `std::sync::Mutex` pays two atomic
//! read-modify-writes per use (its unlock swaps, to find sleepers); this one pays one, and its
//! unlock is a store. A waiter spins briefly, then yields.
#![allow(unsafe_code)] // the lock itself: an UnsafeCell handed out only to the holder

use std::cell::UnsafeCell;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicBool, Ordering::*};

pub(super) struct SpinLock<T> {
    locked: AtomicBool,
    value: UnsafeCell<T>,
}

// SAFETY: the value is reached only through a `Guard`, and one guard exists at a time (the
// `locked` flag, taken with Acquire and released with Release), as with `Mutex<T>`.
unsafe impl<T: Send> Sync for SpinLock<T> {}

pub(super) struct Guard<'a, T> {
    lock: &'a SpinLock<T>,
}

impl<T> SpinLock<T> {
    pub fn new(value: T) -> Self {
        SpinLock { locked: AtomicBool::new(false), value: UnsafeCell::new(value) }
    }

    #[inline]
    pub fn lock(&self) -> Guard<'_, T> {
        if self.locked.compare_exchange_weak(false, true, Acquire, Relaxed).is_err() {
            self.lock_contended();
        }
        Guard { lock: self }
    }

    #[cold]
    fn lock_contended(&self) {
        let mut spins = 0u32;
        loop {
            while self.locked.load(Relaxed) {
                spins += 1;
                if spins < 128 {
                    std::hint::spin_loop();
                } else {
                    // The holder was preempted (exporters run under the lock).
                    std::thread::yield_now();
                }
            }
            if self.locked.compare_exchange_weak(false, true, Acquire, Relaxed).is_ok() {
                return;
            }
        }
    }
}

impl<T> Deref for Guard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: this guard is the only one (see `Sync` above) until it is dropped.
        unsafe { &*self.lock.value.get() }
    }
}

impl<T> DerefMut for Guard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: as in `deref`, and `&mut self` makes this the only reference through the guard.
        unsafe { &mut *self.lock.value.get() }
    }
}

impl<T> Drop for Guard<'_, T> {
    fn drop(&mut self) {
        self.lock.locked.store(false, Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn excludes_across_threads() {
        let l = Arc::new(SpinLock::new(0u64));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let l = l.clone();
                std::thread::spawn(move || {
                    for _ in 0..50_000 {
                        // A read-modify-write split in two: any overlap loses increments.
                        let mut g = l.lock();
                        let v = *g;
                        std::hint::black_box(&v);
                        *g = v + 1;
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().expect("locking thread");
        }
        assert_eq!(*l.lock(), 200_000);
    }
}
