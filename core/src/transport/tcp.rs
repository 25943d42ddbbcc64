//! The tcp transport: a FIFO in process memory on each side whose slots travel over `nsocks`
//! sockets per peer (slot m on socket m mod nsocks). There is no proxy thread: the thread that
//! runs the collective moves the data whenever it waits (`Net` is its `wait::Drive`), with
//! non-blocking I/O and a cursor per socket and direction, so on a small machine no thread
//! competes with it for the cores. The collective code sees the same `SendFifo`/`RecvFifo` as
//! for shm.
//!
//! Wire frame per slot: a 32-byte header (seq, kind, len, descriptor; little-endian) and `len`
//! bytes of data. Kind `ABORT` carries the sender's failure state in `len` and its cause
//! (`fifo::Cause`, the rank that failed first) in the descriptor's first two words instead of
//! data, so the peer learns why its sender stopped, not only that it did; kind `CLOSE` says it
//! was destroyed.
//!
//! An operation returns once its data is in the kernel's socket buffers, and that data must
//! reach the peer even if the process then exits without `destroy`. So a receiver reads every
//! socket to its own end before it calls the peer lost, and a closing or exiting sender (an
//! `atexit` handler covers exit) shuts its sockets for writing and waits, bounded by the
//! timeout, until the peer's kernel has acknowledged all of it (see `linger`).

use super::fifo::{self, state, Cause, Desc, Notice, Region};
use crate::error::{Error, Result};
use crate::sync::lock;
use crate::wait::{self, poll, Deadline, Drive, Patience};
use occl_events::{EventDescr, EventId, EventType, Fanout};
use std::io;
use std::net::TcpStream;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const KIND_DATA: u32 = 0;
const KIND_ABORT: u32 = 1;
/// Sent after the last data frame when the peer destroys its communicator: an end of stream
/// without it means the process died (the kernel closes a killed process's sockets cleanly).
const KIND_CLOSE: u32 = 2;
const FRAME_HDR: usize = 32;
/// Bytes read at once while a socket waits for a frame header: a small frame (header and data)
/// arrives in one system call, and a large one loses at most this much to an extra copy.
const STAGE: usize = 4096;
/// Socket buffers: several FIFOs' worth in flight while the other side is busy reducing, even
/// where the default `tcp_wmem` is small (on this loopback, no different from autotuning).
const SOCK_BUF: libc::c_int = 4 << 20;
/// How long a failing rank's close tries to get its ABORT frames out.
const ABORT_WAIT: Duration = Duration::from_secs(1);

fn encode(seq: u32, kind: u32, len: u32, d: &Desc) -> [u8; FRAME_HDR] {
    let mut b = [0u8; FRAME_HDR];
    b[0..4].copy_from_slice(&seq.to_le_bytes());
    b[4..8].copy_from_slice(&kind.to_le_bytes());
    b[8..12].copy_from_slice(&len.to_le_bytes());
    b[12..16].copy_from_slice(&d.opseq.to_le_bytes());
    b[16..20].copy_from_slice(&d.root.to_le_bytes());
    b[20..24].copy_from_slice(&d.count_lo.to_le_bytes());
    b[24..28].copy_from_slice(&d.count_hi.to_le_bytes());
    b[28] = d.coll;
    b[29] = d.dtype;
    b[30] = d.redop;
    b
}

fn u32_at(b: &[u8], i: usize) -> u32 {
    u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]])
}

fn decode(b: &[u8]) -> (u32, u32, u32, Desc) {
    let d = Desc {
        opseq: u32_at(b, 12),
        root: u32_at(b, 16),
        count_lo: u32_at(b, 20),
        count_hi: u32_at(b, 24),
        coll: b[28],
        dtype: b[29],
        redop: b[30],
        _pad: 0,
    };
    (u32_at(b, 0), u32_at(b, 4), u32_at(b, 8), d)
}

/// Message `m`'s slot and its published sequence word, computed as the FIFO ends compute them
/// (from a wrapping u32 counter).
fn slot_of(m: u64, nslots: usize) -> usize {
    (m as u32) as usize % nslots
}

fn seq_of(m: u64) -> u32 {
    (m as u32).wrapping_add(1)
}

/// A frame being written: its header, data bytes, and how much of header + data went out.
#[derive(Clone, Copy)]
struct Out {
    hdr: [u8; FRAME_HDR],
    len: usize,
    off: usize,
    /// A data frame (its slot is acknowledged when written) or a control frame.
    data: bool,
    /// Where the data is: the slot, or for a pointer slot the sender's own buffer (an address,
    /// so that the link stays `Send`).
    src: usize,
    /// The NetPlugin event of this write, once its first bytes went out.
    net: Option<EventId>,
}

/// Frames one `sendmsg` may carry.
const BATCH: usize = 8;
const NO_FRAME: Out = Out { hdr: [0; FRAME_HDR], len: 0, off: 0, data: false, src: 0, net: None };

/// A data frame being read into its slot.
#[derive(Clone, Copy)]
struct In {
    len: u32,
    desc: Desc,
    got: usize,
    net: Option<EventId>,
}

