//! Elementwise reduction kernels for the ring collectives, over byte buffers of one `DataType`.
//!
//! Each kernel is a plain zipped loop over typed slices, written once generically (`Kern` says how
//! an element loads into a working type, combines and stores back) and left to LLVM's
//! auto-vectorizer. Every loop is compiled twice: for the baseline target (SSE2 on x86_64) and with
//! AVX2+F16C enabled, picked at run time by a cached CPUID check. f16/bf16/f8 are computed in f32
//! and rounded back once, to nearest even. Conversions are branch-free bit manipulation so they
//! vectorize, except f16 on the AVX2 path, which converts 8 lanes at a time with F16C
//! (vcvtph2ps/vcvtps2ph); bf16 runs two lanes per u32. Both leave a short tail to the
//! element-wise loop. Float max/min are `f32::max`/`min` (IEEE maxNum: a NaN operand is
//! ignored), as NCCL's `fmaxf`. Nothing here allocates.

use crate::dtype::{bf16, f16, DataType, RedOp, F8E4M3, F8E5M2};
use std::mem::size_of;

/// An element type as the kernels see it.
///
/// # Safety
/// Implementors are plain data valid for every bit pattern, so byte buffers may be viewed as them.
unsafe trait Kern: Copy + 'static {
    type W: Copy;
    fn ld(self) -> Self::W;
    fn st(w: Self::W) -> Self;
    fn add(a: Self::W, b: Self::W) -> Self::W;
    fn mul(a: Self::W, b: Self::W) -> Self::W;
    fn max(a: Self::W, b: Self::W) -> Self::W;
    fn min(a: Self::W, b: Self::W) -> Self::W;
    /// `a / n`; truncating for integers.
    fn div(a: Self::W, n: usize) -> Self::W;
}

macro_rules! kern_int {
    ($($t:ty => |$a:ident, $n:ident| $div:expr),* $(,)?) => {$(
        // SAFETY: primitive integers are valid for every bit pattern.
        unsafe impl Kern for $t {
            type W = $t;
            #[inline(always)] fn ld(self) -> $t { self }
            #[inline(always)] fn st(w: $t) -> $t { w }
            #[inline(always)] fn add(a: $t, b: $t) -> $t { a.wrapping_add(b) }
            #[inline(always)] fn mul(a: $t, b: $t) -> $t { a.wrapping_mul(b) }
            #[inline(always)] fn max(a: $t, b: $t) -> $t { Ord::max(a, b) }
            #[inline(always)] fn min(a: $t, b: $t) -> $t { Ord::min(a, b) }
            #[inline(always)] fn div($a: $t, $n: usize) -> $t { $div }
        }
    )*};
}

// Narrow types divide in i64 so that an `n` past their range still truncates correctly.
kern_int!(
    i8 => |a, n| (a as i64 / n as i64) as i8,
    u8 => |a, n| (a as i64 / n as i64) as u8,
    i32 => |a, n| (a as i64 / n as i64) as i32,
    u32 => |a, n| (a as i64 / n as i64) as u32,
    i64 => |a, n| i64::try_from(n).map_or(0, |n| a / n),
    u64 => |a, n| a / n as u64,
);

macro_rules! kern_float {
    ($($t:ty: $w:ty, |$x:ident| $ld:expr, |$y:ident| $st:expr);* $(;)?) => {$(
        // SAFETY: floats and the repr(transparent) u16/u8 float types are valid for every bit pattern.
        unsafe impl Kern for $t {
            type W = $w;
            #[inline(always)] fn ld(self) -> $w { let $x = self; $ld }
            #[inline(always)] fn st($y: $w) -> $t { $st }
            #[inline(always)] fn add(a: $w, b: $w) -> $w { a + b }
            #[inline(always)] fn mul(a: $w, b: $w) -> $w { a * b }
            #[inline(always)] fn max(a: $w, b: $w) -> $w { a.max(b) }
            #[inline(always)] fn min(a: $w, b: $w) -> $w { a.min(b) }
            #[inline(always)] fn div(a: $w, n: usize) -> $w { a / n as $w }
        }
    )*};
}

kern_float!(
    f32: f32, |x| x, |w| w;
    f64: f64, |x| x, |w| w;
    f16: f32, |x| f16_to_f32(x.to_bits()), |w| f16::from_bits(f32_to_f16(w));
    bf16: f32, |x| f32::from_bits((x.to_bits() as u32) << 16), |w| bf16::from_bits(f32_to_bf16(w));
    F8E4M3: f32, |x| e4m3_to_f32(x.to_bits()), |w| F8E4M3::from_f32(w);
    F8E5M2: f32, |x| f16_to_f32((x.to_bits() as u16) << 8), |w| F8E5M2::from_f32(w);
);

