//! NCCL 2.28 functions this build does not implement. Each exists, so that a program linked
//! against NVIDIA's library loads this one, and fails with `ncclInvalidUsage` and a
//! `ncclGetLastError` text naming itself (the ones returning an int or a team return -1 or an
//! empty team and leave the same text).

use crate::abi::*;
use crate::error::{guard, guard_value, usage};
use crate::handle::ncclComm_t;
use std::ffi::c_void;

/// `ncclTeam_t` of the device API.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ncclTeam {
    pub nRanks: i32,
    pub rank: i32,
    pub stride: i32,
}

const NO_TEAM: ncclTeam = ncclTeam { nRanks: 0, rank: -1, stride: 0 };

fn unsupported(name: &'static str, why: &str) -> occl::Error {
    usage(format!("{name} is not supported by this libnccl.so.2 (occl, host buffers): {why}"))
}

const DEVICE_API: &str = "NCCL's device API needs the GPU path, which is not in this build yet";

macro_rules! refuse {
    ($(#[$m:meta])* fn $name:ident / $alias:ident ( $($arg:ident : $ty:ty),* ) -> ncclResult_t, $why:expr) => {
        export! {
            $(#[$m])*
            fn $name / $alias($($arg: $ty),*) -> ncclResult_t {
                $(let _ = $arg;)*
                guard(stringify!($name), || Err(unsupported(stringify!($name), $why)))
            }
        }
    };
    ($(#[$m:meta])* fn $name:ident / $alias:ident ( $($arg:ident : $ty:ty),* ) -> $ret:ty = $fallback:expr,
     $why:expr) => {
        export! {
            $(#[$m])*
            fn $name / $alias($($arg: $ty),*) -> $ret {
                $(let _ = $arg;)*
                guard_value(stringify!($name), $fallback, || Err(unsupported(stringify!($name), $why)))
            }
        }
    };
}

refuse!(fn ncclDevCommCreate / pncclDevCommCreate(
    comm: ncclComm_t, reqs: *const c_void, outDevComm: *mut c_void) -> ncclResult_t,
    DEVICE_API);
refuse!(fn ncclDevCommDestroy / pncclDevCommDestroy(comm: ncclComm_t, devComm: *const c_void) -> ncclResult_t,
    DEVICE_API);
refuse!(fn ncclTeamWorld / pncclTeamWorld(comm: ncclComm_t) -> ncclTeam = NO_TEAM, DEVICE_API);
refuse!(fn ncclTeamLsa / pncclTeamLsa(comm: ncclComm_t) -> ncclTeam = NO_TEAM, DEVICE_API);
refuse!(fn ncclTeamRail / pncclTeamRail(comm: ncclComm_t) -> ncclTeam = NO_TEAM, DEVICE_API);
refuse!(fn ncclTeamRankToWorld / pncclTeamRankToWorld(
    comm: ncclComm_t, team: ncclTeam, rank: i32) -> i32 = -1, DEVICE_API);
refuse!(fn ncclTeamRankToLsa / pncclTeamRankToLsa(comm: ncclComm_t, team: ncclTeam, rank: i32) -> i32 = -1, DEVICE_API);
refuse!(fn ncclLsaBarrierCreateRequirement / pncclLsaBarrierCreateRequirement(
    team: ncclTeam, nBarriers: i32, outHandle: *mut c_void, outReq: *mut c_void) -> ncclResult_t, DEVICE_API);
refuse!(fn ncclGinBarrierCreateRequirement / pncclGinBarrierCreateRequirement(
    comm: ncclComm_t, team: ncclTeam, nBarriers: i32, outHandle: *mut c_void, outReq: *mut c_void) -> ncclResult_t,
    DEVICE_API);
refuse!(fn ncclLLA2ACalcSlots / pncclLLA2ACalcSlots(maxElts: i32, maxEltSize: i32) -> i32 = -1, DEVICE_API);
refuse!(fn ncclLLA2ACreateRequirement / pncclLLA2ACreateRequirement(
    nBlocks: i32, nSlots: i32, outHandle: *mut c_void, outReq: *mut c_void) -> ncclResult_t, DEVICE_API);

export! {
    /// NCCL rereads its logging variables here; occl reads them once (deprecated in NCCL 2.28).
    fn ncclResetDebugInit / pncclResetDebugInit() -> () {
        guard("ncclResetDebugInit", || {
            let why = "logging is configured once per process; set NCCL_DEBUG before the first call";
            Err(unsupported("ncclResetDebugInit", why))
        });
    }
}
