//! 8-bit floats in the OCP FP8 formats, as CUDA's `__nv_fp8_e4m3` / `__nv_fp8_e5m2` and PyTorch's
//! `float8_e4m3fn` / `float8_e5m2`.
//!
//! Decoding is a lookup in a 256-entry table built at compile time (integer-only `const fn`, so
//! no float arithmetic is needed in const context). Encoding rounds to nearest, ties to even, with
//! branch-free-able integer code so that loops over it can vectorize: E4M3 saturates to ±448
//! (CUDA's `__NV_SATFINITE`; the format has no infinity), E5M2 overflows to ±inf as IEEE does.

use std::fmt;

/// OCP FP8 E4M3 ("fn"): 1 sign, 4 exponent (bias 7), 3 mantissa bits. No infinities; NaN is
/// S.1111.111; largest finite 448; smallest normal 2^-6; smallest subnormal 2^-9.
#[repr(transparent)]
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct F8E4M3(u8);

/// OCP FP8 E5M2: 1 sign, 5 exponent (bias 15), 2 mantissa bits; IEEE-like, with ±inf (0x7c/0xfc)
/// and NaNs (0x7d–0x7f); largest finite 57344; smallest subnormal 2^-16.
#[repr(transparent)]
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct F8E5M2(u8);

/// The f32 bit pattern of the 8-bit float `b` with `m` mantissa bits and exponent `bias`.
/// `ieee`: the top exponent holds inf/NaN (E5M2); otherwise only S.1111.111 is NaN (E4M3).
const fn decode(b: u8, m: u32, bias: i32, ieee: bool) -> u32 {
    let b = b as u32;
    let sign = (b >> 7) << 31;
    let emax = (1u32 << (7 - m)) - 1;
    let exp = (b >> m) & emax;
    let man = b & ((1 << m) - 1);
    if ieee && exp == emax {
        // inf, or a quiet NaN keeping the payload.
        return sign | 0x7f80_0000 | if man != 0 { 0x0040_0000 | (man << (23 - m)) } else { 0 };
    }
    if !ieee && exp == emax && man == (1 << m) - 1 {
        return sign | 0x7fc0_0000;
    }
    if exp == 0 {
        if man == 0 {
            return sign;
        }
        // Subnormal man * 2^(1-bias-m): normalize so the leading one sits at bit m.
        let (mut e, mut mm) = (1 - bias, man);
        while mm & (1 << m) == 0 {
            mm <<= 1;
            e -= 1;
        }
        return sign | (((e + 127) as u32) << 23) | ((mm & ((1 << m) - 1)) << (23 - m));
    }
    sign | (((exp as i32 - bias + 127) as u32) << 23) | (man << (23 - m))
}

const fn table(m: u32, bias: i32, ieee: bool) -> [u32; 256] {
    let mut t = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        t[i] = decode(i as u8, m, bias, ieee);
        i += 1;
    }
    t
}

static E4M3_TO_F32: [u32; 256] = table(3, 7, false);
static E5M2_TO_F32: [u32; 256] = table(2, 15, true);

/// Rounds the magnitude bits `a` of a finite or infinite (not NaN) f32 to the 8-bit code with `M`
/// mantissa bits and bias `B`, ties to even. Codes past the largest finite are returned as they
/// fall (infinity gives a large code); the caller clamps.
#[inline(always)]
fn round_abs<const M: u32, const B: u32>(a: u32) -> u32 {
    let min_normal = (127 + 1 - B) << 23;
    // Subnormal or zero: adding a number whose ulp is the 8-bit subnormal step makes the FPU's
    // round-to-nearest-even do the rounding; the integer difference is then the code.
    let magic = (127 - B + (23 - M) + 1) << 23;
    let sub = (f32::from_bits(a) + f32::from_bits(magic)).to_bits().wrapping_sub(magic);
    // Normal: rebias, add just under half an ulp plus the mantissa's low bit (ties to even), and
    // truncate; a carry out of the mantissa correctly bumps the exponent.
    let odd = (a >> (23 - M)) & 1;
    let norm = a.wrapping_sub((127 - B) << 23).wrapping_add((1 << (22 - M)) - 1 + odd) >> (23 - M);
    if a < min_normal {
        sub
    } else {
        norm
    }
}

