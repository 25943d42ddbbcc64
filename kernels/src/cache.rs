//! The on-disk cache of compiled kernels.
//!
//! One file per (source, options, architecture, NVRTC version): the key hashes all four, so a
//! changed kernel, a new NVRTC or another GPU never loads a stale binary. Files are written to a
//! temporary name and renamed into place, so processes that build at once each see either no
//! file or a whole one. A file carries a magic, its length and a hash of its contents; one that
//! does not check out is ignored (and replaced by the next build). The cache is an optimisation:
//! any failure to read or write it is logged and the kernels are compiled in memory.

use siphasher::sip128::{Hasher128, SipHasher24};
use std::hash::Hasher;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

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

    /// The cached binary for `key`, if a whole, intact one is there.
    pub fn load(&self, key: &Key<'_>) -> Option<Vec<u8>> {
        let path = self.path(key);
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
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

    /// Stores `binary` for `key`: written under a name of this process's own, then renamed.
    pub fn store(&self, key: &Key<'_>, binary: &[u8]) -> std::io::Result<PathBuf> {
        static SEQ: AtomicU64 = AtomicU64::new(0);
        std::fs::create_dir_all(&self.dir)?;
        let path = self.path(key);
        let tmp = self.dir.join(format!(
            ".{}.tmp.{}.{}",
            key.file_name(),
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        let result = (|| {
            let mut f = std::fs::File::create(&tmp)?;
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