struct Sock {
    /// Owns `fd`: closed when the link is dropped.
    _stream: TcpStream,
    fd: RawFd,
    /// Next data message this socket sends (k, k + nsocks, …) and the frame in progress.
    tx_m: u64,
    out: Option<Out>,
    /// Set by close or failure: the control frame (state) to send after the data, if any.
    end: Option<u32>,
    /// The control frame went out (or the socket failed): nothing more to write.
    tx_done: bool,
    /// Writing failed: what was posted for this socket will never reach the peer.
    tx_failed: bool,
    /// Next data message this socket receives, the frame being read, and bytes read ahead
    /// (`stage[lo..hi]`) while looking for headers.
    rx_m: u64,
    inp: Option<In>,
    stage: Box<[u8]>,
    lo: usize,
    hi: usize,
    /// CLOSE or ABORT seen, or the stream ended: read no more.
    rx_done: bool,
}

/// One peer's tcp connection: its FIFOs' regions and its sockets' cursors. Driven by the
/// collective thread through `Net`; shared with `Peer` for close and failure.
pub(crate) struct TcpLink {
    peer: usize,
    socks: Vec<Sock>,
    send_region: Arc<Region>,
    recv_region: Arc<Region>,
    nslots: usize,
    slot_size: usize,
    timeout: Duration,
    /// Sockets that delivered a CLOSE frame.
    closes: usize,
    /// The first message that can no longer arrive: the lowest next message of the sockets
    /// whose stream ended without CLOSE (the peer died or exited). Everything before it that
    /// the other sockets carry is still read and delivered.
    lost_at: Option<u64>,
    /// The state and cause of the first ABORT frame read, until the link ends with them
    /// (`settle_abort`).
    aborted: Option<(u32, Option<Cause>)>,
    /// The peer is gone (or closed, or failed) and both FIFOs say so: no more I/O.
    dead: bool,
    closed: bool,
    /// Profiler events of the socket requests (NetPlugin) and the ProxySteps they belong to.
    prof: Option<NetProf>,
    tx_steps: Arc<[AtomicU64]>,
    rx_steps: Arc<[AtomicU64]>,
}

/// What the link needs to emit NetPlugin events.
#[derive(Clone)]
pub(crate) struct NetProf {
    pub fanout: Arc<Fanout>,
    pub rank: i32,
}

/// NCCL's `pluginId` for the socket payload: net type SOCK (2 << 16), payload version 1.
const NET_SOCK_V1: i64 = (2 << 16) | 1;
/// The payload's `op`: the request is a send or a receive.
const SOCK_OP_SEND: i32 = 0;
const SOCK_OP_RECV: i32 = 1;

impl NetProf {
    /// Starts the NetPlugin event of one socket request (`len` bytes of data on `fd`) under the
    /// ProxyStep `parent` (0 if no step is known), with NCCL's 24-byte socket payload
    /// (type 1, fd, op, length).
    fn start(&self, parent: u64, fd: RawFd, op: i32, len: usize) -> Option<EventId> {
        if !self.fanout.enabled(EventType::NetPlugin) {
            return None;
        }
        let mut data = [0u8; 24];
        data[0] = 1;
        data[8..12].copy_from_slice(&fd.to_ne_bytes());
        data[12..16].copy_from_slice(&op.to_ne_bytes());
        data[16..24].copy_from_slice(&(len as u64).to_ne_bytes());
        let parent = std::num::NonZeroU64::new(parent).map(EventId);
        self.fanout.start(parent, &EventDescr::NetPlugin { rank: self.rank, id: NET_SOCK_V1, data: &data })
    }

    fn stop(&self, id: Option<EventId>) {
        if let Some(id) = id {
            self.fanout.stop(id);
        }
    }
}

pub(crate) type SharedLink = Arc<Mutex<TcpLink>>;

