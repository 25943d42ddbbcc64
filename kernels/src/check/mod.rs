//! The GPU check: every kernel × element type × operator against the host reference
//! ([`crate::reference`]), at sizes 0, 1, odd, 2^k±1 and large, aligned, at a shared element
//! offset (the scalar head) and at mismatched offsets (the element path), out of place, in place
//! and into two outputs; plus the copy kernel at every byte offset class. Outputs are poisoned
//! before each launch and guard bytes around them must come back untouched, so an element left
//! unwritten or written out of bounds fails. Bandwidth is measured in [`bench`].

pub mod bench;
pub mod data;

use crate::dtype::{DataType, RedOp};
use crate::error::{driver, Result};
use crate::kernels::Kernels;
use crate::launch::{Reduce, Scale};
use crate::reference;
use cudarc::driver::{result as cu, CudaSlice, CudaStream, DevicePtr};
use std::sync::Arc;
use std::time::Instant;

/// Byte value the outputs and their guards hold before a launch.
const POISON: u8 = 0xa5;
/// Guard bytes checked on each side of an output.
const GUARD: usize = 16;
/// Where every region starts in its buffer (room for the guard and the element offsets).
const BASE: usize = 64;

/// What to run.
#[derive(Debug, Clone)]
pub struct Options {
    /// Output bytes of the large case (0: none).
    pub large_bytes: usize,
    /// Run the 2^20±1 cases.
    pub mid: bool,
    pub seed: u64,
}

impl Options {
    /// Small sizes only: for the integration test.
    pub fn quick() -> Options {
        Options { large_bytes: 0, mid: false, seed: 1 }
    }

    pub fn full(large_bytes: usize) -> Options {
        Options { large_bytes, mid: true, seed: 1 }
    }
}

/// Outcome: cases passed and a line for each failure.
#[derive(Debug, Default)]
pub struct Summary {
    pub passed: usize,
    pub failed: Vec<String>,
}

/// Sizes in elements, every one at each alignment and variant.
const SMALL: [usize; 17] = [0, 1, 2, 3, 7, 15, 16, 17, 31, 33, 255, 257, 1023, 1025, 4097, 65535, 65537];
const MID: [usize; 2] = [(1 << 20) - 1, (1 << 20) + 1];

#[derive(Debug, Clone, Copy, PartialEq)]
enum What {
    Reduce(Reduce),
    Scale(Scale),
}

impl What {
    fn dtype(&self) -> DataType {
        match self {
            What::Reduce(r) => r.dtype,
            What::Scale(s) => s.dtype,
        }
    }

    fn minmax(&self) -> bool {
        matches!(self, What::Reduce(r) if matches!(r.op, RedOp::Max | RedOp::Min))
    }

    fn name(&self) -> String {
        let tail = |pre: Option<f64>, div: Option<u32>| {
            let mut s = String::new();
            if let Some(p) = pre {
                s.push_str(&format!("·premul {p:.4}"));
            }
            if let Some(d) = div {
                s.push_str(&format!("·postdiv {d}"));
            }
            s
        };
        match self {
            What::Reduce(r) => format!("reduce {} {}{}", r.dtype.short_name(), r.op, tail(r.premul, r.postdiv)),
            What::Scale(s) => format!("scale {}{}", s.dtype.short_name(), tail(s.premul, s.postdiv)),
        }
    }
}

/// Where the output goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Out {
    One,
    Two,
    /// dst is a.
    InPlace,
}

/// The operations checked for `dt`: the four operators, the average both ways NCCL does it
/// (premultiplied for floats only), and the scale kernel's three uses.
fn whats(dt: DataType) -> Vec<What> {
    let mut v: Vec<What> = RedOp::ALL.iter().map(|&op| What::Reduce(Reduce::new(dt, op))).collect();
    v.push(What::Reduce(Reduce::avg_postdiv(dt, 3)));
    v.push(What::Scale(Scale { dtype: dt, premul: None, postdiv: Some(3) }));
    v.push(What::Scale(Scale { dtype: dt, premul: None, postdiv: None }));
    if dt.is_float() {
        v.push(What::Reduce(Reduce::avg_premul(dt, 3)));
        v.push(What::Scale(Scale { dtype: dt, premul: Some(1.0 / 3.0), postdiv: None }));
    }
    v
}

