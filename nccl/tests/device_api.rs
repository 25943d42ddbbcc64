//! NCCL's device API against occl's headers: `tests/cuda/device_api.cu` (kernels with lsa
//! pointers and barriers, GIN puts, signals, counters and barriers, and host collectives whose
//! output lies in a symmetric window, checked exactly) is compiled
//! with nvcc against `nccl/include` and linked with occl's `libnccl.so`; on a machine with GPUs
//! it runs as one process driving every GPU and as two processes, each with the default CTA
//! policy and with `NCCL_CTA_POLICY=2` (copy engines), else it says why it skipped.
//! nccl-tests' device-API sources are compiled against the same headers when their tree is here.
//!
//! nvcc is found through `NVCC`, on `PATH`, under `/usr/local/cuda*/bin`, or where
//! `scripts/test.sh` unpacks NVIDIA's wheels (`target/nvcc`). CI (`CI` set) must have it.

mod common;

/// Writes past the test harness's capture, so that CI's log shows what ran and what was skipped.
macro_rules! say {
    ($($t:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr().lock(), $($t)*);
    }};
}

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "0" && v != "false")
}

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("the workspace").to_path_buf()
}

/// nvcc, or why there is none.
fn nvcc() -> Result<PathBuf, String> {
    if let Some(p) = std::env::var_os("NVCC") {
        return Ok(PathBuf::from(p));
    }
    let on_path = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).map(|d| d.join("nvcc")).collect::<Vec<_>>())
        .unwrap_or_default();
    let mut local: Vec<PathBuf> = std::fs::read_dir("/usr/local")
        .map(|d| d.flatten().map(|e| e.path()).filter(|p| p.to_string_lossy().contains("cuda")).collect())
        .unwrap_or_default();
    local.sort();
    let local = local.into_iter().rev().map(|d| d.join("bin/nvcc"));
    let wheel = workspace().join("target/nvcc/nvidia/cu13/bin/nvcc");
    on_path.into_iter().chain(local).chain([wheel]).find(|p| p.is_file()).ok_or_else(|| {
        "no nvcc: not in NVCC, on PATH, under /usr/local/cuda*/bin or in target/nvcc (scripts/test.sh unpacks \
         NVIDIA's nvcc wheels there)"
            .into()
    })
}

/// Library directories next to nvcc (a toolkit's lib64, the wheels' lib) for cudart.
fn cuda_lib_dirs(nvcc: &Path) -> Vec<PathBuf> {
    let root = nvcc.parent().and_then(Path::parent).map(Path::to_path_buf).unwrap_or_default();
    ["lib64", "lib"].iter().map(|d| root.join(d)).filter(|d| d.is_dir()).collect()
}

fn run_nvcc(nvcc: &Path, args: &[std::ffi::OsString]) -> Output {
    Command::new(nvcc).args(args).output().unwrap_or_else(|e| panic!("cannot run {}: {e}", nvcc.display()))
}

/// The compiled program, or why it could not be built (no nvcc outside CI).
fn program() -> Result<&'static Path, &'static str> {
    static BUILT: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let built = BUILT.get_or_init(|| {
        let nvcc = match nvcc() {
            Ok(p) => p,
            Err(why) => {
                assert!(!in_ci(), "CI: {why}");
                return Err(why);
            }
        };
        let dir = common::dir_with_library("nccl-cuda");
        let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
        let exe = dir.join("device_api");
        let mut args: Vec<std::ffi::OsString> =
            ["-std=c++17", "-arch=sm_90", "-Xcompiler", "-Wall,-Wextra", "-I"].iter().map(Into::into).collect();
        args.push(manifest.join("include").into());
        args.push(manifest.join("tests/cuda/device_api.cu").into());
        for d in cuda_lib_dirs(&nvcc).into_iter().chain([dir.clone()]) {
            args.push("-L".into());
            args.push(d.into());
        }
        args.extend(["-lnccl".into(), "-Xlinker".into(), format!("-rpath,{}", dir.display()).into()]);
        args.extend(["-o".into(), exe.clone().into()]);
        let out = run_nvcc(&nvcc, &args);
        let text = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "nvcc could not build device_api.cu against nccl/include:\n{text}");
        // Warnings in our own files fail the test; the toolkit's own headers are not ours to fix.
        let ours = |l: &&str| {
            l.contains("warning") && ["device_api.cu", "nccl_device", "nccl.h"].iter().any(|f| l.contains(f))
        };
        let warned: Vec<&str> = text.lines().filter(ours).collect();
        assert!(warned.is_empty(), "device_api.cu or occl's headers compile with warnings:\n{text}");
        Ok(exe)
    });
    built.as_ref().map(PathBuf::as_path).map_err(String::as_str)
}

