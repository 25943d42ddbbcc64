//! Buffer registration (NCCL 2.27's symmetric windows) for host collectives.
//!
//! `Comm::register` is collective: every rank registers a buffer in the same order, and the
//! ranks exchange how each other's buffer can be reached — by address (thread ranks of one
//! process) or by a `HostBuf` file, mapped once per file. A window is *active* when every rank can
//! reach every other rank's buffer; the decision is taken from the exchanged records alone, so it
//! is the same on every rank. A collective whose send and recv buffers lie in active windows reads
//! its peers' buffers in place, synchronised by sequence words in a small control segment per
//! rank (`Ctrl`), instead of copying through the FIFOs twice (`coll`). A rank's share of a
//! large one is split across its helper threads (`threads`).

mod coll;
mod threads;

pub(crate) use coll::{Env, Plan, ALGO};

use crate::error::{Error, Result};
use crate::hostmem::{self, Segment};
use crate::sync::lock;
use crate::wait;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

/// A registered buffer of one communicator, from `Comm::register`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Handle {
    comm: u64,
    id: u64,
    shared: bool,
}

impl Handle {
    /// Whether the window is active: collectives on it read peers' buffers in place. `false`
    /// when some rank cannot reach some other rank's buffer (another host, tcp forced, a plain
    /// allocation in another process); those collectives take the normal path.
    pub fn shared(&self) -> bool {
        self.shared
    }
}

/// Byte offsets of the control segment's words, one cache line each (64 is unused).
const READY: usize = 0;
/// The operation's arguments (hashed), written before READY: peers check they agree.
const DESC: usize = 8;
const DONE: usize = 128;
/// Non-zero once this rank failed or aborted: peers waiting on it stop.
const STATE: usize = 192;
/// Futex word bumped on every publish, and the count of peers asleep on it.
const BELL: usize = 256;
const SLEEPERS: usize = 260;
const CTRL_LEN: usize = 512;

/// A rank's control segment, as mapped in this process.
struct Ctrl(Segment);

impl Ctrl {
    fn at(&self) -> CtrlAt {
        CtrlAt(self.0.ptr() as usize)
    }
}

/// The address of a control segment mapped here; valid while the registry that mapped it lives
/// (mappings are only undone when it drops).
#[derive(Clone, Copy)]
struct CtrlAt(usize);

impl CtrlAt {
    fn u64(&self, off: usize) -> &AtomicU64 {
        // SAFETY: a live CTRL_LEN-byte, page-aligned mapping; offsets are 8-aligned and in range.
        unsafe { &*((self.0 + off) as *const AtomicU64) }
    }
    fn u32(&self, off: usize) -> &AtomicU32 {
        // SAFETY: as above, 4-aligned.
        unsafe { &*((self.0 + off) as *const AtomicU32) }
    }
    fn publish(&self, off: usize, v: u64) {
        self.u64(off).store(v, Ordering::SeqCst);
        self.u32(BELL).fetch_add(1, Ordering::SeqCst);
        wait::wake(self.u32(BELL), self.u32(SLEEPERS));
    }
}

/// How a peer reaches one rank's window.
#[derive(Debug, Clone, PartialEq)]
enum Reach {
    /// An address in that rank's process (usable by ranks of the same process).
    Addr(u64),
    /// An offset in a `HostBuf`'s memory file, by its reference (`hostmem`).
    File(String, u64),
}

/// What each rank sends at register/deregister (over the bootstrap).
#[derive(Debug, Clone, PartialEq)]
struct Record {
    /// 1: register, 2: deregister.
    verb: u8,
    id: u64,
    /// Why this rank refuses the call (empty: it accepts).
    refusal: String,
    len: u64,
    reach: Reach,
    /// Every peer of this rank is over shm (not tcp, not another host).
    shm_only: bool,
    ctrl: String,
}

impl Record {
    fn encode(&self) -> Vec<u8> {
        let mut b = vec![self.verb];
        b.extend_from_slice(&self.id.to_le_bytes());
        b.extend_from_slice(&self.len.to_le_bytes());
        b.push(u8::from(self.shm_only));
        let (kind, v, name) = match &self.reach {
            Reach::Addr(a) => (0u8, *a, ""),
            Reach::File(n, o) => (1u8, *o, n.as_str()),
        };
        b.push(kind);
        b.extend_from_slice(&v.to_le_bytes());
        for s in [name, self.ctrl.as_str(), self.refusal.as_str()] {
            b.extend_from_slice(&(s.len() as u32).to_le_bytes());
            b.extend_from_slice(s.as_bytes());
        }
        b
    }

