//! occl: an Observable Collective Communication Library.
//!
//! A communicator (`Comm`) joins `nranks` ranks — processes on one or several hosts, or threads of
//! one process — and runs NCCL's collectives on host memory: all-reduce, broadcast, reduce,
//! all-gather, reduce-scatter, all-to-all, and point-to-point send/recv. Ranks on one host talk
//! through shared-memory FIFOs; ranks on different hosts through TCP sockets that the calling
//! thread drives while it waits.
//!
//! ```no_run
//! # fn main() -> occl::Result<()> {
//! let comm = occl::Comm::from_env()?;            // OCCL_*, torchrun, Open MPI or Slurm variables
//! let send = vec![comm.rank() as f32; 1024];
//! let mut recv = vec![0f32; 1024];
//! comm.all_reduce(&send, &mut recv, occl::RedOp::Sum)?;
//! comm.destroy()?;
//! # Ok(()) }
//! ```
#![deny(unsafe_op_in_unsafe_fn)]

mod auth;
mod bootstrap;
mod coll;
mod comm;
mod config;
mod copy;
pub mod dtype;
mod env;
mod error;
mod id;
mod profile;
mod record;
mod reduce;
mod transport;

pub use comm::Comm;
pub use config::{Config, TransportKind};
pub use dtype::{DataType, Element, RedOp};
pub use error::{Error, ErrorKind, Result};
pub use id::UniqueId;
pub use record::{CollType, OpRecord};
