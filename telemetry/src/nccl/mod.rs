//! NCCL C-ABI profiler plugins (`ncclProfiler_v1` … `ncclProfiler_v6`) behind the [`Profiler`]
//! trait, so a plugin written for NCCL sees occl's events unchanged.
//!
//! - [`plugin_from_env`]: the plugin named by `OCCL_PROFILER_PLUGIN`, else `NCCL_PROFILER_PLUGIN`,
//!   loaded once per process; a failure is logged once and not retried.
//! - [`NcclPlugin::load`]: the same for an explicit specification, uncached.
//! - [`resolve`]: NCCL 2.28's name rules, without opening anything.
//! - [`abi`]: the `#[repr(C)]` layouts of v1–v6, generated from one field table that also names
//!   how each field carries occl's event, for writing (to a loaded plugin) and reading.
//! - [`decode`]: the other direction, for a plugin written in Rust (`libnccl-profiler-occl.so`):
//!   what NCCL passes to a plugin read back into occl's events, validated.
//!
//! Lifetime as in NCCL (reference §2): the library is opened at load, each communicator's sink
//! holds it, and it is closed when the last sink is dropped; the next communicator opens it again.
//!
//! Conversions follow NCCL's adapters for older plugins (reference §12): types and states a
//! version does not have are not delivered, v1 gets numeric codes, and before v5 Coll/P2p hang
//! under the legacy Group event. One difference: v1–v3 Coll/P2p descriptors carry the real
//! communicator name and hash (as NCCL 2.23–2.26 gave them), where NCCL 2.27+ passes NULL/0.
//! NCCL's last resort of looking for the symbols inside the net plugin does not apply (occl has no
//! net plugins).

pub mod abi;
mod adapter;
mod codec;
mod convert;
pub mod decode;
mod error;
mod load;
mod logger;
pub(crate) mod names;
mod table;

pub use crate::idtable::RETIRED_CAP;
pub use error::{Attempt, LoadError};
pub use load::{resolve, spec_from_env, Resolution, DEFAULT_LIBRARY, PLUGIN_ENV_VARS};

use crate::event::EventType;
use crate::mask::EventMask;
use crate::profiler::{CommInfo, Profiler};
use crate::sink::Sink;
use load::{Library, Origin};
use std::ffi::CStr;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError, Weak};

/// A profiler-plugin API version; the symbol `ncclProfiler_vN` a library exports.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ApiVersion {
    V1 = 1,
    V2 = 2,
    V3 = 3,
    V4 = 4,
    V5 = 5,
    V6 = 6,
}

impl ApiVersion {
    /// The order symbols are tried in: the first one found wins.
    pub const NEWEST_FIRST: [ApiVersion; 6] = [Self::V6, Self::V5, Self::V4, Self::V3, Self::V2, Self::V1];

    /// N of `ncclProfiler_vN`.
    pub const fn number(self) -> u32 {
        self as u32
    }

    /// The exported symbol's name.
    pub const fn symbol_name(self) -> &'static str {
        match self {
            Self::V1 => "ncclProfiler_v1",
            Self::V2 => "ncclProfiler_v2",
            Self::V3 => "ncclProfiler_v3",
            Self::V4 => "ncclProfiler_v4",
            Self::V5 => "ncclProfiler_v5",
            Self::V6 => "ncclProfiler_v6",
        }
    }

    const fn symbol(self) -> &'static CStr {
        match self {
            Self::V1 => c"ncclProfiler_v1",
            Self::V2 => c"ncclProfiler_v2",
            Self::V3 => c"ncclProfiler_v3",
            Self::V4 => c"ncclProfiler_v4",
            Self::V5 => c"ncclProfiler_v5",
            Self::V6 => c"ncclProfiler_v6",
        }
    }

    /// The event types this version has: Group…ProxyCtrl (v1), + KernelCh and NetPlugin (v3), +
    /// the API events (v5), + the copy-engine events (v6).
    pub const fn known_types(self) -> EventMask {
        let below = match self {
            Self::V1 | Self::V2 => EventType::KernelCh,
            Self::V3 | Self::V4 => EventType::GroupApi,
            Self::V5 => EventType::CeColl,
            Self::V6 => return EventMask::ALL,
        };
        EventMask(below.bit() - 1)
    }
}

impl fmt::Display for ApiVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "v{}", self.number())
    }
}

/// The library as communicators share it: opened at load ("primed") until the first
/// communicator takes it, then held only by sinks.
struct Slot {
    primed: Option<Arc<Library>>,
    live: Weak<Library>,
    /// Re-opening failed once; not retried in this process.
    broken: bool,
}

/// A loaded NCCL profiler plugin; a [`Profiler`] whose `init` calls the plugin's `init` for each
/// communicator.
pub struct NcclPlugin {
    name: String,
    version: ApiVersion,
    origin: Origin,
    /// Also serialises the plugin's `init` calls, as NCCL does under its plugin lock.
    slot: Mutex<Slot>,
}

impl fmt::Debug for NcclPlugin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NcclPlugin")
            .field("name", &self.name)
            .field("version", &self.version)
            .field("origin", &self.origin)
            .finish()
    }
}

impl NcclPlugin {
    /// Resolves `spec` (a value of `NCCL_PROFILER_PLUGIN`; "" for unset) by NCCL's rules, opens
    /// the library and checks its function table. Not cached: see [`plugin_from_env`] for the
    /// once-per-process loader.
    pub fn load(spec: &str) -> Result<Arc<NcclPlugin>, LoadError> {
        let lib = load::open(&resolve(spec))?;
        Ok(Arc::new(NcclPlugin {
            name: lib.name.clone(),
            version: lib.version,
            origin: lib.origin.clone(),
            slot: Mutex::new(Slot { primed: Some(Arc::new(lib)), live: Weak::new(), broken: false }),
        }))
    }

