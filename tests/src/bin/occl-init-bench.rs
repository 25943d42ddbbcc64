//! Times communicator creation in threads mode: `occl-init-bench <nranks>... --ids 1,8`.
//! Prints one line per (nranks, ids) with the wall time of `Comm::init_all_scalable`.

use anyhow::Context;
use occl::{Comm, Config};
use std::time::Instant;

fn main() -> anyhow::Result<()> {
    occl_tests::logging::init();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut sizes = Vec::new();
    let mut ids = vec![1usize, 8];
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if a == "--ids" {
            let v = it.next().context("--ids needs a list")?;
            ids = v.split(',').map(str::parse).collect::<Result<_, _>>().context("--ids: numbers")?;
        } else {
            sizes.push(a.parse::<usize>().context("nranks must be a number")?);
        }
    }
    for &n in &sizes {
        for &m in &ids {
            let t0 = Instant::now();
            let comms = Comm::init_all_scalable(n, m.min(n), Config::from_env()?)?;
            let init = t0.elapsed().as_secs_f64();
            for c in comms {
                c.destroy()?;
            }
            println!("init nranks={n} ids={m} seconds={init:.3}");
        }
    }
    Ok(())
}