impl F8E4M3 {
    /// 448.
    pub const MAX: F8E4M3 = F8E4M3(0x7e);
    /// 2^-6, the smallest positive normal value.
    pub const MIN_POSITIVE: F8E4M3 = F8E4M3(0x08);
    pub const NAN: F8E4M3 = F8E4M3(0x7f);

    pub const fn is_nan(self) -> bool {
        self.0 & 0x7f == 0x7f
    }
}

impl F8E5M2 {
    /// 57344.
    pub const MAX: F8E5M2 = F8E5M2(0x7b);
    /// 2^-14, the smallest positive normal value.
    pub const MIN_POSITIVE: F8E5M2 = F8E5M2(0x04);
    pub const INFINITY: F8E5M2 = F8E5M2(0x7c);
    pub const NEG_INFINITY: F8E5M2 = F8E5M2(0xfc);
    pub const NAN: F8E5M2 = F8E5M2(0x7e);

    pub const fn is_nan(self) -> bool {
        self.0 & 0x7f > 0x7c
    }
}

/// A format's bits, its conversions to and from f32 and f32's formatting. `from_f32` rounds the
/// magnitude with `round_abs::<M, BIAS>`, clamps it to the code `top` and gives the code `nan`
/// for a NaN, keeping the sign; `to_f32` reads `table`.
macro_rules! f8_format {
    ($t:ident, $table:ident, round_abs::<$m:literal, $bias:literal>, top: $top:literal, nan: $nan:literal,
     $(#[$from:meta])*) => {
        impl $t {
            pub const fn from_bits(bits: u8) -> Self {
                $t(bits)
            }

            pub const fn to_bits(self) -> u8 {
                self.0
            }

            $(#[$from])*
            #[inline]
            pub fn from_f32(x: f32) -> Self {
                let bits = x.to_bits();
                let sign = (bits >> 24) as u8 & 0x80;
                let a = bits & 0x7fff_ffff;
                let code = if a > 0x7f80_0000 { $nan } else { round_abs::<$m, $bias>(a).min($top) };
                $t(code as u8 | sign)
            }

            #[inline]
            pub fn to_f32(self) -> f32 {
                f32::from_bits($table[self.0 as usize])
            }
        }

        impl fmt::Debug for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Debug::fmt(&self.to_f32(), f)
            }
        }

        impl fmt::Display for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Display::fmt(&self.to_f32(), f)
            }
        }
    };
}

f8_format!(F8E4M3, E4M3_TO_F32, round_abs::<3, 7>, top: 0x7e, nan: 0x7f,
    /// Rounds to nearest even; magnitudes past 448 after rounding (and ±inf) saturate to ±448;
    /// NaN gives NaN with the sign kept.
);
f8_format!(F8E5M2, E5M2_TO_F32, round_abs::<2, 15>, top: 0x7c, nan: 0x7e,
    /// Rounds to nearest even; overflow gives ±inf (IEEE); NaN gives a quiet NaN, sign kept.
);

#[cfg(test)]
mod tests {
    use super::*;

    /// Brute-force nearest finite code (ties to the even code) for |x|, in f64; positive codes
    /// 0..=max increase with their value.
    fn nearest(x: f64, max: u8, to_f32: impl Fn(u8) -> f32) -> u8 {
        let mut best = 0u8;
        for c in 0..=max {
            let (d, db) = ((to_f32(c) as f64 - x).abs(), (to_f32(best) as f64 - x).abs());
            if d < db || (d == db && c % 2 == 0) {
                best = c;
            }
        }
        best
    }

