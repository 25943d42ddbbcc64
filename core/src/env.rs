//! Joining a job from a launcher's environment: which rank, how many, and where the root is.

use crate::bootstrap::root::{self, Expect, Watch};
use crate::config::Config;
use crate::error::{Error, Result};
use crate::id::UniqueId;
use siphasher::sip128::{Hasher128, SipHasher24};
use std::hash::Hasher;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, ToSocketAddrs};
use std::time::Duration;

pub(crate) struct Launch {
    pub rank: usize,
    pub nranks: usize,
    /// One id, or several for scalable init (`OCCL_UNIQUE_ID=<id>,<id>,…`).
    pub ids: Vec<UniqueId>,
    /// The launcher says every rank runs on this host (its local size equals the job's).
    pub all_local: bool,
    /// The root this process serves (rank 0 of a torchrun-style job): kept alive while it tells
    /// the ranks that the job cannot form.
    pub root: Option<Watch>,
}

fn get(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

fn num(name: &str) -> Result<Option<usize>> {
    get(name)
        .map(|v| {
            v.trim().parse::<usize>().map_err(|_| Error::arg(format!("{name}={v:?} is not a non-negative integer")))
        })
        .transpose()
}

/// A launcher's variables: the rank, the job's size, and the ranks on this host if it says.
struct Launcher {
    rank: &'static str,
    size: &'static str,
    local_size: Option<&'static str>,
}

/// The launchers we understand, in order of precedence.
const LAUNCHERS: [Launcher; 5] = [
    Launcher { rank: "OCCL_RANK", size: "OCCL_NRANKS", local_size: None },
    Launcher { rank: "RANK", size: "WORLD_SIZE", local_size: Some("LOCAL_WORLD_SIZE") },
    Launcher {
        rank: "OMPI_COMM_WORLD_RANK",
        size: "OMPI_COMM_WORLD_SIZE",
        local_size: Some("OMPI_COMM_WORLD_LOCAL_SIZE"),
    },
    Launcher { rank: "PMI_RANK", size: "PMI_SIZE", local_size: None },
    Launcher { rank: "SLURM_PROCID", size: "SLURM_NTASKS", local_size: None },
];

/// The first launcher whose variables are set, with its rank and size; one of a pair without
/// the other names the missing one.
fn launcher() -> Result<(&'static Launcher, usize, usize)> {
    for l in &LAUNCHERS {
        match (num(l.rank)?, num(l.size)?) {
            (Some(rank), Some(size)) => return Ok((l, rank, size)),
            (None, None) => continue,
            (rank, _) => {
                let (set, missing) = if rank.is_some() { (l.rank, l.size) } else { (l.size, l.rank) };
                return Err(Error::usage(format!(
                    "{set} is set but {missing} is not: a launcher sets both (the rank and the number of ranks)"
                )));
            }
        }
    }
    Err(Error::usage(
        "no launcher environment found: set OCCL_RANK and OCCL_NRANKS (or torchrun's RANK/WORLD_SIZE, Open MPI's \
         OMPI_COMM_WORLD_RANK/_SIZE, Slurm's SLURM_PROCID/SLURM_NTASKS)",
    ))
}

pub(crate) fn detect(config: &Config) -> Result<Launch> {
    let (l, rank, nranks) = launcher()?;
    let (rv, sv) = (l.rank, l.size);
    if !(1..=crate::config::MAX_NRANKS).contains(&nranks) {
        return Err(Error::arg(format!("{sv}={nranks}: expected between 1 and {} ranks", crate::config::MAX_NRANKS)));
    }
    let all_local = match l.local_size {
        Some(v) => num(v)? == Some(nranks),
        None => false,
    };
    let (ids, root) = if let Some(text) = get("OCCL_UNIQUE_ID") {
        (text.split(',').map(str::parse).collect::<Result<Vec<UniqueId>>>()?, None)
    } else if let (Some(addr), Some(port)) = (get("MASTER_ADDR"), get("MASTER_PORT")) {
        let expect = Expect { nranks, var: sv };
        let (id, root) = root_at_master(&addr, &port, rank, expect, config)?;
        (vec![id], root)
    } else {
        return Err(Error::usage(format!(
            "{rv}/{sv} are set but not where the root is: set OCCL_UNIQUE_ID (the text of a UniqueId created on one \
             rank) or MASTER_ADDR and MASTER_PORT"
        )));
    };
    if rank >= nranks {
        let here = Error::arg(format!("{rv}={rank} is out of range for {sv}={nranks}"));
        return Err(tell_root(&ids, rank, nranks, config).unwrap_or(here));
    }
    tracing::debug!(
        "occl: joining as rank {rank} of {nranks} ({rv}/{sv}{}), {} root(s), first {:?}",
        if all_local { ", all on this host" } else { "" },
        ids.len(),
        ids.first().map(UniqueId::addr)
    );
    Ok(Launch { rank, nranks, ids, all_local, root })
}

/// torchrun-style: rank 0 serves the root at MASTER_ADDR on MASTER_PORT+1 (MASTER_PORT itself
/// is the launcher's own store), or `OCCL_BOOTSTRAP_PORT`. The secret is `OCCL_JOB_SECRET` or,
/// failing that, derived from the job's identity, which every rank of the job sees alike (not
/// from `WORLD_SIZE`: a rank that disagrees on it must reach the root to be told so).
/// `MASTER_ADDR` may be a name or an IP literal, IPv6 ones with or without brackets. Rank 0
/// starts the root expecting `expect`, so a rank started with another size is told which.
fn root_at_master(
    addr: &str,
    port: &str,
    rank: usize,
    expect: Expect,
    config: &Config,
) -> Result<(UniqueId, Option<Watch>)> {
    let port: u16 = match get("OCCL_BOOTSTRAP_PORT") {
        Some(p) => p.trim().parse().map_err(|_| Error::arg(format!("OCCL_BOOTSTRAP_PORT={p:?} is not a port")))?,
        None => port
            .trim()
            .parse::<u16>()
            .ok()
            .and_then(|p| p.checked_add(1))
            .ok_or_else(|| Error::arg(format!("MASTER_PORT={port:?} is not a port below 65535")))?,
    };
    let host = addr.trim();
    let host = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host);
    let sa: SocketAddr = (host, port)
        .to_socket_addrs()
        .map_err(|e| Error::sys(format!("resolve MASTER_ADDR={addr:?}"), e))?
        .next()
        .ok_or_else(|| Error::arg(format!("MASTER_ADDR={addr:?} resolves to no address")))?;
    let secret = match get("OCCL_JOB_SECRET") {
        Some(hex) => {
            let id: UniqueId = format!("occl1-{}@{sa}", hex.trim())
                .parse()
                .map_err(|_| Error::arg("OCCL_JOB_SECRET must be 32 hex digits"))?;
            id.secret
        }
        None => {
            let mut h = SipHasher24::new_with_key(&[0x6f; 16]);
            for v in ["TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "OMPI_MCA_ess_base_jobid", "MASTER_ADDR", "MASTER_PORT"] {
                h.write(v.as_bytes());
                h.write(get(v).unwrap_or_default().as_bytes());
            }
            h.finish128().as_bytes()
        }
    };
    let root = if rank == 0 { Some(root::spawn(sa, secret, Some(expect), config.timeout)?.1) } else { None };
    Ok((UniqueId::at(sa, secret), root))
}

/// A rank whose own variables are inconsistent still joins the root, so that the ranks waiting
/// there learn at once that the job cannot form; the root's answer, which names the rank and
/// both sizes, is this rank's error too. `None` when the root could not be told.
fn tell_root(ids: &[UniqueId], rank: usize, nranks: usize, config: &Config) -> Option<Error> {
    let first = ids.first()?;
    let any = match first.addr() {
        SocketAddr::V4(_) => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        SocketAddr::V6(_) => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
    };
    let limit = config.timeout.min(Duration::from_secs(30));
    match crate::bootstrap::Client::join_any(ids, rank, nranks, any, limit) {
        Err(e) if e.kind() == crate::ErrorKind::InvalidUsage => Some(e),
        _ => None,
    }
}