    fn decode(b: &[u8]) -> Result<Record> {
        let bad = || Error::internal("a malformed buffer registration record from a peer");
        let mut at = 0usize;
        let mut take = |n: usize| -> Result<&[u8]> {
            let s = b.get(at..at.checked_add(n).ok_or_else(bad)?).ok_or_else(bad)?;
            at += n;
            Ok(s)
        };
        let u64_of = |s: &[u8]| u64::from_le_bytes(s.try_into().unwrap_or([0; 8]));
        let verb = take(1)?[0];
        let id = u64_of(take(8)?);
        let len = u64_of(take(8)?);
        let shm_only = take(1)?[0] != 0;
        let kind = take(1)?[0];
        let v = u64_of(take(8)?);
        let mut strs = Vec::with_capacity(3);
        for _ in 0..3 {
            let n = u32::from_le_bytes(take(4)?.try_into().unwrap_or([0; 4])) as usize;
            if n > 4096 {
                return Err(bad());
            }
            strs.push(String::from_utf8(take(n)?.to_vec()).map_err(|_| bad())?);
        }
        let refusal = strs.pop().unwrap_or_default();
        let ctrl = strs.pop().unwrap_or_default();
        let name = strs.pop().unwrap_or_default();
        let reach = match kind {
            0 => Reach::Addr(v),
            1 => Reach::File(name, v),
            _ => return Err(bad()),
        };
        Ok(Record { verb, id, refusal, len, reach, shm_only, ctrl })
    }
}

/// An active window: where each rank's window starts in this process's address space.
struct Window {
    id: u64,
    base: usize,
    len: usize,
    shared: bool,
    /// Per rank: its window's start as mapped here, and its length.
    peers: Vec<(usize, usize)>,
}

/// A communicator's registrations.
#[derive(Default)]
pub(crate) struct Registry {
    /// This rank's control segment (made at the first registration).
    ctrl: OnceLock<Ctrl>,
    /// Set by `fail` before the control segment exists: it starts failed.
    failed: AtomicBool,
    /// Sequence number of the last registered operation.
    seq: AtomicU64,
    inner: Mutex<Inner>,
    /// Helper threads for large operations (`threads`), started by the first that splits.
    threads: OnceLock<threads::Threads>,
}

#[derive(Default)]
struct Inner {
    windows: Vec<Window>,
    next_id: u64,
    /// Peers' control segments, by rank (`None` for this rank).
    ctrls: Vec<Option<Ctrl>>,
    /// Peers' host buffer files mapped here, by name (a larger window of a file maps it again;
    /// earlier mappings stay, so addresses handed out stay valid until the communicator goes).
    files: HashMap<String, Vec<Segment>>,
}

/// Where an in-place call's buffers lie: the one place their offsets differ between ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum InPlace {
    /// Out of place, or in place at the same offset on every rank (all-reduce).
    No,
    /// All-gather of blocks of this many bytes: rank q's send block is block q of its recv.
    Gather(usize),
    /// Reduce-scatter into blocks of this many bytes: rank q's recv is block q of its send.
    Scatter(usize),
}

impl Registry {
    /// Marks this rank failed for peers inside a registered operation with it.
    pub(crate) fn fail(&self) {
        self.failed.store(true, Ordering::SeqCst);
        if let Some(c) = self.ctrl.get() {
            c.at().publish(STATE, 1);
        }
    }

    fn my_ctrl(&self) -> Result<&Ctrl> {
        if let Some(c) = self.ctrl.get() {
            return Ok(c);
        }
        let c = Ctrl(Segment::create(CTRL_LEN)?);
        if self.failed.load(Ordering::SeqCst) {
            c.at().u64(STATE).store(1, Ordering::SeqCst);
        }
        Ok(self.ctrl.get_or_init(|| c))
    }

