//! ibverbs for occl's `ib` transport, with no build-time dependency on rdma-core: the verbs
//! library is opened at run time (`verbs`, declared in `sys`), so this crate builds and tests
//! everywhere and only a device needs `libibverbs.so.1`.
//!
//! A leaf crate: it never depends on `occl`.

mod error;
pub mod sys;
pub mod verbs;

pub use error::{Error, Result};
