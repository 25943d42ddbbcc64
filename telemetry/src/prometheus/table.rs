//! A fixed-capacity map whose lookups take no lock: an entry is created once, under a mutex, and
//! never moves or leaves until the table is dropped, so the span path finds it with one acquire
//! load per probe. Only the first sight of a key (a new series) takes the mutex.

use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::{Mutex, OnceLock, PoisonError};

/// A slot: empty, or an entry that never changes its key or moves.
type Slot<K, V> = OnceLock<Box<(K, V)>>;

pub(crate) struct Table<K, V> {
    slots: Box<[Slot<K, V>]>,
    /// The most entries; the slots are at least twice as many, so probes stay short.
    max: usize,
    len: AtomicUsize,
    create: Mutex<()>,
}

impl<K: Copy + Eq + Hash, V> Table<K, V> {
    /// A table of at most `max` entries.
    pub(crate) fn new(max: usize) -> Self {
        let n = max.saturating_mul(2).next_power_of_two().max(4);
        Table {
            slots: (0..n).map(|_| OnceLock::new()).collect(),
            max,
            len: AtomicUsize::new(0),
            create: Mutex::new(()),
        }
    }

    fn home(&self, k: &K) -> usize {
        let mut h = Fx(0);
        k.hash(&mut h);
        (h.finish() as usize) & (self.slots.len() - 1)
    }

    /// `k`'s slot and value, if it has an entry. Entries are only ever added in probe order under
    /// the mutex, so the first empty slot on the way means "absent" (or "being added", which the
    /// caller resolves under the mutex).
    fn find(&self, k: &K) -> Option<(usize, &V)> {
        let mask = self.slots.len() - 1;
        let mut i = self.home(k);
        for _ in 0..self.slots.len() {
            match self.slots[i].get() {
                Some(e) if e.0 == *k => return Some((i, &e.1)),
                Some(_) => i = (i + 1) & mask,
                None => return None,
            }
        }
        None
    }

    pub(crate) fn get(&self, k: &K) -> Option<&V> {
        self.find(k).map(|(_, v)| v)
    }

    /// `k`'s slot and value, made by `make` on first sight; `None` when the table is full.
    #[inline]
    pub(crate) fn get_or_insert_with(&self, k: K, make: impl FnOnce() -> V) -> Option<(usize, &V)> {
        match self.find(&k) {
            Some(x) => Some(x),
            None => self.insert(k, make),
        }
    }

    /// As [`Table::get_or_insert_with`], looking first in slot `hint`, where the caller found
    /// its key last: an operation's series is the previous operation's almost always, and then
    /// costs one comparison instead of hashing its labels. The caller keeps the slot returned.
    #[inline]
    pub(crate) fn get_or_insert_hinted(&self, k: K, hint: usize, make: impl FnOnce() -> V) -> Option<(usize, &V)> {
        if let Some(e) = self.slots.get(hint).and_then(OnceLock::get) {
            if e.0 == k {
                return Some((hint, &e.1));
            }
        }
        self.get_or_insert_with(k, make)
    }

    #[cold]
    fn insert(&self, k: K, make: impl FnOnce() -> V) -> Option<(usize, &V)> {
        let _g = self.create.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(x) = self.find(&k) {
            return Some(x);
        }
        if self.len.load(Relaxed) >= self.max {
            return None;
        }
        let mask = self.slots.len() - 1;
        let mut i = self.home(&k);
        while self.slots[i].get().is_some() {
            i = (i + 1) & mask;
        }
        let _ = self.slots[i].set(Box::new((k, make())));
        self.len.fetch_add(1, Relaxed);
        self.slots[i].get().map(|e| (i, &e.1))
    }

    /// The value in slot `i` (as returned by `get_or_insert_with`).
    #[inline]
    pub(crate) fn at(&self, i: usize) -> Option<&V> {
        self.slots.get(i).and_then(OnceLock::get).map(|e| &e.1)
    }

    /// Every entry, in slot order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&K, &V)> {
        self.slots.iter().filter_map(OnceLock::get).map(|e| (&e.0, &e.1))
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.len.load(Relaxed)
    }
}

/// A small multiplicative hasher (keys are a few words and short names, chosen by this process
/// or by NCCL, never by a remote peer).
struct Fx(u64);

impl Hasher for Fx {
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            let mut w = [0u8; 8];
            w.copy_from_slice(c);
            self.write_u64(u64::from_le_bytes(w));
        }
        let mut w = [0u8; 8];
        let rest = chunks.remainder();
        w[..rest.len()].copy_from_slice(rest);
        self.write_u64(u64::from_le_bytes(w) ^ (rest.len() as u64) << 59);
    }

    fn write_u64(&mut self, v: u64) {
        self.0 = (self.0.rotate_left(5) ^ v).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }

    fn finish(&self) -> u64 {
        // Fold the high bits (where the multiplication puts its entropy) into the low ones.
        self.0 ^ (self.0 >> 29)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn entries_are_found_again_and_the_bound_holds() {
        let t: Table<(u64, &'static str), u32> = Table::new(8);
        let (i, v) = t.get_or_insert_with((1, "a"), || 10).expect("room");
        assert_eq!(*v, 10);
        assert_eq!(t.get_or_insert_with((1, "a"), || 99).map(|(j, v)| (j, *v)), Some((i, 10)));
        assert_eq!(t.at(i), Some(&10));
        for n in 2..=8 {
            assert!(t.get_or_insert_with((n, "a"), || n as u32).is_some());
        }
        assert_eq!(t.len(), 8);
        assert!(t.get_or_insert_with((9, "a"), || 9).is_none(), "full");
        assert_eq!(t.get(&(5, "a")), Some(&5));
        assert_eq!(t.iter().count(), 8);
    }

    #[test]
    fn a_hint_only_speeds_up_the_lookup() {
        let t: Table<&str, u32> = Table::new(8);
        let (a, _) = t.get_or_insert_hinted("a", usize::MAX, || 1).expect("room"); // out of range
        let (b, _) = t.get_or_insert_hinted("b", a, || 2).expect("room"); // another key's slot
        assert_ne!(a, b);
        assert_eq!(t.get_or_insert_hinted("a", a, || 99).map(|(i, v)| (i, *v)), Some((a, 1)));
        assert_eq!(t.get_or_insert_hinted("a", b, || 99).map(|(i, v)| (i, *v)), Some((a, 1)));
        let empty = (0..16).find(|&i| i != a && i != b).expect("an empty slot");
        assert_eq!(t.get_or_insert_hinted("b", empty, || 99).map(|(i, v)| (i, *v)), Some((b, 2)));
        assert_eq!(t.len(), 2);
    }

    #[test]
    fn threads_racing_on_one_key_share_one_entry() {
        let t: Arc<Table<u64, std::sync::atomic::AtomicU64>> = Arc::new(Table::new(64));
        let hs: Vec<_> = (0..4)
            .map(|_| {
                let t = t.clone();
                std::thread::spawn(move || {
                    for k in 0..1000u64 {
                        if let Some((_, v)) = t.get_or_insert_with(k % 32, Default::default) {
                            v.fetch_add(1, Relaxed);
                        }
                    }
                })
            })
            .collect();
        for h in hs {
            h.join().expect("thread");
        }
        assert_eq!(t.len(), 32);
        assert_eq!(t.iter().map(|(_, v)| v.load(Relaxed)).sum::<u64>(), 4000);
    }
}
