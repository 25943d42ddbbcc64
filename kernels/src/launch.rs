//! Launch wrappers: every kernel is enqueued on the caller's stream and returns at once.
//!
//! The `_raw` forms take device addresses (own allocations, or peer and IPC mappings to come)
//! and are what the collectives use; they record nothing on cudarc's stream-tracking events, so
//! they can be captured into a CUDA graph. The safe forms take cudarc slices and views.

use crate::dtype::{DataType, RedOp};
use crate::error::{driver, Error, Result};
use crate::kernels::{Func, Kernels, THREADS, UNROLL};
use cudarc::driver::{CudaStream, DevicePtr, DevicePtrMut, LaunchConfig, PushKernelArg};

/// One elementwise reduction `dst = a op b`, with the two halves NCCL builds an average from:
/// `premul` scales `a` (this rank's own contribution) before the operation, `postdiv` divides the
/// result. Each step is rounded to the element type, as occl's host path does.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Reduce {
    pub dtype: DataType,
    pub op: RedOp,
    /// Multiply `a` by this first (floats only).
    pub premul: Option<f64>,
    /// Divide the result by this (integers truncate).
    pub postdiv: Option<u32>,
}

impl Reduce {
    pub fn new(dtype: DataType, op: RedOp) -> Reduce {
        Reduce { dtype, op, premul: None, postdiv: None }
    }

    /// The last step of an average as NCCL finishes integer ones: sum, then divide by `nranks`.
    pub fn avg_postdiv(dtype: DataType, nranks: u32) -> Reduce {
        Reduce { postdiv: Some(nranks), ..Reduce::new(dtype, RedOp::Sum) }
    }

    /// A step of an average as NCCL computes float ones: `a` premultiplied by 1/nranks, then summed.
    pub fn avg_premul(dtype: DataType, nranks: u32) -> Reduce {
        Reduce { premul: Some(1.0 / f64::from(nranks.max(1))), ..Reduce::new(dtype, RedOp::Sum) }
    }

    fn validate(&self) -> Result<()> {
        validate_scaling(self.dtype, self.premul, self.postdiv)
    }
}

/// The unary kernel: `dst = a`, premultiplied and/or divided (the first and the finishing step of
/// an average).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Scale {
    pub dtype: DataType,
    pub premul: Option<f64>,
    pub postdiv: Option<u32>,
}

fn validate_scaling(dt: DataType, premul: Option<f64>, postdiv: Option<u32>) -> Result<()> {
    if premul.is_some() && !dt.is_float() {
        return Err(Error::InvalidArgument(format!(
            "premultiplication needs a float type, not {} (integers divide after the sum)",
            dt.short_name()
        )));
    }
    if postdiv == Some(0) {
        return Err(Error::InvalidArgument("division by 0 ranks".into()));
    }
    Ok(())
}

/// Checks that every address is aligned to the element size (the hardware needs it; the kernels
/// handle any element offset within 16 bytes themselves).
pub(crate) fn check_aligned(dt: DataType, ptrs: &[(&str, u64)]) -> Result<()> {
    let size = dt.size() as u64;
    for &(what, p) in ptrs {
        if p == 0 {
            return Err(Error::InvalidArgument(format!("{what} is a null device address")));
        }
        if p % size != 0 {
            return Err(Error::InvalidArgument(format!(
                "{what} at {p:#x} is not aligned to its {size}-byte {dt} elements",
                dt = dt.short_name()
            )));
        }
    }
    Ok(())
}

/// The widest access (16, 4 or 1 bytes) in which all `ptrs` share an offset: the kernels' path.
pub(crate) fn common_width(ptrs: &[u64]) -> u64 {
    let diff = ptrs.iter().fold(0, |acc, &p| acc | (p ^ ptrs[0]));
    if diff & 15 == 0 {
        16
    } else if diff & 3 == 0 {
        4
    } else {
        1
    }
}

/// Blocks for `units` loop items: enough for each thread's `UNROLL` items, at most what the whole
/// device runs at once (the kernels loop over the rest), at least one.
pub(crate) fn grid(units: u64, max_blocks: u32) -> u32 {
    let per_block = u64::from(THREADS) * u64::from(UNROLL);
    let need = units.div_ceil(per_block).max(1);
    u32::try_from(need.min(u64::from(max_blocks.max(1)))).unwrap_or(1)
}

fn config(blocks: u32) -> LaunchConfig {
    LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (THREADS, 1, 1), shared_mem_bytes: 0 }
}

/// Loop items of a reduce-type kernel: 16-byte packs when the pointers share an offset, else
/// elements.
fn units(dt: DataType, count: usize, ptrs: &[u64]) -> u64 {
    let count = count as u64;
    if common_width(ptrs) == 16 {
        (count * dt.size() as u64).div_ceil(16)
    } else {
        count
    }
}

