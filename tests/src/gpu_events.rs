//! `occl-gpu events`: the profiler events of the device collectives, checked on a real GPU.
//!
//! Every rank attaches a recorder that wants KernelCh (and so, by NCCL's implied ancestors, the
//! Coll/P2p, Group and API events) plus KernelLaunch, runs each device operation once, brackets
//! it with host clock readings (before the launch, after the stream synchronised), reports the
//! KernelCh events (`CudaComm::flush_events`) and checks: the operation's Coll/P2p has exactly
//! one KernelCh per channel (its `n_channels`), channel ids 0..n, each with start <= stop and
//! both inside [launch, sync] widened by the clock map's error bound plus [`SLACK_NS`]; a
//! KernelLaunch per launch. A group of sends and receives is one launch whose connections run
//! on channels of their own, one operation after another: every P2p has KernelCh 0..n as well
//! (NCCL's KernelCh per work item), the operations of one connection as many channels each;
//! the check runs a group whose records fit one timer slot and one that needs several. A
//! launch a CUDA graph captured gets its host events and no KernelCh. An operation that ran on
//! the copy engines (no channels: under `NCCL_CTA_POLICY=2`, all-gathers, broadcasts,
//! all-to-alls, sends and receives) has no KernelCh but one CeColl under its API event, at
//! device times inside [launch, sync] widened by the event clock's anchor error plus
//! [`SLACK_NS`]; a second communicator of the same ranks, split from the first, places its
//! stamps through the same device clock (one per context), whose anchor the watcher measures
//! again while timed calls run. Then it times an 8 B all-reduce with the recorder wanting
//! KernelCh, wanting only Coll, and detached, and, on the copy engines, an 8 B all-gather with
//! and without CeColl. Rank 0 prints one JSON line per measurement.

use anyhow::{bail, ensure, Context};
use occl::cuda::kernels::cudarc::driver::{sys, CudaSlice, CudaStream, DevicePtr};
use occl::cuda::kernels::stamps::Stamp;
use occl::cuda::{CtaPolicy, CudaComm, P2p};
use occl::{DataType, RedOp};
use occl_telemetry::spans::unix_nanos;
use occl_telemetry::{EventDescr, EventId, EventMask, EventType, Sink};
use serde_json::json;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

/// What the device times may stray past the host bracket beyond the clock's error bound: the
/// drift of the two clocks since calibration and `%globaltimer`'s update granularity.
pub const SLACK_NS: u64 = 5_000;

/// One recorded event.
#[derive(Clone, Debug, Default)]
struct Ev {
    ty: Option<EventType>,
    parent: Option<u64>,
    start: u64,
    stop: u64,
    /// Coll/P2p/CeColl: func; Coll/P2p: n_channels; KernelCh: channel id.
    func: &'static str,
    n: u32,
    seq: u64,
    /// P2p: the peer.
    peer: i32,
    /// The order in which the events started.
    order: u64,
}

/// Records the events it wants with their times (explicit ones for KernelCh).
struct Recorder {
    mask: AtomicU64,
    evs: Mutex<HashMap<u64, Ev>>,
    started: AtomicU64,
}

impl Recorder {
    fn new(mask: EventMask) -> Arc<Recorder> {
        Arc::new(Recorder { mask: AtomicU64::new(mask.0), evs: Mutex::default(), started: AtomicU64::new(0) })
    }

    fn take(&self) -> HashMap<u64, Ev> {
        std::mem::take(&mut *self.evs.lock().unwrap_or_else(PoisonError::into_inner))
    }

    fn begin(&self, id: EventId, parent: Option<EventId>, d: &EventDescr<'_>, t: u64) {
        let func = |f: &str| -> &'static str {
            ["AllReduce", "ReduceScatter", "Reduce", "AllGather", "Broadcast", "AlltoAll", "Send", "Recv"]
                .into_iter()
                .find(|x| *x == f)
                .unwrap_or("?")
        };
        let order = self.started.fetch_add(1, Relaxed);
        let mut e = Ev { ty: Some(d.event_type()), parent: parent.map(EventId::get), start: t, order, ..Ev::default() };
        match *d {
            EventDescr::Coll { func: f, n_channels, seq_number, .. } => {
                (e.func, e.n, e.seq) = (func(f), u32::from(n_channels), seq_number);
            }
            EventDescr::P2p { func: f, n_channels, peer, .. } => {
                (e.func, e.n, e.peer) = (func(f), u32::from(n_channels), peer);
            }
            EventDescr::KernelCh { channel_id, .. } => e.n = u32::from(channel_id),
            EventDescr::CeColl { func: f, .. } => e.func = func(f),
            _ => {}
        }
        self.evs.lock().unwrap_or_else(PoisonError::into_inner).insert(id.get(), e);
    }

    fn end(&self, id: EventId, t: u64) {
        if let Some(e) = self.evs.lock().unwrap_or_else(PoisonError::into_inner).get_mut(&id.get()) {
            e.stop = t;
        }
    }
}

