//! Flow control for RDMA write-with-immediate into a ring of N receive slots, with no I/O.
//!
//! The sender may write a slot only while it holds a credit; it starts with N. Every write
//! carries its sequence number in the immediate, so the receiver's completion says which write
//! landed. After the consumer is done with a slot, the receiver sends a credit back (a
//! zero-byte write-with-immediate on the reverse direction) naming the sequence number it
//! frees. RC delivers in order, so credits must come back in order: a gap means a credit was
//! lost or reordered, a repeat means it was sent twice, and both are errors rather than
//! silent drift (drift would let the sender overwrite unread data or stall forever).
//!
//! Immediate layout (32 bits): bit 31 is the kind (0 data, 1 credit), bits 0..31 the sequence
//! number modulo 2^31. Both sides start at the same sequence number (the sender's PSN from its
//! connection record), so a stale message from an earlier connection is unlikely to fit.

use crate::error::{Error, Result};
use std::collections::VecDeque;

/// Sequence numbers live in 31 bits and wrap.
pub const SEQ_MASK: u32 = 0x7fff_ffff;
const CREDIT_BIT: u32 = 1 << 31;
/// How far back a sequence number counts as "already seen" rather than "never sent".
const HISTORY: u32 = 1 << 30;

fn seq_add(a: u32, n: u32) -> u32 {
    a.wrapping_add(n) & SEQ_MASK
}

/// How many steps from `b` forward to `a`.
fn seq_diff(a: u32, b: u32) -> u32 {
    a.wrapping_sub(b) & SEQ_MASK
}

/// What an immediate says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Imm {
    /// A data write with this sequence number landed in the next slot.
    Data { seq: u32 },
    /// The receiver freed the slot of the data write with this sequence number.
    Credit { seq: u32 },
}

impl Imm {
    /// The immediate in host order (the driver converts to network order for verbs).
    pub fn encode(self) -> u32 {
        match self {
            Imm::Data { seq } => seq & SEQ_MASK,
            Imm::Credit { seq } => CREDIT_BIT | (seq & SEQ_MASK),
        }
    }

    /// Every 32-bit value decodes; whether it is expected is the state machines' business.
    pub fn decode(imm: u32) -> Imm {
        if imm & CREDIT_BIT != 0 {
            Imm::Credit { seq: imm & SEQ_MASK }
        } else {
            Imm::Data { seq: imm }
        }
    }
}

/// A write the sender may post now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Write {
    /// The remote slot to write (offset = slot × slot size).
    pub slot: u32,
    pub seq: u32,
    /// `Imm::Data { seq }` encoded.
    pub imm: u32,
}

/// The sending half of one direction.
#[derive(Debug, Clone)]
pub struct Sender {
    nslots: u32,
    /// Sequence number of the next write.
    next_seq: u32,
    next_slot: u32,
    /// Sequence number of the oldest write not credited yet.
    oldest: u32,
}

impl Sender {
    /// `nslots` ≥ 1 slots, all free; the first write gets sequence number `start`.
    pub fn new(nslots: u32, start: u32) -> Result<Sender> {
        if nslots == 0 || nslots > HISTORY {
            return Err(Error::Credit(format!("{nslots} slots: need 1 to {HISTORY}")));
        }
        let start = start & SEQ_MASK;
        Ok(Sender { nslots, next_seq: start, next_slot: 0, oldest: start })
    }

    /// Writes posted and not credited yet.
    pub fn in_flight(&self) -> u32 {
        seq_diff(self.next_seq, self.oldest)
    }

    pub fn credits(&self) -> u32 {
        self.nslots - self.in_flight()
    }

    /// Takes a credit for the next write, or `None` while every slot is in the receiver's hands.
    pub fn poll_send(&mut self) -> Option<Write> {
        if self.credits() == 0 {
            return None;
        }
        let w = Write { slot: self.next_slot, seq: self.next_seq, imm: Imm::Data { seq: self.next_seq }.encode() };
        self.next_seq = seq_add(self.next_seq, 1);
        self.next_slot = (self.next_slot + 1) % self.nslots;
        Some(w)
    }

    /// A credit arrived for write `seq`. It must be the oldest uncredited write.
    pub fn handle_credit(&mut self, seq: u32) -> Result<()> {
        let seq = seq & SEQ_MASK;
        if self.in_flight() > 0 && seq == self.oldest {
            self.oldest = seq_add(self.oldest, 1);
            return Ok(());
        }
        let ahead = seq_diff(seq, self.oldest);
        let behind = seq_diff(self.oldest, seq);
        Err(Error::Credit(if ahead < self.in_flight() {
            format!("credit for write {seq} before write {}: a credit was lost or came out of order", self.oldest)
        } else if behind > 0 && behind <= HISTORY {
            format!("credit for write {seq} came twice (it was already returned)")
        } else {
            format!("credit for write {seq}, which was never sent (next write is {})", self.next_seq)
        }))
    }
}

/// A data write that landed and waits for the consumer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Delivery {
    pub slot: u32,
    pub seq: u32,
    /// Bytes written (the completion's `byte_len`).
    pub len: u32,
}

