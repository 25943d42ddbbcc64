//! What a polled work completion means for the transport, with no I/O: the progress engine
//! polls the CQ and hands each `ibv_wc` to `classify`, then feeds the result to `Endpoint`,
//! which owns both flow-control halves of one QP. A failed completion becomes a `WcError`
//! whose text names the verbs status and what it usually means, for occl to report as a
//! `RemoteError` naming the peer.

use crate::credit::{Delivery, Imm, Receiver, Sender};
use crate::error::{Error, Result};
use crate::sys;

/// One successful completion, decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// The peer's data write with this sequence number landed (`len` bytes).
    Data { seq: u32, len: u32 },
    /// The peer freed the slot of our write with this sequence number.
    Credit { seq: u32 },
    /// One of our posted writes (data or credit) completed locally.
    Sent { wr_id: u64 },
}

/// A completion with an error status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WcError {
    pub status: u32,
    pub vendor_err: u32,
    pub wr_id: u64,
}

impl std::fmt::Display for WcError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "work request {} failed: {} ({}), vendor error {:#x}",
            self.wr_id,
            status_name(self.status),
            status_hint(self.status),
            self.vendor_err
        )
    }
}

impl std::error::Error for WcError {}

impl WcError {
    /// Flushed requests only echo an earlier failure on the same QP; report that one instead.
    pub fn is_flush(&self) -> bool {
        self.status == 5
    }
}

/// `enum ibv_wc_status` names, in verbs.h's order.
const STATUS_NAMES: [&str; 24] = [
    "IBV_WC_SUCCESS",
    "IBV_WC_LOC_LEN_ERR",
    "IBV_WC_LOC_QP_OP_ERR",
    "IBV_WC_LOC_EEC_OP_ERR",
    "IBV_WC_LOC_PROT_ERR",
    "IBV_WC_WR_FLUSH_ERR",
    "IBV_WC_MW_BIND_ERR",
    "IBV_WC_BAD_RESP_ERR",
    "IBV_WC_LOC_ACCESS_ERR",
    "IBV_WC_REM_INV_REQ_ERR",
    "IBV_WC_REM_ACCESS_ERR",
    "IBV_WC_REM_OP_ERR",
    "IBV_WC_RETRY_EXC_ERR",
    "IBV_WC_RNR_RETRY_EXC_ERR",
    "IBV_WC_LOC_RDD_VIOL_ERR",
    "IBV_WC_REM_INV_RD_REQ_ERR",
    "IBV_WC_REM_ABORT_ERR",
    "IBV_WC_INV_EECN_ERR",
    "IBV_WC_INV_EEC_STATE_ERR",
    "IBV_WC_FATAL_ERR",
    "IBV_WC_RESP_TIMEOUT_ERR",
    "IBV_WC_GENERAL_ERR",
    "IBV_WC_TM_ERR",
    "IBV_WC_TM_RNDV_INCOMPLETE",
];

fn status_name(status: u32) -> &'static str {
    STATUS_NAMES.get(status as usize).copied().unwrap_or("unknown status")
}

/// What the statuses occl can meet usually mean, so the error says what to look at.
fn status_hint(status: u32) -> &'static str {
    match status {
        5 => "flushed after an earlier error on this queue pair",
        10 => "the peer refused the write: its memory registration or key does not match",
        12 => "transport retries exhausted: the peer is unreachable, dead or its port went down",
        13 => "receiver-not-ready retries exhausted: the peer posted no receive",
        1 | 2 | 4 | 8 => "a local error: a bad work request or registration (an occl bug)",
        _ => "see the verbs documentation",
    }
}

