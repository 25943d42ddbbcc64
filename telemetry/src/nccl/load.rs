//! Finding and opening a plugin library by NCCL 2.28+'s rules (reference §2), and probing it for
//! `ncclProfiler_v6` … `ncclProfiler_v1`.

use super::abi::{Finalize, InitV1, InitV4, InitV5, RecordEventState, StartEvent, StopEvent, Table};
use super::error::{Attempt, LoadError};
use super::ApiVersion;
use std::ffi::{c_char, c_void, CStr, CString};
use std::ptr;

/// The variables naming the plugin, first one set wins (as for the event mask).
pub const PLUGIN_ENV_VARS: [&str; 2] = ["OCCL_PROFILER_PLUGIN", "NCCL_PROFILER_PLUGIN"];

/// The library NCCL opens when the variable is unset or empty.
pub const DEFAULT_LIBRARY: &str = "libnccl-profiler.so";

/// Where a plugin specification points.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Resolution {
    /// `none` (any case): no plugin.
    Disabled,
    /// A case-insensitive prefix of `STATIC_PLUGIN`: the symbols are looked up in the main
    /// program (`dlopen(NULL)`).
    MainProgram,
    /// Library names to `dlopen`, in order; the first that opens is used.
    Files {
        names: Vec<String>,
        /// The spec was unset or empty: a missing default library is not worth a warning.
        default: bool,
    },
}

/// Resolves a plugin specification (the variable's value; "" = unset) the way NCCL 2.27.5+ does:
/// `dlopen(V)` first, then, if V has no `/` and is not of the form `lib*.so`,
/// `libnccl-profiler-V.so`. Bare names go through the dynamic linker's search
/// (LD_LIBRARY_PATH, ld.so.cache).
pub fn resolve(spec: &str) -> Resolution {
    if spec.is_empty() {
        return Resolution::Files { names: vec![DEFAULT_LIBRARY.to_owned()], default: true };
    }
    if spec.eq_ignore_ascii_case("none") {
        return Resolution::Disabled;
    }
    const STATIC: &str = "STATIC_PLUGIN";
    if spec.len() <= STATIC.len() && STATIC.as_bytes()[..spec.len()].eq_ignore_ascii_case(spec.as_bytes()) {
        return Resolution::MainProgram;
    }
    let mut names = vec![spec.to_owned()];
    let lib_form = spec.starts_with("lib") && spec.ends_with(".so");
    if !spec.contains('/') && !lib_form {
        names.push(format!("libnccl-profiler-{spec}.so"));
    }
    Resolution::Files { names, default: false }
}

/// The plugin specification from the environment: the first of [`PLUGIN_ENV_VARS`] that is set,
/// with its name; `None` when neither is (use the default library).
pub fn spec_from_env() -> Option<(&'static str, String)> {
    PLUGIN_ENV_VARS.iter().find_map(|var| std::env::var(var).ok().map(|v| (*var, v)))
}

/// How a library was found, so it can be opened again after the last communicator closed it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Origin {
    File(String),
    MainProgram,
}

impl Origin {
    pub(crate) fn describe(&self) -> String {
        match self {
            Origin::File(n) => n.clone(),
            Origin::MainProgram => "the main program".to_owned(),
        }
    }
}

/// The init function, typed by version (the argument orders differ).
#[derive(Clone, Copy)]
pub(crate) enum Init {
    /// v1–v3.
    V1(InitV1),
    V4(InitV4),
    /// v5, v6.
    V5(InitV5),
}

/// A validated function table: every pointer non-NULL.
#[derive(Clone, Copy)]
pub(crate) struct Funcs {
    pub init: Init,
    pub start_event: StartEvent,
    pub stop_event: StopEvent,
    pub record_event_state: RecordEventState,
    pub finalize: Finalize,
}

/// An open plugin library; `dlclose`d on drop. Communicators' sinks hold it in an `Arc`, so the
/// function pointers stay valid while any of them lives.
pub(crate) struct Library {
    handle: *mut c_void,
    pub origin: Origin,
    pub version: ApiVersion,
    /// The table's `name`, copied.
    pub name: String,
    pub funcs: Funcs,
}

// SAFETY: `handle` is only passed to dlclose (thread-safe) once, in Drop; the rest is plain data
// and function pointers into a library that stays loaded while this value lives.
unsafe impl Send for Library {}
// SAFETY: as above; nothing is mutated through a shared reference.
unsafe impl Sync for Library {}

