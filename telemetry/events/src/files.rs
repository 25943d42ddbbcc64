//! Files occl writes into, and reads from, paths that the user or the system names.
//!
//! A dump directory may be shared (`/tmp`) and another user may plant names in it: a symlink at
//! the name occl is about to open would make occl, possibly root, write wherever it points. So
//! [`write_atomic`] creates its file new (`O_CREAT|O_EXCL`), never through a symlink
//! (`O_NOFOLLOW`), readable by its owner only (0600), under a temporary name with a random part,
//! and renames it into place: `rename(2)` replaces a symlink at the final name instead of
//! following it, and readers never see half a file.
//!
//! A path read from configuration may be anything (`/dev/zero`, a FIFO, a huge file):
//! [`read_capped`] reads at most a given size and says so when the file is larger.

use std::collections::hash_map::RandomState;
use std::fs::{self, File, OpenOptions};
use std::hash::{BuildHasher, Hasher};
use std::io::{self, Read};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// The cap for a configuration file (`OCCL_TUNER_FILE` and the like): far above any real one.
pub const MAX_CONFIG_FILE: u64 = 1 << 20;
/// The cap for a small system file (`/proc`, `/sys`): a few lines at most.
pub const MAX_SYSTEM_FILE: u64 = 64 << 10;

/// Names tried before giving up when someone keeps taking the temporary name.
const TRIES: usize = 16;

/// 64 unpredictable bits: std's `RandomState` is keyed from the OS's random source once per
/// thread and moves on for every instance, so a watcher of the directory cannot guess the next
/// name (which `O_EXCL` already makes harmless; the random part also keeps it from being a
/// denial of service).
fn random_u64() -> u64 {
    static SERIAL: AtomicU64 = AtomicU64::new(0);
    let mut h = RandomState::new().build_hasher();
    h.write_u64(SERIAL.fetch_add(1, Relaxed));
    h.write_u32(std::process::id());
    h.finish()
}

/// Creates `path` as a new file, open for writing: fails if anything (a file, a symlink, even a
/// dangling one) is already there. Mode 0600, close-on-exec.
pub fn create_new(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
}

/// Writes `path` from `fill`: into a new temporary file in the same directory (which must
/// exist), synced, then renamed over `path`. On any failure the temporary file is removed and
/// the error names `path`.
pub fn write_atomic(path: &Path, fill: impl FnOnce(&mut File) -> io::Result<()>) -> io::Result<PathBuf> {
    let named = |e: io::Error| io::Error::new(e.kind(), format!("{}: {e}", path.display()));
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let name = path.file_name().ok_or_else(|| named(io::Error::from(io::ErrorKind::InvalidInput)))?;
    let (tmp, mut f) = {
        let mut tries = 0;
        loop {
            let tmp = dir.join(format!(".{}.{:016x}.tmp", name.to_string_lossy(), random_u64()));
            match create_new(&tmp) {
                Ok(f) => break (tmp, f),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists && tries + 1 < TRIES => tries += 1,
                Err(e) => return Err(named(e)),
            }
        }
    };
    let res = fill(&mut f).and_then(|()| f.sync_all()).and_then(|()| fs::rename(&tmp, path));
    if let Err(e) = res {
        let _ = fs::remove_file(&tmp);
        return Err(named(e));
    }
    Ok(path.to_path_buf())
}

/// Reads `path`, at most `max` bytes: a larger file (or an endless one such as `/dev/zero`) is
/// an `InvalidData` error that says the limit. Opened non-blocking, so a FIFO with no writer
/// reads as empty instead of hanging.
pub fn read_capped(path: &Path, max: u64) -> io::Result<Vec<u8>> {
    let f = OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC).open(path)?;
    let mut buf = Vec::new();
    f.take(max.saturating_add(1)).read_to_end(&mut buf)?;
    if buf.len() as u64 > max {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("larger than {} (the most occl reads from this file)", human(max)),
        ));
    }
    Ok(buf)
}

/// [`read_capped`] as UTF-8 text.
pub fn read_to_string_capped(path: &Path, max: u64) -> io::Result<String> {
    String::from_utf8(read_capped(path, max)?).map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "not UTF-8 text"))
}

fn human(n: u64) -> String {
    match n {
        n if n >= 1 << 20 && n.is_multiple_of(1 << 20) => format!("{} MiB", n >> 20),
        n if n >= 1 << 10 && n.is_multiple_of(1 << 10) => format!("{} KiB", n >> 10),
        n => format!("{n} bytes"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::unix::fs::{symlink, MetadataExt, PermissionsExt};

    fn scratch(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("occl-files-{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(&d).expect("scratch dir");
        d
    }

    #[test]
    fn write_atomic_replaces_a_symlink_at_the_final_name_and_leaves_its_target_alone() {
        let dir = scratch("final");
        let victim = dir.join("victim");
        fs::write(&victim, b"precious").expect("victim");
        let path = dir.join("dump.json");
        symlink(&victim, &path).expect("plant link");
        write_atomic(&path, |f| f.write_all(b"{}")).expect("write");
        assert_eq!(fs::read(&victim).expect("victim"), b"precious");
        let meta = fs::symlink_metadata(&path).expect("dump");
        assert!(meta.file_type().is_file(), "the link was replaced by the file");
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        assert_eq!(fs::read(&path).expect("dump"), b"{}");
        // Only the victim and the dump: no temporary file left behind.
        assert_eq!(fs::read_dir(&dir).expect("dir").count(), 2);
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn create_new_refuses_symlinks_and_existing_files() {
        let dir = scratch("new");
        let victim = dir.join("victim");
        fs::write(&victim, b"precious").expect("victim");
        let link = dir.join("link");
        symlink(&victim, &link).expect("plant link");
        assert!(create_new(&link).is_err(), "followed a symlink");
        symlink(dir.join("nowhere"), dir.join("dangling")).expect("plant dangling link");
        assert!(create_new(&dir.join("dangling")).is_err(), "created through a dangling symlink");
        assert!(!dir.join("nowhere").exists());
        assert_eq!(create_new(&victim).expect_err("exists").kind(), io::ErrorKind::AlreadyExists);
        assert_eq!(fs::read(&victim).expect("victim"), b"precious");
        let f = create_new(&dir.join("fresh")).expect("fresh");
        assert_eq!(f.metadata().expect("meta").mode() & 0o777, 0o600);
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_failed_fill_removes_the_temporary_and_names_the_path() {
        let dir = scratch("fail");
        let e = write_atomic(&dir.join("x.json"), |_| Err(io::Error::other("no space"))).expect_err("fill failed");
        assert!(e.to_string().contains("x.json") && e.to_string().contains("no space"), "{e}");
        assert_eq!(fs::read_dir(&dir).expect("dir").count(), 0);
        let e = write_atomic(&dir.join("missing").join("x.json"), |_| Ok(())).expect_err("no such dir");
        assert!(e.to_string().contains("missing"), "{e}");
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn reads_are_capped() {
        let dir = scratch("read");
        let p = dir.join("small");
        fs::write(&p, b"a = 1\n").expect("write");
        assert_eq!(read_to_string_capped(&p, 6).expect("fits"), "a = 1\n");
        let e = read_to_string_capped(&p, 5).expect_err("too big");
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        let e = read_capped(Path::new("/dev/zero"), MAX_CONFIG_FILE).expect_err("endless");
        assert!(e.to_string().contains("larger than 1 MiB"), "{e}");
        let _ = fs::remove_dir_all(&dir);
    }
}
