//! The tcp transport: a FIFO in process memory on each side and proxy threads that move its
//! slots over `nsocks` sockets (slot m travels on socket m mod nsocks), as NCCL's proxy does
//! for its net transport. The collective code sees the same `SendFifo`/`RecvFifo` as for shm.
//!
//! Wire frame per slot: a 32-byte header (seq, kind, len, descriptor; little-endian) and `len`
//! bytes of data. Kind `ABORT` carries the sender's failure state instead of data, so the peer
//! learns why its sender stopped, not only that it did; kind `CLOSE` says it was destroyed.

use super::fifo::{self, state, Desc, Ends, Liveness, RecvFifo, Region, SendFifo};
use super::wait::{self, Deadline, Patience};
use crate::error::{Error, Result};
use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

const KIND_DATA: u32 = 0;
const KIND_ABORT: u32 = 1;
/// Sent after the last data frame when the peer destroys its communicator: an end of stream
/// without it means the process died (the kernel closes a killed process's sockets cleanly).
const KIND_CLOSE: u32 = 2;
const FRAME_HDR: usize = 32;
/// Proxy threads wait for the collective code without a bound of their own; they stop when
/// their FIFO's state changes or the socket closes.
const FOREVER: Duration = Duration::from_secs(365 * 24 * 3600);

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

