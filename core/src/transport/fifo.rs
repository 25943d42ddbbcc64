//! The FIFO every transport moves data through: `nslots` slots of `slot_size` bytes in one
//! memory region, written by one sender and read by one receiver, like NCCL's connector buffers
//! with NCCL_STEPS slots.
//!
//! For shm the region is a shared-memory segment between two processes (or two threads); for tcp
//! it is process memory that the tcp link drains into, or fills from, its sockets. Either way
//! the protocol is the same:
//! - the sender waits until the slot's previous message was acknowledged, writes the data and
//!   the slot header, then publishes the slot by storing its sequence number;
//! - the receiver waits for that sequence number, uses the data, then acknowledges the slot.
//!
//! The sequence word sits in the same cache line as the first 32 bytes of data, so a small
//! message crosses between cores as one line. Acknowledgements are per slot (not one tail
//! counter) so that the slots of one FIFO, spread over several sockets, can complete out of order.

use crate::dtype::{DataType, RedOp};
use crate::error::{Error, Result};
use crate::record::CollType;
use crate::wait::{self, Check, Deadline, Patience};
use occl_events::files::{read_to_string_capped, MAX_SYSTEM_FILE};
use occl_events::StepTotals;
use std::cell::Cell;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

pub(crate) mod ll;
pub(crate) mod nonblocking;

pub(crate) const MAGIC: u64 = 0x4f43_434c_4649_464f; // "OCCLFIFO"
/// 2: the LL area follows the slots; 3: it has its own step count (`ll::STEPS`); 4: the
/// `ready`, `attached` and `reader_direct` words of lazy connection; 5: the `*_cause` words.
pub(crate) const VERSION: u32 = 5;

/// Endpoint states, written by each side into its own header word. Anything but `OPEN` ends
/// the other side's waits with an error that says why.
pub(crate) mod state {
    pub const OPEN: u32 = 0;
    /// Destroyed cleanly.
    pub const CLOSED: u32 = 1;
    /// The rank failed or was aborted.
    pub const ABORTED: u32 = 2;
    /// The rank saw an operation mismatch.
    pub const MISMATCH: u32 = 3;
    /// The rank timed out.
    pub const TIMEOUT: u32 = 4;
    /// The transport lost the connection (set by the tcp link).
    pub const LOST: u32 = 5;
    /// Never a state word: the cause a rank gives when a peer's process died under it.
    pub const DEAD: u32 = 6;

    pub fn describe(s: u32) -> &'static str {
        match s {
            CLOSED => "destroyed its communicator while this rank still expected it to take part",
            ABORTED => "failed or was aborted",
            MISMATCH => "detected an operation mismatch (ranks called different collectives, counts, types or roots)",
            TIMEOUT => "timed out waiting for another rank",
            LOST => "lost its connection (the process died or the network failed)",
            DEAD => "died (its process is gone)",
            _ => "reported an unknown failure",
        }
    }
}

/// The failure that started a cascade: the rank that failed first and how (a `state`, or
/// `state::DEAD`). A rank that fails because a peer failed passes the peer's cause on in its
/// own notice, so ranks further away name the rank that failed first, not their neighbour.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Cause {
    pub origin: u32,
    pub state: u32,
}

impl Cause {
    /// One word, 0 for none (a rank that said no cause, or a tcp peer's CLOSE).
    pub(crate) fn encode(c: Option<Cause>) -> u64 {
        c.map_or(0, |c| ((u64::from(c.origin) + 1) << 32) | u64::from(c.state))
    }

    pub(crate) fn decode(w: u64) -> Option<Cause> {
        let origin = (w >> 32).checked_sub(1)?;
        Some(Cause { origin: origin as u32, state: w as u32 })
    }
}

/// What one side of a FIFO says about itself: its state word and the cause beside it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Notice {
    pub state: u32,
    pub cause: Option<Cause>,
}

impl Notice {
    /// Reads a side's cause and state words (the state first: the cause was written before it).
    pub(crate) fn read(state: &AtomicU32, cause: &AtomicU64) -> Notice {
        let s = state.load(Ordering::Acquire);
        let cause = if s == state::OPEN { None } else { Cause::decode(cause.load(Ordering::Acquire)) };
        Notice { state: s, cause }
    }

