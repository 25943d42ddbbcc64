//! The kernels' phase profile on a communicator (`OCCL_KERNEL_PHASES=1` when it is created):
//! the phase-profiled programs (`occl_kernels::phases`) are built beside the plain ones and one
//! record buffer is held; `CudaComm::profile_next_call` marks the next kernel launch to run the
//! profiled program into it, and `CudaComm::kernel_phases` reads its records once the caller
//! has synchronised the stream. A measuring tool (`occl-gpu bench --phases`): the plain
//! programs carry none of it, and a communicator without the variable builds nothing.

use super::err;
use super::kernels::coll::CollKernels;
use super::kernels::cudarc::driver::CudaContext;
use super::kernels::phases::{ChannelRecord, PhaseBuf};
use crate::error::{Error, Result};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;

/// The variable that asks for the profile at creation.
pub const VAR: &str = "OCCL_KERNEL_PHASES";

/// Whether `value` (the variable's, if set) turns the profile on: `1` yes, unset or `0` no.
fn enabled(value: Option<&str>) -> Result<bool> {
    match value.map(str::trim) {
        None | Some("" | "0") => Ok(false),
        Some("1") => Ok(true),
        Some(v) => Err(Error::arg(format!("{VAR}={v:?}: 1 (profile the kernels' phases) or 0"))),
    }
}

/// The record buffer and which launch writes it.
pub(crate) struct KernelPhases {
    buf: PhaseBuf,
    /// Set by `profile_next_call`, taken by the next launch.
    armed: AtomicBool,
    /// Channels of the profiled launch since the last arming (0: none yet).
    last: AtomicU32,
}

impl KernelPhases {
    fn new(buf: PhaseBuf) -> KernelPhases {
        KernelPhases { buf, armed: AtomicBool::new(false), last: AtomicU32::new(0) }
    }

    /// The profile of a communicator of up to `channels` channels on `ctx`, when `VAR` asks for
    /// it: builds the byte mover's profiled program now (a reducing type's with `prepare`).
    pub(crate) fn from_env(ctx: &Arc<CudaContext>, k: &CollKernels, channels: u32) -> Result<Option<KernelPhases>> {
        if !enabled(std::env::var(VAR).ok().as_deref())? {
            return Ok(None);
        }
        k.prepare_phases(None).map_err(err("build the phase-profiled kernels"))?;
        let buf = PhaseBuf::alloc(ctx, channels).map_err(err("allocate the phase records"))?;
        Ok(Some(KernelPhases::new(buf)))
    }

    pub(crate) fn arm(&self) {
        self.last.store(0, Ordering::Relaxed);
        self.armed.store(true, Ordering::Release);
    }

    /// For a kernel launch of `channels` channels: the records' address when the launch is the
    /// marked one (which unmarks it), else `None`.
    pub(crate) fn take(&self, channels: u32) -> Option<u64> {
        if channels == 0 || channels > self.buf.channels() || !self.armed.swap(false, Ordering::AcqRel) {
            return None;
        }
        self.buf.clear();
        self.last.store(channels, Ordering::Release);
        Some(self.buf.device_ptr())
    }

    /// The last profiled launch's records; unmarks a mark no launch took.
    pub(crate) fn read(&self) -> Result<Option<Vec<ChannelRecord>>> {
        self.armed.store(false, Ordering::Release);
        match self.last.load(Ordering::Acquire) {
            0 => Ok(None),
            n => self.buf.read(n).map(Some).map_err(err("read the phase records")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_variable_says_one_or_zero() {
        assert!(!enabled(None).unwrap());
        assert!(!enabled(Some("0")).unwrap() && !enabled(Some(" ")).unwrap());
        assert!(enabled(Some("1")).unwrap() && enabled(Some(" 1\n")).unwrap());
        let e = enabled(Some("yes")).unwrap_err().to_string();
        assert!(e.contains("OCCL_KERNEL_PHASES") && e.contains("yes"), "{e}");
    }

    #[test]
    fn only_the_marked_launch_writes_the_records_and_they_are_its_own() {
        let p = KernelPhases::new(PhaseBuf::in_memory(8).unwrap());
        assert_eq!(p.take(4), None, "not marked");
        assert_eq!(p.read().unwrap(), None);
        p.arm();
        assert_eq!(p.take(9), None, "more channels than the records");
        assert_eq!(p.take(0), None);
        assert_eq!(p.take(2), Some(0), "the marked launch gets the (in-memory) address");
        assert_eq!(p.take(2), None, "one launch only");
        // The kernel has not written them: an error that names the channel.
        let e = p.read().unwrap_err().to_string();
        assert!(e.contains("channel 0"), "{e}");
        let rec =
            ChannelRecord { start_ns: 10, end_ns: 110, cycles: 200, phases: [20, 40, 60, 0, 20], chunks: 2, steps: 4 };
        p.buf.write(0, &rec);
        p.buf.write(1, &ChannelRecord { start_ns: 15, ..rec });
        let got = p.read().unwrap().unwrap();
        assert_eq!(got.len(), 2);
        assert_eq!((got[0], got[1].start_ns), (rec, 15));
        // Marking again forgets the last launch; the records are cleared for the next one.
        p.arm();
        assert_eq!(p.take(1), Some(0));
        assert!(p.read().is_err(), "cleared for the new launch");
        // A mark that no launch took (a call on the copy engines) ends with the read.
        p.arm();
        assert_eq!(p.read().unwrap(), None);
        assert_eq!(p.take(1), None, "no later launch is profiled");
    }
}
