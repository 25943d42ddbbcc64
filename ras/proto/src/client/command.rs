//! Parsing one `ncclras` command line into a [`Command`], and the typed errors whose `Display` is the exact text NCCL
//! sends after `ERROR: `.
//!
//! Keywords match case-insensitively and may be separated by any run of ASCII whitespace (NCCL matches
//! case-insensitively; reference §1.1). The argument of `TIMEOUT`, `SET FORMAT` and `MONITOR` is the rest of the line
//! with surrounding whitespace trimmed, and that trimmed text is what an error reply quotes.

use thiserror::Error;

/// Output format of a status report or monitor stream (`SET FORMAT text|json`, NCCL ≥ 2.28.7).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Format {
    /// NCCL's human-readable layout (the default).
    #[default]
    Text,
    /// A single JSON document; always the verbose form.
    Json,
}

/// The per-leg timeout of the data-gathering collective, as set by `TIMEOUT <secs>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Timeout {
    /// No `TIMEOUT` command: 5 s × `NCCL_RAS_TIMEOUT_FACTOR`, which only the I/O layer knows.
    #[default]
    Default,
    /// `TIMEOUT 0`: wait without limit.
    Disabled,
    /// `TIMEOUT n` with n > 0: absolute seconds, not scaled by the timeout factor.
    Seconds(u64),
}

/// Event groups a `MONITOR` client subscribes to (NCCL ≥ 2.29).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EventGroups {
    /// `PEER_NEW`, `PEER_DEAD`.
    pub lifecycle: bool,
    /// Connection-level events: `PEER_CONNECTING`, `PEER_UNRESPONSIVE`, …
    pub trace: bool,
}

impl EventGroups {
    /// What a bare `MONITOR` subscribes to.
    pub const DEFAULT: Self = Self { lifecycle: true, trace: false };
    /// `MONITOR all`.
    pub const ALL: Self = Self { lifecycle: true, trace: true };
}

/// One parsed client command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// `CLIENT PROTOCOL <n>`. The server ignores `<n>` (observed: 1 and 2 both get `SERVER PROTOCOL 2`), so an
    /// absent or non-numeric `<n>` is accepted too and recorded as `None`.
    ClientProtocol(Option<u32>),
    /// `TIMEOUT <secs>`.
    Timeout(Timeout),
    /// `SET FORMAT text|json`.
    SetFormat(Format),
    /// `STATUS` (`verbose: false`) or `VERBOSE STATUS`.
    Status { verbose: bool },
    /// `MONITOR [groups]`.
    Monitor(EventGroups),
    /// occl's `JOB <name>`: the job of the node whose report or events this connection wants, when several jobs
    /// share the node's port (`ncclras --job`).
    Job(String),
}

/// The longest job name `JOB` takes.
pub const MAX_JOB_NAME: usize = 128;

/// Why a line got an `ERROR: ...` reply. `Display` is the text after `ERROR: `; the variants carry the failing input.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ClientError {
    /// Reference §1.2: `ERROR: Unknown command <line as sent>` (only a trailing CR removed).
    #[error("Unknown command {0}")]
    UnknownCommand(String),
    /// Reference §1.2: `ERROR: Invalid timeout value <arg>`; the value must be a non-negative decimal integer.
    #[error("Invalid timeout value {0}")]
    InvalidTimeout(String),
    /// Not in the reference (occl's wording): `TIMEOUT` with no argument.
    #[error("Missing timeout value")]
    MissingTimeout,
    /// Reference §1.2: `ERROR: Invalid format <arg>`.
    #[error("Invalid format {0}")]
    InvalidFormat(String),
    /// Not in the reference (occl's wording): `SET FORMAT` with no argument.
    #[error("Missing format")]
    MissingFormat,
    /// Not in the reference (occl's wording): `JOB` without a name, or one that is not printable ASCII without
    /// spaces, or longer than [`MAX_JOB_NAME`].
    #[error("Invalid job name '{0}'")]
    InvalidJob(String),
    /// Reference §1.2: `ERROR: Invalid event group '<tok>'`. An empty item (`MONITOR trace,,all`) is quoted as `''`.
    #[error("Invalid event group '{0}'")]
    InvalidEventGroup(String),
    /// Not in the reference (occl's wording). NCCL silently drops a client whose 1024-byte buffer fills without a
    /// newline; occl says why before closing.
    #[error("Command line too long (more than {} bytes)", super::MAX_LINE_BYTES - 1)]
    LineTooLong,
    /// Not in the reference (occl's wording): the client pipelined more replies than the session will hold unread.
    #[error("Too many unanswered commands")]
    TooManyPending,
    /// Not in the reference (occl's wording): the `n`th bad line, past [`super::MAX_BAD_LINES`].
    #[error("{0} invalid commands; closing the connection (send CLIENT PROTOCOL 2, then STATUS)")]
    TooManyBadLines(u32),
}

