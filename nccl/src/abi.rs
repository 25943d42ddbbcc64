//! NCCL's C types with NCCL's numbering and layout, and their conversion to occl's.

use occl::cuda::kernels::ClusterSize;
use occl::{DataType, Error, RedOp, Result, UniqueId};
use std::ffi::c_char;

/// `ncclResult_t`: a C enum, passed as `int`.
pub type ncclResult_t = i32;
pub const ncclSuccess: ncclResult_t = 0;
pub const ncclUnhandledCudaError: ncclResult_t = 1;
pub const ncclSystemError: ncclResult_t = 2;
pub const ncclInternalError: ncclResult_t = 3;
pub const ncclInvalidArgument: ncclResult_t = 4;
pub const ncclInvalidUsage: ncclResult_t = 5;
pub const ncclRemoteError: ncclResult_t = 6;
pub const ncclInProgress: ncclResult_t = 7;

/// `ncclDataType_t`: occl's `DataType` discriminants are NCCL's values.
pub type ncclDataType_t = i32;
/// `ncclRedOp_t`: 0..5 are occl's `RedOp`; values from `NUM_OPS` are pre-multiply sums.
pub type ncclRedOp_t = i32;
pub const NUM_OPS: ncclRedOp_t = 5;

/// The release occl speaks as, in NCCL's integer coding (`include/nccl.h`'s `NCCL_VERSION_CODE`).
pub const VERSION_CODE: i32 = occl_types::NCCL_VERSION_CODE;

pub const UNIQUE_ID_BYTES: usize = 128;

/// `ncclUniqueId`: 128 bytes, passed by value. occl puts its text id in it, NUL-terminated.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ncclUniqueId {
    pub internal: [c_char; UNIQUE_ID_BYTES],
}

impl ncclUniqueId {
    pub fn from_occl(id: &UniqueId) -> Result<ncclUniqueId> {
        let text = id.to_string();
        if text.len() >= UNIQUE_ID_BYTES {
            return Err(Error::InternalError(format!(
                "unique id text is {} bytes; ncclUniqueId holds {}",
                text.len(),
                UNIQUE_ID_BYTES - 1
            )));
        }
        let mut out = ncclUniqueId { internal: [0; UNIQUE_ID_BYTES] };
        for (d, s) in out.internal.iter_mut().zip(text.bytes()) {
            *d = s as c_char;
        }
        Ok(out)
    }

    pub fn to_occl(&self) -> Result<UniqueId> {
        let bytes: Vec<u8> = self.internal.iter().map(|&c| c as u8).take_while(|&b| b != 0).collect();
        let not_ours = || {
            Error::InvalidArgument(
                "the ncclUniqueId was not made by occl's ncclGetUniqueId (is another libnccl.so.2 loaded in one of \
                 the processes?); create it with ncclGetUniqueId of this library and pass its 128 bytes unchanged"
                    .into(),
            )
        };
        if bytes.len() == UNIQUE_ID_BYTES {
            return Err(not_ours());
        }
        let text = std::str::from_utf8(&bytes).map_err(|_| not_ours())?;
        text.parse().map_err(|e: Error| Error::InvalidArgument(format!("{e} (from the ncclUniqueId)")))
    }
}

/// Maps NCCL's datatype number to occl's.
pub fn dtype(v: ncclDataType_t) -> Result<DataType> {
    DataType::ALL.iter().copied().find(|d| *d as i32 == v).ok_or_else(|| {
        Error::InvalidArgument(format!("datatype {v} is not an ncclDataType_t (0 ncclInt8 … 11 ncclFloat8e5m2)"))
    })
}

/// A built-in operator, or `None` for a value that may name a pre-multiply sum.
pub fn builtin_op(v: ncclRedOp_t) -> Option<RedOp> {
    RedOp::ALL.iter().copied().find(|o| *o as i32 == v)
}

/// `ncclConfig_t`'s magic, set by `NCCL_CONFIG_INITIALIZER`.
pub const CONFIG_MAGIC: u32 = 0xcafe_beef;
/// `NCCL_CONFIG_UNDEF_INT`.
pub const UNDEF_INT: i32 = i32::MIN;