/// As `F8E4M3::to_f32`, but computed rather than looked up, so that it vectorizes (a table
/// lookup becomes eight scalar loads per vector). E5M2 is the top byte of an f16.
#[inline(always)]
fn e4m3_to_f32(b: u8) -> f32 {
    let b = b as u32;
    let em = (b & 0x7f) << 20;
    let v = if em == 0x7f << 20 {
        f32::NAN
    } else if em < 0x08 << 20 {
        // Subnormal m * 2^-9, exactly: (2^-6 + m * 2^-9) - 2^-6.
        f32::from_bits(em + (121 << 23)) - f32::from_bits(121 << 23)
    } else {
        f32::from_bits(em + ((127 - 7) << 23))
    };
    f32::from_bits(v.to_bits() | ((b & 0x80) << 24))
}

/// f16 bits to f32, exactly; branch-free (selects) so that it vectorizes.
#[inline(always)]
fn f16_to_f32(h: u16) -> f32 {
    let h = h as u32;
    let em = (h & 0x7fff) << 13;
    let exp = em & (0x1f << 23);
    let v = if exp == 0x1f << 23 {
        f32::from_bits(em + ((255 - 31) << 23)) // inf/NaN: top exponent, payload kept
    } else if exp == 0 {
        // Zero/subnormal: m * 2^-24, computed exactly as (2^-14 + m * 2^-24) - 2^-14.
        f32::from_bits(em + (113 << 23)) - f32::from_bits(113 << 23)
    } else {
        f32::from_bits(em + ((127 - 15) << 23))
    };
    f32::from_bits(v.to_bits() | ((h & 0x8000) << 16))
}

/// f32 to f16 bits, nearest even (overflow to inf, NaN stays a quiet NaN); branch-free.
#[inline(always)]
fn f32_to_f16(f: f32) -> u16 {
    let x = f.to_bits();
    let a = x & 0x7fff_ffff;
    let o = if a >= (127 + 16) << 23 {
        if a > 0x7f80_0000 {
            0x7e00 | ((a >> 13) & 0x3ff)
        } else {
            0x7c00
        }
    } else if a < 113 << 23 {
        // Subnormal result: adding 0.5 (ulp 2^-24) lets the FPU round the 10 mantissa bits.
        (f32::from_bits(a) + 0.5).to_bits().wrapping_sub(126 << 23)
    } else {
        // Rebias, add just under half an ulp plus the low mantissa bit (ties to even), truncate.
        a.wrapping_sub((127 - 15) << 23).wrapping_add(0xfff + ((a >> 13) & 1)) >> 13
    };
    (o | ((x >> 16) & 0x8000)) as u16
}

/// f32 bits whose top half is `f` rounded to bf16: nearest even (overflow to inf), NaN quieted.
#[inline(always)]
fn bf16_round(f: f32) -> u32 {
    let x = f.to_bits();
    let r = x.wrapping_add(0x7fff + ((x >> 16) & 1));
    if f.is_nan() {
        x | 0x0040_0000
    } else {
        r
    }
}

#[inline(always)]
fn f32_to_bf16(f: f32) -> u16 {
    (bf16_round(f) >> 16) as u16
}

/// Two bf16 lanes in one u32, so that bf16 kernels run on 32-bit lanes throughout: widening is a
/// shift or a mask, narrowing a mask and an or, with no 32-to-16-bit packing shuffles (~1.3x
/// faster in cache than bf16 by bf16). packed(2): bf16 buffers are only 2-aligned. Either endianness
/// works, as each half is widened, reduced and rounded in place.
#[derive(Clone, Copy)]
#[repr(C, packed(2))]
struct B2(u32);

// SAFETY: 4 plain bytes, valid for every bit pattern.
unsafe impl Kern for B2 {
    type W = [f32; 2];
    #[inline(always)]
    fn ld(self) -> [f32; 2] {
        let w = self.0;
        [f32::from_bits(w << 16), f32::from_bits(w & 0xffff_0000)]
    }
    #[inline(always)]
    fn st(w: [f32; 2]) -> B2 {
        B2((bf16_round(w[1]) & 0xffff_0000) | (bf16_round(w[0]) >> 16))
    }
    #[inline(always)]
    fn add(a: [f32; 2], b: [f32; 2]) -> [f32; 2] {
        [a[0] + b[0], a[1] + b[1]]
    }
    #[inline(always)]
    fn mul(a: [f32; 2], b: [f32; 2]) -> [f32; 2] {
        [a[0] * b[0], a[1] * b[1]]
    }
    #[inline(always)]
    fn max(a: [f32; 2], b: [f32; 2]) -> [f32; 2] {
        [a[0].max(b[0]), a[1].max(b[1])]
    }
    #[inline(always)]
    fn min(a: [f32; 2], b: [f32; 2]) -> [f32; 2] {
        [a[0].min(b[0]), a[1].min(b[1])]
    }
    #[inline(always)]
    fn div(a: [f32; 2], n: usize) -> [f32; 2] {
        [a[0] / n as f32, a[1] / n as f32]
    }
}