    /// Marks a side `s` with `cause`, unless it already left: the first failure is the one
    /// peers learn.
    pub(crate) fn mark(state: &AtomicU32, cause_word: &AtomicU64, s: u32, cause: Option<Cause>) {
        if state.load(Ordering::Acquire) == state::OPEN {
            let _ = cause_word.compare_exchange(0, Cause::encode(cause), Ordering::SeqCst, Ordering::SeqCst);
        }
        let _ = state.compare_exchange(state::OPEN, s, Ordering::SeqCst, Ordering::SeqCst);
    }

    /// The error of a rank that waited on `peer` and found this notice: it names the rank that
    /// failed first when the peer only failed because of it.
    pub(crate) fn error(self, peer: usize) -> Error {
        match self.cause {
            Some(c) if c.origin as usize != peer => Error::remote(
                c.origin as usize,
                format!(
                    "{}; rank {peer} failed because of it, and this rank because of rank {peer}",
                    state::describe(c.state)
                ),
            ),
            _ => Error::remote(peer, state::describe(self.state)),
        }
    }
}

/// Cache-line padding so that words written by different sides never share a line.
#[repr(C, align(64))]
pub(crate) struct Line<T>(pub T);

#[repr(C)]
pub(crate) struct Header {
    pub magic: u64,
    pub version: u32,
    pub nslots: u32,
    pub slot_size: u32,
    pub send_pid: u32,
    pub recv_pid: u32,
    pub send_sleepers: Line<AtomicU32>,
    pub recv_sleepers: Line<AtomicU32>,
    pub send_state: Line<AtomicU32>,
    pub recv_state: Line<AtomicU32>,
    /// Set last by the creator (release): a side that opens the segment waits for it before
    /// it reads anything else, since either side may create it (`shm::attach`).
    pub ready: Line<AtomicU32>,
    /// Sides that have mapped the region: the second one unlinks the name.
    pub attached: AtomicU32,
    /// Written by the receiver when it attaches: 1 if it can read the sender's memory
    /// (same process, or `process_vm_readv` allowed), so the sender may post pointers.
    pub reader_direct: AtomicU32,
    /// Each side's `Cause` (encoded) once it failed, written before its state word.
    pub send_cause: AtomicU64,
    pub recv_cause: AtomicU64,
}

impl Header {
    /// What the sending side says about itself.
    pub(crate) fn sender(&self) -> Notice {
        Notice::read(&self.send_state.0, &self.send_cause)
    }

    /// What the receiving side says about itself.
    pub(crate) fn receiver(&self) -> Notice {
        Notice::read(&self.recv_state.0, &self.recv_cause)
    }
}

/// What a message is part of; every slot carries it so that a receiver detects, on the first
/// slot, a peer that runs a different operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[repr(C)]
pub(crate) struct Desc {
    pub opseq: u32,
    pub root: u32,
    /// The call's count, split so the struct stays 4-byte aligned and the header 32 bytes.
    pub count_lo: u32,
    pub count_hi: u32,
    pub coll: u8,
    pub dtype: u8,
    pub redop: u8,
    pub _pad: u8,
}

impl Desc {
    pub(crate) fn new(coll: u8, opseq: u32, count: u64, dtype: u8, redop: u8, root: u32) -> Desc {
        Desc { opseq, root, count_lo: count as u32, count_hi: (count >> 32) as u32, coll, dtype, redop, _pad: 0 }
    }

    pub(crate) fn count(&self) -> u64 {
        self.count_lo as u64 | ((self.count_hi as u64) << 32)
    }
}

/// `#7 AllReduce(count 4096, f32, sum)`: what mismatch errors name.
impl std::fmt::Display for Desc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let coll = CollType::from_u8(self.coll).map_or("unknown operation", |c| c.name());
        let dt = DataType::from_u8(self.dtype).map_or("?", |t| t.name());
        write!(f, "#{} {coll}(count {}, {dt}", self.opseq, self.count())?;
        // Collectives that only move data carry no operator.
        if let Some(o) = RedOp::from_u8(self.redop) {
            write!(f, ", {}", o.name())?;
        }
        if self.root != u32::MAX {
            write!(f, ", root {}", self.root)?;
        }
        f.write_str(")")
    }
}