/// The receiving half of one direction.
#[derive(Debug, Clone)]
pub struct Receiver {
    nslots: u32,
    expected: u32,
    next_slot: u32,
    /// Landed and not consumed, oldest first.
    filled: VecDeque<Delivery>,
    /// Credits to send back, oldest first.
    credits: VecDeque<u32>,
}

impl Receiver {
    /// Mirrors `Sender::new(nslots, start)` on the other side.
    pub fn new(nslots: u32, start: u32) -> Result<Receiver> {
        if nslots == 0 || nslots > HISTORY {
            return Err(Error::Credit(format!("{nslots} slots: need 1 to {HISTORY}")));
        }
        Ok(Receiver {
            nslots,
            expected: start & SEQ_MASK,
            next_slot: 0,
            filled: VecDeque::new(),
            credits: VecDeque::new(),
        })
    }

    /// A data write with sequence number `seq` and `len` bytes completed.
    pub fn handle_data(&mut self, seq: u32, len: u32) -> Result<Delivery> {
        let seq = seq & SEQ_MASK;
        if seq != self.expected {
            let behind = seq_diff(self.expected, seq);
            return Err(Error::Credit(if behind > 0 && behind <= HISTORY {
                format!("data write {seq} arrived twice (expected {})", self.expected)
            } else {
                format!("data write {seq} arrived, expected {}: a write was lost or reordered", self.expected)
            }));
        }
        if self.filled.len() as u32 >= self.nslots {
            return Err(Error::Credit(format!(
                "data write {seq} into slot {} without a credit: all {} slots hold unconsumed data",
                self.next_slot, self.nslots
            )));
        }
        let d = Delivery { slot: self.next_slot, seq, len };
        self.filled.push_back(d);
        self.expected = seq_add(seq, 1);
        self.next_slot = (self.next_slot + 1) % self.nslots;
        Ok(d)
    }

    /// The oldest landed write, for the consumer.
    pub fn peek(&self) -> Option<Delivery> {
        self.filled.front().copied()
    }

    /// The consumer is done with `slot`, which must be the oldest filled one; queues its credit.
    pub fn consume(&mut self, slot: u32) -> Result<()> {
        match self.filled.front() {
            Some(d) if d.slot == slot => {
                self.credits.push_back(d.seq);
                self.filled.pop_front();
                Ok(())
            }
            Some(d) => {
                Err(Error::Credit(format!("slot {slot} consumed before slot {} (slots are consumed in order)", d.slot)))
            }
            None => Err(Error::Credit(format!("slot {slot} consumed, but no slot holds data"))),
        }
    }