/// `ncclConfig_t` of NCCL 2.28 (80 bytes on LP64). Older programs pass a shorter struct (2.19:
/// 48 bytes, up to `splitShare`; 2.27: 72, up to `nvlsCTAs`), newer ones may pass a longer one;
/// `Options::read` only touches the fields that `size` covers.
#[repr(C)]
pub struct ncclConfig_t {
    pub size: usize,
    pub magic: u32,
    pub version: u32,
    pub blocking: i32,
    pub cgaClusterSize: i32,
    pub minCTAs: i32,
    pub maxCTAs: i32,
    pub netName: *const c_char,
    pub splitShare: i32,
    pub trafficClass: i32,
    pub commName: *const c_char,
    pub collnetEnable: i32,
    pub CTAPolicy: i32,
    pub shrinkShare: i32,
    pub nvlsCTAs: i32,
    pub nChannelsPerNetPeer: i32,
    pub nvlinkCentricSched: i32,
}

/// What occl takes from an `ncclConfig_t`. The channel, collnet and NVLS fields tune NCCL's
/// own kernels and are read by no one; the CTA fields bound a device communicator's SMs, and
/// `cgaClusterSize` sets how its kernels are placed on them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Options {
    /// `blocking = 0`: init returns `ncclInProgress` and completes in the background.
    pub nonblocking: bool,
    /// `commName`, for logs.
    pub name: Option<String>,
    /// What a device communicator takes from it.
    pub device: DeviceFields,
}

/// The fields of an `ncclConfig_t` that shape a device communicator, where the program set them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DeviceFields {
    /// `minCTAs`, `maxCTAs`, `CTAPolicy` (`NCCL_MIN_CTAS`, `NCCL_MAX_CTAS`, `NCCL_CTA_POLICY`
    /// override them, as in NCCL).
    pub cta: CtaFields,
    /// `cgaClusterSize` (`NCCL_CGA_CLUSTER_SIZE` overrides it, as in NCCL).
    pub cluster: Option<ClusterSize>,
}

/// The CTA fields of an `ncclConfig_t` that are not `NCCL_CONFIG_UNDEF_INT`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CtaFields {
    pub min: Option<u32>,
    pub max: Option<u32>,
    pub policy: Option<i32>,
}

impl Options {
    /// Reads `config` (NULL: defaults) through its `size`, checking its `magic`.
    ///
    /// # Safety
    /// `config` is NULL or points to at least `config->size` readable bytes.
    pub unsafe fn read(config: *const ncclConfig_t) -> Result<Options> {
        // SAFETY: the caller's contract.
        let mut opts = unsafe { Options::read_struct(config)? };
        opts.nonblocking = blocking_env(std::env::var("NCCL_COMM_BLOCKING").ok().as_deref(), opts.nonblocking);
        Ok(opts)
    }

