//! Removes FIFO segments that dead processes left in /dev/shm.
//!
//! A segment is unlinked as soon as both ranks have mapped it, so only a process killed during
//! connection setup leaves one behind — but a killed 256-rank init leaves tens of thousands, and a
//! full /dev/shm starves the whole machine (every later job fails to reserve its FIFOs, unrelated
//! programs are killed for memory). Each segment's name carries its sender's pid; the first
//! communicator of a process removes the segments whose sender no longer exists.

use std::path::Path;
use std::sync::Once;
use std::time::Duration;

/// A segment younger than this is left alone even when its sender looks dead: a process in
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

/// The sender's pid of an occl FIFO segment's file name (`occl-<32 hex digits>-<pid>`,
/// `shm::segment_name`).
pub(crate) fn sender_pid(file_name: &str) -> Option<u32> {
    let (tag, pid) = file_name.strip_prefix("occl-")?.split_once('-')?;
    let hex = tag.len() == 32 && tag.bytes().all(|b| b.is_ascii_hexdigit());
    let num = !pid.is_empty() && pid.bytes().all(|b| b.is_ascii_digit());
    if !(hex && num) {
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

/// Removes the occl segments in `dir` whose sender is dead and that are at least `min_age` old;
/// returns how many. Errors (a directory that cannot be read, a file another process removed
/// first) only mean less is removed.
fn reap(dir: &Path, min_age: Duration) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else { return 0 };
    let mut removed = 0;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name.to_str().and_then(sender_pid) else { continue };
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

    const TAG: &str = "0123456789abcdef0123456789abcdef";

    #[test]
    fn names() {
        let name = crate::transport::shm::segment_name(&[1; 16], 0xaa, 3, 17, 4242);
        assert_eq!(sender_pid(&name[1..]), Some(4242), "{name}");
        assert_eq!(sender_pid(&format!("occl-{TAG}-4242")), Some(4242));
        assert_eq!(sender_pid(&format!("occl-{TAG}")), None, "a name without a pid is never ours to judge");
        assert_eq!(sender_pid("occl-deadbeef-4242"), None);
        assert_eq!(sender_pid(&format!("occl-{TAG}-42x")), None);
        assert_eq!(sender_pid(&format!("occl-{TAG}-0")), None);
        assert_eq!(sender_pid(&format!("other-{TAG}-4242")), None);
        assert_eq!(sender_pid("occl-mem-4242-7"), None);
    }

    #[test]
    fn removes_only_old_segments_of_dead_senders() {
        let dir = std::env::temp_dir().join(format!("occl-reap-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut dead = Command::new("true").spawn().unwrap();
        let dead_pid = dead.id();
        dead.wait().unwrap();
        let mut live = Command::new("sleep").arg("30").spawn().unwrap();
        let old = SystemTime::now() - Duration::from_secs(3600);
        let files = [
            (format!("occl-{TAG}-{dead_pid}"), old, false),
            (format!("occl-{}-{dead_pid}", &TAG[..31]), old, true),
            (format!("occl-{}-{dead_pid}", TAG.to_uppercase()), SystemTime::now(), true),
            (format!("occl-{TAG}-{}", live.id()), old, true),
            (format!("occl-{}-{}", TAG.replace('0', "f"), std::process::id()), old, true),
            (format!("occl-{TAG}"), old, true),
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
        assert_eq!(removed, 1);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
