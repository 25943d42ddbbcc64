//! The shm transport: one POSIX shared-memory segment per ordered pair of ranks on a host,
//! holding the FIFO from sender to receiver. Connection is lazy (`attach`): whichever side
//! needs the pair first creates the segment, the other maps it, and the second to map it
//! unlinks the name, so a running job leaves nothing in /dev/shm. A segment whose peer never
//! came is unlinked when its peer is found dead; `shm_reap` removes what a crash left.

use super::fifo::{self, Region};
use crate::error::{Error, Result};
use std::ffi::CString;

/// The segment for the FIFO from `from` to `to`, named with its creator's pid so that a later
/// process can tell a segment whose creator died (`shm_reap`).
pub(crate) fn segment_name(comm_id: u64, from: usize, to: usize, creator_pid: u32) -> String {
    format!("/occl-{comm_id:016x}-{from}-{to}-{creator_pid}")
}

fn cname(name: &str) -> Result<CString> {
    CString::new(name).map_err(|_| Error::internal(format!("shm name {name:?} contains a NUL")))
}

struct Fd(libc::c_int);

impl Drop for Fd {
    fn drop(&mut self) {
        // SAFETY: closing a descriptor we own; the mapping keeps the memory alive.
        unsafe { libc::close(self.0) };
    }
}

/// Creates and initialises the segment for a FIFO that this rank sends into.
pub(crate) fn create(name: &str, nslots: usize, slot_size: usize, send_pid: u32, recv_pid: u32) -> Result<Region> {
    let c = cname(name)?;
    let len = fifo::region_size(nslots, slot_size);
    // SAFETY: plain syscalls on a NUL-terminated name; O_EXCL so a stale or foreign segment is
    // never reused.
    let fd = unsafe { libc::shm_open(c.as_ptr(), libc::O_CREAT | libc::O_EXCL | libc::O_RDWR, 0o600) };
    if fd < 0 {
        return Err(Error::last_os(format!("shm_open({name}) to create a FIFO")));
    }
    let fd = Fd(fd);
    // Reserve the pages now: a full /dev/shm must fail here with ENOSPC, not later with SIGBUS.
    // SAFETY: fd is a valid shm descriptor.
    let rc = unsafe { libc::posix_fallocate(fd.0, 0, len as libc::off_t) };
    if rc != 0 {
        unlink(name);
        return Err(Error::sys(
            format!("reserving {len} bytes of /dev/shm for {name} (is /dev/shm full or too small?)"),
            std::io::Error::from_raw_os_error(rc),
        ));
    }
    let region = Region::map(fd.0, len).inspect_err(|_| unlink(name))?;
    region.init(nslots, slot_size, send_pid, recv_pid);
    Ok(region)
}

/// Maps the segment `name` (the FIFO from a rank of pid `send_pid` to one of `recv_pid`),
/// creating it if the peer has not yet. No handshake: both sides compute the name, one wins the
/// O_EXCL create and the other waits (up to `timeout`) for the creator's `ready` word. The
/// second side to map it unlinks the name.
pub(crate) fn attach(
    name: &str,
    nslots: usize,
    slot_size: usize,
    send_pid: u32,
    recv_pid: u32,
    timeout: std::time::Duration,
) -> Result<Region> {
    use std::sync::atomic::Ordering;
    let deadline = std::time::Instant::now() + timeout;
    let region = loop {
        match create(name, nslots, slot_size, send_pid, recv_pid) {
            Ok(r) => return Ok(r),
            Err(Error::SystemError { source, .. }) if source.raw_os_error() == Some(libc::EEXIST) => {}
            Err(e) => return Err(e),
        }
        match open_ready(name, nslots, slot_size) {
            Ok(Some(r)) => break r,
            // The peer created it but has not sized or initialised it yet, or the name went
            // between our create and our open (a crashed setup's segment was reaped): again.
            Ok(None) if std::time::Instant::now() < deadline => std::thread::yield_now(),
            Ok(None) => {
                return Err(Error::Timeout {
                    what: format!("waiting for the peer to initialise shared-memory FIFO {name}"),
                    secs: timeout.as_secs_f64(),
                })
            }
            Err(e) => return Err(e),
        }
    };
    region.check(nslots, slot_size)?;
    if region.header().attached.fetch_add(1, Ordering::AcqRel) >= 1 {
        unlink(name);
    }
    Ok(region)
}

/// Maps `name` if it exists and its creator has finished it; `None` if not yet.
fn open_ready(name: &str, nslots: usize, slot_size: usize) -> Result<Option<Region>> {
    use std::sync::atomic::Ordering;
    let c = cname(name)?;
    // SAFETY: as above.
    let fd = unsafe { libc::shm_open(c.as_ptr(), libc::O_RDWR, 0) };
    if fd < 0 {
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::ENOENT) {
            return Ok(None);
        }
        return Err(Error::sys(format!("shm_open({name}) to map a peer's FIFO"), e));
    }
    let fd = Fd(fd);
    // SAFETY: fstat into a zeroed struct.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    if unsafe { libc::fstat(fd.0, &mut st) } != 0 {
        return Err(Error::last_os(format!("fstat({name})")));
    }
    let len = fifo::region_size(nslots, slot_size);
    if (st.st_size as usize) < len {
        if st.st_size > 0 {
            return Err(Error::internal(format!(
                "shared-memory FIFO {name} is {} bytes, expected {len}; do all ranks use the same OCCL_FIFO_SLOTS and OCCL_SHM_SLOT_SIZE?",
                st.st_size
            )));
        }
        return Ok(None);
    }
    let region = Region::map(fd.0, len)?;
    Ok((region.header().ready.0.load(Ordering::Acquire) == 1).then_some(region))
}

pub(crate) fn unlink(name: &str) {
    if let Ok(c) = CString::new(name) {
        // SAFETY: unlinking by name; failure (already gone) is fine.
        unsafe { libc::shm_unlink(c.as_ptr()) };
    }
}

/// A word at a fixed address in every occl process, for peers to test whether they may read
/// this process's memory (`process_vm_readv` needs ptrace permission and may be blocked by a
/// seccomp policy or Yama).
pub(crate) static PROBE: u64 = 0x4f43_434c_5052_4f42; // "OCCLPROB"

/// Whether this process may read `pid`'s memory: reads its `PROBE` at `addr`.
pub(crate) fn can_read(pid: u32, addr: u64) -> bool {
    let mut v = 0u64;
    read_peer(pid, addr, (&mut v as *mut u64).cast(), 8).is_ok() && v == PROBE
}

/// Copies `len` bytes from address `remote` of process `pid` to `dst` (single copy, kernel to
/// kernel, no shared staging buffer).
pub(crate) fn read_peer(pid: u32, remote: u64, dst: *mut u8, len: usize) -> std::io::Result<()> {
    let mut done = 0usize;
    while done < len {
        let local = libc::iovec { iov_base: dst.wrapping_add(done).cast(), iov_len: len - done };
        let far = libc::iovec { iov_base: (remote as usize + done) as *mut libc::c_void, iov_len: len - done };
        // SAFETY: `local` is the caller's writable range; the kernel validates `far` in the
        // other process and fails with EFAULT rather than touching anything of ours.
        let n = unsafe { libc::process_vm_readv(pid as libc::pid_t, &local, 1, &far, 1, 0) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        done += n as usize;
    }
    Ok(())
}
