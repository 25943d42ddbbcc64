//! What another local user can do to a job's shared memory: nothing. The attacker runs as uid
//! 65534 (`setpriv`; the test needs root to switch users, which CI has) with what the RAS port
//! tells anyone on the node (communicator id, pids). And what a job leaves in /dev/shm when it
//! ends badly: nothing either.

mod common;

use common::{env, err_of, scratch, shm_files_of};
use occl_tests::launch::{Job, Spawn};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

/// `field=value` of the first line of `out` that starts with `prefix`.
fn field(out: &str, prefix: &str, key: &str) -> Option<String> {
    let line = out.lines().find(|l| l.starts_with(prefix))?;
    line.split_whitespace().find_map(|w| w.strip_prefix(&format!("{key}="))).map(str::to_string)
}

/// A copy of the attack binary that uid 65534 can run wherever the build tree lives.
fn attack_binary(dir: &Path) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let bin = dir.join("occl-shm-attack");
    std::fs::copy(env!("CARGO_BIN_EXE_occl-shm-attack"), &bin).expect("copy the attack binary");
    for (p, mode) in [(dir, 0o755), (bin.as_path(), 0o755)] {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).expect("chmod");
    }
    bin
}

#[test]
fn another_user_can_neither_read_nor_inject_into_a_jobs_shared_memory() {
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI runs as root; this test needs it to run the attacker as another uid"
        );
        println!("SKIPPED: not root, so the attacker cannot run as another user here (CI runs it as root)");
        return;
    }
    let dir = scratch("shm-attack");
    let bin = attack_binary(&dir);
    let (go, done) = (dir.join("go"), dir.join("done"));
    let spawn = Spawn {
        env: env(&[("OCCL_TIMEOUT", "10"), ("OCCL_RAS_ENABLE", "0")]),
        capture_stdout: true,
        capture_stderr: true,
        ..Spawn::default()
    };
    let args = ["victim".to_string(), go.display().to_string(), done.display().to_string()];
    let job = Job::spawn(&bin, &args, 2, &spawn).expect("start the victims");
    job.wait_for_all("READY", Duration::from_secs(30)).expect("victims ready");
    let pids: Vec<String> = (0..2).map(|r| field(&job.output(r), "READY", "pid").expect("pid")).collect();
    let comm = field(&job.output(0), "READY", "comm").expect("comm id");

    let mut attacker = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .arg(&bin)
        .args(["attacker", &comm])
        .args(&pids)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run the attacker with setpriv (util-linux)");
    // The attacker's files are planted and its watch is set before the victims connect.
    let mut out = attacker.stdout.take().expect("attacker stdout");
    let mut first = Vec::new();
    {
        use std::io::Read;
        let mut byte = [0u8; 1];
        while !first.ends_with(b"\n") && out.read(&mut byte).unwrap_or(0) == 1 {
            first.push(byte[0]);
        }
    }
    let first = String::from_utf8_lossy(&first).into_owned();
    assert_eq!(first.trim(), "PLANTED 2", "the attacker could not plant its files");

    std::fs::write(&go, b"").expect("go");
    let start = std::time::Instant::now();
    while !(0..2).all(|r| job.output(r).contains("RESULT") || job.output(r).contains("ERR")) {
        assert!(start.elapsed() < Duration::from_secs(30), "victims: {} / {}", job.output(0), job.output(1));
        std::thread::sleep(Duration::from_millis(10));
    }
    // The registered buffers' memory files are open in the victims now, for the attacker to try.
    for p in &pids {
        let memfds = std::fs::read_dir(format!("/proc/{p}/fd"))
            .expect("victim fds")
            .flatten()
            .filter(|e| std::fs::read_link(e.path()).is_ok_and(|l| l.to_string_lossy().contains("occl-hostbuf")))
            .count();
        assert!(memfds >= 2, "victim {p} holds {memfds} host-buffer memory files");
    }
    std::thread::sleep(Duration::from_millis(300));
    std::fs::write(&done, b"").expect("done");
    let outs = job.wait(Duration::from_secs(30)).expect("victims end");
    let attack = attacker.wait_with_output().expect("attacker ends");
    let report = {
        use std::io::Read;
        let mut s = String::new();
        let _ = out.read_to_string(&mut s);
        s + &String::from_utf8_lossy(&attack.stdout) + &String::from_utf8_lossy(&attack.stderr)
    };
    for o in &outs {
        assert!(o.output.contains("RESULT ok") && o.status.success(), "rank {} ({}):\n{}", o.rank, o.status, o.output);
    }
    let num = |k: &str| field(&report, "ATTACK", k).and_then(|v| v.parse::<usize>().ok()).unwrap_or(usize::MAX);
    assert_eq!(num("opened"), 0, "the attacker opened a segment of the job:\n{report}");
    assert_eq!(num("proc_opened"), 0, "the attacker opened a victim's descriptor:\n{report}");
    assert!(num("seen") >= 2 && num("seen") != usize::MAX, "the attacker saw none of the job's segments:\n{report}");
    assert!(num("denied") >= 1 && num("denied") != usize::MAX, "no segment was there to try:\n{report}");
    assert!(num("proc_denied") > 0 && num("proc_denied") != usize::MAX, "{report}");
    println!("{}", report.lines().find(|l| l.starts_with("ATTACK")).unwrap_or_default());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_killed_registered_job_leaves_nothing_in_dev_shm() {
    let spawn = Spawn {
        env: env(&[("OCCL_TIMEOUT", "5"), ("OCCL_RAS_ENABLE", "0")]),
        capture_stdout: true,
        capture_stderr: true,
        ..Spawn::default()
    };
    let job = Job::spawn(common::worker(), &["register-loop".to_string()], 3, &spawn).expect("start");
    job.wait_for_all("LOOPING", Duration::from_secs(60)).expect("ranks loop");
    let pids: Vec<u32> = job.children.iter().map(|c| c.id()).collect();
    for r in 0..3 {
        job.signal(r, libc::SIGKILL).expect("kill");
    }
    job.wait(Duration::from_secs(30)).expect("job ends");
    assert_eq!(shm_files_of(&pids), Vec::<String>::new(), "left in /dev/shm by the killed job");
}

#[test]
fn ranks_with_different_fifo_geometry_fail_and_leave_nothing() {
    let spawn = Spawn {
        env: env(&[("OCCL_TIMEOUT", "10"), ("OCCL_RAS_ENABLE", "0")]),
        rank_env: vec![vec![], vec![("OCCL_SHM_SLOT_SIZE".into(), "131072".into())], vec![]],
        capture_stdout: true,
        capture_stderr: true,
        ..Spawn::default()
    };
    let start = std::time::Instant::now();
    let job = Job::spawn(common::worker(), &["matrix".to_string(), "counts=1".to_string()], 3, &spawn).expect("start");
    let pids: Vec<u32> = job.children.iter().map(|c| c.id()).collect();
    let outs = job.wait(Duration::from_secs(60)).expect("job ends");
    for o in &outs {
        let (kind, _, line) = err_of(o).unwrap_or_else(|| panic!("rank {} did not fail:\n{}", o.rank, o.output));
        assert!(kind == "InvalidUsage" && line.contains("OCCL_SHM_SLOT_SIZE"), "rank {}: {line}", o.rank);
    }
    assert!(start.elapsed() < Duration::from_secs(10), "took {:?}", start.elapsed());
    assert_eq!(shm_files_of(&pids), Vec::<String>::new(), "left in /dev/shm after the failed job");
}
