//! A bounded append-only log that emitting threads push into without a lock: a slot index from
//! one atomic add, slots allocated in chunks on first use. Past the bound a push is refused and
//! counted (the index keeps growing, so the count is `index - bound`). Readers see every slot
//! whose push completed, at any time.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;

/// Slots per chunk: one allocation per 4096 events.
const CHUNK: usize = 4096;

/// A chunk's slots, each written once.
type Chunk<T> = Box<[OnceLock<T>]>;

pub(crate) struct Log<T> {
    chunks: Box<[OnceLock<Chunk<T>>]>,
    next: AtomicUsize,
    cap: usize,
}

impl<T> Log<T> {
    pub fn new(cap: usize) -> Log<T> {
        let chunks = (0..cap.div_ceil(CHUNK)).map(|_| OnceLock::new()).collect();
        Log { chunks, next: AtomicUsize::new(0), cap }
    }

    /// Appends `v`; `false` (and counted as dropped) when the log is full. The only wait is two
    /// threads racing to allocate the same new chunk.
    pub fn push(&self, v: T) -> bool {
        let i = self.next.fetch_add(1, Ordering::Relaxed);
        if i >= self.cap {
            return false;
        }
        let Some(chunk) = self.chunks.get(i / CHUNK) else { return false };
        let chunk = chunk.get_or_init(|| (0..CHUNK).map(|_| OnceLock::new()).collect());
        chunk.get(i % CHUNK).is_some_and(|slot| slot.set(v).is_ok())
    }

    /// Pushes refused because the log was full.
    pub fn dropped(&self) -> u64 {
        self.next.load(Ordering::Relaxed).saturating_sub(self.cap) as u64
    }

    /// The bound.
    pub fn capacity(&self) -> usize {
        self.cap
    }

    /// Every completed entry, in slot order (a push still in progress is skipped).
    pub fn iter(&self) -> impl Iterator<Item = &T> + '_ {
        let n = self.next.load(Ordering::Acquire).min(self.cap);
        (0..n).filter_map(move |i| self.chunks.get(i / CHUNK)?.get()?.get(i % CHUNK)?.get())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn bounded_counted_and_concurrent() {
        let log = Arc::new(Log::<u64>::new(CHUNK * 2 + 10));
        let threads: Vec<_> = (0..4u64)
            .map(|t| {
                let log = log.clone();
                std::thread::spawn(move || (0..3000u64).filter(|i| log.push(t * 10_000 + i)).count())
            })
            .collect();
        let kept: usize = threads.into_iter().map(|t| t.join().expect("thread")).sum();
        assert_eq!(kept, CHUNK * 2 + 10);
        assert_eq!(log.dropped(), 12_000 - kept as u64);
        let mut seen: Vec<u64> = log.iter().copied().collect();
        assert_eq!(seen.len(), kept);
        seen.sort_unstable();
        seen.dedup();
        assert_eq!(seen.len(), kept, "every entry once");
        assert_eq!(log.capacity(), kept);
    }

    #[test]
    fn empty_and_tiny() {
        let log = Log::<u8>::new(1);
        assert_eq!(log.iter().count(), 0);
        assert!(log.push(1));
        assert!(!log.push(2));
        assert_eq!((log.iter().copied().collect::<Vec<_>>(), log.dropped()), (vec![1], 1));
    }
}
