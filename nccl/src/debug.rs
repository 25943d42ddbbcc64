//! NCCL's logging from the library: with `NCCL_DEBUG` set, occl's `tracing` events are written
//! in NCCL's line shape, filtered by `NCCL_DEBUG_SUBSYS`, to stderr or `NCCL_DEBUG_FILE`.
//!
//! ```text
//! host:pid:tid [dev] NCCL INFO <message>
//! host:pid:tid [dev] <target>:<line> NCCL WARN <message>
//! host:pid:tid [dev] <seconds> <target>:<line> NCCL TRACE <message>
//! ```
//!
//! `dev` is -1: host communicators have no CUDA device. Levels as NCCL's: `VERSION` (only the
//! version line), `WARN` (warnings and errors), `INFO` (and informational lines), `TRACE` (and
//! occl's debug and trace lines). Warnings pass whatever the subsystem mask, as in NCCL.
//!
//! Installed as the process's `tracing` subscriber on the first API call, only when
//! `NCCL_DEBUG` is set and no subscriber is installed already (a Rust host that has its own
//! keeps it).

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::sync::{Mutex, Once};
use std::time::Instant;
use tracing::{Event, Level, Metadata, Subscriber};
use tracing_subscriber::layer::{Context, Layer};
use tracing_subscriber::prelude::*;

/// NCCL's `NCCL_DEBUG` levels, ordered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum DebugLevel {
    Version,
    Warn,
    Info,
    Trace,
}

impl DebugLevel {
    /// `NCCL_DEBUG`'s value; `None` for unset, empty or `NONE` (NCCL's unknown values mean none too).
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

/// `NCCL_DEBUG_SUBSYS`: names separated by commas, `ALL`, or a list after `^` to leave out.
/// Unset: NCCL's default, INIT, BOOTSTRAP and ENV.
pub fn parse_subsys(v: Option<&str>) -> u64 {
    let Some(v) = v.map(str::trim).filter(|v| !v.is_empty()) else {
        return bit("INIT") | bit("BOOTSTRAP") | bit("ENV");
    };
    let (invert, list) = match v.strip_prefix('^') {
        Some(rest) => (true, rest),
        None => (false, v),
    };
    let mask = list
        .split(',')
        .map(|s| s.trim().to_ascii_uppercase())
        .map(|s| if s == "ALL" { u64::MAX } else { bit(&s) })
        .fold(0, |a, b| a | b);
    if invert {
        !mask
    } else {
        mask
    }
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
        let mut out = self.out.lock().unwrap_or_else(|p| p.into_inner());
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

/// `NCCL_DEBUG_FILE` with NCCL's `%h` (host) and `%p` (pid) filled in.
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

/// Installs the NCCL-shaped logger once, if `NCCL_DEBUG` asks for one.
pub fn init() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let Some(level) = std::env::var("NCCL_DEBUG").ok().as_deref().and_then(DebugLevel::parse) else { return };
        let host = short_hostname();
        let pid = std::process::id();
        let mut out: Box<dyn Write + Send> = Box::new(std::io::stderr());
        let mut open_failed = None;
        if let Ok(pattern) = std::env::var("NCCL_DEBUG_FILE") {
            let path = expand_file(&pattern, &host, pid);
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
                Err(e) => open_failed = Some(format!("NCCL_DEBUG_FILE {path}: {e}; logging to stderr")),
            }
        }
        let log = NcclLog {
            level,
            mask: parse_subsys(std::env::var("NCCL_DEBUG_SUBSYS").ok().as_deref()),
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
        log.write(&version);
        if tracing_subscriber::registry().with(log).try_init().is_err() {
            return; // the host program has its own subscriber: occl's lines go there
        }
        if let Some(w) = open_failed {
            tracing::warn!("{w}");
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_subsystems_and_file_names_as_ncclS() {
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
