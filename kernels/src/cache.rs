//! The on-disk cache of compiled kernels.
//!
//! One file per (source, options, architecture, NVRTC version): the key hashes all four, so a
//! changed kernel, a new NVRTC or another GPU never loads a stale binary. Files are written to a
//! temporary name and renamed into place, so processes that build at once each see either no
//! file or a whole one. A file carries a magic, its length and a hash of its contents; one that
//! does not check out is ignored (and replaced by the next build). The cache is an optimisation:
//! any failure to read or write it is logged and the kernels are compiled in memory.
//!
//! A cached binary runs in the process, so the cache is used only where nobody else can plant
//! one: the directory and the file must belong to this user and be writable by nobody else, a
//! file is never read through a link, and temporaries are created new (`O_EXCL`, mode 0600) under
//! an unpredictable name.

use siphasher::sip128::{Hasher128, SipHasher24};
use std::hash::Hasher;
use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// The largest cache file read: compiled kernels are a few MiB.
const MAX_FILE: u64 = 256 << 20;

/// Why `path` may not be trusted (another user owns it, or others may write it), if so.
fn untrusted(path: &Path, meta: &std::fs::Metadata) -> Option<String> {
    // SAFETY: geteuid cannot fail.
    let me = unsafe { libc::geteuid() };
    if meta.uid() != me {
        return Some(format!("{} belongs to uid {}, not this user (uid {me})", path.display(), meta.uid()));
    }
    (meta.mode() & 0o022 != 0)
        .then(|| format!("{} is writable by others (mode {:o})", path.display(), meta.mode() & 0o7777))
}

/// A name no other process can predict.
fn random_suffix() -> String {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let mut b = [0u8; 8];
    let seeded = std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut b)).is_ok();
    let mut h = sip();
    h.write(&b);
    h.write_u64(std::process::id().into());
    h.write_u64(SEQ.fetch_add(1, Ordering::Relaxed));
    if !seeded {
        let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        h.write_u128(t.as_nanos());
    }
    format!("{:016x}", h.finish128().h1)
}

const MAGIC: &[u8; 8] = b"OCCLKC01";
const HEADER: usize = 8 + 8 + 16;

/// What a compiled binary depends on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Key<'a> {
    pub source: &'a str,
    pub options: &'a [String],
    /// `sm_XY`.
    pub arch: &'a str,
    pub nvrtc: (i32, i32),
}

fn sip() -> SipHasher24 {
    // Fixed keys: the hash names files, it must be the same in every process and release.
    SipHasher24::new_with_keys(0x6f63_636c_6b65_726e, 0x656c_7363_6163_6865)
}

impl Key<'_> {
    /// The file name: readable parts plus 128 bits of hash over everything.
    pub fn file_name(&self) -> String {
        let mut h = sip();
        for part in [self.source, self.arch] {
            h.write_usize(part.len());
            h.write(part.as_bytes());
        }
        h.write_usize(self.options.len());
        for o in self.options {
            h.write_usize(o.len());
            h.write(o.as_bytes());
        }
        h.write_i32(self.nvrtc.0);
        h.write_i32(self.nvrtc.1);
        let hash = h.finish128().as_u128();
        format!("occl-kernels-{}-nvrtc{}.{}-{hash:032x}.cubin", self.arch, self.nvrtc.0, self.nvrtc.1)
    }
}

fn payload_hash(b: &[u8]) -> u128 {
    let mut h = sip();
    h.write(b);
    h.finish128().as_u128()
}

/// The cache directory: `OCCL_KERNEL_CACHE_DIR`, else `$XDG_CACHE_HOME/occl/kernels`, else
/// `~/.cache/occl/kernels`; `None` when none of these is set.
pub fn default_dir() -> Option<PathBuf> {
    dir_from(|k| std::env::var_os(k))
}

fn dir_from(var: impl Fn(&str) -> Option<std::ffi::OsString>) -> Option<PathBuf> {
    let var = |k: &str| var(k).filter(|v| !v.is_empty()).map(PathBuf::from);
    var("OCCL_KERNEL_CACHE_DIR")
        .or_else(|| var("XDG_CACHE_HOME").map(|d| d.join("occl").join("kernels")))
        .or_else(|| var("HOME").map(|d| d.join(".cache").join("occl").join("kernels")))
}

