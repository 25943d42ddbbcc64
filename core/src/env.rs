//! Joining a job from a launcher's environment: which rank, how many, and where the root is.

use crate::config::Config;
use crate::error::{Error, Result};
use crate::id::UniqueId;
use siphasher::sip128::{Hasher128, SipHasher24};
use std::hash::Hasher;
use std::net::{SocketAddr, ToSocketAddrs};

pub(crate) struct Launch {
    pub rank: usize,
    pub nranks: usize,
    /// One id, or several for scalable init (`OCCL_UNIQUE_ID=<id>,<id>,…`).
    pub ids: Vec<UniqueId>,
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

/// The launchers we understand, in order of precedence, as (rank variable, size variable).
const LAUNCHERS: [(&str, &str); 5] = [
    ("OCCL_RANK", "OCCL_NRANKS"),
    ("RANK", "WORLD_SIZE"),
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
    ("PMI_RANK", "PMI_SIZE"),
    ("SLURM_PROCID", "SLURM_NTASKS"),
];

pub(crate) fn detect(config: &Config) -> Result<Launch> {
    let mut found = None;
    for (rv, sv) in LAUNCHERS {
        if let (Some(rank), Some(size)) = (num(rv)?, num(sv)?) {
            found = Some((rank, size, rv, sv));
            break;
        }
    }
    let Some((rank, nranks, rv, sv)) = found else {
        return Err(Error::usage(
            "no launcher environment found: set OCCL_RANK and OCCL_NRANKS (or torchrun's RANK/WORLD_SIZE, Open MPI's \
             OMPI_COMM_WORLD_RANK/_SIZE, Slurm's SLURM_PROCID/SLURM_NTASKS)",
        ));
    };
    if !(1..=crate::config::MAX_NRANKS).contains(&nranks) {
        return Err(Error::arg(format!("{sv}={nranks}: expected between 1 and {} ranks", crate::config::MAX_NRANKS)));
    }
    if rank >= nranks {
        return Err(Error::arg(format!("{rv}={rank} is out of range for {sv}={nranks}")));
    }
    let ids = if let Some(text) = get("OCCL_UNIQUE_ID") {
        text.split(',').map(str::parse).collect::<Result<Vec<UniqueId>>>()?
    } else if let (Some(addr), Some(port)) = (get("MASTER_ADDR"), get("MASTER_PORT")) {
        vec![root_at_master(&addr, &port, rank, config)?]
    } else {
        return Err(Error::usage(format!(
            "{rv}/{sv} are set but not where the root is: set OCCL_UNIQUE_ID (the text of a UniqueId created on one \
             rank) or MASTER_ADDR and MASTER_PORT"
        )));
    };
    tracing::debug!(
        "occl: joining as rank {rank} of {nranks} ({rv}/{sv}), {} root(s), first {:?}",
        ids.len(),
        ids.first().map(UniqueId::addr)
    );
    Ok(Launch { rank, nranks, ids })
}

/// torchrun-style: rank 0 serves the root at MASTER_ADDR on MASTER_PORT+1 (MASTER_PORT itself
/// is the launcher's own store), or `OCCL_BOOTSTRAP_PORT`. The secret is `OCCL_JOB_SECRET` or,
/// failing that, derived from the job's identity, which every rank of the job sees alike.
fn root_at_master(addr: &str, port: &str, rank: usize, _config: &Config) -> Result<UniqueId> {
    let port: u16 = match get("OCCL_BOOTSTRAP_PORT") {
        Some(p) => p.trim().parse().map_err(|_| Error::arg(format!("OCCL_BOOTSTRAP_PORT={p:?} is not a port")))?,
        None => port
            .trim()
            .parse::<u16>()
            .ok()
            .and_then(|p| p.checked_add(1))
            .ok_or_else(|| Error::arg(format!("MASTER_PORT={port:?} is not a port below 65535")))?,
    };
    let sa: SocketAddr = (addr.trim(), port)
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
            for v in [
                "TORCHELASTIC_RUN_ID",
                "SLURM_JOB_ID",
                "OMPI_MCA_ess_base_jobid",
                "MASTER_ADDR",
                "MASTER_PORT",
                "WORLD_SIZE",
            ] {
                h.write(v.as_bytes());
                h.write(get(v).unwrap_or_default().as_bytes());
            }
            h.finish128().as_bytes()
        }
    };
    if rank == 0 {
        crate::bootstrap::root::spawn(sa, secret)?;
    }
    Ok(UniqueId::at(sa, secret))
}