/// The kernels, a stream and the device buffers one group of cases runs in.
struct Runner<'a> {
    k: &'a Kernels,
    stream: &'a Arc<CudaStream>,
    a: CudaSlice<u8>,
    b: CudaSlice<u8>,
    d: CudaSlice<u8>,
    d2: CudaSlice<u8>,
}

fn alloc(stream: &Arc<CudaStream>, cap: usize) -> Result<CudaSlice<u8>> {
    stream.alloc_zeros::<u8>(cap).map_err(driver("cuMemAlloc"))
}

fn addr(s: &CudaSlice<u8>, stream: &CudaStream) -> u64 {
    s.device_ptr(stream).0
}

fn poison(stream: &CudaStream, buf: &CudaSlice<u8>, off: usize, len: usize) -> Result<()> {
    // SAFETY: [off, off+len) lies inside `buf` (callers size buffers with BASE and guard room).
    unsafe { cu::memset_d8_async(addr(buf, stream) + off as u64, POISON, len, stream.cu_stream()) }
        .map_err(driver("cuMemsetD8Async"))
}

fn upload(stream: &Arc<CudaStream>, buf: &mut CudaSlice<u8>, off: usize, host: &[u8]) -> Result<()> {
    let mut view = buf.slice_mut(off..off + host.len());
    stream.memcpy_htod(host, &mut view).map_err(driver("cuMemcpyHtoDAsync"))
}

fn download(stream: &Arc<CudaStream>, buf: &CudaSlice<u8>, off: usize, len: usize) -> Result<Vec<u8>> {
    let mut host = vec![0u8; len];
    stream.memcpy_dtoh(&buf.slice(off..off + len), &mut host).map_err(driver("cuMemcpyDtoHAsync"))?;
    stream.synchronize().map_err(driver("cuStreamSynchronize"))?;
    Ok(host)
}

/// The reference over all cores.
fn reference_par(what: &What, a: &[u8], b: &[u8], out: &mut [u8]) {
    let step = (1 << 20) * what.dtype().size();
    let parts: Vec<_> = out.chunks_mut(step).zip(a.chunks(step)).zip(b.chunks(step)).collect();
    data::par(parts, |((o, a), b)| match what {
        What::Reduce(r) => reference::reduce(r, a, b, o),
        What::Scale(s) => reference::scale(s, a, o),
    });
}

/// Checks a downloaded output region (guards included) against `want`; an error line if wrong.
fn judge(label: &str, dt: DataType, minmax: bool, region: &[u8], want: &[u8], a: &[u8], b: &[u8]) -> Option<String> {
    let (lo, rest) = region.split_at(GUARD);
    let (got, hi) = rest.split_at(want.len());
    if lo.iter().chain(hi).any(|&x| x != POISON) {
        return Some(format!("{label}: wrote outside its output (guard bytes changed)"));
    }
    let (bad, first) = data::compare(dt, minmax, got, want);
    if bad == 0 {
        return None;
    }
    let n = want.len() / dt.size();
    let i = first.first().copied().unwrap_or(0);
    let v = |buf: &[u8]| reference::value(dt, buf, i);
    Some(format!(
        "{label}: {bad} of {n} elements wrong, first at {first:?}: got {} want {} (a {} b {})",
        v(got),
        v(want),
        v(a),
        if b.is_empty() { f64::NAN } else { v(b) }
    ))
}

