//! CPU sets: the kernel's list format (`0-3,8,10-11`, as in `cpulist` and `local_cpulist`) and
//! this process's affinity (`sched_getaffinity`).

use crate::error::{Error, Result};
use std::fmt;

/// Highest CPU id a list may name; bounds the bitmap a malformed or hostile file can make us
/// allocate (Linux's own `NR_CPUS` limit is 8192).
pub const MAX_CPUS: u32 = 8192;

/// A set of CPU ids, kept as a bitmap.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct CpuSet {
    words: Vec<u64>,
}

impl CpuSet {
    pub fn new() -> CpuSet {
        CpuSet::default()
    }

    /// Parses the kernel's list format. An empty (or all-blank) string is the empty set.
    pub fn parse_list(text: &str) -> Result<CpuSet> {
        let mut set = CpuSet::new();
        let text = text.trim();
        if text.is_empty() {
            return Ok(set);
        }
        for part in text.split(',') {
            let bad = || Error::arg(format!("cpu list {text:?}: {part:?} is not a cpu id or range"));
            let (lo, hi) = match part.split_once('-') {
                Some((a, b)) => {
                    (a.trim().parse::<u32>().map_err(|_| bad())?, b.trim().parse::<u32>().map_err(|_| bad())?)
                }
                None => {
                    let v = part.trim().parse::<u32>().map_err(|_| bad())?;
                    (v, v)
                }
            };
            if lo > hi || hi >= MAX_CPUS {
                return Err(Error::arg(format!(
                    "cpu list {text:?}: range {part:?} is reversed or beyond cpu {MAX_CPUS}"
                )));
            }
            for c in lo..=hi {
                set.insert(c);
            }
        }
        Ok(set)
    }

    pub fn insert(&mut self, cpu: u32) {
        let (w, b) = ((cpu / 64) as usize, cpu % 64);
        if self.words.len() <= w {
            self.words.resize(w + 1, 0);
        }
        self.words[w] |= 1 << b;
    }

    pub fn contains(&self, cpu: u32) -> bool {
        self.words.get((cpu / 64) as usize).is_some_and(|w| w & (1 << (cpu % 64)) != 0)
    }

    pub fn len(&self) -> usize {
        self.words.iter().map(|w| w.count_ones() as usize).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        self.words
            .iter()
            .enumerate()
            .flat_map(|(i, &w)| (0..64).filter(move |b| w & (1u64 << b) != 0).map(move |b| i as u32 * 64 + b))
    }

    /// True when every cpu of `self` is in `other`.
    pub fn is_subset(&self, other: &CpuSet) -> bool {
        self.words.iter().enumerate().all(|(i, &w)| w & !other.words.get(i).copied().unwrap_or(0) == 0)
    }

    /// Adds every CPU of `other`.
    pub fn union_with(&mut self, other: &CpuSet) {
        if self.words.len() < other.words.len() {
            self.words.resize(other.words.len(), 0);
        }
        for (w, &o) in self.words.iter_mut().zip(&other.words) {
            *w |= o;
        }
    }
}

/// The kernel's list format, ranges collapsed: `0-15,32-47`.
impl fmt::Display for CpuSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        let mut it = self.iter().peekable();
        while let Some(lo) = it.next() {
            let mut hi = lo;
            while it.peek() == Some(&(hi + 1)) {
                hi += 1;
                it.next();
            }
            if !first {
                f.write_str(",")?;
            }
            first = false;
            if lo == hi {
                write!(f, "{lo}")?;
            } else {
                write!(f, "{lo}-{hi}")?;
            }
        }
        Ok(())
    }
}

impl fmt::Debug for CpuSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CpuSet({self})")
    }
}

/// The CPUs this process may run on, or `None` (with a warning) when the kernel refuses.
pub fn process_affinity() -> Option<CpuSet> {
    // SAFETY: cpu_set_t is plain data; zeroed is the empty set.
    let mut raw: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: the size passed is raw's own, and the kernel writes at most that much.
    let rc = unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut raw) };
    if rc != 0 {
        tracing::warn!("occl: topo: sched_getaffinity failed: {}", std::io::Error::last_os_error());
        return None;
    }
    let mut set = CpuSet::new();
    for c in 0..(libc::CPU_SETSIZE as u32).min(MAX_CPUS) {
        // SAFETY: c is below CPU_SETSIZE, the bitmap's size.
        if unsafe { libc::CPU_ISSET(c as usize, &raw) } {
            set.insert(c);
        }
    }
    Some(set)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn list_round_trips_and_collapses_ranges() {
        let s = CpuSet::parse_list("0-3,8, 10-11,9\n").unwrap();
        assert_eq!(s.len(), 8);
        assert_eq!(s.to_string(), "0-3,8-11");
        assert!(s.contains(9) && !s.contains(4) && !s.contains(5000));
        assert_eq!(CpuSet::parse_list("").unwrap(), CpuSet::new());
        assert_eq!(CpuSet::parse_list("7").unwrap().to_string(), "7");
        assert_eq!(CpuSet::parse_list("63-65").unwrap().to_string(), "63-65");
    }

    #[test]
    fn malformed_lists_are_errors() {
        for bad in ["a", "1-", "3-1", "1,,2", "0-4294967295", "-1", "8192"] {
            assert!(CpuSet::parse_list(bad).is_err(), "{bad:?} parsed");
        }
    }

    #[test]
    fn subset() {
        let a = CpuSet::parse_list("1,2").unwrap();
        let b = CpuSet::parse_list("0-3").unwrap();
        assert!(a.is_subset(&b) && !b.is_subset(&a));
        assert!(CpuSet::parse_list("100").unwrap().is_subset(&CpuSet::parse_list("100").unwrap()));
        assert!(!CpuSet::parse_list("100").unwrap().is_subset(&b));
    }

    #[test]
    fn affinity_is_nonempty_here() {
        let a = process_affinity().expect("sched_getaffinity works on Linux");
        assert!(!a.is_empty());
    }
}
