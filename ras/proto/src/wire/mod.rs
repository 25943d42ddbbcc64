//! The RAS peer-to-peer wire format: the messages RAS threads of one job exchange over TCP, and a size-bounded
//! streaming codec for them.
//!
//! Frame layout (every integer big-endian):
//!
//! ```text
//! +----------------+---------+------+----------------------+
//! | length: u32 BE | version | type | body (length-2 bytes) |
//! +----------------+---------+------+----------------------+
//! ```
//!
//! `length` counts the version byte, the type byte and the body; it is at most [`MAX_FRAME`] (or the decoder's
//! smaller limit, [`HANDSHAKE_MAX_FRAME`] before a connection is authenticated). Inside a body, counters and sizes
//! are LEB128 varints (u64, at most 10 bytes; signed values zigzag), hashes and nonces are fixed-width, a string is a
//! varint byte length (at most [`MAX_STRING`]) plus UTF-8, an `Option` is a 0/1 byte then the value, a list is a
//! varint count then the items, each list with its own bound. Anything else is an error: an unknown type, version,
//! flag bit or enum value, a bad UTF-8 string, and bytes left over after a body.
//!
//! Decoding never panics and allocates at most a small constant multiple of the frame it was given: every list
//! count is checked against the bytes left before anything is reserved.

mod codec;
mod decoder;
#[cfg(test)]
pub(crate) mod tests;

use std::fmt;

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::record::RankRecord;

pub(crate) use codec::reply_len;
pub use codec::{encode, encoded_len};
pub use decoder::{Decoder, MAX_PUSH};

/// Wire format version carried by every frame. 2: rank records carry the failed-call count and the last failure.
pub const VERSION: u8 = 2;
/// Bytes before the version byte: the length.
pub const HEADER_LEN: usize = 4;
/// The largest frame (version, type and body) a peer may send: room for a status reply of ~60,000 rank records.
pub const MAX_FRAME: usize = 16 << 20;
/// The decoder's limit until a connection is authenticated: handshake messages are well below it, so a stranger
/// cannot make a process buffer more than this.
pub const HANDSHAKE_MAX_FRAME: usize = 8 * 1024;
/// The longest string (host names, addresses).
pub const MAX_STRING: usize = 4096;
/// The most entries in a list of peers (dead or unresponsive peers, news items, process statuses in one reply).
pub const MAX_PEERS: usize = 1 << 16;
/// The most rank records one process may report.
pub const MAX_RECORDS: usize = 1 << 16;
/// The most hops a status request records in its path; further hops are not appended.
pub const MAX_PATH: usize = 256;
/// The longest metrics text one process sends (Prometheus exposition of its own series).
pub const MAX_METRICS_TEXT: usize = 8 << 20;

/// A process's index in the job's sorted peer table (the same on every process of the job).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct PeerId(pub u32);

impl fmt::Display for PeerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "peer {}", self.0)
    }
}

/// A status gather, unique per originating process: the originator and a number it never reuses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct RequestId {
    pub origin: PeerId,
    pub seq: u64,
}

/// One piece of peer news as first sent, for logs and for counting how often news travels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct NewsId {
    pub origin: PeerId,
    pub seq: u64,
}

/// Connecting side, first message: who it is and its challenge.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hello {
    /// Hash of the sender's peer table; both sides must hold the same table.
    pub table_hash: u64,
    pub from: PeerId,
    /// The sender's RAS listening address, as in the peer table.
    pub from_addr: String,
    /// The sender's incarnation (see [`NewsItem::epoch`]).
    pub epoch: u32,
    pub nonce: [u8; 16],
}

/// Accepting side: who it is, its challenge, and its proof over both challenges.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HelloAck {
    pub from: PeerId,
    pub epoch: u32,
    pub nonce: [u8; 16],
    pub proof: [u8; 16],
}

/// Connecting side: its proof over both challenges. The connection is authenticated once this checks out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HelloFinish {
    pub proof: [u8; 16],
}

