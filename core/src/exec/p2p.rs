//! The sends and receives of one group launch, progressed together by the calling thread: one
//! stream per peer and direction, each moving its calls in order (a FIFO between two ranks is
//! one ordered stream, so the k-th send to a peer matches that peer's k-th receive from us),
//! every stream as far as it can go without blocking, round after round. The thread blocks only
//! when no stream can move, and then on the FIFO of the first blocked stream (the others are
//! looked at again after a short slice).
//!
//! On the wire each call is exactly what a plain `send`/`recv` produces (same slices, same
//! descriptors), so a grouped send matches a plain receive and the other way round. Sends to
//! and receives from this rank itself pair up in order and are copies.

use crate::coll::prims::DIRECT_MIN;
use crate::comm::{Comm, Inner};
use crate::error::{Error, Result};
use crate::op::{nccl_func, Op as Call, NO_OP, NO_ROOT};
use crate::profile::group::GroupProf;
use crate::profile::op::OpDescr;
use crate::profile::{Leg, OpProf, Steps, Tally};
use crate::record::{self, CollType};
use crate::transport::fifo::nonblocking::alive;
use crate::transport::fifo::{state, Desc, Direct, Liveness, Msg, Notice, Timed};
use crate::transport::{shm, Peer};
use crate::wait::{self, Deadline, Drive};
use occl_events::event::ProxyStepState;
use occl_events::EventId;
use occl_telemetry::flight::{OpInfo, RootOrPeer, Slot};
use occl_telemetry::prometheus::{OpLabels, OpSlot};
use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// Idle rounds spent spinning before yielding, then how long to yield before blocking: the
/// peer is usually a moment behind, and a sleep costs a wake-up system call on both sides.
/// On a host with more ranks than cores, spinning keeps the peer off the core: yield at once.
const SPIN_ROUNDS: u32 = 256;
const YIELD_FOR: Duration = Duration::from_micros(500);
/// With tcp links every round is a few system calls (this thread moves the sockets): yield
/// each idle round, and block in poll(2) after this many (as a plain tcp wait does).
const DRIVE_ROUNDS: u32 = 48;
/// How long one block lasts: bounds how late a stream other than the one slept on is looked at
/// again, and how late an abort is seen. Shorter when sockets also need turns.
const SHM_SLICE: Duration = Duration::from_millis(1);
const MIXED_SLICE: Duration = Duration::from_micros(200);
/// How often a blocked stream's peer process is checked for life (a system call).
const LIVENESS_EVERY: Duration = Duration::from_millis(100);

/// One call of the launch, as it is run.
struct Op {
    call: Call,
    peer: usize,
    send: bool,
    bytes: usize,
    desc: Desc,
    flight: Slot,
}

/// The calls of one peer and direction, in order, and how far the current one got.
struct Stream<'p> {
    peer: usize,
    send: bool,
    queue: VecDeque<usize>,
    cur: Option<usize>,
    off: usize,
    /// The current send posts pointers to the caller's buffer (single copy) and must see them
    /// consumed before it is done.
    by_ptr: bool,
    steps: Option<Steps<'p>>,
    /// The launch's slices, for the direct metrics route (`crate::profile`).
    tally: Option<&'p Tally>,
    liveness: Liveness,
}

impl Stream<'_> {
    fn done(&self) -> bool {
        self.cur.is_none() && self.queue.is_empty()
    }
}

fn peer_mut(peers: &mut [Option<Peer>], p: usize) -> Result<&mut Peer> {
    peers.get_mut(p).and_then(Option::as_mut).ok_or_else(|| Error::internal(format!("no connection to rank {p}")))
}

