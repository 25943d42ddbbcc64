//! The host reference of the kernels' arithmetic, written independently of the CUDA sources: what
//! every element of a reduction or scale must be, bit for bit, and the comparison that allows
//! only what IEEE leaves open (which NaN, and the sign of a zero picked by max/min).
//!
//! Semantics (as occl's host path): integers wrap and the average's division truncates; f16,
//! bf16 and the fp8 formats compute in f32 and round to nearest even after every step; E4M3
//! saturates at ±448, E5M2 overflows to ±inf; float max/min ignore a NaN operand.

use crate::dtype::{DataType, RedOp};
use crate::launch::{Reduce, Scale};
use half::{bf16, f16};

/// An element type as the reference sees it: stored bytes, a working type, the operations.
trait El: Copy {
    const SIZE: usize;
    type W: Copy;
    fn read(b: &[u8]) -> Self;
    fn write(self, b: &mut [u8]);
    fn ld(self) -> Self::W;
    fn st(w: Self::W) -> Self;
    fn op(op: RedOp, a: Self::W, b: Self::W) -> Self::W;
    fn div(w: Self::W, n: u32) -> Self::W;
    fn scale(w: Self::W, s: f64) -> Self::W;
}

macro_rules! int_el {
    ($($t:ty => |$a:ident, $n:ident| $div:expr),* $(,)?) => {$(
        impl El for $t {
            const SIZE: usize = std::mem::size_of::<$t>();
            type W = $t;
            fn read(b: &[u8]) -> $t { <$t>::from_le_bytes(b.try_into().unwrap_or_default()) }
            fn write(self, b: &mut [u8]) { b.copy_from_slice(&self.to_le_bytes()) }
            fn ld(self) -> $t { self }
            fn st(w: $t) -> $t { w }
            fn op(op: RedOp, a: $t, b: $t) -> $t {
                match op {
                    RedOp::Sum => a.wrapping_add(b),
                    RedOp::Prod => a.wrapping_mul(b),
                    RedOp::Max => a.max(b),
                    RedOp::Min => a.min(b),
                }
            }
            fn div($a: $t, $n: u32) -> $t { $div }
            fn scale(w: $t, _: f64) -> $t { w }
        }
    )*};
}

int_el!(
    i8 => |a, n| (i64::from(a) / i64::from(n)) as i8,
    u8 => |a, n| (i64::from(a) / i64::from(n)) as u8,
    i32 => |a, n| (i64::from(a) / i64::from(n)) as i32,
    u32 => |a, n| (i64::from(a) / i64::from(n)) as u32,
    i64 => |a, n| a / i64::from(n),
    u64 => |a, n| a / u64::from(n),
);

macro_rules! float_ops {
    ($w:ty) => {
        fn op(op: RedOp, a: $w, b: $w) -> $w {
            match op {
                RedOp::Sum => a + b,
                RedOp::Prod => a * b,
                RedOp::Max => a.max(b),
                RedOp::Min => a.min(b),
            }
        }
        fn div(w: $w, n: u32) -> $w {
            w / n as $w
        }
        fn scale(w: $w, s: f64) -> $w {
            w * s as $w
        }
    };
}

impl El for f32 {
    const SIZE: usize = 4;
    type W = f32;
    fn read(b: &[u8]) -> f32 {
        f32::from_le_bytes(b.try_into().unwrap_or_default())
    }
    fn write(self, b: &mut [u8]) {
        b.copy_from_slice(&self.to_le_bytes())
    }
    fn ld(self) -> f32 {
        self
    }
    fn st(w: f32) -> f32 {
        w
    }
    float_ops!(f32);
}

impl El for f64 {
    const SIZE: usize = 8;
    type W = f64;
    fn read(b: &[u8]) -> f64 {
        f64::from_le_bytes(b.try_into().unwrap_or_default())
    }
    fn write(self, b: &mut [u8]) {
        b.copy_from_slice(&self.to_le_bytes())
    }
    fn ld(self) -> f64 {
        self
    }
    fn st(w: f64) -> f64 {
        w
    }
    float_ops!(f64);
}

/// Small floats stored as bits and computed in f32.
macro_rules! f32w_el {
    ($name:ident, $bits:ty, |$x:ident| $ld:expr, |$w:ident| $st:expr) => {
        #[derive(Clone, Copy)]
        struct $name($bits);
        impl El for $name {
            const SIZE: usize = std::mem::size_of::<$bits>();
            type W = f32;
            fn read(b: &[u8]) -> $name {
                $name(<$bits>::from_le_bytes(b.try_into().unwrap_or_default()))
            }
            fn write(self, b: &mut [u8]) {
                b.copy_from_slice(&self.0.to_le_bytes())
            }
            fn ld(self) -> f32 {
                let $x = self.0;
                $ld
            }
            fn st($w: f32) -> $name {
                $name($st)
            }
            float_ops!(f32);
        }
    };
}

