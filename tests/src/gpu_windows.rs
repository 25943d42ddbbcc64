//! Outputs in symmetric windows on the GPU: the region every rank maps and registers
//! ([`WindowedOut`], shared by `occl-gpu bench --windows`) and `occl-gpu check --windows`, which
//! checks all-gather, all-to-all and broadcast whose outputs lie in one, so that they take the
//! windowed paths (the kernels' windowed mode, or the copy engines' direct route under
//! `NCCL_CTA_POLICY=2`).
//!
//! ```text
//! occl-gpu check --ranks 4 --windows [--big 1G]
//! NCCL_CTA_POLICY=2 occl-gpu check --ranks 4 --windows
//! ```
//!
//! The check runs programs: a few calls on a rank's buffers, its window (buffer [`WIN`]) and
//! plain device buffers, checked against a host model of every rank's buffers ([`Model`]).
//! Before each program (and each replay of a captured one) every buffer a call may touch is
//! refilled on the device from a source buffer at a rotating offset, so that stale bytes and
//! bytes written where no call should are caught: after each, every byte of those buffers is
//! compared, the poison around each output included. Programs: each collective alone, at the
//! window's start and at an offset (the same on every rank) that is not 16-byte aligned, input
//! outside the window, inside it, and in place (an in-place all-to-all takes the slots);
//! broadcast from every root; calls back to back with no host sync that read what the previous
//! wrote, write where peers still read, and alternate with calls outside the window; the same
//! windows written again and again from moving inputs; and a CUDA graph of several windowed
//! calls replayed three times with its inputs refilled in between. The refills are
//! stream-ordered, with no host barrier: a peer may write into this rank's window only once this
//! rank's call has started. Sizes, for elements of 1, 2, 4 and 8 bytes: 0, 1, 3, 15, 16, 17, 1001
//! and 12345 elements and a handful of 8 and 64 KiB pieces per channel get every program; a
//! handful of 256 KiB pieces per channel, 64 MiB + 7 f32 per rank and `--big` (all-gather and
//! all-to-all outputs of that many bytes, as in `check`) get each collective once, out of place
//! at the unaligned offset.

use anyhow::{bail, Context};
use occl::cuda::kernels::cudarc::driver::{result, sys, CudaSlice, CudaStream, DevicePtr};
use occl::cuda::kernels::ipc::{DeviceRegion, IpcHandle, PeerRegion};
use occl::cuda::{CudaComm, Launch, WindowId};
use occl::{CollType, DataType, RedOp};
use std::sync::Arc;
use std::time::Instant;

/// A call's output in a symmetric window: this rank's region, mapped by every peer, and the
/// peers' regions mapped here.
pub struct WindowedOut {
    id: WindowId,
    peers: Vec<PeerRegion>,
    region: DeviceRegion,
}

impl WindowedOut {
    /// Allocates `bytes` on every rank and registers them as one symmetric window (collective).
    pub fn new(cc: &CudaComm, bytes: usize) -> anyhow::Result<WindowedOut> {
        let region = DeviceRegion::alloc(cc.context(), bytes.max(16))?;
        let all = cc.exchange(&region.ipc_handle()?)?;
        let (mut bases, mut peers) = (Vec::with_capacity(all.len()), Vec::new());
        for (q, h) in all.iter().enumerate() {
            if q == cc.rank() {
                bases.push(region.ptr());
                continue;
            }
            let h: IpcHandle = h.as_slice().try_into().context("a peer's IPC handle is not 64 bytes")?;
            let p = PeerRegion::open(cc.context(), &h)
                .with_context(|| format!("map rank {q}'s output (--windows needs one process per rank: --ranks)"))?;
            bases.push(p.ptr());
            peers.push(p);
        }
        let id = cc.add_symmetric_window(&bases, bytes as u64)?;
        Ok(WindowedOut { id, peers, region })
    }

    pub fn ptr(&self) -> u64 {
        self.region.ptr()
    }

    /// Unregisters the window and unmaps the peers' regions; frees this rank's once every rank
    /// has unmapped it (collective; `s` synchronized first, so no call still writes).
    pub fn close(self, cc: &CudaComm, s: &CudaStream) -> anyhow::Result<()> {
        s.synchronize()?;
        cc.comm().all_reduce(&[0u8], &mut [0u8], RedOp::Sum)?;
        cc.remove_window(self.id);
        drop(self.peers);
        cc.comm().all_reduce(&[0u8], &mut [0u8], RedOp::Sum)?;
        drop(self.region);
        Ok(())
    }
}

