//! occl's vocabulary: what an operation is ([`CollType`]), what it moves ([`DataType`]) and how
//! it combines ([`RedOp`]), numbered and named as NCCL numbers and names them, so a value
//! crosses crate boundaries, the wire and the C ABI unchanged.
//!
//! Only the names, numbers and sizes live here; the arithmetic on elements is the core's. The NCCL
//! release occl speaks as ([`NCCL_VERSION`]) lives here too: every crate that names it is above this one.

mod coll;
mod dtype;
mod redop;
mod version;

pub use coll::CollType;
pub use dtype::DataType;
pub use redop::RedOp;
pub use version::{NCCL_VERSION, NCCL_VERSION_CODE, RAS_CLIENT_PROTOCOL};