impl Drop for Library {
    fn drop(&mut self) {
        // SAFETY: `handle` came from a successful dlopen and is closed exactly once, here. No
        // function pointer of this library outlives `self` (holders keep the `Arc`).
        unsafe {
            libc::dlclose(self.handle);
        }
    }
}

impl std::fmt::Debug for Library {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Library")
            .field("origin", &self.origin)
            .field("version", &self.version)
            .field("name", &self.name)
            .finish()
    }
}

/// The text of the last dynamic-linker error of this thread.
fn dlerror_text() -> String {
    // SAFETY: dlerror returns NULL or a NUL-terminated string owned by libc, valid until the next
    // dl* call on this thread; it is copied at once.
    unsafe {
        let e = libc::dlerror();
        if e.is_null() {
            "unknown dynamic-linker error".to_owned()
        } else {
            CStr::from_ptr(e).to_string_lossy().into_owned()
        }
    }
}

/// `dlopen(name, RTLD_NOW|RTLD_LOCAL)`; `None` opens the main program.
fn dlopen(name: Option<&str>) -> Result<*mut c_void, String> {
    let c = match name {
        Some(n) => Some(CString::new(n).map_err(|_| "the name contains a NUL byte".to_owned())?),
        None => None,
    };
    let p = c.as_ref().map_or(ptr::null(), |c| c.as_ptr());
    // SAFETY: `p` is NULL or a NUL-terminated string that outlives the call. Running the
    // library's constructors is what loading a plugin means.
    let h = unsafe { libc::dlopen(p, libc::RTLD_NOW | libc::RTLD_LOCAL) };
    if h.is_null() {
        Err(dlerror_text())
    } else {
        Ok(h)
    }
}

fn close(handle: *mut c_void) {
    // SAFETY: `handle` came from a successful dlopen and is not used afterwards.
    unsafe {
        libc::dlclose(handle);
    }
}

/// Reads the table at `sym`, refusing it if any entry is NULL (NCCL would call them unchecked).
///
/// # Safety
/// `sym` must point to a readable `ncclProfiler_vN` struct of the version whose init type is `I`.
unsafe fn read_table<I: Copy>(
    sym: *const c_void,
    origin: &Origin,
    symbol: &'static str,
    wrap: fn(I) -> Init,
) -> Result<(String, Funcs), LoadError> {
    // SAFETY: guaranteed by the caller; unaligned because a data symbol's alignment is the
    // plugin's business. Every bit pattern is a valid `Table` (pointers and `Option<fn>`).
    let t = unsafe { ptr::read_unaligned(sym.cast::<Table<I>>()) };
    let null = |field| LoadError::NullEntry { origin: origin.describe(), symbol, field };
    if t.name.is_null() {
        return Err(null("name"));
    }
    let funcs = Funcs {
        init: wrap(t.init.ok_or_else(|| null("init"))?),
        start_event: t.start_event.ok_or_else(|| null("startEvent"))?,
        stop_event: t.stop_event.ok_or_else(|| null("stopEvent"))?,
        record_event_state: t.record_event_state.ok_or_else(|| null("recordEventState"))?,
        finalize: t.finalize.ok_or_else(|| null("finalize"))?,
    };
    // SAFETY: non-NULL (checked); the ABI requires `name` to be a NUL-terminated string that
    // lives as long as the library. Copied at once.
    let name = unsafe { CStr::from_ptr(t.name.cast::<c_char>()) }.to_string_lossy().into_owned();
    Ok((name, funcs))
}

/// Looks up the newest `ncclProfiler_vN` (or exactly `only`) in an open library.
fn probe(
    handle: *mut c_void,
    origin: &Origin,
    only: Option<ApiVersion>,
) -> Result<(ApiVersion, String, Funcs), LoadError> {
    for v in ApiVersion::NEWEST_FIRST {
        if only.is_some_and(|o| o != v) {
            continue;
        }
        // SAFETY: `handle` is an open library; the symbol name is NUL-terminated.
        let sym = unsafe { libc::dlsym(handle, v.symbol().as_ptr()) };
        if sym.is_null() {
            continue;
        }
        let symbol = v.symbol_name();
        // SAFETY (each arm): `sym` is the address of the data symbol `ncclProfiler_vN`, which by
        // the ABI is that version's table.
        let (name, funcs) = match v {
            ApiVersion::V1 | ApiVersion::V2 | ApiVersion::V3 => unsafe {
                read_table::<InitV1>(sym, origin, symbol, Init::V1)?
            },
            ApiVersion::V4 => unsafe { read_table::<InitV4>(sym, origin, symbol, Init::V4)? },
            ApiVersion::V5 | ApiVersion::V6 => unsafe { read_table::<InitV5>(sym, origin, symbol, Init::V5)? },
        };
        return Ok((v, name, funcs));
    }
    Err(LoadError::NoSymbol { origin: origin.describe() })
}

