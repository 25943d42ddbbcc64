//! What this process believes about every peer being dead or alive, as a join-semilattice: each peer's state is
//! (epoch, dead), ordered by epoch and then dead after alive. Applying news keeps the larger state, so any two
//! processes that have seen the same news agree whatever the order, and a process floods only news that raised its
//! state, which is also what ends a flood.

use std::hash::Hasher;

use siphasher::sip::SipHasher13;

use crate::wire::{NewsItem, PeerId};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct PeerNewsState {
    pub epoch: u32,
    pub dead: bool,
}

impl PeerNewsState {
    fn newer_than(self, other: PeerNewsState) -> bool {
        (self.epoch, self.dead) > (other.epoch, other.dead)
    }
}

#[derive(Debug, Clone)]
pub(crate) struct NewsBook {
    states: Vec<PeerNewsState>,
    /// XOR of an entry hash over every state that is not the initial one: order-free and updated in O(1).
    digest: u64,
    dead: u32,
}

fn entry_hash(peer: PeerId, s: PeerNewsState) -> u64 {
    let mut h = SipHasher13::new_with_keys(0x6e65_7773, 0x6469_6765_7374);
    h.write_u32(peer.0);
    h.write_u32(s.epoch);
    h.write_u8(u8::from(s.dead));
    h.finish()
}

impl NewsBook {
    pub fn new(n: usize) -> Self {
        Self { states: vec![PeerNewsState::default(); n], digest: 0, dead: 0 }
    }

    pub fn get(&self, p: PeerId) -> PeerNewsState {
        self.states.get(p.0 as usize).copied().unwrap_or_default()
    }

    pub fn is_dead(&self, p: PeerId) -> bool {
        self.get(p).dead
    }

    pub fn digest(&self) -> u64 {
        self.digest
    }

    pub fn dead_count(&self) -> u32 {
        self.dead
    }

    pub fn dead_peers(&self) -> Vec<PeerId> {
        self.states.iter().enumerate().filter(|(_, s)| s.dead).map(|(i, _)| PeerId(i as u32)).collect()
    }

    /// Every state that differs from the initial one, as news items (what a process sends to resynchronise a peer).
    pub fn items(&self) -> Vec<NewsItem> {
        self.states
            .iter()
            .enumerate()
            .filter(|(_, s)| **s != PeerNewsState::default())
            .map(|(i, s)| NewsItem { peer: PeerId(i as u32), epoch: s.epoch, dead: s.dead })
            .collect()
    }

    /// Keeps `item` if it is newer than what is held; returns whether it was (an unknown peer is ignored).
    pub fn apply(&mut self, item: NewsItem) -> bool {
        let new = PeerNewsState { epoch: item.epoch, dead: item.dead };
        let Some(old) = self.states.get_mut(item.peer.0 as usize) else {
            return false;
        };
        if !new.newer_than(*old) {
            return false;
        }
        if *old != PeerNewsState::default() {
            self.digest ^= entry_hash(item.peer, *old);
        }
        self.digest ^= entry_hash(item.peer, new);
        self.dead = self.dead + u32::from(new.dead) - u32::from(old.dead);
        *old = new;
        true
    }
}
