//! Test support: building the C fixtures, serialising tests that touch process-global state
//! (environment, activation mask), capturing `tracing` output, parsing the recorders' logs, and
//! driving a realistic event tree through a `Fanout`.

use occl_telemetry::event::{ProxyCtrlState, ProxyOpState, ProxyStepState};
use occl_telemetry::{EventDescr, EventId, Fanout, GroupApiState, StateArgs};
use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};

/// The fixtures' sources.
pub fn plugin_sources() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/plugins")
}

/// Built fixtures: name → path of the shared library.
pub struct Fixtures {
    pub dir: PathBuf,
    libs: HashMap<&'static str, PathBuf>,
}

impl Fixtures {
    pub fn lib(&self, name: &str) -> &Path {
        self.libs.get(name).unwrap_or_else(|| panic!("no fixture {name}"))
    }

    pub fn spec(&self, name: &str) -> String {
        self.lib(name).to_str().expect("utf-8 path").to_owned()
    }
}

/// (library name, source file, extra compiler flags)
const BUILDS: &[(&str, &str, &[&str])] = &[
    ("recorder_v5", "recorder_v5.c", &[]),
    ("recorder_v4", "recorder_v5.c", &["-DRECORDER_V4"]),
    ("recorder_v6", "recorder_v5.c", &["-DRECORDER_V6"]),
    ("recorder_v1", "recorder_v1.c", &[]),
    // A private copy, so its mapping in this process belongs to one test only.
    ("recorder_v5_refcount", "recorder_v5.c", &[]),
    ("no_symbol", "no_symbol.c", &[]),
    ("init_fails", "init_fails.c", &[]),
    ("null_fn", "null_fn.c", &[]),
    ("null_handles", "null_handles.c", &[]),
];

