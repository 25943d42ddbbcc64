//! NCCL 2.28 functions this build does not implement. Each exists, so that a program linked
//! against NVIDIA's library loads this one, and fails with `ncclInvalidUsage` and a
//! `ncclGetLastError` text naming itself (the one returning an int returns -1 and leaves the
//! same text).

use crate::abi::*;
use crate::error::{guard, guard_value, usage};
use std::ffi::c_void;

fn unsupported(name: &'static str, why: &str) -> occl::Error {
    usage(format!("{name} is not supported by this libnccl.so.2 (occl): {why}"))
}

const LL_A2A: &str =
    "occl does not offer the device API's low-latency all-to-all (ncclLLA2ASession); exchange through \
                      windows with lsa pointers and barriers, or ncclGin puts and signals";

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

refuse!(fn ncclLLA2ACalcSlots / pncclLLA2ACalcSlots(maxElts: i32, maxEltSize: i32) -> i32 = -1, LL_A2A);
refuse!(fn ncclLLA2ACreateRequirement / pncclLLA2ACreateRequirement(
    nBlocks: i32, nSlots: i32, outHandle: *mut c_void, outReq: *mut c_void) -> ncclResult_t, LL_A2A);

export! {
    /// NCCL rereads its logging variables here; occl reads them once (deprecated in NCCL 2.28).
    fn ncclResetDebugInit / pncclResetDebugInit() -> () {
        guard("ncclResetDebugInit", || {
            let why = "logging is configured once per process; set NCCL_DEBUG before the first call";
            Err(unsupported("ncclResetDebugInit", why))
        });
    }
}