#[repr(C)]
pub(crate) struct SlotHdr {
    /// Message number + 1 once published (wrapping; never equals a stale value in the slot).
    pub seq: AtomicU32,
    /// Message number + 1 once consumed.
    pub ack: AtomicU32,
    pub len: u32,
    pub desc: Desc,
}

pub(crate) const SLOT_HDR: usize = 32;

/// Set in a slot's `len` when the slot holds the sender's address of the data instead of the
/// data (single-copy: the receiver reads it straight from the sender's buffer).
pub(crate) const PTR_FLAG: u32 = 1 << 31;

/// How a receiver may read data that a sender leaves in its own memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Direct {
    /// It may not: every byte goes through the slots.
    No,
    /// The same address space (ranks that are threads of one process): plain memcpy.
    SameProcess,
    /// Another process of this host that this rank may read with `process_vm_readv`.
    Cma(u32),
}
const _: () = assert!(std::mem::size_of::<SlotHdr>() == SLOT_HDR);
const _: () = assert!(std::mem::size_of::<Desc>() == 20);

pub(crate) fn header_size() -> usize {
    std::mem::size_of::<Header>().next_multiple_of(64)
}

pub(crate) fn stride(slot_size: usize) -> usize {
    (SLOT_HDR + slot_size).next_multiple_of(64)
}

/// The Simple slots, then the LL area (`ll`), which every FIFO has so that one layout serves
/// shm and tcp alike (tcp never uses it).
pub(crate) fn region_size(nslots: usize, slot_size: usize) -> usize {
    header_size() + nslots * stride(slot_size) + ll::area_size()
}

/// A mapping that holds one FIFO; unmapped when the last user drops it.
pub(crate) struct Region {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the region is plain memory whose concurrent use goes through atomics in the header and
// slot headers; data is only touched by the side that owns the slot at that moment.
unsafe impl Send for Region {}
unsafe impl Sync for Region {}

impl Region {
    /// Maps `len` bytes of `fd` shared (fd < 0: anonymous memory for an in-process FIFO).
    pub(crate) fn map(fd: libc::c_int, len: usize) -> Result<Region> {
        let flags = if fd < 0 { libc::MAP_SHARED | libc::MAP_ANONYMOUS } else { libc::MAP_SHARED };
        // SAFETY: a fresh mapping; the kernel picks the address.
        let p = unsafe { libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, flags, fd, 0) };
        if p == libc::MAP_FAILED {
            return Err(Error::last_os(format!("mmap of a {len}-byte FIFO")));
        }
        Ok(Region { ptr: p.cast(), len })
    }

    pub(crate) fn header(&self) -> &Header {
        // SAFETY: the region starts with a Header (validated by `check` for mapped peers' FIFOs)
        // and lives as long as self.
        unsafe { &*(self.ptr as *const Header) }
    }

    /// Writes a fresh header (the creator does this before anyone else maps the region).
    pub(crate) fn init(&self, nslots: usize, slot_size: usize, send_pid: u32, recv_pid: u32) {
        // SAFETY: the creator has exclusive access; the mapping is zero-filled, which is a valid
        // state for every atomic.
        unsafe {
            let h = self.ptr as *mut Header;
            (*h).magic = MAGIC;
            (*h).version = VERSION;
            (*h).nslots = nslots as u32;
            (*h).slot_size = slot_size as u32;
            (*h).send_pid = send_pid;
            (*h).recv_pid = recv_pid;
            (*h).attached.store(1, Ordering::Relaxed);
            (*h).ready.0.store(1, Ordering::Release);
        }
    }

    /// Validates a header written by another process before trusting its geometry.
    pub(crate) fn check(&self, nslots: usize, slot_size: usize) -> Result<()> {
        let h = self.header();
        if self.len < region_size(nslots, slot_size)
            || h.magic != MAGIC
            || h.version != VERSION
            || h.nslots as usize != nslots
            || h.slot_size as usize != slot_size
        {
            return Err(Error::internal(format!(
                "shared-memory FIFO has an unexpected header (magic {:#x}, version {}, {} slots of {} bytes); \
                 do all ranks run the same occl build and OCCL_FIFO_SLOTS/OCCL_SHM_SLOT_SIZE?",
                h.magic, h.version, h.nslots, h.slot_size
            )));
        }
        Ok(())
    }