fn setsockopt_int(fd: RawFd, level: libc::c_int, name: libc::c_int, v: libc::c_int) -> io::Result<()> {
    // SAFETY: a valid descriptor and a c_int option value.
    let r = unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            &v as *const libc::c_int as *const libc::c_void,
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// One non-blocking sendmsg of `iov`; `Ok(None)` when the socket buffer is full.
fn sendv(fd: RawFd, iov: &[libc::iovec]) -> io::Result<Option<usize>> {
    // SAFETY: a zeroed msghdr is valid; it points at iovecs of live buffers.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = iov.as_ptr() as *mut libc::iovec;
    msg.msg_iovlen = iov.len() as _;
    // SAFETY: as above; MSG_NOSIGNAL so a dead peer is an EPIPE, not a SIGPIPE.
    nonblocking(|| unsafe { libc::sendmsg(fd, &msg, libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL) })
}

/// Message `m`'s frame if it can be sent: its slot once posted (unless the rank failed: then
/// no more data), else the control frame once `end` is set.
fn next_frame(region: &Region, end: Option<u32>, m: u64, nslots: usize, slot_size: usize) -> Option<Out> {
    let i = slot_of(m, nslots);
    let hdr = region.slot_hdr(i);
    if end.is_none_or(|e| e == state::CLOSED) && hdr.seq.load(Ordering::Acquire) == seq_of(m) {
        let raw = hdr.len;
        let (len, src) = if raw & fifo::PTR_FLAG != 0 {
            // SAFETY: a pointer slot holds the data's 8-byte address; the sender keeps the
            // memory unchanged until the slot is acknowledged (its `drain`).
            let addr = unsafe { std::ptr::read(region.slot_data(i) as *const u64) };
            (((raw & !fifo::PTR_FLAG) as usize).min(slot_size), addr as usize)
        } else {
            ((raw as usize).min(slot_size), region.slot_data(i) as usize)
        };
        return Some(Out {
            hdr: encode(seq_of(m), KIND_DATA, len as u32, &hdr.desc),
            len,
            off: 0,
            data: true,
            src,
            net: None,
        });
    }
    let e = end?;
    let kind = if e == state::CLOSED { KIND_CLOSE } else { KIND_ABORT };
    // The cause this rank marked its send end with before it aborted the link (`Peer::fail`).
    let cause = Cause::encode(region.header().sender().cause);
    let d = Desc { opseq: cause as u32, root: (cause >> 32) as u32, ..Desc::default() };
    Some(Out { hdr: encode(seq_of(m), kind, e, &d), len: 0, off: 0, data: false, src: 0, net: None })
}

/// One non-blocking recv; `Ok(None)` when nothing is there, `Ok(Some(0))` at end of stream.
/// Runs a non-blocking socket call: the byte count, `None` when it would block (EAGAIN), and
/// a retry when a signal interrupted it.
fn nonblocking(mut call: impl FnMut() -> isize) -> io::Result<Option<usize>> {
    loop {
        let n = call();
        if n >= 0 {
            return Ok(Some(n as usize));
        }
        let e = io::Error::last_os_error();
        match e.kind() {
            io::ErrorKind::Interrupted => {}
            io::ErrorKind::WouldBlock => return Ok(None),
            _ => return Err(e),
        }
    }
}

fn recv1(fd: RawFd, buf: *mut u8, len: usize) -> io::Result<Option<usize>> {
    // SAFETY: the caller passes `len` writable bytes at `buf`.
    nonblocking(|| unsafe { libc::recv(fd, buf.cast(), len, libc::MSG_DONTWAIT) })
}

fn set_send_state(r: &Region, s: u32, cause: Option<Cause>) {
    let h = r.header();
    Notice::mark(&h.send_state.0, &h.send_cause, s, cause);
    for i in 0..h.nslots as usize {
        wait::wake(&r.slot_hdr(i).seq, &h.recv_sleepers.0);
    }
}

fn set_recv_state(r: &Region, s: u32, cause: Option<Cause>) {
    let h = r.header();
    Notice::mark(&h.recv_state.0, &h.recv_cause, s, cause);
    for i in 0..h.nslots as usize {
        wait::wake(&r.slot_hdr(i).ack, &h.send_sleepers.0);
    }
}

impl TcpLink {
    /// Stops the ProxySteps handed to this link that it will never write (the operation
    /// failed), so no event stays open.
    pub(crate) fn sweep_steps(&self) {
        if let Some(p) = &self.prof {
            for t in self.tx_steps.iter() {
                p.stop(std::num::NonZeroU64::new(t.swap(0, Ordering::Relaxed)).map(EventId));
            }
        }
    }

    /// Sets up the link to `peer` over `sockets` (connected and authenticated, in the same
    /// order on both sides). Returns the FIFO ends for the collective code.
    pub(crate) fn start(
        peer: usize,
        sockets: Vec<TcpStream>,
        nslots: usize,
        slot_size: usize,
        timeout: Duration,
        prof: Option<NetProf>,
    ) -> Result<(SharedLink, fifo::SendFifo, fifo::RecvFifo)> {
        let len = fifo::region_size(nslots, slot_size);
        let send_region = Arc::new(Region::map(-1, len)?);
        send_region.init(nslots, slot_size, 0, 0);
        let recv_region = Arc::new(Region::map(-1, len)?);
        recv_region.init(nslots, slot_size, 0, 0);
        let mut socks = Vec::with_capacity(sockets.len());
        for (k, s) in sockets.into_iter().enumerate() {
            let io = |e| Error::sys(format!("tcp transport to rank {peer}: configure socket"), e);
            s.set_nodelay(true).map_err(io)?;
            let fd = s.as_raw_fd();
            for opt in [libc::SO_SNDBUF, libc::SO_RCVBUF] {
                // Best effort: the kernel caps it at net.core.[rw]mem_max.
                let _ = setsockopt_int(fd, libc::SOL_SOCKET, opt, SOCK_BUF);
            }
            socks.push(Sock {
                _stream: s,
                fd,
                tx_m: k as u64,
                out: None,
                end: None,
                tx_done: false,
                tx_failed: false,
                rx_m: k as u64,
                inp: None,
                stage: vec![0u8; STAGE].into_boxed_slice(),
                lo: 0,
                hi: 0,
                rx_done: false,
            });
        }
        let link = TcpLink {
            peer,
            socks,
            send_region: send_region.clone(),
            recv_region: recv_region.clone(),
            nslots,
            slot_size,
            timeout,
            closes: 0,
            lost_at: None,
            aborted: None,
            dead: false,
            closed: false,
            prof,
            tx_steps: (0..nslots).map(|_| AtomicU64::new(0)).collect(),
            rx_steps: (0..nslots).map(|_| AtomicU64::new(0)).collect(),
        };
        let mut send = fifo::SendFifo::new(send_region, Patience::Drive);
        let mut recv = fifo::RecvFifo::new(recv_region, Patience::Drive);
        send.net_steps = Some(link.tx_steps.clone());
        recv.net_steps = Some(link.rx_steps.clone());
        let link = Arc::new(Mutex::new(link));
        exit::register(&link);
        Ok((link, send, recv))
    }

    /// Does all the non-blocking I/O it can; true if anything moved. A failure ends the link:
    /// both FIFOs get the state that every wait on this peer then reports.
    /// `ready` holds a zero-timeout poll(2) result per socket (see `Net::progress`): a socket
    /// with no event is not read, only its data already read ahead is delivered.
    fn progress(&mut self, ready: &[libc::pollfd]) -> bool {
        if self.dead {
            return false;
        }
        let mut moved = false;
        for k in 0..self.socks.len() {
            let readable = ready.get(k).is_none_or(|p| p.revents != 0);
            moved |= self.tx_or_fail(k);
            if !self.dead {
                moved |= self.rx_or_end(k, readable);
            }
            if self.dead {
                return true;
            }
        }
        moved | self.settle_abort()
    }

    /// `tx` on socket `k`; a failure loses what this rank still sends to the peer (every send
    /// wait on it fails), but not what the peer sent: the receive side goes on to its own end.
    fn tx_or_fail(&mut self, k: usize) -> bool {
        match self.tx(k) {
            Ok(m) => m,
            Err(e) => {
                tracing::debug!("tcp transport to rank {}: sending: {e}; the connection is lost", self.peer);
                let s = &mut self.socks[k];
                s.tx_done = true;
                s.tx_failed = true;
                if let Some(p) = &self.prof {
                    p.stop(s.out.take().and_then(|o| o.net));
                }
                set_recv_state(&self.send_region, state::LOST, None);
                true
            }
        }
    }

    /// `rx` on socket `k`. The end of its stream (end of file, reset, any socket error) is the
    /// end of this socket only: TCP delivered everything before it, and the other sockets may
    /// still hold data that was sent earlier. Malformed data ends the link at once.
    fn rx_or_end(&mut self, k: usize, readable: bool) -> bool {
        match self.rx(k, readable) {
            Ok(m) => {
                if m && self.lost_at.is_some() {
                    self.check_rx_ends();
                }
                m
            }
            Err(e) if e.kind() == io::ErrorKind::InvalidData => {
                self.lost();
                true
            }
            Err(e) => {
                tracing::debug!("tcp transport from rank {}: socket {k}: {e}", self.peer);
                let s = &mut self.socks[k];
                s.rx_done = true;
                if let Some(p) = &self.prof {
                    p.stop(s.inp.take().and_then(|i| i.net));
                }
                let m = s.rx_m;
                self.lost_at = Some(self.lost_at.map_or(m, |l| l.min(m)));
                self.check_rx_ends();
                true
            }
        }
    }

    /// Ends the link once nothing more can be delivered: every socket closed (CLOSE on all:
    /// the peer destroyed its communicator), or a socket's stream was cut at message `lost_at`
    /// and every other socket has delivered all it carried before that message.
    fn check_rx_ends(&mut self) {
        if self.dead {
            return;
        }
        match self.lost_at {
            Some(m) if self.socks.iter().all(|s| s.rx_done || s.rx_m > m) => self.lost(),
            None if self.closes == self.socks.len() => self.end_link(state::CLOSED, None),
            _ => {}
        }
    }

    /// Ends the link after an ABORT frame, once the frames that the peer wrote before it on its
    /// other sockets are read: it writes every socket's frames in turn, so an ABORT on one can
    /// overtake data on another, and that data (a descriptor that explains the failure, say) is
    /// still delivered, as shm delivers what was published before a failure.
    fn settle_abort(&mut self) -> bool {
        let Some((s, cause)) = self.aborted.take() else { return false };
        for k in 0..self.socks.len() {
            // Whatever has arrived; a socket that ends or fails has nothing more to give.
            let _ = self.rx(k, true);
        }
        self.end_link(s, cause);
        true
    }

    /// The connection is lost (a socket's stream was cut, or malformed data came), unless the
    /// peer said why first (an ABORT on another socket), which is then what every wait reports.
    fn lost(&mut self) {
        match self.aborted.take() {
            Some((s, cause)) => self.end_link(s, cause),
            None => self.end_link(state::LOST, None),
        }
    }

    /// The peer is gone, closed or failed (`s`, with the `cause` its ABORT gave): every wait on
    /// it, either way, ends with `s`. Data already published in the receive FIFO is still
    /// delivered.
    fn end_link(&mut self, s: u32, cause: Option<Cause>) {
        self.dead = true;
        if let Some(p) = &self.prof {
            for k in &mut self.socks {
                p.stop(k.out.take().and_then(|o| o.net));
                p.stop(k.inp.take().and_then(|i| i.net));
            }
        }
        set_send_state(&self.recv_region, s, cause);
        set_recv_state(&self.send_region, s, cause);
    }

    /// Writes posted slots (and, once `end` is set, the control frame) to socket `k`, as many
    /// frames per system call as are ready: with small slots, one `sendmsg` per frame costs
    /// more in the kernel's transmit path than the copying.
    fn tx(&mut self, k: usize) -> io::Result<bool> {
        let (nslots, slot_size, nsocks) = (self.nslots, self.slot_size, self.socks.len() as u64);
        let region = &self.send_region;
        let (prof, steps) = (self.prof.as_ref(), &self.tx_steps);
        let s = &mut self.socks[k];
        let mut moved = false;
        while !s.tx_done {
            // The frame in progress (always message tx_m, or the control frame), then the ones
            // ready after it.
            let mut frames = [NO_FRAME; BATCH];
            let mut nf = 0;
            if let Some(o) = s.out {
                frames[0] = o;
                nf = 1;
            }
            while nf < BATCH && (nf == 0 || frames[nf - 1].data) {
                match next_frame(region, s.end, s.tx_m + nf as u64 * nsocks, nslots, slot_size) {
                    Some(o) => frames[nf] = o,
                    None => break,
                }
                nf += 1;
            }
            if nf == 0 {
                break;
            }
            let mut iov = [libc::iovec { iov_base: std::ptr::null_mut(), iov_len: 0 }; 2 * BATCH];
            let mut ni = 0;
            for o in &frames[..nf] {
                if o.off < FRAME_HDR {
                    iov[ni] = libc::iovec { iov_base: o.hdr[o.off..].as_ptr() as *mut _, iov_len: FRAME_HDR - o.off };
                    ni += 1;
                }
                let skip = o.off.saturating_sub(FRAME_HDR);
                if o.len > skip {
                    // The slot (or the buffer it points to) is published and not acknowledged,
                    // so the collective code does not touch it until we store `ack` below.
                    iov[ni] = libc::iovec { iov_base: (o.src + skip) as *mut _, iov_len: o.len - skip };
                    ni += 1;
                }
            }
            let Some(mut n) = sendv(s.fd, &iov[..ni])? else { break };
            moved = true;
            for o in &mut frames[..nf] {
                let rest = FRAME_HDR + o.len - o.off;
                // A frame of no data (a descriptor alone, `coll::rooted`) is no socket request.
                if let (Some(p), true, None, true) = (prof, o.data && o.len > 0, o.net, n > 0) {
                    let step = steps[slot_of(s.tx_m, nslots)].load(Ordering::Relaxed);
                    o.net = p.start(step, s.fd, SOCK_OP_SEND, o.len);
                }
                if n < rest {
                    // The socket buffer is full: wait for the peer to read.
                    o.off += n;
                    s.out = Some(*o);
                    return Ok(moved);
                }
                n -= rest;
                s.out = None;
                if o.data {
                    // The request completed: its NetPlugin event, then the ProxyStep it moved.
                    if let Some(p) = prof {
                        p.stop(o.net);
                        let step = steps[slot_of(s.tx_m, nslots)].swap(0, Ordering::Relaxed);
                        p.stop(std::num::NonZeroU64::new(step).map(EventId));
                    }
                    let hdr = region.slot_hdr(slot_of(s.tx_m, nslots));
                    hdr.ack.store(seq_of(s.tx_m), Ordering::SeqCst);
                    wait::wake(&hdr.ack, &region.header().send_sleepers.0);
                    s.tx_m += nsocks;
                } else {
                    s.tx_done = true;
                }
            }
        }
        Ok(moved)
    }

    /// Whether receive slot for message `m` is free (acknowledged by the consumer, or unused).
    fn rx_slot_free(&self, m: u64) -> bool {
        let n = self.nslots as u64;
        m < n || self.recv_region.slot_hdr(slot_of(m, self.nslots)).ack.load(Ordering::Acquire) == seq_of(m - n)
    }

    /// Reads frames from socket `k` into free receive slots and publishes them (`readable`:
    /// the socket may have data; if not, only bytes already read ahead are delivered).
    fn rx(&mut self, k: usize, readable: bool) -> io::Result<bool> {
        let nsocks = self.socks.len() as u64;
        let mut moved = false;
        // The last read came back short: the socket is empty, do not ask again this round.
        let mut drained = !readable;
        loop {
            let (free, m) = (self.rx_slot_free(self.socks[k].rx_m), self.socks[k].rx_m);
            let s = &mut self.socks[k];
            if s.rx_done {
                return Ok(moved);
            }
            if let Some(mut f) = s.inp {
                if !free {
                    return Ok(moved);
                }
                let i = slot_of(m, self.nslots);
                let data = self.recv_region.slot_data(i);
                let need = f.len as usize - f.got;
                if s.hi > s.lo {
                    let n = need.min(s.hi - s.lo);
                    // SAFETY: the slot is free (we own it until `seq` is published) and holds
                    // slot_size >= len bytes.
                    unsafe { std::ptr::copy_nonoverlapping(s.stage[s.lo..].as_ptr(), data.add(f.got), n) };
                    s.lo += n;
                    f.got += n;
                } else if need > 0 {
                    if drained {
                        s.inp = Some(f);
                        return Ok(moved);
                    }
                    // SAFETY: as above, the rest of this frame's bytes in the slot.
                    match recv1(s.fd, unsafe { data.add(f.got) }, need)? {
                        None => {
                            s.inp = Some(f);
                            return Ok(moved);
                        }
                        Some(0) => return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "end of stream mid-frame")),
                        Some(n) => {
                            moved = true;
                            drained = n < need;
                            f.got += n;
                        }
                    }
                }
                if f.got < f.len as usize {
                    s.inp = Some(f);
                    continue;
                }
                s.inp = None;
                if let Some(p) = &self.prof {
                    p.stop(f.net);
                    self.rx_steps[i].store(0, Ordering::Relaxed);
                }
                let raw = data.wrapping_sub(fifo::SLOT_HDR) as *mut fifo::SlotHdr;
                // SAFETY: as above; len/desc are read by the consumer only after it sees `seq`.
                unsafe {
                    (*raw).len = f.len;
                    (*raw).desc = f.desc;
                }
                let hdr = self.recv_region.slot_hdr(i);
                hdr.seq.store(seq_of(m), Ordering::SeqCst);
                wait::wake(&hdr.seq, &self.recv_region.header().recv_sleepers.0);
                s.rx_m += nsocks;
                moved = true;
                continue;
            }
            if s.hi - s.lo >= FRAME_HDR {
                let (seq, kind, len, desc) = decode(&s.stage[s.lo..s.lo + FRAME_HDR]);
                s.lo += FRAME_HDR;
                match kind {
                    KIND_DATA if seq == seq_of(m) && len as usize <= self.slot_size => {
                        let net = self.prof.as_ref().filter(|_| len > 0).and_then(|p| {
                            let step = self.rx_steps[slot_of(m, self.nslots)].load(Ordering::Relaxed);
                            p.start(step, s.fd, SOCK_OP_RECV, len as usize)
                        });
                        s.inp = Some(In { len, desc, got: 0, net });
                        continue;
                    }
                    KIND_CLOSE => {
                        // The peer flushed everything on this socket. Only when every socket
                        // has closed is it known to have sent all it will send.
                        s.rx_done = true;
                        self.closes += 1;
                        self.check_rx_ends();
                        return Ok(true);
                    }
                    KIND_ABORT => {
                        let st = if len == state::OPEN || len == state::CLOSED { state::ABORTED } else { len };
                        let cause = Cause::decode(u64::from(desc.opseq) | (u64::from(desc.root) << 32));
                        s.rx_done = true;
                        self.aborted.get_or_insert((st, cause));
                        return Ok(true);
                    }
                    _ => {
                        tracing::warn!(
                            "tcp transport from rank {}: malformed frame (kind {kind}, seq {seq} expected {}, len {len}); dropping the connection",
                            self.peer,
                            seq_of(m)
                        );
                        return Err(io::ErrorKind::InvalidData.into());
                    }
                }
            }
            if drained {
                return Ok(moved);
            }
            s.stage.copy_within(s.lo..s.hi, 0);
            s.hi -= s.lo;
            s.lo = 0;
            let room = STAGE - s.hi;
            // SAFETY: `room` bytes of the stage buffer from `hi`.
            match recv1(s.fd, unsafe { s.stage.as_mut_ptr().add(s.hi) }, room)? {
                None => return Ok(moved),
                Some(0) if s.hi == 0 => {
                    // End of stream without a CLOSE frame: the process is gone.
                    return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "end of stream without CLOSE"));
                }
                Some(0) => return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "end of stream mid-header")),
                Some(n) => {
                    moved = true;
                    drained = n < room;
                    s.hi += n;
                }
            }
        }
    }

    /// Socket `s` has a posted slot not yet fully written.
    fn pending(&self, s: &Sock) -> bool {
        s.out.is_some_and(|o| o.data)
            || self.send_region.slot_hdr(slot_of(s.tx_m, self.nslots)).seq.load(Ordering::Acquire) == seq_of(s.tx_m)
    }

    /// Some posted slot is not yet fully written to a socket that can still write it.
    fn unsent(&self) -> bool {
        self.socks.iter().any(|s| !s.tx_done && self.pending(s))
    }

    /// Some posted slot will never be written: its socket failed, or the link ended.
    fn lost_unsent(&self) -> bool {
        self.socks.iter().any(|s| (s.tx_failed || (self.dead && !s.tx_done)) && self.pending(s))
    }

    /// The poll(2) interest of each socket: readable while a free slot can take what comes,
    /// writable while something waits to be written.
    fn poll_fds(&self, fds: &mut Vec<libc::pollfd>) {
        if self.dead {
            return;
        }
        for s in &self.socks {
            let mut events = 0;
            if !s.rx_done && (s.inp.is_none() || self.rx_slot_free(s.rx_m)) {
                events |= libc::POLLIN;
            }
            let posted =
                self.send_region.slot_hdr(slot_of(s.tx_m, self.nslots)).seq.load(Ordering::Acquire) == seq_of(s.tx_m);
            if !s.tx_done && (s.out.is_some() || s.end.is_some() || posted) {
                events |= libc::POLLOUT;
            }
            if events != 0 {
                fds.push(libc::pollfd { fd: s.fd, events, revents: 0 });
            }
        }
    }

    /// On failure (without blocking): stop sending data and try once to tell the peer why.
    pub(crate) fn abort(&mut self, how: u32) {
        if self.dead || self.closed {
            return;
        }
        for s in &mut self.socks {
            s.end.get_or_insert(how);
        }
        for k in 0..self.socks.len() {
            if self.tx(k).is_err() {
                break;
            }
        }
    }

    /// Flushes what was posted (bounded by the timeout; a failing rank only tries briefly to
    /// send its ABORT), sends CLOSE or ABORT on every socket and shuts the sockets down.
    pub(crate) fn close(&mut self, how: u32) {
        if self.closed {
            return;
        }
        self.closed = true;
        let wait = if how == state::CLOSED { self.timeout } else { self.timeout.min(ABORT_WAIT) };
        let until = Instant::now() + wait;
        if !self.dead {
            for s in &mut self.socks {
                s.end.get_or_insert(how);
            }
            loop {
                let mut fds = Vec::new();
                for k in 0..self.socks.len() {
                    if let Err(e) = self.tx(k) {
                        tracing::debug!("tcp transport to rank {}: closing: {e}", self.peer);
                        self.socks[k].tx_done = true;
                    }
                    let s = &self.socks[k];
                    if !s.tx_done {
                        fds.push(libc::pollfd { fd: s.fd, events: libc::POLLOUT, revents: 0 });
                    }
                }
                let left = until.saturating_duration_since(Instant::now());
                if fds.is_empty() || left.is_zero() {
                    break;
                }
                // Frames still queued: the peer is not reading. Stop if it went away.
                for k in 0..self.socks.len() {
                    if !self.dead && !self.socks[k].rx_done {
                        self.rx_or_end(k, true);
                    }
                }
                self.settle_abort();
                if self.dead {
                    break;
                }
                poll(&mut fds, left.min(Duration::from_millis(10)));
            }
        }
        // A peer that is gone or closed reads nothing more: do not wait for it.
        let fds: Vec<RawFd> = self.socks.iter().map(|s| s.fd).collect();
        if !linger(&fds, if self.dead { Instant::now() } else { until }) {
            tracing::debug!("tcp transport to rank {}: closed before the peer took all this rank sent", self.peer);
        }
        self.dead = true;
        tracing::trace!("tcp link to rank {} closed", self.peer);
    }

    /// At process exit without `destroy`: the sockets to linger on (see `exit`), or none if
    /// the link was closed or its peer is gone. Sends no CLOSE: the communicator was not
    /// destroyed, and the peer learns that this rank is gone once it has read its data.
    fn leave(&mut self) -> Vec<RawFd> {
        if self.closed || self.dead {
            return Vec::new();
        }
        self.closed = true;
        self.dead = true;
        self.socks.iter().map(|s| s.fd).collect()
    }
}