fn compile(src_dir: &Path, out: &Path, src: &str, flags: &[&str]) {
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_owned());
    let res = Command::new(&cc)
        .args(["-shared", "-fPIC", "-O1", "-Wall", "-Wextra"])
        .args(flags)
        .arg("-I")
        .arg(src_dir)
        .arg("-o")
        .arg(out)
        .arg(src_dir.join(src))
        .arg("-lpthread")
        .output();
    let output = match res {
        Ok(o) => o,
        Err(e) => panic!(
            "cannot run the C compiler `{cc}` ({e}); these tests build real C plugins and need one \
             (apt-get install gcc, or set CC)"
        ),
    };
    assert!(
        output.status.success(),
        "`{cc}` failed on {src}:\n{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// Removes the fixture directories of earlier test processes that have exited (one per process,
/// so a run never rewrites a library another process has mapped).
fn remove_stale(tmp: &Path) {
    let Ok(entries) = std::fs::read_dir(tmp) else { return };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(pid) = name.strip_prefix("nccl-plugins-") else { continue };
        if pid.parse::<u32>().is_ok() && !Path::new("/proc").join(pid).exists() {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

/// Compiles every fixture once per test process into the target's temporary directory.
pub fn fixtures() -> &'static Fixtures {
    static F: OnceLock<Fixtures> = OnceLock::new();
    F.get_or_init(|| {
        let tmp = Path::new(env!("CARGO_TARGET_TMPDIR"));
        remove_stale(tmp);
        let dir = tmp.join(format!("nccl-plugins-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("fixture dir");
        let src = plugin_sources();
        let mut libs = HashMap::new();
        for (name, file, flags) in BUILDS {
            let out = dir.join(format!("lib{name}.so"));
            compile(&src, &out, file, flags);
            libs.insert(*name, out);
        }
        // The bare-name form: a libnccl-profiler-<x>.so in a directory of its own, for a child
        // process that gets that directory on LD_LIBRARY_PATH.
        let search = dir.join("search-path");
        std::fs::create_dir_all(&search).expect("search dir");
        let named = search.join("libnccl-profiler-occlrec.so");
        compile(&src, &named, "recorder_v5.c", &[]);
        libs.insert("named", named);
        Fixtures { dir, libs }
    })
}

/// Serialises tests that set environment variables or depend on the global activation mask.
pub fn global_lock() -> MutexGuard<'static, ()> {
    static L: Mutex<()> = Mutex::new(());
    L.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Sets the recorders' log prefix and mask for the plugin inits that follow (hold
/// `global_lock`).
pub fn set_plugin_env(prefix: &Path, mask: &str) {
    std::env::set_var("OCCL_TEST_PLUGIN_LOG", prefix);
    std::env::set_var("OCCL_TEST_PLUGIN_MASK", mask);
}

/// A fresh log prefix under the fixture directory.
pub fn log_prefix(test: &str) -> PathBuf {
    let d = fixtures().dir.join("logs");
    std::fs::create_dir_all(&d).expect("log dir");
    let p = d.join(test);
    // Leftovers of an earlier run in the same process cannot exist (the dir is per pid), but a
    // test that runs twice would append; start clean.
    if let Ok(entries) = std::fs::read_dir(&d) {
        for e in entries.flatten() {
            if e.file_name().to_string_lossy().starts_with(test) {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
    p
}

// ---- tracing capture ----

#[derive(Clone, Default)]
pub struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Captured {
    type Writer = Captured;
    fn make_writer(&'a self) -> Captured {
        self.clone()
    }
}

/// Runs `f` with a subscriber that records everything logged on this thread.
pub fn capture<R>(f: impl FnOnce() -> R) -> (R, String) {
    let out = Captured::default();
    let sub = tracing_subscriber::fmt()
        .with_writer(out.clone())
        .with_max_level(tracing::Level::TRACE)
        .with_ansi(false)
        .finish();
    let r = tracing::subscriber::with_default(sub, f);
    let text = String::from_utf8_lossy(&out.0.lock().unwrap_or_else(PoisonError::into_inner)).into_owned();
    (r, text)
}

// ---- recorder logs ----

/// One line of a recorder log: its first word and its key=value tokens.
#[derive(Clone, Debug)]
pub struct Line {
    pub kind: String,
    pub kv: HashMap<String, String>,
    pub text: String,
}

impl Line {
    pub fn get(&self, k: &str) -> &str {
        self.kv.get(k).map(String::as_str).unwrap_or_else(|| panic!("no {k}= in {:?}", self.text))
    }

    pub fn num(&self, k: &str) -> i64 {
        self.get(k).parse().unwrap_or_else(|_| panic!("{k}= is not a number in {:?}", self.text))
    }
}

pub fn parse_log(text: &str) -> Vec<Line> {
    text.lines()
        .map(|l| {
            let (kind, rest) = l.split_once(' ').unwrap_or((l, ""));
            let mut kv = HashMap::new();
            let (fields, name) = match rest.find("name=") {
                Some(i) if i == 0 || rest.as_bytes()[i - 1] == b' ' => (&rest[..i], Some(&rest[i + 5..])),
                _ => (rest, None),
            };
            for tok in fields.split_whitespace() {
                if let Some((k, v)) = tok.split_once('=') {
                    kv.insert(k.to_owned(), v.to_owned());
                }
            }
            if let Some(n) = name {
                kv.insert("name".to_owned(), n.to_owned());
            }
            Line { kind: kind.to_owned(), kv, text: l.to_owned() }
        })
        .collect()
}

pub fn read_log(path: &Path) -> Vec<Line> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("recorder log {}: {e}", path.display()));
    parse_log(&text)
}

/// A parsed log with lookups by type and handle.
pub struct Log {
    pub lines: Vec<Line>,
}

impl Log {
    pub fn new(lines: Vec<Line>) -> Log {
        Log { lines }
    }

    pub fn kind(&self, k: &str) -> impl Iterator<Item = &Line> {
        let k = k.to_owned();
        self.lines.iter().filter(move |l| l.kind == k)
    }

    /// Start lines of one type bit.
    pub fn starts(&self, type_bit: u64) -> Vec<&Line> {
        self.kind("start").filter(|l| l.num("type") as u64 == type_bit).collect()
    }

    /// The single start of a type.
    pub fn one(&self, type_bit: u64) -> &Line {
        let s = self.starts(type_bit);
        assert_eq!(s.len(), 1, "expected one start of type {type_bit}, got {s:?}");
        s[0]
    }

    /// States recorded for a handle, in order: (state, line).
    pub fn states(&self, handle: i64) -> Vec<&Line> {
        self.kind("state").filter(|l| l.num("handle") == handle).collect()
    }

    pub fn state_numbers(&self, handle: i64) -> Vec<i64> {
        self.states(handle).iter().map(|l| l.num("state")).collect()
    }

    pub fn types(&self) -> Vec<u64> {
        let mut t: Vec<u64> = self.kind("start").map(|l| l.num("type") as u64).collect();
        t.sort_unstable();
        t.dedup();
        t
    }
}

// ---- the event tree ----

/// A `Fanout` wrapper that follows NCCL's rule of skipping everything of an event that did not
/// start (no sink wanted it).
pub struct Driver<'a>(pub &'a Fanout);

impl Driver<'_> {
    pub fn start(&self, parent: Option<EventId>, d: EventDescr<'_>) -> Option<EventId> {
        self.0.start(parent, &d)
    }
    pub fn state(&self, id: Option<EventId>, st: StateArgs<'_>) {
        if let Some(id) = id {
            self.0.state(id, &st);
        }
    }
    pub fn stop(&self, id: Option<EventId>) {
        if let Some(id) = id {
            self.0.stop(id);
        }
    }
}

pub const COMM_HASH: u64 = 0x0123_4567_89ab_cdef;
pub const STREAM: usize = 0x5000;
/// NetPlugin id: payload version 1, socket transport (2 << 16).
pub const SOCK_ID: i64 = (2 << 16) | 1;

/// NCCL's socket payload (version 1): type u8 at 0, fd at 8, op at 12, length at 16; 24 bytes.
pub fn sock_payload(fd: i32, op: i32, len: u64) -> [u8; 24] {
    let mut b = [0u8; 24];
    b[0] = 1;
    b[8..12].copy_from_slice(&fd.to_ne_bytes());
    b[12..16].copy_from_slice(&op.to_ne_bytes());
    b[16..24].copy_from_slice(&len.to_ne_bytes());
    b
}

pub fn coll_descr(rank: i32, group: Option<EventId>) -> EventDescr<'static> {
    EventDescr::Coll {
        rank,
        seq_number: 4,
        func: "AllReduce",
        send_buff: 0x1000,
        recv_buff: 0x2000,
        count: 1024,
        root: 0,
        datatype: "ncclFloat32",
        n_channels: 2,
        n_warps: 16,
        algo: "RING",
        proto: "SIMPLE",
        parent_group: group,
    }
}

/// One all-reduce and one send in a group, as NCCL 2.28 emits them, then the proxy and kernel
/// work that follows on other threads (here: in sequence), with states in NCCL's order:
///
/// ```text
/// GroupApi ─┬─ CollApi ── Coll (parentGroup: Group) ─┬─ ProxyOp send ── ProxyStep ×2 (first: NetPlugin)
///           ├─ P2pApi ─── P2p  (parentGroup: Group)  ├─ ProxyOp recv ── ProxyStep
///           └─ KernelLaunch                           └─ KernelCh
/// Group (legacy);  ProxyCtrl alone
/// ```
/// Proxy work starts after Coll's stop, as in NCCL.
pub fn drive_tree(f: &Fanout, rank: i32) {
    let d = Driver(f);
    let sock = sock_payload(7, 0, 4096);
    let sock_done = sock_payload(7, 0, 8192);
    let ga = d.start(None, EventDescr::GroupApi { graph_captured: false, group_depth: 1 });
    d.state(ga, StateArgs::GroupApi { state: GroupApiState::StartApiStop });
    let ca = d.start(
        ga,
        EventDescr::CollApi {
            func: "AllReduce",
            count: 1024,
            datatype: "ncclFloat32",
            root: 0,
            stream: STREAM,
            graph_captured: false,
        },
    );
    d.stop(ca);
    let pa = d.start(
        ga,
        EventDescr::P2pApi { func: "Send", count: 256, datatype: "ncclInt32", stream: STREAM, graph_captured: false },
    );
    d.stop(pa);
    d.state(ga, StateArgs::GroupApi { state: GroupApiState::EndApiStart });
    let kl = d.start(ga, EventDescr::KernelLaunch { stream: STREAM });
    d.stop(kl);
    let g = d.start(None, EventDescr::Group);
    let c = d.start(ca, coll_descr(rank, g));
    d.stop(c);
    let p = d.start(
        pa,
        EventDescr::P2p {
            rank,
            func: "Send",
            buff: 0x3000,
            datatype: "ncclInt32",
            count: 256,
            peer: 1,
            n_channels: 1,
            parent_group: g,
        },
    );
    d.stop(p);
    d.stop(g);
    d.stop(ga);

    // Proxy thread.
    let ctl = d.start(None, EventDescr::ProxyCtrl);
    for (state, n) in [
        (ProxyCtrlState::Sleep, 0),
        (ProxyCtrlState::Wakeup, 0),
        (ProxyCtrlState::Append, 0),
        (ProxyCtrlState::AppendEnd, 3),
    ] {
        d.state(ctl, StateArgs::ProxyCtrl { state, appended_proxy_ops: n });
    }
    d.stop(ctl);

    let pid = std::process::id() as i32;
    let send = d.start(
        c,
        EventDescr::ProxyOp { rank, pid, channel_id: 0, peer: 1, n_steps: 2, chunk_size: 4096, is_send: true },
    );
    d.state(send, StateArgs::ProxyOp { state: ProxyOpState::InProgress, trans_size: 0, steps: 0 });
    // A 2.23–2.26-style op state: only v1–v3 plugins have it.
    d.state(send, StateArgs::ProxyOp { state: ProxyOpState::SendPosted, trans_size: 64, steps: 2 });
    for step in 0..2 {
        let s = d.start(send, EventDescr::ProxyStep { rank, step });
        d.state(s, StateArgs::ProxyStep { state: ProxyStepState::SendGpuWait, trans_size: 0 });
        d.state(s, StateArgs::ProxyStep { state: ProxyStepState::SendPeerWait, trans_size: 0 });
        d.state(s, StateArgs::ProxyStep { state: ProxyStepState::SendWait, trans_size: 4096 });
        if step == 0 {
            let n = d.start(s, EventDescr::NetPlugin { rank, id: SOCK_ID, data: &sock });
            d.state(n, StateArgs::NetPluginUpdate { data: &sock_done });
            d.stop(n);
        }
        d.stop(s);
    }
    d.stop(send);

    let recv = d.start(
        c,
        EventDescr::ProxyOp { rank, pid, channel_id: 1, peer: 1, n_steps: 1, chunk_size: 4096, is_send: false },
    );
    d.state(recv, StateArgs::ProxyOp { state: ProxyOpState::InProgress, trans_size: 0, steps: 0 });
    let s = d.start(recv, EventDescr::ProxyStep { rank, step: 0 });
    d.state(s, StateArgs::ProxyStep { state: ProxyStepState::RecvWait, trans_size: 0 });
    d.state(s, StateArgs::ProxyStep { state: ProxyStepState::RecvFlushWait, trans_size: 2048 });
    d.state(s, StateArgs::ProxyStep { state: ProxyStepState::RecvGpuWait, trans_size: 2048 });
    d.stop(s);
    d.stop(recv);

    // Kernel channel (v3+), after the Coll's stop too.
    let k = d.start(c, EventDescr::KernelCh { channel_id: 0, p_timer: 1000 });
    d.state(k, StateArgs::KernelChStop { p_timer: 2000 });
    d.stop(k);
}
