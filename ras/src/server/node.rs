//! The node's client port among jobs. One process of the node owns the port: the first to bind it (SO_REUSEADDR
//! only, so that a second bind fails instead of sharing it and letting the kernel hand each connection to a random
//! job). Every process also listens on its socket in the node's directory (`node_dir`, private to its user). The
//! owner answers for its own job and asks one process of each other job through these sockets (`ask`), or every
//! process for what each holds alone (its flight records); this module answers those asks. The processes that do
//! not own the port try it every second, so when the owner exits another takes it over.
//!
//! What the port answers, with several jobs on the node: `JOB <name>` (`ncclras --job`, `?job=` on HTTP) picks one;
//! without it a text report holds every job's report, one after the other by job name, `/metrics` every job's series
//! (each labelled with its `job`), and a JSON report is `{"jobs": {name: report, ...}}`. With one job the answers are
//! as they have always been.

use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};

use super::ask::{Ask, ASK_TIMEOUT, MAX_ASK_LINE};
use super::events::event_line;
use super::metrics::job_metrics;
use super::report::report_text;
use super::shared::Shared;

/// Answers the asks that arrive on this process's socket until the runtime stops.
pub(crate) fn serve(sh: Shared, listener: std::os::unix::net::UnixListener) {
    let listener = match tokio::net::UnixListener::from_std(listener) {
        Ok(l) => l,
        Err(e) => {
            tracing::warn!("occl-ras: node socket unusable: {e}; the port's owner cannot ask this process");
            return;
        }
    };
    tokio::spawn(async move {
        loop {
            match listener.accept().await {
                Ok((s, _)) => _ = tokio::spawn(answer(sh.clone(), s)),
                Err(e) => {
                    tracing::debug!("occl-ras: node socket accept: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    });
}

async fn answer(sh: Shared, stream: tokio::net::UnixStream) {
    let (r, mut w) = stream.into_split();
    let mut line = String::new();
    let mut r = tokio::io::BufReader::new(r.take(MAX_ASK_LINE as u64));
    match tokio::time::timeout(ASK_TIMEOUT, r.read_line(&mut line)).await {
        Ok(Ok(n)) if n > 0 => {}
        _ => return,
    }
    let Some(a) = Ask::parse(&line) else { return };
    let text = match a {
        Ask::Who => format!("{} {}\n", u8::from(sh.owner.load(Ordering::Relaxed)), sh.job),
        Ask::Status { verbose, format, budget_ms } => {
            report_text(&sh, Duration::from_millis(budget_ms), verbose, format).await
        }
        Ask::Metrics { budget_ms } => job_metrics(&sh, Duration::from_millis(budget_ms)).await.unwrap_or_default(),
        Ask::Flight => super::flight::render().await.unwrap_or_default(),
        Ask::Monitor { groups, format } => {
            let mut rx = sh.events.subscribe();
            loop {
                match rx.recv().await {
                    Ok(e) => {
                        if let Some(l) = event_line(&e, groups, format) {
                            if w.write_all(l.as_bytes()).await.is_err() {
                                return;
                            }
                        }
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                    Err(_) => return,
                }
            }
        }
    };
    let _ = w.write_all(text.as_bytes()).await;
    let _ = w.shutdown().await;
}
