//! Logging for the benchmark binaries, the way NCCL users set it.

/// `OCCL_DEBUG` (or `NCCL_DEBUG`) as a tracing filter (`warn`, `info`, `debug`...); warnings by
/// default, on stderr.
pub fn init() {
    let level = std::env::var("OCCL_DEBUG")
        .or_else(|_| std::env::var("NCCL_DEBUG"))
        .ok()
        .and_then(|v| tracing_subscriber::EnvFilter::try_new(v.to_ascii_lowercase()).ok())
        .unwrap_or_else(|| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(level)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr)
        .try_init();
}
