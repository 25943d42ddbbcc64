//! Trace ids for spans that arrive before their tree's trace is known (export thread only).
//!
//! A collective's trace id comes from its Coll (sequence number), but the CollApi of the same
//! tree stops before the Coll even starts, and under occl the ProxyOps and ProxySteps stop before
//! their Coll too (the Coll stays open while they run; under NCCL it stops first). So spans whose
//! root (the GroupApi) has no trace yet wait here until the tree's first Coll or P2p arrives, or
//! until they have waited `hold` (then their tree gets a trace of this process alone). The legacy
//! Group that a Coll names as `parentGroup` joins the Coll's trace as a child of its GroupApi.
//! Resolved roots are remembered a while for children that arrive late (NCCL's ProxyOps).
//!
//! Everything is bounded: remembered roots ([`KNOWN_CAP`]), waiting spans (`max_pending`, the
//! oldest tree is resolved early when it is reached), failed-ProxyOp marks ([`FAILED_CAP`]).

use super::ids::{self, CommKey};
use super::record::Rec;
use crate::event::EventDescr;
use std::collections::{HashMap, HashSet, VecDeque};
use std::time::{Duration, Instant};

/// Roots whose trace is remembered for late children.
pub const KNOWN_CAP: usize = 16_384;
/// Coll/P2p events remembered as having a ProxyOp that did not finish.
pub const FAILED_CAP: usize = 4096;

type Key = (CommKey, u64);

#[derive(Clone, Copy)]
struct Known {
    trace: [u8; 16],
    /// The parent a tree's root gets (a legacy Group under its GroupApi).
    parent: Option<u64>,
}

/// A span with its trace decided.
#[derive(Debug)]
pub struct Resolved {
    pub rec: Rec,
    pub trace: [u8; 16],
    /// Replaces the span's own parent (the legacy Group's).
    pub parent_override: Option<u64>,
    pub error: Option<String>,
}

struct Waiting {
    since: Instant,
    recs: Vec<Rec>,
}

pub struct Resolver {
    hold: Duration,
    max_pending: usize,
    track_steps: bool,
    known: HashMap<Key, Known>,
    known_order: VecDeque<Key>,
    pending: HashMap<Key, Waiting>,
    pending_order: VecDeque<Key>,
    pending_len: usize,
    failed: HashSet<Key>,
    failed_order: VecDeque<Key>,
}

impl Resolver {
    /// `track_steps`: ProxyStep events are collected, so a ProxyOp that finished fewer steps
    /// than planned failed.
    pub fn new(hold: Duration, max_pending: usize, track_steps: bool) -> Resolver {
        Resolver {
            hold,
            max_pending: max_pending.max(1),
            track_steps,
            known: HashMap::new(),
            known_order: VecDeque::new(),
            pending: HashMap::new(),
            pending_order: VecDeque::new(),
            pending_len: 0,
            failed: HashSet::new(),
            failed_order: VecDeque::new(),
        }
    }

    /// Spans waiting for their trace.
    #[cfg(test)]
    pub fn waiting(&self) -> usize {
        self.pending_len
    }

    /// Takes one finished span; whatever is now resolved goes to `out`.
    pub fn push(&mut self, rec: Rec, now: Instant, out: &mut Vec<Resolved>) {
        let c = rec.key();
        let mut error = None;
        if self.track_steps {
            error = rec.proxy_op_error();
            if let (Some(_), Some(p)) = (&error, rec.parent) {
                if self.failed.insert((c, p)) {
                    self.failed_order.push_back((c, p));
                    if self.failed_order.len() > FAILED_CAP {
                        if let Some(old) = self.failed_order.pop_front() {
                            self.failed.remove(&old);
                        }
                    }
                }
            }
        }
        let root = (c, rec.root);
        let (trace, group) = match rec.descr {
            EventDescr::Coll { func, seq_number, parent_group, .. } => {
                (Some(ids::coll_trace(c.hash, func, seq_number)), parent_group)
            }
            EventDescr::P2p { parent_group, .. } => (Some(ids::local_trace(c, rec.root)), parent_group),
            _ => (None, None),
        };
        if let Some(trace) = trace {
            if self.failed.remove(&(c, rec.id)) {
                error = Some("a proxy operation of it did not finish".into());
            }
            self.resolve(root, Known { trace, parent: None }, out);
            if let Some(g) = group.map(|g| g.get()).filter(|&g| g != rec.root) {
                // The Group joins the tree's trace (the first Coll's, if it has several).
                let t = self.known.get(&root).map_or(trace, |k| k.trace);
                self.resolve((c, g), Known { trace: t, parent: Some(rec.root) }, out);
            }
        }
        match self.known.get(&root).copied() {
            Some(k) => out.push(emit(rec, k, error)),
            None => {
                if self.pending_len >= self.max_pending {
                    self.expire_oldest(out);
                }
                let w = self.pending.entry(root).or_insert_with(|| Waiting { since: now, recs: Vec::new() });
                if w.recs.is_empty() {
                    self.pending_order.push_back(root);
                }
                w.recs.push(rec);
                self.pending_len += 1;
            }
        }
    }

