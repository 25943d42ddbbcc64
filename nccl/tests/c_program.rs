//! A C program compiled against `nccl/include/nccl.h` and linked with `-lnccl` (occl's
//! library, found as `libnccl.so.2` through its rpath) runs as 2 and 4 processes through every
//! collective, send/recv, groups, split, shrink, non-blocking init, configs of NCCL 2.19, 2.27
//! and 2.28 sizes, and abort, checking every result exactly (`tests/c/host_collectives.c`).

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Compiles the program once per test binary, in a directory that also holds the
/// `libnccl.so` / `libnccl.so.2` links it is linked and run against.
fn program() -> &'static Path {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| {
        let dir = common::dir_with_library("nccl-c");
        let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
        let exe = dir.join("host_collectives");
        let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
        let out = Command::new(&cc)
            .args(["-std=c11", "-O1", "-Wall", "-Wextra", "-Werror", "-I"])
            .arg(manifest.join("include"))
            .arg(manifest.join("tests/c/host_collectives.c"))
            .arg("-pthread")
            .arg("-L")
            .arg(&dir)
            .arg("-lnccl")
            .arg(format!("-Wl,-rpath,{}", dir.display()))
            .arg("-o")
            .arg(&exe)
            .output()
            .unwrap_or_else(|e| {
                panic!("cannot run the C compiler `{cc}` ({e}); install one (e.g. build-essential): this test needs it")
            });
        assert!(out.status.success(), "compiling host_collectives.c failed:\n{}", String::from_utf8_lossy(&out.stderr));
        exe
    })
}

/// Kills the ranks still running when dropped (a failed assertion must not leave them behind).
struct Job(Vec<Child>);

impl Drop for Job {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn run(nranks: usize, env: &[(&str, String)]) {
    let exe = program();
    let idfile = exe.with_file_name(format!("ids-{nranks}-{}", env.len()));
    let _ = std::fs::remove_file(&idfile);
    let mut job = Job(Vec::new());
    for r in 0..nranks {
        let child = Command::new(exe)
            .args([r.to_string(), nranks.to_string()])
            .arg(&idfile)
            .env("OCCL_TIMEOUT", "30")
            .env("OCCL_RAS_ENABLE", "0")
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start a rank of the C program");
        job.0.push(child);
    }
    let deadline = Instant::now() + Duration::from_secs(150);
    let mut done = vec![None; nranks];
    while done.iter().any(Option::is_none) {
        for (r, c) in job.0.iter_mut().enumerate() {
            if done[r].is_none() {
                done[r] = c.try_wait().expect("wait for a rank");
            }
        }
        assert!(Instant::now() < deadline, "the {nranks}-rank job did not finish in 150 s: {done:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
    let children = std::mem::take(&mut job.0);
    let mut report = String::new();
    let mut ok = true;
    for (r, c) in children.into_iter().enumerate() {
        let out = c.wait_with_output().expect("collect a rank's output");
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        ok &= out.status.success() && stdout == format!("OK rank {r}\n");
        report += &format!("rank {r}: {}\nstdout: {stdout}stderr: {stderr}\n", out.status);
    }
    assert!(ok, "the {nranks}-rank C job failed:\n{report}");
}

#[test]
fn c_program_two_processes() {
    run(2, &[]);
}

#[test]
fn c_program_four_processes() {
    run(4, &[]);
}

/// `NCCL_DEBUG=INFO` with `NCCL_DEBUG_FILE`: each process writes NCCL-shaped lines to its own
/// file (`%p`): the version line first, occl's init line (INIT, in the default mask), the
/// refused calls as WARN lines, and no tuner line (TUNING is not in the default mask).
#[test]
fn nccl_debug_writes_nccl_shaped_lines_to_nccl_debug_file() {
    let dir = program().with_file_name("logs");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let pattern = format!("{}/nccl.%h.%p.log", dir.display());
    run(2, &[("NCCL_DEBUG", "INFO".into()), ("NCCL_DEBUG_FILE", pattern)]);
    let files: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).collect();
    assert_eq!(files.len(), 2, "one log per process: {files:?}");
    for f in files {
        let name = f.file_name().unwrap().to_string_lossy().into_owned();
        let parts: Vec<&str> = name.split('.').collect();
        assert_eq!(parts.len(), 4, "nccl.<host>.<pid>.log: {name}");
        let (host, pid) = (parts[1], parts[2]);
        let text = std::fs::read_to_string(&f).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        let prefix = format!("{host}:{pid}:");
        for l in &lines {
            let rest = l.strip_prefix(&prefix).unwrap_or_else(|| panic!("{name}: line without {prefix}: {l}"));
            let (tid, rest) = rest.split_once(' ').unwrap();
            assert!(tid.parse::<u32>().is_ok(), "{name}: tid {tid:?} in {l}");
            let rest = rest.strip_prefix("[-1] ").unwrap_or_else(|| panic!("{name}: no [dev]: {l}"));
            let info = rest.starts_with("NCCL INFO ");
            let warn = rest.split_once(' ').is_some_and(|(at, r)| at.contains(':') && r.starts_with("NCCL WARN "));
            assert!(info || warn, "{name}: neither INFO nor WARN: {l}");
        }
        let banner = format!("NCCL INFO NCCL version {}+occl (host buffers)", occl_types::NCCL_VERSION);
        assert!(lines[0].ends_with(&banner), "{name}: {}", lines[0]);
        assert!(lines.iter().any(|l| l.contains("NCCL INFO occl: Init timings - rank ")), "{name}:\n{text}");
        assert!(
            lines
                .iter()
                .any(|l| l.contains("NCCL WARN ncclDevCommCreate: invalid usage: the communicator was created without")),
            "{name}:\n{text}"
        );
        assert!(!lines.iter().any(|l| l.contains("occl: tuner:")), "{name}: a TUNING line passed the default mask");
    }
}