/// Whether socket `fd` may still hand data to the peer: it holds bytes that the peer's kernel
/// has not acknowledged, and the connection is not closed (after a reset the kernel has
/// dropped them and the count never goes down).
fn still_sending(fd: RawFd) -> bool {
    let mut n: libc::c_int = 0;
    // SAFETY: TIOCOUTQ (SIOCOUTQ for a TCP socket) stores one int.
    if unsafe { libc::ioctl(fd, libc::TIOCOUTQ, &mut n as *mut libc::c_int) } != 0 || n == 0 {
        return false;
    }
    // SAFETY: a zeroed tcp_info is valid; getsockopt writes at most `len` bytes into it.
    let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
    // SAFETY: as above.
    let r = unsafe {
        libc::getsockopt(fd, libc::IPPROTO_TCP, libc::TCP_INFO, (&mut info as *mut libc::tcp_info).cast(), &mut len)
    };
    r == 0 && info.tcpi_state != TCP_CLOSE
}

/// `TCP_CLOSE` of the kernel's TCP states (`tcp_info.tcpi_state`).
const TCP_CLOSE: u8 = 7;

/// Ends the sockets `fds` (already drained of frames) so that what they hold still reaches the
/// peer: FIN after the data, then, until `until`, reads and drops whatever comes in while the
/// peer's kernel has not acknowledged everything. Closing a socket that holds unread input
/// resets the connection, and a reset drops what the kernel had not sent yet (the peer keeps
/// what it received, so once nothing is unacknowledged a reset loses nothing). True when every
/// socket got there (or failed: its peer is gone).
fn linger(fds: &[RawFd], until: Instant) -> bool {
    for &fd in fds {
        // SAFETY: a socket descriptor this link owns.
        unsafe { libc::shutdown(fd, libc::SHUT_WR) };
    }
    let mut open: Vec<(RawFd, bool)> = fds.iter().map(|&fd| (fd, false)).collect();
    let mut junk = vec![0u8; 64 << 10];
    loop {
        open.retain_mut(|(fd, eof)| {
            // Bounded per round, so a peer that floods us cannot keep us past `until`.
            for _ in 0..64 {
                match recv1(*fd, junk.as_mut_ptr(), junk.len()) {
                    Ok(Some(0)) => *eof = true,
                    Ok(Some(_)) => continue,
                    Ok(None) => {}
                    Err(_) => return false,
                }
                break;
            }
            still_sending(*fd)
        });
        let left = until.saturating_duration_since(Instant::now());
        if open.is_empty() || left.is_zero() {
            return open.is_empty();
        }
        // Input wakes us; the peer's acknowledgements do not, so look again soon.
        let mut pfds: Vec<libc::pollfd> = open
            .iter()
            .filter(|(_, eof)| !eof)
            .map(|&(fd, _)| libc::pollfd { fd, events: libc::POLLIN, revents: 0 })
            .collect();
        poll(&mut pfds, left.min(Duration::from_millis(2)));
    }
}

