//! Element arithmetic on occl's datatypes (the vocabulary enums are `occl-types`'): the
//! [`Element`] types, reading and writing an element of a byte buffer, the pre-multiply.

mod f8;

pub use f8::{F8E4M3, F8E5M2};
pub use half::{bf16, f16};
pub use occl_types::{DataType, RedOp};

/// A plain-old-data element type that occl can move and reduce.
///
/// # Safety
/// Implementors must be `repr(transparent)` or primitive types without padding, valid for every
/// bit pattern, with size `DTYPE.size()` and alignment no greater than their size.
pub unsafe trait Element: Copy + Send + Sync + 'static {
    const DTYPE: DataType;
}

macro_rules! element {
    ($($t:ty => $d:ident),* $(,)?) => {
        $(unsafe impl Element for $t { const DTYPE: DataType = DataType::$d; })*
    };
}

element!(
    i8 => I8, u8 => U8, i32 => I32, u32 => U32, i64 => I64, u64 => U64,
    f16 => F16, f32 => F32, f64 => F64, bf16 => Bf16, F8E4M3 => F8E4M3, F8E5M2 => F8E5M2,
);

/// Views a mutable slice of elements as bytes.
#[cfg(test)]
pub(crate) fn as_bytes_mut<T: Element>(s: &mut [T]) -> &mut [u8] {
    // SAFETY: as above, and every bit pattern is a valid element, so any byte write is sound.
    unsafe { std::slice::from_raw_parts_mut(s.as_mut_ptr().cast(), std::mem::size_of_val(s)) }
}

/// Reads element `i` of a byte buffer of `dt` as f64 (for checks and references; not a hot path).
pub fn get_f64(dt: DataType, bytes: &[u8], i: usize) -> f64 {
    let s = dt.size();
    let b = &bytes[i * s..(i + 1) * s];
    match dt {
        DataType::I8 => b[0] as i8 as f64,
        DataType::U8 => b[0] as f64,
        DataType::I32 => i32::from_ne_bytes([b[0], b[1], b[2], b[3]]) as f64,
        DataType::U32 => u32::from_ne_bytes([b[0], b[1], b[2], b[3]]) as f64,
        DataType::I64 => i64::from_ne_bytes(b.try_into().unwrap_or([0; 8])) as f64,
        DataType::U64 => u64::from_ne_bytes(b.try_into().unwrap_or([0; 8])) as f64,
        DataType::F16 => f16::from_bits(u16::from_ne_bytes([b[0], b[1]])).to_f64(),
        DataType::Bf16 => bf16::from_bits(u16::from_ne_bytes([b[0], b[1]])).to_f64(),
        DataType::F32 => f32::from_ne_bytes([b[0], b[1], b[2], b[3]]) as f64,
        DataType::F64 => f64::from_ne_bytes(b.try_into().unwrap_or([0; 8])),
        DataType::F8E4M3 => F8E4M3::from_bits(b[0]).to_f32() as f64,
        DataType::F8E5M2 => F8E5M2::from_bits(b[0]).to_f32() as f64,
    }
}

/// Writes `v` (converted, rounded to nearest) as element `i` of a byte buffer of `dt`.
pub fn set_f64(dt: DataType, bytes: &mut [u8], i: usize, v: f64) {
    let s = dt.size();
    let b = &mut bytes[i * s..(i + 1) * s];
    match dt {
        DataType::I8 => b[0] = v as i8 as u8,
        DataType::U8 => b[0] = v as u8,
        DataType::I32 => b.copy_from_slice(&(v as i32).to_ne_bytes()),
        DataType::U32 => b.copy_from_slice(&(v as u32).to_ne_bytes()),
        DataType::I64 => b.copy_from_slice(&(v as i64).to_ne_bytes()),
        DataType::U64 => b.copy_from_slice(&(v as u64).to_ne_bytes()),
        DataType::F16 => b.copy_from_slice(&f16::from_f64(v).to_bits().to_ne_bytes()),
        DataType::Bf16 => b.copy_from_slice(&bf16::from_f64(v).to_bits().to_ne_bytes()),
        DataType::F32 => b.copy_from_slice(&(v as f32).to_ne_bytes()),
        DataType::F64 => b.copy_from_slice(&v.to_ne_bytes()),
        DataType::F8E4M3 => b[0] = F8E4M3::from_f32(v as f32).to_bits(),
        DataType::F8E5M2 => b[0] = F8E5M2::from_f32(v as f32).to_bits(),
    }
}

