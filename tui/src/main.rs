//! `ncclras`: the RAS client and live terminal UI. Filled in by the `ncclras` issue.
use std::process::ExitCode;

fn main() -> ExitCode {
    eprintln!("ncclras: not built yet; see the issue \"ncclras: the RAS client and a live terminal UI\"");
    ExitCode::from(2)
}