    /// # Safety
    /// As `read`.
    unsafe fn read_struct(config: *const ncclConfig_t) -> Result<Options> {
        if config.is_null() {
            return Ok(Options::default());
        }
        let base = config.cast::<u8>();
        // SAFETY: every ncclConfig_t starts with size, magic and version (16 bytes).
        let (size, magic, version) = unsafe { ((*config).size, (*config).magic, (*config).version) };
        if magic != CONFIG_MAGIC {
            return Err(Error::InvalidArgument(format!(
                "ncclConfig_t has magic {magic:#x}, not {CONFIG_MAGIC:#x}: initialise it with NCCL_CONFIG_INITIALIZER \
                 before setting fields"
            )));
        }
        let has = |offset: usize, len: usize| offset + len <= size;
        if !has(std::mem::offset_of!(ncclConfig_t, blocking), 4) {
            return Err(Error::InvalidArgument(format!(
                "ncclConfig_t size {size} (version {version}) is too small to hold even `blocking`; \
                 initialise it with NCCL_CONFIG_INITIALIZER"
            )));
        }
        // SAFETY: each field is read only when `size` says the caller's struct has it.
        let read_i32 = |offset: usize| unsafe { base.add(offset).cast::<i32>().read_unaligned() };
        let read_ptr = |offset: usize| unsafe { base.add(offset).cast::<*const c_char>().read_unaligned() };
        let blocking = read_i32(std::mem::offset_of!(ncclConfig_t, blocking));
        let nonblocking = match blocking {
            0 => true,
            1 | UNDEF_INT => false,
            b => {
                return Err(Error::InvalidArgument(format!(
                    "ncclConfig_t.blocking is {b}; use 1 (blocking), 0 (non-blocking) or leave NCCL_CONFIG_UNDEF_INT"
                )))
            }
        };
        let at = std::mem::offset_of!(ncclConfig_t, commName);
        let name = if has(at, std::mem::size_of::<*const c_char>()) {
            let p = read_ptr(at);
            // SAFETY: a non-NULL commName is a NUL-terminated string (NCCL's contract).
            (!p.is_null()).then(|| unsafe { std::ffi::CStr::from_ptr(p) }.to_string_lossy().into_owned())
        } else {
            None
        };
        let cta_count = |name: &str, offset: usize| -> Result<Option<u32>> {
            if !has(offset, 4) {
                return Ok(None);
            }
            match read_i32(offset) {
                UNDEF_INT => Ok(None),
                v => u32::try_from(v).map(Some).map_err(|_| {
                    Error::InvalidArgument(format!("ncclConfig_t.{name} is {v}; a count of CTAs is 0 or more"))
                }),
            }
        };
        let at = std::mem::offset_of!(ncclConfig_t, CTAPolicy);
        let cta = CtaFields {
            min: cta_count("minCTAs", std::mem::offset_of!(ncclConfig_t, minCTAs))?,
            max: cta_count("maxCTAs", std::mem::offset_of!(ncclConfig_t, maxCTAs))?,
            policy: if has(at, 4) { Some(read_i32(at)).filter(|&v| v != UNDEF_INT) } else { None },
        };
        let at = std::mem::offset_of!(ncclConfig_t, cgaClusterSize);
        let cluster = match if has(at, 4) { read_i32(at) } else { UNDEF_INT } {
            UNDEF_INT => None,
            v => Some(u32::try_from(v).map(ClusterSize::new).map_err(|_| {
                Error::InvalidArgument(format!(
                    "ncclConfig_t.cgaClusterSize is {v}; thread blocks per cluster are 0 (none) to {}",
                    ClusterSize::MAX
                ))
            })?),
        };
        Ok(Options { nonblocking, name, device: DeviceFields { cta, cluster } })
    }
}

