//! Mutual challenge-response between two RAS peers: each proves it knows the 16-byte job secret without sending it.
//! The proof is SipHash-2-4 keyed with the secret (a keyed PRF) over a role label, both nonces, both peer ids and
//! the peer table's hash. The role label keeps one side's proof from being reflected back as the other's, the
//! nonces keep it from being replayed, and the labels differ from the bootstrap's so neither handshake's proofs work
//! in the other.

use siphasher::sip128::{Hasher128, SipHasher24};
use std::hash::Hasher;

use crate::wire::PeerId;

#[derive(Debug, Clone, Copy)]
pub(crate) enum Role {
    Acceptor,
    Connector,
}

/// What both proofs of one handshake are computed over.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Transcript {
    pub connector: PeerId,
    pub acceptor: PeerId,
    pub nonce_c: [u8; 16],
    pub nonce_s: [u8; 16],
    pub table_hash: u64,
}

pub(crate) fn proof(secret: &[u8; 16], role: Role, t: &Transcript) -> [u8; 16] {
    let mut h = SipHasher24::new_with_key(secret);
    h.write(match role {
        Role::Acceptor => b"occl-ras mesh acceptor",
        Role::Connector => b"occl-ras mesh connector",
    });
    h.write(&t.nonce_c);
    h.write(&t.nonce_s);
    h.write_u32(t.connector.0);
    h.write_u32(t.acceptor.0);
    h.write_u64(t.table_hash);
    h.finish128().as_bytes()
}

/// A name for the job when the launcher gives none, equal on every process that holds `secret` and saying nothing
/// of it (SipHash-2-4 keyed with the secret over a label of its own): 16 hex digits.
pub fn job_name(secret: &[u8; 16]) -> String {
    let mut h = SipHasher24::new_with_key(secret);
    h.write(b"occl-ras job name");
    format!("{:016x}", h.finish128().h1)
}

/// Compares without an early exit, so timing says nothing about how much of a forged proof was right.
pub(crate) fn ct_eq(a: &[u8; 16], b: &[u8; 16]) -> bool {
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Nonces and ids from a seed the driver draws from the OS (the mesh itself has no entropy source, so that tests are
/// deterministic): SipHash-2-4 keyed with the seed over a counter, which is unpredictable without the seed.
#[derive(Debug, Clone)]
pub(crate) struct Rng {
    key: [u8; 16],
    counter: u64,
}

impl Rng {
    pub fn new(seed: [u8; 16]) -> Self {
        Self { key: seed, counter: 0 }
    }

    pub fn bytes16(&mut self) -> [u8; 16] {
        let mut h = SipHasher24::new_with_key(&self.key);
        h.write_u64(self.counter);
        self.counter = self.counter.wrapping_add(1);
        h.finish128().as_bytes()
    }

    pub fn u64(&mut self) -> u64 {
        let b = self.bytes16();
        u64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]])
    }
}
