//! Collective algorithms: ring (all-reduce, all-gather, reduce-scatter), chains (broadcast,
//! reduce), trees (all-reduce, broadcast, reduce), PAT (all-gather, reduce-scatter), one-shot
//! (all-reduce) and direct exchanges (all-to-all, send/recv); the tuner (`tune`) picks one per
//! call. They run as a sequence of primitives (`prims`) that the calling thread drives through
//! the FIFOs. The calling thread is also the
//! progress engine for tcp: every wait moves the sockets of all the communicator's tcp links
//! (`transport::tcp`), and an operation returns only once its data is on the wire.

pub(crate) mod algo;
pub(crate) mod direct;
pub(crate) mod order;
pub(crate) mod pat;
pub(crate) mod plan;
pub(crate) mod prims;
pub(crate) mod ring;
pub(crate) mod shape;
#[cfg(test)]
mod sim;
pub(crate) mod tree;
pub(crate) mod tune;
pub(crate) mod walk;

use crate::dtype::{DataType, RedOp};
use crate::error::{Error, ErrorKind, Result};
use crate::profile::{OpProf, Tally};
use crate::record::{CollType, OpRecord};
use crate::transport::fifo::{ll, Desc, Ends, Members};
use crate::transport::Peer;
use crate::wait::{Deadline, Drive};
use algo::{Algo, Proto};
use prims::{Prims, RecvEnd, SendEnd};
use shape::Shape;
use std::sync::atomic::AtomicBool;
use walk::Run;

/// What one operation runs with.
pub(crate) struct Ctx<'a> {
    /// This rank, or its position in `order` when that is set.
    pub rank: usize,
    pub nranks: usize,
    pub peers: &'a mut [Option<Peer>],
    /// Connects a peer the first time an operation needs it.
    pub lazy: Option<&'a crate::transport::connect::Lazy>,
    pub abort: &'a AtomicBool,
    pub deadline: Deadline,
    pub desc: Desc,
    pub dt: DataType,
    pub op: RedOp,
    /// The operation's protocol (the tuner's choice).
    pub proto: Proto,
    /// Bytes per slice and per step (`geometry` of the operation's algorithm and protocol on
    /// the communicator's FIFOs), worked out once per operation: every primitive asks for them.
    pub geo: (usize, usize),
    /// Progresses the communicator's tcp sockets while this rank waits (none without tcp peers).
    pub drive: Option<&'a dyn Drive>,
    /// Reused staging memory (in-place all-to-all), kept by the communicator between calls so
    /// large operations do not fault in fresh pages every time.
    pub staging: &'a mut Vec<u64>,
    /// The operation's profiler events, when a sink wants any.
    pub prof: Option<&'a OpProf<'a>>,
    /// What the primitives move, for the direct metrics route (`crate::profile`).
    pub tally: Option<&'a Tally>,
    /// The rank record (what a blocked wait waits on).
    pub record: &'a crate::record::OpRecord,
    /// Every peer's FIFO ends, for waits to notice a failure elsewhere in the communicator.
    pub members: Option<&'a crate::transport::peers::PeerTable>,
    /// Set for ring, chain and tree operations when the host-grouped order is not rank order:
    /// `rank`, the peers given to `prims` and roots are then positions in it.
    pub order: Option<&'a order::RingOrder>,
}

/// Bytes per slice: one slot of whole elements of `dt` (Simple; p2p and all-to-all).
pub(crate) fn slice_bytes(slot: usize, dt: DataType) -> usize {
    slot / dt.size() * dt.size()
}

/// LL payload bytes per slice, per algorithm: at most one LL step. Multi-hop algorithms pass
/// each slice on only once it is whole, so shorter slices pipeline better over their hops
/// while each step's fixed costs (flags, acknowledgement) favour longer ones.
fn ll_slice(algo: Algo) -> usize {
    match algo {
        Algo::Ring | Algo::Chain | Algo::Tree | Algo::Pat | Algo::OneShot | Algo::Direct => ll::STEP_BYTES,
    }
}

/// Bytes per slice and per step of an algorithm (ring chunk, tree piece) for `algo` with
/// `proto` on FIFOs of `nslots` Simple slots of `slot` bytes (LL has its own ring of
/// `ll::STEPS`). A step is half the FIFO, so the next step's send never waits on this one.
pub(crate) fn geometry(algo: Algo, proto: Proto, slot: usize, nslots: usize, dt: DataType) -> (usize, usize) {
    let (slice, depth) = match proto {
        Proto::Simple => (slice_bytes(slot, dt), nslots),
        Proto::Ll => ((ll_slice(algo) / dt.size() * dt.size()).max(dt.size()), ll::STEPS),
    };
    (slice, slice * (depth / 2).max(1))
}