fn decode(b: &[u8; FRAME_HDR]) -> (u32, u32, u32, Desc) {
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

/// The proxy side of one peer's tcp connection.
pub(crate) struct TcpLink {
    peer: usize,
    sockets: Vec<TcpStream>,
    send_region: Arc<Region>,
    recv_region: Arc<Region>,
    senders: Vec<JoinHandle<()>>,
    receivers: Vec<JoinHandle<()>>,
}

impl TcpLink {
    /// Starts the proxy threads for `peer` over `sockets` (already connected and authenticated,
    /// in the same order on both sides). Returns the FIFO ends for the collective code.
    pub(crate) fn start(
        peer: usize,
        sockets: Vec<TcpStream>,
        nslots: usize,
        slot_size: usize,
        timeout: Duration,
    ) -> Result<(TcpLink, SendFifo, RecvFifo)> {
        let len = fifo::region_size(nslots, slot_size);
        let send_region = Arc::new(Region::map(-1, len)?);
        send_region.init(nslots, slot_size, 0, 0);
        let recv_region = Arc::new(Region::map(-1, len)?);
        recv_region.init(nslots, slot_size, 0, 0);
        let nsocks = sockets.len();
        let clean_eofs = Arc::new(AtomicU32::new(0));
        let mut link = TcpLink {
            peer,
            sockets: Vec::new(),
            send_region: send_region.clone(),
            recv_region: recv_region.clone(),
            senders: Vec::new(),
            receivers: Vec::new(),
        };
        for (k, s) in sockets.into_iter().enumerate() {
            let io = |e| Error::sys(format!("tcp transport to rank {peer}: configure socket"), e);
            s.set_nodelay(true).map_err(io)?;
            s.set_write_timeout(Some(timeout)).map_err(io)?;
            let (ws, rs) = (s.try_clone().map_err(io)?, s.try_clone().map_err(io)?);
            link.sockets.push(s);
            let region = send_region.clone();
            link.senders.push(
                std::thread::Builder::new()
                    .name(format!("occl-proxy-tx{peer}.{k}"))
                    .spawn(move || send_loop(peer, k, nsocks, ws, &region))
                    .map_err(|e| Error::sys("spawn tcp proxy thread", e))?,
            );
            let region = recv_region.clone();
            let eofs = clean_eofs.clone();
            link.receivers.push(
                std::thread::Builder::new()
                    .name(format!("occl-proxy-rx{peer}.{k}"))
                    .spawn(move || recv_loop(peer, k, nsocks, rs, &region, &eofs))
                    .map_err(|e| Error::sys("spawn tcp proxy thread", e))?,
            );
        }
        Ok((link, SendFifo::new(send_region, Patience::Lazy), RecvFifo::new(recv_region, Patience::Lazy)))
    }

    /// Flushes what was posted (bounded by the socket write timeout), then closes the sockets
    /// and joins the proxy threads. `how` is the state the peer is told (closed or a failure).
    pub(crate) fn close(&mut self, how: u32) {
        set_send_state(&self.send_region, how);
        for t in self.senders.drain(..) {
            let _ = t.join();
        }
        set_recv_state(&self.recv_region, state::CLOSED);
        for s in &self.sockets {
            let _ = s.shutdown(Shutdown::Both);
        }
        for t in self.receivers.drain(..) {
            let _ = t.join();
        }
        tracing::trace!("tcp link to rank {} closed", self.peer);
    }
}

impl Drop for TcpLink {
    fn drop(&mut self) {
        if !self.senders.is_empty() || !self.receivers.is_empty() {
            self.close(state::CLOSED);
        }
    }
}

fn set_send_state(r: &Region, s: u32) {
    let h = r.header();
    let _ = h.send_state.0.compare_exchange(state::OPEN, s, Ordering::SeqCst, Ordering::SeqCst);
    for i in 0..h.nslots as usize {
        wait::wake(&r.slot_hdr(i).seq, &h.recv_sleepers.0);
    }
}

fn set_recv_state(r: &Region, s: u32) {
    let h = r.header();
    let _ = h.recv_state.0.compare_exchange(state::OPEN, s, Ordering::SeqCst, Ordering::SeqCst);
    for i in 0..h.nslots as usize {
        wait::wake(&r.slot_hdr(i).ack, &h.send_sleepers.0);
    }
}

fn write_frame(s: &mut TcpStream, hdr: &[u8], data: &[u8]) -> std::io::Result<()> {
    let mut bufs = [std::io::IoSlice::new(hdr), std::io::IoSlice::new(data)];
    let mut bufs: &mut [std::io::IoSlice<'_>] = &mut bufs;
    while !bufs.is_empty() {
        let n = s.write_vectored(bufs)?;
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        std::io::IoSlice::advance_slices(&mut bufs, n);
    }
    Ok(())
}

/// Drains slots k, k+nsocks, … of the send FIFO onto socket k.
fn send_loop(peer: usize, k: usize, nsocks: usize, mut sock: TcpStream, r: &Region) {
    let h = r.header();
    let nslots = h.nslots as usize;
    let never = AtomicBool::new(false);
    let mut m = k as u32;
    loop {
        let i = m as usize % nslots;
        let hdr = r.slot_hdr(i);
        let want = m.wrapping_add(1);
        let posted = || hdr.seq.load(Ordering::Acquire) == want;
        let stop = || h.send_state.0.load(Ordering::Acquire) != state::OPEN;
        let ends = Ends { peer, liveness: Liveness::Local, abort: &never };
        let _ = wait::wait_until(
            || posted() || stop(),
            &hdr.seq,
            &h.recv_sleepers.0,
            &mut |_| Ok(()),
            &Deadline::after(FOREVER),
            Patience::Lazy,
            &|| format!("tcp proxy to rank {}", ends.peer),
        );
        if posted() {
            let len = (hdr.len as usize).min(h.slot_size as usize);
            let frame = encode(want, KIND_DATA, len as u32, &hdr.desc);
            // SAFETY: the slot is published and not acknowledged, so the collective code will
            // not touch it until we store `ack` below.
            let data = unsafe { std::slice::from_raw_parts(r.slot_data(i), len) };
            if let Err(e) = write_frame(&mut sock, &frame, data) {
                tracing::debug!("tcp proxy to rank {peer}: send failed: {e}");
                set_recv_state(r, state::LOST);
                return;
            }
            hdr.ack.store(want, Ordering::SeqCst);
            wait::wake(&hdr.ack, &h.send_sleepers.0);
            m = m.wrapping_add(nsocks as u32);
            continue;
        }
        let s = h.send_state.0.load(Ordering::Acquire);
        let kind = if s == state::CLOSED { KIND_CLOSE } else { KIND_ABORT };
        let _ = write_frame(&mut sock, &encode(want, kind, s, &Desc::default()), &[]);
        let _ = sock.shutdown(Shutdown::Write);
        return;
    }
}

/// Fills slots k, k+nsocks, … of the receive FIFO from socket k.
fn recv_loop(peer: usize, k: usize, nsocks: usize, mut sock: TcpStream, r: &Region, clean_eofs: &AtomicU32) {
    let h = r.header();
    let (nslots, slot_size) = (h.nslots as usize, h.slot_size as usize);
    let never = AtomicBool::new(false);
    let mut m = k as u32;
    loop {
        let mut fh = [0u8; FRAME_HDR];
        match read_exact_or_eof(&mut sock, &mut fh) {
            Ok(true) => {}
            Ok(false) => {
                // End of stream without a CLOSE frame: the process is gone.
                if h.recv_state.0.load(Ordering::Acquire) == state::OPEN {
                    set_send_state(r, state::LOST);
                }
                return;
            }
            Err(e) => {
                if h.recv_state.0.load(Ordering::Acquire) == state::OPEN {
                    tracing::debug!("tcp proxy from rank {peer}: receive failed: {e}");
                    set_send_state(r, state::LOST);
                }
                return;
            }
        }
        let (seq, kind, len, desc) = decode(&fh);
        let want = m.wrapping_add(1);
        if kind == KIND_CLOSE {
            // The peer flushed everything on this socket. Only when every socket has closed is
            // the peer known to have sent all it will send.
            if clean_eofs.fetch_add(1, Ordering::SeqCst) + 1 == nsocks as u32 {
                set_send_state(r, state::CLOSED);
            }
            return;
        }
        if kind == KIND_ABORT {
            set_send_state(r, if len == state::OPEN || len == state::CLOSED { state::ABORTED } else { len });
            return;
        }
        if kind != KIND_DATA || seq != want || len as usize > slot_size {
            tracing::warn!(
                "tcp proxy from rank {peer}: malformed frame (kind {kind}, seq {seq} expected {want}, len {len}); dropping the connection"
            );
            set_send_state(r, state::LOST);
            return;
        }
        let i = m as usize % nslots;
        let hdr = r.slot_hdr(i);
        if m as usize >= nslots {
            let free = m.wrapping_sub(nslots as u32).wrapping_add(1);
            let ends = Ends { peer, liveness: Liveness::Local, abort: &never };
            let _ = wait::wait_until(
                || hdr.ack.load(Ordering::Acquire) == free || h.recv_state.0.load(Ordering::Acquire) != state::OPEN,
                &hdr.ack,
                &h.send_sleepers.0,
                &mut |_| Ok(()),
                &Deadline::after(FOREVER),
                Patience::Lazy,
                &|| format!("tcp proxy from rank {}", ends.peer),
            );
            if hdr.ack.load(Ordering::Acquire) != free {
                return;
            }
        }
        // SAFETY: the slot was acknowledged (or never used), so the collective code does not
        // read it until we publish `seq` below.
        let data = unsafe { std::slice::from_raw_parts_mut(r.slot_data(i), len as usize) };
        if let Err(e) = sock.read_exact(data) {
            if h.recv_state.0.load(Ordering::Acquire) == state::OPEN {
                tracing::debug!("tcp proxy from rank {peer}: receive failed mid-frame: {e}");
                set_send_state(r, state::LOST);
            }
            return;
        }
        let raw = r.slot_data(i).wrapping_sub(fifo::SLOT_HDR) as *mut fifo::SlotHdr;
        // SAFETY: as above; len/desc are read by the consumer only after it sees `seq`.
        unsafe {
            (*raw).len = len;
            (*raw).desc = desc;
        }
        hdr.seq.store(want, Ordering::SeqCst);
        wait::wake(&hdr.seq, &h.recv_sleepers.0);
        m = m.wrapping_add(nsocks as u32);
    }
}

/// Reads exactly `buf.len()` bytes; `Ok(false)` on a clean end of stream before the first byte.
fn read_exact_or_eof(s: &mut TcpStream, buf: &mut [u8]) -> std::io::Result<bool> {
    let mut got = 0;
    while got < buf.len() {
        match s.read(&mut buf[got..]) {
            Ok(0) if got == 0 => return Ok(false),
            Ok(0) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}