    #[test]
    fn known_values() {
        let e4 = |b| F8E4M3::from_bits(b).to_f32();
        assert_eq!(e4(0x7e), 448.0);
        assert_eq!(e4(0xfe), -448.0);
        assert_eq!(e4(0x08), 2f32.powi(-6));
        assert_eq!(e4(0x01), 2f32.powi(-9));
        assert_eq!(e4(0x07), 7.0 * 2f32.powi(-9));
        assert_eq!(e4(0x38), 1.0);
        assert_eq!(e4(0x39), 1.125);
        assert_eq!(e4(0x80).to_bits(), 0x8000_0000);
        assert!(e4(0x7f).is_nan() && e4(0xff).is_nan() && e4(0xff).is_sign_negative());
        assert!(F8E4M3::from_bits(0xff).is_nan() && !F8E4M3::from_bits(0x7e).is_nan());
        let e5 = |b| F8E5M2::from_bits(b).to_f32();
        assert_eq!(e5(0x7b), 57344.0);
        assert_eq!(e5(0x7c), f32::INFINITY);
        assert_eq!(e5(0xfc), f32::NEG_INFINITY);
        assert_eq!(e5(0x01), 2f32.powi(-16));
        assert_eq!(e5(0x04), 2f32.powi(-14));
        assert_eq!(e5(0x3c), 1.0);
        for b in [0x7d, 0x7e, 0x7f, 0xfd, 0xfe, 0xff] {
            assert!(e5(b).is_nan() && F8E5M2::from_bits(b).is_nan(), "{b:#x}");
        }
        assert_eq!(format!("{}", F8E4M3::from_f32(1.5)), "1.5");
        assert_eq!(format!("{:?}", F8E5M2::from_f32(-2.0)), "-2.0");
    }

    #[test]
    fn e5m2_is_the_top_byte_of_f16() {
        for b in 0..=255u8 {
            let h = half::f16::from_bits((b as u16) << 8).to_f32();
            let v = F8E5M2::from_bits(b).to_f32();
            assert!(v.to_bits() == h.to_bits() || (v.is_nan() && h.is_nan()), "{b:#x}");
        }
    }

    #[test]
    fn round_trip_all_bit_patterns() {
        for b in 0..=255u8 {
            let v = F8E4M3::from_bits(b).to_f32();
            let r = F8E4M3::from_f32(v);
            if v.is_nan() {
                assert!(r.to_f32().is_nan() && r.to_bits() & 0x80 == b & 0x80, "e4m3 {b:#x}");
            } else {
                assert_eq!(r.to_bits(), b, "e4m3 {b:#x} = {v}");
            }
            let v = F8E5M2::from_bits(b).to_f32();
            let r = F8E5M2::from_f32(v);
            if v.is_nan() {
                assert!(r.to_f32().is_nan() && r.to_bits() & 0x80 == b & 0x80, "e5m2 {b:#x}");
            } else {
                assert_eq!(r.to_bits(), b, "e5m2 {b:#x} = {v}");
            }
        }
    }

    #[test]
    fn ties_to_even() {
        // e4m3: 1.0 = 0x38, 1.125 = 0x39, 1.25 = 0x3a.
        assert_eq!(F8E4M3::from_f32(1.0625).to_bits(), 0x38);
        assert_eq!(F8E4M3::from_f32(1.1875).to_bits(), 0x3a);
        assert_eq!(F8E4M3::from_f32(-1.0625).to_bits(), 0xb8);
        // Subnormal ties: 0.5 and 1.5 steps of 2^-9.
        assert_eq!(F8E4M3::from_f32(0.5 * 2f32.powi(-9)).to_bits(), 0x00);
        assert_eq!(F8E4M3::from_f32(1.5 * 2f32.powi(-9)).to_bits(), 0x02);
        assert_eq!(F8E4M3::from_f32(-0.5 * 2f32.powi(-9)).to_bits(), 0x80);
        // Just below the smallest normal rounds up into it.
        assert_eq!(F8E4M3::from_f32(7.75 * 2f32.powi(-9)).to_bits(), 0x08);
        // e5m2: 1.0 = 0x3c, 1.25 = 0x3d, 1.5 = 0x3e.
        assert_eq!(F8E5M2::from_f32(1.125).to_bits(), 0x3c);
        assert_eq!(F8E5M2::from_f32(1.375).to_bits(), 0x3e);
        assert_eq!(F8E5M2::from_f32(2.5 * 2f32.powi(-16)).to_bits(), 0x02);
        assert_eq!(F8E5M2::from_f32(3.5 * 2f32.powi(-16)).to_bits(), 0x04);
    }