/// Sent on a connection when nothing else went out for a keep-alive interval; carries the sender's view so that
/// two views that drifted apart are noticed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeepAlive {
    pub table_hash: u64,
    /// Digest of the sender's peer news (who is dead, at which epoch); a mismatch makes both sides exchange news.
    pub news_digest: u64,
    /// Peers the sender considers dead.
    pub dead: u32,
    /// Peers the sender finds unresponsive right now.
    pub unresponsive: u32,
    /// The sender wants this connection as one of its links (so the receiver keeps it open).
    pub link: bool,
}

/// A peer's state as news: dead or alive at an epoch. News for a peer is ordered by (epoch, dead after alive), and a
/// process applies and floods only news newer than what it holds, which is also what stops the flood.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct NewsItem {
    pub peer: PeerId,
    /// The peer's incarnation: a process declared dead at epoch e that proves it is alive comes back at e + 1.
    pub epoch: u32,
    pub dead: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerNews {
    pub id: NewsId,
    pub items: Vec<NewsItem>,
}

/// A status gather on its way out from the originator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatusRequest {
    pub id: RequestId,
    /// Nanoseconds the receiver has, from the moment the request arrives, to send its reply.
    pub budget_ns: u64,
    /// Processes the request went through, originator first (at most [`MAX_PATH`]).
    pub path: Vec<PeerId>,
}

/// What one process reports about itself in a gather.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessStatus {
    pub peer: PeerId,
    pub addr: String,
    pub host: String,
    pub pid: u32,
    pub epoch: u32,
    pub records: Vec<RankRecord>,
    /// Peers this process considers dead.
    pub dead: Vec<PeerId>,
    /// Peers this process finds unresponsive (silent too long) right now.
    pub unresponsive: Vec<PeerId>,
}

/// A subtree's answer to a status request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatusReply {
    pub id: RequestId,
    /// The receiver already had this request from elsewhere; the reply is empty and only ends the wait.
    pub duplicate: bool,
    /// Legs in the subtree that timed out.
    pub leg_timeouts: u32,
    pub statuses: Vec<ProcessStatus>,
}

/// A process asks another on its node for its metrics (a scrape of the node's `/metrics`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetricsRequest {
    /// Chosen by the asking process; the reply carries it back.
    pub seq: u64,
}

/// A process's metrics in Prometheus text exposition format (at most [`MAX_METRICS_TEXT`] bytes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetricsReply {
    pub seq: u64,
    pub text: String,
}

/// Why a connection is being closed on purpose.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ByeReason {
    /// The process is leaving the job.
    Shutdown,
    /// Another connection between the same two processes is kept instead.
    Duplicate,
    /// Neither side wants the connection as a link any more.
    Unneeded,
    /// The connection was refused (peer table mismatch, unknown peer).
    Refused,
    /// A reason this version does not know.
    Other(u8),
}

impl ByeReason {
    pub fn code(self) -> u8 {
        match self {
            ByeReason::Shutdown => 0,
            ByeReason::Duplicate => 1,
            ByeReason::Unneeded => 2,
            ByeReason::Refused => 3,
            ByeReason::Other(c) => c,
        }
    }

    pub fn from_code(c: u8) -> Self {
        match c {
            0 => ByeReason::Shutdown,
            1 => ByeReason::Duplicate,
            2 => ByeReason::Unneeded,
            3 => ByeReason::Refused,
            c => ByeReason::Other(c),
        }
    }
}

/// Every message, with its type byte.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Msg {
    Hello(Hello),
    HelloAck(HelloAck),
    HelloFinish(HelloFinish),
    KeepAlive(KeepAlive),
    PeerNews(PeerNews),
    StatusRequest(StatusRequest),
    StatusReply(StatusReply),
    Bye(ByeReason),
    MetricsRequest(MetricsRequest),
    MetricsReply(MetricsReply),
}