impl<'a> Runner<'a> {
    /// Buffers of `cap` bytes (`cap_b` for the second input).
    fn new(k: &'a Kernels, stream: &'a Arc<CudaStream>, cap: usize, cap_b: usize) -> Result<Runner<'a>> {
        Ok(Runner {
            k,
            stream,
            a: alloc(stream, cap)?,
            b: alloc(stream, cap_b)?,
            d: alloc(stream, cap)?,
            d2: alloc(stream, cap)?,
        })
    }

    /// Runs one element-kernel case: `count` elements, element offsets `[a, b, dst, dst2]`.
    fn elem_case(
        &mut self,
        what: &What,
        out: Out,
        count: usize,
        offs: [usize; 4],
        inputs: (&[u8], &[u8]),
    ) -> Result<Option<String>> {
        let stream = self.stream;
        let dt = what.dtype();
        let s = dt.size();
        let bytes = count * s;
        let (a_host, b_host) = (&inputs.0[..bytes], &inputs.1[..bytes]);
        let [oa, ob, od, od2] = offs.map(|o| BASE + o * s);
        poison(stream, &self.d, od - GUARD, bytes + 2 * GUARD)?;
        poison(stream, &self.d2, od2 - GUARD, bytes + 2 * GUARD)?;
        // In place, `a` is uploaded into the output itself.
        let in_place = out == Out::InPlace;
        let oa = if in_place { od } else { oa };
        upload(stream, if in_place { &mut self.d } else { &mut self.a }, oa, a_host)?;
        upload(stream, &mut self.b, ob, b_host)?;
        let pa = addr(if in_place { &self.d } else { &self.a }, stream) + oa as u64;
        let pb = addr(&self.b, stream) + ob as u64;
        let (pd, pd2) = (addr(&self.d, stream) + od as u64, addr(&self.d2, stream) + od2 as u64);
        let dst2 = (out == Out::Two).then_some(pd2);
        // SAFETY: every region lies inside its buffer (BASE + offsets + bytes + GUARD <= cap), the
        // buffers live until the synchronize in `download`, and in place means dst == a exactly.
        unsafe {
            match what {
                What::Reduce(r) => self.k.reduce_raw(stream, r, pd, dst2, pa, pb, count)?,
                What::Scale(sc) => self.k.scale_raw(stream, sc, pd, dst2, pa, count)?,
            }
        }
        let mut want = vec![0u8; bytes];
        reference_par(what, a_host, b_host, &mut want);
        let label = format!("{} {:?} count={count} offs={offs:?}", what.name(), out);
        let b_shown: &[u8] = if matches!(what, What::Scale(_)) { &[] } else { b_host };
        let region = download(stream, &self.d, od - GUARD, bytes + 2 * GUARD)?;
        if let Some(e) = judge(&label, dt, what.minmax(), &region, &want, a_host, b_shown) {
            return Ok(Some(e));
        }
        let region2 = download(stream, &self.d2, od2 - GUARD, bytes + 2 * GUARD)?;
        if out == Out::Two {
            return Ok(judge(&format!("{label} (second output)"), dt, what.minmax(), &region2, &want, a_host, b_shown));
        }
        if region2.iter().any(|&x| x != POISON) {
            return Ok(Some(format!("{label}: wrote to the unused second output")));
        }
        Ok(None)
    }

    /// Runs one copy case: `bytes` bytes, byte offsets `[src, dst, dst2]`.
    fn copy_case(&mut self, two: bool, bytes: usize, offs: [usize; 3], src: &[u8]) -> Result<Option<String>> {
        let stream = self.stream;
        let [os, od, od2] = offs.map(|o| BASE + o);
        let src = &src[..bytes];
        poison(stream, &self.d, od - GUARD, bytes + 2 * GUARD)?;
        poison(stream, &self.d2, od2 - GUARD, bytes + 2 * GUARD)?;
        upload(stream, &mut self.a, os, src)?;
        let ps = addr(&self.a, stream) + os as u64;
        let (pd, pd2) = (addr(&self.d, stream) + od as u64, addr(&self.d2, stream) + od2 as u64);
        // SAFETY: as in `elem_case`.
        unsafe { self.k.copy_raw(stream, pd, two.then_some(pd2), ps, bytes)? };
        let label = format!("copy {} bytes={bytes} offs={offs:?}", if two { "Two" } else { "One" });
        let region = download(stream, &self.d, od - GUARD, bytes + 2 * GUARD)?;
        if let Some(e) = judge(&label, DataType::U8, false, &region, src, src, &[]) {
            return Ok(Some(e));
        }
        let region2 = download(stream, &self.d2, od2 - GUARD, bytes + 2 * GUARD)?;
        if two {
            return Ok(judge(&format!("{label} (second output)"), DataType::U8, false, &region2, src, src, &[]));
        }
        if region2.iter().any(|&x| x != POISON) {
            return Ok(Some(format!("{label}: wrote to the unused second output")));
        }
        Ok(None)
    }
}