impl<'a> Ctx<'a> {
    pub(crate) fn chunk(&self) -> usize {
        self.geo.1
    }

    fn slice(&self) -> usize {
        self.geo.0
    }

    /// The shape a schedule walks: `count` elements per rank (per block).
    fn shape(&self, coll: CollType, algo: Algo, count: usize, root: usize) -> Shape<'a> {
        Shape {
            coll,
            algo,
            nranks: self.nranks,
            rank: self.rank,
            count,
            elem: self.dt.size(),
            slice: self.slice(),
            chunk: self.chunk(),
            root,
            peer: 0,
            order: self.order,
        }
    }

    /// The rank at position `p` (`p` itself without an order).
    pub(crate) fn real(&self, p: usize) -> usize {
        self.order.map_or(p, |o| o.rank(p))
    }

    /// The position of `rank` (`rank` itself without an order).
    fn virt(&self, rank: usize) -> usize {
        self.order.map_or(rank, |o| o.pos(rank))
    }

    /// How waits on FIFOs of `peer` tell that it, or the operation, is gone.
    fn ends(&self, peer: usize, liveness: crate::transport::fifo::Liveness) -> Ends<'a> {
        Ends {
            peer,
            liveness,
            abort: self.abort,
            drive: self.drive,
            sleeper: self.prof.and_then(|p| p.sleeper()),
            record: Some(self.record),
            waited: self.tally.map(Tally::wait_sums),
            members: self.members.map(|m| m as &dyn Members),
        }
    }

    /// The connection to rank `p` (a real rank), made on first use, and how waits on its
    /// FIFOs tell that it or the operation is gone.
    fn peer(&mut self, p: usize) -> Result<(&mut Peer, Ends<'a>)> {
        crate::transport::connect::ensure(self.peers, p, self.lazy, self.members)?;
        let mut ends = self.ends(p, crate::transport::fifo::Liveness::Local);
        let peer = self.peers.get_mut(p).and_then(Option::as_mut).ok_or_else(|| missing(p))?;
        ends.liveness = peer.liveness;
        Ok((peer, ends))
    }

    /// Primitives that send to `to` and receive from `from` (either may be absent), given as
    /// positions when the operation runs in ring order, built in `slot`: they are large, and
    /// building them where they stay saves a copy per operation.
    pub(crate) fn prims<'s, 'x>(
        &'s mut self,
        slot: &'x mut Option<Prims<'s>>,
        to: Option<usize>,
        from: Option<usize>,
    ) -> Result<&'x mut Prims<'s>> {
        self.prims_for(slot, to, from, true)
    }

    /// As `prims`; `steps` says whether they move the operation's data (its steps, which the
    /// profiler and the metrics see) or only messages that carry no data (`rooted`'s
    /// descriptors).
    fn prims_for<'s, 'x>(
        &'s mut self,
        slot: &'x mut Option<Prims<'s>>,
        to: Option<usize>,
        from: Option<usize>,
        steps: bool,
    ) -> Result<&'x mut Prims<'s>> {
        let (to, from) = (to.map(|p| self.real(p)), from.map(|p| self.real(p)));
        for p in [to, from].into_iter().flatten() {
            crate::transport::connect::ensure(self.peers, p, self.lazy, self.members)?;
        }
        let (slice, ll) = (self.slice(), self.proto == Proto::Ll);
        let mut base = self.ends(0, crate::transport::fifo::Liveness::Local);
        if !steps {
            // Not the operation's steps: their waits are no step's either.
            base.waited = None;
        }
        let ends = |peer, liveness| Ends { peer, liveness, ..base };
        let (send, recv) = match (to, from) {
            (Some(a), Some(b)) if a == b => {
                let p = self.peers.get_mut(a).and_then(Option::as_mut).ok_or_else(|| missing(a))?;
                let live = p.liveness;
                (
                    Some(SendEnd { fifo: &mut p.send, ends: ends(a, live) }),
                    Some(RecvEnd { fifo: &mut p.recv, ends: ends(b, live) }),
                )
            }
            (Some(a), Some(b)) => {
                let [pa, pb] = self.peers.get_disjoint_mut([a, b]).map_err(|_| missing(a.max(b)))?;
                let pa = pa.as_mut().ok_or_else(|| missing(a))?;
                let pb = pb.as_mut().ok_or_else(|| missing(b))?;
                let (la, lb) = (pa.liveness, pb.liveness);
                (
                    Some(SendEnd { fifo: &mut pa.send, ends: ends(a, la) }),
                    Some(RecvEnd { fifo: &mut pb.recv, ends: ends(b, lb) }),
                )
            }
            (Some(a), None) => {
                let p = self.peers.get_mut(a).and_then(Option::as_mut).ok_or_else(|| missing(a))?;
                let live = p.liveness;
                (Some(SendEnd { fifo: &mut p.send, ends: ends(a, live) }), None)
            }
            (None, Some(b)) => {
                let p = self.peers.get_mut(b).and_then(Option::as_mut).ok_or_else(|| missing(b))?;
                let live = p.liveness;
                (None, Some(RecvEnd { fifo: &mut p.recv, ends: ends(b, live) }))
            }
            (None, None) => (None, None),
        };
        Ok(slot.insert(Prims {
            send,
            recv,
            deadline: self.deadline,
            desc: self.desc,
            dt: self.dt,
            op: self.op,
            nranks: self.nranks,
            slice,
            ll,
            scratch: Vec::new(),
            direct: false,
            stream: false,
            steps: if steps { self.prof.and_then(|p| p.steps(to, from)) } else { None },
            tally: if steps { self.tally } else { None },
        }))
    }
}

