//! The shm transport: one POSIX shared-memory segment per ordered pair of ranks on a host,
//! holding the FIFO from sender to receiver. The sender creates it, both map it, and it is
//! unlinked as soon as both have (so a crash leaves nothing behind in /dev/shm).

use super::fifo::{self, Region};
use crate::error::{Error, Result};
use std::ffi::CString;

pub(crate) fn segment_name(comm_id: u64, from: usize, to: usize) -> String {
    format!("/occl-{comm_id:016x}-{from}-{to}")
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

/// Maps a segment that the peer created for a FIFO this rank receives from.
pub(crate) fn open(name: &str, nslots: usize, slot_size: usize) -> Result<Region> {
    let c = cname(name)?;
    // SAFETY: as above.
    let fd = unsafe { libc::shm_open(c.as_ptr(), libc::O_RDWR, 0) };
    if fd < 0 {
        return Err(Error::last_os(format!("shm_open({name}) to map a peer's FIFO")));
    }
    let fd = Fd(fd);
    // SAFETY: fstat into a zeroed struct.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    if unsafe { libc::fstat(fd.0, &mut st) } != 0 {
        return Err(Error::last_os(format!("fstat({name})")));
    }
    let len = fifo::region_size(nslots, slot_size);
    if (st.st_size as usize) < len {
        return Err(Error::internal(format!(
            "shared-memory FIFO {name} is {} bytes, expected {len}; do all ranks use the same OCCL_FIFO_SLOTS and OCCL_SHM_SLOT_SIZE?",
            st.st_size
        )));
    }
    let region = Region::map(fd.0, len)?;
    region.check(nslots, slot_size)?;
    Ok(region)
}

pub(crate) fn unlink(name: &str) {
    if let Ok(c) = CString::new(name) {
        // SAFETY: unlinking by name; failure (already gone) is fine.
        unsafe { libc::shm_unlink(c.as_ptr()) };
    }
}