/// Decodes one completion of a QP that only posts RDMA writes with immediate and zero-length
/// receives.
pub fn classify(wc: &sys::IbvWc) -> std::result::Result<Event, WcError> {
    if wc.status != sys::IBV_WC_SUCCESS {
        return Err(WcError { status: wc.status, vendor_err: wc.vendor_err, wr_id: wc.wr_id });
    }
    if wc.opcode == sys::IBV_WC_RECV_RDMA_WITH_IMM {
        if wc.wc_flags & sys::IBV_WC_WITH_IMM == 0 {
            // Cannot happen for this opcode on a correct provider; treat it as a local error.
            return Err(WcError { status: 2, vendor_err: 0, wr_id: wc.wr_id });
        }
        return Ok(match Imm::decode(u32::from_be(wc.imm_data)) {
            Imm::Data { seq } => Event::Data { seq, len: wc.byte_len },
            Imm::Credit { seq } => Event::Credit { seq },
        });
    }
    Ok(Event::Sent { wr_id: wc.wr_id })
}

/// Both directions of flow control on one QP: our writes to the peer and the peer's to us.
#[derive(Debug, Clone)]
pub struct Endpoint {
    pub send: Sender,
    pub recv: Receiver,
}

impl Endpoint {
    /// `nslots` slots each way; our writes start at `our_start`, the peer's at `peer_start`
    /// (each side's PSN from its connection record).
    pub fn new(nslots: u32, our_start: u32, peer_start: u32) -> Result<Endpoint> {
        Ok(Endpoint { send: Sender::new(nslots, our_start)?, recv: Receiver::new(nslots, peer_start)? })
    }

    /// Applies one successful completion; returns the delivery when data landed.
    pub fn handle(&mut self, ev: Event) -> Result<Option<Delivery>> {
        match ev {
            Event::Data { seq, len } => self.recv.handle_data(seq, len).map(Some),
            Event::Credit { seq } => self.send.handle_credit(seq).map(|()| None),
            Event::Sent { .. } => Ok(None),
        }
    }

    /// Classifies and applies one completion: a failed completion or a protocol violation is
    /// an error (the first as `Error::Credit` would hide the status, so it stays a `WcError`).
    pub fn handle_wc(&mut self, wc: &sys::IbvWc) -> std::result::Result<Option<Delivery>, CompletionError> {
        let ev = classify(wc).map_err(CompletionError::Wc)?;
        self.handle(ev).map_err(CompletionError::Protocol)
    }
}

/// Fuzz entry (`ibverbs/fuzz`): arbitrary completions (each 13 bytes: status, opcode/flags,
/// immediate, length) fed to an endpoint, interleaved with sends and consumption, never panic
/// and never let the sender exceed its slots.
#[cfg(any(test, feature = "test-support"))]
pub fn fuzz_completions(data: &[u8]) {
    let Some((&n, rest)) = data.split_first() else { return };
    let nslots = u32::from(n % 8) + 1;
    let Ok(mut ep) = Endpoint::new(nslots, 0, 0) else { return };
    for c in rest.chunks_exact(13) {
        let word = |i: usize| u32::from_le_bytes([c[i], c[i + 1], c[i + 2], c[i + 3]]);
        let wc = sys::IbvWc {
            status: u32::from(c[0] % 4 / 3) * 12,
            opcode: if c[0] & 0x10 != 0 { sys::IBV_WC_RECV_RDMA_WITH_IMM } else { 1 },
            wc_flags: if c[0] & 0x20 != 0 { 0 } else { sys::IBV_WC_WITH_IMM },
            imm_data: word(1),
            byte_len: word(5),
            wr_id: u64::from(word(9)),
            ..Default::default()
        };
        if c[0] & 0x40 != 0 {
            let _ = ep.send.poll_send();
        }
        if c[0] & 0x80 != 0 {
            if let Some(d) = ep.recv.peek() {
                let _ = ep.recv.consume(d.slot);
                let _ = ep.recv.poll_credit();
            }
        }
        let _ = ep.handle_wc(&wc);
        assert!(ep.send.in_flight() <= nslots, "the sender exceeded its {nslots} slots");
    }
}

/// Why a completion could not be applied.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CompletionError {
    #[error("{0}")]
    Wc(WcError),
    #[error("{0}")]
    Protocol(Error),
}

#[cfg(test)]
mod tests {
    use super::*;

