//! Deterministic contents for test and benchmark buffers, in any datatype, chosen so that
//! reductions over up to 8 ranks stay in range (no overflow to infinity, no wrap where the
//! reference cannot follow), and the f64 reference each check compares against.

use occl::dtype::{get_f64, set_f64};
use occl::{DataType, RedOp};

/// The value rank `rank` contributes at element `i` for `op`.
pub fn value(dt: DataType, op: RedOp, rank: usize, i: usize) -> f64 {
    let h = (i.wrapping_mul(2654435761) ^ rank.wrapping_mul(40503)) % 97;
    match op {
        // Products stay small: factors of 1 or 2 (and -1 for signed types); 8-bit integers get
        // a 2 only from the first four ranks, so no product leaves their range.
        RedOp::Prod => {
            let eight_bit = matches!(dt, DataType::I8 | DataType::U8);
            let f = if eight_bit && rank >= 4 { [1.0, -1.0, 1.0, 1.0][h % 4] } else { [1.0, 2.0, 1.0, -1.0][h % 4] };
            if f < 0.0 && !signed(dt) {
                1.0
            } else {
                f
            }
        }
        _ => {
            let span =
                if matches!(dt, DataType::F8E4M3 | DataType::F8E5M2 | DataType::I8 | DataType::U8) { 8 } else { 100 };
            let v = (h % span) as f64;
            if signed(dt) && h.is_multiple_of(3) {
                -v
            } else {
                v
            }
        }
    }
}

fn signed(dt: DataType) -> bool {
    !matches!(dt, DataType::U8 | DataType::U32 | DataType::U64)
}

/// Fills `buf` (count elements of `dt`) with rank `rank`'s values, starting at element `first`.
pub fn fill(dt: DataType, op: RedOp, rank: usize, first: usize, buf: &mut [u8]) {
    for i in 0..buf.len() / dt.size() {
        set_f64(dt, buf, i, value(dt, op, rank, first + i));
    }
}

/// The exact reduction of every rank's value at element `i`, in f64.
pub fn reduced(dt: DataType, op: RedOp, nranks: usize, i: usize) -> f64 {
    let vals = (0..nranks).map(|r| value(dt, op, r, i));
    match op {
        RedOp::Sum => vals.sum(),
        RedOp::Avg => {
            let s: f64 = vals.sum();
            if dt.is_float() {
                s / nranks as f64
            } else {
                (s / nranks as f64).trunc()
            }
        }
        RedOp::Prod => vals.product(),
        RedOp::Max => vals.fold(f64::MIN, f64::max),
        RedOp::Min => vals.fold(f64::MAX, f64::min),
    }
}

/// Allowed absolute error of a reduction over `nranks` values whose magnitudes add up to
/// `scale`: each of the n-1 steps rounds a partial sum to the type once.
pub fn tolerance(dt: DataType, nranks: usize, scale: f64) -> f64 {
    let eps = match dt {
        DataType::F64 => 2f64.powi(-52),
        DataType::F32 => 2f64.powi(-23),
        DataType::F16 => 2f64.powi(-10),
        DataType::Bf16 => 2f64.powi(-7),
        DataType::F8E4M3 => 2f64.powi(-3),
        DataType::F8E5M2 => 2f64.powi(-2),
        _ => return 0.0,
    };
    // Half an ulp per rounding, n rounds, plus the final Avg division.
    eps * 0.5 * (nranks + 1) as f64 * scale.max(1.0)
}

/// The sum of magnitudes of the values reduced at element `i` (what rounding error scales with).
pub fn scale(dt: DataType, op: RedOp, nranks: usize, i: usize) -> f64 {
    match op {
        RedOp::Sum | RedOp::Avg => (0..nranks).map(|r| value(dt, op, r, i).abs()).sum(),
        _ => reduced(dt, op, nranks, i).abs(),
    }
}

/// Counts elements of a reduction result that differ from the reference beyond tolerance;
/// element `k` of `buf` holds reduced element `first + k`.
pub fn wrong_reduced(dt: DataType, op: RedOp, nranks: usize, buf: &[u8], first: usize) -> usize {
    (0..buf.len() / dt.size())
        .filter(|&k| {
            let i = first + k;
            let (got, want) = (get_f64(dt, buf, k), reduced(dt, op, nranks, i));
            // A NaN result is wrong too: compare so that it fails.
            let ok = (got - want).abs() <= tolerance(dt, nranks, scale(dt, op, nranks, i));
            !ok
        })
        .count()
}

/// Counts elements of moved (not reduced) data that are not exactly `want(k)`. The reference
/// value is rounded to the type first, as the sender's buffer was.
pub fn wrong_exact(dt: DataType, buf: &[u8], want: impl Fn(usize) -> f64) -> usize {
    let mut one = [0u8; 8];
    (0..buf.len() / dt.size())
        .filter(|&k| {
            set_f64(dt, &mut one, 0, want(k));
            get_f64(dt, buf, k).to_bits() != get_f64(dt, &one, 0).to_bits()
        })
        .count()
}

/// An 8-byte-aligned zeroed byte buffer (every datatype's alignment).
pub fn aligned(bytes: usize) -> Vec<u64> {
    vec![0u64; bytes.div_ceil(8).max(1)]
}

/// The first `bytes` of an aligned buffer as bytes.
pub fn bytes_of(v: &[u64], bytes: usize) -> &[u8] {
    // SAFETY: u64 storage viewed as bytes; `bytes` is at most its size (checked by slicing).
    let all = unsafe { std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), v.len() * 8) };
    &all[..bytes]
}

pub fn bytes_of_mut(v: &mut [u64], bytes: usize) -> &mut [u8] {
    // SAFETY: as above.
    let all = unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr().cast::<u8>(), v.len() * 8) };
    &mut all[..bytes]
}