    #[test]
    fn saturation_and_overflow() {
        let e4 = |x: f32| F8E4M3::from_f32(x).to_bits();
        assert_eq!(e4(448.0), 0x7e);
        assert_eq!(e4(449.0), 0x7e);
        assert_eq!(e4(464.0), 0x7e); // the tie with (non-existent) 480 goes to even 448 anyway
        assert_eq!(e4(465.0), 0x7e);
        assert_eq!(e4(1e30), 0x7e);
        assert_eq!(e4(f32::MAX), 0x7e);
        assert_eq!(e4(f32::INFINITY), 0x7e);
        assert_eq!(e4(f32::NEG_INFINITY), 0xfe);
        assert_eq!(e4(-1000.0), 0xfe);
        assert_eq!(e4(f32::NAN), 0x7f);
        assert_eq!(e4(-f32::NAN), 0xff);
        assert_eq!(e4(1e-30), 0x00);
        assert_eq!(e4(-1e-30), 0x80);
        let e5 = |x: f32| F8E5M2::from_f32(x).to_bits();
        assert_eq!(e5(57344.0), 0x7b);
        assert_eq!(e5(61439.0), 0x7b);
        assert_eq!(e5(61440.0), 0x7c); // tie between 57344 (odd) and 65536 (inf): to even, inf
        assert_eq!(e5(-61440.0), 0xfc);
        assert_eq!(e5(1e30), 0x7c);
        assert_eq!(e5(f32::MAX), 0x7c);
        assert_eq!(e5(f32::INFINITY), 0x7c);
        assert_eq!(e5(f32::NEG_INFINITY), 0xfc);
        assert!(F8E5M2::from_f32(f32::NAN).is_nan());
        assert_eq!(e5(-f32::NAN) & 0x80, 0x80);
        assert_eq!(e5(1e-30), 0x00);
    }

    /// The midpoint between adjacent finite values goes to the even code; a hair either side goes
    /// to the nearer one.
    fn midpoints(max: u8, to_f32: impl Fn(u8) -> f32, from_f32: impl Fn(f32) -> u8) {
        for c in 0..max {
            let (lo, hi) = (to_f32(c), to_f32(c + 1));
            let mid = (lo + hi) / 2.0; // exact: both have few mantissa bits
            assert_eq!((mid as f64) * 2.0, lo as f64 + hi as f64);
            let even = if c % 2 == 0 { c } else { c + 1 };
            for s in [0u8, 0x80] {
                let sg = if s == 0 { 1.0 } else { -1.0 };
                assert_eq!(from_f32(sg * mid), even | s, "mid of {c:#x},{:#x}", c + 1);
                let below = f32::from_bits(mid.to_bits() - 1);
                let above = f32::from_bits(mid.to_bits() + 1);
                assert_eq!(from_f32(sg * below), c | s, "below mid of {c:#x}");
                assert_eq!(from_f32(sg * above), (c + 1) | s, "above mid of {c:#x}");
            }
        }
    }

    #[test]
    fn midpoints_round_to_even() {
        midpoints(0x7e, |c| F8E4M3::from_bits(c).to_f32(), |x| F8E4M3::from_f32(x).to_bits());
        midpoints(0x7b, |c| F8E5M2::from_bits(c).to_f32(), |x| F8E5M2::from_f32(x).to_bits());
    }

    #[test]
    fn matches_brute_force_nearest() {
        let mut s = 0x9e37_79b9_7f4a_7c15u64;
        for i in 0..200_000 {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            // Magnitudes from 2^-20 to 2^20 (plus a few all-range patterns), either sign.
            let x = if i % 16 == 0 {
                f32::from_bits(s as u32)
            } else {
                let e = (s >> 32) % 41;
                f32::from_bits((((107 + e) as u32) << 23) | (s as u32 & 0x807f_ffff))
            };
            if x.is_nan() {
                continue;
            }
            let sign = if x.is_sign_negative() { 0x80 } else { 0 };
            let a = x.abs() as f64;
            let want4 = nearest(a, 0x7e, |c| F8E4M3::from_bits(c).to_f32()) | sign;
            assert_eq!(F8E4M3::from_f32(x).to_bits(), want4, "e4m3 of {x:e}");
            let want5 = if a >= 61440.0 { 0x7c } else { nearest(a, 0x7b, |c| F8E5M2::from_bits(c).to_f32()) } | sign;
            assert_eq!(F8E5M2::from_f32(x).to_bits(), want5, "e5m2 of {x:e}");
        }
    }
}
