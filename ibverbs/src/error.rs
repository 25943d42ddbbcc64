//! The crate's typed errors. Each carries the input or the call that failed, so that `occl` can
//! wrap it into its own error kinds without losing the reason.

/// Why something in this crate failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// `dlopen("libibverbs.so.1")` failed: rdma-core is not installed.
    #[error("libibverbs.so.1 not found: install rdma-core (Debian: ibverbs-providers libibverbs1) ({detail})")]
    LibraryMissing { detail: String },
    /// The library loaded but lacks a function this crate needs (a libibverbs older than 1.1).
    #[error("libibverbs.so.1 has no symbol {name}: rdma-core is too old (need the IBVERBS_1.1 ABI)")]
    SymbolMissing { name: &'static str },
    /// A verbs call failed; `errno` is what it returned or left in errno.
    #[error("{call} failed: {}", std::io::Error::from_raw_os_error(*errno))]
    Verbs { call: &'static str, errno: i32 },
    /// No device port can be used; the text says why (no device, all filtered, none active).
    #[error("no usable RDMA device: {0}")]
    NoDevice(String),
    /// A malformed `OCCL_IB_HCA` / `NCCL_IB_HCA` value.
    #[error("malformed HCA list {value:?}: {why}")]
    HcaSyntax { value: String, why: String },
    /// Bytes from a peer that do not decode as a connection record.
    #[error("malformed ib connection record: {0}")]
    Record(String),
    /// The QP connection state machine was driven out of order.
    #[error("ib connection: {0}")]
    Conn(String),
    /// The flow-control protocol saw a message that a correct peer never sends.
    #[error("ib flow control: {0}")]
    Credit(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
