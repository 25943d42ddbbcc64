//! Training-step marks for jobs on NVIDIA's NCCL: NCCL's profiler API has no step event, so the
//! plugin exports two C functions an application calls itself (PyTorch through `ctypes`, after
//! loading the same library path it gave `NCCL_PROFILER_PLUGIN`, which the dynamic linker maps
//! once). They write the `ProfilerStep#N` rows HTA cuts a trace into iterations by; without a
//! trace exporter (`OCCL_TRACE_DIR`) they do nothing.
//!
//! ```c
//! void occlProfilerStepBegin(uint64_t step);  // ends the open step, if any, and begins `step`
//! void occlProfilerStepEnd(void);             // ends the open step, if any
//! ```

use crate::stats::{self, Reason};
use std::panic::{catch_unwind, AssertUnwindSafe};

/// Begins training step `step`, ending the open one.
#[no_mangle]
pub extern "C" fn occlProfilerStepBegin(step: u64) {
    if catch_unwind(AssertUnwindSafe(|| occl_telemetry::trace::step_begin(step))).is_err() {
        stats::count(Reason::Panic);
    }
}

/// Ends the open training step.
#[no_mangle]
pub extern "C" fn occlProfilerStepEnd() {
    if catch_unwind(AssertUnwindSafe(occl_telemetry::trace::step_end)).is_err() {
        stats::count(Reason::Panic);
    }
}
