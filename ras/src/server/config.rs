//! The RAS settings from the environment (`OCCL_*`, and NCCL's names where NCCL has the knob).

use std::net::{IpAddr, Ipv4Addr, SocketAddr, ToSocketAddrs};
use std::time::Duration;

use thiserror::Error;

use crate::mesh::{MeshConfig, MeshError};

/// NCCL's default client address, `localhost:28028`, as the loopback address it resolves to.
pub const DEFAULT_CLIENT_ADDR: SocketAddr = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 28028);

/// Everything the RAS thread needs to know before it starts.
#[derive(Debug, Clone)]
pub struct RasConfig {
    /// `OCCL_RAS_ENABLE` / `NCCL_RAS_ENABLE` (default on).
    pub enabled: bool,
    /// The client port: `OCCL_RAS_ADDR`, else `NCCL_RAS_ADDR`, else `127.0.0.1:28028`.
    pub client_addr: SocketAddr,
    /// The job's name, the first of `OCCL_JOB_ID`, `SLURM_JOB_ID`, `TORCHELASTIC_RUN_ID` that is set; without one the
    /// server names the job from its secret ([`crate::mesh::job_name`]). Labels every series (`job`) and tells the
    /// jobs that share the node's port apart.
    pub job: Option<String>,
    /// This node's host name (the `host` label, as OTLP's `host.name` and the trace files' names have it).
    pub host_name: String,
    /// Where the mesh listener binds (the transport's address; loopback by default).
    pub mesh_ip: IpAddr,
    /// Mesh timers (`OCCL_RAS_TIMEOUT_FACTOR`, `OCCL_RAS_DEAD_TIMEOUT`).
    pub mesh: MeshConfig,
    /// The gather budget when a client gives no `TIMEOUT` (NCCL: 5 s × the timeout factor).
    pub default_budget: Duration,
    /// Client connections held at once (see `server::admission`): by default 256, or a quarter of the process's
    /// file descriptors when that is less, so that clients never take the sockets the collectives need.
    pub max_clients: usize,
    /// A client connection must complete each request (an `ncclras` command line, an HTTP request head) within this
    /// long, the first one counted from the connection; one that sends nothing, or trickles bytes, is closed.
    pub client_request_timeout: Duration,
    /// `OCCL_RAS_EXIT_WAIT` (seconds, default 30, 0: never): the longest a process that owns the client port and
    /// ends without a failure waits at exit for one more scrape (see `server::ending`).
    pub exit_wait: Duration,
}

