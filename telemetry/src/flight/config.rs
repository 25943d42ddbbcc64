//! `OCCL_FLIGHT_RECORDER_SIZE`, `OCCL_FLIGHT_RECORDER_DIR` and `OCCL_FLIGHT_RECORDER_SIGNAL`.

use super::ring::{FlightRecorder, DEFAULT_CAPACITY, MAX_CAPACITY};
use std::ffi::OsString;
use std::fmt;
use std::path::PathBuf;

/// Operations kept per communicator; 0 disables the recorder. Default [`DEFAULT_CAPACITY`].
pub const SIZE_ENV: &str = "OCCL_FLIGHT_RECORDER_SIZE";
/// Directory the dumps go to (on timeout, on error, on SIGUSR1); unset: no dumps are written.
pub const DIR_ENV: &str = "OCCL_FLIGHT_RECORDER_DIR";
/// `SIGUSR1` (or `USR1`, `1`): SIGUSR1 dumps every live recorder into [`DIR_ENV`]. Unset or `0`:
/// occl leaves SIGUSR1 to the application (Slurm and Lightning use it to requeue a job).
pub const SIGNAL_ENV: &str = "OCCL_FLIGHT_RECORDER_SIGNAL";

/// A flight-recorder variable with a value we refuse.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FlightEnvError {
    /// The variable.
    pub var: &'static str,
    /// Its value (lossily decoded if it was not UTF-8).
    pub value: String,
    pub reason: String,
}

impl fmt::Display for FlightEnvError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}={:?}: {}", self.var, self.value, self.reason)
    }
}

impl std::error::Error for FlightEnvError {}

/// The flight recorder's part of the configuration, read once at init and passed down.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FlightConfig {
    /// Operations kept per communicator; 0: disabled.
    pub capacity: usize,
    /// Where dumps go; `None`: nowhere.
    pub dir: Option<PathBuf>,
    /// Whether SIGUSR1 dumps (only with a `dir`).
    pub signal: bool,
}

impl Default for FlightConfig {
    fn default() -> Self {
        FlightConfig { capacity: DEFAULT_CAPACITY, dir: None, signal: false }
    }
}

/// Parses a capacity: decimal digits (surrounding whitespace allowed), at most [`MAX_CAPACITY`].
pub fn parse_capacity(s: &str) -> Result<usize, String> {
    let t = s.trim();
    if t.is_empty() {
        return Err(format!("empty; expected a number of operations, 0 to {MAX_CAPACITY} (0 disables)"));
    }
    if !t.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("expected a decimal number of operations, 0 to {MAX_CAPACITY} (0 disables)"));
    }
    match t.parse::<usize>() {
        Ok(n) if n <= MAX_CAPACITY => Ok(n),
        _ => Err(format!("at most {MAX_CAPACITY} operations per communicator")),
    }
}

impl FlightConfig {
    /// Reads [`SIZE_ENV`] and [`DIR_ENV`] from the environment.
    pub fn from_env() -> Result<FlightConfig, FlightEnvError> {
        Self::from_lookup(|k| std::env::var_os(k))
    }

    /// As [`FlightConfig::from_env`], with variables from `get`.
    pub fn from_lookup(get: impl Fn(&str) -> Option<OsString>) -> Result<FlightConfig, FlightEnvError> {
        let err = |var, value: &OsString, reason: String| FlightEnvError {
            var,
            value: value.to_string_lossy().into_owned(),
            reason,
        };
        let capacity = match get(SIZE_ENV) {
            None => DEFAULT_CAPACITY,
            Some(v) => {
                let s = v.to_str().ok_or_else(|| err(SIZE_ENV, &v, "not UTF-8".to_owned()))?;
                parse_capacity(s).map_err(|r| err(SIZE_ENV, &v, r))?
            }
        };
        let dir = match get(DIR_ENV) {
            None => None,
            Some(v) if v.is_empty() => {
                return Err(err(DIR_ENV, &v, "empty path; unset the variable to write no dumps".to_owned()))
            }
            Some(v) => Some(PathBuf::from(v)),
        };
        let signal = match get(SIGNAL_ENV) {
            None => false,
            Some(v) => match v.to_string_lossy().trim().to_ascii_uppercase().as_str() {
                "" | "0" => false,
                "1" | "USR1" | "SIGUSR1" => true,
                _ => return Err(err(SIGNAL_ENV, &v, "expected SIGUSR1 (dump on SIGUSR1) or 0".to_owned())),
            },
        };
        if signal && dir.is_none() {
            let v = get(SIGNAL_ENV).unwrap_or_default();
            return Err(err(SIGNAL_ENV, &v, format!("SIGUSR1 dumps need {DIR_ENV} to say where they go")));
        }
        Ok(FlightConfig { capacity, dir, signal })
    }
}

impl FlightRecorder {
    /// [`SIZE_ENV`], or [`DEFAULT_CAPACITY`] when unset.
    pub fn capacity_from_env() -> Result<usize, FlightEnvError> {
        let get = |k: &str| if k == SIZE_ENV { std::env::var_os(k) } else { None };
        FlightConfig::from_lookup(get).map(|c| c.capacity)
    }
}
