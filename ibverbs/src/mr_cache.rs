//! A memory-registration cache. Registering memory with the NIC pins pages and costs tens of
//! microseconds or more, so a buffer used by many operations is registered once. Entries are
//! page-aligned address ranges; a request that overlaps or touches cached ranges replaces them
//! with one registration of the union (so a growing buffer converges on one entry), and the
//! least recently used entries are deregistered beyond a capacity.
//!
//! The cache is generic over a `Registrar` so that its logic is tested with a fake; the ib
//! transport plugs in `ibv_reg_mr`/`ibv_dereg_mr` with `Arc<Mr>` handles, so that a registration
//! evicted or merged away while a work request still uses it is deregistered only when that
//! request lets go of its clone.

use std::collections::BTreeMap;

/// Registers and deregisters address ranges (`ibv_reg_mr` / `ibv_dereg_mr` in the transport).
pub trait Registrar {
    /// Cloned out to callers: with `Arc<Mr>`, an evicted registration lives until the last
    /// work request that uses it has dropped its clone.
    type Handle: Clone;
    type Error;
    /// Registers `[addr, addr + len)`; both are page-aligned.
    fn register(&mut self, addr: usize, len: usize) -> Result<Self::Handle, Self::Error>;
    fn deregister(&mut self, handle: Self::Handle);
}

struct Entry<H> {
    end: usize,
    handle: H,
    last_use: u64,
}

/// The cache. Keys are range starts; ranges never overlap.
pub struct MrCache<R: Registrar> {
    reg: R,
    page: usize,
    capacity: usize,
    entries: BTreeMap<usize, Entry<R::Handle>>,
    clock: u64,
}

/// What `get` found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lookup<H> {
    pub handle: H,
    /// The registered range that covers the request.
    pub start: usize,
    pub end: usize,
    /// Whether the range was already registered.
    pub hit: bool,
}