f32w_el!(H, u16, |x| f16::from_bits(x).to_f32(), |w| f16::from_f32(w).to_bits());
f32w_el!(B, u16, |x| bf16::from_bits(x).to_f32(), |w| bf16::from_f32(w).to_bits());
f32w_el!(E4, u8, |x| f8_decode(x, E4M3), |w| f8_encode(w, E4M3));
f32w_el!(E5, u8, |x| f8_decode(x, E5M2), |w| f8_encode(w, E5M2));

/// An 8-bit float format: mantissa bits, exponent bias, whether the top exponent holds inf/NaN
/// (E5M2, IEEE-like) or only S.1111.111 is NaN (E4M3), and the largest finite value.
#[derive(Clone, Copy)]
struct F8 {
    m: u32,
    bias: i32,
    ieee: bool,
    max: f64,
}

const E4M3: F8 = F8 { m: 3, bias: 7, ieee: false, max: 448.0 };
const E5M2: F8 = F8 { m: 2, bias: 15, ieee: true, max: 57344.0 };

fn pow2(e: i32) -> f64 {
    f64::powi(2.0, e)
}

/// The value of the 8-bit float `b`.
pub fn f8_decode_bits(b: u8, e4m3: bool) -> f32 {
    f8_decode(b, if e4m3 { E4M3 } else { E5M2 })
}

/// `x` rounded to the 8-bit float format, nearest even (E4M3 saturating, E5M2 to ±inf).
pub fn f8_encode_value(x: f32, e4m3: bool) -> u8 {
    f8_encode(x, if e4m3 { E4M3 } else { E5M2 })
}

fn f8_decode(b: u8, f: F8) -> f32 {
    let sign: f32 = if b & 0x80 != 0 { -1.0 } else { 1.0 };
    let emax = (1i32 << (7 - f.m)) - 1;
    let e = i32::from(b & 0x7f) >> f.m;
    let man = i32::from(b) & ((1 << f.m) - 1);
    if f.ieee && e == emax {
        return if man == 0 { sign * f32::INFINITY } else { f32::NAN };
    }
    if !f.ieee && e == emax && man == (1 << f.m) - 1 {
        return f32::NAN;
    }
    let v = if e == 0 {
        f64::from(man) * pow2(1 - f.bias - f.m as i32)
    } else {
        (1.0 + f64::from(man) / pow2(f.m as i32)) * pow2(e - f.bias)
    };
    sign * v as f32
}

fn f8_encode(x: f32, f: F8) -> u8 {
    let sign: u8 = if x.is_sign_negative() { 0x80 } else { 0 };
    if x.is_nan() {
        return sign | 0x7f;
    }
    let a = f64::from(x).abs();
    let min_exp = 1 - f.bias; // exponent of the smallest normal
    let binade = |v: f64| (((v.to_bits() >> 52) & 0x7ff) as i32 - 1023).max(min_exp);
    // Rounded to the quantum of a's binade (subnormals share the smallest normal's quantum);
    // exact: scaling by powers of two, and f32 values are normal f64 values.
    let r = if a == 0.0 || a.is_infinite() {
        a
    } else {
        let q = pow2(binade(a) - f.m as i32);
        (a / q).round_ties_even() * q
    };
    if r > f.max {
        // E4M3 saturates (no infinity); E5M2 rounds to infinity.
        return sign | if f.ieee { 0x7c } else { 0x7e };
    }
    if r == 0.0 {
        return sign;
    }
    let e = binade(r);
    let code = if r < pow2(min_exp) {
        (r / pow2(min_exp - f.m as i32)) as u32
    } else {
        (((e + f.bias) as u32) << f.m) | ((r / pow2(e - f.m as i32)) as u32 - (1 << f.m))
    };
    sign | code as u8
}

/// One element: `pre(a) op b` (or `pre(a)` alone), then divided; each step rounded.
fn one<E: El>(op: RedOp, pre: Option<f64>, div: Option<u32>, a: E, b: Option<E>) -> E {
    let mut x = a.ld();
    if let Some(s) = pre {
        x = E::st(E::scale(x, s)).ld();
    }
    let mut r = match b {
        Some(b) => E::st(E::op(op, x, b.ld())),
        None => E::st(x),
    };
    if let Some(n) = div {
        r = E::st(E::div(r.ld(), n));
    }
    r
}