impl Kernels {
    fn same_context(&self, stream: &CudaStream) -> Result<()> {
        if stream.context() == &self.ctx {
            Ok(())
        } else {
            Err(Error::InvalidArgument("the stream belongs to another device context than these kernels".into()))
        }
    }

    fn reduce_fn(&self, dt: DataType, op: RedOp) -> Result<&Func> {
        self.reduce[(dt as usize) * RedOp::ALL.len() + op.index()].as_ref().ok_or_else(|| self.unsupported(dt))
    }

    fn scale_fn(&self, dt: DataType) -> Result<&Func> {
        self.scale[dt as usize].as_ref().ok_or_else(|| self.unsupported(dt))
    }

    /// Enqueues `dst = a op b` (and the same into `dst2`) over `count` elements on `stream`.
    /// `count == 0` enqueues nothing.
    ///
    /// # Safety
    /// Every address is device memory usable from this context (its own, or mapped from a peer),
    /// valid for `count` elements of `r.dtype` until the work has run on `stream`. An output is
    /// either exactly an input (in place) or overlaps neither input, and the outputs are disjoint.
    #[allow(clippy::too_many_arguments)] // the kernel's own parameter list, address by address
    pub unsafe fn reduce_raw(
        &self,
        stream: &CudaStream,
        r: &Reduce,
        dst: u64,
        dst2: Option<u64>,
        a: u64,
        b: u64,
        count: usize,
    ) -> Result<()> {
        r.validate()?;
        self.same_context(stream)?;
        let f = self.reduce_fn(r.dtype, r.op)?;
        if count == 0 {
            return Ok(());
        }
        let mut ptrs = vec![("dst", dst), ("a", a), ("b", b)];
        ptrs.extend(dst2.map(|p| ("dst2", p)));
        check_aligned(r.dtype, &ptrs)?;
        let addrs: Vec<u64> = ptrs.iter().map(|p| p.1).collect();
        let blocks = grid(units(r.dtype, count, &addrs), f.max_blocks);
        let (d2, n) = (dst2.unwrap_or(0), count as u64);
        let (s, div, pre) = (r.premul.unwrap_or(1.0), r.postdiv.unwrap_or(0), i32::from(r.premul.is_some()));
        let mut l = stream.launch_builder(&f.f);
        l.arg(&dst).arg(&d2).arg(&a).arg(&b).arg(&n).arg(&s).arg(&div).arg(&pre);
        // SAFETY: the argument list matches occl_reduce_*'s signature; the caller vouches for the
        // addresses (see above).
        unsafe { l.launch(config(blocks)) }.map_err(driver("cuLaunchKernel(occl_reduce)"))?;
        Ok(())
    }

    /// Enqueues `dst = a` premultiplied and/or divided as `sc` says (and the same into `dst2`).
    ///
    /// # Safety
    /// As [`Kernels::reduce_raw`], with `a` the only input.
    pub unsafe fn scale_raw(
        &self,
        stream: &CudaStream,
        sc: &Scale,
        dst: u64,
        dst2: Option<u64>,
        a: u64,
        count: usize,
    ) -> Result<()> {
        validate_scaling(sc.dtype, sc.premul, sc.postdiv)?;
        self.same_context(stream)?;
        let f = self.scale_fn(sc.dtype)?;
        if count == 0 {
            return Ok(());
        }
        let mut ptrs = vec![("dst", dst), ("a", a)];
        ptrs.extend(dst2.map(|p| ("dst2", p)));
        check_aligned(sc.dtype, &ptrs)?;
        let addrs: Vec<u64> = ptrs.iter().map(|p| p.1).collect();
        let blocks = grid(units(sc.dtype, count, &addrs), f.max_blocks);
        let (d2, n) = (dst2.unwrap_or(0), count as u64);
        let (s, div, pre) = (sc.premul.unwrap_or(1.0), sc.postdiv.unwrap_or(0), i32::from(sc.premul.is_some()));
        let mut l = stream.launch_builder(&f.f);
        l.arg(&dst).arg(&d2).arg(&a).arg(&n).arg(&s).arg(&div).arg(&pre);
        // SAFETY: matches occl_scale_*'s signature; the caller vouches for the addresses.
        unsafe { l.launch(config(blocks)) }.map_err(driver("cuLaunchKernel(occl_scale)"))?;
        Ok(())
    }

