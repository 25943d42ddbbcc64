//! One copy-engine call as data: the stream operations of each lane, in the order they are
//! issued. Pure (addresses in, steps out), so the order rules are tested without a GPU.

use super::{CeArea, CeSends, Flows, Route, Share, FREE};
use crate::cuda::kernels::coll::MAX_RANKS;
use crate::cuda::kernels::memops::Piece;

/// The stream a step runs on: the sends to one peer (`Send(me)`: this rank's own part), every
/// receive, or every send at once ([`CeSends::Batch`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum Lane {
    Send(usize),
    Recv,
    Batch,
}

/// One stream operation (`memops::StreamOps`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Step {
    Copy {
        dst: u64,
        src: u64,
        n: u64,
    },
    /// Copies in no order among them, done before the lane's next step (one driver batch).
    Batch(Vec<Piece>),
    /// Hold the lane until the word at `at` is at least `ge`.
    Wait {
        at: u64,
        ge: u64,
    },
    /// Write `v` to the word at `at` once the lane's earlier steps are done.
    Write {
        at: u64,
        v: u64,
    },
}

/// A batch's pieces start at multiples of this within a share.
const PIECE_ALIGN: u64 = 4096;

/// Each share (a [`Piece`] from its source to where it lands) cut into `chunks` pieces of whole
/// [`PIECE_ALIGN`] units (the last smaller), interleaved: piece 0 of every share, then piece 1
/// of every share that has one, ...
fn pieces(shares: &[Piece], chunks: u64) -> Vec<Piece> {
    let cut = |s: &Piece| s.n.div_ceil(chunks.max(1)).next_multiple_of(PIECE_ALIGN).max(PIECE_ALIGN);
    let most = shares.iter().map(|s| s.n.div_ceil(cut(s))).max().unwrap_or(0);
    (0..most)
        .flat_map(|k| {
            shares.iter().filter_map(move |s| {
                let (size, o) = (cut(s), k * cut(s));
                (o < s.n).then(|| Piece { dst: s.dst + o, src: s.src + o, n: size.min(s.n - o) })
            })
        })
        .collect()
}

/// Whether two byte ranges share a byte.
fn overlaps(a: &Share, b: &Share) -> bool {
    a.bytes > 0 && b.bytes > 0 && a.at < b.at.saturating_add(b.bytes) && b.at < a.at.saturating_add(a.bytes)
}

/// Per peer, in the order its first share comes, the chunks of its shares one after another:
/// each share cut at `sb` bytes (its last chunk smaller), as the peer cuts its matching shares.
fn pair_chunks(shares: &[Share], sb: u64) -> Vec<(usize, Vec<(u64, u64)>)> {
    let mut pairs: Vec<(usize, Vec<(u64, u64)>)> = Vec::new();
    for s in shares {
        let i = match pairs.iter().position(|p| p.0 == s.peer) {
            Some(i) => i,
            None => {
                pairs.push((s.peer, Vec::new()));
                pairs.len() - 1
            }
        };
        pairs[i].1.extend((0..s.bytes.div_ceil(sb)).map(|k| (s.at + k * sb, sb.min(s.bytes - k * sb))));
    }
    pairs
}

/// The steps of `f` for rank `me` whose peers' regions are mapped at `regions`, in issue order:
/// this rank's own part, then round by round (chunk `i` to every peer that has one, chunk `i`
/// from every peer that has one). A pair's first chunk waits for its `tail` to be [`FREE`] and
/// resets it; its last release writes [`FREE`]. With [`CeSends::Batch`] a round's sends are one
/// batch on one lane: the waits for every peer's free slot, the copies, the heads.
///
/// A receive whose destination overlaps what this rank sends to the same peer (an in-place
/// all-to-all: the block from peer `q` lands where the block for `q` is read) must not
/// overwrite chunk `i` before chunk `i` has left. Its steps go on the lane of the sends to
/// `q`, after each round's send; if a receive overlaps what goes to another peer, every step
/// goes on one lane, in round order. (A group of sends and receives whose buffers overlap is
/// undefined, as in NCCL: only these collective layouts are kept apart.)
///
/// A direct call ([`Route::Direct`]) is planned by [`direct`].
pub(crate) fn plan(
    regions: &[u64; MAX_RANKS],
    me: usize,
    area: &CeArea,
    f: &Flows,
    sends: CeSends,
) -> Vec<(Lane, Step)> {
    if let Route::Direct(to) = &f.route {
        return direct(regions, me, area, f, to, sends);
    }
    let (mine, slots, sb) = (regions[me], area.geo.slots, area.geo.slot_bytes);
    let batched = matches!(sends, CeSends::Batch { .. });
    let tangled = f.recvs.iter().any(|r| f.sends.iter().any(|s| s.peer != r.peer && overlaps(r, s)));
    let send_lane = |p: usize| match (tangled, batched) {
        (true, _) => Lane::Recv,
        (false, true) => Lane::Batch,
        (false, false) => Lane::Send(p),
    };
    // The lane of each peer's receives (and of every step when tangled).
    let recv_lane = |q: usize| {
        let in_place = f.recvs.iter().any(|r| r.peer == q && f.sends.iter().any(|s| s.peer == q && overlaps(r, s)));
        if in_place {
            send_lane(q)
        } else {
            Lane::Recv
        }
    };
    let mut s = Vec::new();
    if let Some(l) = f.local.filter(|l| l.dst != l.src && l.n > 0) {
        s.push((Lane::Send(me), Step::Copy { dst: l.dst, src: l.src, n: l.n }));
    }
    let (to, from) = (pair_chunks(&f.sends, sb), pair_chunks(&f.recvs, sb));
    let rounds = to.iter().chain(&from).map(|p| p.1.len() as u64).max().unwrap_or(0);
    for i in 0..rounds {
        // The peers this round sends to, each with its chunk `i`.
        let round: Vec<(usize, (u64, u64))> =
            to.iter().filter_map(|(p, c)| c.get(i as usize).map(|&chunk| (*p, chunk))).collect();
        // Before chunk `i` to `p`: every slot free (the pair's first), or chunk `i - slots`'s.
        let free = |p: usize| {
            let (l, at) = (send_lane(p), mine + area.tail(p));
            match i {
                0 => vec![(l, Step::Wait { at, ge: FREE }), (l, Step::Write { at, v: 0 })],
                _ if i >= slots => vec![(l, Step::Wait { at, ge: i + 1 - slots })],
                _ => Vec::new(),
            }
        };
        let copy = |p: usize, (src, n): (u64, u64)| Piece { dst: regions[p] + area.slot(me, i), src, n };
        let head = |p: usize| (send_lane(p), Step::Write { at: regions[p] + area.head(me), v: i + 1 });
        if batched && !round.is_empty() {
            s.extend(round.iter().flat_map(|&(p, _)| free(p)));
            let batch = round.iter().map(|&(p, c)| copy(p, c)).collect();
            s.push((send_lane(round[0].0), Step::Batch(batch)));
            s.extend(round.iter().map(|&(p, _)| head(p)));
        } else {
            for &(p, c) in &round {
                s.extend(free(p));
                let Piece { dst, src, n } = copy(p, c);
                s.push((send_lane(p), Step::Copy { dst, src, n }));
                s.push(head(p));
            }
        }
        for (q, chunks) in &from {
            let Some(&(dst, n)) = chunks.get(i as usize) else { continue };
            let (q, l) = (*q, recv_lane(*q));
            s.push((l, Step::Wait { at: mine + area.head(q), ge: i + 1 }));
            s.push((l, Step::Copy { dst, src: mine + area.slot(q, i), n }));
            let last = i + 1 == chunks.len() as u64;
            if last {
                s.push((l, Step::Write { at: mine + area.head(q), v: 0 }));
            }
            s.push((l, Step::Write { at: regions[q] + area.tail(me), v: if last { FREE } else { i + 1 } }));
        }
    }
    s
}

