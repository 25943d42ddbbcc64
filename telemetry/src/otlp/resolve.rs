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
use super::model;
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
            error = model::proxy_op_error(&rec);
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
                let error = if self.track_steps { model::proxy_op_error(&rec) } else { None };
                out.push(emit(rec, known, error));
            }
        }
    }
}

fn emit(rec: Rec, k: Known, error: Option<String>) -> Resolved {
    let parent_override = if rec.id == rec.root { k.parent } else { None };
    Resolved { rec, trace: k.trace, parent_override, error }
}