    /// Trees that waited `hold` get a trace of their own.
    pub fn expire(&mut self, now: Instant, out: &mut Vec<Resolved>) {
        while let Some(k) = self.pending_order.front().copied() {
            match self.pending.get(&k) {
                Some(w) if now.duration_since(w.since) < self.hold => break,
                _ => self.expire_oldest(out),
            }
        }
    }

    /// Everything waiting, resolved now (flush, exit).
    pub fn drain(&mut self, out: &mut Vec<Resolved>) {
        while !self.pending_order.is_empty() {
            self.expire_oldest(out);
        }
    }

    /// When the tree's next span may expire.
    pub fn next_expiry(&self) -> Option<Instant> {
        let k = self.pending_order.front()?;
        self.pending.get(k).map(|w| w.since + self.hold)
    }

    fn expire_oldest(&mut self, out: &mut Vec<Resolved>) {
        let Some(k) = self.pending_order.pop_front() else { return };
        if self.pending.contains_key(&k) {
            self.resolve(k, Known { trace: ids::local_trace(k.0, k.1), parent: None }, out);
        }
    }

    fn resolve(&mut self, key: Key, known: Known, out: &mut Vec<Resolved>) {
        if self.known.contains_key(&key) {
            return;
        }
        self.known.insert(key, known);
        self.known_order.push_back(key);
        if self.known_order.len() > KNOWN_CAP {
            if let Some(old) = self.known_order.pop_front() {
                self.known.remove(&old);
            }
        }
        if let Some(w) = self.pending.remove(&key) {
            self.pending_len -= w.recs.len();
            self.pending_order.retain(|k| *k != key);
            for rec in w.recs {
                let error = if self.track_steps { rec.proxy_op_error() } else { None };
                out.push(emit(rec, known, error));
            }
        }
    }
}