    /// Registers `[base, base+len)`: `gather` exchanges the records among the ranks (the
    /// bootstrap all-gather). `same_host` and `shm_only` come from the peer table and config.
    pub(crate) fn register(
        &self,
        comm: u64,
        me: usize,
        pids: &[u32],
        (base, len): (usize, usize),
        shm_only: bool,
        mut gather: impl FnMut(&[u8]) -> Result<Vec<Vec<u8>>>,
    ) -> Result<Handle> {
        let n = pids.len();
        let ctrl_name = self.my_ctrl()?.0.name().unwrap_or("").to_string();
        let g = lock(&self.inner);
        let id = g.next_id + 1;
        let mut refusal = String::new();
        if len == 0 {
            refusal = "an empty buffer cannot be registered".into();
        } else if let Some(w) = g.windows.iter().find(|w| base < w.base + w.len && w.base < base + len) {
            refusal = format!(
                "the buffer {base:#x}+{len} overlaps the registered window {:#x}+{} (handle {})",
                w.base, w.len, w.id
            );
        }
        let reach = match hostmem::find(base, len) {
            Some((name, off)) => Reach::File(name, off as u64),
            None => Reach::Addr(base as u64),
        };
        let mine = Record { verb: 1, id, refusal, len: len as u64, reach, shm_only, ctrl: ctrl_name };
        // Not held across the bootstrap exchange (which takes the communicator's lock, and an
        // operation's error path takes this one inside that).
        drop(g);
        let all = gather(&mine.encode())?.iter().map(|b| Record::decode(b)).collect::<Result<Vec<_>>>()?;
        agree(&all, 1, id, "register")?;
        let mut g = lock(&self.inner);
        g.next_id = id;
        // Active when every rank reaches every other's buffer: one host, shm only, and each
        // buffer a HostBuf file or in a process that holds every rank.
        let one_process = pids.iter().all(|&p| p == pids[0]);
        let shared = all.iter().all(|r| r.shm_only && (one_process || matches!(r.reach, Reach::File(..))));
        let mut peers = Vec::with_capacity(n);
        let mapped: Result<()> = (|| {
            if !shared {
                return Ok(());
            }
            if g.ctrls.len() != n {
                g.ctrls = (0..n).map(|_| None).collect();
            }
            for (r, rec) in all.iter().enumerate() {
                if r == me {
                    peers.push((base, len));
                    continue;
                }
                if g.ctrls[r].is_none() {
                    g.ctrls[r] = Some(Ctrl(Segment::open(&rec.ctrl, CTRL_LEN, pids[r])?));
                }
                let at = match (&rec.reach, pids[r] == pids[me]) {
                    (Reach::Addr(a), true) => *a as usize,
                    (Reach::File(name, off), _) => {
                        let need = *off as usize + rec.len as usize;
                        let maps = g.files.entry(name.clone()).or_default();
                        if !maps.iter().any(|s| s.len() >= need) {
                            maps.push(Segment::open(name, need, pids[r])?);
                        }
                        let seg = maps.iter().find(|s| s.len() >= need).map_or(0, |s| s.ptr() as usize);
                        seg + *off as usize
                    }
                    (Reach::Addr(_), false) => return Err(Error::internal("an address window of another process")),
                };
                peers.push((at, rec.len as usize));
            }
            Ok(())
        })();
        drop(g);
        // Every rank learns whether every other mapped what it needed, so all agree to fail.
        if let Err(e) = &mapped {
            tracing::error!("occl: rank {me} could not map its peers' registered buffers: {e}");
        }
        let ok = gather(&[u8::from(mapped.is_ok())])?;
        mapped?;
        if let Some(r) = ok.iter().position(|v| v.first() != Some(&1)) {
            return Err(Error::remote(r, "could not map the peers' registered buffers (see that rank's log)"));
        }
        lock(&self.inner).windows.push(Window { id, base, len, shared, peers });
        if !shared {
            tracing::debug!(
                "occl: registered window {id} is inactive (another host, tcp, or a buffer that is not a HostBuf)"
            );
        }
        Ok(Handle { comm, id, shared })
    }

    /// Removes a window; collective like `register`.
    pub(crate) fn deregister(
        &self,
        comm: u64,
        h: Handle,
        mut gather: impl FnMut(&[u8]) -> Result<Vec<Vec<u8>>>,
    ) -> Result<()> {
        let g = lock(&self.inner);
        let refusal = if h.comm != comm {
            format!("handle {} belongs to communicator {:016x}, not this one", h.id, h.comm)
        } else if !g.windows.iter().any(|w| w.id == h.id) {
            format!("handle {} is not registered (deregistered already?)", h.id)
        } else {
            String::new()
        };
        let mine =
            Record { verb: 2, id: h.id, refusal, len: 0, reach: Reach::Addr(0), shm_only: false, ctrl: String::new() };
        drop(g);
        let all = gather(&mine.encode())?.iter().map(|b| Record::decode(b)).collect::<Result<Vec<_>>>()?;
        agree(&all, 2, h.id, "deregister")?;
        let mut g = lock(&self.inner);
        g.windows.retain(|w| w.id != h.id);
        Ok(())
    }

    /// A timeout of a normal-path operation on a communicator with active windows: peers that
    /// passed registered buffers wait elsewhere, so the message names that likely cause.
    pub(crate) fn explain(&self, e: Error) -> Error {
        match e {
            Error::Timeout { what, secs } if lock(&self.inner).windows.iter().any(|w| w.shared) => Error::Timeout {
                what: format!(
                    "{what} (this communicator has registered windows: if other ranks passed registered buffers while \
                     this one did not, every rank must pass registered buffers, at the same window offsets, or none)"
                ),
                secs,
            },
            e => e,
        }
    }

    /// This rank's buffer `[p, p+bytes)` in an active window: the window and the offset.
    fn window_of(g: &Inner, p: usize, bytes: usize) -> Option<(usize, usize)> {
        g.windows
            .iter()
            .position(|w| w.shared && p >= w.base && p + bytes <= w.base + w.len)
            .map(|i| (i, p - g.windows[i].base))
    }