/// Eight f16 lanes, converted with F16C. Only ever used on the AVX2+F16C path.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy)]
#[repr(transparent)]
struct H8([u16; 8]);

#[cfg(target_arch = "x86_64")]
mod h8 {
    use super::{Kern, H8};
    use std::arch::x86_64::*;
    use std::mem::transmute;

    // SAFETY: H8 is 16 plain bytes. Every method below runs AVX/F16C instructions: H8 is only
    // instantiated inside the `#[target_feature(enable = "avx2,f16c")]` wrappers, reached only
    // when the CPU has both, and these `inline(always)` bodies are compiled into them.
    unsafe impl Kern for H8 {
        type W = __m256;
        #[inline(always)]
        fn ld(self) -> __m256 {
            unsafe { _mm256_cvtph_ps(transmute::<[u16; 8], __m128i>(self.0)) }
        }
        #[inline(always)]
        fn st(w: __m256) -> H8 {
            H8(unsafe { transmute::<__m128i, [u16; 8]>(_mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(w)) })
        }
        #[inline(always)]
        fn add(a: __m256, b: __m256) -> __m256 {
            unsafe { _mm256_add_ps(a, b) }
        }
        #[inline(always)]
        fn mul(a: __m256, b: __m256) -> __m256 {
            unsafe { _mm256_mul_ps(a, b) }
        }
        // vmaxps/vminps return the second operand when either is NaN; the blend makes a NaN `b`
        // yield `a`, which gives f32::max/min's NaN-ignoring semantics.
        #[inline(always)]
        fn max(a: __m256, b: __m256) -> __m256 {
            unsafe { _mm256_blendv_ps(_mm256_max_ps(a, b), a, _mm256_cmp_ps::<_CMP_UNORD_Q>(b, b)) }
        }
        #[inline(always)]
        fn min(a: __m256, b: __m256) -> __m256 {
            unsafe { _mm256_blendv_ps(_mm256_min_ps(a, b), a, _mm256_cmp_ps::<_CMP_UNORD_Q>(b, b)) }
        }
        #[inline(always)]
        fn div(a: __m256, n: usize) -> __m256 {
            unsafe { _mm256_div_ps(a, _mm256_set1_ps(n as f32)) }
        }
    }
}

/// A reduction operator, as a type so that each (type, op) loop is monomorphized.
trait Op {
    fn ap<K: Kern>(a: K::W, b: K::W) -> K::W;
}
struct Sum;
struct Prod;
struct Max;
struct Min;
impl Op for Sum {
    #[inline(always)]
    fn ap<K: Kern>(a: K::W, b: K::W) -> K::W {
        K::add(a, b)
    }
}
impl Op for Prod {
    #[inline(always)]
    fn ap<K: Kern>(a: K::W, b: K::W) -> K::W {
        K::mul(a, b)
    }
}
impl Op for Max {
    #[inline(always)]
    fn ap<K: Kern>(a: K::W, b: K::W) -> K::W {
        K::max(a, b)
    }
}
impl Op for Min {
    #[inline(always)]
    fn ap<K: Kern>(a: K::W, b: K::W) -> K::W {
        K::min(a, b)
    }
}

// The loops. `inline(always)` so that each is compiled inside its caller's target features.
#[inline(always)]
fn k_reduce<K: Kern, O: Op>(d: &mut [K], a: &[K], b: &[K]) {
    for ((d, &x), &y) in d.iter_mut().zip(a).zip(b) {
        *d = K::st(O::ap::<K>(x.ld(), y.ld()));
    }
}

#[inline(always)]
fn k_in_place<K: Kern, O: Op>(d: &mut [K], s: &[K]) {
    for (d, &y) in d.iter_mut().zip(s) {
        *d = K::st(O::ap::<K>(d.ld(), y.ld()));
    }
}

#[inline(always)]
fn k_copy2<K: Kern, O: Op>(d1: &mut [K], d2: &mut [K], a: &[K], b: &[K]) {
    for (((d1, d2), &x), &y) in d1.iter_mut().zip(d2.iter_mut()).zip(a).zip(b) {
        let r = K::st(O::ap::<K>(x.ld(), y.ld()));
        *d1 = r;
        *d2 = r;
    }
}