/// A cache directory (which need not exist yet).
#[derive(Debug, Clone)]
pub struct Cache {
    dir: PathBuf,
}

impl Cache {
    pub fn new(dir: impl Into<PathBuf>) -> Cache {
        Cache { dir: dir.into() }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn path(&self, key: &Key<'_>) -> PathBuf {
        self.dir.join(key.file_name())
    }

    /// Why the directory may not be used, if so (a missing one is fine: `store` makes it).
    fn refused(&self) -> Option<String> {
        let meta = std::fs::metadata(&self.dir).ok()?;
        untrusted(&self.dir, &meta)
    }

    /// The cached binary for `key`, if a whole, intact one is there.
    pub fn load(&self, key: &Key<'_>) -> Option<Vec<u8>> {
        if let Some(why) = self.refused() {
            tracing::warn!(target: "occl_kernels", "not using the kernel cache: {why}; compiling in memory");
            return None;
        }
        let path = self.path(key);
        let read = || -> std::io::Result<Option<Vec<u8>>> {
            let f = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW).open(&path)?;
            let meta = f.metadata()?;
            if let Some(why) = untrusted(&path, &meta).or_else(|| (!meta.is_file()).then(|| "not a file".into())) {
                return Err(std::io::Error::other(why));
            }
            let mut b = Vec::new();
            f.take(MAX_FILE + 1).read_to_end(&mut b)?;
            Ok((b.len() as u64 <= MAX_FILE).then_some(b))
        };
        let bytes = match read() {
            Ok(Some(b)) => b,
            Ok(None) => {
                tracing::warn!(target: "occl_kernels", path = %path.display(), "ignoring a kernel cache file over {MAX_FILE} bytes");
                return None;
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
            Err(e) => {
                tracing::warn!(target: "occl_kernels", path = %path.display(), "cannot read the kernel cache: {e}");
                return None;
            }
        };
        match decode(&bytes) {
            Some(p) => Some(p.to_vec()),
            None => {
                tracing::warn!(target: "occl_kernels", path = %path.display(), "ignoring a damaged kernel cache file");
                None
            }
        }
    }

    /// Stores `binary` for `key`: written to a new file of an unpredictable name, then renamed
    /// (over a link, never through it).
    pub fn store(&self, key: &Key<'_>, binary: &[u8]) -> std::io::Result<PathBuf> {
        std::fs::create_dir_all(&self.dir)?;
        if let Some(why) = self.refused() {
            return Err(std::io::Error::other(why));
        }
        let path = self.path(key);
        let tmp = self.dir.join(format!(".{}.tmp.{}", key.file_name(), random_suffix()));
        let result = (|| {
            let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&tmp)?;
            f.write_all(&encode(binary))?;
            f.sync_all()?;
            std::fs::rename(&tmp, &path)
        })();
        if result.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        result.map(|()| path)
    }
}

pub(crate) fn encode(payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER + payload.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    out.extend_from_slice(&payload_hash(payload).to_le_bytes());
    out.extend_from_slice(payload);
    out
}

