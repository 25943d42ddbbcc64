//! Test inputs and the host-side parallel loops of the GPU check: random elements of every type,
//! the reference and the comparison run on all cores (256 MiB buffers are checked in full).

use crate::dtype::DataType;
use crate::reference;
use half::{bf16, f16};

/// splitmix64: small, fast, and good enough to draw test inputs.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

/// One random float: mostly ±[1,2)·2^[-4,4) (sums, products and averages that stay in range,
/// with real rounding), and one in eight random bits (subnormals, huge values, infinities, NaNs).
fn float_value(r: &mut Rng) -> Option<f64> {
    let x = r.next_u64();
    if x & 7 == 0 {
        return None;
    }
    let m = 1.0 + (x >> 11) as f64 / (1u64 << 53) as f64;
    let e = ((x >> 3) & 7) as i32 - 4;
    let v = m * f64::powi(2.0, e);
    Some(if x & 8 != 0 { -v } else { v })
}

/// Fills `out` (whole `dt` elements) from `seed`.
fn fill_chunk(dt: DataType, seed: u64, out: &mut [u8]) {
    let mut r = Rng::new(seed);
    if !dt.is_float() {
        for c in out.chunks_mut(8) {
            let v = r.next_u64().to_le_bytes();
            c.copy_from_slice(&v[..c.len()]);
        }
        return;
    }
    let s = dt.size();
    for c in out.chunks_exact_mut(s) {
        let bits = r.next_u64();
        let Some(v) = float_value(&mut r) else {
            c.copy_from_slice(&bits.to_le_bytes()[..s]);
            continue;
        };
        match dt {
            DataType::F16 => c.copy_from_slice(&f16::from_f64(v).to_bits().to_le_bytes()),
            DataType::Bf16 => c.copy_from_slice(&bf16::from_f64(v).to_bits().to_le_bytes()),
            DataType::F32 => c.copy_from_slice(&(v as f32).to_le_bytes()),
            DataType::F64 => c.copy_from_slice(&v.to_le_bytes()),
            DataType::F8E4M3 => c[0] = reference::f8_encode_value(v as f32, true),
            DataType::F8E5M2 => c[0] = reference::f8_encode_value(v as f32, false),
            _ => c.copy_from_slice(&bits.to_le_bytes()[..s]),
        }
    }
}

fn threads() -> usize {
    std::thread::available_parallelism().map_or(4, |n| n.get()).min(32)
}

/// Elements per parallel chunk: big enough to be worth a thread, a multiple of 8 bytes.
const CHUNK: usize = 1 << 20;

/// `count` random elements of `dt` drawn from `seed` (the same for any thread count).
pub fn random(dt: DataType, count: usize, seed: u64) -> Vec<u8> {
    let mut v = vec![0u8; count * dt.size()];
    let step = CHUNK * dt.size();
    let chunks: Vec<(usize, &mut [u8])> = v.chunks_mut(step).enumerate().collect();
    par(chunks, |(i, c)| fill_chunk(dt, seed.wrapping_mul(0x1000_0000_01b3).wrapping_add(i as u64), c));
    v
}

/// Runs `f` over `items` on all cores.
pub fn par<T: Send, F: Fn(T) + Sync>(items: Vec<T>, f: F) {
    if items.len() <= 1 {
        // Small buffers: a thread would cost more than the work.
        items.into_iter().for_each(f);
        return;
    }
    let n = threads().min(items.len());
    let mut buckets: Vec<Vec<T>> = (0..n).map(|_| Vec::new()).collect();
    for (i, it) in items.into_iter().enumerate() {
        buckets[i % n].push(it);
    }
    std::thread::scope(|s| {
        for b in buckets {
            let f = &f;
            s.spawn(move || b.into_iter().for_each(f));
        }
    });
}

/// Splits buffers of `dt` elements into aligned parallel chunks: (offset in elements, pieces).
pub fn split(dt: DataType, len: usize) -> Vec<(usize, usize)> {
    let count = len / dt.size();
    (0..count.div_ceil(CHUNK)).map(|i| (i * CHUNK, CHUNK.min(count - i * CHUNK))).collect()
}

/// Mismatches of `got` against `want` (elements of `dt`): how many, and the first few indices.
pub fn compare(dt: DataType, minmax: bool, got: &[u8], want: &[u8]) -> (usize, Vec<usize>) {
    let s = dt.size();
    let results = std::sync::Mutex::new((0usize, Vec::new()));
    par(split(dt, got.len()), |(off, n)| {
        let (g, w) = (&got[off * s..(off + n) * s], &want[off * s..(off + n) * s]);
        if g == w {
            return;
        }
        let mut bad = 0;
        let mut first = Vec::new();
        for i in 0..n {
            if !reference::same(dt, minmax, g, w, i) {
                bad += 1;
                if first.len() < 4 {
                    first.push(off + i);
                }
            }
        }
        if let Ok(mut r) = results.lock() {
            r.0 += bad;
            r.1.extend(first);
        }
    });
    let (n, mut first) = results.into_inner().unwrap_or_default();
    first.sort_unstable();
    first.truncate(4);
    (n, first)
}