/// `NCCL_COMM_BLOCKING` (0 or 1) overrides every communicator's `blocking`, as in NCCL; other
/// values are ignored.
pub fn blocking_env(v: Option<&str>, nonblocking: bool) -> bool {
    match v.map(str::trim) {
        Some("0") => true,
        Some("1") => false,
        _ => nonblocking,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    /// `include/nccl.h` states the release that `occl_types::NCCL_VERSION` names.
    #[test]
    fn the_header_states_the_release_occl_speaks_as() {
        let header = include_str!("../include/nccl.h");
        let define = |name: &str| {
            header.lines().find_map(|l| {
                let mut w = l.split_whitespace();
                (w.next() == Some("#define") && w.next() == Some(name))
                    .then(|| w.next().unwrap_or_default().to_string())
            })
        };
        let release: Vec<String> = occl_types::NCCL_VERSION.split('.').map(str::to_string).collect();
        let stated: Vec<String> =
            ["NCCL_MAJOR", "NCCL_MINOR", "NCCL_PATCH"].iter().map(|n| define(n).unwrap_or_default()).collect();
        assert_eq!(stated, release);
        assert_eq!(define("NCCL_VERSION_CODE"), Some(VERSION_CODE.to_string()));
    }

    #[test]
    fn config_layout_is_ncclConfig_v22800() {
        assert_eq!(size_of::<ncclConfig_t>(), 80);
        assert_eq!(offset_of!(ncclConfig_t, blocking), 16);
        assert_eq!(offset_of!(ncclConfig_t, netName), 32);
        assert_eq!(offset_of!(ncclConfig_t, splitShare), 40);
        assert_eq!(offset_of!(ncclConfig_t, commName), 48);
        assert_eq!(offset_of!(ncclConfig_t, nvlsCTAs), 68);
        assert_eq!(offset_of!(ncclConfig_t, nvlinkCentricSched), 76);
        assert_eq!(size_of::<ncclUniqueId>(), 128);
    }

    #[test]
    fn unique_id_round_trip_and_foreign_ids() {
        let id: UniqueId = format!("occl1-{}@127.0.0.1:4000", "ab".repeat(16)).parse().unwrap();
        let c = ncclUniqueId::from_occl(&id).unwrap();
        assert_eq!(c.to_occl().unwrap(), id);
        let full = ncclUniqueId { internal: [7; 128] };
        assert_eq!(full.to_occl().unwrap_err().kind(), occl::ErrorKind::InvalidArgument);
        let zero = ncclUniqueId { internal: [0; 128] };
        assert_eq!(zero.to_occl().unwrap_err().kind(), occl::ErrorKind::InvalidArgument);
    }

    #[test]
    fn numbering_is_ncclDataType_t_and_ncclRedOp_t() {
        assert_eq!(dtype(7).unwrap(), DataType::F32);
        assert_eq!(dtype(9).unwrap(), DataType::Bf16);
        assert_eq!(dtype(11).unwrap(), DataType::F8E5M2);
        assert!(dtype(12).is_err() && dtype(-1).is_err());
        assert_eq!(builtin_op(2), Some(RedOp::Max));
        assert_eq!(builtin_op(3), Some(RedOp::Min));
        assert_eq!(builtin_op(4), Some(RedOp::Avg));
        assert_eq!(builtin_op(5), None);
    }

    /// `NCCL_CONFIG_INITIALIZER`: every field undefined.
    fn initializer() -> ncclConfig_t {
        ncclConfig_t {
            size: size_of::<ncclConfig_t>(),
            magic: CONFIG_MAGIC,
            version: VERSION_CODE as u32,
            blocking: UNDEF_INT,
            cgaClusterSize: UNDEF_INT,
            minCTAs: UNDEF_INT,
            maxCTAs: UNDEF_INT,
            netName: std::ptr::null(),
            splitShare: UNDEF_INT,
            trafficClass: UNDEF_INT,
            commName: std::ptr::null(),
            collnetEnable: UNDEF_INT,
            CTAPolicy: UNDEF_INT,
            shrinkShare: UNDEF_INT,
            nvlsCTAs: UNDEF_INT,
            nChannelsPerNetPeer: UNDEF_INT,
            nvlinkCentricSched: UNDEF_INT,
        }
    }

    #[test]
    fn cta_fields_are_read_where_set_and_within_size() {
        let mut c = initializer();
        // SAFETY: a whole ncclConfig_t of its size.
        let read = |c: &ncclConfig_t| unsafe { Options::read_struct(c) };
        assert_eq!(read(&c).unwrap().device.cta, CtaFields::default());
        c.minCTAs = 4;
        c.maxCTAs = 16;
        c.CTAPolicy = 1;
        assert_eq!(read(&c).unwrap().device.cta, CtaFields { min: Some(4), max: Some(16), policy: Some(1) });
        // A 2.19-sized struct (48 bytes) has minCTAs and maxCTAs but no CTAPolicy.
        c.size = 48;
        assert_eq!(read(&c).unwrap().device.cta, CtaFields { min: Some(4), max: Some(16), policy: None });
        c.size = size_of::<ncclConfig_t>();
        c.maxCTAs = -3;
        let e = read(&c).unwrap_err().to_string();
        assert!(e.contains("ncclConfig_t.maxCTAs is -3"), "{e}");
    }

    #[test]
    fn the_cluster_size_is_read_where_set() {
        let mut c = initializer();
        // SAFETY: a whole ncclConfig_t of its size.
        let read = |c: &ncclConfig_t| unsafe { Options::read_struct(c) };
        assert_eq!(read(&c).unwrap().device.cluster, None);
        c.cgaClusterSize = 2;
        assert_eq!(read(&c).unwrap().device.cluster, Some(ClusterSize::new(2)));
        c.cgaClusterSize = 0;
        assert_eq!(read(&c).unwrap().device.cluster, Some(ClusterSize::NONE));
        c.cgaClusterSize = 12;
        assert_eq!(read(&c).unwrap().device.cluster, Some(ClusterSize::new(ClusterSize::MAX)), "cut to 8");
        c.cgaClusterSize = -5;
        let e = read(&c).unwrap_err().to_string();
        assert!(e.contains("ncclConfig_t.cgaClusterSize is -5"), "{e}");
    }

    #[test]
    fn nccl_comm_blocking_overrides_the_config() {
        assert!(blocking_env(Some("0"), false));
        assert!(!blocking_env(Some("1"), true));
        assert!(blocking_env(Some("2"), true) && !blocking_env(None, false));
    }
}
