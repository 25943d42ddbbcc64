//! The `ncclras` client-port protocol as an I/O-free state machine (line in, action out), in the style of
//! quinn-proto: the tokio layer feeds whatever bytes a socket read returned to [`ClientSession::handle_bytes`], then
//! drains [`ClientSession::poll_action`] until `None` and carries each [`Action`] out.
//!
//! Protocol (reference `nccl-ras.md` §1.1–1.2): ASCII lines ending in LF, a CR before the LF dropped, keywords in any
//! case. The `CLIENT PROTOCOL` handshake is optional — a bare `STATUS` gets the report — and any client version is
//! answered with `SERVER PROTOCOL 2`. `STATUS` / `VERBOSE STATUS` end the command phase: the report follows and the
//! connection closes. `MONITOR` ends it too: `OK`, then an event stream until either side closes. Errors leave the
//! connection open, except an over-long line and a bad line after [`MAX_BAD_LINES`] of them. occl adds `JOB <name>`
//! (answered `OK`): which of the jobs sharing the node's port the `STATUS` or `MONITOR` that follows is about.
//!
//! Memory is bounded: at most [`MAX_LINE_BYTES`] of a partial line, at most about [`MAX_PENDING_REPLY_BYTES`] of
//! replies not yet polled, and nothing at all once the command phase is over (later input is discarded).

mod command;
#[cfg(test)]
mod tests;

use std::collections::VecDeque;

pub use command::{parse, parse_job, ClientError, Command, EventGroups, Format, Timeout, MAX_JOB_NAME};

/// The client protocol version this server speaks; NCCL has sent 2 since RAS appeared in 2.24.
pub const SERVER_PROTOCOL_VERSION: u32 = occl_types::RAS_CLIENT_PROTOCOL;

/// NCCL's per-client receive buffer: a line, LF included, must fit in 1024 bytes, so its text (CR included) is at
/// most 1023 bytes. A buffer that fills with no LF ends the session.
pub const MAX_LINE_BYTES: usize = 1024;

/// Replies the session holds before the driver polls them. `ncclras` sends at most four commands before `STATUS`;
/// a client that pipelines far more than this without reading is cut off rather than buffered without bound.
pub const MAX_PENDING_REPLY_BYTES: usize = 64 * 1024;

/// Bad lines answered with an error; the next one gets a final error and the connection closes. `ncclras` sends at
/// most four commands, all valid, and NCCL's own transcripts hold three errors at most, so more is a scanner, a
/// misdirected client or a flood: answering each line would send back about twice what it sends.
pub const MAX_BAD_LINES: u32 = 3;

/// What the I/O layer must do next for this client, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Write this text as is (it ends with `\n`).
    Reply(String),
    /// Gather the job-wide status, write the report in `format`, then close the connection (EOF ends the report).
    Status { verbose: bool, format: Format, timeout: Timeout },
    /// Stream events of `groups` in `format` until either side closes. `OK` has already been queued before this.
    Monitor { groups: EventGroups, format: Format },
    /// Close the connection after writing every earlier reply.
    Close,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Reading commands.
    Commands,
    /// `STATUS` or `MONITOR` was accepted: input is no longer interpreted.
    Streaming,
    /// `Close` has been queued.
    Closed,
}

/// One client connection's protocol state.
///
/// Methods by kind, as in quinn-proto: getters (`handshake_done`, `format`, …), the input `handle_bytes`, and the
/// output `poll_action`.
#[derive(Debug)]
pub struct ClientSession {
    opened_ms: u64,
    phase: Phase,
    line: Vec<u8>,
    actions: VecDeque<Action>,
    pending_reply_bytes: usize,
    /// Lines answered with an error so far.
    bad_lines: u32,
    /// Non-blank lines handled so far, bad ones included.
    lines: u64,
    handshake_done: bool,
    client_version: Option<u32>,
    format: Format,
    timeout: Timeout,
    job: Option<String>,
}

impl ClientSession {
    /// A session for a connection accepted at `now_ms` (any monotonic millisecond clock the driver uses).
    pub fn new(now_ms: u64) -> Self {
        Self {
            opened_ms: now_ms,
            phase: Phase::Commands,
            line: Vec::new(),
            actions: VecDeque::new(),
            pending_reply_bytes: 0,
            bad_lines: 0,
            lines: 0,
            handshake_done: false,
            client_version: None,
            format: Format::default(),
            timeout: Timeout::default(),
            job: None,
        }
    }

    /// When the connection was accepted, as given to [`ClientSession::new`].
    pub fn opened_ms(&self) -> u64 {
        self.opened_ms
    }

    /// Whether a `CLIENT PROTOCOL` line has been seen (it is optional).
    pub fn handshake_done(&self) -> bool {
        self.handshake_done
    }

    /// The version the client announced, when it was a number; kept only for logging, since it changes nothing.
    pub fn client_version(&self) -> Option<u32> {
        self.client_version
    }

    /// The format set by `SET FORMAT` (text by default).
    pub fn format(&self) -> Format {
        self.format
    }

    /// The job set by `JOB` (none: the node's jobs, all of them where the answer can hold them).
    pub fn job(&self) -> Option<&str> {
        self.job.as_deref()
    }

    /// The gather timeout set by `TIMEOUT`.
    pub fn timeout(&self) -> Timeout {
        self.timeout
    }

    /// Non-blank command lines handled so far (bad ones included): the driver's measure of progress, since a client
    /// that trickles bytes or blank lines never completes one.
    pub fn lines_handled(&self) -> u64 {
        self.lines
    }

