//! Starts an N-rank job on this host: N child processes of a given program, each with
//! `OCCL_RANK`, `OCCL_NRANKS` and `OCCL_UNIQUE_ID` set (the root is served by this process), or
//! with a launcher's variables as torchrun would set them (`Job::start`).

use std::io::Read;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A running local job.
pub struct Job {
    pub children: Vec<Child>,
    /// Captured stdout of each rank so far (when `capture_stdout`), filled by reader threads.
    stdout: Vec<Arc<Mutex<String>>>,
    readers: Vec<std::thread::JoinHandle<()>>,
}

/// Options for `Job::spawn`.
#[derive(Debug, Clone, Default)]
pub struct Spawn {
    /// Extra environment for every rank.
    pub env: Vec<(String, String)>,
    /// Extra environment per rank (applied after `env`).
    pub rank_env: Vec<Vec<(String, String)>>,
    /// Capture stdout (otherwise inherited).
    pub capture_stdout: bool,
    /// Capture stderr (otherwise inherited).
    pub capture_stderr: bool,
    /// Where the bootstrap root listens (default: loopback); a job spread over network namespaces needs an
    /// address all of them reach.
    pub root_ip: Option<std::net::IpAddr>,
}

impl Job {
    /// Starts `nranks` copies of `program args…`. The unique id is created here, so the
    /// bootstrap root runs in this process for the job's lifetime.
    pub fn spawn(program: &Path, args: &[String], nranks: usize, opts: &Spawn) -> anyhow::Result<Job> {
        let id = match opts.root_ip {
            Some(ip) => occl::UniqueId::new_on(ip)?,
            None => occl::UniqueId::new()?,
        };
        let launcher = (0..nranks)
            .map(|r| {
                [("OCCL_RANK", r.to_string()), ("OCCL_NRANKS", nranks.to_string()), ("OCCL_UNIQUE_ID", id.to_string())]
                    .into_iter()
                    .map(|(k, v)| (k.to_string(), v))
                    .collect()
            })
            .collect();
        Job::start(program, args, launcher, opts)
    }

    /// Starts one copy of `program args…` per entry of `launcher`, each with that entry's
    /// variables (a launcher's: torchrun's `RANK`, `WORLD_SIZE`, `MASTER_ADDR`, …) and none of
    /// occl's own launcher variables from this process; then `opts.env` and `opts.rank_env`.
    pub fn start(
        program: &Path,
        args: &[String],
        launcher: Vec<Vec<(String, String)>>,
        opts: &Spawn,
    ) -> anyhow::Result<Job> {
        let mut children = Vec::with_capacity(launcher.len());
        for (r, vars) in launcher.into_iter().enumerate() {
            let mut cmd = Command::new(program);
            cmd.args(args).stdin(Stdio::null());
            for k in ["OCCL_RANK", "OCCL_NRANKS", "OCCL_UNIQUE_ID"] {
                cmd.env_remove(k);
            }
            for (k, v) in vars.iter().chain(&opts.env) {
                cmd.env(k, v);
            }
            if let Some(extra) = opts.rank_env.get(r) {
                for (k, v) in extra {
                    cmd.env(k, v);
                }
            }
            if opts.capture_stdout {
                cmd.stdout(Stdio::piped());
            }
            if opts.capture_stderr {
                cmd.stderr(Stdio::piped());
            }
            children.push(cmd.spawn().map_err(|e| anyhow::anyhow!("start rank {r} ({}): {e}", program.display()))?);
        }
        let mut job = Job { children, stdout: Vec::new(), readers: Vec::new() };
        for c in &mut job.children {
            let buf = Arc::new(Mutex::new(String::new()));
            job.stdout.push(buf.clone());
            let (out, err) = (c.stdout.take(), c.stderr.take());
            job.readers.push(std::thread::spawn(move || {
                let t = err.map(|mut e| {
                    std::thread::spawn(move || {
                        let mut s = String::new();
                        let _ = e.read_to_string(&mut s);
                        s
                    })
                });
                if let Some(mut o) = out {
                    let mut chunk = [0u8; 4096];
                    while let Ok(n) = o.read(&mut chunk) {
                        if n == 0 {
                            break;
                        }
                        if let Ok(mut b) = buf.lock() {
                            b.push_str(&String::from_utf8_lossy(&chunk[..n]));
                        }
                    }
                }
                if let Some(t) = t {
                    let e = t.join().unwrap_or_default();
                    if let Ok(mut b) = buf.lock() {
                        b.push_str(&e);
                    }
                }
            }));
        }
        Ok(job)
    }

    /// Rank `rank`'s captured output so far.
    pub fn output(&self, rank: usize) -> String {
        self.stdout.get(rank).and_then(|b| b.lock().ok().map(|s| s.clone())).unwrap_or_default()
    }

    /// Waits until every rank's output contains `needle` (or `limit` passes).
    pub fn wait_for_all(&self, needle: &str, limit: Duration) -> anyhow::Result<()> {
        let start = Instant::now();
        while !(0..self.children.len()).all(|r| self.output(r).contains(needle)) {
            if start.elapsed() > limit {
                anyhow::bail!(
                    "not every rank printed {needle:?} within {limit:?}:\n{}",
                    (0..self.children.len()).map(|r| format!("--- rank {r}\n{}", self.output(r))).collect::<String>()
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(())
    }

    /// Sends `sig` to rank `rank`'s process.
    pub fn signal(&self, rank: usize, sig: i32) -> anyhow::Result<()> {
        let pid = self.children.get(rank).ok_or_else(|| anyhow::anyhow!("no rank {rank}"))?.id();
        // SAFETY: signalling our own child.
        if unsafe { libc::kill(pid as libc::pid_t, sig) } != 0 {
            anyhow::bail!("kill({pid}, {sig}): {}", std::io::Error::last_os_error());
        }
        Ok(())
    }

    /// Waits for every rank, killing all of them if `limit` passes first. Returns each rank's
    /// exit status and captured output.
    pub fn wait(mut self, limit: Duration) -> anyhow::Result<Vec<RankOutput>> {
        let start = Instant::now();
        let mut statuses: Vec<Option<ExitStatus>> = vec![None; self.children.len()];
        while statuses.iter().any(Option::is_none) {
            for (i, c) in self.children.iter_mut().enumerate() {
                if statuses[i].is_none() {
                    statuses[i] = c.try_wait()?;
                }
            }
            if start.elapsed() > limit {
                for c in &mut self.children {
                    let _ = c.kill();
                    let _ = c.wait();
                }
                for t in self.readers.drain(..) {
                    let _ = t.join();
                }
                anyhow::bail!(
                    "job did not finish within {limit:?}; ranks were killed. Output:\n{}",
                    (0..self.children.len()).map(|r| format!("--- rank {r}\n{}", self.output(r))).collect::<String>()
                );
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        for t in self.readers.drain(..) {
            let _ = t.join();
        }
        Ok((0..self.children.len())
            .map(|i| RankOutput { rank: i, status: statuses[i].unwrap_or_else(exit_unknown), output: self.output(i) })
            .collect())
    }
}

fn exit_unknown() -> ExitStatus {
    use std::os::unix::process::ExitStatusExt;
    ExitStatus::from_raw(255 << 8)
}

impl Drop for Job {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// What one rank left behind.
#[derive(Debug, Clone)]
pub struct RankOutput {
    pub rank: usize,
    pub status: ExitStatus,
    /// Captured stdout, then stderr.
    pub output: String,
}