/// Probes an open handle; closes it on failure.
fn adopt(handle: *mut c_void, origin: Origin, only: Option<ApiVersion>) -> Result<Library, LoadError> {
    match probe(handle, &origin, only) {
        Ok((version, name, funcs)) => Ok(Library { handle, origin, version, name, funcs }),
        Err(e) => {
            close(handle);
            Err(e)
        }
    }
}

/// Opens the first library of a resolution that loads and probes it. A library that opens but
/// has no usable table is an error at once (NCCL does not go on to the next name either).
pub(crate) fn open(res: &Resolution) -> Result<Library, LoadError> {
    match res {
        Resolution::Disabled => Err(LoadError::Disabled),
        Resolution::MainProgram => {
            let h = dlopen(None).map_err(|error| LoadError::NotFound {
                attempts: vec![Attempt { name: Origin::MainProgram.describe(), error }],
                default: false,
            })?;
            adopt(h, Origin::MainProgram, None)
        }
        Resolution::Files { names, default } => {
            let mut attempts = Vec::new();
            for n in names {
                match dlopen(Some(n)) {
                    Ok(h) => return adopt(h, Origin::File(n.clone()), None),
                    Err(error) => attempts.push(Attempt { name: n.clone(), error }),
                }
            }
            Err(LoadError::NotFound { attempts, default: *default })
        }
    }
}

/// Opens a library again (after the last communicator closed it), expecting the same version.
pub(crate) fn reopen(origin: &Origin, version: ApiVersion) -> Result<Library, LoadError> {
    let name = match origin {
        Origin::File(n) => Some(n.as_str()),
        Origin::MainProgram => None,
    };
    let h = dlopen(name).map_err(|error| LoadError::NotFound {
        attempts: vec![Attempt { name: origin.describe(), error }],
        default: false,
    })?;
    adopt(h, origin.clone(), Some(version))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(names: &[&str]) -> Resolution {
        Resolution::Files { names: names.iter().map(|s| s.to_string()).collect(), default: false }
    }

    #[test]
    fn unset_or_empty_means_the_default_library() {
        assert_eq!(resolve(""), Resolution::Files { names: vec!["libnccl-profiler.so".into()], default: true });
    }

    #[test]
    fn none_disables_in_any_case() {
        for s in ["none", "NONE", "None", "nOnE"] {
            assert_eq!(resolve(s), Resolution::Disabled, "{s}");
        }
        assert_eq!(resolve("nones"), files(&["nones", "libnccl-profiler-nones.so"]));
    }

    #[test]
    fn static_plugin_prefixes_mean_the_main_program() {
        for s in ["STATIC_PLUGIN", "static_plugin", "STATIC", "st", "S", "Static_P"] {
            assert_eq!(resolve(s), Resolution::MainProgram, "{s}");
        }
        assert_eq!(resolve("STATIC_PLUGINS"), files(&["STATIC_PLUGINS", "libnccl-profiler-STATIC_PLUGINS.so"]));
        assert_eq!(resolve("statik"), files(&["statik", "libnccl-profiler-statik.so"]));
    }

    #[test]
    fn bare_names_also_try_the_nccl_profiler_form() {
        assert_eq!(resolve("inspector"), files(&["inspector", "libnccl-profiler-inspector.so"]));
        assert_eq!(resolve("occl.so"), files(&["occl.so", "libnccl-profiler-occl.so.so"]));
    }

    #[test]
    fn paths_and_lib_so_names_are_opened_as_given() {
        assert_eq!(resolve("/opt/p/libx.so"), files(&["/opt/p/libx.so"]));
        assert_eq!(resolve("./x.so"), files(&["./x.so"]));
        assert_eq!(resolve("rel/dir/x"), files(&["rel/dir/x"]));
        assert_eq!(resolve("libnccl-profiler-occl.so"), files(&["libnccl-profiler-occl.so"]));
        assert_eq!(resolve("libfoo.so"), files(&["libfoo.so"]));
        // `lib*.so` means exactly that: a versioned name still gets the second candidate.
        assert_eq!(resolve("libfoo.so.1"), files(&["libfoo.so.1", "libnccl-profiler-libfoo.so.1.so"]));
    }
}
