//! Who may hold a client-port connection. A bounded table, with a bound per peer address, in which a newcomer pushes
//! out an idle connection instead of being refused: a flood of connections that say nothing cannot keep `ncclras` or
//! a Prometheus scrape out, and the process never holds more sockets than the bound. Pure bookkeeping (the caller
//! passes the clock and closes what it is told to), so the policy is tested without sockets.
//!
//! A connection is, in turn:
//! - fresh: accepted, no complete request yet (a flood's connections stay here until the request timeout);
//! - waiting: it made a request and waits for the next (an `ncclras` between commands, an HTTP keep-alive);
//! - busy: a request is being served (a status gather, a scrape);
//! - streaming: a `MONITOR` or server-sent-events client, for as long as it stays.
//!
//! Fresh and waiting connections can be evicted: fresh ones first, from the address with the most connections, the
//! oldest first. Busy and streaming ones never are; streams are bounded so that part of the table always stays
//! free for requests.

use std::collections::HashMap;
use std::net::IpAddr;

/// The bounds of the table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Limits {
    /// Connections held at once.
    pub total: usize,
    /// Connections held at once from one peer address.
    pub per_addr: usize,
    /// Streaming connections held at once (below `total`, so the rest stays for requests).
    pub streams: usize,
}

impl Limits {
    /// `total` connections, three quarters of them from one address, half of them streams.
    pub(crate) fn for_total(total: usize) -> Limits {
        let total = total.max(4);
        Limits { total, per_addr: total * 3 / 4, streams: total / 2 }
    }
}

/// A connection's handle in the table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct Slot(pub u64);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Fresh,
    Waiting,
    Busy,
    Streaming,
}

#[derive(Debug)]
struct Entry {
    addr: IpAddr,
    state: State,
    /// When it last became fresh or waiting (ms on the caller's clock).
    since: u64,
}

/// What to do with a new connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Admit {
    /// Serve it as `slot`, after closing `evict` if given (already out of the table).
    Yes { slot: Slot, evict: Option<Slot> },
    /// Every connection it could replace is being served: close it.
    No,
}

/// The table of client connections.
#[derive(Debug)]
pub(crate) struct Admission {
    limits: Limits,
    next: u64,
    conns: HashMap<Slot, Entry>,
    streams: usize,
}

impl Admission {
    pub(crate) fn new(limits: Limits) -> Admission {
        Admission { limits, next: 1, conns: HashMap::new(), streams: 0 }
    }

    /// Connections held now.
    pub(crate) fn len(&self) -> usize {
        self.conns.len()
    }

    /// Whether `slot` is held (not released or evicted).
    pub(crate) fn contains(&self, slot: Slot) -> bool {
        self.conns.contains_key(&slot)
    }

    /// A connection from `addr` was accepted at `now`.
    pub(crate) fn admit(&mut self, now: u64, addr: IpAddr) -> Admit {
        let from_addr = self.conns.values().filter(|e| e.addr == addr).count();
        let evict = if from_addr >= self.limits.per_addr {
            match self.victim(Some(addr)) {
                Some(v) => Some(v),
                None => return Admit::No,
            }
        } else if self.conns.len() >= self.limits.total {
            match self.victim(None) {
                Some(v) => Some(v),
                None => return Admit::No,
            }
        } else {
            None
        };
        if let Some(v) = evict {
            self.release(v);
        }
        let slot = Slot(self.next);
        self.next += 1;
        self.conns.insert(slot, Entry { addr, state: State::Fresh, since: now });
        Admit::Yes { slot, evict }
    }

    /// The connection to push out: fresh before waiting, then from the address holding the most connections, then
    /// the longest idle; only from `addr` when given.
    fn victim(&self, addr: Option<IpAddr>) -> Option<Slot> {
        let mut per_addr: HashMap<IpAddr, usize> = HashMap::new();
        for e in self.conns.values() {
            *per_addr.entry(e.addr).or_default() += 1;
        }
        self.conns
            .iter()
            .filter(|(_, e)| matches!(e.state, State::Fresh | State::Waiting))
            .filter(|(_, e)| addr.is_none_or(|a| a == e.addr))
            .min_by_key(|(s, e)| {
                let held = per_addr.get(&e.addr).copied().unwrap_or(0);
                (e.state == State::Waiting, std::cmp::Reverse(held), e.since, **s)
            })
            .map(|(s, _)| *s)
    }

    /// A request is being served on `slot`: it cannot be evicted until it waits again.
    pub(crate) fn busy(&mut self, slot: Slot) {
        if let Some(e) = self.conns.get_mut(&slot) {
            if e.state != State::Streaming {
                e.state = State::Busy;
            }
        }
    }

