//! [`TraceExporter`]: keeps each finished span of interest in its rank file's bounded log and
//! writes the files at communicator finalize, at [`super::flush`] and at process exit.
//!
//! Rank files: a process usually is one rank, and all its communicators (the world and any
//! splits) go into one file whose rank is the one in its largest communicator, as PyTorch writes
//! one file per process. A process holding several ranks of one communicator (occl's threads
//! mode, or one process driving several GPUs under NCCL) gets one file per rank: a communicator
//! joins the first file that has no communicator with its id yet. Sub-communicators of such a
//! process are placed by that same rule, which cannot tell which thread they belong to.

use super::config::{ProxyDetail, TraceConfig};
use super::log::Log;
use super::record::Rec;
use super::render::{self, FileView};
use super::{steps, threads, write};
use crate::event::EventType;
use crate::mask::EventMask;
use crate::spans::{CommMeta, Exporter, Span};
use std::io::{self, Write};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Mutex, PoisonError, RwLock, Weak};

/// Communicators one file can hold (a record stores the ordinal in 16 bits).
const MAX_COMMS_PER_FILE: usize = u16::MAX as usize;

/// One rank's trace file.
struct RankFile {
    /// Its number among this exporter's files (0 for the first), for a unique file name.
    index: usize,
    log: Log<Rec>,
    comms: Mutex<Vec<Arc<CommMeta>>>,
    /// The path last written; the lock also keeps two writers of this file apart.
    written: Mutex<Option<PathBuf>>,
}

struct CommSlot {
    comm: Arc<CommMeta>,
    file: Arc<RankFile>,
    ordinal: u16,
}

#[derive(Default)]
struct State {
    files: Vec<Arc<RankFile>>,
    comms: Vec<CommSlot>,
}

struct Inner {
    cfg: TraceConfig,
    host: String,
    pid: u32,
    /// Written on communicator init only; the hot path takes it shared to find a span's file.
    state: RwLock<State>,
    /// A write failed and was reported: the same directory keeps failing the same way at every
    /// communicator destroy and at exit, so later failures are only logged at debug level.
    warned: AtomicBool,
}

/// Writes one Kineto/Chrome trace file per rank for HTA and Perfetto (see the module docs).
pub struct TraceExporter {
    inner: Arc<Inner>,
}

/// Every live exporter, for [`super::flush`] and the exit handler.
static LIVE: Mutex<Vec<Weak<Inner>>> = Mutex::new(Vec::new());

/// Set by the exit handler: from then on nothing may log through `tracing`, whose subscribers
/// keep thread-local state that the C runtime has already destroyed (using it panics).
static AT_EXIT: AtomicBool = AtomicBool::new(false);

/// A warning: through `tracing`, or straight to stderr once the process is exiting.
fn warn(msg: std::fmt::Arguments<'_>) {
    if AT_EXIT.load(Relaxed) {
        let _ = writeln!(io::stderr(), "occl trace: WARN {msg}");
    } else {
        tracing::warn!("occl trace: {msg}");
    }
}

fn hostname() -> String {
    crate::files::read_to_string_capped(
        std::path::Path::new("/proc/sys/kernel/hostname"),
        crate::files::MAX_SYSTEM_FILE,
    )
    .ok()
    .map(|h| h.trim().to_owned())
    .filter(|h| !h.is_empty())
    .unwrap_or_else(|| "localhost".into())
}

/// A host name made safe for a file name.
fn file_safe(s: &str) -> String {
    s.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '.' { c } else { '_' }).collect()
}

impl TraceExporter {
    pub fn new(cfg: TraceConfig) -> TraceExporter {
        let inner = Arc::new(Inner {
            cfg,
            host: hostname(),
            pid: std::process::id(),
            state: RwLock::new(State::default()),
            warned: AtomicBool::new(false),
        });
        {
            let mut live = LIVE.lock().unwrap_or_else(PoisonError::into_inner);
            live.retain(|w| w.strong_count() > 0);
            live.push(Arc::downgrade(&inner));
        }
        steps::RECORDING.store(true, Relaxed);
        super::exit::install(flush_at_exit);
        TraceExporter { inner }
    }

    /// From `OCCL_TRACE_*` ([`TraceConfig::from_env`]); `None` when tracing is off or a variable is
    /// invalid (logged).
    pub fn from_env() -> Option<TraceExporter> {
        match TraceConfig::from_env() {
            Ok(Some(cfg)) => Some(TraceExporter::new(cfg)),
            Ok(None) => None,
            Err(e) => {
                tracing::warn!("occl trace: {e}; trace files are off");
                None
            }
        }
    }

    pub fn config(&self) -> &TraceConfig {
        &self.inner.cfg
    }

    /// Writes every rank file now; the paths written, or why not.
    pub fn write_all(&self) -> Vec<io::Result<PathBuf>> {
        self.inner.write_all()
    }
}

impl Inner {
    fn files(&self) -> Vec<Arc<RankFile>> {
        self.state.read().unwrap_or_else(PoisonError::into_inner).files.clone()
    }

    fn write_all(&self) -> Vec<io::Result<PathBuf>> {
        self.files().iter().map(|f| self.write(f)).collect()
    }

