//! occl as `libnccl.so.2`: NCCL 2.28's C API (`include/nccl.h`) over occl's collectives.
//!
//! Every `nccl*` function of NCCL 2.28 is exported, with its `pnccl*` alias. A communicator
//! created while the calling thread has a current CUDA context lives on that device (occl's
//! `CudaComm`): its collectives are enqueued on the caller's `cudaStream_t` and capturable in
//! graphs, and its sends and receives run staged through pinned host memory (`p2p`). In a
//! process without the CUDA driver a call with a NULL stream and host buffers runs occl's host
//! collective and has completed when it returns. Every function this build does not implement
//! (`stubs`: the device API's low-latency all-to-all) returns `ncclInvalidUsage`, naming itself
//! in `ncclGetLastError`, so that a program linked against NVIDIA's library always loads this
//! one and never finds a symbol missing.
//!
//! NCCL's device API (`include/nccl_device.h`: device communicators, windows on device memory,
//! lsa pointers and barriers, GIN) is offered on GPU communicators whose ranks share one host
//! (`devapi`).
//!
//! Layers, bottom up: `abi` (C types and their conversions) → `error` (result codes, the last error, the panic barrier) → `device` (is a pointer GPU
//! memory) → `gpu` (current device, streams, staging buffers) → `lsa` (the device API's
//! layouts and shared device memory) → `handle` (the communicator behind `ncclComm_t`) →
//! `setup` (the device API's collective setups) → `p2p` (staged device send/recv) →
//! `deferred` (where a call runs; the device collectives a group holds) → `group` (the
//! thread's group, with the inits, buffers, setups and device calls it holds) → the entry
//! points (`init`, `coll`, `misc`, `devapi`, `stubs`).
#![deny(unsafe_op_in_unsafe_fn)]
#![allow(non_camel_case_types, non_snake_case, non_upper_case_globals)] // NCCL's C names

/// Exports `$name` and its profiling alias `$alias` (NCCL's `pncclX`), both calling one body.
macro_rules! export {
    ($(#[$m:meta])* fn $name:ident / $alias:ident ( $($arg:ident : $ty:ty),* $(,)? ) -> $ret:ty $body:block) => {
        $(#[$m])*
        ///
        /// # Safety
        /// The pointers must be valid as NCCL's API documents for this function.
        #[no_mangle]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> $ret $body

        /// The profiling alias (`pncclX`) of the function of the same name without `p`.
        ///
        /// # Safety
        /// As the function it aliases.
        #[no_mangle]
        pub unsafe extern "C" fn $alias($($arg: $ty),*) -> $ret {
            // SAFETY: the caller upholds the aliased function's contract.
            unsafe { $name($($arg),*) }
        }
    };
}

pub mod abi;
mod coll;
mod deferred;
mod devapi;
mod device;
mod error;
mod gpu;
mod group;
mod handle;
mod init;
mod lsa;
mod misc;
mod p2p;
mod setup;
mod stubs;

pub use abi::{ncclConfig_t, ncclDataType_t, ncclRedOp_t, ncclResult_t, ncclUniqueId};
pub use coll::*;
pub use devapi::*;
pub use group::{ncclGroupEnd, ncclGroupStart, pncclGroupEnd, pncclGroupStart};
pub use handle::ncclComm_t;
pub use init::*;
pub use lsa::abi::{
    ncclDevComm, ncclDevCommRequirements, ncclDevResourceRequirements, ncclGinBarrierHandle, ncclLsaBarrierHandle,
    ncclTeam, ncclTeamRequirements,
};
pub use misc::*;
pub use stubs::*;