/// Runs `tasks` (sends and receives of `comm`, with their API events) as one launch.
pub(super) fn run(comm: &Comm, prof: &GroupProf, tasks: &[(Call, Option<EventId>)]) -> Result<()> {
    let mut g = comm.lock_usable()?;
    let inner = &mut *g;
    let t0 = record::now_ns();
    let mut ops = Vec::with_capacity(tasks.len());
    for (call, _) in tasks {
        let peer = call.peer.ok_or_else(|| Error::internal("a grouped send/recv without a peer"))?;
        let send = call.coll == CollType::Send;
        let bytes = call.count * call.dt.size();
        let opseq = match (peer == comm.rank(), send) {
            (true, _) => 0,
            (false, true) => {
                inner.p2p_sent[peer] = inner.p2p_sent[peer].wrapping_add(1);
                inner.p2p_sent[peer]
            }
            (false, false) => {
                inner.p2p_received[peer] = inner.p2p_received[peer].wrapping_add(1);
                inner.p2p_received[peer]
            }
        };
        // A receive checks against what the sender stamps: a Send (as `Comm::run`).
        let desc = Desc::new(CollType::Send as u8, opseq, call.count as u64, call.dt as u8, NO_OP, NO_ROOT);
        let seq = comm.record.launch(call.coll, bytes as u64, t0);
        inner.func_seq[call.coll as usize] += 1;
        let flight = comm.flight.enqueue(
            &OpInfo {
                seq,
                coll_seq: inner.func_seq[call.coll as usize],
                op: nccl_func(call.coll),
                dtype: call.dt.nccl_name(),
                redop: None,
                count: call.count as u64,
                in_bytes: if send { bytes as u64 } else { 0 },
                out_bytes: if send { 0 } else { bytes as u64 },
                root_or_peer: Some(RootOrPeer::Peer(peer as u32)),
                algo: "direct",
                proto: "simple",
            },
            t0,
        );
        comm.flight.started(flight, t0);
        ops.push(Op { call: *call, peer, send, bytes, desc, flight });
    }
    let slot = inner.slot;
    let profs: Vec<Option<OpProf<'_>>> = ops
        .iter()
        .zip(tasks)
        .map(|(o, (_, api))| {
            let slice = crate::coll::slice_bytes(slot, o.call.dt);
            let seq_number = inner.func_seq[o.call.coll as usize];
            OpProf::within(
                prof.fanout(),
                prof.mask(),
                comm.rank(),
                *api,
                prof.group(),
                || OpDescr { seq_number, algo: "DIRECT", proto: "SIMPLE", chunk_size: slice, ..o.call.descr() },
                || {
                    let steps = o.bytes.div_ceil(slice);
                    if o.peer == comm.rank() || steps == 0 {
                        Vec::new()
                    } else {
                        vec![Leg { peer: o.peer, send: o.send, steps }]
                    }
                },
                |p| inner.kind_name(p),
            )
        })
        .collect();
    let tally = inner.metrics.as_ref().map(|_| Tally::default());
    let res = self_copies(comm.rank(), &ops).and_then(|()| progress(comm, inner, &ops, &profs, tally.as_ref()));
    let res = res.and_then(|()| match &inner.net {
        // Sends still in tcp FIFOs must reach their sockets before the launch returns.
        Some(n) => n.flush(&comm.abort, &Deadline::after(comm.config.timeout)),
        None => Ok(()),
    });
    for p in profs.into_iter().flatten() {
        p.end();
    }
    let t1 = record::now_ns();
    if let Some(m) = &mut inner.metrics {
        // Each call is timed over the launch, as its span is; failed ones count too.
        for o in &ops {
            let (coll, dt) = (o.call.coll, o.call.dt);
            let labels = || OpLabels { p2p: true, op: nccl_func(coll), algo: "", proto: "", dtype: dt.nccl_name() };
            m.op(OpSlot { op: coll as u8, dtype: dt as u8, choice: 0 }, labels, o.bytes as u64, t1.saturating_sub(t0));
        }
        if let Some(t) = &tally {
            t.report(m);
        }
    }
    match res {
        Ok(()) => {
            for o in &ops {
                comm.record.complete(o.call.coll);
                comm.flight.completed(o.flight, t1);
            }
            Ok(())
        }
        Err(e) => {
            let why = e.to_string();
            for o in &ops {
                comm.flight.failed(o.flight, t1, &why);
            }
            Err(comm.poison(inner, CollType::Send, e))
        }
    }
}

/// Sends to this rank itself pair up with its receives from itself, in order.
fn self_copies(me: usize, ops: &[Op]) -> Result<()> {
    let sends: Vec<&Op> = ops.iter().filter(|o| o.peer == me && o.send).collect();
    let recvs: Vec<&Op> = ops.iter().filter(|o| o.peer == me && !o.send).collect();
    if sends.len() != recvs.len() {
        return Err(Error::usage(format!(
            "rank {me} sends to itself {} time(s) but receives from itself {} time(s) in this group; they pair up in order",
            sends.len(),
            recvs.len()
        )));
    }
    for (s, r) in sends.iter().zip(&recvs) {
        if s.call.count != r.call.count || s.call.dt != r.call.dt {
            return Err(Error::usage(format!(
                "operation mismatch: rank {me} sends itself {} × {} but receives {} × {}",
                s.call.count, s.call.dt, r.call.count, r.call.dt
            )));
        }
        if s.bytes > 0 {
            // SAFETY: the caller's contract: send holds `bytes` readable bytes and recv as many
            // writable ones until the group has run. `copy` allows overlap.
            unsafe { std::ptr::copy(s.call.send as *const u8, r.call.recv as *mut u8, s.bytes) };
        }
    }
    Ok(())
}