#[inline(always)]
fn k_in_place_copy<K: Kern, O: Op>(d: &mut [K], d2: &mut [K], s: &[K]) {
    for ((d, d2), &y) in d.iter_mut().zip(d2.iter_mut()).zip(s) {
        let r = K::st(O::ap::<K>(d.ld(), y.ld()));
        *d = r;
        *d2 = r;
    }
}

#[inline(always)]
fn k_div<K: Kern>(buf: &mut [K], n: usize) {
    for x in buf.iter_mut() {
        *x = K::st(K::div(x.ld(), n));
    }
}

/// Whether the AVX2+F16C variants may run; CPUID is read once.
fn simd_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        static S: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *S.get_or_init(|| is_x86_feature_detected!("avx2") && is_x86_feature_detected!("f16c"))
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

fn view<K: Kern>(b: &[u8]) -> &[K] {
    // A hard check: it costs a compare per call and keeps the cast below sound in release builds.
    // (Sizes are powers of two.)
    assert!(b.as_ptr().cast::<K>().is_aligned() && b.len() & (size_of::<K>() - 1) == 0, "misaligned reduce buffer");
    // SAFETY: aligned for K, whole elements, and K is valid for every bit pattern (Kern's contract).
    unsafe { std::slice::from_raw_parts(b.as_ptr().cast(), b.len() / size_of::<K>()) }
}

fn view_mut<K: Kern>(b: &mut [u8]) -> &mut [K] {
    assert!(b.as_ptr().cast::<K>().is_aligned() && b.len() & (size_of::<K>() - 1) == 0, "misaligned reduce buffer");
    // SAFETY: as in `view`; the result borrows `b` exclusively, and any K written is valid bytes.
    unsafe { std::slice::from_raw_parts_mut(b.as_mut_ptr().cast(), b.len() / size_of::<K>()) }
}

/// Checks the callers' contract (equal lengths of whole elements, element-aligned); returns the
/// length in bytes.
#[inline]
fn check(dt: DataType, bufs: &[&[u8]]) -> usize {
    let len = bufs[0].len();
    let mask = dt.size() - 1; // sizes are powers of two
    debug_assert!(len & mask == 0, "reduce buffer of partial {dt} elements");
    for b in bufs {
        assert_eq!(b.len(), len, "reduce buffers differ in length");
        debug_assert!(len == 0 || b.as_ptr() as usize & mask == 0, "reduce buffer not aligned to {dt}");
    }
    len
}

/// `$f::<K>(args)` with K the kernel element type of `$dt`.
macro_rules! by_dtype {
    ($dt:expr, $f:ident($($a:expr),*)) => {
        match $dt {
            DataType::I8 => $f::<i8>($($a),*),
            DataType::U8 => $f::<u8>($($a),*),
            DataType::I32 => $f::<i32>($($a),*),
            DataType::U32 => $f::<u32>($($a),*),
            DataType::I64 => $f::<i64>($($a),*),
            DataType::U64 => $f::<u64>($($a),*),
            DataType::F16 => $f::<f16>($($a),*),
            DataType::F32 => $f::<f32>($($a),*),
            DataType::F64 => $f::<f64>($($a),*),
            DataType::Bf16 => $f::<bf16>($($a),*),
            DataType::F8E4M3 => $f::<F8E4M3>($($a),*),
            DataType::F8E5M2 => $f::<F8E5M2>($($a),*),
        }
    };
}

