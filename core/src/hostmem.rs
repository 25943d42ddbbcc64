//! Host memory that same-host peer processes can map: a file in /dev/shm per allocation.
//!
//! A [`HostBuf`] registered with [`Comm::register`](crate::Comm::register) lets the registered
//! collectives read a peer's buffer in place (one copy instead of two through a FIFO). The file is
//! named `occl-mem-<pid>-<n>` (created O_EXCL, never reused by this process) so that `shm_reap`
//! can remove what a killed process left behind; it is unlinked and unmapped on drop.

use crate::dtype::Element;
use crate::error::{Error, Result};
use std::ffi::CString;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// The name (with its leading '/') of this process's `n`-th host buffer.
fn name_for(n: u64) -> String {
    format!("/occl-mem-{}-{n}", std::process::id())
}

fn cname(name: &str) -> Result<CString> {
    CString::new(name).map_err(|_| Error::arg(format!("shm name {name:?} contains a NUL")))
}

/// A shared mapping of a /dev/shm file: the creator's (unlinked on drop) or a peer's.
pub(crate) struct Segment {
    ptr: *mut u8,
    len: usize,
    /// The name, when this process created the file and must unlink it.
    owned: Option<String>,
}

// SAFETY: the mapping is plain memory; who reads and writes it when is the users' contract
// (HostBuf's borrows, or the registered collectives' sequence words).
unsafe impl Send for Segment {}
unsafe impl Sync for Segment {}

impl Segment {
    /// Creates, sizes (pages reserved now: a full /dev/shm fails here, not with SIGBUS later)
    /// and maps a new zero-filled file of `len` bytes.
    pub(crate) fn create(len: usize) -> Result<Segment> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let name = name_for(NEXT.fetch_add(1, Ordering::Relaxed));
        let c = cname(&name)?;
        // SAFETY: plain syscalls on a NUL-terminated name; O_EXCL never reuses a stale file.
        let fd = unsafe { libc::shm_open(c.as_ptr(), libc::O_CREAT | libc::O_EXCL | libc::O_RDWR, 0o600) };
        if fd < 0 {
            return Err(Error::last_os(format!("shm_open({name}) for a host buffer")));
        }
        let fd = Fd(fd);
        let unlink = || {
            // SAFETY: unlinking our own name.
            unsafe { libc::shm_unlink(c.as_ptr()) };
        };
        // SAFETY: fd is a valid shm descriptor.
        let rc = unsafe { libc::posix_fallocate(fd.0, 0, len.max(1) as libc::off_t) };
        if rc != 0 {
            unlink();
            return Err(Error::sys(
                format!("reserving {len} bytes of /dev/shm for host buffer {name} (is /dev/shm full or too small?)"),
                std::io::Error::from_raw_os_error(rc),
            ));
        }
        match map(fd.0, len, &name) {
            Ok(ptr) => Ok(Segment { ptr, len, owned: Some(name) }),
            Err(e) => {
                unlink();
                Err(e)
            }
        }
    }

    /// Maps a peer's file `name`, which must hold at least `len` bytes.
    pub(crate) fn open(name: &str, len: usize) -> Result<Segment> {
        if !name.starts_with("/occl-mem-") || name[1..].contains('/') {
            return Err(Error::internal(format!("a peer sent {name:?} as a host buffer name")));
        }
        let c = cname(name)?;
        // SAFETY: as in `create`.
        let fd = unsafe { libc::shm_open(c.as_ptr(), libc::O_RDWR, 0) };
        if fd < 0 {
            return Err(Error::last_os(format!("shm_open({name}) to map a peer's registered buffer")));
        }
        let fd = Fd(fd);
        // SAFETY: fstat into a zeroed struct.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        if unsafe { libc::fstat(fd.0, &mut st) } != 0 {
            return Err(Error::last_os(format!("fstat({name})")));
        }
        if (st.st_size as u64) < len as u64 {
            return Err(Error::internal(format!("peer host buffer {name} is {} bytes, expected {len}", st.st_size)));
        }
        Ok(Segment { ptr: map(fd.0, len, name)?, len, owned: None })
    }

    pub(crate) fn ptr(&self) -> *mut u8 {
        self.ptr
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The file's name, when this process created it.
    pub(crate) fn name(&self) -> Option<&str> {
        self.owned.as_deref()
    }
}

fn map(fd: libc::c_int, len: usize, name: &str) -> Result<*mut u8> {
    if len == 0 {
        return Ok(std::ptr::NonNull::<u64>::dangling().as_ptr().cast());
    }
    // SAFETY: mapping `len` bytes of a file at least that long.
    let p =
        unsafe { libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, fd, 0) };
    if p == libc::MAP_FAILED {
        return Err(Error::last_os(format!("mmap {len} bytes of {name}")));
    }
    Ok(p.cast())
}