/// The window's buffer; then the plain ones: an input outside the window, an output outside
/// it, and the sources the buffers are refilled from.
pub const WIN: usize = 0;
pub const P_IN: usize = 1;
pub const P_OUT: usize = 2;
pub const SRC: usize = 3;
/// Bytes past a buffer's length that a source holds, so that refills at rotating offsets differ.
const ROTATE: usize = 4096;
/// Poison after the farthest output of a slot.
const TAIL: usize = 64;

/// The non-zero output offset for elements of `es` bytes: element-aligned, not 16-byte aligned.
pub fn shift(es: usize) -> usize {
    128 + 3 * es
}

/// Bytes of one slot of the window (and of a plain buffer): the largest span a call of `count`
/// elements of `es` bytes on `n` ranks touches (`n` blocks), after [`shift`], then poison;
/// 256-byte aligned so that every slot starts aligned.
pub fn slot_bytes(n: usize, count: usize, es: usize) -> usize {
    (n * count * es + shift(es) + TAIL).div_ceil(256) * 256
}

/// Every buffer's bytes: the window of `slots` slots, the plain input and output, `sources`
/// sources as long as the largest buffer plus [`ROTATE`].
pub fn buffer_bytes(slot: usize, slots: usize, plain_out: bool, sources: usize) -> Vec<usize> {
    let out = if plain_out { slot } else { 256 };
    let mut v = vec![slots * slot, slot, out];
    v.extend(std::iter::repeat_n(slots.max(1) * slot + ROTATE, sources));
    v
}

/// The element counts that make about `per` pieces of each of 8, 64 and 256 KiB per channel
/// (`channels`: the channels a per-rank share of that many bytes takes), plus odd elements so
/// that the last piece is short.
pub fn piece_counts(es: usize, per: usize, channels: impl Fn(u64) -> u32) -> Vec<usize> {
    [8usize << 10, 64 << 10, 256 << 10]
        .iter()
        .map(|&piece| {
            let mut bytes = per * piece;
            for _ in 0..4 {
                bytes = channels(bytes as u64).max(1) as usize * per * piece;
            }
            bytes / es + 7
        })
        .collect()
}

/// A place in a rank's buffers: rank `r`'s is `off + r * per_rank` of buffer `buf`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Loc {
    pub buf: usize,
    pub off: usize,
    pub per_rank: usize,
}

impl Loc {
    pub fn at(buf: usize, off: usize) -> Loc {
        Loc { buf, off, per_rank: 0 }
    }

