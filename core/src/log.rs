//! occl's logging when the program has none: `tracing` events written in NCCL's line shape,
//! filtered by level and subsystem, to stderr or a file. The library and `libnccl.so` share it.
//!
//! ```text
//! host:pid:tid [dev] NCCL INFO <message>
//! host:pid:tid [dev] <target>:<line> NCCL WARN <message>
//! host:pid:tid [dev] <seconds> <target>:<line> NCCL TRACE <message>
//! ```
//!
//! Variables, the `OCCL_` name before the `NCCL_` one: `OCCL_DEBUG`/`NCCL_DEBUG` (`VERSION`: the
//! version line only, `WARN`: warnings and errors, `INFO`: the version line, warnings and
//! informational lines, `TRACE`
//! (or `ABORT`): and occl's debug and trace lines), `OCCL_DEBUG_SUBSYS`/`NCCL_DEBUG_SUBSYS`
//! (subsystems, mapped from `tracing` targets by [`subsystem_of`]), `OCCL_DEBUG_FILE`/
//! `NCCL_DEBUG_FILE` (`%h` host, `%p` pid). `dev` is -1: host communicators have no CUDA device.
//! Warnings pass whatever the subsystem mask, as in NCCL.
//!
//! [`init`] installs it once per process, at the first communicator (or the first C API call),
//! unless the program already set a `tracing` dispatcher: then occl's events go there. Its
//! default level is the caller's: `WARN` for the Rust library (a misconfiguration is never
//! silent), none for `libnccl.so` (as NCCL).

use crate::sync::lock;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::sync::{Mutex, Once};
use std::time::Instant;
use tracing::{Event, Level, Metadata, Subscriber};
use tracing_subscriber::layer::{Context, Layer};
use tracing_subscriber::prelude::*;

/// `OCCL_DEBUG`'s levels (NCCL's `NCCL_DEBUG`), ordered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum DebugLevel {
    Version,
    Warn,
    Info,
    Trace,
}

impl DebugLevel {
    /// A level's name; `None` for `NONE` and any other value (NCCL's unknown values mean none).
    pub fn parse(v: &str) -> Option<DebugLevel> {
        match v.trim().to_ascii_uppercase().as_str() {
            "VERSION" => Some(DebugLevel::Version),
            "WARN" => Some(DebugLevel::Warn),
            "INFO" => Some(DebugLevel::Info),
            "ABORT" | "TRACE" => Some(DebugLevel::Trace),
            _ => None,
        }
    }
}

/// NCCL's subsystems, in `NCCL_DEBUG_SUBSYS` bit order.
const SUBSYSTEMS: [&str; 18] = [
    "INIT",
    "COLL",
    "P2P",
    "SHM",
    "NET",
    "GRAPH",
    "TUNING",
    "ENV",
    "ALLOC",
    "CALL",
    "PROXY",
    "NVLS",
    "BOOTSTRAP",
    "REG",
    "PROFILE",
    "RAS",
    "",
    "",
];

fn bit(name: &str) -> u64 {
    SUBSYSTEMS.iter().position(|s| !s.is_empty() && *s == name).map_or(0, |i| 1 << i)
}

/// `OCCL_DEBUG_SUBSYS`: names separated by commas, `ALL`, or a list after `^` to leave out.
/// Unset: NCCL's default, INIT, BOOTSTRAP and ENV.
pub fn parse_subsys(v: Option<&str>) -> u64 {
    subsys_and_unknown(v).0
}

/// [`parse_subsys`] and the names in the list that are no subsystem.
fn subsys_and_unknown(v: Option<&str>) -> (u64, Vec<String>) {
    let Some(v) = v.map(str::trim).filter(|v| !v.is_empty()) else {
        return (bit("INIT") | bit("BOOTSTRAP") | bit("ENV"), Vec::new());
    };
    let (invert, list) = match v.strip_prefix('^') {
        Some(rest) => (true, rest),
        None => (false, v),
    };
    let names: Vec<String> = list.split(',').map(|s| s.trim().to_ascii_uppercase()).collect();
    let unknown = names.iter().filter(|s| *s != "ALL" && bit(s) == 0).cloned().collect();
    let mask = names.iter().map(|s| if s == "ALL" { u64::MAX } else { bit(s) }).fold(0, |a, b| a | b);
    (if invert { !mask } else { mask }, unknown)
}