fn emit(rec: Rec, k: Known, error: Option<String>) -> Resolved {
    let parent_override = if rec.id == rec.root { k.parent } else { None };
    Resolved { rec, trace: k.trace, parent_override, error }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::EventId;
    use crate::spans::{CommMeta, Span};
    use std::num::NonZeroU64;
    use std::sync::Arc;

    fn eid(n: u64) -> EventId {
        EventId(NonZeroU64::new(n).expect("non-zero"))
    }

    struct T {
        comm: Arc<CommMeta>,
    }

    impl T {
        fn new() -> T {
            T { comm: Arc::new(CommMeta { name: None, hash: 0xc0ffee, rank: 1, nranks: 2, n_nodes: 1 }) }
        }
        fn rec(&self, id: u64, parent: Option<u64>, root: u64, descr: EventDescr<'static>, steps_done: u32) -> Rec {
            Rec::new(&Span {
                comm: &self.comm,
                id: eid(id),
                parent: parent.map(eid),
                root: eid(root),
                start_ns: id,
                end_ns: id + 1,
                descr,
                payload: &[],
                states: &[],
                states_dropped: 0,
                steps_done,
            })
        }
    }

    fn coll(seq: u64, group: Option<u64>) -> EventDescr<'static> {
        EventDescr::Coll {
            rank: 1,
            seq_number: seq,
            func: "AllReduce",
            send_buff: 0,
            recv_buff: 0,
            count: 8,
            root: 0,
            datatype: "ncclFloat32",
            n_channels: 1,
            n_warps: 0,
            algo: "RING",
            proto: "SIMPLE",
            parent_group: group.map(eid),
        }
    }

    fn op(n_steps: i32) -> EventDescr<'static> {
        EventDescr::ProxyOp { rank: 1, pid: 1, channel_id: 0, peer: 0, n_steps, chunk_size: 64, is_send: true }
    }

    const API: EventDescr<'static> = EventDescr::CollApi {
        func: "AllReduce",
        count: 8,
        datatype: "ncclFloat32",
        root: 0,
        stream: 0,
        graph_captured: false,
    };
    const GAPI: EventDescr<'static> = EventDescr::GroupApi { graph_captured: false, group_depth: 1 };

    fn ids_of(out: &[Resolved]) -> Vec<u64> {
        out.iter().map(|r| r.rec.id).collect()
    }

    #[test]
    fn occl_order_waits_for_the_coll_and_the_group_joins_its_trace() {
        let t = T::new();
        let mut r = Resolver::new(Duration::from_secs(30), 100, true);
        let (now, mut out) = (Instant::now(), Vec::new());
        r.push(t.rec(2, Some(1), 1, API, 0), now, &mut out);
        r.push(t.rec(5, Some(4), 1, EventDescr::ProxyStep { rank: 1, step: 0 }, 0), now, &mut out);
        r.push(t.rec(4, Some(3), 1, op(1), 1), now, &mut out);
        assert!(out.is_empty());
        assert_eq!(r.waiting(), 3);
        r.push(t.rec(3, Some(2), 1, coll(7, Some(10)), 0), now, &mut out);
        r.push(t.rec(10, None, 10, EventDescr::Group, 0), now, &mut out);
        r.push(t.rec(1, None, 1, GAPI, 0), now, &mut out);
        assert_eq!(ids_of(&out), vec![2, 5, 4, 3, 10, 1]);
        let want = ids::coll_trace(0xc0ffee, "AllReduce", 7);
        assert!(out.iter().all(|x| x.trace == want && x.error.is_none()));
        assert_eq!(out[4].parent_override, Some(1), "the legacy Group hangs under its GroupApi");
        assert_eq!(out[5].parent_override, None);
        assert_eq!(r.waiting(), 0);
    }

    #[test]
    fn nccl_order_resolves_late_proxy_ops_and_marks_failures() {
        let t = T::new();
        let mut r = Resolver::new(Duration::from_secs(30), 100, true);
        let (now, mut out) = (Instant::now(), Vec::new());
        r.push(t.rec(2, Some(1), 1, API, 0), now, &mut out);
        r.push(t.rec(3, Some(2), 1, coll(1, None), 0), now, &mut out);
        r.push(t.rec(1, None, 1, GAPI, 0), now, &mut out);
        // The ProxyOp stops after its whole tree: it still finds the trace.
        r.push(t.rec(4, Some(3), 1, op(4), 2), now, &mut out);
        assert_eq!(ids_of(&out), vec![2, 3, 1, 4]);
        assert!(out.iter().all(|x| x.trace == out[0].trace));
        assert_eq!(out[3].error.as_deref(), Some("2 of 4 steps finished"));
        // occl order: a failed ProxyOp marks the Coll that stops after it.
        out.clear();
        r.push(t.rec(14, Some(13), 11, op(4), 3), now, &mut out);
        r.push(t.rec(13, Some(12), 11, coll(2, None), 0), now, &mut out);
        assert_eq!(ids_of(&out), vec![14, 13]);
        assert!(out.iter().all(|x| x.error.is_some()));
    }

    #[test]
    fn trees_without_a_coll_expire_and_waiting_is_bounded() {
        let t = T::new();
        let mut r = Resolver::new(Duration::from_secs(1), 2, false);
        let (now, mut out) = (Instant::now(), Vec::new());
        r.push(t.rec(1, None, 1, GAPI, 0), now, &mut out);
        r.push(t.rec(2, Some(1), 1, EventDescr::KernelLaunch { stream: 0 }, 0), now, &mut out);
        assert!(out.is_empty());
        assert_eq!(r.next_expiry(), Some(now + Duration::from_secs(1)));
        r.expire(now + Duration::from_millis(500), &mut out);
        assert!(out.is_empty());
        // A third waiting span pushes the oldest tree out early.
        r.push(t.rec(21, None, 21, GAPI, 0), now, &mut out);
        assert_eq!(ids_of(&out), vec![1, 2]);
        assert_eq!(out[0].trace, ids::local_trace(t.rec(1, None, 1, GAPI, 0).key(), 1));
        out.clear();
        r.expire(now + Duration::from_secs(2), &mut out);
        assert_eq!(ids_of(&out), vec![21]);
        // Without step tracking a short ProxyOp is not an error.
        out.clear();
        r.push(t.rec(33, Some(32), 31, coll(3, None), 0), now, &mut out);
        r.push(t.rec(34, Some(33), 31, op(4), 0), now, &mut out);
        assert!(out.iter().all(|x| x.error.is_none()));
        r.drain(&mut out);
        assert_eq!(r.waiting(), 0);
    }
}