    fn of(&self, r: usize) -> usize {
        self.off + r * self.per_rank
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Move {
    AllGather,
    AllToAll,
    Broadcast(usize),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// A collective of `count` elements of `es` bytes per rank (all-to-all: per peer).
    Call { mv: Move, count: usize, es: usize, src: Loc, dst: Loc },
    /// A device copy on every rank.
    Fill { src: Loc, dst: Loc, bytes: usize },
}

/// The bytes a call of `mv` reads and writes on each rank.
fn spans(mv: Move, n: usize, b: usize) -> (usize, usize) {
    match mv {
        Move::AllGather => (b, n * b),
        Move::AllToAll => (n * b, n * b),
        Move::Broadcast(_) => (b, b),
    }
}

/// Every rank's buffers on the host, as the device's must be after the same steps.
#[derive(Clone, Debug, PartialEq)]
pub struct Model {
    pub mem: Vec<Vec<Vec<u8>>>,
}

impl Model {
    /// `n` ranks with buffers of `bytes`: zeros, but sources (`SRC..`), which hold [`pattern`]s.
    /// A thread per rank: at `--big` every process models GiBs.
    pub fn new(n: usize, bytes: &[usize], salt: u64) -> Model {
        let rank = |r: usize| -> Vec<Vec<u8>> {
            bytes
                .iter()
                .enumerate()
                .map(|(b, &len)| {
                    let mut v = vec![0u8; len];
                    if b >= SRC {
                        pattern(salt, r, b, &mut v);
                    }
                    v
                })
                .collect()
        };
        Model { mem: on_threads((0..n).map(|r| move || rank(r)).collect()) }
    }

    fn span(&self, r: usize, at: Loc, len: usize) -> anyhow::Result<&[u8]> {
        let o = at.of(r);
        self.mem[r].get(at.buf).and_then(|b| b.get(o..o + len)).with_context(|| format!("{at:?}+{len} out of bounds"))
    }

    /// Runs `f` on every rank's buffers, a thread per rank, once every span lies inside every
    /// rank's buffers.
    fn each_rank(&mut self, spans: &[(Loc, usize)], f: impl Fn(usize, &mut [Vec<u8>]) + Sync) -> anyhow::Result<()> {
        for r in 0..self.mem.len() {
            for &(at, len) in spans {
                self.span(r, at, len)?;
            }
        }
        let f = &f;
        on_threads(self.mem.iter_mut().enumerate().map(|(r, bufs)| move || f(r, bufs)).collect());
        Ok(())
    }

    /// Applies `step` on every rank: every rank's input is read before any output is written,
    /// as a collective's is.
    pub fn apply(&mut self, step: &Step) -> anyhow::Result<()> {
        let n = self.mem.len();
        match *step {
            Step::Fill { src, dst, bytes } => self.each_rank(&[(src, bytes), (dst, bytes)], |r, bufs| {
                let (from, to) = (src.of(r), dst.of(r));
                if src.buf == dst.buf {
                    bufs[src.buf].copy_within(from..from + bytes, to);
                    return;
                }
                let (s, d) = if src.buf < dst.buf {
                    let (lo, hi) = bufs.split_at_mut(dst.buf);
                    (&lo[src.buf], &mut hi[0])
                } else {
                    let (lo, hi) = bufs.split_at_mut(src.buf);
                    (&hi[0], &mut lo[dst.buf])
                };
                d[to..to + bytes].copy_from_slice(&s[from..from + bytes]);
            }),
            Step::Call { mv, count, es, src, dst } => {
                let b = count * es;
                let (ib, ob) = spans(mv, n, b);
                let spans: Vec<&[u8]> = (0..n).map(|r| self.span(r, src, ib)).collect::<Result<_, _>>()?;
                let ins: Vec<Vec<u8>> = on_threads(spans.iter().map(|&i| move || i.to_vec()).collect());
                let ins = &ins;
                self.each_rank(&[(dst, ob)], |r, bufs| {
                    let o = dst.of(r);
                    let out = &mut bufs[dst.buf][o..o + ob];
                    match mv {
                        Move::AllGather => {
                            for (q, i) in ins.iter().enumerate() {
                                out[q * b..(q + 1) * b].copy_from_slice(i);
                            }
                        }
                        Move::AllToAll => {
                            for (q, i) in ins.iter().enumerate() {
                                out[q * b..(q + 1) * b].copy_from_slice(&i[r * b..(r + 1) * b]);
                            }
                        }
                        Move::Broadcast(root) => out.copy_from_slice(&ins[root]),
                    }
                })
            }
        }
    }
}

/// Runs every job on a thread of its own and returns their results in order; a job's panic
/// goes on in the caller.
fn on_threads<T: Send>(jobs: Vec<impl FnOnce() -> T + Send>) -> Vec<T> {
    std::thread::scope(|s| {
        let running: Vec<_> = jobs.into_iter().map(|j| s.spawn(j)).collect();
        running.into_iter().map(|h| h.join().unwrap_or_else(|e| std::panic::resume_unwind(e))).collect()
    })
}

/// Rank `r`'s bytes of buffer `buf`: distinct per rank, buffer and place (`salt`: per run).
pub fn pattern(salt: u64, r: usize, buf: usize, out: &mut [u8]) {
    let seed = salt ^ ((r as u64) << 48) ^ ((buf as u64) << 40);
    for (i, c) in out.chunks_mut(8).enumerate() {
        let mut z = seed.wrapping_add((i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15));
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        c.copy_from_slice(&z.to_le_bytes()[..c.len()]);
    }
}

/// A few calls run back to back, or captured once and replayed `replays` times.
#[derive(Clone, Debug, PartialEq)]
pub struct Program {
    pub name: String,
    pub calls: Vec<Step>,
    pub replays: usize,
}

/// The programs for `count` elements of `es` bytes on `n` ranks in slots of `slot` bytes.
/// `full`: the whole set on a window of 3 slots; else each collective once, out of place, in
/// a window of 1 slot (large sizes).
pub fn programs(n: usize, count: usize, es: usize, slot: usize, full: bool) -> Vec<Program> {
    let b = count * es;
    let sh = shift(es);
    let w = |k: usize, off: usize| Loc::at(WIN, k * slot + off);
    let call = |mv, src, dst| Step::Call { mv, count, es, src, dst };
    let one = |name: String, s: Step| Program { name, calls: vec![s], replays: 0 };
    let mut v = Vec::new();
    if !full {
        v.push(one("all_gather".into(), call(Move::AllGather, Loc::at(P_IN, 0), w(0, sh))));
        v.push(one("all_to_all".into(), call(Move::AllToAll, Loc::at(P_IN, 0), w(0, sh))));
        for root in [0, n - 1] {
            v.push(one(format!("broadcast root {root}"), call(Move::Broadcast(root), Loc::at(P_IN, 0), w(0, sh))));
        }
        return v;
    }
    for off in [0, sh] {
        let at = |what: &str| format!("{what}, output at +{off}");
        let out = w(0, off);
        let own = Loc { buf: WIN, off, per_rank: b };
        v.push(one(at("all_gather, input outside"), call(Move::AllGather, Loc::at(P_IN, off), out)));
        v.push(one(at("all_gather, input in the window"), call(Move::AllGather, w(2, off), out)));
        v.push(one(at("all_gather in place"), call(Move::AllGather, own, out)));
        v.push(one(at("all_to_all, input outside"), call(Move::AllToAll, Loc::at(P_IN, off), out)));
        v.push(one(at("all_to_all, input in the window"), call(Move::AllToAll, w(1, off), out)));
        v.push(one(at("all_to_all in place (slots)"), call(Move::AllToAll, out, out)));
        for root in 0..n {
            let bc = Move::Broadcast(root);
            v.push(one(at(&format!("broadcast root {root}, input outside")), call(bc, Loc::at(P_IN, off), out)));
            v.push(one(at(&format!("broadcast root {root} in place")), call(bc, out, out)));
        }
        v.push(one(at("broadcast, input in the window"), call(Move::Broadcast(n - 1), w(1, off), out)));
    }
    let own = |k: usize| Loc { buf: WIN, off: k * slot + sh, per_rank: b };
    // Every call changes what the program leaves (a test holds it to that), so a call that
    // wrote nothing or wrote stale bytes shows.
    v.push(Program {
        name: "back to back".into(),
        calls: vec![
            call(Move::AllGather, Loc::at(P_IN, 0), w(0, sh)),
            // Reads what the peers' all-gather wrote into this rank's window.
            call(Move::AllToAll, w(0, sh), w(1, sh)),
            // Outside the window: the slots.
            call(Move::AllGather, w(1, sh), Loc::at(P_OUT, 0)),
            call(Move::Broadcast(n - 1), Loc::at(P_OUT, 0), w(2, sh)),
            // Writes where the peers' all-gather read.
            call(Move::AllGather, own(1), w(1, sh)),
            // Writes where the peers' all-to-all read.
            call(Move::AllToAll, Loc::at(P_IN, 0), w(0, sh)),
            call(Move::Broadcast(0), w(0, sh), w(0, sh)),
            call(Move::AllToAll, w(2, sh), Loc::at(P_OUT, 0)),
            call(Move::AllGather, own(2), w(2, sh)),
        ],
        replays: 0,
    });
    // The same windows again and again, each call's input and output a little further on: a
    // call that kept what the one before left (a counter or handshake not reset) leaves the
    // wrong bytes.
    let from = |k: usize| Loc::at(P_IN, 2 * k * es);
    v.push(Program {
        name: "repeated".into(),
        calls: (0..4)
            .flat_map(|k| {
                [
                    call(Move::AllGather, from(k), w(0, sh + k * es)),
                    call(Move::AllToAll, from(k), w(1, sh + k * es)),
                    call(Move::Broadcast(k % n), from(k), w(2, sh + k * es)),
                ]
            })
            .collect(),
        replays: 0,
    });
    v.push(Program {
        name: "graph".into(),
        calls: vec![
            call(Move::AllGather, Loc::at(P_IN, 0), w(0, sh)),
            call(Move::AllToAll, w(0, sh), w(1, sh)),
            call(Move::AllGather, own(1), w(1, sh)),
            call(Move::AllToAll, Loc::at(P_IN, 0), Loc::at(P_OUT, 0)),
            call(Move::Broadcast(n - 1), Loc::at(P_OUT, 0), w(2, sh)),
        ],
        replays: 3,
    });
    v
}

/// The refills before program (or replay) number `j`: every buffer a call may touch, from
/// source `j % sources` at an offset that moves with `j` and differs between the buffers (so
/// that no input starts out equal to where it is copied).
pub fn refills(bytes: &[usize], j: usize) -> Vec<Step> {
    let sources = bytes.len().saturating_sub(SRC).max(1);
    [WIN, P_IN, P_OUT]
        .iter()
        .map(|&buf| {
            let src = Loc::at(SRC + j % sources, (j * 40 + buf * 1352) % ROTATE);
            Step::Fill { src, dst: Loc::at(buf, 0), bytes: bytes[buf] }
        })
        .collect()
}

/// Cases run and cases with a wrong byte.
#[derive(Default)]
struct Tally {
    cases: usize,
    bad: usize,
}

/// One rank's buffers on the device for a group of programs, and the model beside them.
struct Group<'a> {
    cc: &'a CudaComm,
    s: &'a Arc<CudaStream>,
    dt: DataType,
    win: Option<WindowedOut>,
    _plain: Vec<CudaSlice<u8>>,
    base: Vec<u64>,
    bytes: Vec<usize>,
    model: Model,
}

impl<'a> Group<'a> {
    fn new(
        cc: &'a CudaComm,
        s: &'a Arc<CudaStream>,
        dt: DataType,
        bytes: Vec<usize>,
        salt: u64,
    ) -> anyhow::Result<Self> {
        let (r, n) = (cc.rank(), cc.nranks());
        let model = Model::new(n, &bytes, salt);
        let win = WindowedOut::new(cc, bytes[WIN])?;
        let mut base = vec![win.ptr()];
        let mut plain = Vec::new();
        for (i, &len) in bytes.iter().enumerate().skip(1) {
            let mut d = s.alloc_zeros::<u8>(len.max(16))?;
            if i >= SRC {
                s.memcpy_htod(&model.mem[r][i], &mut d.slice_mut(..len))?;
            }
            base.push(d.device_ptr(s).0);
            plain.push(d);
        }
        s.synchronize()?;
        Ok(Group { cc, s, dt, win: Some(win), _plain: plain, base, bytes, model })
    }