/// Moves every stream until all calls are done.
fn progress<'p>(
    comm: &Comm,
    inner: &mut Inner,
    ops: &[Op],
    profs: &'p [Option<OpProf<'p>>],
    tally: Option<&'p Tally>,
) -> Result<()> {
    let me = comm.rank();
    let mut streams: Vec<Stream<'p>> = Vec::new();
    for (i, o) in ops.iter().enumerate().filter(|(_, o)| o.peer != me) {
        let pos = streams.iter().position(|s| s.peer == o.peer && s.send == o.send);
        let s = match pos {
            Some(p) => &mut streams[p],
            None => {
                let lazy = inner.lazy.as_ref();
                crate::transport::connect::ensure(&mut inner.peers, o.peer, lazy, Some(&comm.ends))?;
                let liveness = peer_mut(&mut inner.peers, o.peer)?.liveness;
                streams.push(Stream {
                    peer: o.peer,
                    send: o.send,
                    queue: VecDeque::new(),
                    cur: None,
                    off: 0,
                    by_ptr: false,
                    steps: None,
                    tally,
                    liveness,
                });
                let n = streams.len();
                &mut streams[n - 1]
            }
        };
        s.queue.push_back(i);
    }
    let (timeout, slot) = (comm.config.timeout, inner.slot);
    // Known since init: `available_parallelism` here cost a sched_getaffinity and cgroup file
    // reads per launch, several times the whole of a small all-to-allv.
    let spin_rounds = if comm.tuner.oversubscribed() { 0 } else { SPIN_ROUNDS };
    let driving = inner.net.is_some();
    let mut last_moved = None::<Instant>;
    let mut idle_since = None::<Instant>;
    let mut last_liveness = Instant::now();
    let mut idle = 0u32;
    // The direct metrics route's step waits: from the first round that moves nothing to the
    // next that moves something, in the state of the stream the launch waits on (the clock is
    // read only then).
    let waited = tally.map(Tally::wait_sums);
    let mut timed: Option<Timed<'_>> = None;
    loop {
        let mut moved = match &inner.net {
            Some(n) => n.progress(),
            None => false,
        };
        let mut blocked = None;
        for (k, s) in streams.iter_mut().enumerate() {
            let p = peer_mut(&mut inner.peers, s.peer)?;
            moved |= advance(s, p, slot, ops, profs)?;
            if !s.done() && blocked.is_none() {
                blocked = Some(k);
            }
        }
        if moved {
            timed = None;
        }
        let Some(b) = blocked else { return Ok(()) };
        if moved {
            idle = 0;
            last_moved = None;
            idle_since = None;
            continue;
        }
        if timed.is_none() {
            timed = Timed::start(waited, wait_state(&streams[b], ops) as u32);
        }
        if comm.abort.load(Ordering::Relaxed) {
            return Err(Error::usage("the communicator was aborted"));
        }
        idle += 1;
        if driving {
            std::thread::yield_now();
            if idle < DRIVE_ROUNDS {
                continue;
            }
            idle = 0;
        } else if idle < spin_rounds {
            std::hint::spin_loop();
            continue;
        }
        let now = Instant::now();
        let since = *last_moved.get_or_insert(now);
        if now.duration_since(since) >= timeout {
            let waiting: Vec<String> = streams
                .iter()
                .filter(|s| !s.done())
                .map(|s| format!("{} rank {}", if s.send { "sending to" } else { "receiving from" }, s.peer))
                .collect();
            return Err(Error::Timeout {
                what: format!("grouped send/recv ({})", waiting.join(", ")),
                secs: timeout.as_secs_f64(),
            });
        }
        if now.duration_since(last_liveness) >= LIVENESS_EVERY {
            last_liveness = now;
            for s in streams.iter().filter(|s| !s.done()) {
                if !alive(s.liveness) {
                    let Liveness::Process(pid) = s.liveness else { continue };
                    return Err(Error::remote(s.peer, format!("process {pid} is dead")));
                }
            }
            comm.ends.failed_peer(usize::MAX)?;
        }
        if !driving && now.duration_since(*idle_since.get_or_insert(now)) < YIELD_FOR {
            std::thread::yield_now();
            continue;
        }
        block(comm, inner, &streams[b], profs, ops)?;
    }
}

