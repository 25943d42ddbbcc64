//! Bandwidth of the kernels against the device's own device-to-device copy, measured in the same
//! run: CUDA events around many back-to-back launches, the median of several samples.
//! Bytes moved count every byte read and written (a reduce-copy of N output bytes into two
//! outputs moves 4N), as the copy's 2N.

use super::data;
use crate::dtype::{DataType, RedOp};
use crate::error::{driver, Result};
use crate::kernels::Kernels;
use crate::launch::Reduce;
use cudarc::driver::{result as cu, sys, CudaSlice, CudaStream, DevicePtr};
use std::sync::Arc;

/// One measured kernel at one size.
#[derive(Debug, Clone)]
pub struct Row {
    pub name: String,
    /// Output bytes per launch.
    pub bytes: usize,
    /// Bytes read plus bytes written per launch.
    pub moved: usize,
    /// Median time per launch.
    pub us: f64,
    pub gbps: f64,
    /// Against the device-to-device copy at the same size.
    pub vs_memcpy: f64,
}

enum Item {
    Memcpy,
    Copy { two: bool },
    Reduce { r: Reduce, two: bool },
}

impl Item {
    fn name(&self) -> String {
        match self {
            Item::Memcpy => "memcpy D2D (driver)".into(),
            Item::Copy { two } => format!("occl copy{}", if *two { " ×2 out" } else { "" }),
            Item::Reduce { r, two } => {
                let avg = if r.premul.is_some() { " avg(premul)" } else { "" };
                format!("reduce {} {}{avg}{}", r.dtype.short_name(), r.op, if *two { " ×2 out" } else { "" })
            }
        }
    }

    /// Bytes read + written per output byte set of `n` bytes.
    fn moved(&self, n: usize) -> usize {
        match self {
            Item::Memcpy | Item::Copy { two: false } => 2 * n,
            Item::Copy { two: true } | Item::Reduce { two: false, .. } => 3 * n,
            Item::Reduce { two: true, .. } => 4 * n,
        }
    }
}

fn items() -> Vec<Item> {
    let mut v = vec![Item::Memcpy, Item::Copy { two: false }, Item::Copy { two: true }];
    for dt in [DataType::F32, DataType::Bf16] {
        v.push(Item::Reduce { r: Reduce::new(dt, RedOp::Sum), two: false });
    }
    for dt in [
        DataType::F32,
        DataType::Bf16,
        DataType::F16,
        DataType::F8E4M3,
        DataType::F8E5M2,
        DataType::I8,
        DataType::I32,
        DataType::F64,
    ] {
        v.push(Item::Reduce { r: Reduce::new(dt, RedOp::Sum), two: true });
    }
    v.push(Item::Reduce { r: Reduce::new(DataType::F32, RedOp::Max), two: true });
    v.push(Item::Reduce { r: Reduce::avg_premul(DataType::Bf16, 8), two: true });
    v
}

fn event(stream: &Arc<CudaStream>) -> Result<cudarc::driver::CudaEvent> {
    stream.context().new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT)).map_err(driver("cuEventCreate"))
}

/// Measures every item at each output size in `sizes` (bytes).
pub fn run(k: &Kernels, stream: &Arc<CudaStream>, sizes: &[usize], log: &mut dyn FnMut(&str)) -> Result<Vec<Row>> {
    let mut rows = Vec::new();
    for &size in sizes {
        let alloc = |n: usize| -> Result<CudaSlice<u8>> { stream.alloc_zeros::<u8>(n).map_err(driver("cuMemAlloc")) };
        let (mut a, mut b, d, d2) = (alloc(size)?, alloc(size)?, alloc(size)?, alloc(size)?);
        let ptr = |s: &CudaSlice<u8>| s.device_ptr(stream).0;
        let (pa, pb, pd, pd2) = (ptr(&a), ptr(&b), ptr(&d), ptr(&d2));
        let mut loaded = None;
        let mut memcpy_gbps = f64::NAN;
        for item in items() {
            let dt = match &item {
                Item::Reduce { r, .. } => r.dtype,
                _ => DataType::U8,
            };
            if !k.supports(dt) {
                continue;
            }
            if loaded != Some(dt) {
                // Real data, never zeros: every type's own random values.
                stream.memcpy_htod(&data::random(dt, size / dt.size(), 7), &mut a).map_err(driver("cuMemcpyHtoD"))?;
                stream.memcpy_htod(&data::random(dt, size / dt.size(), 8), &mut b).map_err(driver("cuMemcpyHtoD"))?;
                loaded = Some(dt);
            }
            let count = size / dt.size();
            let launch = || -> Result<()> {
                // SAFETY: all four buffers hold `size` bytes and live past the synchronize below.
                unsafe {
                    match &item {
                        Item::Memcpy => {
                            cu::memcpy_dtod_async(pd, pa, size, stream.cu_stream()).map_err(driver("cuMemcpyDtoDAsync"))
                        }
                        Item::Copy { two } => k.copy_raw(stream, pd, two.then_some(pd2), pa, size),
                        Item::Reduce { r, two } => k.reduce_raw(stream, r, pd, two.then_some(pd2), pa, pb, count),
                    }
                }
            };
            let reps = ((1usize << 30) / size.max(1)).clamp(5, 1000);
            for _ in 0..3 {
                launch()?;
            }
            let mut samples = Vec::new();
            for _ in 0..7 {
                let (start, end) = (event(stream)?, event(stream)?);
                start.record(stream).map_err(driver("cuEventRecord"))?;
                for _ in 0..reps {
                    launch()?;
                }
                end.record(stream).map_err(driver("cuEventRecord"))?;
                end.synchronize().map_err(driver("cuEventSynchronize"))?;
                samples
                    .push(f64::from(start.elapsed_ms(&end).map_err(driver("cuEventElapsedTime"))?) * 1e3 / reps as f64);
            }
            samples.sort_by(f64::total_cmp);
            let us = samples[samples.len() / 2];
            let moved = item.moved(size);
            let gbps = moved as f64 / (us * 1e-6) / 1e9;
            if matches!(item, Item::Memcpy) {
                memcpy_gbps = gbps;
            }
            let row = Row { name: item.name(), bytes: size, moved, us, gbps, vs_memcpy: gbps / memcpy_gbps };
            log(&format!(
                "{:>10} {:<34} {:>10.2} µs {:>8.1} GB/s {:>6.2}× memcpy",
                size, row.name, us, gbps, row.vs_memcpy
            ));
            rows.push(row);
        }
        stream.synchronize().map_err(driver("cuStreamSynchronize"))?;
    }
    Ok(rows)
}