    fn slot(&self, i: usize) -> *mut u8 {
        let h = self.header();
        // SAFETY: i < nslots, and the region holds nslots slots (checked at creation/mapping).
        unsafe { self.ptr.add(header_size() + i * stride(h.slot_size as usize)) }
    }

    pub(crate) fn slot_hdr(&self, i: usize) -> &SlotHdr {
        // SAFETY: every slot starts with a SlotHdr; atomics make shared access sound.
        unsafe { &*(self.slot(i) as *const SlotHdr) }
    }

    pub(crate) fn slot_data(&self, i: usize) -> *mut u8 {
        // SAFETY: within the slot (data follows the 32-byte header).
        unsafe { self.slot(i).add(SLOT_HDR) }
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: unmapping our own mapping; nobody holds references past the Arc's life.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

/// How the waiting side learns that the other side is gone, beyond its state word.
#[derive(Clone, Copy)]
pub(crate) enum Liveness {
    /// In this process (a thread rank, or the tcp link): the state word says it all.
    Local,
    /// Another process of this host: also check that its pid is alive.
    Process(u32),
}

pub(crate) fn pid_alive(pid: u32) -> bool {
    // SAFETY: kill with signal 0 only checks for existence.
    let r = unsafe { libc::kill(pid as libc::pid_t, 0) };
    if r != 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH) {
        return false;
    }
    // A killed child that its parent has not reaped yet still exists as a zombie.
    match read_to_string_capped(std::path::Path::new(&format!("/proc/{pid}/stat")), MAX_SYSTEM_FILE) {
        Ok(s) => !matches!(s.rsplit_once(") ").and_then(|(_, t)| t.chars().next()), Some('Z' | 'X')),
        Err(_) => r == 0,
    }
}

/// Told when an operation's wait blocks: on which peer, in which state (NCCL's ProxyStep
/// numbers). Implemented above the transport by whatever keeps the record of operations.
pub(crate) trait Waiting {
    fn waiting_on(&self, peer: usize, state: u32);
}

/// The communicator's other peers, as a wait that has blocked for a while sees them: an error
/// once any of them failed (the operation cannot complete). Implemented by the peer table
/// (`peers.rs`).
pub(crate) trait Members {
    fn failed_peer(&self, except: usize) -> Result<()>;
}

/// The time an operation's waits blocked, by step state (`StepTotals::STATES` order): the
/// direct metrics route's step waits, where no step marks read the clock. [`Timed`] adds to it.
#[derive(Default)]
pub(crate) struct WaitSums {
    /// Set by the first wait that blocked: an operation without one reads nothing more.
    blocked: Cell<bool>,
    ns: [Cell<u64>; StepTotals::STATES.len()],
}

impl WaitSums {
    /// A wait in `state` (NCCL's ProxyStep number) blocked for `ns`; a state that is not one of
    /// `StepTotals::STATES` counts nowhere.
    #[cfg(test)]
    pub(crate) fn add(&self, state: u32, ns: u64) {
        self.add_at(StepTotals::index_of(state), ns);
    }

    /// As [`WaitSums::add`], with the state's index found already.
    #[inline]
    fn add_at(&self, at: Option<usize>, ns: u64) {
        self.blocked.set(true);
        if let Some(c) = at.and_then(|i| self.ns.get(i)) {
            c.set(c.get().saturating_add(ns));
        }
    }

    /// The ns waits blocked, by state, if any wait blocked.
    #[inline]
    pub(crate) fn get(&self) -> Option<[u64; StepTotals::STATES.len()]> {
        self.blocked.get().then(|| std::array::from_fn(|i| self.ns[i].get()))
    }
}

/// A wait that blocked, timed into a [`WaitSums`]: made where the wait's first readiness check
/// failed, it starts a stopwatch then (the clock's rate and state index looked up while the
/// rank waits anyway), and adds the time when dropped (the wait ended, or failed), which reads
/// only the counter: the data's arrival is followed by a few instructions, not a clock
/// reading. A wait that succeeds at once makes none. The ns are the span clock's
/// (`occl_events::Stopwatch`), so both routes time waits alike.
pub(crate) struct Timed<'a> {
    to: &'a WaitSums,
    at: Option<usize>,
    watch: occl_events::Stopwatch,
}