/// The payload of a cache file, if its magic, length and hash all check out.
pub(crate) fn decode(file: &[u8]) -> Option<&[u8]> {
    let (head, payload) = file.split_at_checked(HEADER)?;
    let (magic, rest) = head.split_at(8);
    let (len, hash) = rest.split_at(8);
    let len = u64::from_le_bytes(len.try_into().ok()?);
    let hash = u128::from_le_bytes(hash.try_into().ok()?);
    (magic == MAGIC && len == payload.len() as u64 && hash == payload_hash(payload)).then_some(payload)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key<'a>(src: &'a str, opts: &'a [String], arch: &'a str, v: (i32, i32)) -> Key<'a> {
        Key { source: src, options: opts, arch, nvrtc: v }
    }

    #[test]
    fn the_key_changes_with_each_input() {
        let o = vec!["--fmad=false".to_string()];
        let o2 = vec!["--fmad=true".to_string()];
        let base = key("src", &o, "sm_90", (13, 0)).file_name();
        assert!(base.starts_with("occl-kernels-sm_90-nvrtc13.0-"), "{base}");
        assert_eq!(base, key("src", &o, "sm_90", (13, 0)).file_name(), "stable");
        for other in [
            key("src2", &o, "sm_90", (13, 0)),
            key("src", &o2, "sm_90", (13, 0)),
            key("src", &o, "sm_80", (13, 0)),
            key("src", &o, "sm_90", (13, 1)),
            key("src", &[], "sm_90", (13, 0)),
        ] {
            assert_ne!(base, other.file_name(), "{other:?}");
        }
        // Length prefixes keep parts from running into each other.
        let ab = vec!["a".to_string(), "b".to_string()];
        let a_b = vec!["ab".to_string()];
        assert_ne!(key("s", &ab, "sm_90", (1, 0)).file_name(), key("s", &a_b, "sm_90", (1, 0)).file_name());
    }

    #[test]
    fn the_directory_follows_the_environment() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| pairs.iter().find(|p| p.0 == k).map(|p| std::ffi::OsString::from(p.1))
        };
        const ALL: [(&str, &str); 3] =
            [("OCCL_KERNEL_CACHE_DIR", "/x"), ("XDG_CACHE_HOME", "/xdg"), ("HOME", "/home/u")];
        assert_eq!(dir_from(env(&ALL)), Some(PathBuf::from("/x")));
        assert_eq!(dir_from(env(&ALL[1..])), Some(PathBuf::from("/xdg/occl/kernels")));
        assert_eq!(dir_from(env(&ALL[2..])), Some(PathBuf::from("/home/u/.cache/occl/kernels")));
        assert_eq!(
            dir_from(env(&[("OCCL_KERNEL_CACHE_DIR", ""), ("HOME", "/h")])),
            Some(PathBuf::from("/h/.cache/occl/kernels"))
        );
        assert_eq!(dir_from(env(&[])), None);
    }

    /// A cache others can write is never used, a link in it is never followed, and a stored
    /// file is this user's alone.
    #[test]
    fn only_a_private_cache_is_trusted() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("occl-kcache-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        let (o, victim) = (vec![], dir.join("victim"));
        let k = key("src", &o, "sm_90", (13, 0));
        let c = Cache::new(&dir);
        let stored = c.store(&k, b"cubin").unwrap();
        assert_eq!(std::fs::metadata(&stored).unwrap().mode() & 0o777, 0o600);
        assert_eq!(c.load(&k).as_deref(), Some(&b"cubin"[..]));
        // A planted link at the final name: read through, never; replaced by the next store.
        std::fs::write(&victim, encode(b"planted")).unwrap();
        std::fs::remove_file(&stored).unwrap();
        std::os::unix::fs::symlink(&victim, &stored).unwrap();
        assert_eq!(c.load(&k), None, "read through a link");
        c.store(&k, b"cubin2").unwrap();
        assert_eq!(std::fs::read(&victim).unwrap(), encode(b"planted"), "wrote through a link");
        assert_eq!(c.load(&k).as_deref(), Some(&b"cubin2"[..]));
        // A file others may write, and a directory others may write.
        std::fs::set_permissions(&stored, std::fs::Permissions::from_mode(0o666)).unwrap();
        assert_eq!(c.load(&k), None, "a file others may write");
        std::fs::set_permissions(&stored, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        assert_eq!(c.load(&k), None, "a directory others may write");
        assert!(c.store(&k, b"x").is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn damaged_files_are_rejected() {
        let payload = b"\x7fELF cubin bytes".to_vec();
        let good = encode(&payload);
        assert_eq!(decode(&good), Some(&payload[..]));
        assert_eq!(decode(&good[..good.len() - 1]), None, "truncated");
        assert_eq!(decode(&good[..10]), None, "shorter than the header");
        let mut flipped = good.clone();
        let last = flipped.len() - 1;
        flipped[last] ^= 1;
        assert_eq!(decode(&flipped), None, "a flipped payload bit");
        let mut magic = good.clone();
        magic[0] = b'X';
        assert_eq!(decode(&magic), None, "another magic");
        assert_eq!(decode(&encode(&[])), Some(&[][..]));
    }
}
