//! The trace exporter's settings and their environment variables.

use std::path::PathBuf;

/// Turns trace files on: the directory each rank's file is written to (created if missing).
pub const DIR_ENV: &str = "OCCL_TRACE_DIR";
/// `1`/`true`/`yes`: write `.json.gz` (gzip) instead of `.json`. HTA reads both.
pub const GZIP_ENV: &str = "OCCL_TRACE_GZIP";
/// Events kept per rank file; later ones are dropped and counted in the file's metadata.
pub const MAX_EVENTS_ENV: &str = "OCCL_TRACE_MAX_EVENTS";
/// `none`, `ops` (default) or `steps`: which proxy rows (CPU-side, for Perfetto) the file gets.
pub const PROXY_ENV: &str = "OCCL_TRACE_PROXY";

/// Default bound on events per rank file: about 200 bytes each, so ~50 MiB at most, which holds
/// tens of thousands of collectives (a few training steps, as PyTorch's profiler takes).
pub const DEFAULT_MAX_EVENTS: usize = 250_000;
/// The most `OCCL_TRACE_MAX_EVENTS` may ask for: the events are kept in memory until the file
/// is written, so this bounds a rank's trace memory (about 2 GB) whatever the variable says.
pub const LIMIT_MAX_EVENTS: usize = 10_000_000;

/// Which proxy events become rows. HTA ignores them all (they are CPU rows of categories it
/// does not analyse); Perfetto shows them as lanes per peer and direction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProxyDetail {
    /// Collectives and their calls only.
    None,
    /// Plus one row per ProxyOp (peer, direction, steps).
    Ops,
    /// Plus one row per ProxyStep (each slice, with its wait states): many events per operation.
    Steps,
}

/// Settings of a [`super::TraceExporter`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceConfig {
    pub dir: PathBuf,
    pub gzip: bool,
    pub max_events: usize,
    pub proxy: ProxyDetail,
}

/// A trace variable with a value it cannot take.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{var}={value:?}: expected {expected}")]
pub struct TraceConfigError {
    pub var: &'static str,
    pub value: String,
    pub expected: &'static str,
}

impl TraceConfig {
    /// Files in `dir`, uncompressed, with the default bound and ProxyOp rows.
    pub fn new(dir: impl Into<PathBuf>) -> TraceConfig {
        TraceConfig { dir: dir.into(), gzip: false, max_events: DEFAULT_MAX_EVENTS, proxy: ProxyDetail::Ops }
    }

    /// From the process environment; `Ok(None)` when `OCCL_TRACE_DIR` is unset or empty.
    pub fn from_env() -> Result<Option<TraceConfig>, TraceConfigError> {
        Self::from_lookup(|k| std::env::var(k).ok())
    }

    /// From any variable lookup (tests).
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Option<TraceConfig>, TraceConfigError> {
        let Some(dir) = get(DIR_ENV).filter(|d| !d.trim().is_empty()) else { return Ok(None) };
        let mut c = TraceConfig::new(dir.trim());
        let bad = |var, value: &str, expected| TraceConfigError { var, value: value.to_owned(), expected };
        if let Some(v) = get(GZIP_ENV) {
            c.gzip = match v.trim().to_ascii_lowercase().as_str() {
                "" | "0" | "false" | "no" | "off" => false,
                "1" | "true" | "yes" | "on" => true,
                _ => return Err(bad(GZIP_ENV, &v, "0 or 1")),
            };
        }
        if let Some(v) = get(MAX_EVENTS_ENV) {
            c.max_events = match v.trim().parse::<usize>() {
                Ok(n) if (1..=LIMIT_MAX_EVENTS).contains(&n) => n,
                _ => return Err(bad(MAX_EVENTS_ENV, &v, "a number of events from 1 to 10000000")),
            };
        }
        if let Some(v) = get(PROXY_ENV) {
            c.proxy = match v.trim().to_ascii_lowercase().as_str() {
                "none" | "0" => ProxyDetail::None,
                "" | "ops" => ProxyDetail::Ops,
                "steps" => ProxyDetail::Steps,
                _ => return Err(bad(PROXY_ENV, &v, "none, ops or steps")),
            };
        }
        Ok(Some(c))
    }
}