/// Multiplies every element of `data` (whole elements of `dt`) in place by `scalar` (one
/// element's bytes): the first step of a pre-multiply sum run on host memory. Integers wrap;
/// floats round once to `dt`, as the device kernels do (the product of two half or 8-bit floats
/// is exact in f64, so computing it there and rounding once is the correctly rounded product).
pub fn premultiply(dt: DataType, data: &mut [u8], scalar: &[u8]) -> crate::Result<()> {
    let size = dt.size();
    if scalar.len() != size || !data.len().is_multiple_of(size) {
        return Err(crate::Error::arg(format!(
            "a pre-multiply of {} bytes by a {}-byte scalar: {dt} elements have {size}",
            data.len(),
            scalar.len()
        )));
    }
    macro_rules! each {
        ($t:ty, |$x:ident, $s:ident| $e:expr) => {{
            let $s = <$t>::from_ne_bytes(scalar.try_into().map_err(|_| crate::Error::internal("scalar size"))?);
            for d in data.chunks_exact_mut(size) {
                let $x = <$t>::from_ne_bytes((&*d).try_into().map_err(|_| crate::Error::internal("element size"))?);
                d.copy_from_slice(&$e.to_ne_bytes());
            }
        }};
    }
    match dt {
        DataType::I8 => each!(i8, |x, s| x.wrapping_mul(s)),
        DataType::U8 => each!(u8, |x, s| x.wrapping_mul(s)),
        DataType::I32 => each!(i32, |x, s| x.wrapping_mul(s)),
        DataType::U32 => each!(u32, |x, s| x.wrapping_mul(s)),
        DataType::I64 => each!(i64, |x, s| x.wrapping_mul(s)),
        DataType::U64 => each!(u64, |x, s| x.wrapping_mul(s)),
        DataType::F32 => each!(f32, |x, s| x * s),
        DataType::F64 => each!(f64, |x, s| x * s),
        DataType::F16 | DataType::Bf16 | DataType::F8E4M3 | DataType::F8E5M2 => {
            let s = get_f64(dt, scalar, 0);
            for i in 0..data.len() / size {
                let x = get_f64(dt, data, i);
                set_f64(dt, data, i, x * s);
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn premultiply_wraps_integers_and_rounds_floats_once() {
        let mut v: Vec<u8> = [100i8, -3, 0].iter().map(|x| *x as u8).collect();
        premultiply(DataType::I8, &mut v, &[3]).unwrap();
        assert_eq!(v.iter().map(|x| *x as i8).collect::<Vec<_>>(), [44, -9, 0], "300 wraps to 44");
        let mut v: Vec<u8> = [u64::MAX, 2].iter().flat_map(|x| x.to_ne_bytes()).collect();
        premultiply(DataType::U64, &mut v, &2u64.to_ne_bytes()).unwrap();
        assert_eq!(u64::from_ne_bytes(v[..8].try_into().unwrap()), u64::MAX - 1);
        assert_eq!(u64::from_ne_bytes(v[8..].try_into().unwrap()), 4);
        let mut v: Vec<u8> = [1.5f32, -2.0].iter().flat_map(|x| x.to_ne_bytes()).collect();
        premultiply(DataType::F32, &mut v, &0.5f32.to_ne_bytes()).unwrap();
        assert_eq!(get_f64(DataType::F32, &v, 0), 0.75);
        assert_eq!(get_f64(DataType::F32, &v, 1), -1.0);
        // bf16: 1 + 2^-7 times 1 + 2^-7 is 1 + 2^-6 + 2^-14, rounded once to 1 + 2^-6.
        let x = bf16::from_f64(1.0 + 2f64.powi(-7)).to_bits().to_ne_bytes();
        let mut v = x.to_vec();
        premultiply(DataType::Bf16, &mut v, &x).unwrap();
        assert_eq!(get_f64(DataType::Bf16, &v, 0), 1.0 + 2f64.powi(-6));
        let mut v = vec![0u8; 6];
        let e = premultiply(DataType::F32, &mut v, &[0; 4]).unwrap_err();
        assert!(e.to_string().contains("6 bytes by a 4-byte scalar"), "{e}");
        assert!(premultiply(DataType::F16, &mut [0; 4], &[0; 4]).is_err());
    }
}