    /// The API version found (the newest symbol the library exports).
    pub fn version(&self) -> ApiVersion {
        self.version
    }

    /// The library name that opened (as given to `dlopen`), or "the main program".
    pub fn origin(&self) -> String {
        self.origin.describe()
    }

    /// Whether the library is open now: from load until the first communicator, then while any
    /// communicator's sink lives.
    pub fn is_loaded(&self) -> bool {
        let s = self.lock();
        s.primed.is_some() || s.live.strong_count() > 0
    }

    fn lock(&self) -> MutexGuard<'_, Slot> {
        self.slot.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The open library for a new communicator, opening it again if every earlier one is gone.
    fn acquire(&self, slot: &mut Slot) -> Option<Arc<Library>> {
        if let Some(lib) = slot.primed.take() {
            slot.live = Arc::downgrade(&lib);
            return Some(lib);
        }
        if let Some(lib) = slot.live.upgrade() {
            return Some(lib);
        }
        if slot.broken {
            return None;
        }
        match load::reopen(&self.origin, self.version) {
            Ok(lib) => {
                let lib = Arc::new(lib);
                slot.live = Arc::downgrade(&lib);
                Some(lib)
            }
            Err(e) => {
                slot.broken = true;
                tracing::warn!("profiler plugin {:?}: opening it again failed, disabled from now on: {e}", self.name);
                None
            }
        }
    }
}

impl Profiler for NcclPlugin {
    /// The plugin's own name (its table's `name`).
    fn name(&self) -> &str {
        &self.name
    }

    fn init(&self, comm: &CommInfo<'_>) -> Option<Arc<dyn Sink>> {
        let mut slot = self.lock();
        let lib = self.acquire(&mut slot)?;
        adapter::init(lib, comm).map(adapter::into_sink)
    }
}

static FROM_ENV: OnceLock<Option<Arc<NcclPlugin>>> = OnceLock::new();

/// The plugin named by `OCCL_PROFILER_PLUGIN`, else `NCCL_PROFILER_PLUGIN` (the first one set;
/// unset or empty: `libnccl-profiler.so`; `none`: no plugin), loaded on the first call and
/// shared by every later one. A failure is logged once — at debug level when nothing was
/// configured and the default library is absent, otherwise as a warning naming every path tried
/// and the dynamic linker's reason — and not retried in this process.
pub fn plugin_from_env() -> Option<Arc<dyn Profiler>> {
    let p = FROM_ENV.get_or_init(|| {
        let (spec, from) = match spec_from_env() {
            Some((var, v)) => (v.clone(), format!("{var}={v:?}")),
            None => (String::new(), "OCCL_PROFILER_PLUGIN and NCCL_PROFILER_PLUGIN unset".to_owned()),
        };
        match NcclPlugin::load(&spec) {
            Ok(p) => {
                tracing::info!(
                    "profiler plugin {:?} loaded from {} ({})",
                    p.name,
                    p.origin.describe(),
                    p.version.symbol_name()
                );
                Some(p)
            }
            Err(e) if e.is_quiet() => {
                tracing::debug!("no profiler plugin ({from}): {e}");
                None
            }
            Err(e) => {
                tracing::warn!("profiler plugin not loaded ({from}): {e}");
                None
            }
        }
    });
    p.clone().map(|p| p as Arc<dyn Profiler>)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_know_nccls_types() {
        assert_eq!(ApiVersion::V1.known_types(), EventMask(0x3F));
        assert_eq!(ApiVersion::V2.known_types(), EventMask(0x3F));
        assert_eq!(ApiVersion::V3.known_types(), EventMask(0xFF));
        assert_eq!(ApiVersion::V4.known_types(), EventMask(0xFF));
        assert_eq!(ApiVersion::V5.known_types(), EventMask(0xFFF));
        assert_eq!(ApiVersion::V6.known_types(), EventMask(0x7FFF));
        assert_eq!(ApiVersion::NEWEST_FIRST.map(ApiVersion::number), [6, 5, 4, 3, 2, 1]);
        for v in ApiVersion::NEWEST_FIRST {
            assert_eq!(v.symbol().to_str().ok(), Some(v.symbol_name()));
        }
        assert_eq!(ApiVersion::V4.to_string(), "v4");
    }

    #[test]
    fn the_main_program_is_no_plugin() {
        let e = NcclPlugin::load("STATIC").expect_err("the test binary exports no ncclProfiler_v*");
        assert_eq!(e, LoadError::NoSymbol { origin: "the main program".into() });
        assert!(e.to_string().contains("exports none of ncclProfiler_v6"), "{e}");
    }

    #[test]
    fn missing_libraries_list_every_attempt() {
        let e = NcclPlugin::load("occl-no-such-plugin").expect_err("absent");
        let LoadError::NotFound { attempts, default: false } = &e else { panic!("{e:?}") };
        let names: Vec<_> = attempts.iter().map(|a| a.name.as_str()).collect();
        assert_eq!(names, ["occl-no-such-plugin", "libnccl-profiler-occl-no-such-plugin.so"]);
        assert!(attempts.iter().all(|a| !a.error.is_empty()));
        let msg = e.to_string();
        assert!(msg.contains("libnccl-profiler-occl-no-such-plugin.so (") && !e.is_quiet(), "{msg}");
        assert_eq!(NcclPlugin::load("none").expect_err("disabled"), LoadError::Disabled);
        assert!(LoadError::Disabled.is_quiet());
        assert!(LoadError::NotFound { attempts: vec![], default: true }.is_quiet());
    }
}