    /// The next credit to send back, as an immediate.
    pub fn poll_credit(&mut self) -> Option<u32> {
        self.credits.pop_front().map(|seq| Imm::Credit { seq }.encode())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn credit_seq(imm: u32) -> u32 {
        match Imm::decode(imm) {
            Imm::Credit { seq } => seq,
            other => panic!("expected a credit, got {other:?}"),
        }
    }

    #[test]
    fn immediates_tell_data_from_credits() {
        assert_eq!(Imm::decode(Imm::Data { seq: 5 }.encode()), Imm::Data { seq: 5 });
        assert_eq!(Imm::decode(Imm::Credit { seq: SEQ_MASK }.encode()), Imm::Credit { seq: SEQ_MASK });
        assert_eq!(Imm::Credit { seq: 0 }.encode(), 0x8000_0000);
        assert_eq!(Imm::Data { seq: u32::MAX }.encode(), SEQ_MASK, "the kind bit never leaks into data");
    }

    #[test]
    fn sender_stops_at_n_and_resumes_on_credit() {
        let mut s = Sender::new(3, 10).expect("new");
        let mut r = Receiver::new(3, 10).expect("new");
        let w: Vec<Write> = (0..3).map(|_| s.poll_send().expect("credit")).collect();
        assert_eq!(w.iter().map(|w| (w.slot, w.seq)).collect::<Vec<_>>(), vec![(0, 10), (1, 11), (2, 12)]);
        assert_eq!(s.poll_send(), None, "no credit left");
        for w in &w {
            let Imm::Data { seq } = Imm::decode(w.imm) else { panic!("data") };
            assert_eq!(r.handle_data(seq, 100).expect("in order").slot, w.slot);
        }
        assert_eq!(r.poll_credit(), None, "nothing consumed yet");
        r.consume(0).expect("oldest");
        s.handle_credit(credit_seq(r.poll_credit().expect("credit"))).expect("in order");
        assert_eq!(s.credits(), 1);
        assert_eq!(s.poll_send().map(|w| (w.slot, w.seq)), Some((0, 13)), "slot 0 again");
    }

    #[test]
    fn sequence_numbers_wrap_around() {
        let start = SEQ_MASK - 1;
        let mut s = Sender::new(2, start).expect("new");
        let mut r = Receiver::new(2, start).expect("new");
        let mut seen = Vec::new();
        for _ in 0..6 {
            let w = s.poll_send().expect("credit");
            seen.push(w.seq);
            let Imm::Data { seq } = Imm::decode(w.imm) else { panic!("data") };
            let d = r.handle_data(seq, 1).expect("in order");
            r.consume(d.slot).expect("consume");
            s.handle_credit(credit_seq(r.poll_credit().expect("credit"))).expect("credit in order");
        }
        assert_eq!(seen, vec![SEQ_MASK - 1, SEQ_MASK, 0, 1, 2, 3]);
        assert_eq!(s.credits(), 2);
    }

    #[test]
    fn out_of_order_lost_duplicate_and_unsent_credits_are_errors() {
        let mut s = Sender::new(4, 0).expect("new");
        for _ in 0..3 {
            s.poll_send().expect("credit");
        }
        // Credit 1 before 0: 0 was lost or reordered.
        let e = s.handle_credit(1).expect_err("out of order");
        assert!(e.to_string().contains("lost or came out of order"), "{e}");
        s.handle_credit(0).expect("oldest");
        let e = s.handle_credit(0).expect_err("duplicate");
        assert!(e.to_string().contains("came twice"), "{e}");
        let e = s.handle_credit(3).expect_err("never sent");
        assert!(e.to_string().contains("never sent"), "{e}");
        s.handle_credit(1).expect("in order");
        s.handle_credit(2).expect("in order");
        // Nothing in flight: any credit is wrong.
        assert!(s.handle_credit(3).expect_err("unsent").to_string().contains("never sent"));
        assert_eq!(s.credits(), 4);
    }

    #[test]
    fn receiver_rejects_duplicate_skipped_and_uncredited_writes() {
        let mut r = Receiver::new(1, 7).expect("new");
        assert!(r.handle_data(8, 1).expect_err("skip").to_string().contains("lost or reordered"));
        r.handle_data(7, 1).expect("first");
        assert!(r.handle_data(7, 1).expect_err("dup").to_string().contains("twice"));
        // The slot still holds data: a second write means the sender ignored credits.
        assert!(r.handle_data(8, 1).expect_err("overrun").to_string().contains("without a credit"));
        assert!(r.consume(1).is_err(), "slot 1 does not exist / is not oldest");
        r.consume(0).expect("oldest");
        assert!(r.consume(0).expect_err("empty").to_string().contains("no slot holds data"));
        assert_eq!(r.poll_credit().map(credit_seq), Some(7));
    }

    #[test]
    fn zero_slots_is_refused() {
        assert!(Sender::new(0, 0).is_err());
        assert!(Receiver::new(0, 0).is_err());
    }

    /// A tiny deterministic generator, so the schedule is random-looking but reproducible.
    struct Lcg(u64);
    impl Lcg {
        fn next(&mut self) -> u32 {
            self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (self.0 >> 33) as u32
        }
    }

    /// Both directions of one QP pair, with wires that deliver in order after random delays and
    /// consumers that consume at random moments. Returns how many steps it took.
    fn simulate(nslots: u32, messages: u32, seed: u64) -> u32 {
        let mut rng = Lcg(seed);
        // side[i] sends to side[1 - i].
        let mut senders = [Sender::new(nslots, 100).expect("s"), Sender::new(nslots, SEQ_MASK - 3).expect("s")];
        let mut receivers = [Receiver::new(nslots, SEQ_MASK - 3).expect("r"), Receiver::new(nslots, 100).expect("r")];
        // wire[i]: immediates in flight from side i to side 1 - i, in order.
        let mut wire: [VecDeque<u32>; 2] = [VecDeque::new(), VecDeque::new()];
        let mut sent = [0u32; 2];
        let mut got = [0u32; 2];
        for step in 0..1_000_000 {
            if got == [messages; 2] {
                return step;
            }
            let i = (rng.next() % 2) as usize;
            match rng.next() % 4 {
                0 if sent[i] < messages => {
                    if let Some(w) = senders[i].poll_send() {
                        wire[i].push_back(w.imm);
                        sent[i] += 1;
                    }
                }
                1 => {
                    if let Some(imm) = wire[i].pop_front() {
                        let j = 1 - i;
                        match Imm::decode(imm) {
                            Imm::Data { seq } => {
                                receivers[j].handle_data(seq, 8).expect("data in order");
                            }
                            Imm::Credit { seq } => senders[j].handle_credit(seq).expect("credit in order"),
                        }
                    }
                }
                2 => {
                    if let Some(d) = receivers[i].peek() {
                        receivers[i].consume(d.slot).expect("consume");
                        got[1 - i] += 1;
                    }
                }
                _ => {
                    if let Some(c) = receivers[i].poll_credit() {
                        wire[i].push_back(c);
                    }
                }
            }
        }
        panic!("no progress after 1e6 steps: sent {sent:?} got {got:?} (deadlock)");
    }

    #[test]
    fn one_slot_never_deadlocks() {
        for seed in 0..20 {
            simulate(1, 500, seed);
        }
    }

    #[test]
    fn many_slots_random_schedules_deliver_everything() {
        for (n, seed) in [(2, 1), (4, 2), (8, 3), (64, 4)] {
            simulate(n, 2000, seed);
        }
    }
}
