//! Non-blocking access to the FIFO ends, for a progress loop that moves many FIFOs at once (a
//! group's send/recv): take a slot or a message only if it is there now, say which word to sleep
//! on when none is, and read the other side's state. Also marks a FIFO failed from any thread
//! (`abort()` runs beside the thread that owns the FIFO ends).

use super::{Cause, Header, Msg, Notice, RecvFifo, Region, SendFifo, PTR_FLAG};
use crate::error::{Error, Result};
use crate::wait;
use std::sync::atomic::{AtomicU32, Ordering};

impl SendFifo {
    /// The next slot's data area if the receiver has freed it, else `None` (nothing waited).
    pub(crate) fn try_acquire(&self) -> Option<*mut u8> {
        let i = self.head as usize % self.nslots;
        if (self.head as usize) >= self.nslots {
            let want = self.head.wrapping_sub(self.nslots as u32).wrapping_add(1);
            if self.region.slot_hdr(i).ack.load(Ordering::Acquire) != want {
                return None;
            }
        }
        Some(self.region.slot_data(i))
    }

    /// Whether the receiver has consumed every pointer slot posted so far (always true when
    /// none is outstanding); clears the outstanding mark when it has.
    pub(crate) fn try_drain(&mut self) -> bool {
        if !self.drained() {
            return false;
        }
        self.ptr_outstanding = false;
        true
    }

    /// Whether `try_drain` would succeed now.
    pub(crate) fn drained(&self) -> bool {
        if !self.ptr_outstanding || self.head == 0 {
            return true;
        }
        let i = self.head.wrapping_sub(1) as usize % self.nslots;
        self.region.slot_hdr(i).ack.load(Ordering::Acquire) == self.head
    }

    /// The word a blocked sender sleeps on (the acknowledgement of the slot it needs: the next
    /// one, or the last posted while draining) and the counter that tells the receiver to wake
    /// it.
    pub(crate) fn wait_word(&self, draining: bool) -> (&AtomicU32, &AtomicU32) {
        let i = if draining { self.head.wrapping_sub(1) } else { self.head } as usize % self.nslots;
        (&self.region.slot_hdr(i).ack, &self.region.header().send_sleepers.0)
    }

    /// What the receiver says about itself (`state::OPEN` while it takes part).
    pub(crate) fn peer_notice(&self) -> Notice {
        self.region.header().receiver()
    }
}

impl RecvFifo {
    /// The next message if its sender has published it, else `None` (nothing waited). Its data
    /// stays valid until `release`.
    pub(crate) fn try_peek(&self, peer: usize) -> Result<Option<Msg>> {
        let i = self.tail as usize % self.nslots;
        let hdr = self.region.slot_hdr(i);
        if hdr.seq.load(Ordering::Acquire) != self.tail.wrapping_add(1) {
            return Ok(None);
        }
        let raw = hdr.len;
        let len = (raw & !PTR_FLAG) as usize;
        if raw & PTR_FLAG != 0 {
            // SAFETY: a pointer slot holds the 8-byte address at the start of its data area.
            let addr = unsafe { std::ptr::read(self.region.slot_data(i) as *const u64) };
            return Ok(Some(Msg { data: std::ptr::null(), len, desc: hdr.desc, remote: Some(addr) }));
        }
        if len > self.slot_size {
            return Err(Error::internal(format!(
                "rank {peer} published a {len}-byte slot in a FIFO of {}-byte slots",
                self.slot_size
            )));
        }
        Ok(Some(Msg { data: self.region.slot_data(i), len, desc: hdr.desc, remote: None }))
    }

    /// The word a blocked receiver sleeps on (the next slot's sequence number) and the counter
    /// that tells the sender to wake it.
    pub(crate) fn wait_word(&self) -> (&AtomicU32, &AtomicU32) {
        let i = self.tail as usize % self.nslots;
        (&self.region.slot_hdr(i).seq, &self.region.header().recv_sleepers.0)
    }

    /// What the sender says about itself (`state::OPEN` while it takes part). Data it published
    /// before it left is still delivered: check `try_peek` first.
    pub(crate) fn peer_notice(&self) -> Notice {
        self.region.header().sender()
    }
}

/// Wakes every waiter on `r`, on either side (any slot's sequence or acknowledgement).
fn wake_all(h: &Header, r: &Region) {
    for i in 0..h.nslots as usize {
        wait::wake(&r.slot_hdr(i).seq, &h.recv_sleepers.0);
        wait::wake(&r.slot_hdr(i).ack, &h.send_sleepers.0);
    }
    super::ll::wake_all(r);
}

/// Marks this rank's end of the FIFO it sends into as `how`, with its `cause` (unless it
/// already left), and wakes both sides: the receiver learns this rank is gone, and a thread of
/// this rank waiting on the FIFO looks at its abort flag. Safe from any thread: only atomics
/// are touched.
pub(crate) fn fail_send_end(r: &Region, how: u32, cause: Option<Cause>) {
    let h = r.header();
    Notice::mark(&h.send_state.0, &h.send_cause, how, cause);
    wake_all(h, r);
}

/// As `fail_send_end`, for the FIFO this rank receives from.
pub(crate) fn fail_recv_end(r: &Region, how: u32, cause: Option<Cause>) {
    let h = r.header();
    Notice::mark(&h.recv_state.0, &h.recv_cause, how, cause);
    wake_all(h, r);
}

/// Whether the other side is still there as far as its process goes (a thread rank or a tcp
/// link has only its state word).
pub(crate) fn alive(l: super::Liveness) -> bool {
    match l {
        super::Liveness::Local => true,
        super::Liveness::Process(pid) => super::pid_alive(pid),
    }
}