impl Sink for Recorder {
    fn interest(&self) -> EventMask {
        EventMask(self.mask.load(Relaxed))
    }
    fn start(&self, id: EventId, parent: Option<EventId>, ev: &EventDescr<'_>) {
        self.begin(id, parent, ev, unix_nanos());
    }
    fn start_at(&self, id: EventId, parent: Option<EventId>, ev: &EventDescr<'_>, t_ns: u64) {
        self.begin(id, parent, ev, t_ns);
    }
    fn stop(&self, id: EventId) {
        self.end(id, unix_nanos());
    }
    fn stop_at(&self, id: EventId, t_ns: u64) {
        self.end(id, t_ns);
    }
}

fn alloc(stream: &Arc<CudaStream>, bytes: usize) -> anyhow::Result<(CudaSlice<u8>, u64)> {
    let s = stream.alloc_zeros::<u8>(bytes.max(16))?;
    let p = { s.device_ptr(stream).0 };
    Ok((s, p))
}

/// The device operations this check runs, by name.
const OPS: [&str; 10] = [
    "all_reduce_8B",
    "all_reduce_4M",
    "reduce_scatter",
    "reduce",
    "all_gather",
    "broadcast",
    "all_to_all",
    "send_recv",
    "grouped_send_recv",
    "grouped_many",
];

/// Operations a connection carries in `grouped_many`: enough that their records (one per
/// operation and channel) fill several timer slots.
const MANY: usize = 16;

/// Enqueues `op` of `bytes` per rank (f32) on `s`.
fn launch(cc: &CudaComm, s: &Arc<CudaStream>, op: &str, bufs: (u64, u64), bytes: usize) -> anyhow::Result<()> {
    let (n, r) = (cc.nranks(), cc.rank());
    let (i, o) = bufs;
    let c = bytes / 4;
    // SAFETY: both buffers hold nranks × `bytes` bytes and live until the stream synchronised.
    unsafe {
        match op {
            "all_reduce_8B" => cc.all_reduce_raw(s, i, o, 2, DataType::F32, RedOp::Sum)?,
            "all_reduce_4M" => cc.all_reduce_raw(s, i, o, c, DataType::F32, RedOp::Sum)?,
            "reduce_scatter" => cc.reduce_scatter_raw(s, i, o, c, DataType::F32, RedOp::Sum)?,
            "reduce" => cc.reduce_raw(s, i, o, c, DataType::F32, RedOp::Sum, 0)?,
            "all_gather" => cc.all_gather_raw(s, i, o, c, DataType::F32)?,
            "broadcast" => cc.broadcast_raw(s, i, o, c, DataType::F32, 0)?,
            "all_to_all" => cc.all_to_all_raw(s, i, o, c / n, DataType::F32)?,
            "grouped_send_recv" | "grouped_many" => {
                // One group: the ring exchange in k parts, each a send to r+1 and a receive from
                // r-1, so each connection carries k operations.
                let k = if op == "grouped_many" { MANY } else { 2 };
                let (to, from, part) = ((r + 1) % n, (r + n - 1) % n, c / k);
                let p2p = |send, peer, buf, j: usize| P2p {
                    send,
                    peer,
                    buf: buf + (j * part * 4) as u64,
                    count: part,
                    dt: DataType::F32,
                };
                let ops: Vec<P2p> = (0..k).flat_map(|j| [p2p(true, to, i, j), p2p(false, from, o, j)]).collect();
                cc.p2p_group_raw(s, &ops)?
            }
            _ => {
                // Ring pairs: even ranks send first, so every send meets its receive.
                let (to, from) = ((r + 1) % n, (r + n - 1) % n);
                if r % 2 == 0 {
                    cc.send_raw(s, i, c, DataType::F32, to)?;
                    cc.recv_raw(s, o, c, DataType::F32, from)?;
                } else {
                    cc.recv_raw(s, o, c, DataType::F32, from)?;
                    cc.send_raw(s, i, c, DataType::F32, to)?;
                }
            }
        }
    }
    Ok(())
}