fn missing(p: usize) -> Error {
    Error::internal(format!("no connection to rank {p}"))
}

/// Copies `len` bytes unless source and destination are the same memory (in place).
///
/// # Safety
/// Both ranges must be valid for `len` bytes and either identical or disjoint.
pub(crate) unsafe fn copy_unless_same(src: *const u8, dst: *mut u8, len: usize) {
    if len > 0 && !std::ptr::eq(src, dst) {
        // SAFETY: the caller's contract.
        unsafe { crate::copy::copy(dst, src, len) };
    }
}

/// All-reduce of `count` elements with `algo`.
pub(crate) fn all_reduce(ctx: &mut Ctx<'_>, algo: Algo, send: *const u8, recv: *mut u8, count: usize) -> Result<()> {
    let s = ctx.shape(CollType::AllReduce, algo, count, 0);
    match algo {
        Algo::Tree => tree::all_reduce(&s, &mut Run::new(ctx, send, recv, tree::all_reduce_scratch(&s))),
        Algo::OneShot if count * s.elem <= direct::one_step_max(ctx.proto, s.slice) => {
            direct::all_reduce_one_step(ctx, send, recv, count * s.elem)
        }
        Algo::OneShot => direct::all_reduce_one_shot(&s, &mut Run::new(ctx, send, recv, direct::one_shot_scratch(&s))),
        _ => ring::all_reduce(ctx, send, recv, count),
    }
}

/// A rooted collective (`coll`: broadcast or reduce) of `count` elements from or to `root`
/// with `algo`.
pub(crate) fn rooted_coll(
    ctx: &mut Ctx<'_>,
    coll: CollType,
    algo: Algo,
    (send, recv): (*const u8, *mut u8),
    count: usize,
    root: usize,
) -> Result<()> {
    let root = ctx.virt(root);
    let s = ctx.shape(coll, algo, count, root);
    let bytes = count * s.elem;
    rooted(ctx, &s, |ctx| match (coll, algo) {
        (CollType::Broadcast, Algo::Tree) => tree::broadcast(&s, &mut Run::new(ctx, send, recv, 0)),
        (CollType::Broadcast, _) => ring::broadcast(ctx, send, recv, bytes, root),
        (_, Algo::Tree) => tree::reduce(&s, &mut Run::new(ctx, send, recv, tree::reduce_scratch(&s))),
        _ => ring::reduce(ctx, send, recv, bytes, root),
    })
}

/// How long `rooted` still waits for a neighbour's descriptor once another rank failed.
const ANNOUNCE_GRACE: std::time::Duration = std::time::Duration::from_millis(200);

