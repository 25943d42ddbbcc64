//! Why a plugin could not be loaded.

use std::fmt;

/// One library name that was tried, and the dynamic linker's reason it did not open.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attempt {
    pub name: String,
    /// `dlerror()` text.
    pub error: String,
}

impl fmt::Display for Attempt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.name, self.error)
    }
}

/// Loading an NCCL profiler plugin failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LoadError {
    /// The specification was `none`.
    #[error("profiler plugin disabled (\"none\")")]
    Disabled,
    /// No candidate library opened.
    #[error("no profiler plugin library could be opened; tried {}", list(attempts))]
    NotFound {
        attempts: Vec<Attempt>,
        /// Only the default `libnccl-profiler.so` was tried (its absence is normal).
        default: bool,
    },
    /// The library opened but exports no profiler table.
    #[error("{origin} exports none of ncclProfiler_v6 … ncclProfiler_v1; not a profiler plugin")]
    NoSymbol { origin: String },
    /// The table has a NULL entry, which NCCL would call (or read) without a check.
    #[error("{origin}: {symbol}.{field} is NULL; refusing the plugin")]
    NullEntry { origin: String, symbol: &'static str, field: &'static str },
}

impl LoadError {
    /// Whether this is the normal "nothing configured" case: disabled, or the default library
    /// absent. Those are logged at debug level, everything else as a warning.
    pub fn is_quiet(&self) -> bool {
        matches!(self, LoadError::Disabled | LoadError::NotFound { default: true, .. })
    }
}

fn list(attempts: &[Attempt]) -> String {
    attempts.iter().map(Attempt::to_string).collect::<Vec<_>>().join("; ")
}
