//! Logging from the library: a program that links occl and has no `tracing` subscriber sees
//! occl's warnings on stderr in NCCL's line shape, or in `OCCL_DEBUG_FILE` with `%h` and `%p`
//! expanded; a program with its own subscriber gets them there, and occl installs nothing.

mod common;

use common::scratch;
use std::path::Path;
use std::process::{Command, Output};

fn probe(args: &[&str], vars: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_occl-log-probe"));
    cmd.args(args);
    for k in
        ["OCCL_DEBUG", "NCCL_DEBUG", "OCCL_DEBUG_SUBSYS", "NCCL_DEBUG_SUBSYS", "OCCL_DEBUG_FILE", "NCCL_DEBUG_FILE"]
    {
        cmd.env_remove(k);
    }
    cmd.envs(vars.iter().copied());
    let out = cmd.output().expect("run occl-log-probe");
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    assert!(
        out.status.success() && text(&out.stdout).contains("DONE 1"),
        "probe {args:?} {vars:?}: {}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        text(&out.stdout),
        text(&out.stderr)
    );
    out
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// An unwritable `OCCL_TOPO_DUMP_FILE`: init goes on, with a warning.
fn bad_topo(dir: &Path) -> String {
    dir.join("no-such-dir").join("topo.xml").to_string_lossy().into_owned()
}

#[test]
fn a_bad_variable_warns_on_stderr_without_a_subscriber() {
    let dir = scratch("log-stderr");
    let out = probe(&[], &[("OCCL_TOPO_DUMP_FILE", &bad_topo(&dir))]);
    let err = text(&out.stderr);
    let line = err.lines().find(|l| l.contains("NCCL WARN occl: topo:")).unwrap_or_else(|| panic!("{err}"));
    assert!(line.contains("no-such-dir"), "the warning names the path: {line}");
    assert!(!err.contains("NCCL INFO"), "the default level is WARN: {err}");
    // A subsystem that does not exist is named too.
    let out = probe(&[], &[("NCCL_DEBUG", "INFO"), ("NCCL_DEBUG_SUBSYS", "INIT,NETT")]);
    let err = text(&out.stderr);
    assert!(err.contains("NCCL INFO NCCL version"), "{err}");
    assert!(err.contains("NCCL WARN occl: NCCL_DEBUG_SUBSYS=\"INIT,NETT\": no subsystem named NETT"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn debug_file_expands_host_and_pid() {
    let dir = scratch("log-file");
    let pattern = dir.join("occl.%h.%p.log").to_string_lossy().into_owned();
    let out = probe(&[], &[("OCCL_TOPO_DUMP_FILE", &bad_topo(&dir)), ("OCCL_DEBUG_FILE", &pattern)]);
    assert!(!text(&out.stderr).contains("NCCL WARN"), "the file, not stderr: {}", text(&out.stderr));
    let files: Vec<_> = std::fs::read_dir(&dir).expect("dir").filter_map(|e| e.ok().map(|e| e.path())).collect();
    let log = files.iter().find(|p| p.extension().is_some_and(|x| x == "log")).unwrap_or_else(|| panic!("{files:?}"));
    let name = log.file_name().expect("name").to_string_lossy().into_owned();
    let host = text(&Command::new("hostname").output().expect("hostname").stdout);
    let host = host.trim().split('.').next().unwrap_or_default();
    let parts: Vec<&str> = name.split('.').collect();
    assert_eq!(parts.len(), 4, "{name}");
    assert_eq!(parts[1], host, "%h is the host: {name}");
    assert!(parts[2].parse::<u32>().is_ok(), "%p is a pid: {name}");
    let body = std::fs::read_to_string(log).expect("read log");
    let line = body.lines().find(|l| l.contains("NCCL WARN occl: topo:")).unwrap_or_else(|| panic!("{body}"));
    assert!(line.starts_with(&format!("{host}:{}:", parts[2])), "the line's pid is the file's: {line}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_program_with_its_own_subscriber_keeps_it() {
    let dir = scratch("log-own");
    let pattern = dir.join("occl.%p.log").to_string_lossy().into_owned();
    let out = probe(
        &["own"],
        &[("OCCL_TOPO_DUMP_FILE", &bad_topo(&dir)), ("OCCL_DEBUG", "INFO"), ("OCCL_DEBUG_FILE", &pattern)],
    );
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(stdout.contains("APP subscriber installed"), "{stdout}");
    assert!(
        stdout.lines().any(|l| l.contains("WARN") && l.contains("occl: topo:")),
        "the app's subscriber got it: {stdout}"
    );
    assert!(!stderr.contains("NCCL "), "occl installed no logger: {stderr}");
    let logs = std::fs::read_dir(&dir)
        .expect("dir")
        .filter_map(|e| e.ok())
        .filter(|e| e.path().extension().is_some_and(|x| x == "log"))
        .count();
    assert_eq!(logs, 0, "no OCCL_DEBUG_FILE opened");
    let _ = std::fs::remove_dir_all(&dir);
}