/// Runs `exe args` (as many processes as `args` has entries) with `env` and returns each one's
/// output, killing the lot after 240 s.
fn run_job(exe: &Path, args: &[Vec<String>], env: &[(&str, &str)]) -> Vec<Output> {
    let mut kids: Vec<_> = args
        .iter()
        .map(|a| {
            Command::new(exe)
                .args(a)
                .envs(env.iter().copied())
                .env("OCCL_TIMEOUT", "60")
                .env("OCCL_RAS_ENABLE", "0")
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("start device_api")
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(240);
    while kids.iter_mut().any(|k| k.try_wait().ok().flatten().is_none()) {
        if Instant::now() > deadline {
            for k in &mut kids {
                let _ = k.kill();
            }
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    kids.into_iter().map(|k| k.wait_with_output().expect("collect device_api's output")).collect()
}

fn report(outs: &[Output]) -> String {
    outs.iter()
        .enumerate()
        .map(|(i, o)| {
            format!(
                "process {i}: {}\nstdout: {}stderr: {}\n",
                o.status,
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            )
        })
        .collect()
}

/// "SKIPPED: ..." when every process skipped; panics unless each printed its OK lines.
fn judge(outs: &[Output], ranks_per_process: &[Vec<usize>]) -> Option<String> {
    if outs.iter().all(|o| o.status.code() == Some(77)) {
        return Some(String::from_utf8_lossy(&outs[0].stdout).trim().to_string());
    }
    for (o, ranks) in outs.iter().zip(ranks_per_process) {
        let text = String::from_utf8_lossy(&o.stdout);
        let want: String = ranks.iter().map(|r| format!("OK rank {r}\n")).collect();
        assert!(o.status.success() && text == want, "device_api failed:\n{}", report(outs));
    }
    None
}

#[test]
fn device_api_program_builds_against_our_headers_and_runs_on_every_gpu() {
    let exe = match program() {
        Ok(p) => p,
        Err(why) => {
            say!("SKIPPED: {why}");
            return;
        }
    };
    // Each mode twice: the window collectives on kernels, then on the copy engines writing
    // straight into the peers' windows (CTAPolicy zero).
    for (policy, env) in [("default", &[][..]), ("NCCL_CTA_POLICY=2", &[("NCCL_CTA_POLICY", "2")][..])] {
        // One process, one thread driving every GPU (the groups' per-communicator setup threads).
        let outs = run_job(exe, &[vec!["threads".into()]], env);
        let gpus = {
            let text = String::from_utf8_lossy(&outs[0].stdout);
            text.lines().filter(|l| l.starts_with("OK rank ")).count()
        };
        match judge(&outs, &[(0..gpus.max(1)).collect()]) {
            Some(why) if why.contains("no usable CUDA device") => {
                say!("compiled; {why}");
                return;
            }
            Some(why) => say!("threads mode, {policy}: {why}"),
            None => say!("threads mode, {policy}: {gpus} GPUs OK"),
        }
        // One rank per process (CUDA IPC between them), two ranks.
        let idfile = exe.with_file_name(format!("id-{}", std::process::id()));
        let _ = std::fs::remove_file(&idfile);
        let args: Vec<Vec<String>> =
            (0..2).map(|r| vec!["rank".into(), r.to_string(), "2".into(), idfile.display().to_string()]).collect();
        let outs = run_job(exe, &args, env);
        match judge(&outs, &[vec![0], vec![1]]) {
            Some(why) => say!("rank mode, {policy}: {why}"),
            None => say!("rank mode, {policy}: OK"),
        }
    }
}

/// nccl-tests' tree: `NCCL_TESTS_DIR`, else the one the GPU script leaves under target/.
fn nccl_tests_tree() -> Option<PathBuf> {
    let dir = std::env::var_os("NCCL_TESTS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace().join("target/nccl-gpu-run"));
    dir.join("src/alltoall.cu").is_file().then_some(dir)
}

#[test]
fn nccl_tests_device_kernels_compile_against_our_headers() {
    let Some(tree) = nccl_tests_tree() else {
        say!("SKIPPED: no nccl-tests tree (set NCCL_TESTS_DIR to one; CI has none)");
        return;
    };
    let nvcc = match nvcc() {
        Ok(p) => p,
        Err(why) => {
            assert!(!in_ci(), "CI: {why}");
            say!("SKIPPED: {why}");
            return;
        }
    };
    let out_dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("nccl-tests-{}", std::process::id()));
    std::fs::create_dir_all(&out_dir).expect("a scratch directory");
    let include = Path::new(env!("CARGO_MANIFEST_DIR")).join("include");
    let compiled: Vec<(String, Output)> = std::thread::scope(|s| {
        let hs: Vec<_> = ["all_reduce.cu", "alltoall.cu", "common.cu"]
            .into_iter()
            .map(|f| {
                let (nvcc, tree, include, out_dir) = (&nvcc, &tree, &include, &out_dir);
                s.spawn(move || {
                    let mut args: Vec<std::ffi::OsString> =
                        ["-std=c++17", "-gencode=arch=compute_90,code=sm_90", "-DNCCL_OS_LINUX", "-c", "-I"]
                            .iter()
                            .map(Into::into)
                            .collect();
                    args.extend([include.clone().into_os_string(), "-I".into(), tree.join("src").into()]);
                    args.extend(["-I".into(), tree.join("os").into(), tree.join("src").join(f).into()]);
                    args.extend(["-o".into(), out_dir.join(f).with_extension("o").into()]);
                    (f.to_string(), run_nvcc(nvcc, &args))
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("an nvcc thread")).collect()
    });
    for (f, out) in &compiled {
        assert!(
            out.status.success(),
            "{f} does not compile against nccl/include:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let objects = std::fs::read(out_dir.join("alltoall.o")).expect("alltoall.o");
    let has = |s: &str| objects.windows(s.len()).any(|w| w == s.as_bytes());
    assert!(has("GinAlltoAllKernel") && has("HybridAlltoAllKernel"), "nccl-tests' GIN kernels were not compiled");
}
