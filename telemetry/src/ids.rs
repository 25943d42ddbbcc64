//! Trace and span ids, derived rather than drawn, so that no table maps events to ids:
//!
//! - a span id is a hash of (process salt, communicator hash, rank, event id): a child computes
//!   its parent's span id from the parent's event id alone, so parent links are exact even when
//!   the parent is exported in another batch;
//! - a collective's trace id is a hash of (communicator hash, function, sequence number), equal on
//!   every rank: the spans of one all-reduce on all ranks form one trace;
//! - any other tree (p2p, a tree whose Coll never arrived) gets a trace id of its own from
//!   (salt, communicator, rank, root event id).

use std::sync::OnceLock;

/// SplitMix64's finaliser: a bijection with good avalanche, enough to spread ids.
#[inline]
pub fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn fold(words: &[u64], seed: u64) -> u64 {
    words.iter().fold(mix(seed), |h, &w| mix(h ^ w).wrapping_add(0x9e37_79b9_7f4a_7c15))
}

/// FNV-1a of a name (function names are short).
fn name_hash(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}

/// This process's salt: span ids of two processes never collide, even for one communicator rank
/// created twice.
pub fn salt() -> u64 {
    static SALT: OnceLock<u64> = OnceLock::new();
    *SALT.get_or_init(|| mix(occl_events::clock::unix_nanos() ^ (u64::from(std::process::id()) << 32)))
}

/// A communicator rank within a process.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CommKey {
    pub hash: u64,
    pub rank: i32,
}

/// The span id of event `id` of communicator rank `c` (never zero).
pub fn span_id(c: CommKey, id: u64) -> [u8; 8] {
    let h = fold(&[c.hash, c.rank as u32 as u64, id], salt());
    h.max(1).to_be_bytes()
}

fn trace_of(a: u64, b: u64) -> [u8; 16] {
    let mut t = [0u8; 16];
    t[..8].copy_from_slice(&a.to_be_bytes());
    t[8..].copy_from_slice(&b.max(1).to_be_bytes());
    t
}

/// The trace of collective `func` number `seq` on communicator `comm_hash`: the same on every rank.
pub fn coll_trace(comm_hash: u64, func: &str, seq: u64) -> [u8; 16] {
    let f = name_hash(func);
    trace_of(fold(&[comm_hash, f, seq], 1), fold(&[comm_hash, f, seq], 2))
}

/// A trace of this process only, for the tree rooted at event `root`.
pub fn local_trace(c: CommKey, root: u64) -> [u8; 16] {
    let w = [c.hash, c.rank as u32 as u64, root];
    trace_of(fold(&w, salt() ^ 3), fold(&w, salt() ^ 4))
}

/// Whether event `id` is among the `threshold / 2^64` sampled (deterministic per event, so a
/// child can repeat its parent's decision).
#[inline]
pub fn sampled(id: u64, threshold: u64) -> bool {
    threshold == u64::MAX || mix(id ^ salt()) < threshold
}

/// The sampling threshold of a fraction in [0, 1].
pub fn threshold(fraction: f64) -> u64 {
    if fraction >= 1.0 {
        u64::MAX
    } else if fraction > 0.0 {
        (fraction * 18_446_744_073_709_551_616.0) as u64
    } else {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn collective_traces_agree_across_ranks_and_differ_by_operation() {
        assert_eq!(coll_trace(7, "AllReduce", 3), coll_trace(7, "AllReduce", 3));
        assert_ne!(coll_trace(7, "AllReduce", 3), coll_trace(7, "AllReduce", 4));
        assert_ne!(coll_trace(7, "AllReduce", 3), coll_trace(7, "Broadcast", 3));
        assert_ne!(coll_trace(7, "AllReduce", 3), coll_trace(8, "AllReduce", 3));
        let (a, b) = (CommKey { hash: 7, rank: 0 }, CommKey { hash: 7, rank: 1 });
        assert_ne!(span_id(a, 5), span_id(b, 5));
        assert_ne!(local_trace(a, 5), local_trace(b, 5));
        assert_ne!(span_id(a, 5), [0; 8]);
    }

    #[test]
    fn sampling_keeps_about_the_fraction() {
        let t = threshold(0.1);
        let n = (1..=100_000u64).filter(|&i| sampled(i, t)).count();
        assert!((9_000..11_000).contains(&n), "{n}");
        assert!((1..100).all(|i| sampled(i, threshold(1.0))));
        assert!((1..100).all(|i| !sampled(i, threshold(0.0))));
    }
}