/// The NCCL subsystem of an occl log line, from the module that logged it.
pub fn subsystem_of(target: &str) -> &'static str {
    let t = target.strip_prefix("occl::").unwrap_or(target);
    let starts = |p: &str| t.starts_with(p);
    if starts("bootstrap") || starts("auth") || starts("id") {
        "BOOTSTRAP"
    } else if starts("transport::shm") || starts("transport::fifo") {
        "SHM"
    } else if starts("transport") || target.starts_with("ibverbs") {
        "NET"
    } else if starts("coll::tune") {
        "TUNING"
    } else if starts("coll") || starts("group") || starts("copy") || starts("reduce") {
        "COLL"
    } else if starts("register") || starts("hostmem") {
        "REG"
    } else if starts("topo") {
        "GRAPH"
    } else if starts("profile") || target.starts_with("occl_telemetry") {
        "PROFILE"
    } else if starts("ras") || target.starts_with("occl_ras") {
        "RAS"
    } else if starts("config") || starts("env") {
        "ENV"
    } else if target.starts_with("nccl::coll") {
        "CALL"
    } else {
        "INIT"
    }
}

struct NcclLog {
    level: DebugLevel,
    mask: u64,
    host: String,
    pid: u32,
    start: Instant,
    out: Mutex<Box<dyn Write + Send>>,
}

impl NcclLog {
    fn wants(&self, meta: &Metadata<'_>) -> bool {
        let l = *meta.level();
        let need = if l <= Level::WARN {
            return self.level >= DebugLevel::Warn; // ERROR and WARN pass every mask
        } else if l == Level::INFO {
            DebugLevel::Info
        } else {
            DebugLevel::Trace
        };
        self.level >= need && self.mask & bit(subsystem_of(meta.target())) != 0
    }

    fn write(&self, line: &str) {
        let mut out = lock(&self.out);
        let _ = out.write_all(line.as_bytes());
        let _ = out.flush();
    }
}

/// The message and fields of an event, as one line.
#[derive(Default)]
struct Text(String);

impl tracing::field::Visit for Text {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        use std::fmt::Write as _;
        if field.name() == "message" {
            let _ = write!(self.0, "{value:?}");
        } else {
            let _ = write!(self.0, " {}={value:?}", field.name());
        }
    }
}

/// One line in NCCL's shape.
pub fn format_line(host: &str, pid: u32, tid: i64, level: &Level, at: (&str, u32, f64), msg: &str) -> String {
    let (target, line, secs) = at;
    let msg = msg.trim_end();
    if *level <= Level::WARN {
        format!("{host}:{pid}:{tid} [-1] {target}:{line} NCCL WARN {msg}\n")
    } else if *level == Level::INFO {
        format!("{host}:{pid}:{tid} [-1] NCCL INFO {msg}\n")
    } else {
        format!("{host}:{pid}:{tid} [-1] {secs:.6} {target}:{line} NCCL TRACE {msg}\n")
    }
}

impl<S: Subscriber> Layer<S> for NcclLog {
    fn register_callsite(&self, meta: &'static Metadata<'static>) -> tracing::subscriber::Interest {
        if self.wants(meta) {
            tracing::subscriber::Interest::always()
        } else {
            tracing::subscriber::Interest::never()
        }
    }

    fn enabled(&self, meta: &Metadata<'_>, _: Context<'_, S>) -> bool {
        self.wants(meta)
    }

    fn on_event(&self, event: &Event<'_>, _: Context<'_, S>) {
        let meta = event.metadata();
        let mut text = Text::default();
        event.record(&mut text);
        // SAFETY: gettid has no arguments and cannot fail.
        let tid = unsafe { libc::syscall(libc::SYS_gettid) };
        let at = (meta.target(), meta.line().unwrap_or(0), self.start.elapsed().as_secs_f64());
        self.write(&format_line(&self.host, self.pid, tid, meta.level(), at, &text.0));
    }
}

/// The host name up to its first dot, as NCCL prints it.
fn short_hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most buf.len() bytes into the live buffer.
    let ok = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) } == 0;
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    let name = if ok { String::from_utf8_lossy(&buf[..end]).into_owned() } else { "localhost".into() };
    name.split('.').next().unwrap_or_default().to_string()
}