/// What stream `s` waits for when it cannot move: a free slot, the receiver reading its
/// pointed-to buffer, or data.
fn wait_state(s: &Stream<'_>, ops: &[Op]) -> ProxyStepState {
    if s.send {
        if s.by_ptr && s.cur.is_some_and(|i| s.off >= ops[i].bytes) {
            ProxyStepState::SendWait
        } else {
            ProxyStepState::SendPeerWait
        }
    } else {
        ProxyStepState::RecvWait
    }
}

/// Sleeps until stream `s`'s FIFO may have moved (or a short slice passes): in poll(2) on the
/// sockets for a tcp peer (this thread fills its FIFOs itself), on the FIFO's futex otherwise.
fn block(comm: &Comm, inner: &mut Inner, s: &Stream<'_>, profs: &[Option<OpProf<'_>>], ops: &[Op]) -> Result<()> {
    let sleeper = s.cur.and_then(|i| profs[i].as_ref()).and_then(|p| p.sleeper());
    let token = sleeper.map(|z| z.sleep());
    let st = wait_state(s, ops);
    comm.record.waiting_on(s.peer, st as u32);
    let tcp = inner.net.is_some();
    let p = peer_mut(&mut inner.peers, s.peer)?;
    if p.tcp.is_some() {
        if let Some(n) = &inner.net {
            n.block(SHM_SLICE);
        }
    } else {
        let draining = st == ProxyStepState::SendWait;
        let (word, sleepers) = if s.send { p.send.wait_word(draining) } else { p.recv.wait_word() };
        let seen = word.load(Ordering::Acquire);
        sleepers.fetch_add(1, Ordering::SeqCst);
        // Re-check after announcing ourselves: the waker either sees the count or we see its
        // store (both SeqCst).
        let ready = if s.send {
            if draining {
                p.send.drained()
            } else {
                p.send.try_acquire().is_some()
            }
        } else {
            matches!(p.recv.try_peek(s.peer), Ok(Some(_)))
        };
        if !ready {
            wait::futex_wait(word, seen, if tcp { MIXED_SLICE } else { SHM_SLICE });
        }
        sleepers.fetch_sub(1, Ordering::SeqCst);
    }
    if let (Some(z), Some(t)) = (sleeper, token) {
        z.woke(t);
    }
    Ok(())
}

/// Takes the stream's next call when the current one is done; false when none is left.
fn next_call<'p>(s: &mut Stream<'p>, profs: &'p [Option<OpProf<'p>>]) -> bool {
    if s.cur.is_some() {
        return true;
    }
    let Some(i) = s.queue.pop_front() else { return false };
    s.cur = Some(i);
    s.off = 0;
    s.by_ptr = false;
    s.steps =
        profs[i].as_ref().and_then(|p| if s.send { p.steps(Some(s.peer), None) } else { p.steps(None, Some(s.peer)) });
    true
}

fn finish_call(s: &mut Stream<'_>) {
    s.cur = None;
    s.steps = None;
}

/// Moves the stream's calls in order: sends as many slices as the receiver has room for, or
/// receives every slice that has arrived. Returns whether anything moved.
fn advance<'p>(
    s: &mut Stream<'p>,
    p: &mut Peer,
    slot: usize,
    ops: &[Op],
    profs: &'p [Option<OpProf<'p>>],
) -> Result<bool> {
    let mut moved = false;
    while next_call(s, profs) {
        let Some(i) = s.cur else { break };
        let (o, slice) = (&ops[i], crate::coll::slice_bytes(slot, ops[i].call.dt));
        let done = if s.send { send_call(s, p, o, slice, &mut moved)? } else { recv_call(s, p, o, slice, &mut moved)? };
        if !done {
            return Ok(moved);
        }
        finish_call(s);
        moved = true;
    }
    Ok(moved)
}

/// A call that cannot move now: the peer's failure when `notice` shows one, else not done.
fn stalled(notice: Notice, peer: usize) -> Result<bool> {
    if notice.state != state::OPEN {
        return Err(notice.error(peer));
    }
    Ok(false)
}

