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
        let lib = common::library();
        let dir = std::env::temp_dir().join(format!("occl-nccl-c-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a scratch directory");
        for name in ["libnccl.so", "libnccl.so.2"] {
            let link = dir.join(name);
            let _ = std::fs::remove_file(&link);
            std::os::unix::fs::symlink(&lib, &link).expect("link libnccl.so");
        }
        let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
        let exe = dir.join("host_collectives");
        let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
        let out = Command::new(&cc)
            .args(["-std=c11", "-O1", "-Wall", "-Wextra", "-Werror", "-I"])
            .arg(manifest.join("include"))
            .arg(manifest.join("tests/c/host_collectives.c"))
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

fn run(nranks: usize) {
    let exe = program();
    let idfile = exe.with_file_name(format!("ids-{nranks}"));
    let _ = std::fs::remove_file(&idfile);
    let mut job = Job(Vec::new());
    for r in 0..nranks {
        let child = Command::new(exe)
            .args([r.to_string(), nranks.to_string()])
            .arg(&idfile)
            .env("OCCL_TIMEOUT", "30")
            .env("OCCL_RAS_ENABLE", "0")
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
    run(2);
}

#[test]
fn c_program_four_processes() {
    run(4);
}