/// Process exit without `destroy`: returning from `main` or calling `exit` runs no destructor
/// of a communicator that is still alive, and the kernel's own close of its sockets can lose
/// data (see `linger`). An `atexit` handler lingers on every live link instead.
mod exit {
    use super::{SharedLink, TcpLink};
    use std::sync::{Mutex, Once, TryLockError, Weak};
    use std::time::{Duration, Instant};

    static LINKS: Mutex<Vec<Weak<Mutex<TcpLink>>>> = Mutex::new(Vec::new());

    pub(super) fn register(link: &SharedLink) {
        static ONCE: Once = Once::new();
        ONCE.call_once(|| {
            // SAFETY: a plain `extern "C" fn()` that lives as long as the program. Failure only
            // loses the guarantee at exit (destroy still flushes), so it is not an error.
            if unsafe { libc::atexit(at_exit) } != 0 {
                tracing::warn!("occl: atexit failed; tcp sends may be lost if the process exits without destroy");
            }
        });
        let mut links = crate::sync::lock(&LINKS);
        links.retain(|w| w.strong_count() > 0);
        links.push(std::sync::Arc::downgrade(link));
    }

    extern "C" fn at_exit() {
        // Never unwind into C, and log nothing through `tracing` (its thread-locals are gone).
        let _ = std::panic::catch_unwind(|| {
            let start = Instant::now();
            let links: Vec<_> = crate::sync::lock(&LINKS).iter().filter_map(Weak::upgrade).collect();
            // Every link at once: two links of this process may be each other's peers, and each
            // must drain the other's input while both wait.
            let (mut guards, mut fds, mut wait) = (Vec::new(), Vec::new(), Duration::ZERO);
            for l in &links {
                // Another thread may be inside an operation on this link: it holds the lock for
                // one step of I/O at a time.
                let mut link = loop {
                    match l.try_lock() {
                        Ok(g) => break Some(g),
                        Err(TryLockError::Poisoned(p)) => break Some(p.into_inner()),
                        Err(TryLockError::WouldBlock) if start.elapsed() < Duration::from_secs(1) => {
                            std::thread::sleep(Duration::from_millis(1))
                        }
                        Err(TryLockError::WouldBlock) => break None,
                    }
                };
                let Some(mut link) = link.take() else { continue };
                wait = wait.max(link.timeout);
                fds.extend(link.leave());
                // Held until the sockets are done: nobody else writes to them meanwhile.
                guards.push(link);
            }
            if !fds.is_empty() && !super::linger(&fds, start + wait) {
                let _ = std::io::Write::write_all(
                    &mut std::io::stderr(),
                    b"occl: at exit: a tcp peer did not take all that this process sent it within OCCL_TIMEOUT; the rest is lost\n",
                );
            }
            drop(guards);
        });
    }
}

