//! Communicator lifetimes across threads through the exported functions (the same code the
//! cdylib exports, linked here as the rlib): `ncclCommAbort` on one thread while another is
//! blocked in a call on that communicator, as PyTorch's watchdog does.

use nccl::*;
use std::ptr::null_mut;
use std::time::{Duration, Instant};

/// Two thread ranks of one process.
fn two_ranks() -> [usize; 2] {
    let mut comms: [ncclComm_t; 2] = [null_mut(); 2];
    // SAFETY: room for two handles; devlist may be NULL.
    assert_eq!(unsafe { ncclCommInitAll(comms.as_mut_ptr(), 2, std::ptr::null()) }, 0);
    comms.map(|c| c as usize)
}

#[test]
fn abort_from_another_thread_ends_a_blocked_call_and_frees_after_it() {
    std::env::set_var("OCCL_RAS_ENABLE", "0");
    std::env::set_var("OCCL_TIMEOUT", "10"); // a missed abort fails the test instead of hanging it
    let [c0, c1] = two_ranks();
    // Rank 1 waits for a message rank 0 never sends.
    let waiter = std::thread::spawn(move || {
        let mut buf = [0f32; 16];
        let t0 = Instant::now();
        // SAFETY: a live handle and a writable buffer of 16 floats.
        let r = unsafe { ncclRecv(buf.as_mut_ptr().cast(), 16, 7, 0, c1 as ncclComm_t, null_mut()) };
        (r, t0.elapsed())
    });
    std::thread::sleep(Duration::from_millis(200));
    // The handle is released while the receive still uses the communicator: the receive must
    // return an error (not hang, not touch freed memory).
    // SAFETY: c1 is a live handle, not used by this thread again.
    assert_eq!(unsafe { ncclCommAbort(c1 as ncclComm_t) }, 0);
    let (r, took) = waiter.join().unwrap();
    assert_eq!(r, 5, "the blocked ncclRecv returns ncclInvalidUsage: this rank aborted it");
    assert!(took < Duration::from_secs(3), "the blocked ncclRecv took {took:?} to notice the abort");
    // SAFETY: the thread's last error text is a C string.
    let text = unsafe { std::ffi::CStr::from_ptr(ncclGetLastError(null_mut())) }.to_string_lossy().into_owned();
    assert_eq!(text, "ncclRecv: invalid usage: the communicator was aborted");
    // Rank 0's communicator learns that its peer aborted: waiting on it fails at once.
    let mut x = [1f32; 4];
    let t0 = Instant::now();
    // SAFETY: live handle, writable buffer.
    let r0 = unsafe { ncclRecv(x.as_mut_ptr().cast(), 4, 7, 1, c0 as ncclComm_t, null_mut()) };
    assert_eq!(r0, 6, "a receive from an aborted rank is ncclRemoteError");
    assert!(t0.elapsed() < Duration::from_secs(3), "took {:?}", t0.elapsed());
    let mut state = 0;
    // SAFETY: live handle, writable result.
    assert_eq!(unsafe { ncclCommGetAsyncError(c0 as ncclComm_t, &mut state) }, 0);
    assert_eq!(state, r0, "the failure is the communicator's asynchronous error");
    // SAFETY: live handle, not used again.
    assert_eq!(unsafe { ncclCommDestroy(c0 as ncclComm_t) }, 0);
}