    fn addr(&self, at: Loc) -> u64 {
        self.base[at.buf] + at.of(self.cc.rank()) as u64
    }

    /// Enqueues `step` on the stream (the model is not touched).
    fn enqueue(&self, step: &Step) -> anyhow::Result<()> {
        let (cc, s, dt) = (self.cc, self.s, self.dt);
        match *step {
            Step::Fill { src, dst, bytes } => {
                self.model.span(cc.rank(), src, bytes)?;
                self.model.span(cc.rank(), dst, bytes)?;
                s.context().bind_to_thread()?;
                // SAFETY: both spans lie in this rank's buffers (checked against the model's).
                unsafe { result::memcpy_dtod_async(self.addr(dst), self.addr(src), bytes, s.cu_stream())? };
            }
            Step::Call { mv, count, es, src, dst } => {
                let (ib, ob) = spans(mv, cc.nranks(), count * es);
                self.model.span(cc.rank(), src, ib)?;
                self.model.span(cc.rank(), dst, ob)?;
                let (src, dst) = (self.addr(src), self.addr(dst));
                // SAFETY: the spans the call reads and writes lie in this rank's buffers (checked
                // against the model's), alive until the group is dropped after a sync.
                unsafe {
                    match mv {
                        Move::AllGather => cc.all_gather_raw(s, src, dst, count, dt)?,
                        Move::AllToAll => cc.all_to_all_raw(s, src, dst, count, dt)?,
                        Move::Broadcast(root) => cc.broadcast_raw(s, src, dst, count, dt, root)?,
                    }
                }
            }
        }
        Ok(())
    }