impl<'a> Timed<'a> {
    /// Starts timing a wait in `state` when there is a `to`.
    #[inline]
    pub(crate) fn start(to: Option<&'a WaitSums>, state: u32) -> Option<Timed<'a>> {
        to.map(|to| Timed { to, at: StepTotals::index_of(state), watch: occl_events::Stopwatch::start() })
    }
}

impl Drop for Timed<'_> {
    #[inline]
    fn drop(&mut self) {
        self.to.add_at(self.at, self.watch.elapsed_ns());
    }
}

/// Checks shared by both ends: our own abort flag, the other side's state, its pid.
pub(crate) struct Ends<'a> {
    pub peer: usize,
    pub liveness: Liveness,
    pub abort: &'a std::sync::atomic::AtomicBool,
    /// The communicator's tcp sockets, which this thread moves while it waits (any wait: a
    /// rank waiting on one peer may still owe data to another).
    pub drive: Option<&'a dyn wait::Drive>,
    /// Told when a wait blocks and wakes (ProxyCtrl Sleep/Wakeup), when profiling wants it.
    pub sleeper: Option<&'a dyn wait::Sleeper>,
    /// Told on which peer and in which step state a wait blocks (the rank record, for RAS).
    pub record: Option<&'a dyn Waiting>,
    /// Where each wait that blocked adds its time (the operation's tally, on the direct
    /// metrics route).
    pub waited: Option<&'a WaitSums>,
    /// The communicator's other peers: a wait that has blocked for a while also fails when
    /// one of them failed (the operation cannot complete; see `peers`).
    pub members: Option<&'a dyn Members>,
}

impl Ends<'_> {
    /// Notes in the rank record that this operation now waits on the peer in `state` (NCCL's ProxyStep numbers);
    /// only called when data is not there yet, so the fast path pays nothing.
    fn waits(&self, state: u32) {
        if let Some(r) = self.record {
            r.waiting_on(self.peer, state);
        }
    }

    /// Starts timing a wait in `state` whose first check failed (see [`Timed`]).
    fn timed(&self, state: u32) -> Option<Timed<'_>> {
        Timed::start(self.waited, state)
    }
}

impl Ends<'_> {
    /// `other`: the other side's notice (`Header::sender` or `receiver`).
    fn check(&self, other: impl Fn() -> Notice, slow: bool) -> Result<()> {
        if self.abort.load(Ordering::Relaxed) {
            return Err(Error::usage("the communicator was aborted"));
        }
        let n = other();
        if n.state != state::OPEN {
            return Err(n.error(self.peer));
        }
        if slow {
            if let Liveness::Process(pid) = self.liveness {
                if !pid_alive(pid) {
                    return Err(Error::remote(self.peer, format!("process {pid} is dead")));
                }
            }
            if let Some(m) = self.members {
                m.failed_peer(self.peer)?;
            }
        }
        Ok(())
    }
}

/// NCCL's ProxyStep states, as RAS reports what a blocked operation waits in: a free slot (the receiver's
/// credit), the receiver reading a pointed-to buffer, data from the sender.
const SEND_PEER_WAIT: u32 = 20;
const SEND_WAIT: u32 = 9;
const RECV_WAIT: u32 = 10;

/// The sending end of a FIFO.
pub(crate) struct SendFifo {
    pub region: Arc<Region>,
    nslots: usize,
    patience: Patience,
    /// Whether this end may post pointers at all (shm with OCCL_SHM_DIRECT); the receiver
    /// also has to say in the header that it can read this rank's memory (`may_post_ptr`).
    pub pointers: bool,
    /// A pointer slot was posted and may not be consumed yet: `drain` before the op returns.
    ptr_outstanding: bool,
    /// Messages posted so far.
    head: u32,
    /// For a tcp link: per slot, the ProxyStep event of the message in it, which the socket
    /// writer stops when the frame is on the wire (0: none).
    pub net_steps: Option<Arc<[AtomicU64]>>,
    /// The LL protocol's side of this end.
    ll: ll::SendState,
}