    /// Enqueues a copy of `bytes` bytes from `src` to `dst` (and `dst2`); any alignment.
    ///
    /// # Safety
    /// As [`Kernels::reduce_raw`], in bytes, with `src` the only input.
    pub unsafe fn copy_raw(
        &self,
        stream: &CudaStream,
        dst: u64,
        dst2: Option<u64>,
        src: u64,
        bytes: usize,
    ) -> Result<()> {
        self.same_context(stream)?;
        if bytes == 0 {
            return Ok(());
        }
        let mut ptrs = vec![("dst", dst), ("src", src)];
        ptrs.extend(dst2.map(|p| ("dst2", p)));
        check_aligned(DataType::U8, &ptrs)?;
        let addrs: Vec<u64> = ptrs.iter().map(|p| p.1).collect();
        let f = &self.copy;
        let blocks = grid((bytes as u64).div_ceil(common_width(&addrs)), f.max_blocks);
        let (d2, n) = (dst2.unwrap_or(0), bytes as u64);
        let mut l = stream.launch_builder(&f.f);
        l.arg(&dst).arg(&d2).arg(&src).arg(&n);
        // SAFETY: matches occl_copy's signature; the caller vouches for the addresses.
        unsafe { l.launch(config(blocks)) }.map_err(driver("cuLaunchKernel(occl_copy)"))?;
        Ok(())
    }

    /// `dst = a op b` on cudarc buffers of equal byte length (whole `r.dtype` elements).
    pub fn reduce<T, D, A, B>(&self, stream: &CudaStream, r: &Reduce, dst: &mut D, a: &A, b: &B) -> Result<()>
    where
        D: DevicePtrMut<T>,
        A: DevicePtr<T>,
        B: DevicePtr<T>,
    {
        let count = elements(r.dtype, &[dst.num_bytes(), a.num_bytes(), b.num_bytes()])?;
        let (pa, _ra) = a.device_ptr(stream);
        let (pb, _rb) = b.device_ptr(stream);
        let (pd, _rd) = dst.device_ptr_mut(stream);
        // SAFETY: three live cudarc buffers of `count` elements; `dst` is borrowed mutably, so it
        // cannot alias `a` or `b`. The guards order other streams' uses after this launch.
        unsafe { self.reduce_raw(stream, r, pd, None, pa, pb, count) }
    }

    /// `dst = dst op b` (in place).
    pub fn reduce_in_place<T, D, B>(&self, stream: &CudaStream, r: &Reduce, dst: &mut D, b: &B) -> Result<()>
    where
        D: DevicePtrMut<T>,
        B: DevicePtr<T>,
    {
        let count = elements(r.dtype, &[dst.num_bytes(), b.num_bytes()])?;
        let (pb, _rb) = b.device_ptr(stream);
        let (pd, _rd) = dst.device_ptr_mut(stream);
        // SAFETY: as in `reduce`; `dst` is read and written at the same index by one thread.
        unsafe { self.reduce_raw(stream, r, pd, None, pd, pb, count) }
    }

    /// `dst1 = dst2 = a op b`: a ring step's reduce into the user's buffer and the next peer's.
    pub fn reduce2<T, D1, D2, A, B>(
        &self,
        stream: &CudaStream,
        r: &Reduce,
        dst1: &mut D1,
        dst2: &mut D2,
        a: &A,
        b: &B,
    ) -> Result<()>
    where
        D1: DevicePtrMut<T>,
        D2: DevicePtrMut<T>,
        A: DevicePtr<T>,
        B: DevicePtr<T>,
    {
        let count = elements(r.dtype, &[dst1.num_bytes(), dst2.num_bytes(), a.num_bytes(), b.num_bytes()])?;
        let (pa, _ra) = a.device_ptr(stream);
        let (pb, _rb) = b.device_ptr(stream);
        let (p1, _r1) = dst1.device_ptr_mut(stream);
        let (p2, _r2) = dst2.device_ptr_mut(stream);
        // SAFETY: four live buffers; the two outputs are distinct mutable borrows.
        unsafe { self.reduce_raw(stream, r, p1, Some(p2), pa, pb, count) }
    }

    /// `dst = a`, premultiplied and/or divided.
    pub fn scale<T, D, A>(&self, stream: &CudaStream, sc: &Scale, dst: &mut D, a: &A) -> Result<()>
    where
        D: DevicePtrMut<T>,
        A: DevicePtr<T>,
    {
        let count = elements(sc.dtype, &[dst.num_bytes(), a.num_bytes()])?;
        let (pa, _ra) = a.device_ptr(stream);
        let (pd, _rd) = dst.device_ptr_mut(stream);
        // SAFETY: two live buffers of `count` elements, not aliased (one is borrowed mutably).
        unsafe { self.scale_raw(stream, sc, pd, None, pa, count) }
    }

