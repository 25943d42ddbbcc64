//! `occl-run -n N [--] PROGRAM ARGS…`: starts an N-rank local job (like `mpirun -np N` on one host). Each rank is
//! a process of PROGRAM with `OCCL_RANK`, `OCCL_NRANKS` and `OCCL_UNIQUE_ID` set; the bootstrap root runs here.
//! Output is inherited; the exit code is the first failing rank's (0 if all succeed).

use clap::Parser;
use occl_tests::launch::{Job, Spawn};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

#[derive(Parser)]
#[command(name = "occl-run", about = "start an N-rank local occl job")]
struct Args {
    /// Ranks (processes).
    #[arg(short = 'n', long = "np", value_parser = clap::value_parser!(u64).range(1..=1024))]
    nranks: u64,
    /// Give up after this many seconds (the ranks are killed).
    #[arg(long, default_value_t = 86_400)]
    timeout: u64,
    program: PathBuf,
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    args: Vec<String>,
}

fn main() -> ExitCode {
    let a = Args::parse();
    let job = match Job::spawn(&a.program, &a.args, a.nranks as usize, &Spawn::default()) {
        Ok(j) => j,
        Err(e) => {
            eprintln!("occl-run: {e:#}");
            return ExitCode::FAILURE;
        }
    };
    match job.wait(Duration::from_secs(a.timeout)) {
        Ok(outs) => match outs.iter().find(|o| !o.status.success()) {
            None => ExitCode::SUCCESS,
            Some(o) => {
                eprintln!("occl-run: rank {} failed: {}", o.rank, o.status);
                ExitCode::from(o.status.code().map_or(1, |c| c.clamp(1, 255) as u8))
            }
        },
        Err(e) => {
            eprintln!("occl-run: {e:#}");
            ExitCode::FAILURE
        }
    }
}