impl SendFifo {
    /// `patience`: how the collective thread waits on this FIFO: spin when the other end is
    /// another rank's thread (shm); drive the sockets when it is a tcp link (see `wait`).
    pub(crate) fn new(region: Arc<Region>, patience: Patience) -> SendFifo {
        let h = region.header();
        SendFifo {
            nslots: h.nslots as usize,
            region,
            head: 0,
            patience,
            pointers: false,
            ptr_outstanding: false,
            net_steps: None,
            ll: ll::SendState::default(),
        }
    }

    /// Whether a message may go by pointer: the receiver attached and can read this rank's
    /// memory. Until it attaches every byte goes through the slots, which it reads either way.
    pub(crate) fn may_post_ptr(&self) -> bool {
        self.pointers && self.region.header().reader_direct.load(Ordering::Acquire) == 1
    }

    /// Waits for the next slot to be free and returns its data area (`slot_size` bytes).
    pub(crate) fn acquire(&mut self, ends: &Ends<'_>, deadline: &Deadline) -> Result<*mut u8> {
        let i = self.head as usize % self.nslots;
        if (self.head as usize) >= self.nslots {
            let want = self.head.wrapping_sub(self.nslots as u32).wrapping_add(1);
            if !self.acked(i, want) {
                let peer = ends.peer;
                let what = || format!("sending to rank {peer} (waiting for a free slot)");
                self.wait_acked(i, want, ends, deadline, SEND_PEER_WAIT, &what)?;
            }
        }
        Ok(self.region.slot_data(i))
    }

    /// Whether slot `i` is acknowledged up to `want` (the receiver is done with it).
    #[inline]
    fn acked(&self, i: usize, want: u32) -> bool {
        self.region.slot_hdr(i).ack.load(Ordering::Acquire) == want
    }

    /// Waits until slot `i` is acknowledged up to `want`, once a first look (`acked`) found it
    /// was not, recording `state` as the rank's wait; `what` names the wait in a timeout. Out of
    /// line, so that the look that finds it done stays small.
    #[cold]
    #[inline(never)]
    fn wait_acked(
        &self,
        i: usize,
        want: u32,
        ends: &Ends<'_>,
        deadline: &Deadline,
        state: u32,
        what: &dyn Fn() -> String,
    ) -> Result<()> {
        let hdr = self.region.slot_hdr(i);
        let h = self.region.header();
        ends.waits(state);
        let _timed = ends.timed(state);
        // Driven like every other wait: a rank with tcp peers keeps their sockets moving.
        wait::wait_until(
            wait::driven(ends.drive, || hdr.ack.load(Ordering::Acquire) == want),
            &hdr.ack,
            &h.send_sleepers.0,
            &mut |slow| ends.check(|| h.receiver(), slow),
            deadline,
            self.patience,
            what,
            ends.sleeper,
        )
    }

    /// Publishes the slot returned by the last `acquire` with `len` bytes of data.
    #[inline]
    pub(crate) fn post(&mut self, len: usize, desc: &Desc) {
        let i = self.head as usize % self.nslots;
        let h = self.region.header();
        let hdr = self.region.slot(i) as *mut SlotHdr;
        // SAFETY: the slot is ours until `seq` is published; the receiver reads len/desc only
        // after observing seq with Acquire.
        unsafe {
            (*hdr).len = len as u32;
            (*hdr).desc = *desc;
        }
        self.head = self.head.wrapping_add(1);
        self.region.slot_hdr(i).seq.store(self.head, Ordering::SeqCst);
        wait::wake(&self.region.slot_hdr(i).seq, &h.recv_sleepers.0);
    }

    /// Publishes a pointer slot: `len` bytes at `addr` in this process, which the receiver
    /// reads directly. The memory must stay valid and unchanged until `drain` returns.
    pub(crate) fn post_ptr(&mut self, addr: *const u8, len: usize, desc: &Desc) {
        let i = self.head as usize % self.nslots;
        // SAFETY: the slot (acquired by the caller) is ours until published.
        unsafe { std::ptr::write(self.region.slot_data(i) as *mut u64, addr as u64) };
        self.ptr_outstanding = true;
        self.post(len | PTR_FLAG as usize, desc);
    }

