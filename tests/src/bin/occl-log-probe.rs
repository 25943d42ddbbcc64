//! A program that links occl and logs nothing of its own: it creates a one-rank communicator
//! from the environment and runs one all-reduce. With `own` it first installs its own `tracing`
//! subscriber, which writes to stdout with an `APP` prefix, as an application with its own
//! logging would. The logging test reads what reaches stderr, stdout and `OCCL_DEBUG_FILE`.

use occl::{Comm, Config, RedOp};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    if std::env::args().nth(1).as_deref() == Some("own") {
        tracing_subscriber::fmt()
            .with_writer(std::io::stdout)
            .with_ansi(false)
            .with_max_level(tracing::Level::WARN)
            .event_format(tracing_subscriber::fmt::format().with_target(false).without_time())
            .init();
        tracing::warn!("APP subscriber installed");
    }
    let comm = Comm::init_all_with(1, Config::from_env()?)?.remove(0);
    let mut buf = [1.0f32; 4];
    comm.all_reduce_in_place(&mut buf, RedOp::Sum)?;
    println!("DONE {}", buf[0]);
    Ok(())
}