    fn recv_wc(imm: u32, len: u32) -> sys::IbvWc {
        sys::IbvWc {
            opcode: sys::IBV_WC_RECV_RDMA_WITH_IMM,
            wc_flags: sys::IBV_WC_WITH_IMM,
            imm_data: imm.to_be(),
            byte_len: len,
            ..Default::default()
        }
    }

    #[test]
    fn status_names_follow_verbs_h() {
        assert_eq!(status_name(12), "IBV_WC_RETRY_EXC_ERR");
        assert_eq!(status_name(23), "IBV_WC_TM_RNDV_INCOMPLETE");
        assert_eq!(status_name(99), "unknown status");
    }

    #[test]
    fn successful_completions_decode_by_opcode_and_immediate() {
        assert_eq!(classify(&recv_wc(Imm::Data { seq: 9 }.encode(), 4096)), Ok(Event::Data { seq: 9, len: 4096 }));
        assert_eq!(classify(&recv_wc(Imm::Credit { seq: 3 }.encode(), 0)), Ok(Event::Credit { seq: 3 }));
        let sent = sys::IbvWc { wr_id: 42, opcode: 1, ..Default::default() };
        assert_eq!(classify(&sent), Ok(Event::Sent { wr_id: 42 }));
        let mut no_imm = recv_wc(0, 0);
        no_imm.wc_flags = 0;
        assert!(classify(&no_imm).is_err(), "a receive with immediate must carry one");
    }

    #[test]
    fn error_completions_say_what_failed() {
        let wc = sys::IbvWc { status: 12, vendor_err: 0x81, wr_id: 7, ..Default::default() };
        let e = classify(&wc).expect_err("failed");
        assert!(!e.is_flush());
        let text = e.to_string();
        assert!(text.contains("IBV_WC_RETRY_EXC_ERR") && text.contains("unreachable, dead"), "{text}");
        assert!(text.contains("0x81") && text.contains("work request 7"), "{text}");
        let flush = classify(&sys::IbvWc { status: 5, ..Default::default() }).expect_err("flush");
        assert!(flush.is_flush());
    }

    #[test]
    fn random_completion_streams_never_panic() {
        let mut x: u64 = 0xc0ffee;
        for len in 0..3000usize {
            let bytes: Vec<u8> = (0..len % 400)
                .map(|_| {
                    x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                    // Small immediates, so that some sequence numbers are the expected ones.
                    let b = (x >> 33) as u8;
                    if x & 1 == 0 {
                        b % 4
                    } else {
                        b
                    }
                })
                .collect();
            fuzz_completions(&bytes);
        }
    }

    /// Two endpoints wired through encoded completions, as the progress engine would drive them.
    #[test]
    fn endpoints_exchange_data_and_credits_through_completions() {
        let (psn_a, psn_b) = (0x7fff_fffe, 5);
        let mut a = Endpoint::new(2, psn_a, psn_b).expect("a");
        let mut b = Endpoint::new(2, psn_b, psn_a).expect("b");
        for round in 0..10u32 {
            let w = a.send.poll_send().expect("a has a credit");
            let d = b.handle_wc(&recv_wc(w.imm, 100 + round)).expect("data").expect("delivery");
            assert_eq!((d.slot, d.len), (round % 2, 100 + round));
            assert_eq!(a.handle_wc(&sys::IbvWc { wr_id: 1, ..Default::default() }).expect("sent"), None);
            b.recv.consume(d.slot).expect("consume");
            let credit = b.recv.poll_credit().expect("credit");
            assert_eq!(a.handle_wc(&recv_wc(credit, 0)).expect("credit"), None);
        }
        assert_eq!(a.send.credits(), 2);
        // A credit the receiver never sent is a protocol error, not a silent extra slot.
        let bogus = recv_wc(Imm::Credit { seq: 12345 }.encode(), 0);
        assert!(matches!(a.handle_wc(&bogus), Err(CompletionError::Protocol(Error::Credit(_)))));
    }
}