/// Checks one operation's events; returns (operations, KernelCh events, mean channel µs), the
/// channels of a call on the copy engines being its CeColl events. `err_ns`: the kernel clock
/// map's and the event clock anchor's error bounds.
fn verify(
    op: &str,
    evs: &HashMap<u64, Ev>,
    (t0, t1): (u64, u64),
    (err_ns, ce_err_ns): (u64, u64),
) -> anyhow::Result<(usize, usize, f64)> {
    let slack = err_ns + SLACK_NS;
    let mut parents: Vec<(&u64, &Ev)> =
        evs.iter().filter(|(_, e)| matches!(e.ty, Some(EventType::Coll) | Some(EventType::P2p))).collect();
    parents.sort_by_key(|(_, e)| e.order);
    let (want, want_launches) = match op {
        "send_recv" => (2, 2),
        "grouped_send_recv" => (4, 1),
        "grouped_many" => (2 * MANY, 1),
        _ => (1, 1),
    };
    ensure!(parents.len() == want, "{op}: {} Coll/P2p events, want {want}", parents.len());
    let launches = evs.values().filter(|e| e.ty == Some(EventType::KernelLaunch)).count();
    ensure!(launches == want_launches, "{op}: {launches} KernelLaunch events, want {want_launches}");
    let (mut chans, mut dur) = (0, 0u64);
    for (k, &(&pid, p)) in parents.iter().enumerate() {
        ensure!(p.start >= t0 && p.stop <= t1 && p.stop > 0, "{op}: the {} host event lies outside its call", p.func);
        if p.n == 0 {
            let (n, us) = verify_ce(op, evs, (pid, p), (t0, t1), ce_err_ns + SLACK_NS)?;
            (chans, dur) = (chans + n, dur + us);
            continue;
        }
        let mut ch: Vec<&Ev> =
            evs.values().filter(|e| e.ty == Some(EventType::KernelCh) && e.parent == Some(pid)).collect();
        ch.sort_by_key(|e| e.n);
        let ids: Vec<u32> = ch.iter().map(|e| e.n).collect();
        // A later operation of the same connection (a P2p's function and peer) ran on the
        // first one's channels, after it.
        let first =
            parents[..k].iter().find(|(_, q)| q.ty == Some(EventType::P2p) && q.func == p.func && q.peer == p.peer);
        if let Some((_, q)) = first {
            ensure!(p.n == q.n, "{op}: a later {} to peer {} has {} channels, the first {}", p.func, p.peer, p.n, q.n);
        }
        ensure!(
            ids == (0..p.n).collect::<Vec<_>>(),
            "{op}: {} with {} channels has KernelCh channels {ids:?}",
            p.func,
            p.n
        );
        for e in ch {
            ensure!(e.stop >= e.start, "{op}: channel {} stops before it starts", e.n);
            ensure!(
                e.start + slack >= t0 && e.stop <= t1 + slack,
                "{op}: channel {} ran [{}, {}] ns, outside [launch, sync] = [{t0}, {t1}] ± {slack}",
                e.n,
                e.start as i128 - t0 as i128,
                e.stop as i128 - t0 as i128
            );
            ensure!(e.stop - e.start <= t1 - t0 + slack, "{op}: channel {} longer than its call", e.n);
            ensure!(e.start >= p.start.saturating_sub(slack), "{op}: channel {} starts before its enqueue", e.n);
            dur += e.stop - e.start;
            chans += 1;
        }
    }
    Ok((want, chans, dur as f64 / chans.max(1) as f64 / 1e3))
}