/// Element offsets `[a, b, dst, dst2]`: all aligned; all one element in (the scalar head, then
/// 16-byte packs); all different (the element-by-element path).
const OFFSETS: [[usize; 4]; 3] = [[0, 0, 0, 0], [1, 1, 1, 1], [1, 2, 3, 5]];

/// Runs the whole check; `log` receives progress lines.
pub fn verify(k: &Kernels, stream: &Arc<CudaStream>, opt: &Options, log: &mut dyn FnMut(&str)) -> Result<Summary> {
    let mut sum = Summary::default();
    let record = |sum: &mut Summary, r: Option<String>| match r {
        None => sum.passed += 1,
        Some(e) => sum.failed.push(e),
    };
    let max_small = MID[1].max(*SMALL.iter().max().unwrap_or(&0));
    for dt in DataType::ALL {
        if !k.supports(dt) {
            log(&format!("{}: skipped, {}", dt.short_name(), k.unsupported(dt)));
            continue;
        }
        let t = Instant::now();
        let large = opt.large_bytes / dt.size();
        let cap_elems = large.max(max_small) + 16;
        let cap = cap_elems * dt.size() + BASE + 2 * GUARD + 64;
        let mut run = Runner::new(k, stream, cap, cap)?;
        let seed = opt.seed ^ (dt as u64) << 32;
        let a = data::random(dt, cap_elems, seed);
        let b = data::random(dt, cap_elems, seed ^ 0xb);
        let before = (sum.passed, sum.failed.len());
        for what in whats(dt) {
            for &count in &SMALL {
                for offs in OFFSETS {
                    for out in [Out::One, Out::Two, Out::InPlace] {
                        let r = run.elem_case(&what, out, count, offs, (&a, &b))?;
                        record(&mut sum, r);
                    }
                }
            }
            if opt.mid {
                for &count in &MID {
                    let r = run.elem_case(&what, Out::Two, count, [1, 1, 1, 1], (&a, &b))?;
                    record(&mut sum, r);
                }
            }
            if large > 0 {
                let r = run.elem_case(&what, Out::Two, large, [0, 0, 0, 0], (&a, &b))?;
                record(&mut sum, r);
            }
        }
        log(&format!(
            "{dt:>6}: {} cases passed, {} failed ({:.1} s)",
            sum.passed - before.0,
            sum.failed.len() - before.1,
            t.elapsed().as_secs_f64(),
            dt = dt.short_name()
        ));
    }

    // The copy kernel, in bytes, at each alignment class: 16-byte words, 4-byte words, bytes.
    let t = Instant::now();
    let large = opt.large_bytes;
    let cap = large.max(1 << 21) + BASE + 2 * GUARD + 64;
    let mut run = Runner::new(k, stream, cap, 64)?;
    let src = data::random(DataType::U8, cap, opt.seed ^ 0xc0);
    let before = (sum.passed, sum.failed.len());
    let mut sizes = vec![0usize, 1, 2, 3, 4, 5, 15, 16, 17, 31, 33, 63, 65, 4095, 4097, 65537];
    if opt.mid {
        sizes.extend([(1 << 20) + 3, (1 << 21) - 1]);
    }
    for bytes in sizes {
        for offs in [[0, 0, 0], [5, 5, 5], [4, 8, 12], [1, 2, 3], [3, 0, 0]] {
            for two in [false, true] {
                let r = run.copy_case(two, bytes, offs, &src)?;
                record(&mut sum, r);
            }
        }
    }
    if large > 0 {
        for offs in [[0, 0, 0], [1, 2, 3]] {
            let r = run.copy_case(true, large - 3, offs, &src)?;
            record(&mut sum, r);
        }
    }
    log(&format!(
        "  copy: {} cases passed, {} failed ({:.1} s)",
        sum.passed - before.0,
        sum.failed.len() - before.1,
        t.elapsed().as_secs_f64()
    ));
    Ok(sum)
}