    /// `slot` finished a request (or completed a command line) at `now` and waits for the next.
    pub(crate) fn waiting(&mut self, now: u64, slot: Slot) {
        if let Some(e) = self.conns.get_mut(&slot) {
            if e.state != State::Streaming {
                e.state = State::Waiting;
                e.since = now;
            }
        }
    }

    /// `slot` becomes a stream; `false` (and no change) when the streams are all taken.
    pub(crate) fn stream(&mut self, slot: Slot) -> bool {
        let Some(e) = self.conns.get_mut(&slot) else { return false };
        if e.state == State::Streaming {
            return true;
        }
        if self.streams >= self.limits.streams {
            return false;
        }
        e.state = State::Streaming;
        self.streams += 1;
        true
    }

    /// `slot` is closed (or was evicted); unknown slots are ignored.
    pub(crate) fn release(&mut self, slot: Slot) {
        if let Some(e) = self.conns.remove(&slot) {
            if e.state == State::Streaming {
                self.streams -= 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    fn ip(last: u8) -> IpAddr {
        IpAddr::V4(Ipv4Addr::new(10, 0, 0, last))
    }

    fn yes(a: Admit) -> (Slot, Option<Slot>) {
        match a {
            Admit::Yes { slot, evict } => (slot, evict),
            Admit::No => panic!("refused"),
        }
    }

    #[test]
    fn an_idle_flood_makes_room_for_a_newcomer_oldest_first() {
        let mut t = Admission::new(Limits { total: 8, per_addr: 8, streams: 4 });
        let flood: Vec<Slot> = (0..8).map(|i| yes(t.admit(i, ip(1))).0).collect();
        // Each later connection pushes out the oldest fresh one; the table stays at its bound.
        for (i, old) in flood.iter().enumerate() {
            let (_, evict) = yes(t.admit(100 + i as u64, ip(1)));
            assert_eq!(evict, Some(*old));
            assert_eq!(t.len(), 8);
        }
    }

    #[test]
    fn fresh_connections_go_before_ones_that_made_a_request() {
        let mut t = Admission::new(Limits { total: 3, per_addr: 3, streams: 1 });
        let (client, _) = yes(t.admit(0, ip(1)));
        t.waiting(1, client); // an ncclras between two commands
        let (f1, _) = yes(t.admit(2, ip(1)));
        let (f2, _) = yes(t.admit(3, ip(1)));
        assert_eq!(yes(t.admit(4, ip(1))).1, Some(f1));
        assert_eq!(yes(t.admit(5, ip(1))).1, Some(f2));
    }

    #[test]
    fn busy_and_streaming_connections_are_never_evicted() {
        let mut t = Admission::new(Limits { total: 3, per_addr: 3, streams: 1 });
        let (a, _) = yes(t.admit(0, ip(1)));
        let (b, _) = yes(t.admit(1, ip(1)));
        let (c, _) = yes(t.admit(2, ip(1)));
        t.busy(a);
        assert!(t.stream(b));
        assert!(!t.stream(c), "one stream at most");
        t.busy(c);
        assert_eq!(t.admit(3, ip(1)), Admit::No);
        // A stream stays a stream when its connection's middleware says the request ended.
        t.waiting(4, b);
        assert_eq!(t.admit(5, ip(1)), Admit::No);
        t.waiting(6, c);
        assert_eq!(yes(t.admit(7, ip(1))).1, Some(c));
        t.release(b);
        assert!(t.stream(a), "the stream slot is free again");
    }

    #[test]
    fn one_address_cannot_push_out_another() {
        let mut t = Admission::new(Limits { total: 8, per_addr: 6, streams: 4 });
        let (other, _) = yes(t.admit(0, ip(2)));
        let (other2, _) = yes(t.admit(0, ip(3)));
        for i in 0..6 {
            yes(t.admit(1 + i, ip(1)));
        }
        for i in 0..20 {
            let (_, evict) = yes(t.admit(10 + i, ip(1)));
            let evict = evict.expect("at its bound");
            assert!(evict != other && evict != other2, "address 1 pushed out another address's connection");
        }
        assert_eq!(t.len(), 8);
        // Another address still gets in when the table is full: the address holding the most gives way.
        let (_, evict) = yes(t.admit(50, ip(4)));
        assert!(evict.is_some_and(|e| e != other && e != other2), "{evict:?}");
        assert_eq!(t.len(), 8);
    }

    #[test]
    fn limits_from_a_total() {
        assert_eq!(Limits::for_total(256), Limits { total: 256, per_addr: 192, streams: 128 });
        assert_eq!(Limits::for_total(0), Limits { total: 4, per_addr: 3, streams: 2 });
    }
}