impl Msg {
    pub fn type_byte(&self) -> u8 {
        match self {
            Msg::Hello(_) => 1,
            Msg::HelloAck(_) => 2,
            Msg::HelloFinish(_) => 3,
            Msg::KeepAlive(_) => 4,
            Msg::PeerNews(_) => 5,
            Msg::StatusRequest(_) => 6,
            Msg::StatusReply(_) => 7,
            Msg::Bye(_) => 8,
            Msg::MetricsRequest(_) => 9,
            Msg::MetricsReply(_) => 10,
        }
    }

    pub fn name(&self) -> &'static str {
        match self {
            Msg::Hello(_) => "HELLO",
            Msg::HelloAck(_) => "HELLO_ACK",
            Msg::HelloFinish(_) => "HELLO_FINISH",
            Msg::KeepAlive(_) => "KEEPALIVE",
            Msg::PeerNews(_) => "PEER_NEWS",
            Msg::StatusRequest(_) => "STATUS_REQUEST",
            Msg::StatusReply(_) => "STATUS_REPLY",
            Msg::Bye(_) => "BYE",
            Msg::MetricsRequest(_) => "METRICS_REQUEST",
            Msg::MetricsReply(_) => "METRICS_REPLY",
        }
    }
}

/// Why bytes could not be decoded (or a message could not be encoded within the bounds).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum WireError {
    #[error("frame of {len} bytes exceeds the limit of {max}")]
    FrameTooLarge { len: usize, max: usize },
    #[error("frame of {len} bytes is too short for a version and a type")]
    FrameTooShort { len: usize },
    #[error("wire version {0} is not supported (this side speaks {VERSION})")]
    Version(u8),
    #[error("unknown message type {0}")]
    UnknownType(u8),
    #[error("message ends early while reading {0}")]
    Truncated(&'static str),
    #[error("{0} bytes left over after the message body")]
    TrailingBytes(usize),
    #[error("{what}: {len} exceeds the limit of {max}")]
    TooLong { what: &'static str, len: usize, max: usize },
    #[error("invalid {0}")]
    Invalid(&'static str),
    #[error("the decoder holds {held} bytes and was given {more} more (limit {max}); drain it with next() first")]
    BufferFull { held: usize, more: usize, max: usize },
}

/// The body of a cargo-fuzz target (`fuzz_target!(|data: &[u8]| occl_ras::fuzz_wire_bytes(data))`): feeds `data` to
/// a decoder in chunks of pseudo-random sizes (seeded by the length, so the bytes themselves stay intact), and checks that every message it yields encodes within the
/// bounds and decodes back to itself, and that the decoder stays within its buffer bound and fails for good once it
/// has failed.
#[cfg(any(test, feature = "test-support"))]
pub fn fuzz_wire_bytes(data: &[u8]) {
    let mut dec = Decoder::new();
    let mut rest = data;
    let mut failed: Option<WireError> = None;
    let mut lcg = data.len() as u64 | 1;
    while !rest.is_empty() {
        lcg = lcg.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let n = ((lcg >> 33) as usize % 4096 + 1).min(rest.len());
        let (chunk, tail) = rest.split_at(n);
        rest = tail;
        if dec.push(chunk).is_err() {
            return;
        }
        assert!(dec.buffered() <= decoder::max_buffered(MAX_FRAME));
        loop {
            match dec.next() {
                Ok(Some(msg)) => {
                    assert!(failed.is_none(), "a message after an error");
                    let mut buf = Vec::new();
                    encode(&msg, &mut buf).expect("a decoded message re-encodes");
                    assert_eq!(buf.len(), encoded_len(&msg).expect("length of a decoded message"));
                    let mut again = Decoder::new();
                    again.push(&buf).expect("one frame fits");
                    assert_eq!(again.next(), Ok(Some(msg)), "re-encoded message decodes to itself");
                    assert_eq!(again.next(), Ok(None));
                }
                Ok(None) => break,
                Err(e) => {
                    if let Some(f) = &failed {
                        assert_eq!(f, &e, "a failed decoder repeats its error");
                    }
                    failed = Some(e);
                    break;
                }
            }
        }
    }
}