/// Runs a rooted collective (`run`, the schedule of shape `s`) after this rank and its ring
/// neighbours have shown each other their descriptors, root included.
///
/// The root decides who sends first, so ranks that disagree on it do not meet in the data:
/// two ranks that both take themselves for the root only send, and return `Ok` with different
/// data; two that both wait for the other hang until the timeout. So every rank first posts
/// its descriptor (a message of no data) to both neighbours, before it waits on anything, and
/// then takes theirs: neighbours that disagree both fail at once with an operation mismatch
/// that names both roots, at any size, whoever was to send first. At 2 and 3 ranks everyone is
/// a neighbour of everyone; further away a rank learns of it from the failure notice.
///
/// A rank whose whole part is to send one slice to each peer takes its neighbours'
/// descriptors after sending, so a small operation's data leaves at once: its sends cannot
/// wait on a peer that disagrees (once a peer has finished the operations before, which it
/// does, its FIFO has room for the descriptor and the slice). Such a rank still returns only
/// once its neighbours have shown the same descriptor.
fn rooted(ctx: &mut Ctx<'_>, s: &Shape, run: impl FnOnce(&mut Ctx<'_>) -> Result<()>) -> Result<()> {
    let n = ctx.nranks;
    if n == 1 {
        return run(ctx);
    }
    let (next, prev) = ((s.rank + 1) % n, (s.rank + n - 1) % n);
    let both = [next, prev];
    let neighbours = if next == prev { &both[..1] } else { &both[..] };
    for &p in neighbours {
        ctx.prims_for(&mut None, Some(p), None, false)?.announce()?;
    }
    // Over tcp the descriptors go out now: a rank that fails (on a neighbour's descriptor, say)
    // sends no more data after it, and its neighbours must still see what it ran. This fails
    // when a neighbour has already failed: its descriptor then tells why better than that.
    let flushed = ctx.drive.map_or(Ok(()), |d| d.flush_writes(ctx.abort, &ctx.deadline));
    // Both neighbours' descriptors, even when waiting for one fails. A wait also ends when any
    // other rank has failed, and that rank may have failed on this very mismatch while the
    // descriptor that shows it is still on its way: so a neighbour that is still there gets a
    // moment more, watched for its own failure only. The mismatch, naming both roots, is the
    // better error.
    let take = |ctx: &mut Ctx<'_>| -> Result<()> {
        let mut failed = None;
        for &p in neighbours {
            let got = ctx.prims_for(&mut None, None, Some(p), false).and_then(|c| c.expect_announce());
            let got = match got {
                Err(e) if e.kind() != ErrorKind::InvalidUsage => {
                    match ctx
                        .prims_for(&mut None, None, Some(p), false)
                        .and_then(|c| c.only_this_peer(ANNOUNCE_GRACE).expect_announce())
                    {
                        Err(m) if m.kind() == ErrorKind::InvalidUsage => Err(m),
                        _ => Err(e),
                    }
                }
                got => got,
            };
            match got {
                Ok(()) => {}
                Err(e) if e.kind() == ErrorKind::InvalidUsage => return Err(e),
                Err(e) => {
                    failed.get_or_insert(e);
                }
            }
        }
        failed.map_or(Ok(()), Err)
    };
    let lone = s.count * s.elem <= s.slice && plan::legs(s).iter().all(|l| l.send && l.steps <= 1);
    if lone && flushed.is_ok() {
        run(ctx)?;
        return take(ctx);
    }
    take(ctx)?;
    flushed?;
    run(ctx)
}

/// All-gather of `count` elements per rank with `algo`.
pub(crate) fn all_gather(ctx: &mut Ctx<'_>, algo: Algo, send: *const u8, recv: *mut u8, count: usize) -> Result<()> {
    let s = ctx.shape(CollType::AllGather, algo, count, 0);
    match algo {
        Algo::Pat => pat::all_gather(&s, &mut Run::new(ctx, send, recv, 0)),
        _ => ring::all_gather(ctx, send, recv, count),
    }
}

/// Reduce-scatter of `count` elements per rank with `algo`.
pub(crate) fn reduce_scatter(
    ctx: &mut Ctx<'_>,
    algo: Algo,
    send: *const u8,
    recv: *mut u8,
    count: usize,
) -> Result<()> {
    let s = ctx.shape(CollType::ReduceScatter, algo, count, 0);
    match algo {
        Algo::Pat => pat::reduce_scatter(&s, &mut Run::new(ctx, send, recv, pat::reduce_scatter_scratch(&s))),
        _ => ring::reduce_scatter(ctx, send, recv, count),
    }
}

/// The rank record hears where an operation's waits block (RAS shows it).
impl crate::transport::fifo::Waiting for OpRecord {
    fn waiting_on(&self, peer: usize, state: u32) {
        OpRecord::waiting_on(self, peer, state);
    }
}
