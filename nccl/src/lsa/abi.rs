//! The C types of `include/nccl_device/core.h` as the library reads and writes them.
//!
//! `ncclDevCommRequirements` and the lists it points to have NCCL 2.28's layout (programs fill
//! them). The device communicator, the window and the handles have occl's layout, shared with
//! the inline device code of the header alone; `tests::layouts_match_the_header` compiles the
//! header with the C compiler and compares every offset.

use std::ffi::c_void;

/// `ncclTeam`: `nRanks` ranks `stride` apart, the caller at index `rank`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ncclTeam {
    pub nRanks: i32,
    pub rank: i32,
    pub stride: i32,
}

/// `ncclDevCommRequirements` (NCCL 2.28.9). C's `bool` fields are read as bytes: a caller's
/// byte other than 0 or 1 must not become an invalid Rust `bool`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ncclDevCommRequirements {
    pub resourceRequirementsList: *mut ncclDevResourceRequirements,
    pub teamRequirementsList: *mut ncclTeamRequirements,
    pub lsaMultimem: u8,
    pub barrierCount: i32,
    pub lsaBarrierCount: i32,
    pub railGinBarrierCount: i32,
    pub lsaLLA2ABlockCount: i32,
    pub lsaLLA2ASlotCount: i32,
    pub ginForceEnable: u8,
    pub ginContextCount: i32,
    pub ginSignalCount: i32,
    pub ginCounterCount: i32,
}

/// `ncclDevResourceRequirements` (NCCL 2.28.9): one entry of a linked list.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ncclDevResourceRequirements {
    pub next: *mut ncclDevResourceRequirements,
    pub bufferSize: usize,
    pub bufferAlign: usize,
    pub outBufferHandle: *mut u32,
    pub ginSignalCount: i32,
    pub ginCounterCount: i32,
    pub outGinSignalStart: *mut u32,
    pub outGinCounterStart: *mut u32,
}

/// `ncclTeamRequirements` (NCCL 2.28.9): one entry of a linked list.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ncclTeamRequirements {
    pub next: *mut ncclTeamRequirements,
    pub team: ncclTeam,
    pub multimem: u8,
    pub outMultimemHandle: *mut ncclMultimemHandle,
}

/// `ncclMultimemHandle`: always NULL on occl.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ncclMultimemHandle {
    pub mcBasePtr: *mut c_void,
}

/// `ncclLsaBarrierHandle`: `nBarriers` barriers in resource buffer `bufHandle`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ncclLsaBarrierHandle {
    pub bufHandle: u32,
    pub nBarriers: i32,
}

/// `ncclGinBarrierHandle`: barriers on signals `signal0..`, epochs in buffer `bufHandle`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ncclGinBarrierHandle {
    pub signal0: u32,
    pub bufHandle: u32,
}

/// `OCCL_NCCL_LSA_MAX`: the lsa peers a window names.
pub const LSA_MAX: usize = 64;
/// `OCCL_NCCL_WINDOW_MAGIC`.
pub const WINDOW_MAGIC: u32 = 0x6f63_574e;
/// `OCCL_NCCL_DEVCOMM_MAGIC`.
pub const DEVCOMM_MAGIC: u32 = 0x6f63_444d;
/// Resource buffers are placed in units of this many bytes; a handle counts units.
pub const RESOURCE_UNIT: usize = 128;

/// `struct ncclWindow_vidmem`, the device-resident window (occl's layout). Addresses are
/// device pointers of this process.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ncclWindow_vidmem {
    pub local: u64,
    pub size: u64,
    pub worldRank: i32,
    pub lsaRank: i32,
    pub lsaSize: i32,
    pub magic: u32,
    pub lsaPeers: [u64; LSA_MAX],
}

impl ncclWindow_vidmem {
    /// The window of rank `world_rank` whose lsa peers' buffers are `peers` (this rank's at
    /// `lsa_rank`).
    pub fn new(world_rank: usize, lsa_rank: usize, peers: &[u64], size: u64) -> Option<ncclWindow_vidmem> {
        if peers.len() > LSA_MAX || lsa_rank >= peers.len() {
            return None;
        }
        let mut lsaPeers = [0u64; LSA_MAX];
        lsaPeers[..peers.len()].copy_from_slice(peers);
        Some(ncclWindow_vidmem {
            local: peers[lsa_rank],
            size,
            worldRank: i32::try_from(world_rank).ok()?,
            lsaRank: i32::try_from(lsa_rank).ok()?,
            lsaSize: i32::try_from(peers.len()).ok()?,
            magic: WINDOW_MAGIC,
            lsaPeers,
        })
    }

    /// Its bytes, as the device reads them.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(std::mem::size_of::<Self>());
        b.extend_from_slice(&self.local.to_ne_bytes());
        b.extend_from_slice(&self.size.to_ne_bytes());
        for v in [self.worldRank, self.lsaRank, self.lsaSize] {
            b.extend_from_slice(&v.to_ne_bytes());
        }
        b.extend_from_slice(&self.magic.to_ne_bytes());
        for p in &self.lsaPeers {
            b.extend_from_slice(&p.to_ne_bytes());
        }
        b
    }
}

