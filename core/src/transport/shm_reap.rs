//! Removes FIFO segments that dead processes left in /dev/shm.
//!
//! A segment is unlinked as soon as both ranks have mapped it, so only a process killed during
//! connection setup leaves one behind — but a killed 256-rank init leaves tens of thousands, and a
//! full /dev/shm starves the whole machine (every later job fails to reserve its FIFOs, unrelated
//! programs are killed for memory). Each segment's name carries its creator's pid; the first
//! communicator of a process removes the segments whose creator no longer exists.

use std::path::Path;
use std::sync::Once;
use std::time::Duration;

/// A segment younger than this is left alone even when its creator looks dead: a process in
/// another pid namespace that shares this /dev/shm may own it, and no setup lasts longer than the
/// default bootstrap timeout (600 s).
const MIN_AGE: Duration = Duration::from_secs(600);

/// Reaps stale segments once per process; later calls return at once.
pub(crate) fn reap_once() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let removed = reap(Path::new("/dev/shm"), MIN_AGE);
        if removed > 0 {
            tracing::info!(removed, "removed shm FIFO segments left in /dev/shm by processes that died during setup");
        }
    });
}

/// The creator's pid of an occl FIFO segment's file name (`occl-<comm>-<from>-<to>-<pid>`) or
/// of a host buffer's (`occl-mem-<pid>-<n>`, `crate::hostmem`).
pub(crate) fn creator_pid(file_name: &str) -> Option<u32> {
    if let Some(rest) = file_name.strip_prefix("occl-mem-") {
        let (pid, n) = rest.split_once('-')?;
        let num = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
        return (num(pid) && num(n)).then(|| pid.parse().ok()).flatten().filter(|&p| p > 0);
    }
    let rest = file_name.strip_prefix("occl-")?;
    let parts: Vec<&str> = rest.split('-').collect();
    let [comm, from, to, pid] = parts.as_slice() else { return None };
    let hex = comm.len() == 16 && comm.bytes().all(|b| b.is_ascii_hexdigit());
    let num = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if !(hex && num(from) && num(to) && num(pid)) {
        return None;
    }
    pid.parse().ok().filter(|&p| p > 0)
}

fn alive(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else { return false };
    // SAFETY: signal 0 only checks that the process exists and may be signalled.
    if unsafe { libc::kill(pid, 0) } == 0 {
        return true;
    }
    // EPERM: it exists but belongs to someone else.
    std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}

/// Removes the occl segments in `dir` whose creator is dead and that are at least `min_age` old;
/// returns how many. Errors (a directory that cannot be read, a file another process removed
/// first) only mean less is removed.
fn reap(dir: &Path, min_age: Duration) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else { return 0 };
    let mut removed = 0;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name.to_str().and_then(creator_pid) else { continue };
        if pid == std::process::id() || alive(pid) {
            continue;
        }
        let old = entry
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age >= min_age);
        if old && std::fs::remove_file(entry.path()).is_ok() {
            removed += 1;
        }
    }
    removed
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs::File;
    use std::process::Command;
    use std::time::SystemTime;

    #[test]
    fn names() {
        assert_eq!(creator_pid("occl-00000000deadbeef-3-17-4242"), Some(4242));
        assert_eq!(creator_pid("occl-00000000deadbeef-3-17"), None, "a name without a pid is never ours to judge");
        assert_eq!(creator_pid("occl-deadbeef-3-17-4242"), None);
        assert_eq!(creator_pid("occl-00000000deadbeef-3-x-4242"), None);
        assert_eq!(creator_pid("occl-00000000deadbeef-3-17-0"), None);
        assert_eq!(creator_pid("other-00000000deadbeef-3-17-4242"), None);
        assert_eq!(creator_pid("occl-mem-4242-7"), Some(4242));
        assert_eq!(creator_pid("occl-mem-4242"), None);
        assert_eq!(creator_pid("occl-mem-x-7"), None);
    }

    #[test]
    fn removes_only_old_segments_of_dead_creators() {
        let dir = std::env::temp_dir().join(format!("occl-reap-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut dead = Command::new("true").spawn().unwrap();
        let dead_pid = dead.id();
        dead.wait().unwrap();
        let mut live = Command::new("sleep").arg("30").spawn().unwrap();
        let old = SystemTime::now() - Duration::from_secs(3600);
        let files = [
            (format!("occl-00000000000000aa-0-1-{dead_pid}"), old, false),
            (format!("occl-00000000000000aa-0-2-{dead_pid}"), SystemTime::now(), true),
            (format!("occl-mem-{dead_pid}-3"), old, false),
            (format!("occl-00000000000000aa-1-0-{}", live.id()), old, true),
            (format!("occl-00000000000000aa-2-0-{}", std::process::id()), old, true),
            ("occl-00000000000000aa-0-1".to_string(), old, true),
            ("unrelated".to_string(), old, true),
        ];
        for (name, mtime, _) in &files {
            File::create(dir.join(name)).unwrap().set_modified(*mtime).unwrap();
        }
        let removed = reap(&dir, Duration::from_secs(600));
        let _ = live.kill();
        let _ = live.wait();
        for (name, _, kept) in &files {
            assert_eq!(dir.join(name).exists(), *kept, "{name}");
        }
        assert_eq!(removed, 2);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
