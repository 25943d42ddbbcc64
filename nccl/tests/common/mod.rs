//! Finding the built `libnccl.so` and the committed API list.
#![allow(dead_code)] // each test binary uses part of it

use std::path::{Path, PathBuf};

/// The `libnccl.so` cargo built beside this test binary (`target/<profile>/deps`).
pub fn library() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    let deps = exe.parent().expect("the test binary's directory");
    for dir in [deps, deps.parent().unwrap_or(deps)] {
        let p = dir.join("libnccl.so");
        if p.is_file() {
            return p;
        }
    }
    panic!("libnccl.so was not built next to {} (cargo builds the cdylib with the lib target)", deps.display());
}

/// A scratch directory of this test binary (`name-<pid>` under cargo's test temp dir) holding
/// `libnccl.so` and `libnccl.so.2` links to the built library, for a program to link and run
/// against (its rpath pointing here).
pub fn dir_with_library(name: &str) -> PathBuf {
    let lib = library();
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a scratch directory");
    for link in ["libnccl.so", "libnccl.so.2"].map(|n| dir.join(n)) {
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&lib, &link).expect("link libnccl.so");
    }
    dir
}

/// The function names of `nccl/api-2.28.txt`.
pub fn api_names() -> Vec<String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("api-2.28.txt");
    let text = std::fs::read_to_string(&path).expect("nccl/api-2.28.txt");
    text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')).map(String::from).collect()
}