impl<R: Registrar> MrCache<R> {
    /// `page` must be a power of two; `capacity` ≥ 1 entries.
    pub fn new(reg: R, page: usize, capacity: usize) -> MrCache<R> {
        let page = if page.is_power_of_two() { page } else { 4096 };
        MrCache { reg, page, capacity: capacity.max(1), entries: BTreeMap::new(), clock: 0 }
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn registrar(&self) -> &R {
        &self.reg
    }

    fn align(&self, addr: usize, len: usize) -> (usize, usize) {
        let start = addr & !(self.page - 1);
        let end = addr.saturating_add(len.max(1)).saturating_add(self.page - 1) & !(self.page - 1);
        (start, end)
    }

    /// Starts of the entries that overlap or touch `[start, end)`.
    fn neighbours(&self, start: usize, end: usize) -> Vec<usize> {
        // An entry starting before `start` can reach into the range; at most one does.
        let before = self.entries.range(..start).next_back().filter(|(_, e)| e.end >= start).map(|(s, _)| *s);
        before.into_iter().chain(self.entries.range(start..=end).map(|(s, _)| *s)).collect()
    }

    /// The registration covering `[addr, addr + len)`, registering (and merging) on a miss. On a
    /// registration error the merged entries are gone and nothing new is cached.
    pub fn get(&mut self, addr: usize, len: usize) -> Result<Lookup<R::Handle>, R::Error> {
        self.clock += 1;
        let clock = self.clock;
        let (start, end) = self.align(addr, len);
        if let Some((s, e)) = self.entries.range_mut(..=start).next_back() {
            if e.end >= end {
                e.last_use = clock;
                return Ok(Lookup { handle: e.handle.clone(), start: *s, end: e.end, hit: true });
            }
        }
        let (mut lo, mut hi) = (start, end);
        for s in self.neighbours(start, end) {
            if let Some(e) = self.entries.remove(&s) {
                lo = lo.min(s);
                hi = hi.max(e.end);
                self.reg.deregister(e.handle);
            }
        }
        let handle = self.reg.register(lo, hi - lo)?;
        // Room first, so the new entry (the most recent) is never the one evicted.
        self.evict_to(self.capacity - 1);
        self.entries.insert(lo, Entry { end: hi, handle: handle.clone(), last_use: clock });
        Ok(Lookup { handle, start: lo, end: hi, hit: false })
    }

    /// Deregisters the least recently used entries until at most `keep` are left.
    fn evict_to(&mut self, keep: usize) {
        while self.entries.len() > keep {
            let victim = self.entries.iter().min_by_key(|(_, e)| e.last_use).map(|(s, _)| *s);
            match victim.and_then(|s| self.entries.remove(&s)) {
                Some(e) => self.reg.deregister(e.handle),
                None => break,
            }
        }
    }

    /// Forgets every registration that overlaps `[addr, addr + len)` (memory being freed).
    /// Returns how many were deregistered.
    pub fn invalidate(&mut self, addr: usize, len: usize) -> usize {
        let (start, end) = self.align(addr, len);
        let mut n = 0;
        for s in self.neighbours(start, end) {
            // Touching is not overlapping: keep an entry that ends exactly at `start` or starts at `end`.
            let overlaps = self.entries.get(&s).is_some_and(|e| s < end && e.end > start);
            if overlaps {
                if let Some(e) = self.entries.remove(&s) {
                    self.reg.deregister(e.handle);
                    n += 1;
                }
            }
        }
        n
    }
}

impl<R: Registrar> Drop for MrCache<R> {
    fn drop(&mut self) {
        for (_, e) in std::mem::take(&mut self.entries) {
            self.reg.deregister(e.handle);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;
    use std::rc::Rc;

    /// Counts calls and remembers which ranges are registered; fails on request.
    #[derive(Default)]
    struct Log {
        registered: Vec<(usize, usize)>,
        live: Vec<(usize, usize)>,
        deregistered: usize,
        fail_next: bool,
    }

    #[derive(Clone, Default)]
    struct Fake(Rc<RefCell<Log>>);

    impl Registrar for Fake {
        type Handle = (usize, usize);
        type Error = String;
        fn register(&mut self, addr: usize, len: usize) -> Result<(usize, usize), String> {
            let mut l = self.0.borrow_mut();
            assert_eq!(addr % 4096, 0, "unaligned start");
            assert_eq!(len % 4096, 0, "unaligned length");
            if std::mem::take(&mut l.fail_next) {
                return Err("ENOMEM".into());
            }
            l.registered.push((addr, len));
            l.live.push((addr, addr + len));
            Ok((addr, addr + len))
        }
        fn deregister(&mut self, h: (usize, usize)) {
            let mut l = self.0.borrow_mut();
            let i = l.live.iter().position(|r| *r == h).expect("deregistered a range that is not live");
            l.live.remove(i);
            l.deregistered += 1;
        }
    }

    const P: usize = 4096;

    fn cache(cap: usize) -> (MrCache<Fake>, Rc<RefCell<Log>>) {
        let f = Fake::default();
        let log = f.0.clone();
        (MrCache::new(f, P, cap), log)
    }

    #[test]
    fn a_range_is_registered_once_and_page_aligned() {
        let (mut c, log) = cache(8);
        let l = c.get(10 * P + 100, 50).expect("register");
        assert_eq!((l.start, l.end, l.hit), (10 * P, 11 * P, false));
        // Any sub-range of the registered pages hits.
        assert!(c.get(10 * P, P).expect("hit").hit);
        assert!(c.get(10 * P + 4000, 96).expect("hit").hit);
        assert_eq!(log.borrow().registered, vec![(10 * P, P)]);
        // One byte past the page is a miss that grows the entry.
        let l = c.get(10 * P + 4000, 97).expect("grow");
        assert_eq!((l.start, l.end, l.hit), (10 * P, 12 * P, false));
        assert_eq!(c.len(), 1);
    }

    #[test]
    fn overlapping_and_adjacent_ranges_merge() {
        let (mut c, log) = cache(8);
        c.get(0, P).expect("a");
        c.get(4 * P, P).expect("b");
        c.get(8 * P, 2 * P).expect("c");
        assert_eq!(c.len(), 3);
        // Spans a's end to c's start: a, b and c merge into one registration.
        let l = c.get(P - 1, 7 * P + 2).expect("merge");
        assert_eq!((l.start, l.end), (0, 10 * P));
        assert_eq!(c.len(), 1);
        assert_eq!(log.borrow().live, vec![(0, 10 * P)]);
        assert_eq!(log.borrow().deregistered, 3);
        // Touching (adjacent) also merges, so a buffer registered piecewise becomes one entry.
        let l = c.get(10 * P, P).expect("adjacent");
        assert_eq!((l.start, l.end), (0, 11 * P));
        assert_eq!(c.len(), 1);
    }

    #[test]
    fn least_recently_used_entry_is_evicted() {
        let (mut c, log) = cache(2);
        c.get(0, P).expect("a");
        c.get(10 * P, P).expect("b");
        assert!(c.get(0, P).expect("a again").hit, "a is now newer than b");
        c.get(20 * P, P).expect("c");
        assert_eq!(c.len(), 2);
        assert_eq!(log.borrow().live, vec![(0, P), (20 * P, 21 * P)], "b was evicted");
        assert!(!c.get(10 * P, P).expect("b again").hit);
        let mut live = log.borrow().live.clone();
        live.sort();
        assert_eq!(live, vec![(10 * P, 11 * P), (20 * P, 21 * P)], "then a");
    }

    #[test]
    fn invalidate_drops_overlapping_entries_only() {
        let (mut c, log) = cache(8);
        c.get(0, P).expect("a");
        c.get(2 * P, 2 * P).expect("b");
        c.get(6 * P, P).expect("c");
        assert_eq!(c.invalidate(3 * P, 10), 1, "only b overlaps");
        assert_eq!(log.borrow().live, vec![(0, P), (6 * P, 7 * P)]);
        assert_eq!(c.invalidate(P, P), 0, "a ends where the range starts");
        drop(c);
        assert!(log.borrow().live.is_empty(), "drop deregisters everything");
    }

    #[test]
    fn a_failed_registration_caches_nothing() {
        let (mut c, log) = cache(8);
        c.get(0, P).expect("a");
        log.borrow_mut().fail_next = true;
        assert_eq!(c.get(P / 2, 2 * P).expect_err("fails"), "ENOMEM");
        assert!(c.is_empty(), "a was merged away before the failure");
        assert!(log.borrow().live.is_empty());
        assert!(!c.get(0, P).expect("retry").hit);
    }
}