    /// Waits for the stream and compares every byte of the buffers calls touch against the
    /// model; prints the first few wrong. Returns wrong bytes.
    fn compare(&self, what: &str) -> anyhow::Result<usize> {
        let (s, r) = (self.s, self.cc.rank());
        s.synchronize()?;
        self.cc.device_error()?;
        s.context().bind_to_thread()?;
        let mut wrong = 0;
        for buf in [WIN, P_IN, P_OUT] {
            let mut got = vec![0u8; self.bytes[buf]];
            // SAFETY: the buffer's whole length into a host vector as long; waited for below.
            unsafe { result::memcpy_dtoh_async(&mut got, self.base[buf], s.cu_stream())? };
            s.synchronize()?;
            let want = &self.model.mem[r][buf];
            if got == *want {
                continue;
            }
            for (i, (g, w)) in got.iter().zip(want).enumerate() {
                if g != w {
                    if wrong < 3 {
                        let name = ["window", "plain input", "plain output"][buf];
                        eprintln!("rank {r}: {what}: {name} byte {i} = {g:#04x}, want {w:#04x}");
                    }
                    wrong += 1;
                }
            }
        }
        Ok(wrong)
    }

    /// Runs program `p` (number `j` for its refills) and checks it after each run or replay.
    fn run(&mut self, p: &Program, j: &mut usize, label: &str, t: &mut Tally) -> anyhow::Result<()> {
        let refill = |g: &mut Self, j: &mut usize| -> anyhow::Result<()> {
            for f in refills(&g.bytes, *j) {
                g.enqueue(&f)?;
                g.model.apply(&f)?;
            }
            *j += 1;
            Ok(())
        };
        let mut tally = |g: &Self, what: String| -> anyhow::Result<()> {
            let w = g.compare(&what)?;
            t.cases += 1;
            if w > 0 {
                eprintln!("rank {}: {what}: {w} wrong bytes", g.cc.rank());
                t.bad += 1;
            }
            Ok(())
        };
        if p.replays == 0 {
            refill(self, j)?;
            for c in &p.calls {
                self.enqueue(c)?;
                self.model.apply(c)?;
            }
            return tally(self, format!("{label} {}", p.name));
        }
        let s = self.s;
        s.begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)?;
        let captured = p.calls.iter().try_for_each(|c| self.enqueue(c));
        let g = s.end_capture(sys::CUgraphInstantiate_flags(0))?;
        captured?;
        // Calls of no element enqueue nothing: an empty capture.
        if g.is_none() && p.calls.iter().any(|c| matches!(c, Step::Call { count, .. } if *count > 0)) {
            bail!("{label} {}: nothing captured", p.name);
        }
        for k in 0..p.replays {
            refill(self, j)?;
            if let Some(g) = &g {
                g.launch()?;
            }
            for c in &p.calls {
                self.model.apply(c)?;
            }
            tally(self, format!("{label} {} replay {k}", p.name))?;
        }
        Ok(())
    }

