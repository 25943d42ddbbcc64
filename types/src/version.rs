//! The NCCL release occl speaks as, in one place: `libnccl.so.2`'s `ncclGetVersion` and log banner,
//! the RAS report's version, `ncclras --version`. The release is one string; NCCL's integer code is
//! derived from it at compile time, and the C header's `NCCL_MAJOR`/`MINOR`/`PATCH` are checked
//! against it by occl-nccl's tests.
//!
//! The RAS client protocol has a number of its own: NCCL has answered `SERVER PROTOCOL 2` since RAS
//! appeared (2.24), and NVIDIA's `ncclras` warns when the server's number differs from its own.

/// NCCL's `major.minor.patch` whose C API, ABI and RAS report layout occl follows.
pub const NCCL_VERSION: &str = "2.28.9";

/// [`NCCL_VERSION`] coded as NCCL codes releases from 2.9 on: major × 10000 + minor × 100 + patch.
pub const NCCL_VERSION_CODE: i32 = version_code(NCCL_VERSION);

/// The RAS client protocol version (`CLIENT PROTOCOL n` / `SERVER PROTOCOL n`).
pub const RAS_CLIENT_PROTOCOL: u32 = 2;

/// `"M.m.p"` → M × 10000 + m × 100 + p; anything else fails the build.
const fn version_code(v: &str) -> i32 {
    let b = v.as_bytes();
    let mut parts = [0i32; 3];
    let (mut i, mut part, mut digits) = (0, 0, 0);
    while i < b.len() {
        match b[i] {
            b'0'..=b'9' => {
                parts[part] = parts[part] * 10 + (b[i] - b'0') as i32;
                digits += 1;
            }
            b'.' if digits > 0 && part < 2 => {
                part += 1;
                digits = 0;
            }
            _ => panic!("NCCL_VERSION must be major.minor.patch"),
        }
        i += 1;
    }
    assert!(part == 2 && digits > 0 && parts[1] < 100 && parts[2] < 100, "NCCL_VERSION must be major.minor.patch");
    parts[0] * 10000 + parts[1] * 100 + parts[2]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_code_is_nccls_coding_of_the_string() {
        assert_eq!(version_code("2.28.9"), 22809);
        assert_eq!(version_code("2.30.11"), 23011);
        let [major, minor, patch]: [i32; 3] = {
            let mut it = NCCL_VERSION.split('.').map(|p| p.parse::<i32>().expect("number"));
            [(); 3].map(|_| it.next().expect("three parts"))
        };
        assert_eq!(NCCL_VERSION_CODE, major * 10000 + minor * 100 + patch);
    }
}
