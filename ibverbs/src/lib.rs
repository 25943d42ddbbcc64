//! ibverbs for occl's `ib` transport, with no build-time dependency on rdma-core: the verbs
//! library is opened at run time (`verbs`, declared in `sys`), so this crate builds and tests
//! everywhere and only a device needs `libibverbs.so.1`.
//!
//! The transport's protocol parts are pure state machines with no I/O, in the quinn style, each
//! tested without a device:
//! - `hca`: the `OCCL_IB_HCA` / `NCCL_IB_HCA` device list;
//! - `device`: discovery (needs the library) and the choice of ports and GIDs (pure);
//! - `conn`: the connection record exchanged through the bootstrap and the QP's
//!   RESET→INIT→RTR→RTS steps;
//! - `credit`: flow control for RDMA write-with-immediate into N slots;
//! - `mr_cache`: the memory-registration cache;
//! - `completion`: what a polled work completion means, and both flow-control halves of a QP.
//!
//! `resources` wraps the verbs objects (PD, MR, CQ, RC QP) for the data path.
//!
//! Every decoder of bytes or immediates from a peer has a fuzz entry (`conn::fuzz_conn_record`,
//! `completion::fuzz_completions`), run by the cargo-fuzz crate in `ibverbs/fuzz/` (feature
//! `test-support`; not in the library otherwise).
//!
//! A leaf crate: it never depends on `occl`.

pub mod completion;
pub mod conn;
pub mod credit;
pub mod device;
mod error;
pub mod hca;
pub mod mr_cache;
pub mod resources;
pub mod sys;
pub mod verbs;

pub use error::{Error, Result};