/// Sends what the receiver has room for of call `o`, in slices of `slice` bytes; true when the
/// call is done.
fn send_call(s: &mut Stream<'_>, p: &mut Peer, o: &Op, slice: usize, moved: &mut bool) -> Result<bool> {
    if s.off == 0 && !s.by_ptr {
        // Large ranges go by pointer where the receiver can read this rank's memory, as a
        // plain send does.
        s.by_ptr = o.bytes >= DIRECT_MIN && p.send.may_post_ptr();
    }
    while s.off < o.bytes {
        if let Some(st) = s.steps.as_mut() {
            st.send_peer_wait();
        }
        let Some(out) = p.send.try_acquire() else { return stalled(p.send.peer_notice(), s.peer) };
        let n = slice.min(o.bytes - s.off);
        let src = (o.call.send + s.off) as *const u8;
        if s.by_ptr {
            p.send.post_ptr(src, n, &o.desc);
        } else {
            // SAFETY: the caller's buffer holds `bytes` readable bytes until the group has
            // run; the acquired slot holds slot_size >= n bytes.
            unsafe { std::ptr::copy_nonoverlapping(src, out, n) };
            p.send.post(n, &o.desc);
        }
        if let Some(st) = s.steps.as_mut() {
            st.send_posted(n, &p.send);
        }
        if let Some(t) = s.tally {
            t.sent(n);
        }
        s.off += n;
        *moved = true;
    }
    // Pointers posted must be read before the caller may touch its buffer again.
    if s.by_ptr && !p.send.try_drain() {
        return stalled(p.send.peer_notice(), s.peer);
    }
    Ok(true)
}

/// Receives the slices of call `o` that have arrived; true when the call is done.
fn recv_call(s: &mut Stream<'_>, p: &mut Peer, o: &Op, slice: usize, moved: &mut bool) -> Result<bool> {
    while s.off < o.bytes {
        if let Some(st) = s.steps.as_mut() {
            st.recv_begin(&p.recv);
        }
        let Some(m) = p.recv.try_peek(s.peer)? else { return stalled(p.recv.peer_notice(), s.peer) };
        let n = slice.min(o.bytes - s.off);
        if m.desc != o.desc {
            return Err(Error::usage(format!(
                "operation mismatch: this rank runs {} but rank {} runs {}; every rank must call the same collectives in the same order with the same count, datatype, operator and root",
                o.desc,
                s.peer,
                m.desc
            )));
        }
        if m.len != n {
            return Err(Error::usage(format!(
                "operation mismatch: rank {} sent a {}-byte slice where this rank expected {n} bytes for {}",
                s.peer, m.len, o.desc
            )));
        }
        if let Some(st) = s.steps.as_mut() {
            st.recv_arrived(n);
        }
        if let Some(t) = s.tally {
            t.arrived(n);
        }
        fetch(p, s.peer, &m, (o.call.recv + s.off) as *mut u8, n)?;
        p.recv.release();
        if let Some(st) = s.steps.as_mut() {
            st.recv_done();
        }
        if let Some(t) = s.tally {
            t.released();
        }
        s.off += n;
        *moved = true;
    }
    Ok(true)
}

/// Copies message `m` (`n` bytes) to `dst`: from the slot, or from the sender's memory for a
/// pointer slot.
fn fetch(p: &Peer, peer: usize, m: &Msg, dst: *mut u8, n: usize) -> Result<()> {
    let Some(addr) = m.remote else {
        // SAFETY: the slot holds n bytes until released; dst is the caller's n bytes (its
        // contract holds until the group has run).
        unsafe { std::ptr::copy_nonoverlapping(m.data, dst, n) };
        return Ok(());
    };
    match p.recv.direct {
        // SAFETY: a thread rank of this process published the address of n bytes that stay
        // valid until we release the slot (its sender drains first).
        Direct::SameProcess => unsafe { std::ptr::copy_nonoverlapping(addr as *const u8, dst, n) },
        Direct::Cma(pid) => shm::read_peer(pid, addr, dst, n).map_err(|e| {
            Error::remote(peer, format!("reading {n} bytes of its buffer (process_vm_readv) failed: {e}"))
        })?,
        Direct::No => {
            return Err(Error::internal(format!("rank {peer} sent a pointer on a FIFO without single-copy support")))
        }
    }
    Ok(())
}