    /// Whether `Close` has been queued; the driver may stop reading.
    pub fn is_closed(&self) -> bool {
        self.phase == Phase::Closed
    }

    /// Bytes held by the session: the partial line plus unpolled replies. Never above
    /// `MAX_LINE_BYTES + MAX_PENDING_REPLY_BYTES` plus one short error line.
    pub fn buffered_len(&self) -> usize {
        self.line.len() + self.pending_reply_bytes
    }

    /// Feeds bytes read from the socket, in any split: a command may span calls and one call may hold many.
    pub fn handle_bytes(&mut self, bytes: &[u8]) {
        let mut rest = bytes;
        while self.phase == Phase::Commands && !rest.is_empty() {
            let Some(lf) = rest.iter().position(|&b| b == b'\n') else {
                if self.line.len() + rest.len() >= MAX_LINE_BYTES {
                    self.fail(ClientError::LineTooLong);
                } else {
                    self.line.extend_from_slice(rest);
                }
                return;
            };
            if self.line.len() + lf + 1 > MAX_LINE_BYTES {
                self.fail(ClientError::LineTooLong);
                return;
            }
            self.line.extend_from_slice(&rest[..lf]);
            rest = &rest[lf + 1..];
            let mut line = std::mem::take(&mut self.line);
            self.handle_line(&line);
            line.clear();
            self.line = line; // reuse the allocation; fail() may have freed it, and then it stays empty
        }
    }

    /// The next thing to do, in order; `None` once everything queued so far has been taken.
    pub fn poll_action(&mut self) -> Option<Action> {
        let action = self.actions.pop_front()?;
        if let Action::Reply(text) = &action {
            self.pending_reply_bytes -= text.len();
        }
        Some(action)
    }

    fn handle_line(&mut self, raw: &[u8]) {
        let raw = raw.strip_suffix(b"\r").unwrap_or(raw);
        // Invalid UTF-8 can never match a keyword; the lossy text is only echoed back in an error reply.
        let line = String::from_utf8_lossy(raw);
        let parsed = parse(&line);
        if !matches!(parsed, Ok(None)) {
            self.lines += 1;
        }
        match parsed {
            Ok(None) => {}
            Ok(Some(Command::ClientProtocol(version))) => {
                self.handshake_done = true;
                self.client_version = version;
                self.reply(format!("SERVER PROTOCOL {SERVER_PROTOCOL_VERSION}\n"));
            }
            Ok(Some(Command::Timeout(timeout))) => {
                self.timeout = timeout;
                self.reply("OK\n".to_owned());
            }
            Ok(Some(Command::SetFormat(format))) => {
                self.format = format;
                self.reply("OK\n".to_owned());
            }
            Ok(Some(Command::Job(job))) => {
                self.job = Some(job);
                self.reply("OK\n".to_owned());
            }
            Ok(Some(Command::Status { verbose })) => {
                self.phase = Phase::Streaming;
                self.actions.push_back(Action::Status { verbose, format: self.format, timeout: self.timeout });
            }
            Ok(Some(Command::Monitor(groups))) => {
                self.reply("OK\n".to_owned());
                if self.phase == Phase::Commands {
                    self.phase = Phase::Streaming;
                    self.actions.push_back(Action::Monitor { groups, format: self.format });
                }
            }
            Err(_) if self.bad_lines >= MAX_BAD_LINES => self.fail(ClientError::TooManyBadLines(self.bad_lines + 1)),
            Err(e) => {
                self.bad_lines += 1;
                self.reply(e.reply());
            }
        }
    }

    fn reply(&mut self, text: String) {
        if self.pending_reply_bytes + text.len() > MAX_PENDING_REPLY_BYTES {
            self.fail(ClientError::TooManyPending);
            return;
        }
        self.pending_reply_bytes += text.len();
        self.actions.push_back(Action::Reply(text));
    }

    /// Queues the error reply and `Close`, and drops all input state.
    fn fail(&mut self, err: ClientError) {
        let text = err.reply();
        self.pending_reply_bytes += text.len();
        self.actions.push_back(Action::Reply(text));
        self.actions.push_back(Action::Close);
        self.line = Vec::new();
        self.phase = Phase::Closed;
    }
}

/// The body of a cargo-fuzz target (`fuzz_target!(|data: &[u8]| occl_ras::fuzz_client_bytes(data))`): feeds `data`
/// to a fresh session in chunks whose sizes come from the data itself, drains the actions after each chunk, and
/// panics if the session ever holds more than its documented bound or acts after `Close`.
#[cfg(any(test, feature = "test-support"))]
pub fn fuzz_client_bytes(data: &[u8]) {
    let bound = MAX_LINE_BYTES + MAX_PENDING_REPLY_BYTES + 128;
    let mut session = ClientSession::new(0);
    let mut rest = data;
    let mut closed = false;
    while !rest.is_empty() {
        let n = (usize::from(rest[0]) % 64 + 1).min(rest.len());
        let (chunk, tail) = rest.split_at(n);
        rest = tail;
        session.handle_bytes(chunk);
        assert!(session.buffered_len() <= bound, "session buffers {} bytes", session.buffered_len());
        while let Some(action) = session.poll_action() {
            assert!(!closed, "action {action:?} after Close");
            closed |= action == Action::Close;
        }
        assert_eq!(session.buffered_len(), session.line.len());
    }
}