    /// `dst = src`, bytes.
    pub fn copy<T, D, S>(&self, stream: &CudaStream, dst: &mut D, src: &S) -> Result<()>
    where
        D: DevicePtrMut<T>,
        S: DevicePtr<T>,
    {
        let bytes = elements(DataType::U8, &[dst.num_bytes(), src.num_bytes()])?;
        let (ps, _rs) = src.device_ptr(stream);
        let (pd, _rd) = dst.device_ptr_mut(stream);
        // SAFETY: two live buffers of `bytes` bytes, not aliased.
        unsafe { self.copy_raw(stream, pd, None, ps, bytes) }
    }

    /// `dst1 = dst2 = src`, bytes: an all-gather ring step's copy out and pass on.
    pub fn copy2<T, D1, D2, S>(&self, stream: &CudaStream, dst1: &mut D1, dst2: &mut D2, src: &S) -> Result<()>
    where
        D1: DevicePtrMut<T>,
        D2: DevicePtrMut<T>,
        S: DevicePtr<T>,
    {
        let bytes = elements(DataType::U8, &[dst1.num_bytes(), dst2.num_bytes(), src.num_bytes()])?;
        let (ps, _rs) = src.device_ptr(stream);
        let (p1, _r1) = dst1.device_ptr_mut(stream);
        let (p2, _r2) = dst2.device_ptr_mut(stream);
        // SAFETY: three live buffers, the outputs distinct mutable borrows.
        unsafe { self.copy_raw(stream, p1, Some(p2), ps, bytes) }
    }
}

/// The common element count of buffers of these byte lengths.
pub(crate) fn elements(dt: DataType, lens: &[usize]) -> Result<usize> {
    let first = lens.first().copied().unwrap_or(0);
    if lens.iter().any(|&l| l != first) {
        return Err(Error::InvalidArgument(format!("buffers differ in length: {lens:?} bytes")));
    }
    if first % dt.size() != 0 {
        return Err(Error::InvalidArgument(format!(
            "{first} bytes is not a whole number of {} elements",
            dt.short_name()
        )));
    }
    Ok(first / dt.size())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alignment_is_checked_per_element_size() {
        assert!(check_aligned(DataType::F32, &[("dst", 0x1000), ("a", 0x1004), ("b", 0x100c)]).is_ok());
        let e = check_aligned(DataType::F32, &[("dst", 0x1000), ("a", 0x1002)]).unwrap_err();
        assert!(e.to_string().contains("a at 0x1002 is not aligned to its 4-byte f32"), "{e}");
        assert!(check_aligned(DataType::U8, &[("dst", 0x1001)]).is_ok());
        assert!(check_aligned(DataType::F64, &[("dst", 0x1004)]).is_err());
        assert!(check_aligned(DataType::U8, &[("src", 0)]).unwrap_err().to_string().contains("null"));
    }

    #[test]
    fn the_path_follows_the_shared_offset() {
        assert_eq!(common_width(&[0x1000, 0x2000, 0x3010]), 16);
        assert_eq!(common_width(&[0x1004, 0x2004]), 16, "same offset within 16 bytes");
        assert_eq!(common_width(&[0x1000, 0x2004]), 4);
        assert_eq!(common_width(&[0x1000, 0x2002]), 1);
        assert_eq!(units(DataType::F32, 5, &[0x1000, 0x2000]), 2, "20 bytes: two packs");
        assert_eq!(units(DataType::F32, 5, &[0x1000, 0x2004]), 5, "element path");
    }

    #[test]
    fn grids_cover_the_work_up_to_the_device() {
        assert_eq!(grid(0, 528), 1);
        assert_eq!(grid(1, 528), 1);
        assert_eq!(grid(1024, 528), 1, "512 threads x 2 packs");
        assert_eq!(grid(1025, 528), 2);
        assert_eq!(grid(1 << 30, 528), 528, "capped at what runs at once");
        assert_eq!(grid(1 << 30, 0), 1);
    }

    #[test]
    fn averages_are_validated() {
        assert!(Reduce::avg_premul(DataType::Bf16, 8).validate().is_ok());
        assert_eq!(Reduce::avg_premul(DataType::F32, 4).premul, Some(0.25));
        assert!(Reduce::avg_premul(DataType::I32, 8).validate().unwrap_err().to_string().contains("float"));
        assert!(Reduce::avg_postdiv(DataType::I32, 8).validate().is_ok());
        assert!(Reduce::avg_postdiv(DataType::F16, 0).validate().is_err());
    }

    #[test]
    fn lengths_must_match_in_whole_elements() {
        assert_eq!(elements(DataType::F32, &[16, 16, 16]).ok(), Some(4));
        assert!(elements(DataType::F32, &[16, 12]).is_err());
        assert!(elements(DataType::F64, &[12, 12]).is_err());
        assert_eq!(elements(DataType::U8, &[0, 0]).ok(), Some(0));
    }
}