#[derive(Debug, Error)]
pub enum RasConfigError {
    #[error("{var}={value:?}: {reason}")]
    Bad { var: &'static str, value: String, reason: String },
    #[error(transparent)]
    Mesh(#[from] MeshError),
}

impl RasConfig {
    /// Reads the environment through `var` (`std::env::var` in production, a map in tests).
    pub fn from_vars(var: impl Fn(&str) -> Option<String>, mesh_ip: IpAddr) -> Result<RasConfig, RasConfigError> {
        let pick = |names: [&'static str; 2]| names.into_iter().find_map(|n| var(n).map(|v| (n, v)));
        let enabled = match pick(["OCCL_RAS_ENABLE", "NCCL_RAS_ENABLE"]) {
            None => true,
            Some((n, v)) => match v.trim() {
                "1" | "true" | "on" => true,
                "0" | "false" | "off" => false,
                _ => return Err(RasConfigError::Bad { var: n, value: v, reason: "must be 0 or 1".into() }),
            },
        };
        let client_addr = match pick(["OCCL_RAS_ADDR", "NCCL_RAS_ADDR"]) {
            None => DEFAULT_CLIENT_ADDR,
            Some((n, v)) => resolve(&v).map_err(|reason| RasConfigError::Bad { var: n, value: v.clone(), reason })?,
        };
        let job = JOB_VARS.into_iter().find_map(|n| var(n).map(|v| v.trim().to_string()).filter(|v| !v.is_empty()));
        let mesh = MeshConfig::from_vars(&var)?;
        let factor = mesh.keepalive.as_secs_f64().max(1.0);
        let exit_wait = match var(EXIT_WAIT_VAR) {
            None => DEFAULT_EXIT_WAIT,
            Some(v) => match v.trim().parse::<u64>() {
                Ok(s) if s <= 3600 => Duration::from_secs(s),
                _ => {
                    let reason = "a number of seconds, 0 to 3600 (0: never wait)".into();
                    return Err(RasConfigError::Bad { var: EXIT_WAIT_VAR, value: v, reason });
                }
            },
        };
        Ok(RasConfig {
            enabled,
            client_addr,
            job,
            host_name: host_name(),
            mesh_ip,
            mesh,
            default_budget: Duration::from_secs_f64(5.0 * factor),
            max_clients: max_clients(open_files_limit()),
            client_request_timeout: Duration::from_secs(5),
            exit_wait,
        })
    }
}

/// How long a cleanly ending port owner may wait at exit for its last scrape.
pub const EXIT_WAIT_VAR: &str = "OCCL_RAS_EXIT_WAIT";
const DEFAULT_EXIT_WAIT: Duration = Duration::from_secs(30);

/// Where the job's name comes from, first set first.
pub const JOB_VARS: [&str; 3] = ["OCCL_JOB_ID", "SLURM_JOB_ID", "TORCHELASTIC_RUN_ID"];

/// The kernel's host name, else `$HOSTNAME`, else "localhost".
fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok().filter(|s| !s.is_empty()))
        .unwrap_or_else(|| "localhost".into())
}

/// The client-connection bound for a process allowed `fds` open files (`None`: unknown).
fn max_clients(fds: Option<u64>) -> usize {
    const MAX: usize = 256;
    fds.map_or(MAX, |n| usize::try_from(n / 4).unwrap_or(MAX).clamp(16, MAX))
}

/// The soft RLIMIT_NOFILE, read from `/proc/self/limits` (this crate has no unsafe code to call getrlimit).
fn open_files_limit() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/self/limits").ok()?;
    parse_open_files(&text)
}

/// `Max open files  <soft>  <hard>  files` from `/proc/<pid>/limits`; `None` for `unlimited` or no such line.
fn parse_open_files(limits: &str) -> Option<u64> {
    let rest = limits.lines().find_map(|l| l.strip_prefix("Max open files"))?;
    rest.split_whitespace().next()?.parse().ok()
}