/// The steps of a call whose sends land straight in the peers' buffers (`to[i]`: where
/// `f.sends[i]` lands; one send per peer), in issue order: this rank tells each sender it has
/// started (`ready`), copies its own part, sends each peer's share once that peer has started
/// and tells it (`done`), then waits for every sender's `done`. Each waiter resets the word it
/// waited for. With [`CeSends::Batch`] the sends are one lane: every peer's `ready`, one batch
/// of every share (cut into pieces, interleaved across peers), every peer's `done`.
fn direct(
    regions: &[u64; MAX_RANKS],
    me: usize,
    area: &CeArea,
    f: &Flows,
    to: &[u64],
    sends: CeSends,
) -> Vec<(Lane, Step)> {
    let mine = regions[me];
    let mut s: Vec<(Lane, Step)> =
        f.recvs.iter().map(|r| (Lane::Recv, Step::Write { at: regions[r.peer] + area.ready(me), v: 1 })).collect();
    if let Some(l) = f.local.filter(|l| l.dst != l.src && l.n > 0) {
        s.push((Lane::Send(me), Step::Copy { dst: l.dst, src: l.src, n: l.n }));
    }
    let ready = |l: Lane, p: usize| {
        let at = mine + area.ready(p);
        [(l, Step::Wait { at, ge: 1 }), (l, Step::Write { at, v: 0 })]
    };
    let done = |l: Lane, p: usize| (l, Step::Write { at: regions[p] + area.done(me), v: 1 });
    match sends {
        CeSends::Batch { chunks } if !f.sends.is_empty() => {
            s.extend(f.sends.iter().flat_map(|x| ready(Lane::Batch, x.peer)));
            let shares: Vec<Piece> =
                to.iter().zip(&f.sends).map(|(&dst, x)| Piece { dst, src: x.at, n: x.bytes }).collect();
            if shares.iter().any(|x| x.n > 0) {
                s.push((Lane::Batch, Step::Batch(pieces(&shares, chunks))));
            }
            s.extend(f.sends.iter().map(|x| done(Lane::Batch, x.peer)));
        }
        _ => {
            for (x, &dst) in f.sends.iter().zip(to) {
                let l = Lane::Send(x.peer);
                s.extend(ready(l, x.peer));
                if x.bytes > 0 {
                    s.push((l, Step::Copy { dst, src: x.at, n: x.bytes }));
                }
                s.push(done(l, x.peer));
            }
        }
    }
    for r in &f.recvs {
        s.push((Lane::Recv, Step::Wait { at: mine + area.done(r.peer), ge: 1 }));
        s.push((Lane::Recv, Step::Write { at: mine + area.done(r.peer), v: 0 }));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cuda::ce::CeGeometry;
    use std::collections::{HashMap, VecDeque};

    const LANES: CeSends = CeSends::Lanes;

    /// Each rank's way of issuing its sends.
    type Modes = (&'static str, fn(usize) -> CeSends);

    /// Every rank per lane, every rank batched (whole shares, and three pieces each), and the
    /// ranks choosing differently: each rank picks alone.
    const MODES: [Modes; 4] = [
        ("per-lane copies", |_| CeSends::Lanes),
        ("one batch", |_| CeSends::Batch { chunks: 1 }),
        ("batches of 3 pieces", |_| CeSends::Batch { chunks: 3 }),
        ("odd ranks batched", |r| if r % 2 == 1 { CeSends::Batch { chunks: 2 } } else { CeSends::Lanes }),
    ];

    /// Regions 1 TiB apart, user buffers far above them.
    const REGION: u64 = 1 << 40;
    const USER: u64 = 1 << 50;

    fn share(peer: usize, at: u64, bytes: u64) -> Share {
        Share { peer, at, bytes }
    }

    fn regions(n: usize) -> [u64; MAX_RANKS] {
        std::array::from_fn(|r| if r < n { (r as u64 + 1) * REGION } else { 0 })
    }

    fn all_gather(r: usize, n: usize, bytes: u64) -> Flows {
        let peers = || (1..n).map(move |k| (r + k) % n);
        let (input, output) = (USER * (2 * r as u64 + 1), USER * (2 * r as u64 + 2));
        Flows {
            sends: peers().map(|p| share(p, input, bytes)).collect(),
            recvs: peers().map(|q| share(q, output + q as u64 * bytes, bytes)).collect(),
            local: Some(Piece { dst: output + r as u64 * bytes, src: input, n: bytes }),
            route: Route::Slots,
        }
    }

    fn lane(p: &[(Lane, Step)], l: Lane) -> Vec<Step> {
        p.iter().filter(|s| s.0 == l).map(|s| s.1.clone()).collect()
    }

    #[test]
    fn a_send_lane_starts_once_every_slot_is_free_and_reuses_a_slot_only_after_its_release() {
        let geo = CeGeometry { slots: 3, slot_bytes: 4096 };
        let (n, me, bytes) = (4, 1, 10 * 4096 + 100);
        let area = CeArea::after(8192, n, geo);
        let rg = regions(n);
        let p = plan(&rg, me, &area, &all_gather(me, n, bytes), LANES);
        let chunks = 11;
        for peer in [2, 3, 0] {
            let steps = lane(&p, Lane::Send(peer));
            let tail = rg[me] + area.tail(peer);
            let mut copies = 0;
            for (k, s) in steps.iter().enumerate() {
                if let Step::Copy { dst, n: len, .. } = s.clone() {
                    assert_eq!(dst, rg[peer] + area.slot(me, copies), "chunk {copies} goes to its slot");
                    assert_eq!(len, if copies + 1 == chunks { 100 } else { 4096 });
                    if copies >= geo.slots {
                        assert_eq!(steps[k - 1], Step::Wait { at: tail, ge: copies + 1 - geo.slots });
                    }
                    assert_eq!(steps[k + 1], Step::Write { at: rg[peer] + area.head(me), v: copies + 1 });
                    copies += 1;
                }
            }
            assert_eq!(copies, chunks);
            assert_eq!(steps[..2], [Step::Wait { at: tail, ge: FREE }, Step::Write { at: tail, v: 0 }]);
            // Done once the last chunk is in the slots: no wait for the receiver to take it.
            assert_eq!(steps.last(), Some(&Step::Write { at: rg[peer] + area.head(me), v: chunks }));
        }
        assert_eq!(lane(&p, Lane::Send(me)).len(), 1, "the own part is one copy on its own lane");
    }

    #[test]
    fn the_receive_lane_zeroes_a_head_before_its_last_release_frees_every_slot() {
        let geo = CeGeometry { slots: 2, slot_bytes: 4096 };
        let (n, me) = (3, 0);
        let area = CeArea::after(0, n, geo);
        let rg = regions(n);
        let steps = lane(&plan(&rg, me, &area, &all_gather(me, n, 3 * 4096), LANES), Lane::Recv);
        for q in [1, 2] {
            let head = rg[me] + area.head(q);
            let reset = steps.iter().position(|s| *s == Step::Write { at: head, v: 0 });
            let last = steps.iter().position(|s| *s == Step::Write { at: rg[q] + area.tail(me), v: FREE });
            let waited = steps.iter().rposition(|s| *s == Step::Wait { at: head, ge: 3 });
            assert!(waited < reset && reset < last && last.is_some(), "peer {q}: {steps:?}");
        }
    }

    #[test]
    fn nothing_to_move_is_nothing() {
        let area = CeArea::after(0, 2, CeGeometry::default());
        for sends in [LANES, CeSends::Batch { chunks: 4 }] {
            assert_eq!(plan(&regions(2), 0, &area, &all_gather(0, 2, 0), sends), [], "{sends:?}");
        }
    }

    /// What a byte range holds in the simulation: the user address it came from.
    type Mem = HashMap<u64, u64>;

    /// The words of `n` ranks' areas that do not start at zero (`CeArea::at_rest`), as a
    /// communicator leaves them at set-up and every call leaves them at its end.
    fn at_rest(n: usize) -> HashMap<u64, u64> {
        let area = CeArea::after(0, n, CeGeometry::default());
        let rg = regions(n);
        (0..n).flat_map(|r| area.at_rest().map(move |(at, v)| (rg[r] + at as u64, v)).collect::<Vec<_>>()).collect()
    }

    /// Whether every word is back where it rests: what the next call (or a replay) starts from.
    fn rested(words: &HashMap<u64, u64>, n: usize) -> bool {
        let rest = at_rest(n);
        words.iter().all(|(at, v)| *v == rest.get(at).copied().unwrap_or(0))
    }

    /// Runs every rank's plans on queues: `queues(rank, lane)` names the hardware queue a lane's
    /// stream lands on, each queue runs its steps in issue order, and a waiting head holds its
    /// queue. Picks the next queue to run from `seed`. Returns the data and words at the end,
    /// or the stuck queues' heads.
    fn run(
        plans: &[Vec<(Lane, Step)>],
        queues: impl Fn(usize, Lane) -> usize,
        seed: u64,
    ) -> Result<(Mem, HashMap<u64, u64>), Vec<Step>> {
        let mut qs: HashMap<(usize, usize), VecDeque<Step>> = HashMap::new();
        for (r, p) in plans.iter().enumerate() {
            for (l, s) in p {
                qs.entry((r, queues(r, *l))).or_default().push_back(s.clone());
            }
        }
        let mut keys: Vec<_> = qs.keys().copied().collect();
        keys.sort_unstable();
        let (mut data, mut words) = (Mem::new(), at_rest(plans.len()));
        let mut rng = seed | 1;
        loop {
            let ready: Vec<_> = keys
                .iter()
                .filter(|k| match qs[k].front() {
                    Some(Step::Wait { at, ge }) => words.get(at).copied().unwrap_or(0) >= *ge,
                    Some(_) => true,
                    None => false,
                })
                .copied()
                .collect();
            if ready.is_empty() {
                let stuck: Vec<Step> = keys.iter().filter_map(|k| qs[k].front().cloned()).collect();
                return if stuck.is_empty() { Ok((data, words)) } else { Err(stuck) };
            }
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            let k = ready[(rng % ready.len() as u64) as usize];
            let copy = |data: &mut Mem, Piece { dst, src, n }: Piece| {
                for b in (0..n).step_by(512) {
                    let v = data.get(&(src + b)).copied().unwrap_or(src + b);
                    data.insert(dst + b, v);
                }
            };
            match qs.get_mut(&k).and_then(VecDeque::pop_front) {
                Some(Step::Copy { dst, src, n }) => copy(&mut data, Piece { dst, src, n }),
                // A batch's pieces run in no order among them.
                Some(Step::Batch(mut pieces)) => {
                    for i in (1..pieces.len()).rev() {
                        pieces.swap(i, (rng >> 7) as usize % (i + 1));
                        rng = rng.rotate_left(11);
                    }
                    pieces.into_iter().for_each(|p| copy(&mut data, p));
                }
                Some(Step::Write { at, v }) => {
                    words.insert(at, v);
                }
                Some(Step::Wait { .. }) | None => {}
            }
        }
    }

    /// Every rank's plan of its `flows`, with `slots` slots of 4 KiB, rank `r` issuing its
    /// sends as `sends(r)`.
    fn plans(flows: &[Flows], slots: u64, sends: fn(usize) -> CeSends) -> Vec<Vec<(Lane, Step)>> {
        let n = flows.len();
        let area = CeArea::after(0, n, CeGeometry { slots, slot_bytes: 4096 });
        let rg = regions(n);
        flows.iter().enumerate().map(|(r, f)| plan(&rg, r, &area, f, sends(r))).collect()
    }

    /// A lane's own queue among `n` ranks' lanes.
    fn lane_index(n: usize, l: Lane) -> usize {
        match l {
            Lane::Send(p) => p,
            Lane::Recv => n,
            Lane::Batch => n + 1,
        }
    }

    /// A name, and the hardware queue of a rank's lane.
    type Mapping<'a> = (&'a str, &'a dyn Fn(usize, Lane) -> usize);

    /// The hardware queue of a rank's lane.
    type Queues = Box<dyn Fn(usize, Lane) -> usize>;

    /// The ways the lanes of `n` ranks may land on hardware queues: a queue each, one for all,
    /// two shared, and the receives on a send's queue.
    fn every_mapping(n: usize) -> [(&'static str, Queues); 4] {
        [
            ("a stream each", Box::new(move |_, l| lane_index(n, l))),
            ("one queue", Box::new(|_, _| 0)),
            ("two queues", Box::new(move |_, l| lane_index(n, l) % 2)),
            (
                "receives with the first send",
                Box::new(move |r, l| if l == Lane::Recv { (r + 1) % n } else { lane_index(n, l) }),
            ),
        ]
    }

    /// Every rank's all-gather output holds each rank's input, whatever the queues and the
    /// interleaving and however each rank issues its sends, and the words are back at zero for
    /// the next call.
    #[test]
    fn every_mapping_of_lanes_onto_queues_completes_with_the_right_data() {
        let n = 3;
        for ((slots, bytes), (how, sends)) in
            [(1, 5 * 4096 + 512), (2, 7 * 4096), (3, 4096), (2, 0)].into_iter().flat_map(|c| MODES.map(|m| (c, m)))
        {
            let flows: Vec<Flows> = (0..n).map(|r| all_gather(r, n, bytes)).collect();
            let plans = plans(&flows, slots, sends);
            for (what, m) in every_mapping(n) {
                let what = format!("{how}, {what}");
                for seed in 1..20 {
                    let (data, words) = run(&plans, m.as_ref(), seed * 0x9e37_79b9)
                        .unwrap_or_else(|stuck| panic!("{what}, {slots} slots, {bytes} B: stuck at {stuck:?}"));
                    for (r, f) in flows.iter().enumerate() {
                        for (q, from) in flows.iter().enumerate() {
                            let (dst, src) = match f.recvs.iter().find(|x| x.peer == q) {
                                Some(x) => (x.at, from.sends[0].at),
                                None => f.local.map_or((0, 0), |l| (l.dst, l.src)),
                            };
                            for b in (0..bytes).step_by(512) {
                                assert_eq!(data.get(&(dst + b)), Some(&(src + b)), "{what}: rank {r} from {q}");
                            }
                        }
                    }
                    assert!(rested(&words, n), "{what}: words left {words:?}");
                }
            }
        }
    }

    /// Message `k` from rank `a` to rank `b`, of `bytes`: `(a, b, k, bytes)`.
    type Message = (usize, usize, usize, u64);

    /// Where message `k` from rank `a` to rank `b` is read on `a` and lands on `b`.
    fn message(a: usize, b: usize, k: usize) -> (u64, u64) {
        let at = ((b * 16 + k) as u64) << 24;
        let at_b = ((a * 16 + k) as u64) << 24;
        (USER * (a as u64 + 1) + at, USER * (b as u64 + 1) + (1 << 40) + at_b)
    }

    /// Groups of sends and receives on `n` ranks: from each rank to each other, 0 to 3
    /// messages of sizes picked by `seed` (none, part of a chunk, whole chunks, several chunks
    /// and a part), every rank's sends and receives in an order of their own that keeps each
    /// peer's messages in order, as NCCL matches them.
    fn groups(n: usize, seed: u64) -> (Vec<Flows>, Vec<Message>) {
        const SIZES: [u64; 6] = [0, 512, 4096, 3 * 4096 + 512, 9 * 4096, 2 * 4096];
        let mut rng = seed | 1;
        let mut next = |m: u64| {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng % m
        };
        let mut msgs = Vec::new();
        for a in 0..n {
            for b in (0..n).filter(|&b| b != a) {
                for k in 0..next(4) as usize {
                    msgs.push((a, b, k, SIZES[next(SIZES.len() as u64) as usize]));
                }
            }
        }
        let mut flows: Vec<Flows> =
            (0..n).map(|_| Flows { sends: vec![], recvs: vec![], local: None, route: Route::Slots }).collect();
        // Each rank's operations: its messages in a rotated peer order, each peer's in order.
        for (r, f) in flows.iter_mut().enumerate() {
            let turn = next(n as u64) as usize;
            for i in 0..n {
                let p = (r + turn + i) % n;
                for &(a, b, k, bytes) in &msgs {
                    let (src, dst) = message(a, b, k);
                    if a == r && b == p {
                        f.sends.push(share(b, src, bytes));
                    }
                    if b == r && a == p {
                        f.recvs.push(share(a, dst, bytes));
                    }
                }
            }
        }
        (flows, msgs)
    }

    /// Groups of any sizes, several messages to one peer among them, land every message and
    /// leave every word at zero, whatever the queues, the interleaving and each rank's way of
    /// issuing its sends; two groups back to back as well.
    #[test]
    fn groups_of_sends_and_receives_of_any_size_land_every_message() {
        for ((how, sends), n) in MODES.into_iter().flat_map(|m| (2..=4).map(move |n| (m, n))) {
            for (seed, slots) in (1..12u64).map(|s| (s * 0x2545_f491, 1 + s % 2)) {
                let (first, msgs) = groups(n, seed);
                let (second, more) = groups(n, seed ^ 0x5555);
                let mut issued = plans(&first, slots, sends);
                for (r, p) in plans(&second, slots, sends).into_iter().enumerate() {
                    issued[r].extend(p);
                }
                for (what, m) in every_mapping(n) {
                    let what = format!("{n} ranks, {how}, {what}, {slots} slots, seed {seed:#x}");
                    let (data, words) =
                        run(&issued, m.as_ref(), seed).unwrap_or_else(|stuck| panic!("{what}: stuck at {stuck:?}"));
                    // The second group's messages overwrite the first's where both have one.
                    for &(a, b, k, bytes) in msgs
                        .iter()
                        .filter(|m| !more.iter().any(|o| o.0 == m.0 && o.1 == m.1 && o.2 == m.2))
                        .chain(&more)
                    {
                        let (src, dst) = message(a, b, k);
                        for o in (0..bytes).step_by(512) {
                            assert_eq!(
                                data.get(&(dst + o)),
                                Some(&(src + o)),
                                "{what}: message {k} from {a} to {b} at {o}"
                            );
                        }
                    }
                    assert!(rested(&words, n), "{what}: words left {words:?}");
                }
            }
        }
    }

    /// A lone send that fits the receiver's slots is done before its receiver starts, so two
    /// ranks that each send, then receive, as separate calls (each call's lanes wait for the
    /// last one's end) do not wait on each other; one that does not fit waits for its receiver.
    #[test]
    fn a_send_that_fits_the_slots_completes_before_its_receiver_starts() {
        let (n, slots) = (2, 2);
        let lone = |r: usize, send: bool, bytes: u64| {
            let p = 1 - r;
            let (sends, recvs) = match send {
                true => (vec![share(p, message(r, p, 0).0, bytes)], vec![]),
                false => (vec![], vec![share(p, message(p, r, 0).1, bytes)]),
            };
            Flows { sends, recvs, local: None, route: Route::Slots }
        };
        for (how, sends) in MODES {
            let fits = 2 * 4096;
            // Both ranks' sends alone complete; then their receives land what was sent.
            let sent = plans(&[lone(0, true, fits), lone(1, true, fits)], slots, sends);
            run(&sent, |_, l| lane_index(n, l), 7).unwrap_or_else(|s| panic!("{how}: the sends stuck at {s:?}"));
            let got = plans(&[lone(0, false, fits), lone(1, false, fits)], slots, sends);
            let mut both = sent.clone();
            for (r, p) in got.into_iter().enumerate() {
                both[r].extend(p);
            }
            let (data, words) =
                run(&both, |_, l| lane_index(n, l), 7).unwrap_or_else(|s| panic!("{how}: stuck at {s:?}"));
            for r in 0..n {
                let (src, dst) = message(r, 1 - r, 0);
                for o in (0..fits).step_by(512) {
                    assert_eq!(data.get(&(dst + o)), Some(&(src + o)), "{how}: {r} -> {}", 1 - r);
                }
            }
            assert!(rested(&words, n), "{how}: words left {words:?}");
            // One chunk more than the slots: the sender waits for its receiver.
            let big = plans(&[lone(0, true, fits + 1), lone(1, true, fits + 1)], slots, sends);
            assert!(run(&big, |_, l| lane_index(n, l), 7).is_err(), "{how}: a send past the slots completed alone");
        }
    }

    /// An all-to-all in place: each block from peer `q` lands where the block for `q` is read.
    fn all_to_all_in_place(r: usize, n: usize, blk: u64) -> Flows {
        let buf = USER * (r as u64 + 1);
        let peers = || (1..n).map(move |k| (r + k) % n);
        Flows {
            sends: peers().map(|p| share(p, buf + p as u64 * blk, blk)).collect(),
            recvs: peers().map(|q| share(q, buf + q as u64 * blk, blk)).collect(),
            local: Some(Piece { dst: buf + r as u64 * blk, src: buf + r as u64 * blk, n: blk }),
            route: Route::Slots,
        }
    }

    /// In place, a chunk is overwritten only after it has left, whatever the queues and the
    /// interleaving: block `p` of rank `r` ends in rank `p`'s block `r` as it was.
    #[test]
    fn an_in_place_all_to_all_sends_each_chunk_before_it_is_overwritten() {
        let n = 3;
        for ((slots, blk), (how, sends)) in
            [(1, 3 * 4096 + 512), (2, 5 * 4096), (2, 4096)].into_iter().flat_map(|c| MODES.map(|m| (c, m)))
        {
            let flows: Vec<Flows> = (0..n).map(|r| all_to_all_in_place(r, n, blk)).collect();
            let plans = plans(&flows, slots, sends);
            let index = |l| lane_index(n, l);
            let mappings: [Mapping<'_>; 2] = [("a stream each", &|_, l| index(l)), ("one queue", &|_, _| 0)];
            for (what, m) in mappings {
                let what = format!("{how}, {what}");
                for seed in 1..40 {
                    let (data, words) = run(&plans, m, seed * 0x9e37_79b9)
                        .unwrap_or_else(|stuck| panic!("{what}, {slots} slots: stuck at {stuck:?}"));
                    for r in 0..n {
                        for p in (0..n).filter(|&p| p != r) {
                            let (from, to) =
                                (USER * (r as u64 + 1) + p as u64 * blk, USER * (p as u64 + 1) + r as u64 * blk);
                            for b in (0..blk).step_by(512) {
                                assert_eq!(
                                    data.get(&(to + b)),
                                    Some(&(from + b)),
                                    "{what}, seed {seed}: {r} -> {p} at {b}"
                                );
                            }
                        }
                    }
                    assert!(rested(&words, n), "{what}: words left {words:?}");
                }
            }
        }
        // A receive that overlaps what goes to another peer puts the whole call on one lane.
        let area = CeArea::after(0, n, CeGeometry::default());
        let mut f = all_to_all_in_place(0, n, 4096);
        let dsts: Vec<u64> = f.recvs.iter().rev().map(|r| r.at).collect();
        f.recvs.iter_mut().zip(dsts).for_each(|(r, d)| r.at = d);
        for sends in [LANES, CeSends::Batch { chunks: 1 }] {
            let p = plan(&regions(n), 0, &area, &f, sends);
            let flags = p.iter().filter(|s| matches!(s.1, Step::Wait { .. } | Step::Write { .. }));
            assert!(flags.clone().count() > 0 && flags.clone().all(|s| s.0 == Lane::Recv), "{sends:?}");
        }
    }

    /// A broadcast root sends and never receives; the others only receive.
    #[test]
    fn a_broadcast_plan_has_the_lanes_of_its_role() {
        let area = CeArea::after(0, 3, CeGeometry::default());
        let rg = regions(3);
        let b = 1 << 20;
        let root = Flows {
            sends: vec![share(1, USER, b), share(2, USER, b)],
            recvs: vec![],
            local: None,
            route: Route::Slots,
        };
        let leaf = Flows { sends: vec![], recvs: vec![share(0, USER, b)], local: None, route: Route::Slots };
        let lanes = |p: Vec<(Lane, Step)>| {
            let mut l: Vec<Lane> = p.iter().map(|s| s.0).collect();
            l.dedup();
            l.sort_unstable();
            l.dedup();
            l
        };
        assert_eq!(lanes(plan(&rg, 0, &area, &root, LANES)), [Lane::Send(1), Lane::Send(2)]);
        assert_eq!(lanes(plan(&rg, 2, &area, &leaf, LANES)), [Lane::Recv]);
        assert_eq!(lanes(plan(&rg, 0, &area, &root, CeSends::Batch { chunks: 1 })), [Lane::Batch]);
        assert_eq!(lanes(plan(&rg, 2, &area, &leaf, CeSends::Batch { chunks: 1 })), [Lane::Recv]);
    }

    /// Rank `r`'s symmetric window: every rank's buffers of a call at the same offset of theirs.
    fn window(r: usize) -> u64 {
        USER * (2 * r as u64 + 2)
    }

    /// One collective of a direct sequence, on `n` ranks, at offset `off` of the windows.
    #[derive(Clone, Copy, Debug)]
    enum Call {
        AllGather {
            in_place: bool,
        },
        AllToAll,
        Broadcast {
            root: usize,
        },
        /// An all-gather through the slots, between direct calls.
        SlotAllGather,
    }

    /// Peers and their addresses.
    type Peers = Vec<(usize, u64)>;

    /// Rank `r`'s flows of `call`: its input outside the window (or in it, in place), its output
    /// in the window, each send landing at the same offset of its peer's window.
    fn direct_flows(call: Call, r: usize, n: usize, bytes: u64, off: u64) -> Flows {
        let peers = || (1..n).map(move |k| (r + k) % n);
        let (input, output) = (USER * (2 * r as u64 + 1) + off, window(r) + off);
        let block = |base: u64, q: usize| base + q as u64 * bytes;
        let lands = |p: usize, at: u64| window(p) + (at - window(r));
        let (sends, recvs, local): (Peers, Peers, _) = match call {
            Call::AllGather { in_place } => {
                let src = if in_place { block(output, r) } else { input };
                (
                    peers().map(|p| (p, src)).collect(),
                    peers().map(|q| (q, block(output, q))).collect(),
                    Some((block(output, r), src)),
                )
            }
            Call::AllToAll => (
                peers().map(|p| (p, block(input, p))).collect(),
                peers().map(|q| (q, block(output, q))).collect(),
                Some((block(output, r), block(input, r))),
            ),
            Call::Broadcast { root } if r == root => {
                (peers().map(|p| (p, input)).collect(), Vec::new(), Some((output, input)))
            }
            Call::Broadcast { root } => (Vec::new(), vec![(root, output)], None),
            Call::SlotAllGather => {
                let f = all_gather(r, n, bytes);
                let moved = |x: &Share| share(x.peer, x.at + off, x.bytes);
                return Flows {
                    sends: f.sends.iter().map(moved).collect(),
                    recvs: f.recvs.iter().map(moved).collect(),
                    local: f.local.map(|l| Piece { dst: l.dst + off, src: l.src + off, n: l.n }),
                    ..f
                };
            }
        };
        let to = match call {
            Call::AllGather { .. } | Call::AllToAll => sends.iter().map(|&(p, _)| lands(p, block(output, r))).collect(),
            _ => sends.iter().map(|&(p, _)| lands(p, output)).collect(),
        };
        let shares = |v: Peers| v.into_iter().map(|(p, at)| share(p, at, bytes)).collect();
        let local = local.map(|(dst, src)| Piece { dst, src, n: bytes });
        Flows { sends: shares(sends), recvs: shares(recvs), local, route: Route::Direct(to) }
    }

    /// Where the test reads a receive as the caller would once the call is done: a copy on
    /// the receive lane after the call's steps, from `dst` to `SNAPSHOT + dst`.
    const SNAPSHOT: u64 = 1 << 61;

    /// Every receive of every rank holds what its sender sent, there and in its snapshot once
    /// the receive lane was done, and every own part its source.
    fn check_landed(calls: &[Vec<Flows>], data: &Mem, what: &str) {
        for flows in calls {
            for (r, f) in flows.iter().enumerate() {
                let mut expect: Vec<(u64, u64, u64)> =
                    f.local.into_iter().filter(|l| l.dst != l.src).map(|l| (l.dst, l.src, l.n)).collect();
                for x in &f.recvs {
                    let src = flows[x.peer].sends.iter().find(|s| s.peer == r).map(|s| s.at);
                    let src = src.unwrap_or_else(|| panic!("{what}: rank {} sends nothing to {r}", x.peer));
                    expect.extend([(x.at, src, x.bytes), (SNAPSHOT + x.at, src, x.bytes)]);
                }
                for (dst, src, bytes) in expect {
                    for b in (0..bytes).step_by(512) {
                        assert_eq!(data.get(&(dst + b)), Some(&(src + b)), "{what}: rank {r}, {dst:#x} + {b}");
                    }
                }
            }
        }
    }

    /// Calls back to back on 2 to 8 ranks (all-gather out of place and in place, all-to-all out
    /// of place, a broadcast from every root, one all-gather through the slots among them), each
    /// rank's plans issued one after the other on its lanes: whatever the queues, the
    /// interleaving and each rank's way of issuing its sends, every call's data lands and every
    /// word ends at zero, ready for a replay.
    #[test]
    fn direct_calls_back_to_back_land_their_data_and_leave_every_word_at_zero() {
        for ((how, sends), n) in MODES.into_iter().flat_map(|m| (2..=MAX_RANKS).map(move |n| (m, n))) {
            let mut seq = vec![Call::AllGather { in_place: false }, Call::AllToAll, Call::AllGather { in_place: true }];
            seq.extend((0..n).map(|root| Call::Broadcast { root }));
            seq.extend([Call::SlotAllGather, Call::AllToAll, Call::AllGather { in_place: false }]);
            let bytes = 2 * 4096 + 512;
            let calls: Vec<Vec<Flows>> = seq
                .iter()
                .enumerate()
                .map(|(c, &call)| (0..n).map(|r| direct_flows(call, r, n, bytes, c as u64 * (1 << 30))).collect())
                .collect();
            let mut issued: Vec<Vec<(Lane, Step)>> = vec![Vec::new(); n];
            for flows in &calls {
                for (r, p) in plans(flows, 2, sends).into_iter().enumerate() {
                    issued[r].extend(p);
                    let read = |x: &Share| Step::Copy { dst: SNAPSHOT + x.at, src: x.at, n: x.bytes };
                    issued[r].extend(flows[r].recvs.iter().map(|q| (Lane::Recv, read(q))));
                }
            }
            for (what, m) in every_mapping(n) {
                let what = format!("{how}, {what}");
                for seed in 1..6 {
                    let (data, words) = run(&issued, m.as_ref(), seed * 0x9e37_79b9)
                        .unwrap_or_else(|stuck| panic!("{n} ranks, {what}, seed {seed}: stuck at {stuck:?}"));
                    check_landed(&calls, &data, &format!("{n} ranks, {what}"));
                    assert!(rested(&words, n), "{n} ranks, {what}: words left {words:?}");
                }
            }
        }
    }

    /// A direct plan touches no slot and no head or tail, and writes only 0 and 1.
    #[test]
    fn a_direct_plan_uses_its_own_words_and_only_zero_and_one() {
        let (n, me, bytes) = (4, 2, 1 << 20);
        let area = CeArea::after(0, n, CeGeometry::default());
        let rg = regions(n);
        let f = direct_flows(Call::AllToAll, me, n, bytes, 0);
        let p = plan(&rg, me, &area, &f, LANES);
        let words: Vec<u64> =
            (0..n).flat_map(|r| (0..n).flat_map(move |o| [rg[r] + area.ready(o), rg[r] + area.done(o)])).collect();
        for (l, s) in &p {
            match *s {
                Step::Wait { at, ge } => assert!(words.contains(&at) && ge == 1, "{l:?} {s:?}"),
                Step::Write { at, v } => assert!(words.contains(&at) && v <= 1, "{l:?} {s:?}"),
                Step::Copy { dst, n: len, .. } => {
                    assert_eq!(len, bytes, "one copy of the whole share");
                    assert!(dst >= USER, "into a user buffer, not a slot: {dst:#x}");
                }
                Step::Batch(_) => panic!("a batch on {l:?} without OCCL_CE_BATCH"),
            }
        }
        // Each send waits for its receiver's ready and resets it before it copies.
        for (peer, to) in f.sends.iter().map(|s| s.peer).zip(match &f.route {
            Route::Direct(to) => to.clone(),
            Route::Slots => vec![],
        }) {
            let ready = rg[me] + area.ready(peer);
            assert_eq!(
                lane(&p, Lane::Send(peer)),
                [
                    Step::Wait { at: ready, ge: 1 },
                    Step::Write { at: ready, v: 0 },
                    Step::Copy { dst: to, src: f.sends.iter().find(|s| s.peer == peer).map_or(0, |s| s.at), n: bytes },
                    Step::Write { at: rg[peer] + area.done(me), v: 1 },
                ]
            );
        }
        // The receive lane announces this rank to every sender before it waits for any.
        let recv = lane(&p, Lane::Recv);
        let first_wait = recv.iter().position(|s| matches!(s, Step::Wait { .. })).unwrap_or(0);
        assert_eq!(first_wait, n - 1);
        assert!(recv[..first_wait].iter().all(|s| matches!(s, Step::Write { v: 1, .. })));
    }

    /// A batched direct plan: every send on the batch lane, every peer's `ready` waited for and
    /// reset before one batch that holds each share once, cut into pieces interleaved across
    /// peers, then every peer's `done`; the receive lane is as without batching.
    #[test]
    fn a_batched_direct_plan_is_the_readies_one_batch_and_the_dones() {
        let (n, me, bytes) = (4, 1, 3 * 4096 + 512);
        let area = CeArea::after(0, n, CeGeometry::default());
        let rg = regions(n);
        let f = direct_flows(Call::AllToAll, me, n, bytes, 0);
        let Route::Direct(to) = &f.route else { panic!("a direct call") };
        let plain = plan(&rg, me, &area, &f, LANES);
        for chunks in [1, 2, 4, 64] {
            let p = plan(&rg, me, &area, &f, CeSends::Batch { chunks });
            assert_eq!(lane(&p, Lane::Recv), lane(&plain, Lane::Recv));
            assert_eq!(lane(&p, Lane::Send(me)), lane(&plain, Lane::Send(me)), "the own part keeps its lane");
            assert!((0..n).filter(|&q| q != me).all(|q| lane(&p, Lane::Send(q)).is_empty()));
            let steps = lane(&p, Lane::Batch);
            let peers = f.sends.len();
            let readies: Vec<Step> = f
                .sends
                .iter()
                .flat_map(|x| {
                    let at = rg[me] + area.ready(x.peer);
                    [Step::Wait { at, ge: 1 }, Step::Write { at, v: 0 }]
                })
                .collect();
            let dones: Vec<Step> =
                f.sends.iter().map(|x| Step::Write { at: rg[x.peer] + area.done(me), v: 1 }).collect();
            assert_eq!(steps[..2 * peers], readies[..]);
            assert_eq!(steps[2 * peers + 1..], dones[..]);
            let Step::Batch(pieces) = &steps[2 * peers] else { panic!("{chunks}: {steps:?}") };
            let size = if chunks == 1 { bytes } else { bytes.div_ceil(chunks).next_multiple_of(4096) };
            assert_eq!(pieces.len(), peers * bytes.div_ceil(size) as usize, "{chunks} chunks");
            for (k, piece) in pieces.iter().enumerate() {
                let (i, o) = (k % peers, (k / peers) as u64 * size);
                let want = Piece { dst: to[i] + o, src: f.sends[i].at + o, n: size.min(bytes - o) };
                assert_eq!(*piece, want, "{chunks} chunks: piece {k} is peer {i}'s at {o}");
            }
        }
    }

    /// Pieces tile each share exactly, in whole 4 KiB units but the last, however many asked.
    #[test]
    fn pieces_tile_every_share() {
        let ends = [(USER, 2 * USER), (3 * USER, 4 * USER), (5 * USER, 6 * USER)];
        for (bytes, chunks) in [(1, 1), (4096, 8), (4097, 2), (10 << 20, 3), ((64 << 20) + 512, 64), (12345, 1)] {
            // The same size for every share (a collective's), and three sizes (the last share
            // the largest, so that it has pieces the others lack).
            for sizes in [[bytes; 3], [bytes, bytes / 3 + 1, 2 * bytes]] {
                let shares: Vec<Piece> = ends.iter().zip(sizes).map(|(&(dst, src), n)| Piece { dst, src, n }).collect();
                let p = pieces(&shares, chunks);
                assert!(p.len() as u64 <= 3 * chunks, "{sizes:?} B in {chunks}: {} pieces", p.len());
                // Piece k of every share that has one comes before any share's piece k + 1.
                let owner = |x: &Piece| shares.iter().position(|s| x.dst >= s.dst && x.dst < s.dst + s.n);
                let ordinals: Vec<usize> =
                    (0..p.len()).map(|i| p[..i].iter().filter(|y| owner(y) == owner(&p[i])).count()).collect();
                assert!(ordinals.windows(2).all(|w| w[0] <= w[1]), "{sizes:?} B in {chunks}: {ordinals:?}");
                for share in &shares {
                    tiles(&p, share, chunks);
                }
            }
        }
    }

    /// `share` is covered by the pieces that land in it, in order, whole units but the last.
    fn tiles(p: &[Piece], share: &Piece, chunks: u64) {
        let Piece { dst, src, n: bytes } = *share;
        let mut mine: Vec<&Piece> = p.iter().filter(|x| x.dst >= dst && x.dst < dst + bytes).collect();
        mine.sort_by_key(|x| x.dst);
        let mut at = 0;
        for x in mine {
            assert_eq!((x.dst - dst, x.src - src), (at, at), "{bytes} B in {chunks}");
            assert!(x.n > 0 && (x.n.is_multiple_of(PIECE_ALIGN) || at + x.n == bytes));
            at += x.n;
        }
        assert_eq!(at, bytes, "{bytes} B in {chunks}: the share is covered");
    }
}
