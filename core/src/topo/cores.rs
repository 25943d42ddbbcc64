//! How many cores the ranks of one host have between them, which decides whether they
//! oversubscribe it (shm waits then yield instead of spinning, and the tuner prices the shared
//! links). Each rank alone cannot tell: ranks pinned one per core (`taskset`, `mpirun
//! --bind-to core`, Slurm's `--cpu-bind`) each see a single CPU. So every rank publishes its
//! affinity set at init, and the host's ranks count the union, bounded by a cgroup CPU quota
//! where one is below the affinity set (what `available_parallelism` also reads).

use super::cpuset::{process_affinity, CpuSet};

/// This process's share of the host: its affinity set (empty when the kernel refused) and the
/// CPU quota below it, 0 for none.
pub(crate) fn this_process() -> (CpuSet, u32) {
    let set = process_affinity().unwrap_or_default();
    let usable = std::thread::available_parallelism().map_or(1, |n| n.get());
    let cap = if !set.is_empty() && usable < set.len() { u32::try_from(usable).unwrap_or(u32::MAX) } else { 0 };
    (set, cap)
}

/// The cores that ranks with these (affinity set, quota) shares can run on together: the size
/// of the union of their sets, at most the largest quota among them. A rank whose set is empty
/// (unknown) counts as one core of its own.
pub(crate) fn shared_cores<'a>(ranks: impl IntoIterator<Item = (&'a CpuSet, u32)>) -> usize {
    let (mut union, mut unknown, mut cap) = (CpuSet::new(), 0usize, 0u32);
    for (set, quota) in ranks {
        if set.is_empty() {
            unknown += 1;
        } else {
            union.union_with(set);
        }
        cap = cap.max(quota);
    }
    let cores = union.len() + unknown;
    if cap > 0 { cores.min(cap as usize) } else { cores }.max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(list: &str) -> CpuSet {
        CpuSet::parse_list(list).expect("a cpu list")
    }

    #[test]
    fn ranks_pinned_one_per_core_have_a_core_each() {
        let (a, b, c, d) = (set("0"), set("1"), set("2"), set("3"));
        assert_eq!(shared_cores([(&a, 0), (&b, 0), (&c, 0), (&d, 0)]), 4);
        // Pinned to the same core: one between them.
        assert_eq!(shared_cores([(&a, 0), (&a, 0)]), 1);
        // Unpinned on an 8-core host: 8, however many ranks.
        let all = set("0-7");
        assert_eq!(shared_cores([(&all, 0), (&all, 0), (&all, 0)]), 8);
        // Overlapping sets count each core once.
        assert_eq!(shared_cores([(&set("0-3"), 0), (&set("2-5"), 0)]), 6);
    }

    #[test]
    fn a_quota_below_the_sets_bounds_them_and_unknown_sets_count_one_each() {
        let all = set("0-63");
        // A container of 64 visible CPUs limited to 2 by its cgroup quota.
        assert_eq!(shared_cores([(&all, 2), (&all, 2), (&all, 2), (&all, 2)]), 2);
        let empty = CpuSet::new();
        assert_eq!(shared_cores([(&empty, 0), (&empty, 0)]), 2);
        assert_eq!(shared_cores([(&set("4"), 0), (&empty, 0)]), 2);
        assert_eq!(shared_cores(std::iter::empty()), 1);
    }

    #[test]
    fn this_process_reports_its_own_affinity() {
        let (set, cap) = this_process();
        let usable = std::thread::available_parallelism().map_or(1, |n| n.get());
        assert!(!set.is_empty(), "sched_getaffinity works here");
        assert_eq!(shared_cores([(&set, cap)]), usable, "one rank alone counts what the standard library does");
    }
}