/// `host:port` with NCCL's syntax (`localhost:28028`, `[::1]:28028`, `10.0.0.5:28030`); a bare port means loopback.
fn resolve(text: &str) -> Result<SocketAddr, String> {
    let t = text.trim();
    if let Ok(port) = t.parse::<u16>() {
        return Ok(SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port));
    }
    if let Ok(a) = t.parse::<SocketAddr>() {
        return Ok(a);
    }
    let mut addrs = t.to_socket_addrs().map_err(|e| format!("expected host:port ({e})"))?;
    // Prefer IPv4, as `localhost` usually means 127.0.0.1 to the clients.
    let all: Vec<SocketAddr> = addrs.by_ref().collect();
    all.iter().find(|a| a.is_ipv4()).or(all.first()).copied().ok_or_else(|| "the host name resolves to nothing".into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn cfg(vars: &[(&str, &str)]) -> Result<RasConfig, RasConfigError> {
        let m: HashMap<String, String> = vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        RasConfig::from_vars(|k| m.get(k).cloned(), IpAddr::V4(Ipv4Addr::LOCALHOST))
    }

    #[test]
    fn addresses_and_switches() {
        let c = cfg(&[]).expect("defaults");
        assert!(c.enabled);
        assert_eq!(c.client_addr, DEFAULT_CLIENT_ADDR);
        assert_eq!(c.default_budget, Duration::from_secs(5));
        let c = cfg(&[("NCCL_RAS_ADDR", "localhost:28030")]).expect("nccl name");
        assert_eq!(c.client_addr.port(), 28030);
        assert!(c.client_addr.ip().is_loopback());
        let c = cfg(&[("OCCL_RAS_ADDR", "[::1]:28031"), ("NCCL_RAS_ADDR", "127.0.0.1:1")]).expect("occl wins");
        assert_eq!(c.client_addr, "[::1]:28031".parse::<SocketAddr>().expect("addr"));
        assert_eq!(cfg(&[("OCCL_RAS_ADDR", "28040")]).expect("port").client_addr.port(), 28040);
        assert!(!cfg(&[("NCCL_RAS_ENABLE", "0")]).expect("off").enabled);
        let e = cfg(&[("OCCL_RAS_ENABLE", "maybe")]).expect_err("bad switch").to_string();
        assert!(e.contains("OCCL_RAS_ENABLE"), "{e}");
        let e = cfg(&[("OCCL_RAS_ADDR", "no-such-host.invalid:x")]).expect_err("bad addr").to_string();
        assert!(e.contains("OCCL_RAS_ADDR"), "{e}");
    }

    #[test]
    fn the_job_is_the_first_launcher_name_set() {
        assert_eq!(cfg(&[]).expect("none").job, None);
        let c = cfg(&[("TORCHELASTIC_RUN_ID", "run"), ("SLURM_JOB_ID", "77")]).expect("slurm first");
        assert_eq!(c.job.as_deref(), Some("77"));
        let c = cfg(&[("TORCHELASTIC_RUN_ID", "run"), ("OCCL_JOB_ID", " j1 "), ("SLURM_JOB_ID", "")]).expect("occl");
        assert_eq!(c.job.as_deref(), Some("j1"));
        assert_eq!(
            cfg(&[("SLURM_JOB_ID", ""), ("TORCHELASTIC_RUN_ID", "run")]).expect("empty").job.as_deref(),
            Some("run")
        );
        assert!(!cfg(&[]).expect("host").host_name.is_empty());
    }

    #[test]
    fn client_bound_follows_the_file_limit() {
        let limits = "Limit                     Soft Limit           Hard Limit           Units     \n\
                      Max processes             63704                63704                processes \n\
                      Max open files            1024                 524288               files     \n";
        assert_eq!(parse_open_files(limits), Some(1024));
        assert_eq!(parse_open_files("Max open files  unlimited  unlimited  files\n"), None);
        assert_eq!(max_clients(Some(1024)), 256);
        assert_eq!(max_clients(Some(256)), 64, "a quarter of a low limit");
        assert_eq!(max_clients(Some(20)), 16);
        assert_eq!(max_clients(Some(1 << 20)), 256);
        assert_eq!(max_clients(None), 256);
    }

    /// Hostile timer values: refused with the variable named, or accepted with every timer and
    /// budget a finite duration that the server's arithmetic (saturating) can hold; no panic.
    #[test]
    fn hostile_timer_values_are_refused_or_held() {
        for var in ["OCCL_RAS_TIMEOUT_FACTOR", "NCCL_RAS_TIMEOUT_FACTOR", "OCCL_RAS_DEAD_TIMEOUT"] {
            for v in [
                "NaN",
                "inf",
                "-1",
                "0",
                "1e30",
                "4294967295",
                "4294967296",
                "18446744073709551615",
                "99999999999999999999",
            ] {
                match cfg(&[(var, v)]) {
                    Err(e) => {
                        let e = e.to_string();
                        assert!(e.contains(var) && e.contains("positive whole number"), "{var}={v}: {e}");
                    }
                    Ok(c) => {
                        // The budget is computed with floating point from the scaled timers.
                        assert!(c.default_budget >= Duration::from_secs(5), "{var}={v}");
                        assert!(c.mesh.dead_timeout > Duration::ZERO && c.mesh.keepalive > Duration::ZERO);
                    }
                }
            }
        }
    }
}