fn run<E: El>(op: RedOp, pre: Option<f64>, div: Option<u32>, a: &[u8], b: Option<&[u8]>, out: &mut [u8]) {
    let s = E::SIZE;
    for (i, (o, x)) in out.chunks_exact_mut(s).zip(a.chunks_exact(s)).enumerate() {
        let y = b.map(|b| E::read(&b[i * s..(i + 1) * s]));
        one::<E>(op, pre, div, E::read(x), y).write(o);
    }
}

macro_rules! by_dtype {
    ($dt:expr, $f:ident($($a:expr),*)) => {
        match $dt {
            DataType::I8 => $f::<i8>($($a),*),
            DataType::U8 => $f::<u8>($($a),*),
            DataType::I32 => $f::<i32>($($a),*),
            DataType::U32 => $f::<u32>($($a),*),
            DataType::I64 => $f::<i64>($($a),*),
            DataType::U64 => $f::<u64>($($a),*),
            DataType::F16 => $f::<H>($($a),*),
            DataType::Bf16 => $f::<B>($($a),*),
            DataType::F32 => $f::<f32>($($a),*),
            DataType::F64 => $f::<f64>($($a),*),
            DataType::F8E4M3 => $f::<E4>($($a),*),
            DataType::F8E5M2 => $f::<E5>($($a),*),
        }
    };
}

/// `out = a op b` as the reduce kernel computes it (equal lengths, whole elements).
pub fn reduce(r: &Reduce, a: &[u8], b: &[u8], out: &mut [u8]) {
    by_dtype!(r.dtype, run(r.op, r.premul, r.postdiv, a, Some(b), out))
}

/// `out = a` scaled as the scale kernel computes it.
pub fn scale(sc: &Scale, a: &[u8], out: &mut [u8]) {
    by_dtype!(sc.dtype, run(RedOp::Sum, sc.premul, sc.postdiv, a, None, out))
}

/// Element `i` of a buffer of `dt` as f64 (for messages and comparisons).
pub fn value(dt: DataType, bytes: &[u8], i: usize) -> f64 {
    let s = dt.size();
    let b = &bytes[i * s..(i + 1) * s];
    match dt {
        DataType::I8 => f64::from(i8::read(b)),
        DataType::U8 => f64::from(u8::read(b)),
        DataType::I32 => f64::from(i32::read(b)),
        DataType::U32 => f64::from(u32::read(b)),
        DataType::I64 => i64::read(b) as f64,
        DataType::U64 => u64::read(b) as f64,
        DataType::F16 => f64::from(H::read(b).ld()),
        DataType::Bf16 => f64::from(B::read(b).ld()),
        DataType::F32 => f64::from(f32::read(b)),
        DataType::F64 => f64::read(b),
        DataType::F8E4M3 => f64::from(E4::read(b).ld()),
        DataType::F8E5M2 => f64::from(E5::read(b).ld()),
    }
}