impl ClientError {
    /// The full reply line, `ERROR: <message>\n`.
    pub fn reply(&self) -> String {
        format!("ERROR: {self}\n")
    }
}

/// Parses one line (CR already removed). `Ok(None)` for a blank line, which NCCL's reference does not cover: occl
/// ignores it silently so a telnet user's stray Enter costs nothing.
pub fn parse(line: &str) -> Result<Option<Command>, ClientError> {
    let t = line.trim_matches(|c: char| c.is_ascii_whitespace());
    if t.is_empty() {
        return Ok(None);
    }
    let unknown = || ClientError::UnknownCommand(line.to_owned());
    if let Some(rest) = keyword(t, "CLIENT").and_then(|r| keyword(r, "PROTOCOL")) {
        return Ok(Some(Command::ClientProtocol(rest.parse().ok())));
    }
    if let Some(arg) = keyword(t, "TIMEOUT") {
        return parse_timeout(arg).map(|v| Some(Command::Timeout(v)));
    }
    if let Some(arg) = keyword(t, "SET").and_then(|r| keyword(r, "FORMAT")) {
        return parse_format(arg).map(|f| Some(Command::SetFormat(f)));
    }
    if let Some(rest) = keyword(t, "STATUS") {
        return if rest.is_empty() { Ok(Some(Command::Status { verbose: false })) } else { Err(unknown()) };
    }
    if let Some(rest) = keyword(t, "VERBOSE").and_then(|r| keyword(r, "STATUS")) {
        return if rest.is_empty() { Ok(Some(Command::Status { verbose: true })) } else { Err(unknown()) };
    }
    if let Some(arg) = keyword(t, "MONITOR") {
        return parse_groups(arg).map(|g| Some(Command::Monitor(g)));
    }
    if let Some(arg) = keyword(t, "JOB") {
        return parse_job(arg).map(|j| Some(Command::Job(j)));
    }
    Err(unknown())
}

/// If `s` starts with `kw` (any case) followed by whitespace or the end, returns what follows, left-trimmed.
fn keyword<'a>(s: &'a str, kw: &str) -> Option<&'a str> {
    let head = s.get(..kw.len())?;
    if !head.eq_ignore_ascii_case(kw) {
        return None;
    }
    let rest = &s[kw.len()..];
    match rest.chars().next() {
        None => Some(rest),
        Some(c) if c.is_ascii_whitespace() => Some(rest.trim_start_matches(|c: char| c.is_ascii_whitespace())),
        Some(_) => None,
    }
}

fn parse_timeout(arg: &str) -> Result<Timeout, ClientError> {
    if arg.is_empty() {
        return Err(ClientError::MissingTimeout);
    }
    // Digits only: no sign, no inner spaces; `u64::from_str` alone would accept a leading '+'.
    let secs = match arg.bytes().all(|b| b.is_ascii_digit()) {
        true => arg.parse::<u64>().ok(),
        false => None,
    };
    match secs {
        Some(0) => Ok(Timeout::Disabled),
        Some(n) => Ok(Timeout::Seconds(n)),
        None => Err(ClientError::InvalidTimeout(arg.to_owned())),
    }
}

/// A job name: 1 to [`MAX_JOB_NAME`] printable ASCII characters, no spaces (launchers' job ids are).
pub fn parse_job(arg: &str) -> Result<String, ClientError> {
    if !arg.is_empty() && arg.len() <= MAX_JOB_NAME && arg.bytes().all(|b| b.is_ascii_graphic()) {
        Ok(arg.to_owned())
    } else {
        Err(ClientError::InvalidJob(arg.chars().take(MAX_JOB_NAME).collect()))
    }
}

fn parse_format(arg: &str) -> Result<Format, ClientError> {
    if arg.is_empty() {
        Err(ClientError::MissingFormat)
    } else if arg.eq_ignore_ascii_case("text") {
        Ok(Format::Text)
    } else if arg.eq_ignore_ascii_case("json") {
        Ok(Format::Json)
    } else {
        Err(ClientError::InvalidFormat(arg.to_owned()))
    }
}

fn parse_groups(arg: &str) -> Result<EventGroups, ClientError> {
    if arg.is_empty() {
        return Ok(EventGroups::DEFAULT);
    }
    let mut groups = EventGroups { lifecycle: false, trace: false };
    for tok in arg.split(',').map(|t| t.trim_matches(|c: char| c.is_ascii_whitespace())) {
        if tok.eq_ignore_ascii_case("lifecycle") {
            groups.lifecycle = true;
        } else if tok.eq_ignore_ascii_case("trace") {
            groups.trace = true;
        } else if tok.eq_ignore_ascii_case("all") {
            groups = EventGroups::ALL;
        } else {
            return Err(ClientError::InvalidEventGroup(tok.to_owned()));
        }
    }
    Ok(groups)
}