/// Checks the events of operation `p`, which ran on the copy engines: no KernelCh, one CeColl
/// of its function under its API event, inside [launch, sync] ± `slack`; returns (1, its ns).
fn verify_ce(
    op: &str,
    evs: &HashMap<u64, Ev>,
    (pid, p): (u64, &Ev),
    (t0, t1): (u64, u64),
    slack: u64,
) -> anyhow::Result<(usize, u64)> {
    ensure!(
        !evs.values().any(|e| e.ty == Some(EventType::KernelCh) && e.parent == Some(pid)),
        "{op}: {} ran on the copy engines but has KernelCh events",
        p.func
    );
    let api = p.parent.context("a Coll/P2p with no API event")?;
    let ce: Vec<&Ev> = evs.values().filter(|e| e.ty == Some(EventType::CeColl) && e.parent == Some(api)).collect();
    ensure!(ce.len() == 1, "{op}: {} on the copy engines has {} CeColl events under its API event", p.func, ce.len());
    let e = ce[0];
    ensure!(e.func == p.func, "{op}: a CeColl of {} under the API event of {}", e.func, p.func);
    ensure!(e.stop >= e.start && e.stop > 0, "{op}: its CeColl stops before it starts");
    ensure!(
        e.start + slack >= t0 && e.stop <= t1 + slack,
        "{op}: its CeColl ran [{}, {}] ns, outside [launch, sync] = [{t0}, {t1}] ± {slack}",
        e.start as i128 - t0 as i128,
        e.stop as i128 - t0 as i128
    );
    ensure!(e.start + slack >= p.start, "{op}: its CeColl starts before its enqueue");
    Ok((1, e.stop - e.start))
}

/// Mean host time per call of `iters` 8 B `op`s (launch to stream done), and of their enqueue
/// alone (the calls' own host time), each of the slowest rank.
fn time_small(
    cc: &CudaComm,
    s: &Arc<CudaStream>,
    bufs: (u64, u64),
    iters: usize,
    op: &str,
) -> anyhow::Result<(f64, f64)> {
    for _ in 0..50 {
        launch(cc, s, op, bufs, 8)?;
    }
    s.synchronize()?;
    cc.flush_events();
    cc.comm().all_reduce(&[0u8], &mut [0u8], RedOp::Sum)?;
    let t = Instant::now();
    let mut enqueue = std::time::Duration::ZERO;
    for _ in 0..iters {
        let e = Instant::now();
        launch(cc, s, op, bufs, 8)?;
        enqueue += e.elapsed();
    }
    s.synchronize()?;
    let us = t.elapsed().as_secs_f64() * 1e6 / iters as f64;
    let enqueue_us = enqueue.as_secs_f64() * 1e6 / iters as f64;
    cc.flush_events();
    cc.device_error()?;
    let mut worst = [0f64; 2];
    cc.comm().all_reduce(&[us, enqueue_us], &mut worst, RedOp::Max)?;
    Ok((worst[0], worst[1]))
}

/// Timed 8 B calls on the copy engines for at least [`RENEWAL_RUN`] and until every rank's
/// event clock anchor has been measured again, at most [`RENEWAL_LIMIT`] (in rounds all ranks
/// end together, `rec`'s events dropped after each). Only the watcher's thread renews the
/// anchor that soon: a call's own thread would after 5 s without a measurement. Returns the
/// 99.9th percentile and the slowest of the calls' enqueues, in µs, of the slowest rank.
fn renews_the_clock(cc: &CudaComm, s: &Arc<CudaStream>, bufs: (u64, u64), rec: &Recorder) -> anyhow::Result<[f64; 2]> {
    let r = cc.rank();
    let Some(before) = cc.ce_clock() else { bail!("rank {r}: no device clock on the copy engines") };
    let t = Instant::now();
    let mut enqueues = Vec::new();
    loop {
        for _ in 0..100 {
            let e = Instant::now();
            launch(cc, s, "all_gather", bufs, 8)?;
            enqueues.push(e.elapsed().as_secs_f64() * 1e6);
        }
        s.synchronize()?;
        cc.flush_events();
        rec.take();
        let renewed = cc.ce_clock().is_some_and(|a| a.host_ns != before.host_ns);
        let mine = (t.elapsed() >= RENEWAL_RUN && renewed) || t.elapsed() >= RENEWAL_LIMIT;
        let mut all = [0u8];
        cc.comm().all_reduce(&[u8::from(mine)], &mut all, RedOp::Min)?;
        if all[0] == 1 {
            break;
        }
    }
    cc.device_error()?;
    let after = cc.ce_clock();
    ensure!(
        after.is_some_and(|a| a.host_ns != before.host_ns),
        "rank {r}: the device clock's anchor was not measured again in {:?} of timed calls: {before:?}, then {after:?}",
        t.elapsed()
    );
    enqueues.sort_by(f64::total_cmp);
    let at = |q: f64| enqueues[((enqueues.len() - 1) as f64 * q) as usize];
    let mut worst = [0f64; 2];
    cc.comm().all_reduce(&[at(0.999), at(1.0)], &mut worst, RedOp::Max)?;
    Ok(worst)
}

