//! occl-kernels: occl's CUDA kernels — elementwise reductions for every element type and
//! operator, a fused reduce-and-copy for ring steps, and copies — written in CUDA C
//! (`kernels/cuda/`), compiled with NVRTC at first use for the device's architecture, cached on
//! disk, and launched through cudarc on the caller's stream.
//!
//! CUDA is loaded at run time (cudarc's dynamic loading): the crate builds and its CPU tests run
//! on machines without a driver, and every entry point says so with [`Error::NoDriver`] /
//! [`Error::NoNvrtc`] instead of failing to link. This crate is a leaf: it never depends on `occl`.
//!
//! ```no_run
//! # fn main() -> Result<(), occl_kernels::Error> {
//! use occl_kernels::{device, DataType, Kernels, RedOp, Reduce};
//! let ctx = device::context(0)?;
//! let k = Kernels::load(&ctx)?; // NVRTC on the first use on this machine, then the cache
//! let stream = ctx.default_stream();
//! let a = stream.clone_htod(&[1.0f32, 2.0]).map_err(|e| occl_kernels::Error::InvalidArgument(format!("{e:?}")))?;
//! let b = a.clone();
//! let mut out = a.clone();
//! k.reduce(&stream, &Reduce::new(DataType::F32, RedOp::Sum), &mut out, &a, &b)?;
//! # Ok(()) }
//! ```

pub mod cache;
#[cfg(feature = "test-support")]
pub mod check;
pub mod coll;
pub mod device;
mod dtype;
mod error;
pub mod ipc;
mod kernels;
mod launch;
pub mod memops;
pub mod nvrtc;
pub mod p2p;
pub mod peer_launch;
pub mod phases;
pub mod prebuild;
#[cfg(any(test, feature = "test-support"))]
pub mod reference;
pub mod staging;
pub mod stamps;
pub mod timer;

pub use cudarc;
pub use dtype::{DataType, RedOp};
pub use error::{Error, Result};
pub use kernels::{compile, options, reduce_name, scale_name, source, Kernels, LoadReport, COPY_NAME, SOURCES};
pub use launch::{Reduce, Scale};
pub use peer_launch::{ClusterSize, PeerLaunch, SyncDomain};