    fn write(&self, f: &RankFile) -> io::Result<PathBuf> {
        let mut written = f.written.lock().unwrap_or_else(PoisonError::into_inner);
        let comms = f.comms.lock().unwrap_or_else(PoisonError::into_inner).clone();
        let rank = render::world(&comms).and_then(|w| comms.get(w)).map_or(0, |c| c.rank);
        let ext = if self.cfg.gzip { "json.gz" } else { "json" };
        let suffix = if f.index > 0 { format!("-{}", f.index) } else { String::new() };
        let name = format!("occl-trace-rank{rank}-{}-{}{suffix}.{ext}", file_safe(&self.host), self.pid);
        let path = self.cfg.dir.join(name);
        let (steps, steps_dropped) = steps::finished();
        let threads = threads::names();
        let view = FileView {
            comms: &comms,
            recs: f.log.iter().collect(),
            steps: &steps,
            threads: &threads,
            pid: self.pid,
            host: &self.host,
            proxy: self.cfg.proxy,
            events_dropped: f.log.dropped(),
            max_events: f.log.capacity(),
            steps_dropped,
        };
        if view.events_dropped > 0 {
            warn(format_args!(
                "rank {rank}: {} events dropped past OCCL_TRACE_MAX_EVENTS={}",
                view.events_dropped, view.max_events
            ));
        }
        let path = write::atomic(&path, self.cfg.gzip, |w| render::render(&view, w))?;
        // The rank can change when a larger communicator joins later: remove the old name.
        if let Some(old) = written.replace(path.clone()) {
            if old != path {
                let _ = std::fs::remove_file(old);
            }
        }
        if !AT_EXIT.load(Relaxed) {
            tracing::debug!("occl trace: wrote {}", path.display());
        }
        Ok(path)
    }

    /// Writes the files and reports a failure (an unwritable `OCCL_TRACE_DIR`) once: a trace
    /// that cannot be written never fails the job.
    fn write_and_report(&self, files: &[Arc<RankFile>]) {
        for f in files {
            let Err(e) = self.write(f) else { continue };
            if !self.warned.swap(true, Relaxed) {
                warn(format_args!(
                    "cannot write a trace file ({}): {e}; the job goes on without it (later failures are logged at \
                     debug level)",
                    super::config::DIR_ENV
                ));
            } else if !AT_EXIT.load(Relaxed) {
                tracing::debug!("occl trace: {e}");
            }
        }
    }

    /// The file of a communicator seen by `comm_init`.
    fn file_of(&self, comm: &Arc<CommMeta>) -> Option<Arc<RankFile>> {
        let st = self.state.read().unwrap_or_else(PoisonError::into_inner);
        st.comms.iter().rev().find(|s| Arc::ptr_eq(&s.comm, comm)).map(|s| s.file.clone())
    }
}

impl Exporter for TraceExporter {
    fn name(&self) -> &str {
        "trace"
    }

    fn interest(&self) -> EventMask {
        let mut m = EventMask::of(EventType::CollApi)
            | EventMask::of(EventType::P2pApi)
            | EventMask::of(EventType::Coll)
            | EventMask::of(EventType::P2p)
            | EventMask::of(EventType::KernelCh)
            | EventMask::of(EventType::CeColl);
        if self.inner.cfg.proxy != ProxyDetail::None {
            m |= EventMask::of(EventType::ProxyOp);
        }
        if self.inner.cfg.proxy == ProxyDetail::Steps {
            m |= EventMask::of(EventType::ProxyStep);
        }
        m
    }

    fn comm_init(&self, comm: &Arc<CommMeta>) {
        let inner = &self.inner;
        let mut st = inner.state.write().unwrap_or_else(PoisonError::into_inner);
        let State { files, comms } = &mut *st;
        let fits = |f: &Arc<RankFile>| {
            let c = f.comms.lock().unwrap_or_else(PoisonError::into_inner);
            c.len() < MAX_COMMS_PER_FILE && !c.iter().any(|m| m.hash == comm.hash)
        };
        let file = match files.iter().find(|f| fits(f)) {
            Some(f) => f.clone(),
            None => {
                let f = Arc::new(RankFile {
                    index: files.len(),
                    log: Log::new(inner.cfg.max_events),
                    comms: Mutex::new(Vec::new()),
                    written: Mutex::new(None),
                });
                files.push(f.clone());
                f
            }
        };
        let ordinal = {
            let mut c = file.comms.lock().unwrap_or_else(PoisonError::into_inner);
            c.push(comm.clone());
            (c.len() - 1) as u16
        };
        comms.push(CommSlot { comm: comm.clone(), file, ordinal });
    }

    fn span(&self, span: &Span<'_>) {
        // Under the shared lock: no reference count to touch per span.
        let st = self.inner.state.read().unwrap_or_else(PoisonError::into_inner);
        if let Some(s) = st.comms.iter().rev().find(|s| Arc::ptr_eq(&s.comm, span.comm)) {
            s.file.log.push(Rec::from_span(span, s.ordinal, threads::current()));
        }
    }

    fn comm_finalize(&self, comm: &Arc<CommMeta>) {
        if let Some(file) = self.inner.file_of(comm) {
            self.inner.write_and_report(&[file]);
        }
    }

    fn flush(&self) {
        self.inner.write_and_report(&self.inner.files());
    }
}

fn live() -> Vec<Arc<Inner>> {
    LIVE.lock().unwrap_or_else(PoisonError::into_inner).iter().filter_map(Weak::upgrade).collect()
}

/// Writes every rank file of every trace exporter in this process (also done at exit).
pub fn flush() -> Vec<io::Result<PathBuf>> {
    live().iter().flat_map(|i| i.write_all()).collect()
}

/// The exit handler's flush: failures are reported once per exporter, on stderr.
pub(super) fn flush_at_exit() {
    AT_EXIT.store(true, Relaxed);
    for i in live() {
        i.write_and_report(&i.files());
    }
}