/// `OCCL_DEBUG_FILE` with NCCL's `%h` (host) and `%p` (pid) filled in.
pub fn expand_file(pattern: &str, host: &str, pid: u32) -> String {
    let mut out = String::new();
    let mut chars = pattern.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('h') => out.push_str(host),
            Some('p') => out.push_str(&pid.to_string()),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

/// The logging variables as set: the name each came from and its value.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct LogVars {
    pub debug: Option<(&'static str, String)>,
    pub subsys: Option<(&'static str, String)>,
    pub file: Option<(&'static str, String)>,
}

impl LogVars {
    /// The first of each `OCCL_`/`NCCL_` pair that `get` has.
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> LogVars {
        let first = |names: [&'static str; 2]| names.into_iter().find_map(|n| get(n).map(|v| (n, v)));
        LogVars {
            debug: first(["OCCL_DEBUG", "NCCL_DEBUG"]),
            subsys: first(["OCCL_DEBUG_SUBSYS", "NCCL_DEBUG_SUBSYS"]),
            file: first(["OCCL_DEBUG_FILE", "NCCL_DEBUG_FILE"]),
        }
    }

    /// The level (`default` when the variable is unset) and the warnings about values that
    /// mean nothing (unknown subsystems; an unknown level, which logs nothing as in NCCL).
    pub fn level(&self, default: Option<DebugLevel>) -> (Option<DebugLevel>, Vec<String>) {
        let mut warnings = Vec::new();
        let level = match &self.debug {
            None => default,
            Some((n, v)) => {
                let l = DebugLevel::parse(v);
                if l.is_none() && !v.trim().eq_ignore_ascii_case("NONE") && !v.trim().is_empty() {
                    warnings.push(format!("{n}={v:?} is no level (VERSION, WARN, INFO, TRACE, NONE): logging is off"));
                }
                l
            }
        };
        if let Some((n, v)) = &self.subsys {
            let unknown = subsys_and_unknown(Some(v)).1;
            if !unknown.is_empty() {
                warnings.push(format!("{n}={v:?}: no subsystem named {}", unknown.join(", ")));
            }
        }
        (level, warnings)
    }
}

/// Installs the NCCL-shaped logger once per process, with `default` as the level when neither
/// `OCCL_DEBUG` nor `NCCL_DEBUG` is set. Nothing is installed when the program has its own
/// `tracing` dispatcher (occl's events, warnings about these variables included, go there) or
/// when the level is none.
pub fn init(default: Option<DebugLevel>) {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let vars = LogVars::from_lookup(|k| std::env::var(k).ok());
        let (level, warnings) = vars.level(default);
        if tracing::dispatcher::has_been_set() {
            for w in &warnings {
                tracing::warn!("occl: {w}");
            }
            return;
        }
        let Some(level) = level else {
            // Logging is off; a variable that turned it off by mistake still says so once.
            for w in &warnings {
                eprintln!("occl: {w}");
            }
            return;
        };
        let host = short_hostname();
        let pid = std::process::id();
        let mut out: Box<dyn Write + Send> = Box::new(std::io::stderr());
        let mut open_failed = None;
        if let Some((name, pattern)) = &vars.file {
            let path = expand_file(pattern, &host, pid);
            // Not through a symlink: jobs (often root) write these into shared directories.
            let opened = std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o644)
                .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
                .open(&path);
            match opened {
                Ok(f) => out = Box::new(f),
                Err(e) => open_failed = Some(format!("{name} {path}: {e}; logging to stderr")),
            }
        }
        let log = NcclLog {
            level,
            mask: parse_subsys(vars.subsys.as_ref().map(|(_, v)| v.as_str())),
            host,
            pid,
            start: Instant::now(),
            out: Mutex::new(out),
        };
        let version = format!(
            "{}:{}:{} [-1] NCCL INFO NCCL version {}+occl (host buffers)\n",
            log.host,
            pid,
            // SAFETY: as in on_event.
            unsafe { libc::syscall(libc::SYS_gettid) },
            occl_types::NCCL_VERSION,
        );
        // As NCCL: the version line at VERSION and at INFO and above, not among warnings only.
        if level != DebugLevel::Warn {
            log.write(&version);
        }
        // The dispatcher alone: a `log` logger the program may have is left as it is.
        if tracing::subscriber::set_global_default(tracing_subscriber::registry().with(log)).is_err() {
            return; // set between the check and here: occl's lines go to that one
        }
        for w in open_failed.iter().chain(&warnings) {
            tracing::warn!("occl: {w}");
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_subsystems_and_file_names_as_nccls() {
        assert_eq!(DebugLevel::parse("info"), Some(DebugLevel::Info));
        assert_eq!(DebugLevel::parse("WARN"), Some(DebugLevel::Warn));
        assert_eq!(DebugLevel::parse("TRACE"), Some(DebugLevel::Trace));
        assert_eq!(DebugLevel::parse(""), None);
        assert_eq!(parse_subsys(None), bit("INIT") | bit("BOOTSTRAP") | bit("ENV"));
        assert_eq!(parse_subsys(Some("COLL,net")), bit("COLL") | bit("NET"));
        assert_eq!(parse_subsys(Some("^INIT")) & bit("INIT"), 0);
        assert_ne!(parse_subsys(Some("^INIT")) & bit("SHM"), 0);
        assert_eq!(parse_subsys(Some("ALL")), u64::MAX);
        assert_eq!(subsystem_of("occl::bootstrap::root"), "BOOTSTRAP");
        assert_eq!(subsystem_of("occl::transport::shm::fifo"), "SHM");
        assert_eq!(subsystem_of("occl::transport::tcp"), "NET");
        assert_eq!(subsystem_of("occl::coll::tune"), "TUNING");
        assert_eq!(subsystem_of("occl::init_timer"), "INIT");
        assert_eq!(subsystem_of("occl_ras::mesh"), "RAS");
        let vars = |pairs: &'static [(&'static str, &'static str)]| {
            LogVars::from_lookup(|k| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string()))
        };
        let v = vars(&[("NCCL_DEBUG", "INFO"), ("OCCL_DEBUG", "WARN"), ("NCCL_DEBUG_FILE", "/tmp/x")]);
        assert_eq!(v.debug, Some(("OCCL_DEBUG", "WARN".into())));
        assert_eq!(v.file, Some(("NCCL_DEBUG_FILE", "/tmp/x".into())));
        assert_eq!(vars(&[]).level(Some(DebugLevel::Warn)), (Some(DebugLevel::Warn), vec![]));
        assert_eq!(vars(&[]).level(None), (None, vec![]));
        assert_eq!(vars(&[("OCCL_DEBUG", "none")]).level(Some(DebugLevel::Warn)), (None, vec![]));
        let (l, w) = vars(&[("OCCL_DEBUG", "LOUD")]).level(Some(DebugLevel::Warn));
        assert_eq!((l, w.len()), (None, 1));
        assert!(w[0].contains("OCCL_DEBUG=\"LOUD\""), "{w:?}");
        let (l, w) = vars(&[("NCCL_DEBUG_SUBSYS", "INIT,NETT")]).level(Some(DebugLevel::Info));
        assert_eq!(l, Some(DebugLevel::Info));
        assert!(w.len() == 1 && w[0].contains("NCCL_DEBUG_SUBSYS") && w[0].contains("NETT"), "{w:?}");
        assert_eq!(expand_file("/tmp/nccl.%h.%p.log%", "node1", 42), "/tmp/nccl.node1.42.log%");
        assert_eq!(
            format_line("node1", 42, 43, &Level::INFO, ("occl::comm", 7, 1.5), "Init done\n"),
            "node1:42:43 [-1] NCCL INFO Init done\n"
        );
        assert_eq!(
            format_line("node1", 42, 43, &Level::ERROR, ("occl::comm", 7, 1.5), "rank 1 failed"),
            "node1:42:43 [-1] occl::comm:7 NCCL WARN rank 1 failed\n"
        );
        assert_eq!(
            format_line("n", 1, 2, &Level::DEBUG, ("occl::coll", 9, 0.25), "step"),
            "n:1:2 [-1] 0.250000 occl::coll:9 NCCL TRACE step\n"
        );
    }
}
