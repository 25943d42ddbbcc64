//! `ncclras`: NVIDIA's RAS client, for occl and NCCL jobs alike (same flags, messages, exit codes; the server's
//! report printed as sent), and `ncclras --tui`, a live terminal view for hang triage.

mod app;
mod cli;
mod conn;
mod model;
mod plain;

use std::process::ExitCode;

fn main() -> ExitCode {
    let mut args = std::env::args();
    let argv0 = args.next().unwrap_or_else(|| "ncclras".into());
    match cli::parse(args, &|k| std::env::var(k).ok()) {
        Ok(cli::Parsed::Help) => {
            eprint!("{}", cli::usage(&argv0));
            ExitCode::SUCCESS
        }
        Ok(cli::Parsed::Version) => {
            eprintln!("NCCL RAS client version {} (occl {})", occl_types::NCCL_VERSION, env!("CARGO_PKG_VERSION"));
            ExitCode::SUCCESS
        }
        Ok(cli::Parsed::Run(o)) if o.tui => ExitCode::from(app::run(&o)),
        Ok(cli::Parsed::Run(o)) => ExitCode::from(plain::run(&o)),
        Err(e) => {
            // getopt's own complaints carry the program name; NVIDIA's value checks do not.
            match (e.message.is_empty(), e.show_usage) {
                (true, _) => {}
                (false, true) => eprintln!("{argv0}: {e}"),
                (false, false) => eprintln!("{e}"),
            }
            if e.show_usage {
                eprint!("{}", cli::usage(&argv0));
            }
            ExitCode::from(1)
        }
    }
}
