//! occl: an Observable Collective Communication Library.
//!
//! A communicator (`Comm`) joins `nranks` ranks — processes on one or several hosts, or threads of
//! one process — and runs NCCL's collectives on host memory: all-reduce, broadcast, reduce,
//! all-gather, reduce-scatter, all-to-all, and point-to-point send/recv. Ranks on one host talk
//! through shared-memory FIFOs; ranks on different hosts through TCP sockets that the calling
//! thread drives while it waits.
//!
//! Calls between [`group_start`] and [`group_end`] (or inside [`group`]) run together as one
//! launch, so any pattern of sends and receives completes; `all_to_allv`, `gather` and
//! `scatter` are built that way. A communicator can be split ([`Comm::split`]), aborted from any
//! thread ([`Comm::abort`]), shrunk to exclude failed ranks ([`Comm::shrink`]), and created
//! without blocking ([`Comm::init_rank_nonblocking`]).
//!
//! Every operation emits NCCL's profiler events (GroupApi → CollApi → Coll → ProxyOp → ProxyStep,
//! ProxyCtrl, NetPlugin for tcp) to the sinks that want them: those of the profilers a
//! communicator was handed ([`Config::profilers`]) or, by default, of the process's (registered
//! with [`telemetry::profiler::register`], an NCCL profiler plugin named by
//! `OCCL_PROFILER_PLUGIN` / `NCCL_PROFILER_PLUGIN`, the exporters the environment enables), and
//! sinks attached with [`Comm::attach_sink`]. With none, an operation pays one relaxed load and a
//! branch.
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

mod api;
mod auth;
mod bootstrap;
mod coll;
mod comm;
mod config;
mod copy;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod dtype;
mod env;
mod error;
mod exec;
mod hostmem;
mod id;
mod init_timer;
mod launch;
mod lifecycle;
pub mod log;
mod netif;
mod op;
mod profile;
mod ras;
mod record;
mod reduce;
mod register;
mod sync;
pub mod topo;
mod transport;
mod wait;

/// The profiler event model, sinks and registry (`occl-telemetry`), re-exported so applications
/// register profilers and attach sinks without naming a second crate.
pub use occl_telemetry as telemetry;

/// A collector of occl's metrics for an application's own `prometheus-client` registry
/// (`registry.register_collector(Box::new(occl::metrics_collector()))`), feature
/// `prometheus-client`; call it before the first communicator is created.
#[cfg(feature = "prometheus-client")]
pub use occl_telemetry::exporters::collector as metrics_collector;
/// Marks training step `n` in the HTA trace files (`OCCL_TRACE_DIR`) until the guard drops:
/// `let _step = occl::profiler_step(n);` (PyTorch's `ProfilerStep#N`). `step_begin`/`step_end`
/// are in [`telemetry::trace`].
#[cfg(feature = "exporters")]
pub use occl_telemetry::trace::{profiler_step, ProfilerStep};

pub use api::{group, Group};
pub use comm::Comm;
pub use config::{Config, Profilers, TransportKind};
pub use dtype::{DataType, Element, RedOp};
pub use error::{Error, ErrorKind, Result};
pub use hostmem::HostBuf;
pub use id::UniqueId;
pub use launch::{group_depth, group_end, group_simulate_end, group_start};
pub use lifecycle::{InitState, PendingComm, ShrinkMode, OCCL_SPLIT_NOCOLOR};
pub use record::{CollType, InFlight, OpRecord};
pub use register::Handle;

/// The tuner's calibration, for the `occl-tune` tool (not a stable API).
#[doc(hidden)]
pub mod tuning {
    pub use crate::coll::tune::fit::{Calibration, Measured};
    pub use crate::coll::tune::{calibrate, check_file};
}
