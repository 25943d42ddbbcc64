//! Typed errors, named after NCCL's result codes so that users who know `ncclResult_t` know what
//! each one means. Every error carries the context that caused it (the argument, the peer rank,
//! the operation), so the message alone tells the user what to fix.

use std::fmt;
use std::io;

/// The class of an error, one per NCCL result code (`ncclSuccess` excluded).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// `ncclInvalidArgument`: a bad value passed to a call (length, root, datatype, alignment).
    InvalidArgument,
    /// `ncclInvalidUsage`: a valid call used the wrong way (ranks disagree on the operation,
    /// a communicator used after an error, a forced choice that is not supported).
    InvalidUsage,
    /// `ncclSystemError`: the operating system refused something (socket, mmap, shm).
    SystemError,
    /// `ncclInternalError`: a bug in occl or a corrupted peer; the message says what.
    InternalError,
    /// `ncclRemoteError`: a peer process died, closed its connection or reported a failure.
    RemoteError,
    /// A bounded wait expired (`OCCL_TIMEOUT`); NCCL reports these as `ncclSystemError` with a
    /// timeout message, occl keeps them apart so callers can retry or abort deliberately.
    Timeout,
}

impl ErrorKind {
    /// The kind's name as a metric label (`occl_operation_errors_total{kind}`): NCCL's result
    /// code without `nccl`, and `Timeout`.
    pub const fn name(self) -> &'static str {
        match self {
            ErrorKind::InvalidArgument => "InvalidArgument",
            ErrorKind::InvalidUsage => "InvalidUsage",
            ErrorKind::SystemError => "SystemError",
            ErrorKind::InternalError => "InternalError",
            ErrorKind::RemoteError => "RemoteError",
            ErrorKind::Timeout => "Timeout",
        }
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ErrorKind::InvalidArgument => "invalid argument",
            ErrorKind::InvalidUsage => "invalid usage",
            ErrorKind::SystemError => "system error",
            ErrorKind::InternalError => "internal error",
            ErrorKind::RemoteError => "remote error",
            ErrorKind::Timeout => "timeout",
        })
    }
}

/// An occl error: its kind and a message with the context.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    #[error("invalid usage: {0}")]
    InvalidUsage(String),
    #[error("system error: {context}: {source}")]
    SystemError {
        context: String,
        #[source]
        source: io::Error,
    },
    #[error("internal error: {0}")]
    InternalError(String),
    #[error("remote error: peer rank {peer}: {what}")]
    RemoteError { peer: usize, what: String },
    #[error("timeout: {what} did not complete within {secs:.1} s (OCCL_TIMEOUT)")]
    Timeout { what: String, secs: f64 },
}

impl Error {
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::InvalidArgument(_) => ErrorKind::InvalidArgument,
            Error::InvalidUsage(_) => ErrorKind::InvalidUsage,
            Error::SystemError { .. } => ErrorKind::SystemError,
            Error::InternalError(_) => ErrorKind::InternalError,
            Error::RemoteError { .. } => ErrorKind::RemoteError,
            Error::Timeout { .. } => ErrorKind::Timeout,
        }
    }

    pub(crate) fn sys(context: impl Into<String>, source: io::Error) -> Error {
        Error::SystemError { context: context.into(), source }
    }

    pub(crate) fn last_os(context: impl Into<String>) -> Error {
        Error::sys(context, io::Error::last_os_error())
    }

    pub(crate) fn arg(msg: impl Into<String>) -> Error {
        Error::InvalidArgument(msg.into())
    }

    pub(crate) fn usage(msg: impl Into<String>) -> Error {
        Error::InvalidUsage(msg.into())
    }

    pub(crate) fn internal(msg: impl Into<String>) -> Error {
        Error::InternalError(msg.into())
    }

    pub(crate) fn remote(peer: usize, what: impl Into<String>) -> Error {
        Error::RemoteError { peer, what: what.into() }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// A copy of this error for the sticky per-communicator error (an `io::Error` cannot be
    /// cloned, so a system error keeps its message and OS error kind).
    pub(crate) fn duplicate(&self) -> Error {
        match self {
            Error::InvalidArgument(m) => Error::InvalidArgument(m.clone()),
            Error::InvalidUsage(m) => Error::InvalidUsage(m.clone()),
            Error::SystemError { context, source } => Error::SystemError {
                context: context.clone(),
                source: io::Error::new(source.kind(), source.to_string()),
            },
            Error::InternalError(m) => Error::InternalError(m.clone()),
            Error::RemoteError { peer, what } => Error::RemoteError { peer: *peer, what: what.clone() },
            Error::Timeout { what, secs } => Error::Timeout { what: what.clone(), secs: *secs },
        }
    }
}