    /// Whether this rank has ever registered a window (its control segment exists), at one
    /// load: without one `plan` finds nothing, and an operation skips it.
    #[inline]
    pub(crate) fn any(&self) -> bool {
        self.ctrl.get().is_some()
    }

    /// The plan of a registered operation when `send` and `recv` both lie in active windows
    /// (`None`: the normal path). `layout`: where an in-place call's buffers lie, whose offsets
    /// differ per rank. `call`: the arguments every rank must pass alike, hashed only once the
    /// windows apply (an unregistered call pays one load).
    pub(crate) fn plan(
        &self,
        me: usize,
        send: (usize, usize),
        recv: (usize, usize),
        layout: InPlace,
        call: &[u64],
    ) -> Result<Option<Plan<'_>>> {
        if send.1 == 0 || recv.1 == 0 || self.ctrl.get().is_none() {
            return Ok(None);
        }
        let g = lock(&self.inner);
        let (Some((sw, so)), Some((rw, ro))) =
            (Self::window_of(&g, send.0, send.1), Self::window_of(&g, recv.0, recv.1))
        else {
            return Ok(None);
        };
        let n = g.windows[rw].peers.len();
        let mut sends = Vec::with_capacity(n);
        let mut recvs = Vec::with_capacity(n);
        for q in 0..n {
            let (rbase, rlen) = g.windows[rw].peers[q];
            let (sbase, slen) = g.windows[sw].peers[q];
            // In-place all-gather: rank q's send block is at q × block of its recv buffer (within
            // the recv buffer, whose bounds are checked). In-place reduce-scatter: rank q's recv
            // block is at q × block of its send buffer (within it, likewise).
            let (s_at, s_fits) = match layout {
                InPlace::Gather(b) => (rbase + ro + q * b, true),
                _ => (sbase + so, so + send.1 <= slen),
            };
            let (r_at, r_fits) = match layout {
                InPlace::Scatter(b) => (sbase + so + q * b, true),
                _ => (rbase + ro, ro + recv.1 <= rlen),
            };
            if !r_fits || !s_fits {
                return Err(Error::usage(format!(
                    "a registered collective's buffers run past rank {q}'s registered window; every rank must pass \
                     buffers at the same offsets of windows registered together"
                )));
            }
            sends.push(if q == me { send.0 } else { s_at });
            recvs.push(if q == me { recv.0 } else { r_at });
        }
        let ctrls = g
            .ctrls
            .iter()
            .enumerate()
            .map(|(q, c)| if q == me { self.ctrl.get() } else { c.as_ref() }.map(Ctrl::at))
            .collect::<Option<Vec<CtrlAt>>>()
            .ok_or_else(|| Error::internal("a registered window without its peers' control segments"))?;
        // Offsets and windows go into the check too: the contract is the same offsets everywhere.
        let (sid, rid) = (g.windows[sw].id, g.windows[rw].id);
        let soff = if matches!(layout, InPlace::Gather(_)) { u64::MAX } else { so as u64 };
        let roff = if matches!(layout, InPlace::Scatter(_)) { u64::MAX } else { ro as u64 };
        let desc = describe(&[describe(call), sid, rid, soff, roff]);
        Ok(Some(Plan { reg: self, ctrls, send: sends, recv: recvs, desc }))
    }
}

/// Every rank made the same call (verb, handle id) and none refused it.
fn agree(all: &[Record], verb: u8, id: u64, what: &str) -> Result<()> {
    if let Some((r, rec)) = all.iter().enumerate().find(|(_, r)| !r.refusal.is_empty()) {
        let e = format!("{what} refused by rank {r}: {}", rec.refusal);
        return Err(Error::arg(e));
    }
    if let Some(r) = all.iter().position(|rec| rec.verb != verb || rec.id != id) {
        return Err(Error::usage(format!(
            "{what}: rank {r} made a different registration call (every rank must register and deregister the same \
             windows in the same order)"
        )));
    }
    Ok(())
}

/// A hash of the arguments every rank of a registered operation must pass alike.
fn describe(parts: &[u64]) -> u64 {
    parts.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &x| (h ^ x).wrapping_mul(0x100_0000_01b3)) | 1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_reject_garbage() {
        let r = Record {
            verb: 1,
            id: 7,
            refusal: "no".into(),
            len: 4096,
            reach: Reach::File("memfd:1:2:3:4".into(), 64),
            shm_only: true,
            ctrl: "memfd:1:1:3:5".into(),
        };
        assert_eq!(Record::decode(&r.encode()).unwrap(), r);
        let b = r.encode();
        for cut in 0..b.len() {
            assert!(Record::decode(&b[..cut]).is_err(), "cut at {cut}");
        }
    }
}