/// Every tcp link of one communicator: what the collective thread drives while it waits.
pub(crate) struct Net {
    links: Vec<SharedLink>,
    /// `progress`'s poll(2) array, kept between calls.
    fds: Mutex<Vec<libc::pollfd>>,
    /// Sockets of all links.
    sockets: usize,
}

/// From this many sockets on, `progress` asks poll(2) which to read rather than trying each:
/// with 2 (one peer) a poll and then a read cost more than two reads (2-rank 64 B-4 KiB
/// all-reduce 4.3 -> 4.9 µs); with 6 (4 ranks) the poll saves four calls a round (8 B: tree
/// 40 -> 33 µs, ring 41 -> 34).
const POLL_FIRST: usize = 3;

impl Net {
    pub(crate) fn new(links: Vec<SharedLink>) -> Net {
        let sockets = links.iter().map(|l| lock(l).socks.len()).sum();
        Net { links, fds: Mutex::new(Vec::new()), sockets }
    }

    /// Keeps driving the sockets until every posted slot is written to its socket (the kernel
    /// delivers it from there), so an operation can return without leaving data behind that
    /// nobody would send. Bounded by `deadline`; fails if a peer with pending data is gone.
    pub(crate) fn flush(&self, abort: &AtomicBool, deadline: &Deadline) -> Result<()> {
        if self.busy() {
            let mut check = |_slow: bool| -> Result<()> {
                if abort.load(Ordering::Relaxed) {
                    return Err(Error::usage("the communicator was aborted"));
                }
                Ok(())
            };
            let unused = AtomicU32::new(0);
            wait::wait_until(
                wait::driven(Some(self as &dyn Drive), || !self.busy()),
                &unused,
                &unused,
                &mut check,
                deadline,
                Patience::Drive,
                &|| {
                    let to: Vec<usize> =
                        self.links.iter().map(|l| lock(l)).filter(|l| l.unsent()).map(|l| l.peer).collect();
                    format!("flushing sends to rank(s) {to:?}")
                },
                None,
            )?;
        }
        // A peer that went away with data of ours unsent: say which and why.
        for l in &self.links {
            let l = lock(l);
            if l.lost_unsent() {
                return Err(l.send_region.header().receiver().error(l.peer));
            }
        }
        Ok(())
    }
}

