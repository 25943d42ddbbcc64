//! occl's vocabulary: what an operation is ([`CollType`]), what it moves ([`DataType`]) and how
//! it combines ([`RedOp`]), numbered and named as NCCL numbers and names them, so a value
//! crosses crate boundaries, the wire and the C ABI unchanged.
//!
//! Only the names, numbers and sizes live here; the arithmetic on elements is the core's.

mod coll;
mod dtype;
mod redop;

pub use coll::CollType;
pub use dtype::DataType;
pub use redop::RedOp;