/// Stamps out a public entry point and its `$with(simd, ...)` twin (tests force either path):
/// contract check, f16 (AVX2 path) and bf16 split into wide blocks plus an element-wise tail,
/// dispatch on type and op, then the AVX2 or portable copy of loop `$kern`. `$m` are the output buffers, `$c` the inputs.
macro_rules! entry {
    ($(#[$doc:meta])* $name:ident, $with:ident => $kern:ident($($m:ident),+; $($c:ident),+)) => {
        $(#[$doc])*
        pub(crate) fn $name(dt: DataType, op: RedOp, $($m: &mut [u8],)+ $($c: &[u8],)+) {
            $with(simd_available(), dt, op, $($m,)+ $($c,)+)
        }

        fn $with(simd: bool, dt: DataType, op: RedOp, $($m: &mut [u8],)+ $($c: &[u8],)+) {
            fn run<K: Kern, O: Op>(simd: bool, $($m: &mut [K],)+ $($c: &[K],)+) {
                #[cfg(target_arch = "x86_64")]
                if simd {
                    #[target_feature(enable = "avx2,f16c")]
                    unsafe fn fast<K: Kern, O: Op>($($m: &mut [K],)+ $($c: &[K],)+) {
                        $kern::<K, O>($($m,)+ $($c,)+)
                    }
                    // SAFETY: `simd` is true only when the CPU has AVX2 and F16C.
                    return unsafe { fast::<K, O>($($m,)+ $($c,)+) };
                }
                let _ = simd;
                $kern::<K, O>($($m,)+ $($c,)+)
            }
            fn typed<K: Kern>(simd: bool, op: RedOp, $($m: &mut [u8],)+ $($c: &[u8],)+) {
                $(let $m = view_mut::<K>($m);)+
                $(let $c = view::<K>($c);)+
                match op {
                    RedOp::Sum | RedOp::Avg => run::<K, Sum>(simd, $($m,)+ $($c,)+),
                    RedOp::Prod => run::<K, Prod>(simd, $($m,)+ $($c,)+),
                    RedOp::Max => run::<K, Max>(simd, $($m,)+ $($c,)+),
                    RedOp::Min => run::<K, Min>(simd, $($m,)+ $($c,)+),
                }
            }
            let len = check(dt, &[$(&*$m,)+ $($c,)+]);
            if len == 0 {
                return; // an empty slice's pointer may be dangling, hence unaligned for K
            }
            #[cfg(target_arch = "x86_64")]
            if simd && dt == DataType::F16 {
                let k = len / 16 * 16;
                typed::<H8>(true, op, $(&mut $m[..k],)+ $(&$c[..k],)+);
                return typed::<f16>(true, op, $(&mut $m[k..],)+ $(&$c[k..],)+);
            }
            if dt == DataType::Bf16 {
                let k = len / 4 * 4;
                typed::<B2>(simd, op, $(&mut $m[..k],)+ $(&$c[..k],)+);
                return typed::<bf16>(simd, op, $(&mut $m[k..],)+ $(&$c[k..],)+);
            }
            by_dtype!(dt, typed(simd, op, $($m,)+ $($c),+))
        }
    };
}

entry!(
    /// dst[i] = a[i] op b[i]. dst is disjoint from a and b.
    reduce, reduce_with => k_reduce(dst; a, b)
);
entry!(
    /// dst[i] = dst[i] op src[i].
    reduce_in_place, reduce_in_place_with => k_in_place(dst; src)
);
entry!(
    /// dst1[i] = dst2[i] = a[i] op b[i]: a ring step whose result goes both to the user's buffer
    /// and to the next peer's slot, in one pass over memory. All four disjoint.
    reduce_copy2, reduce_copy2_with => k_copy2(dst1, dst2; a, b)
);
entry!(
    /// dst[i] = dst[i] op src[i]; dst2[i] = that result. dst, dst2, src disjoint.
    reduce_in_place_copy, reduce_in_place_copy_with => k_in_place_copy(dst, dst2; src)
);

/// buf[i] /= n: finishes RedOp::Avg (integers: truncating division; f16/bf16/f8: computed in f32
/// and rounded once).
pub(crate) fn div_in_place(dt: DataType, buf: &mut [u8], n: usize) {
    div_with(simd_available(), dt, buf, n)
}

fn div_with(simd: bool, dt: DataType, buf: &mut [u8], n: usize) {
    fn typed<K: Kern>(simd: bool, buf: &mut [u8], n: usize) {
        let buf = view_mut::<K>(buf);
        #[cfg(target_arch = "x86_64")]
        if simd {
            #[target_feature(enable = "avx2,f16c")]
            unsafe fn fast<K: Kern>(buf: &mut [K], n: usize) {
                k_div(buf, n)
            }
            // SAFETY: `simd` is true only when the CPU has AVX2 and F16C.
            return unsafe { fast(buf, n) };
        }
        let _ = simd;
        k_div(buf, n)
    }
    debug_assert!(n > 0);
    let len = check(dt, &[&*buf]);
    if len == 0 {
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if simd && dt == DataType::F16 {
        let k = len / 16 * 16;
        typed::<H8>(true, &mut buf[..k], n);
        return typed::<f16>(true, &mut buf[k..], n);
    }
    if dt == DataType::Bf16 {
        let k = len / 4 * 4;
        typed::<B2>(simd, &mut buf[..k], n);
        return typed::<bf16>(simd, &mut buf[k..], n);
    }
    by_dtype!(dt, typed(simd, buf, n))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::{get_f64, set_f64};

    /// Deterministic xorshift64.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
    }

    /// A byte buffer starting `off` bytes past an 8-aligned address (callers keep `off` a
    /// multiple of the element size), so that tests see unequal alignments across buffers.
    struct Buf(Vec<u64>, usize, usize);
    impl Buf {
        fn new(len: usize) -> Buf {
            Buf::at(len, 0)
        }
        fn at(len: usize, off: usize) -> Buf {
            Buf(vec![0; (len + off) / 8 + 2], off, len)
        }
        fn from(b: &[u8]) -> Buf {
            Buf::from_at(b, 0)
        }
        fn from_at(b: &[u8], off: usize) -> Buf {
            let mut x = Buf::at(b.len(), off);
            x.bytes().copy_from_slice(b);
            x
        }
        fn bytes(&mut self) -> &mut [u8] {
            &mut crate::dtype::as_bytes_mut(&mut self.0[..])[self.1..self.1 + self.2]
        }
    }

    /// `n` random elements: full-range bits for integers; for floats ±(1..2)·2^e with e in
    /// [-10, 6], so that sums and products stay finite (e4m3 products may saturate, as they should).
    fn random(rng: &mut Rng, dt: DataType, n: usize) -> Vec<u8> {
        let mut b = vec![0u8; n * dt.size()];
        for i in 0..n {
            let r = rng.next();
            if dt.is_float() {
                let m = 1.0 + (r >> 11) as f64 / (1u64 << 53) as f64;
                let v = m * 2f64.powi((r % 17) as i32 - 10) * if r & 1 << 5 == 0 { 1.0 } else { -1.0 };
                set_f64(dt, &mut b, i, v);
            } else {
                b[i * dt.size()..(i + 1) * dt.size()].copy_from_slice(&r.to_ne_bytes()[..dt.size()]);
            }
        }
        b
    }

    fn get_int(dt: DataType, b: &[u8], i: usize) -> i128 {
        let s = dt.size();
        let mut x = [0u8; 8];
        x[..s].copy_from_slice(&b[i * s..(i + 1) * s]);
        let u = u64::from_ne_bytes(x);
        match dt {
            DataType::I8 => u as i8 as i128,
            DataType::I32 => u as i32 as i128,
            DataType::I64 => u as i64 as i128,
            _ => u as i128,
        }
    }

    fn set_int(dt: DataType, b: &mut [u8], i: usize, v: i128) {
        let s = dt.size();
        b[i * s..(i + 1) * s].copy_from_slice(&(v as u64).to_ne_bytes()[..s]);
    }

    /// Scalar reference: integers exactly in i128 then truncated (= wrapping); floats in f64 then
    /// rounded once to the type (equal to computing in f32 and rounding: f32 has ≥ 2p+2 bits).
    fn reference(dt: DataType, op: RedOp, a: &[u8], b: &[u8]) -> Vec<u8> {
        let mut out = vec![0u8; a.len()];
        for i in 0..a.len() / dt.size() {
            if dt.is_float() {
                let (x, y) = (get_f64(dt, a, i), get_f64(dt, b, i));
                let r = match op {
                    RedOp::Sum | RedOp::Avg => x + y,
                    RedOp::Prod => x * y,
                    RedOp::Max => x.max(y),
                    RedOp::Min => x.min(y),
                };
                set_f64(dt, &mut out, i, r);
            } else {
                let (x, y) = (get_int(dt, a, i), get_int(dt, b, i));
                let r = match op {
                    RedOp::Sum | RedOp::Avg => x.wrapping_add(y),
                    RedOp::Prod => x.wrapping_mul(y),
                    RedOp::Max => x.max(y),
                    RedOp::Min => x.min(y),
                };
                set_int(dt, &mut out, i, r);
            }
        }
        out
    }

    fn reference_div(dt: DataType, a: &[u8], n: usize) -> Vec<u8> {
        let mut out = a.to_vec();
        for i in 0..a.len() / dt.size() {
            if dt.is_float() {
                set_f64(dt, &mut out, i, get_f64(dt, a, i) / n as f64);
            } else {
                set_int(dt, &mut out, i, get_int(dt, a, i) / n as i128);
            }
        }
        out
    }

    /// Integers bit-exact; floats equal as values (±0 alike) or both NaN.
    fn assert_same(dt: DataType, got: &[u8], want: &[u8], what: &str) {
        assert_eq!(got.len(), want.len());
        for i in 0..got.len() / dt.size() {
            let (g, w) = (get_f64(dt, got, i), get_f64(dt, want, i));
            let ok = if dt.is_float() {
                g == w || (g.is_nan() && w.is_nan())
            } else {
                get_int(dt, got, i) == get_int(dt, want, i)
            };
            assert!(ok, "{what}: element {i}: got {g}, want {w}");
        }
    }

    /// The four reduce entry points and div, each run on fresh copies of `a`, `b`; every output
    /// buffer is returned (they must all equal the reference). With `shift`, the buffers start
    /// 0, 1, 2, 3 elements past 8-aligned addresses.
    fn run_all(
        simd: bool,
        dt: DataType,
        op: RedOp,
        a: &[u8],
        b: &[u8],
        n: usize,
        shift: bool,
    ) -> Vec<(&'static str, Vec<u8>)> {
        let (len, o) = (a.len(), if shift { dt.size() } else { 0 });
        let (mut ab, mut bb) = (Buf::from_at(a, 0), Buf::from_at(b, o));
        let (mut d1, mut d2) = (Buf::at(len, 2 * o), Buf::at(len, 3 * o));
        let mut out = Vec::new();
        reduce_with(simd, dt, op, d1.bytes(), ab.bytes(), bb.bytes());
        out.push(("reduce", d1.bytes().to_vec()));
        let mut d = Buf::from_at(a, 2 * o);
        reduce_in_place_with(simd, dt, op, d.bytes(), bb.bytes());
        out.push(("reduce_in_place", d.bytes().to_vec()));
        reduce_copy2_with(simd, dt, op, d1.bytes(), d2.bytes(), ab.bytes(), bb.bytes());
        out.push(("reduce_copy2.dst1", d1.bytes().to_vec()));
        out.push(("reduce_copy2.dst2", d2.bytes().to_vec()));
        let (mut d, mut d2) = (Buf::from_at(a, 2 * o), Buf::at(len, 3 * o));
        reduce_in_place_copy_with(simd, dt, op, d.bytes(), d2.bytes(), bb.bytes());
        out.push(("reduce_in_place_copy.dst", d.bytes().to_vec()));
        out.push(("reduce_in_place_copy.dst2", d2.bytes().to_vec()));
        let mut d = Buf::from_at(a, o);
        div_with(simd, dt, d.bytes(), n);
        out.push(("div_in_place", d.bytes().to_vec()));
        out
    }

    fn paths() -> Vec<bool> {
        if simd_available() {
            vec![false, true]
        } else {
            eprintln!("no AVX2+F16C: testing the portable path only");
            vec![false]
        }
    }

    #[test]
    fn all_types_ops_lengths_against_reference() {
        let mut rng = Rng(0x2545_f491_4f6c_dd1d);
        let lens: Vec<usize> = (0..=67).chain([4099]).collect();
        for simd in paths() {
            for dt in DataType::ALL {
                for op in RedOp::ALL {
                    for &n in &lens {
                        let (a, b) = (random(&mut rng, dt, n), random(&mut rng, dt, n));
                        let ranks = [1, 3, 7, 8, 300][n % 5];
                        let want = reference(dt, op, &a, &b);
                        let want_div = reference_div(dt, &a, ranks);
                        for shift in [false, true] {
                            for (what, got) in run_all(simd, dt, op, &a, &b, ranks, shift) {
                                let w = if what == "div_in_place" { &want_div } else { &want };
                                let ctx = format!("{what} {dt} {op} len {n} simd {simd} n {ranks} shift {shift}");
                                assert_same(dt, &got, w, &ctx);
                            }
                        }
                    }
                }
            }
        }
    }

    /// Through the public entry points: empty slices (whose pointers may be dangling, e.g. 0x1)
    /// are a no-op, not a misalignment panic.
    #[test]
    fn empty_buffers() {
        for dt in DataType::ALL {
            for op in RedOp::ALL {
                let (mut d, mut d2): (Vec<u8>, Vec<u8>) = (Vec::new(), Vec::new());
                reduce(dt, op, &mut d, &[], &[]);
                reduce_in_place(dt, op, &mut d, &[]);
                reduce_copy2(dt, op, &mut d, &mut d2, &[], &[]);
                reduce_in_place_copy(dt, op, &mut d, &mut d2, &[]);
                div_in_place(dt, &mut d, 2);
            }
        }
    }

    /// Specials (±0, ±inf, NaN, subnormals, extremes): both paths agree with each other, and
    /// with the reference where it is defined elementwise the same way.
    #[test]
    fn specials_agree_across_paths() {
        let vals = [
            0.0,
            -0.0,
            f64::INFINITY,
            f64::NEG_INFINITY,
            f64::NAN,
            1e-7,
            -3e-8,
            6e-5,
            65504.0,
            65520.0,
            -1e38,
            3.4e38,
            448.0,
            464.0,
            57344.0,
            61440.0,
            1.0,
            -2.5,
            1e-40,
        ];
        for dt in DataType::ALL.into_iter().filter(|d| d.is_float()) {
            let n = vals.len() * vals.len();
            let (mut a, mut b) = (vec![0u8; n * dt.size()], vec![0u8; n * dt.size()]);
            for i in 0..n {
                set_f64(dt, &mut a, i, vals[i / vals.len()]);
                set_f64(dt, &mut b, i, vals[i % vals.len()]);
            }
            for op in RedOp::ALL {
                let want = reference(dt, op, &a, &b);
                let portable = run_all(false, dt, op, &a, &b, 3, false);
                let fast = run_all(simd_available(), dt, op, &a, &b, 3, true);
                for ((what, p), (_, f)) in portable.iter().zip(&fast) {
                    let ctx = format!("{what} {dt} {op}");
                    assert_same(dt, f, p, &ctx);
                    if *what != "div_in_place" {
                        assert_same(dt, p, &want, &ctx);
                    }
                }
            }
        }
    }

    #[test]
    fn conversions_match_half_and_f8() {
        for h in 0..=u16::MAX {
            let (g, w) = (f16_to_f32(h), f16::from_bits(h).to_f32());
            assert!(g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()), "{h:#x}");
            if !w.is_nan() {
                assert_eq!(f32_to_f16(w), h);
            }
        }
        for b in 0..=u8::MAX {
            assert_eq!(e4m3_to_f32(b).to_bits(), F8E4M3::from_bits(b).to_f32().to_bits(), "{b:#x}");
            let (g, w) = (f16_to_f32((b as u16) << 8), F8E5M2::from_bits(b).to_f32());
            assert!(g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()), "{b:#x}");
        }
        let mut rng = Rng(77);
        for i in 0..1_000_000u32 {
            let r = rng.next() as u32;
            // Half the samples concentrate on f16's range (exponents 100..=145), all rounding bits.
            let x = f32::from_bits(if i % 2 == 0 { r } else { (r & 0x807f_ffff) | ((100 + (r >> 8) % 46) << 23) });
            let (h, b) = (f16::from_f32(x), bf16::from_f32(x));
            let ok = |g: u16, w: u16, nan: bool| g == w || nan;
            assert!(ok(f32_to_f16(x), h.to_bits(), h.is_nan() && f16::from_bits(f32_to_f16(x)).is_nan()), "{x:e}");
            assert!(ok(f32_to_bf16(x), b.to_bits(), b.is_nan() && bf16::from_bits(f32_to_bf16(x)).is_nan()), "{x:e}");
        }
    }

    /// By hand: `cargo test --release -p occl --lib reduce::tests::bench -- --ignored --nocapture`.
    /// Prints GB/s of output at 64 MiB (memory-bound; a plain copy is shown for scale) and at
    /// 256 KiB (cache-resident: what the kernels themselves can do).
    #[test]
    #[ignore]
    fn bench() {
        use std::time::Instant;
        const MAX: usize = 64 << 20;
        let mut rng = Rng(1);
        let mut a = Buf::new(MAX);
        // 0x3c00 halves keep f16/bf16/f32 lanes finite and ordinary.
        a.0.iter_mut().for_each(|x| *x = (rng.next() & 0x00ff_00ff_00ff_00ff) | 0x3c00_3c00_3c00_3c00);
        let mut b = Buf::from(a.bytes());
        b.0.iter_mut().for_each(|x| *x ^= 0x0001_0001_0001_0001);
        let (mut d, mut d2) = (Buf::from(a.bytes()), Buf::from(a.bytes()));
        for bytes in [MAX, 256 << 10] {
            let (a, b, d, d2) =
                (&a.bytes()[..bytes], &b.bytes()[..bytes], &mut d.bytes()[..bytes], &mut d2.bytes()[..bytes]);
            let mut time = |name: &str, f: &mut dyn FnMut(&mut [u8], &mut [u8])| {
                f(d, d2);
                let iters = (1 << 30) / bytes;
                let t = Instant::now();
                for _ in 0..iters {
                    f(d, d2);
                }
                let s = t.elapsed().as_secs_f64() / iters as f64;
                println!("{:>5} KiB {name:<34} {:6.2} GB/s of output", bytes >> 10, bytes as f64 / s / 1e9);
            };
            time("copy_from_slice (for scale)", &mut |d, _| d.copy_from_slice(a));
            for simd in paths() {
                let p = if simd { "avx2" } else { "portable" };
                for dt in [DataType::F32, DataType::F16, DataType::Bf16, DataType::F64, DataType::I32, DataType::F8E4M3]
                {
                    time(&format!("reduce {dt} sum {p}"), &mut |d, _| reduce_with(simd, dt, RedOp::Sum, d, a, b));
                }
                let f = DataType::F32;
                time(&format!("reduce float max {p}"), &mut |d, _| reduce_with(simd, f, RedOp::Max, d, a, b));
                time(&format!("reduce_in_place float sum {p}"), &mut |d, _| {
                    reduce_in_place_with(simd, f, RedOp::Sum, d, a)
                });
                time(&format!("reduce_copy2 float sum {p}"), &mut |d, d2| {
                    reduce_copy2_with(simd, f, RedOp::Sum, d, d2, a, b)
                });
                time(&format!("div_in_place float {p}"), &mut |d, _| div_with(simd, f, d, 4));
            }
        }
    }
}
