//! Host memory that same-host peer processes can map: an anonymous shared-memory file
//! (`memfd_create`) per allocation.
//!
//! A [`HostBuf`] registered with [`Comm::register`](crate::Comm::register) lets the registered
//! collectives read a peer's buffer in place (one copy instead of two through a FIFO). The file
//! has no name anywhere: a peer process reaches it as `/proc/<pid>/fd/<fd>` of its creator, which
//! the kernel opens only for a process that may inspect the creator (the same user; never another
//! one), and the memory goes when the last process holding it exits, however it exits. The
//! reference a peer gets over the authenticated bootstrap also carries the file's inode, so a
//! descriptor number reused after a buffer was freed is never mistaken for it.

use crate::dtype::Element;
use crate::error::{Error, Result};
use crate::sync::lock;
use std::sync::Mutex;

/// A shared mapping of a memory file: the creator's (with its descriptor) or a peer's.
pub(crate) struct Segment {
    ptr: *mut u8,
    len: usize,
    /// The creator's descriptor and the reference peers open the file by.
    owned: Option<(Fd, String)>,
}

// SAFETY: the mapping is plain memory; who reads and writes it when is the users' contract
// (HostBuf's borrows, or the registered collectives' sequence words).
unsafe impl Send for Segment {}
unsafe impl Sync for Segment {}

/// What identifies a memory file to a peer: `memfd:<pid>:<fd>:<dev>:<ino>`.
fn reference(fd: libc::c_int, st: &libc::stat) -> String {
    format!("memfd:{}:{fd}:{}:{}", std::process::id(), st.st_dev, st.st_ino)
}

fn fstat(fd: libc::c_int, what: &str) -> Result<libc::stat> {
    // SAFETY: fstat into a zeroed struct.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return Err(Error::last_os(format!("fstat({what})")));
    }
    Ok(st)
}

