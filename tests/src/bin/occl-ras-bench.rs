//! `occl-ras-bench`: how long a RAS status gather takes over real loopback sockets.
//!
//! ```text
//! occl-ras-bench --peers 1024 --rounds 5      # 1,024 RAS servers, one thread each, in this process
//! ```
//!
//! Every simulated process is a full `RasServer` (its own RAS thread, mesh listener and sockets) with one rank
//! record, all joined into one job; the gathers are started from one of them, as a client's `STATUS` would. Prints
//! the time to form the mesh and each gather's wall time and completeness.

use clap::Parser;
use occl_ras::mesh::PeerAddr;
use occl_ras::record::{CollType, CommId, CommRecord, RankInfo, ResultCode};
use occl_ras::server::{RasConfig, RasServer};
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Parser)]
struct Args {
    /// Simulated processes (RAS servers).
    #[arg(long, default_value_t = 1024)]
    peers: usize,
    /// Gathers to time.
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// Gather budget, seconds.
    #[arg(long, default_value_t = 10.0)]
    budget: f64,
}

fn main() -> anyhow::Result<()> {
    let a = Args::parse();
    let secret = [7u8; 16];
    let mut cfg = RasConfig::from_vars(|_| None, IpAddr::V4(Ipv4Addr::LOCALHOST))?;
    // Only the mesh is measured: no client ports (1,024 listeners on one port would only share it).
    cfg.client_addr = "127.0.0.1:0".parse()?;
    let t0 = Instant::now();
    let servers: Vec<RasServer> =
        (0..a.peers).map(|_| RasServer::start(cfg.clone(), secret)).collect::<Result<_, _>>()?;
    let table: Vec<PeerAddr> = servers
        .iter()
        .enumerate()
        .map(|(i, s)| PeerAddr {
            addr: s.mesh_addr().to_string(),
            host: "127.0.0.1".into(),
            pid: 100_000 + i as u32,
            cuda_devs: Vec::new(),
            nvml_devs: Vec::new(),
        })
        .collect();
    let comm = CommId { hash: 0x0cc1, root_host_hash: 1, root_pid_hash: 2 };
    let records: Vec<Arc<CommRecord>> = (0..a.peers)
        .map(|i| {
            let r = Arc::new(CommRecord::new(RankInfo {
                comm,
                size: a.peers as u32,
                rank: i as u32,
                pid: 100_000 + i as u32,
                host: "127.0.0.1".into(),
                cuda_dev: None,
                nvml_dev: None,
            }));
            r.live().set_init_state(ResultCode::Success);
            r.live().launch(CollType::AllReduce, 4096, 0);
            r
        })
        .collect();
    let members: Vec<(u32, PeerAddr)> = table.iter().cloned().enumerate().map(|(i, p)| (i as u32, p)).collect();
    for (s, r) in servers.iter().zip(&records) {
        s.join(r, members.clone());
    }
    println!("# {} RAS servers started and joined in {:.3} s", a.peers, t0.elapsed().as_secs_f64());
    // Let the links form (a gather before that would also work, over fewer links).
    std::thread::sleep(Duration::from_secs(2));
    let budget = Duration::from_secs_f64(a.budget);
    for round in 0..a.rounds {
        let t = Instant::now();
        let g = servers[round % servers.len()].status_blocking(budget).map_err(anyhow::Error::msg)?;
        let ranks: usize = g.result.statuses.iter().map(|s| s.records.len()).sum();
        println!(
            "gather {round}: {:.3} ms wall, {} processes answered, {} ranks, {} missing, {} leg timeouts",
            t.elapsed().as_secs_f64() * 1e3,
            g.result.statuses.len(),
            ranks,
            g.result.missing.len(),
            g.result.leg_timeouts
        );
    }
    Ok(())
}