    /// Waits until the receiver has consumed every message posted so far (it consumes in order,
    /// so the last one suffices). Needed only after pointer slots: the caller's buffer must not
    /// be released or changed while a peer may still read it.
    pub(crate) fn drain(&mut self, ends: &Ends<'_>, deadline: &Deadline) -> Result<()> {
        if !self.ptr_outstanding || self.head == 0 {
            return Ok(());
        }
        let i = (self.head.wrapping_sub(1)) as usize % self.nslots;
        if !self.acked(i, self.head) {
            let peer = ends.peer;
            let what = || format!("waiting for rank {peer} to read this rank's buffer");
            self.wait_acked(i, self.head, ends, deadline, SEND_WAIT, &what)?;
        }
        self.ptr_outstanding = false;
        Ok(())
    }

    /// Hands the ProxyStep of the message just posted to the socket writer, which stops it
    /// when the frame is written; `false` where posting is delivery (shm).
    pub(crate) fn hand_step(&self, step: u64) -> bool {
        let Some(t) = &self.net_steps else { return false };
        let i = self.head.wrapping_sub(1) as usize % self.nslots;
        t[i].store(step, Ordering::Relaxed);
        true
    }

    /// Marks this end with `s` (closed or failed, and why) and wakes the receiver so it
    /// notices.
    pub(crate) fn set_state(&self, s: u32, cause: Option<Cause>) {
        let h = self.region.header();
        Notice::mark(&h.send_state.0, &h.send_cause, s, cause);
        for i in 0..self.nslots {
            wait::wake(&self.region.slot_hdr(i).seq, &h.recv_sleepers.0);
        }
        ll::wake_all(&self.region);
    }
}

