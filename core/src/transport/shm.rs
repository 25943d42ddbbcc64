//! The shm transport: one POSIX shared-memory segment per ordered pair of ranks on a host,
//! holding the FIFO from sender to receiver. Connection is lazy (`attach`): whichever side
//! needs the pair first creates the segment, the other maps it, and the second to map it
//! unlinks the name, so a running job leaves nothing in /dev/shm. A segment whose peer never
//! came is unlinked when its peer is found dead or the communicator ends; `shm_reap` removes
//! what a killed process left.
//!
//! Who can open a segment: its name is a MAC of the pair under the job secret, so only the
//! job's processes can compute it and another local user can neither create it first (to feed
//! a rank forged data or read what it sends) nor find it before it exists. The creator makes
//! it O_EXCL with mode 0600, and the side that maps an existing one checks that it belongs to
//! this user and is private before it reads a byte of it.

use super::fifo::{self, Region};
use crate::error::{Error, Result};
use std::ffi::CString;
use std::time::{Duration, Instant};

/// The segment for the FIFO from `from` to `to` of communicator `comm_id`: the pair's secret
/// tag and the sender's pid (for `shm_reap` to tell a segment whose sender died).
pub(crate) fn segment_name(secret: &[u8; 16], comm_id: u64, from: usize, to: usize, sender_pid: u32) -> String {
    let tag = crate::auth::secret_tag(secret, b"occl shm fifo", &[comm_id, from as u64, to as u64, sender_pid as u64]);
    format!("/occl-{tag}-{sender_pid}")
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

/// How often a side waiting for its peer to finish a segment checks that the peer still lives.
const LIVENESS_CHECK: Duration = Duration::from_millis(20);

/// Maps the segment `name` (the FIFO from a rank of pid `send_pid` to one of `recv_pid`),
/// creating it if the peer has not yet. No handshake: both sides compute the name, one wins the
/// O_EXCL create and the other waits (up to `timeout`) for the creator's `ready` word. The
/// second side to map it unlinks the name. `peer` (rank, pid) is the other side: if it dies
/// before it finished the segment, its half-made file is removed and the wait ends at once.
pub(crate) fn attach(
    name: &str,
    nslots: usize,
    slot_size: usize,
    send_pid: u32,
    recv_pid: u32,
    peer: (usize, u32),
    timeout: Duration,
) -> Result<Region> {
    use std::sync::atomic::Ordering;
    let start = Instant::now();
    let mut checked = start;
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
            Ok(None) => {
                let now = Instant::now();
                if now.duration_since(checked) >= LIVENESS_CHECK {
                    checked = now;
                    if !fifo::pid_alive(peer.1) {
                        unlink(name);
                        return Err(Error::remote(
                            peer.0,
                            format!(
                                "rank {}'s process {} died while it set up shared-memory FIFO {name}",
                                peer.0, peer.1
                            ),
                        ));
                    }
                }
                if now.duration_since(start) >= timeout {
                    return Err(Error::Timeout {
                        what: format!("waiting for rank {} to initialise shared-memory FIFO {name}", peer.0),
                        secs: timeout.as_secs_f64(),
                    });
                }
                std::thread::yield_now();
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

/// Maps `name` if it exists and its creator has finished it; `None` if not yet. A file that is
/// not this user's, or that others may open, was not made by this job: refused, never read.
fn open_ready(name: &str, nslots: usize, slot_size: usize) -> Result<Option<Region>> {
    use std::sync::atomic::Ordering;
    let c = cname(name)?;
    // SAFETY: as above. O_NOFOLLOW: /dev/shm is world-writable, a name there may be a link.
    let fd = unsafe { libc::shm_open(c.as_ptr(), libc::O_RDWR | libc::O_NOFOLLOW, 0) };
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
    check_private(name, &st)?;
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

/// Refuses a segment that another user owns or could open: the job's own are this user's,
/// created with mode 0600.
pub(crate) fn check_private(name: &str, st: &libc::stat) -> Result<()> {
    // SAFETY: geteuid cannot fail.
    let uid = unsafe { libc::geteuid() };
    if st.st_uid != uid || st.st_mode & 0o077 != 0 || st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return Err(Error::usage(format!(
            "shared-memory segment {name} belongs to uid {} with mode {:o}, so this job (uid {uid}) did not make it; \
             refusing to map it (another user may be trying to read or forge this job's data)",
            st.st_uid,
            st.st_mode & 0o7777
        )));
    }
    Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn dead_pid() -> u32 {
        let mut c = std::process::Command::new("true").spawn().expect("spawn");
        let pid = c.id();
        c.wait().expect("wait");
        pid
    }

    fn dev_shm(name: &str) -> std::path::PathBuf {
        std::path::Path::new("/dev/shm").join(&name[1..])
    }

    #[test]
    fn names_need_the_secret_and_carry_the_sender() {
        let a = segment_name(&[1; 16], 7, 0, 1, 4242);
        assert!(a.starts_with("/occl-") && a.ends_with("-4242"), "{a}");
        assert!(!a.contains("0000000000000007"), "the communicator id must not show: {a}");
        assert_ne!(a, segment_name(&[2; 16], 7, 0, 1, 4242), "another secret, another name");
        assert_ne!(a, segment_name(&[1; 16], 7, 1, 0, 4242));
        assert_ne!(a, segment_name(&[1; 16], 8, 0, 1, 4242));
    }

    /// A file under a FIFO's name that others may open (or that another user owns) was not
    /// made by this job: mapping it could hand a rank forged data or leak what it sends.
    #[test]
    fn a_segment_others_may_open_is_refused() {
        let name = format!("/occl-test-open-{}", std::process::id());
        let path = dev_shm(&name);
        std::fs::write(&path, vec![0u8; fifo::region_size(2, 4096)]).expect("plant");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).expect("chmod");
        let e = attach(&name, 2, 4096, 1, 2, (1, std::process::id()), Duration::from_secs(2)).err().expect("refused");
        let _ = std::fs::remove_file(&path);
        assert_eq!(e.kind(), crate::ErrorKind::InvalidUsage, "{e}");
        assert!(e.to_string().contains("mode 666") && e.to_string().contains("refusing"), "{e}");
    }

    /// The peer created the segment (O_EXCL won) and died before it sized it: the wait ends
    /// at once with the peer named, and its half-made file goes with it.
    #[test]
    fn a_peer_that_died_mid_create_is_seen_at_once_and_its_file_removed() {
        let name = format!("/occl-test-dead-{}", std::process::id());
        let path = dev_shm(&name);
        std::fs::write(&path, b"").expect("half-made segment");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        let t = Instant::now();
        let e = attach(&name, 2, 4096, 1, 2, (3, dead_pid()), Duration::from_secs(5)).err().expect("fails");
        assert!(t.elapsed() < Duration::from_secs(1), "waited {:?}", t.elapsed());
        assert_eq!(e.kind(), crate::ErrorKind::RemoteError, "{e}");
        assert!(e.to_string().contains("rank 3"), "{e}");
        assert!(!path.exists(), "the dead peer's half-made segment stays");
    }
}