impl Segment {
    /// Creates, sizes (pages reserved now: a full /dev/shm fails here, not with SIGBUS later)
    /// and maps a new zero-filled memory file of `len` bytes.
    pub(crate) fn create(len: usize) -> Result<Segment> {
        // SAFETY: a NUL-terminated label; the file is anonymous.
        let fd = unsafe { libc::memfd_create(c"occl-hostbuf".as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(Error::last_os("memfd_create for a host buffer"));
        }
        let fd = Fd(fd);
        // SAFETY: fd is a valid memory file.
        let rc = unsafe { libc::posix_fallocate(fd.0, 0, len.max(1) as libc::off_t) };
        if rc != 0 {
            return Err(Error::sys(
                format!("reserving {len} bytes of shared memory for a host buffer (is the host or its memory cgroup out of memory?)"),
                std::io::Error::from_raw_os_error(rc),
            ));
        }
        let st = fstat(fd.0, "a host buffer")?;
        let r = reference(fd.0, &st);
        let ptr = map(fd.0, len, &r)?;
        Ok(Segment { ptr, len, owned: Some((fd, r)) })
    }

    /// Maps a peer's memory file by the `reference` it sent, which must name a process of pid
    /// `owner` and hold at least `len` bytes.
    pub(crate) fn open(reference: &str, len: usize, owner: u32) -> Result<Segment> {
        let bad = || Error::internal(format!("a peer sent {reference:?} as a host buffer reference"));
        let fields: Vec<u64> = reference
            .strip_prefix("memfd:")
            .ok_or_else(bad)?
            .split(':')
            .map(|f| f.parse().map_err(|_| bad()))
            .collect::<Result<_>>()?;
        let [pid, fd, dev, ino] = fields[..] else { return Err(bad()) };
        if pid != u64::from(owner) {
            return Err(Error::internal(format!("rank of pid {owner} sent a host buffer of pid {pid}")));
        }
        let path = std::ffi::CString::new(format!("/proc/{pid}/fd/{fd}")).map_err(|_| bad())?;
        // SAFETY: opening a NUL-terminated path. The kernel lets only a process that may
        // inspect `pid` (same user, not blocked) reopen its descriptor.
        let fd = unsafe { libc::open(path.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
        if fd < 0 {
            return Err(Error::last_os(format!(
                "opening a peer's registered host buffer through /proc/{pid}/fd (ranks that register HostBufs must run \
                 as one user in one pid namespace)"
            )));
        }
        let fd = Fd(fd);
        let st = fstat(fd.0, reference)?;
        if st.st_dev != dev || st.st_ino != ino {
            return Err(Error::internal(format!(
                "{reference}: the peer's descriptor now names another file (was the buffer freed during registration?)"
            )));
        }
        if (st.st_size as u64) < len as u64 {
            return Err(Error::internal(format!(
                "peer host buffer {reference} is {} bytes, expected {len}",
                st.st_size
            )));
        }
        Ok(Segment { ptr: map(fd.0, len, reference)?, len, owned: None })
    }

    pub(crate) fn ptr(&self) -> *mut u8 {
        self.ptr
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The reference peers open the file by, when this process created it.
    pub(crate) fn name(&self) -> Option<&str> {
        self.owned.as_ref().map(|(_, r)| r.as_str())
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
        if let Some((_, r)) = &self.owned {
            // Out of the live list before the unmap: once the range is unmapped, another thread's
            // new buffer may be mapped at the same address, and `find` must not give it this
            // buffer's reference, nor this removal take out the new buffer's entry.
            live().retain(|w| !(w.0 == self.ptr as usize && w.2 == *r));
        }
        if self.len > 0 {
            // SAFETY: unmapping the mapping this value owns.
            unsafe { libc::munmap(self.ptr.cast(), self.len) };
        }
        // The descriptor (if ours) closes after: peers that mapped the file keep its memory.
    }
}

struct Fd(libc::c_int);

impl Drop for Fd {
    fn drop(&mut self) {
        // SAFETY: closing a descriptor we own; a mapping outlives it.
        unsafe { libc::close(self.0) };
    }
}

/// This process's live host buffers: (start, length, reference), for `register` to find which
/// one a slice lies in.
fn live() -> std::sync::MutexGuard<'static, Vec<(usize, usize, String)>> {
    static LIVE: Mutex<Vec<(usize, usize, String)>> = Mutex::new(Vec::new());
    lock(&LIVE)
}

/// The host buffer holding `[addr, addr + len)`: its reference and the offset of `addr` in it.
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
    /// Allocates `len` zeroed elements in a new shared memory file.
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

    /// How a peer process of the same user opens this buffer's memory file
    /// (`memfd:<pid>:<fd>:<dev>:<ino>`); `Comm::register` sends it to the other ranks.
    pub fn reference(&self) -> &str {
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
        f.debug_struct("HostBuf").field("len", &self.n).field("reference", &self.reference()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zeroed_shared_and_nameless() {
        let mut b = HostBuf::<f32>::alloc(1000).unwrap();
        assert!(b.iter().all(|&x| x == 0.0));
        b[999] = 7.5;
        // A second mapping (what a peer process gets) sees the write.
        let peer = Segment::open(b.reference(), 4000, std::process::id()).unwrap();
        // SAFETY: 4000 bytes mapped; reading an f32 at the end.
        assert_eq!(unsafe { *peer.ptr().cast::<f32>().add(999) }, 7.5);
        assert_eq!(find(b.as_ptr() as usize + 8, 16).map(|f| f.1), Some(8));
        assert!(find(b.as_ptr() as usize + 3992, 16).is_none(), "past the end");
        let tag = b.reference().split(':').nth(4).unwrap().to_string();
        let in_shm =
            std::fs::read_dir("/dev/shm").unwrap().flatten().any(|e| e.file_name().to_string_lossy().contains(&tag));
        assert!(!in_shm, "a host buffer leaves no name in /dev/shm");
        drop(b);
        // SAFETY: the peer's mapping keeps the memory after the creator let go.
        assert_eq!(unsafe { *peer.ptr().cast::<f32>().add(999) }, 7.5);
        drop(peer);
    }

    #[test]
    fn foreign_and_stale_references_are_refused() {
        let b = HostBuf::<u8>::alloc(0).unwrap();
        assert!(b.is_empty());
        let me = std::process::id();
        assert!(Segment::open("/etc/passwd", 1, me).is_err());
        assert!(Segment::open("memfd:1:2:3", 1, 1).is_err());
        assert!(Segment::open("memfd:1:2:3:x", 1, 1).is_err());
        let c = HostBuf::<u8>::alloc(64).unwrap();
        assert!(Segment::open(c.reference(), 64, me + 1).is_err(), "the sender's pid must own the file");
        let f: Vec<&str> = c.reference().split(':').collect();
        let other_ino = format!("memfd:{}:{}:{}:{}", f[1], f[2], f[3], f[4].parse::<u64>().unwrap() + 1);
        let e = Segment::open(&other_ino, 64, me).err().unwrap();
        assert!(e.to_string().contains("another file"), "{e}");
        assert!(Segment::open(c.reference(), 65, me).is_err(), "larger than the file");
    }
}