    fn close(mut self) -> anyhow::Result<()> {
        match self.win.take() {
            Some(w) => w.close(self.cc, self.s),
            None => Ok(()),
        }
    }
}

/// A type of `es` bytes (the calls move bytes; the type sets the count's unit).
fn of_size(es: usize) -> DataType {
    match es {
        1 => DataType::I8,
        2 => DataType::Bf16,
        4 => DataType::F32,
        _ => DataType::F64,
    }
}

/// `occl-gpu check --windows`: every program for every type size at counts up to a few pieces
/// of 8 KiB per channel, then each collective once at the larger counts. Prints `rank R: N
/// cases, W wrong (windows) in S s`; an error when one is wrong.
pub fn check(cc: &CudaComm, s: &Arc<CudaStream>, big: usize) -> anyhow::Result<()> {
    let (r, n) = (cc.rank(), cc.nranks());
    if cc.is_staged() {
        bail!("check --windows: peers on other hosts have no mapped outputs");
    }
    if r == 0 {
        let b = cc.budget();
        let on = if cc.on_copy_engines(CollType::AllGather) {
            "the copy engines".to_string()
        } else if b.may_use_copy_engines() {
            // The budget's own choice: large all-gathers and all-to-alls.
            format!("the kernels, from {} bytes a peer the copy engines", b.ce_share)
        } else {
            "the kernels".to_string()
        };
        println!("occl-gpu check --windows: {n} ranks, windowed calls on {on}");
    }
    let (mut t, mut j, t0) = (Tally::default(), 0usize, Instant::now());
    let mut group = |count: usize, es: usize, full: bool, t: &mut Tally| -> anyhow::Result<()> {
        let slot = slot_bytes(n, count, es);
        let bytes = if full { buffer_bytes(slot, 3, true, 2) } else { buffer_bytes(slot, 1, false, 1) };
        let mut g = Group::new(cc, s, of_size(es), bytes, 0x5eed_0000 + j as u64)?;
        let label = format!("{} x{count}", of_size(es));
        if r == 0 {
            // Where a hang was, should one come, and where the time goes.
            let what = if full { "every program" } else { "single calls" };
            eprintln!("occl-gpu check --windows: {label}: {what} (at {:.1} s)", t0.elapsed().as_secs_f64());
        }
        for p in programs(n, count, es, slot, full) {
            g.run(&p, &mut j, &label, t)?;
        }
        g.close()
    };
    for es in [1, 2, 4, 8] {
        let pieces = piece_counts(es, 3, |b| cc.channels_for(b, Launch::Window));
        for c in [0, 1, 3, 15, 16, 17, 1001, 12_345, pieces[0]] {
            group(c, es, true, &mut t)?;
        }
        // 64 and 256 KiB pieces on every channel: MiBs to tens of MiB per rank, each collective
        // once (every program at that size would copy GBs to the host to compare per rank).
        for &c in &pieces[1..] {
            group(c, es, false, &mut t)?;
        }
    }
    // Across many pieces, then the large size once.
    group((64 << 20) / 4 + 7, 4, false, &mut t)?;
    group((big / 4 / n).max(1), 4, false, &mut t)?;
    println!("rank {r}: {} cases, {} wrong (windows) in {:.1} s", t.cases, t.bad, t0.elapsed().as_secs_f64());
    if t.bad > 0 {
        bail!("{} of {} cases wrong (windows)", t.bad, t.cases);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn loc(buf: usize, off: usize) -> Loc {
        Loc::at(buf, off)
    }

    fn filled(n: usize, len: usize) -> Model {
        let mut m = Model::new(n, &[len, len, len], 0);
        for (r, bufs) in m.mem.iter_mut().enumerate() {
            for (b, v) in bufs.iter_mut().enumerate() {
                for (i, x) in v.iter_mut().enumerate() {
                    *x = (r * 100 + b * 10 + i) as u8;
                }
            }
        }
        m
    }

    #[test]
    fn the_model_moves_blocks_as_the_collectives_do() {
        let mut m = filled(3, 16);
        let ag = Step::Call { mv: Move::AllGather, count: 1, es: 2, src: loc(1, 0), dst: loc(0, 4) };
        m.apply(&ag).unwrap();
        assert_eq!(&m.mem[2][0][4..10], &[10, 11, 110, 111, 210, 211], "every rank's input in rank order");
        assert_eq!(&m.mem[0][0][..4], &[0, 1, 2, 3], "before the output: untouched");
        assert_eq!(m.mem[0][0][10], 10, "after it too");
        let mut m = filled(2, 8);
        let a2a = Step::Call { mv: Move::AllToAll, count: 2, es: 1, src: loc(1, 0), dst: loc(2, 0) };
        m.apply(&a2a).unwrap();
        assert_eq!(&m.mem[0][2][..4], &[10, 11, 110, 111], "rank 0 gets every rank's block 0");
        assert_eq!(&m.mem[1][2][..4], &[12, 13, 112, 113]);
        let bc = Step::Call { mv: Move::Broadcast(1), count: 3, es: 1, src: loc(1, 2), dst: loc(0, 0) };
        m.apply(&bc).unwrap();
        assert_eq!(&m.mem[0][0][..3], &[112, 113, 114]);
        assert_eq!(&m.mem[1][0][..4], &[112, 113, 114, 103]);
    }

    #[test]
    fn in_place_calls_read_every_input_before_writing() {
        let mut m = filled(2, 8);
        let own = Loc { buf: 0, off: 2, per_rank: 2 };
        m.apply(&Step::Call { mv: Move::AllGather, count: 1, es: 2, src: own, dst: loc(0, 2) }).unwrap();
        assert_eq!(&m.mem[1][0][2..6], &[2, 3, 104, 105]);
        let mut m = filled(2, 8);
        m.apply(&Step::Call { mv: Move::AllToAll, count: 2, es: 1, src: loc(0, 0), dst: loc(0, 0) }).unwrap();
        assert_eq!(&m.mem[0][0][..4], &[0, 1, 100, 101]);
        assert_eq!(&m.mem[1][0][..4], &[2, 3, 102, 103]);
        let oob = Step::Fill { src: loc(1, 4), dst: loc(0, 0), bytes: 5 };
        assert!(m.apply(&oob).is_err(), "a span past a buffer is refused");
    }

    #[test]
    fn slots_hold_every_span_and_offsets_stay_unaligned() {
        for es in [1, 2, 4, 8] {
            let sh = shift(es);
            assert_eq!(sh % es, 0);
            assert_ne!(sh % 16, 0, "es {es}: the offset must not be 16-byte aligned");
            for (n, c) in [(1, 0), (2, 1), (4, 1001), (8, 12_345)] {
                let s = slot_bytes(n, c, es);
                assert_eq!(s % 256, 0);
                assert!(s >= n * c * es + sh + TAIL);
            }
        }
        assert_eq!(buffer_bytes(512, 3, true, 2), vec![1536, 512, 512, 1536 + ROTATE, 1536 + ROTATE]);
        assert_eq!(buffer_bytes(512, 1, false, 1), vec![512, 512, 256, 512 + ROTATE]);
    }

    #[test]
    fn piece_counts_follow_the_channels() {
        // 4 channels below 1 MiB, 32 above.
        let ch = |b: u64| -> u32 {
            if b < 1 << 20 {
                4
            } else {
                32
            }
        };
        let c = piece_counts(4, 3, ch);
        assert_eq!(c, vec![4 * 3 * 8192 / 4 + 7, 4 * 3 * 65536 / 4 + 7, 32 * 3 * 262_144 / 4 + 7]);
        for (k, piece) in [8 << 10, 64 << 10, 256 << 10].into_iter().enumerate() {
            let per_channel = c[k] * 4 / ch((c[k] * 4) as u64) as usize;
            assert!(per_channel >= 3 * piece && per_channel < 4 * piece, "a handful of pieces per channel");
        }
    }

    #[test]
    fn patterns_differ_by_rank_buffer_and_place() {
        let mut a = vec![0u8; 64];
        let mut b = vec![0u8; 64];
        pattern(1, 0, 3, &mut a);
        pattern(1, 1, 3, &mut b);
        assert_ne!(a, b);
        pattern(1, 0, 4, &mut b);
        assert_ne!(a, b);
        assert_ne!(a[..8], a[8..16]);
        let mut c = vec![0u8; 13];
        pattern(1, 0, 3, &mut c);
        assert_eq!(c, a[..13], "deterministic, any length");
    }

    #[test]
    fn every_program_stays_in_its_buffers_and_windowed_outputs_share_an_offset() {
        for n in [1, 2, 3, 4, 8] {
            for (count, es, full) in [(0, 1, true), (1, 8, true), (17, 2, true), (1001, 4, true), (33, 4, false)] {
                let slot = slot_bytes(n, count, es);
                let bytes = if full { buffer_bytes(slot, 3, true, 2) } else { buffer_bytes(slot, 1, false, 1) };
                let mut m = Model::new(n, &bytes, 7);
                let ps = programs(n, count, es, slot, full);
                let roots: std::collections::HashSet<usize> = ps
                    .iter()
                    .flat_map(|p| &p.calls)
                    .filter_map(|c| match c {
                        Step::Call { mv: Move::Broadcast(root), .. } => Some(*root),
                        _ => None,
                    })
                    .collect();
                assert_eq!(roots.len(), if full { n } else { n.min(2) }, "n {n}: broadcast from every root");
                for (j, p) in ps.iter().enumerate() {
                    for f in refills(&bytes, j) {
                        m.apply(&f).unwrap();
                    }
                    for c in &p.calls {
                        m.apply(c).unwrap_or_else(|e| panic!("n {n} count {count} es {es} {}: {e}", p.name));
                        if let Step::Call { dst, .. } = c {
                            assert_eq!(dst.per_rank, 0, "an output at the same offset on every rank");
                        }
                    }
                }
                if full {
                    assert!(ps.iter().any(|p| p.replays >= 3 && p.calls.len() > 3));
                    assert!(ps
                        .iter()
                        .any(|p| p.calls.iter().any(|c| matches!(c, Step::Call { dst, .. } if dst.buf == P_OUT))));
                }
            }
        }
    }

    /// What a program (one run of it) leaves in the buffers calls touch, without call `skip`.
    fn after(n: usize, bytes: &[usize], p: &Program, skip: Option<usize>) -> Vec<Vec<Vec<u8>>> {
        let mut m = Model::new(n, bytes, 9);
        for f in refills(bytes, 5) {
            m.apply(&f).unwrap();
        }
        for (i, c) in p.calls.iter().enumerate() {
            if Some(i) != skip {
                m.apply(c).unwrap();
            }
        }
        m.mem.into_iter().map(|mut b| b.drain(..SRC).collect()).collect()
    }

    #[test]
    fn every_call_of_every_program_leaves_a_trace() {
        for n in [2, 3, 4] {
            for (count, es) in [(17, 2), (3, 8), (1001, 1)] {
                let slot = slot_bytes(n, count, es);
                let bytes = buffer_bytes(slot, 3, true, 2);
                for p in programs(n, count, es, slot, true) {
                    let all = after(n, &bytes, &p, None);
                    for i in 0..p.calls.len() {
                        let without = after(n, &bytes, &p, Some(i));
                        assert!(all != without, "n {n} count {count}: {} call {i} leaves no trace", p.name);
                    }
                }
            }
        }
    }

    #[test]
    fn refills_rotate_over_sources_and_offsets() {
        let bytes = buffer_bytes(512, 3, true, 2);
        let (a, b) = (refills(&bytes, 0), refills(&bytes, 1));
        assert_eq!(a.len(), 3);
        assert_ne!(a[0], b[0]);
        let m = Model::new(2, &bytes, 3);
        let src = |s: &Step| match *s {
            Step::Fill { src, bytes, .. } => m.span(0, src, bytes).unwrap().to_vec(),
            _ => unreachable!(),
        };
        assert_ne!(src(&a[0]), src(&refills(&bytes, 2)[0]), "the same source at another offset");
    }
}
