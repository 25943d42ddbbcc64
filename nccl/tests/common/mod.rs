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

/// The function names of `nccl/api-2.28.txt`.
pub fn api_names() -> Vec<String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("api-2.28.txt");
    let text = std::fs::read_to_string(&path).expect("nccl/api-2.28.txt");
    text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')).map(String::from).collect()
}