impl Drop for Segment {
    fn drop(&mut self) {
        if let Some(name) = &self.owned {
            // Out of the live list before the unmap: once the range is unmapped, another thread's
            // new buffer may be mapped at the same address, and `find` must not give it this
            // (unlinked) file's name, nor this removal take out the new buffer's entry.
            live().retain(|w| !(w.0 == self.ptr as usize && w.2 == *name));
        }
        if self.len > 0 {
            // SAFETY: unmapping the mapping this value owns.
            unsafe { libc::munmap(self.ptr.cast(), self.len) };
        }
        if let Some(name) = &self.owned {
            if let Ok(c) = CString::new(name.as_str()) {
                // SAFETY: unlinking our own name; already gone is fine.
                unsafe { libc::shm_unlink(c.as_ptr()) };
            }
        }
    }
}

struct Fd(libc::c_int);

impl Drop for Fd {
    fn drop(&mut self) {
        // SAFETY: closing a descriptor we own; a mapping outlives it.
        unsafe { libc::close(self.0) };
    }
}

/// This process's live host buffers: (start, length, name), for `register` to find which one
/// a slice lies in.
fn live() -> std::sync::MutexGuard<'static, Vec<(usize, usize, String)>> {
    static LIVE: Mutex<Vec<(usize, usize, String)>> = Mutex::new(Vec::new());
    LIVE.lock().unwrap_or_else(|p| p.into_inner())
}

/// The host buffer holding `[addr, addr + len)`: its file name and the offset of `addr` in it.
pub(crate) fn find(addr: usize, len: usize) -> Option<(String, usize)> {
    live()
        .iter()
        .find(|(start, l, _)| addr >= *start && addr.checked_add(len).is_some_and(|end| end <= start + l))
        .map(|(start, _, name)| (name.clone(), addr - start))
}

/// `len` elements of host memory, zero-filled, that same-host peer processes can map.
/// Dereferences to `[T]`; pass it (or a sub-slice) to `Comm::register` and the collectives.
pub struct HostBuf<T: Element> {
    seg: Segment,
    n: usize,
    _t: std::marker::PhantomData<T>,
}

impl<T: Element> HostBuf<T> {
    /// Allocates `len` zeroed elements in a new /dev/shm file.
    pub fn alloc(len: usize) -> Result<HostBuf<T>> {
        let bytes = len
            .checked_mul(std::mem::size_of::<T>())
            .filter(|b| *b <= isize::MAX as usize)
            .ok_or_else(|| Error::arg(format!("HostBuf::alloc: {len} elements overflow the address space")))?;
        let seg = Segment::create(bytes)?;
        if let Some(name) = seg.name() {
            live().push((seg.ptr() as usize, bytes, name.to_string()));
        }
        Ok(HostBuf { seg, n: len, _t: std::marker::PhantomData })
    }

    /// The /dev/shm file's name (with its leading '/').
    pub fn file_name(&self) -> &str {
        self.seg.name().unwrap_or("")
    }
}

impl<T: Element> std::ops::Deref for HostBuf<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        // SAFETY: the mapping holds `n` zero-initialised (valid for every Element) T, aligned
        // to a page, and lives as long as self.
        unsafe { std::slice::from_raw_parts(self.seg.ptr().cast::<T>(), self.n) }
    }
}

impl<T: Element> std::ops::DerefMut for HostBuf<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        // SAFETY: as above, and &mut self is the only borrow of this process's view.
        unsafe { std::slice::from_raw_parts_mut(self.seg.ptr().cast::<T>(), self.n) }
    }
}

impl<T: Element> std::fmt::Debug for HostBuf<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostBuf").field("len", &self.n).field("file", &self.file_name()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn zeroed_shared_and_removed_on_drop() {
        let mut b = HostBuf::<f32>::alloc(1000).unwrap();
        assert!(b.iter().all(|&x| x == 0.0));
        let file = Path::new("/dev/shm").join(&b.file_name()[1..]);
        assert!(file.exists(), "{file:?}");
        b[999] = 7.5;
        // A second mapping (what a peer process gets) sees the write.
        let peer = Segment::open(b.file_name(), 4000).unwrap();
        // SAFETY: 4000 bytes mapped; reading an f32 at the end.
        assert_eq!(unsafe { *peer.ptr().cast::<f32>().add(999) }, 7.5);
        assert_eq!(find(b.as_ptr() as usize + 8, 16).map(|f| f.1), Some(8));
        assert!(find(b.as_ptr() as usize + 3992, 16).is_none(), "past the end");
        drop(b);
        assert!(!file.exists(), "drop unlinks {file:?}");
        drop(peer);
    }

    #[test]
    fn empty_buffer_and_foreign_names() {
        let b = HostBuf::<u8>::alloc(0).unwrap();
        assert!(b.is_empty());
        assert!(Segment::open("/etc/passwd", 1).is_err());
        assert!(Segment::open("/occl-mem-1-x/../y", 1).is_err());
    }
}
