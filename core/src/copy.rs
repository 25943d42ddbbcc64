//! Large copies with non-temporal stores. A collective's output is usually read long after it
//! is written, so for copies far larger than the caches, streaming stores save the read of
//! each destination line (and keep the FIFO slots in cache). glibc decides this from the
//! reported cache size, which virtual machines often inflate, so occl decides itself.

/// Copies below this size use `memcpy`: the destination may well be read again while cached.
const STREAM_MIN: usize = 4 << 20;

/// Copies `n` bytes from `src` to `dst`.
///
/// # Safety
/// `src` readable and `dst` writable for `n` bytes; the ranges do not overlap.
pub(crate) unsafe fn copy(dst: *mut u8, src: *const u8, n: usize) {
    // SAFETY: the caller's contract.
    unsafe {
        if n >= STREAM_MIN {
            stream(dst, src, n);
        } else {
            std::ptr::copy_nonoverlapping(src, dst, n);
        }
    }
}

/// Copies `n` bytes with streaming stores whatever the size: for pieces of an operation whose
/// destination as a whole is far larger than the caches.
///
/// # Safety
/// As `copy`.
pub(crate) unsafe fn stream(dst: *mut u8, src: *const u8, n: usize) {
    #[cfg(target_arch = "x86_64")]
    if n >= 256 {
        // Whole 64-byte lines per store where the CPU has them: the registered all-gather at
        // 64 MiB gained 1-3% at 2 ranks and 4-22% at 4 on a 16-CPU Xeon host, 10% on the 2-core
        // EPYC VM (bench/baselines/registered-vs-mpi.md).
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: the caller's contract, and AVX-512F is present.
            unsafe { stream_avx512(dst, src, n) };
            return;
        }
        if std::arch::is_x86_feature_detected!("avx") {
            // SAFETY: the caller's contract, and AVX is present.
            unsafe { stream_avx(dst, src, n) };
            return;
        }
    }
    // SAFETY: the caller's contract.
    unsafe { std::ptr::copy_nonoverlapping(src, dst, n) };
}

/// Copies one piece of a larger operation: with streaming stores when the operation as a whole
/// streams (`streams` of its total), else with `memcpy`.
///
/// # Safety
/// As `copy`.
pub(crate) unsafe fn piece(dst: *mut u8, src: *const u8, n: usize, stream: bool) {
    // SAFETY: the caller's contract.
    unsafe {
        if stream {
            self::stream(dst, src, n);
        } else {
            std::ptr::copy_nonoverlapping(src, dst, n);
        }
    }
}

/// Whether an operation writing `bytes` to a user buffer should stream its final writes.
pub(crate) fn streams(bytes: usize) -> bool {
    bytes >= STREAM_MIN
}

/// A streaming copy kernel over `$width`-byte vectors, four per turn of the loop, storing to
/// `$width`-aligned addresses (the unaligned head is copied first).
macro_rules! stream_kernel {
    ($name:ident, $feature:literal, $width:literal, $vec:ident, $load:ident, $store:ident) => {
        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = $feature)]
        unsafe fn $name(dst: *mut u8, src: *const u8, n: usize) {
            use std::arch::x86_64::{_mm_sfence, $load, $store, $vec};
            // SAFETY (whole body): offsets stay below n; the stream stores go to aligned
            // addresses.
            unsafe {
                let head = dst.align_offset($width).min(n);
                std::ptr::copy_nonoverlapping(src, dst, head);
                let mut i = head;
                while i + 4 * $width <= n {
                    for k in 0..4 {
                        let v = $load(src.add(i + $width * k) as *const $vec);
                        $store(dst.add(i + $width * k) as *mut $vec, v);
                    }
                    i += 4 * $width;
                }
                std::ptr::copy_nonoverlapping(src.add(i), dst.add(i), n - i);
                // Streaming stores are weakly ordered: make them visible before anyone is told.
                _mm_sfence();
            }
        }
    };
}

stream_kernel!(stream_avx, "avx", 32, __m256i, _mm256_loadu_si256, _mm256_stream_si256);
stream_kernel!(stream_avx512, "avx512f", 64, __m512i, _mm512_loadu_si512, _mm512_stream_si512);

#[cfg(test)]
mod tests {
    type Kernel = unsafe fn(*mut u8, *const u8, usize);

    /// Every copy this CPU can run, named.
    fn kernels() -> Vec<(&'static str, Kernel)> {
        let mut k: Vec<(&'static str, Kernel)> = vec![("copy", super::copy), ("stream", super::stream)];
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx") {
                k.push(("avx", super::stream_avx));
            } else {
                println!("copy: the AVX kernel is not tested: this CPU has no AVX");
            }
            if std::arch::is_x86_feature_detected!("avx512f") {
                k.push(("avx512", super::stream_avx512));
            } else {
                println!("copy: the AVX-512 kernel is not tested: this CPU has no AVX-512F");
            }
        }
        k
    }

    #[test]
    fn copies_every_length_and_alignment_exactly() {
        let src: Vec<u8> = (0..(super::STREAM_MIN + 300)).map(|i| (i * 7 + 3) as u8).collect();
        let cases = [(0, 0), (1, 5), (3, 1000), (7, 4099), (0, super::STREAM_MIN), (5, super::STREAM_MIN + 129)];
        for (name, kernel) in kernels() {
            for (off, len) in cases {
                // Destinations at every offset within a 64-byte line, against the source's.
                let at = (off * 13) % 64;
                let mut dst = vec![0u8; len + 128];
                // SAFETY: both buffers hold len bytes past the offsets used; the kernels need
                // only the features `kernels` checked.
                unsafe { kernel(dst.as_mut_ptr().add(at), src.as_ptr().add(off), len) };
                assert_eq!(&dst[at..at + len], &src[off..off + len], "{name}: off {off} len {len}");
                assert!(dst[..at].iter().chain(&dst[at + len..]).all(|&b| b == 0), "{name}: wrote outside");
            }
        }
    }
}