/// `struct ncclDevComm` (occl's layout), written into the caller's struct.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ncclDevComm {
    pub rank: i32,
    pub nRanks: i32,
    pub lsaRank: i32,
    pub lsaSize: i32,
    pub resourceWindow: u64,
    pub lsaBarrier: ncclLsaBarrierHandle,
    pub railGinBarrier: ncclGinBarrierHandle,
    pub lsaMultimem: ncclMultimemHandle,
    pub ginContextCount: i32,
    pub ginSignalCount: i32,
    pub ginCounterCount: i32,
    pub ginSignalOffset: u32,
    pub ginCounters: u64,
    pub ginSignalShadows: u64,
    pub errorWord: u64,
    pub timeoutNs: u64,
    pub magic: u32,
    pub reserved: u32,
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use std::mem::{offset_of, size_of};
    use std::path::Path;
    use std::process::Command;

    /// `name value` lines of `nccl/tests/c/device_layout.c`, built against the header.
    fn c_layout() -> Option<HashMap<String, usize>> {
        let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
        let dir = std::env::temp_dir().join(format!("occl-nccl-layout-{}", std::process::id()));
        std::fs::create_dir_all(&dir).ok()?;
        let exe = dir.join("device_layout");
        let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
        let built = Command::new(&cc)
            .args(["-std=c11", "-Wall", "-Werror", "-DOCCL_NCCL_NO_CUDA", "-I"])
            .arg(manifest.join("include"))
            .arg(manifest.join("tests/c/device_layout.c"))
            .arg("-o")
            .arg(&exe)
            .output();
        let built = match built {
            Ok(o) => o,
            Err(e) => {
                assert!(std::env::var_os("CI").is_none(), "no C compiler `{cc}` in CI: {e}");
                eprintln!("SKIPPED: no C compiler `{cc}` ({e})");
                return None;
            }
        };
        assert!(built.status.success(), "device_layout.c: {}", String::from_utf8_lossy(&built.stderr));
        let out = Command::new(&exe).output().expect("run device_layout");
        let _ = std::fs::remove_dir_all(&dir);
        let text = String::from_utf8(out.stdout).expect("utf-8");
        Some(
            text.lines()
                .filter_map(|l| l.split_once(' '))
                .map(|(k, v)| (k.to_string(), v.trim().parse().expect("a number")))
                .collect(),
        )
    }

    #[test]
    fn layouts_match_the_header() {
        let Some(c) = c_layout() else { return };
        let mut rust: Vec<(&str, usize)> = Vec::new();
        macro_rules! fields {
            ($t:ident: $($f:ident),*) => {
                rust.push((concat!(stringify!($t), ".sizeof"), size_of::<$t>()));
                $(rust.push((concat!(stringify!($t), ".", stringify!($f)), offset_of!($t, $f)));)*
            };
        }
        fields!(ncclTeam: nRanks, rank, stride);
        fields!(ncclDevCommRequirements: resourceRequirementsList, teamRequirementsList, lsaMultimem,
            barrierCount, lsaBarrierCount, railGinBarrierCount, lsaLLA2ABlockCount, lsaLLA2ASlotCount,
            ginForceEnable, ginContextCount, ginSignalCount, ginCounterCount);
        fields!(ncclDevResourceRequirements: next, bufferSize, bufferAlign, outBufferHandle, ginSignalCount,
            ginCounterCount, outGinSignalStart, outGinCounterStart);
        fields!(ncclTeamRequirements: next, team, multimem, outMultimemHandle);
        fields!(ncclLsaBarrierHandle: bufHandle, nBarriers);
        fields!(ncclGinBarrierHandle: signal0, bufHandle);
        fields!(ncclMultimemHandle: mcBasePtr);
        fields!(ncclWindow_vidmem: local, size, worldRank, lsaRank, lsaSize, magic, lsaPeers);
        fields!(ncclDevComm: rank, nRanks, lsaRank, lsaSize, resourceWindow, lsaBarrier, railGinBarrier,
            lsaMultimem, ginContextCount, ginSignalCount, ginCounterCount, ginSignalOffset, ginCounters,
            ginSignalShadows, errorWord, timeoutNs, magic, reserved);
        for (name, v) in &rust {
            assert_eq!(c.get(*name), Some(v), "{name}: the header and the library disagree");
        }
        assert_eq!(c.len(), rust.len() + 4, "device_layout.c prints fields the test does not check");
        assert_eq!(c["LSA_MAX"], LSA_MAX);
        assert_eq!(c["WINDOW_MAGIC"], WINDOW_MAGIC as usize);
        assert_eq!(c["DEVCOMM_MAGIC"], DEVCOMM_MAGIC as usize);
        assert_eq!(c["RESOURCE_UNIT"], RESOURCE_UNIT);
        // NCCL 2.28.9's requirement struct on LP64, which programs fill by position.
        assert_eq!(size_of::<ncclDevCommRequirements>(), 56);
        assert_eq!(size_of::<ncclDevResourceRequirements>(), 56);
    }

    #[test]
    fn a_window_serialises_in_field_order() {
        let w = ncclWindow_vidmem::new(3, 1, &[0x1000, 0x2000], 64).unwrap();
        assert_eq!(w.local, 0x2000);
        let b = w.encode();
        assert_eq!(b.len(), size_of::<ncclWindow_vidmem>());
        assert_eq!(&b[offset_of!(ncclWindow_vidmem, lsaPeers) + 8..][..8], &0x2000u64.to_ne_bytes());
        assert_eq!(&b[offset_of!(ncclWindow_vidmem, magic)..][..4], &WINDOW_MAGIC.to_ne_bytes());
        assert!(ncclWindow_vidmem::new(0, 2, &[1, 2], 0).is_none());
        assert!(ncclWindow_vidmem::new(0, 0, &[1; LSA_MAX + 1], 0).is_none());
    }
}