impl Drive for Net {
    /// One zero-timeout poll(2) over every socket says which to read: a waiting rank calls this
    /// in a loop, and a recv(2) per socket that finds nothing costs as much as the poll (4
    /// ranks over tcp: 6 sockets, 6 system calls a round where one does).
    fn progress(&self) -> bool {
        if self.sockets < POLL_FIRST {
            let mut moved = false;
            for l in &self.links {
                moved |= lock(l).progress(&[]);
            }
            return moved;
        }
        let mut fds = lock(&self.fds);
        fds.clear();
        for l in &self.links {
            for s in &lock(l).socks {
                let events = if s.rx_done { 0 } else { libc::POLLIN };
                fds.push(libc::pollfd { fd: s.fd, events, revents: 0 });
            }
        }
        poll(&mut fds, Duration::ZERO);
        let (mut moved, mut at) = (false, 0);
        for l in &self.links {
            let mut l = lock(l);
            let n = l.socks.len();
            moved |= l.progress(fds.get(at..at + n).unwrap_or(&[]));
            at += n;
        }
        moved
    }

    fn block(&self, timeout: Duration) {
        let mut fds = Vec::with_capacity(self.links.len() * 2);
        for l in &self.links {
            lock(l).poll_fds(&mut fds);
        }
        poll(&mut fds, timeout);
    }

    fn busy(&self) -> bool {
        self.links.iter().any(|l| {
            let l = lock(l);
            !l.dead && l.unsent()
        })
    }

    fn flush_writes(&self, abort: &AtomicBool, deadline: &Deadline) -> Result<()> {
        Net::flush(self, abort, deadline)
    }
}