/// Starts pulling the cache line at `p` into this core's cache: for writing (`write`), which
/// fetches it exclusive so a later store need not wait for the other core's copy to go, or for
/// reading. Only a hint: no effect on memory, and none off x86-64.
#[inline]
fn prefetch(p: *const u8, write: bool) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_ET0, _MM_HINT_T0};
        // SAFETY: prefetching never faults and does not change memory.
        unsafe {
            if write {
                _mm_prefetch::<_MM_HINT_ET0>(p as *const i8);
            } else {
                _mm_prefetch::<_MM_HINT_T0>(p as *const i8);
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (p, write);
}

/// Prefetches for reading the cache lines that a message of `bytes` fills in slot `i` (its
/// header's line first), at most four, as `ll::prefetch_step` does for an LL step.
fn prefetch_slot(r: &Region, i: usize, bytes: usize) {
    let lines = (SLOT_HDR + bytes).div_ceil(64).min(4);
    for k in 0..lines {
        // SAFETY: within slot i (header and data), which the region holds.
        prefetch(unsafe { r.slot(i).add(64 * k) }, false);
    }
}

impl RecvFifo {
    /// Hints that the next message, of `bytes`, will be read soon (see `prefetch`), as an LL
    /// step (`ll`) or a Simple slot.
    #[inline]
    pub(crate) fn prepare(&self, ll: bool, bytes: usize) {
        if ll {
            self.ll_prepare(bytes);
        } else {
            prefetch_slot(&self.region, self.tail as usize % self.nslots, bytes);
        }
    }

    /// Waits for the next message of the protocol the operation runs (`ll`: an LL step, else
    /// a Simple slot); it stays valid until `release_as` with the same protocol.
    pub(crate) fn peek_as(&mut self, ll: bool, ends: &Ends<'_>, deadline: &Deadline) -> Result<Msg> {
        if ll {
            self.ll_peek(ends, deadline)
        } else {
            self.peek(ends, deadline)
        }
    }

    /// Frees the message from the last `peek_as` for the sender.
    pub(crate) fn release_as(&mut self, ll: bool) {
        if ll {
            self.ll_release();
        } else {
            self.release();
        }
    }
}

/// The receiving end of a FIFO.
pub(crate) struct RecvFifo {
    pub region: Arc<Region>,
    nslots: usize,
    slot_size: usize,
    patience: Patience,
    /// How to read pointer slots from this FIFO's sender (set after init's probe).
    pub direct: Direct,
    /// Messages consumed so far.
    tail: u32,
    /// For a tcp link: per slot, the ProxyStep waiting for the message, the parent of the
    /// socket reader's NetPlugin event (0: none waiting yet).
    pub net_steps: Option<Arc<[AtomicU64]>>,
    /// The LL protocol's side of this end.
    ll: ll::RecvState,
}

/// A published slot: its data, length and descriptor.
#[derive(Debug)]
pub(crate) struct Msg {
    pub data: *const u8,
    pub len: usize,
    pub desc: Desc,
    /// For a pointer slot: the data's address in the sender's memory.
    pub remote: Option<u64>,
}

impl RecvFifo {
    pub(crate) fn new(region: Arc<Region>, patience: Patience) -> RecvFifo {
        let h = region.header();
        let (nslots, slot_size) = (h.nslots as usize, h.slot_size as usize);
        RecvFifo {
            region,
            nslots,
            slot_size,
            tail: 0,
            patience,
            direct: Direct::No,
            net_steps: None,
            ll: ll::RecvState::default(),
        }
    }

    /// Waits for the next message. Its data stays valid until `release`.
    pub(crate) fn peek(&mut self, ends: &Ends<'_>, deadline: &Deadline) -> Result<Msg> {
        let i = self.tail as usize % self.nslots;
        let hdr = self.region.slot_hdr(i);
        let want = self.tail.wrapping_add(1);
        if hdr.seq.load(Ordering::Acquire) != want {
            self.wait_published(hdr, want, ends, deadline)?;
        }
        let raw = hdr.len;
        let len = (raw & !PTR_FLAG) as usize;
        if raw & PTR_FLAG != 0 {
            // SAFETY: a pointer slot holds the 8-byte address at the start of its data area.
            let addr = unsafe { std::ptr::read(self.region.slot_data(i) as *const u64) };
            return Ok(Msg { data: std::ptr::null(), len, desc: hdr.desc, remote: Some(addr) });
        }
        if len > self.slot_size {
            return Err(Error::internal(format!(
                "rank {} published a {len}-byte slot in a FIFO of {}-byte slots",
                ends.peer, self.slot_size
            )));
        }
        Ok(Msg { data: self.region.slot_data(i), len, desc: hdr.desc, remote: None })
    }

    /// Waits until `hdr`'s slot is published as message `want` (`peek`'s first look found it
    /// was not): out of line, so that the look that finds it stays small.
    #[cold]
    #[inline(never)]
    fn wait_published(&self, hdr: &SlotHdr, want: u32, ends: &Ends<'_>, deadline: &Deadline) -> Result<()> {
        let h = self.region.header();
        let peer = ends.peer;
        ends.waits(RECV_WAIT);
        let _timed = ends.timed(RECV_WAIT);
        let mut check = |slow: bool| -> Result<()> {
            // Data published before the sender went away is still delivered.
            if hdr.seq.load(Ordering::Acquire) == want {
                return Ok(());
            }
            self.ll_instead(peer)?;
            ends.check(|| h.sender(), slow)
        };
        let check: Check<'_> = &mut check;
        wait::wait_until(
            wait::driven(ends.drive, || hdr.seq.load(Ordering::Acquire) == want),
            &hdr.seq,
            &h.recv_sleepers.0,
            check,
            deadline,
            self.patience,
            &|| format!("receiving from rank {peer}"),
            ends.sleeper,
        )
    }

    /// Publishes the ProxyStep that waits for the next message (for the socket reader).
    pub(crate) fn waiting_step(&self, step: u64) {
        if let Some(t) = &self.net_steps {
            t[self.tail as usize % self.nslots].store(step, Ordering::Relaxed);
        }
    }

    /// Acknowledges the message returned by the last `peek`, freeing its slot for the sender.
    pub(crate) fn release(&mut self) {
        let i = self.tail as usize % self.nslots;
        self.tail = self.tail.wrapping_add(1);
        let hdr = self.region.slot_hdr(i);
        hdr.ack.store(self.tail, Ordering::SeqCst);
        wait::wake(&hdr.ack, &self.region.header().send_sleepers.0);
    }

    pub(crate) fn set_state(&self, s: u32, cause: Option<Cause>) {
        let h = self.region.header();
        Notice::mark(&h.recv_state.0, &h.recv_cause, s, cause);
        for i in 0..self.nslots {
            wait::wake(&self.region.slot_hdr(i).ack, &h.send_sleepers.0);
        }
        ll::wake_all(&self.region);
    }
}