/// How long [`renews_the_clock`] times calls at least (past the anchor's life of a second),
/// and at most: a renewal whose stamps all wait too long is tried again a second later.
const RENEWAL_RUN: std::time::Duration = std::time::Duration::from_millis(1300);
const RENEWAL_LIMIT: std::time::Duration = std::time::Duration::from_millis(3500);

/// A second communicator of the same ranks on the same GPU places its stamps through the
/// first one's clock: the same anchor, to the nanosecond (two measurements never agree so).
fn shares_the_clock(cc: &CudaComm) -> anyhow::Result<()> {
    let Some(first) = cc.ce_clock() else { return Ok(()) };
    let r = cc.rank();
    let Some(c) = cc.comm().split(0, r as i32)? else { bail!("rank {r}: left out of its own split") };
    let second = CudaComm::new(c, cc.context().ordinal())?;
    // A renewal between the two reads moves both.
    let (a, b) = (second.ce_clock(), cc.ce_clock());
    ensure!(
        a == b && b.is_some(),
        "rank {r}: a second communicator's device clock {a:?}, the first's {b:?} (made with {first:?})"
    );
    Ok(())
}

pub fn run(cc: &CudaComm, s: &Arc<CudaStream>, args: &[String]) -> anyhow::Result<()> {
    let r = cc.rank();
    let Some(clock) = cc.clock_map() else { bail!("no KernelCh events on this device (see the log)") };
    let iters: usize =
        args.iter().position(|a| a == "--iters").and_then(|i| args.get(i + 1)).map_or(Ok(2000), |v| v.parse())?;
    let bytes = 4 << 20;
    let (_ib, i) = alloc(s, bytes * cc.nranks())?;
    let (_ob, o) = alloc(s, bytes * cc.nranks())?;
    let bufs = (i, o);
    cc.prepare(DataType::F32)?;
    // The event clock reads a stamp before its anchor as a negative time (an anchor renewed
    // between a call's enqueue and its collection lies after the call's stamps).
    let (a, b) = (Stamp::new(s.context())?, Stamp::new(s.context())?);
    a.record(s)?;
    launch(cc, s, "all_reduce_4M", bufs, bytes)?;
    b.record(s)?;
    s.synchronize()?;
    let (fwd, back) = (b.ns_since(&a)?, a.ns_since(&b)?);
    ensure!(fwd > 0 && (fwd + back).abs() <= 1_000, "rank {r}: stamps {fwd} ns apart one way, {back} ns the other");
    let all = EventMask::of(EventType::KernelCh) | EventType::KernelLaunch | EventType::CeColl;
    let rec = Recorder::new(all);
    let h = cc.comm().attach_sink(rec.clone()).map_err(|e| anyhow::anyhow!("{e}"))?;
    let (mut ops, mut chans, mut on_ce) = (0, 0, 0);
    for op in OPS {
        // Sends and receives need a peer.
        if (op == "send_recv" || op.starts_with("grouped")) && cc.nranks() < 2 {
            continue;
        }
        cc.comm().all_reduce(&[0u8], &mut [0u8], RedOp::Sum)?;
        rec.take();
        let t0 = unix_nanos();
        launch(cc, s, op, bufs, bytes)?;
        s.synchronize()?;
        let t1 = unix_nanos();
        let ce = cc.last_launch().0 == 0;
        cc.flush_events();
        cc.device_error()?;
        let ce_err = cc.ce_clock().map_or(0, |a| a.err_ns);
        let errs = (clock.err_ns, ce_err);
        let (o, c, mean_us) = verify(op, &rec.take(), (t0, t1), errs).with_context(|| format!("rank {r}"))?;
        (ops, chans, on_ce) = (ops + o, chans + c, on_ce + usize::from(ce));
        if r == 0 {
            let what = if ce { "ce_coll" } else { "kernel_ch" };
            println!(
                "{}",
                json!({"check": op, "ops": o, what: c, "mean_channel_us": (mean_us * 1000.0).round() / 1000.0,
                    "call_us": ((t1 - t0) as f64 / 1e3 * 1000.0).round() / 1000.0})
            );
        }
    }
    ensure!(cc.ce_events_pending().0 == 0, "rank {r}: copy-engine calls not reported after the flush");
    shares_the_clock(cc)?;
    // Under policy zero every all-gather, broadcast, all-to-all, send and receive runs on the
    // copy engines (two ranks of one process on one GPU excepted): the CeColl checks ran.
    let zero = cc.budget().policy == CtaPolicy::Zero;
    ensure!(
        !zero || cc.nranks() < 2 || on_ce == 6,
        "rank {r}: {on_ce} of 6 operations ran on the copy engines under policy zero"
    );
    // A captured launch: host events, no KernelCh, and no slot held.
    cc.comm().all_reduce(&[0u8], &mut [0u8], RedOp::Sum)?;
    rec.take();
    s.begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)?;
    launch(cc, s, "all_reduce_8B", bufs, 8)?;
    let g = s.end_capture(sys::CUgraphInstantiate_flags(0))?.context("empty graph")?;
    g.launch()?;
    s.synchronize()?;
    cc.flush_events();
    let evs = rec.take();
    let count = |t: EventType| evs.values().filter(|e| e.ty == Some(t)).count();
    ensure!(count(EventType::Coll) == 1 && count(EventType::KernelCh) == 0, "rank {r}: a captured launch: {evs:?}");
    ensure!(cc.kernel_events_pending().0 == 0, "rank {r}: a captured launch holds a timer slot");
    // The cost of KernelCh on the smallest operation, and of CeColl on the smallest call on
    // the copy engines.
    let (with_ch, _) = time_small(cc, s, bufs, iters, "all_reduce_8B")?;
    let with_ce = if on_ce > 0 { Some(time_small(cc, s, bufs, iters, "all_gather")?) } else { None };
    let (_, ce_untimed) = cc.ce_events_pending();
    let ce_tail = if on_ce > 0 { Some(renews_the_clock(cc, s, bufs, &rec)?) } else { None };
    cc.comm().detach_sink(h);
    let h = cc.comm().attach_sink(Recorder::new(EventMask::of(EventType::Coll))).map_err(|e| anyhow::anyhow!("{e}"))?;
    let (coll_only, _) = time_small(cc, s, bufs, iters, "all_reduce_8B")?;
    let ce_coll_only = if on_ce > 0 { Some(time_small(cc, s, bufs, iters, "all_gather")?) } else { None };
    cc.comm().detach_sink(h);
    let (none, _) = time_small(cc, s, bufs, iters, "all_reduce_8B")?;
    let (pending, untimed) = cc.kernel_events_pending();
    let round = |v: Option<f64>| v.map(|v| (v * 1000.0).round() / 1000.0);
    let (with_ce, with_ce_enqueue) = (with_ce.map(|t| t.0), with_ce.map(|t| t.1));
    let (ce_coll_only, ce_coll_only_enqueue) = (ce_coll_only.map(|t| t.0), ce_coll_only.map(|t| t.1));
    let last = cc.clock_map().unwrap_or(clock);
    if r == 0 {
        println!(
            "{}",
            json!({"ops": ops, "kernel_ch": chans, "clock_offset_ns": clock.offset_ns, "clock_err_ns": clock.err_ns,
                "clock_offset_ns_at_end": last.offset_ns, "clock_err_ns_at_end": last.err_ns, "drift_ppb": last.ppb,
                "iters": iters, "allreduce_8B_us_kernel_ch": (with_ch * 1000.0).round() / 1000.0,
                "allreduce_8B_us_coll_only": (coll_only * 1000.0).round() / 1000.0,
                "allreduce_8B_us_no_sink": (none * 1000.0).round() / 1000.0, "untimed": untimed, "pending": pending,
                "on_copy_engines": on_ce, "allgather_8B_ce_us_ce_coll": round(with_ce),
                "allgather_8B_ce_us_coll_only": round(ce_coll_only),
                "allgather_8B_ce_enqueue_us_ce_coll": round(with_ce_enqueue),
                "allgather_8B_ce_enqueue_us_coll_only": round(ce_coll_only_enqueue), "ce_untimed": ce_untimed,
                "allgather_8B_ce_enqueue_us_renewal_run_p999": round(ce_tail.map(|t| t[0])),
                "allgather_8B_ce_enqueue_us_renewal_run_max": round(ce_tail.map(|t| t[1])),
                "ce_clock_err_ns": cc.ce_clock().map(|a| a.err_ns)})
        );
    }
    println!(
        "rank {r}: events ok: {ops} operations ({on_ce} on the copy engines), {chans} KernelCh/CeColl, clock ± {} ns",
        clock.err_ns
    );
    Ok(())
}