/// Whether element `i` of `got` is the reference's: the same bits, or two NaNs, or — for max
/// and min, which IEEE lets pick either — two zeros.
pub fn same(dt: DataType, minmax: bool, got: &[u8], want: &[u8], i: usize) -> bool {
    let s = dt.size();
    if got[i * s..(i + 1) * s] == want[i * s..(i + 1) * s] {
        return true;
    }
    if !dt.is_float() {
        return false;
    }
    let (g, w) = (value(dt, got, i), value(dt, want, i));
    (g.is_nan() && w.is_nan()) || (minmax && g == 0.0 && w == 0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f8_values_are_the_ocp_formats() {
        for (b, v) in [(0x00, 0.0), (0x08, 0.015625), (0x01, 0.001953125), (0x7e, 448.0), (0x38, 1.0), (0xb8, -1.0)] {
            assert_eq!(f8_decode_bits(b, true), v as f32, "e4m3 {b:#x}");
        }
        assert!(f8_decode_bits(0x7f, true).is_nan() && f8_decode_bits(0xff, true).is_nan());
        assert_eq!(f8_decode_bits(0x78, true), 256.0, "0x78 is a number in E4M3, not infinity");
        for (b, v) in [(0x3c, 1.0), (0x7b, 57344.0), (0x01, 1.52587890625e-05), (0x04, 6.103515625e-05)] {
            assert_eq!(f8_decode_bits(b, false), v as f32, "e5m2 {b:#x}");
        }
        assert_eq!(f8_decode_bits(0x7c, false), f32::INFINITY);
        assert!(f8_decode_bits(0x7d, false).is_nan());
    }

    #[test]
    fn every_f8_code_survives_a_round_trip() {
        for e4m3 in [true, false] {
            for b in 0..=255u8 {
                let v = f8_decode_bits(b, e4m3);
                if !v.is_nan() {
                    assert_eq!(f8_encode_value(v, e4m3), b, "e4m3={e4m3} code {b:#x} = {v}");
                }
            }
        }
    }

    #[test]
    fn f8_rounding_ties_to_even_and_overflow() {
        // 1 + 1/16 is half way between E4M3's 1 and 1.125: ties to the even code, 1.
        assert_eq!(f8_encode_value(1.0625, true), 0x38);
        assert_eq!(f8_encode_value(1.0625001, true), 0x39);
        assert_eq!(f8_encode_value(1.1875, true), 0x3a, "1.1875 ties between 1.125 (odd) and 1.25");
        assert_eq!(f8_encode_value(464.0, true), 0x7e, "saturates");
        assert_eq!(f8_encode_value(f32::INFINITY, true), 0x7e);
        assert_eq!(f8_encode_value(-1e9, true), 0xfe);
        assert_eq!(f8_encode_value(61439.0, false), 0x7b, "below half an ulp past the max");
        assert_eq!(f8_encode_value(61440.0, false), 0x7c, "the tie goes to infinity (odd max)");
        assert_eq!(f8_encode_value(f32::NEG_INFINITY, false), 0xfc);
        // Subnormals: E4M3's quantum is 2^-9; half of it ties to zero.
        assert_eq!(f8_encode_value(0.0009765625, true), 0x00);
        assert_eq!(f8_encode_value(0.0029296875, true), 0x02, "1.5 quanta tie to 2");
        assert_eq!(f8_encode_value(-0.0, true), 0x80);
    }

    #[test]
    fn reductions_follow_the_stated_semantics() {
        let r = Reduce::new(DataType::I8, RedOp::Sum);
        let mut out = [0u8; 2];
        reduce(&r, &[100, 0x80], &[100, 0xff], &mut out);
        assert_eq!(out, [200, 0x7f], "wrapping: 100+100 = -56, -128-1 = 127");
        let avg = Reduce::avg_postdiv(DataType::I32, 3);
        let mut out = [0u8; 4];
        reduce(&avg, &(-7i32).to_le_bytes(), &0i32.to_le_bytes(), &mut out);
        assert_eq!(i32::from_le_bytes(out), -2, "truncates toward zero");

        let max = Reduce::new(DataType::F32, RedOp::Max);
        let mut out = [0u8; 4];
        reduce(&max, &f32::NAN.to_le_bytes(), &2.0f32.to_le_bytes(), &mut out);
        assert_eq!(f32::from_le_bytes(out), 2.0, "a NaN operand is ignored");

        // bf16: 1 + 2^-8 is a tie between 1 and 1 + 2^-7 and rounds to even, 1.
        let sum = Reduce::new(DataType::Bf16, RedOp::Sum);
        let mut out = [0u8; 2];
        reduce(&sum, &bf16::ONE.to_bits().to_le_bytes(), &bf16::from_f32(0.00390625).to_bits().to_le_bytes(), &mut out);
        assert_eq!(bf16::from_bits(u16::from_le_bytes(out)), bf16::ONE);

        // Premultiplied average rounds after the premultiplication.
        let pre = Reduce::avg_premul(DataType::F16, 3);
        let mut out = [0u8; 2];
        let one = f16::ONE.to_bits().to_le_bytes();
        reduce(&pre, &one, &f16::ZERO.to_bits().to_le_bytes(), &mut out);
        assert_eq!(f16::from_bits(u16::from_le_bytes(out)), f16::from_f32(1.0 / 3.0));

        let sc = Scale { dtype: DataType::U8, premul: None, postdiv: Some(4) };
        let mut out = [0u8; 1];
        scale(&sc, &[255], &mut out);
        assert_eq!(out, [63]);
    }

    #[test]
    fn comparison_allows_only_what_ieee_leaves_open() {
        let nan1 = f32::NAN.to_le_bytes();
        let nan2 = f32::from_bits(0xffc0_0001).to_le_bytes();
        assert!(same(DataType::F32, false, &nan1, &nan2, 0));
        let (pz, nz) = (0.0f32.to_le_bytes(), (-0.0f32).to_le_bytes());
        assert!(same(DataType::F32, true, &pz, &nz, 0));
        assert!(!same(DataType::F32, false, &pz, &nz, 0), "a sum's zero sign is determined");
        assert!(!same(DataType::F32, false, &1.0f32.to_le_bytes(), &1.0000001f32.to_le_bytes(), 0));
        assert!(!same(DataType::I32, true, &0i32.to_le_bytes(), &1i32.to_le_bytes(), 0));
    }
}
