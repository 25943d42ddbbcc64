//! The kernel cache under concurrent writers: several real processes store the same key over and
//! over while this one reads it; every read sees nothing or a whole, valid binary, and no
//! temporary file is left behind.

use occl_kernels::cache::{Cache, Key};
use std::path::PathBuf;
use std::process::Command;

const CHILD_ENV: &str = "OCCL_KERNELS_CACHE_CHILD_DIR";
const OPTS: [String; 0] = [];

fn key() -> Key<'static> {
    Key { source: "the same kernel source", options: &OPTS, arch: "sm_90", nvrtc: (13, 0) }
}

/// What writer `id` stores: 1 MiB, so that a write is not one syscall's worth.
fn payload(id: u8) -> Vec<u8> {
    let mut v = vec![id; 1 << 20];
    v[..4].copy_from_slice(b"\x7fELF");
    v
}

/// A writer process's body; run only when the parent test starts it.
#[test]
#[ignore = "helper: started as a child process by several_processes_write_one_key_safely"]
fn cache_writer_child() {
    let Some(dir) = std::env::var_os(CHILD_ENV) else { return };
    let id: u8 = std::env::var("OCCL_KERNELS_CACHE_CHILD_ID").ok().and_then(|v| v.parse().ok()).unwrap_or(0);
    let cache = Cache::new(PathBuf::from(dir));
    for _ in 0..30 {
        cache.store(&key(), &payload(id)).expect("store");
    }
}

#[test]
fn several_processes_write_one_key_safely() {
    let dir = std::env::temp_dir().join(format!("occl-kernels-cache-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let exe = std::env::current_exe().expect("test binary");
    let children: Vec<_> = (1..=6u8)
        .map(|id| {
            Command::new(&exe)
                .args(["--exact", "cache_writer_child", "--ignored", "--test-threads", "1"])
                .env(CHILD_ENV, &dir)
                .env("OCCL_KERNELS_CACHE_CHILD_ID", id.to_string())
                .stdout(std::process::Stdio::null())
                .spawn()
                .expect("spawn a writer")
        })
        .collect();
    let cache = Cache::new(&dir);
    let (mut seen, mut reads) = (std::collections::BTreeSet::new(), 0);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let mut children = children;
    while !children.is_empty() && std::time::Instant::now() < deadline {
        if let Some(bin) = cache.load(&key()) {
            let id = bin[4];
            assert!((1..=6).contains(&id) && bin == payload(id), "a torn or foreign binary was read");
            seen.insert(id);
        }
        reads += 1;
        children.retain_mut(|c| match c.try_wait() {
            Ok(Some(status)) => {
                assert!(status.success(), "a writer failed: {status}");
                false
            }
            _ => true,
        });
    }
    assert!(children.is_empty(), "writers did not finish in 60 s");
    assert!(!seen.is_empty(), "no read saw a binary in {reads} reads");
    let files: Vec<String> = std::fs::read_dir(&dir)
        .expect("cache dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(files, vec![key().file_name()], "exactly the one cache file, no temporary left");
    let final_bin = cache.load(&key()).expect("a final binary");
    assert_eq!(final_bin, payload(final_bin[4]));
    std::fs::remove_dir_all(&dir).expect("clean up");
}
