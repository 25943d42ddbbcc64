//! What the client port answers when jobs share the node (see `node`): the job the client picked (`JOB <name>`,
//! `?job=`), else every job of the node: their text reports one after the other by job name, their JSON reports as
//! `{"jobs": {name: report}}`, their series in one exposition, their monitor events in one stream.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;
use tokio::sync::mpsc;

use super::ask::{ask_async, monitor_lines, Ask};
use super::events::event_line;
use super::metrics::job_metrics;
use super::node_dir::other_jobs;
use super::report::report_text;
use super::seat::write_within;
use super::shared::Shared;
use crate::client::{EventGroups, Format};
use crate::exposition::{merge, Part};

/// An answer, or why there is none.
pub(crate) enum Reply {
    Ok(String),
    /// The client named a job the node does not run; the text says which jobs it runs.
    Unknown(String),
    /// The job (this process's, or the one asked) could not answer.
    Failed(String),
}

/// Whose answer the client wants.
enum Pick {
    /// This process's job (the only one, or the one named).
    Own,
    /// Another job, through one of its processes.
    One(String, PathBuf),
    /// Every job of the node: this one and these.
    All(BTreeMap<String, PathBuf>),
    Unknown(String),
}

async fn pick(sh: &Shared, job: Option<&str>) -> Pick {
    if job == Some(&*sh.job) {
        return Pick::Own;
    }
    let others = other_jobs(sh.node.as_ref(), &sh.job).await;
    match job {
        None if others.is_empty() => Pick::Own,
        None => Pick::All(others),
        Some(j) => match others.get(j) {
            Some(p) => Pick::One(j.to_string(), p.clone()),
            None => {
                let mut names: Vec<&str> = others.keys().map(String::as_str).collect();
                names.push(&sh.job);
                names.sort_unstable();
                Pick::Unknown(format!("No job {j} on this node (its jobs: {})", names.join(", ")))
            }
        },
    }
}

/// Every other job's answer to `a`, by job name; one that fails answers with `failed(error)`.
async fn ask_all(
    others: &BTreeMap<String, PathBuf>,
    a: &Ask,
    failed: impl Fn(&str, String) -> String,
) -> Vec<(String, String)> {
    let failed = &failed;
    let asks = others.iter().map(|(j, p)| async move {
        let text = ask_async(p.clone(), a.clone()).await.unwrap_or_else(|e| failed(j, e.to_string()));
        (j.clone(), text)
    });
    futures_util::future::join_all(asks).await
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// The report a `STATUS` client gets (the whole text: a failed gather is said in it).
pub(crate) async fn status(sh: &Shared, budget: Duration, verbose: bool, format: Format, job: Option<&str>) -> Reply {
    let a = Ask::Status { verbose, format, budget_ms: ms(budget) };
    let failed = |j: &str, e: String| format!("occl RAS: job {j} did not answer: {e}\n");
    match pick(sh, job).await {
        Pick::Own => Reply::Ok(report_text(sh, budget, verbose, format).await),
        Pick::One(j, p) => match ask_async(p, a).await {
            Ok(text) if !text.is_empty() => Reply::Ok(text),
            Ok(_) => Reply::Failed(failed(&j, "no report".into())),
            Err(e) => Reply::Failed(failed(&j, e.to_string())),
        },
        Pick::Unknown(e) => Reply::Unknown(e),
        Pick::All(others) => {
            let (mine, theirs) = tokio::join!(report_text(sh, budget, verbose, format), ask_all(&others, &a, failed));
            let mut all: BTreeMap<String, String> = theirs.into_iter().collect();
            all.insert(sh.job.to_string(), mine);
            Reply::Ok(combine(format, &all))
        }
    }
}

/// Several jobs' reports as one answer.
fn combine(format: Format, all: &BTreeMap<String, String>) -> String {
    match format {
        Format::Text => {
            let mut out = String::new();
            for (i, (job, text)) in all.iter().enumerate() {
                out.push_str(&format!(
                    "Job {job} ({} of {} jobs on this node; ncclras --job {job} shows it alone)\n\n{text}",
                    i + 1,
                    all.len()
                ));
                if !text.ends_with('\n') {
                    out.push('\n');
                }
                if i + 1 < all.len() {
                    out.push('\n');
                }
            }
            out
        }
        Format::Json => {
            let jobs: serde_json::Map<String, serde_json::Value> = all
                .iter()
                .map(|(j, t)| {
                    let v = serde_json::from_str(t).unwrap_or_else(|_| serde_json::Value::String(t.clone()));
                    (j.clone(), v)
                })
                .collect();
            format!("{}\n", serde_json::json!({ "jobs": jobs }))
        }
    }
}

/// `/metrics`: the picked job's exposition, or every job's merged (each series carries its `job`).
pub(crate) async fn metrics(sh: &Shared, budget: Duration, job: Option<&str>) -> Reply {
    let a = Ask::Metrics { budget_ms: ms(budget) };
    match pick(sh, job).await {
        Pick::Own => job_metrics(sh, budget).await.map_or_else(Reply::Failed, Reply::Ok),
        Pick::One(j, p) => match ask_async(p, a).await {
            Ok(text) if !text.is_empty() => Reply::Ok(text),
            Ok(_) => Reply::Failed(format!("job {j} has no metrics to give")),
            Err(e) => Reply::Failed(format!("job {j} did not answer: {e}")),
        },
        Pick::Unknown(e) => Reply::Unknown(e),
        Pick::All(others) => {
            let (mine, theirs) = tokio::join!(job_metrics(sh, budget), ask_all(&others, &a, |_, _| String::new()));
            let mine = match mine {
                Ok(m) => m,
                Err(e) => return Reply::Failed(e),
            };
            let mut parts = vec![Part { text: &mine, ..Part::default() }];
            parts.extend(theirs.iter().map(|(_, t)| Part { text: t, ..Part::default() }));
            Reply::Ok(merge(&parts).text)
        }
    }
}

/// Streams monitor events of the picked job, or of every job, until the client goes away.
pub(crate) async fn monitor(
    sh: &Shared,
    stream: &mut TcpStream,
    groups: EventGroups,
    format: Format,
    job: Option<&str>,
) {
    let (mine, theirs) = match pick(sh, job).await {
        Pick::Own => (true, Vec::new()),
        Pick::One(_, p) => (false, vec![p]),
        Pick::All(others) => (true, others.into_values().collect()),
        Pick::Unknown(e) => {
            let _ = write_within(stream, format!("ERROR: {e}\n").as_bytes()).await;
            return;
        }
    };
    let (tx, mut lines) = mpsc::channel::<String>(256);
    for p in theirs {
        monitor_lines(p, groups, format, tx.clone());
    }
    drop(tx);
    let mut remote = true;
    let mut rx = sh.events.subscribe();
    let mut sink = [0u8; 256];
    loop {
        tokio::select! {
            ev = rx.recv(), if mine => match ev {
                Ok(e) => {
                    if let Some(line) = event_line(&e, groups, format) {
                        if !write_within(stream, line.as_bytes()).await {
                            return;
                        }
                    }
                }
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                Err(_) => return,
            },
            l = lines.recv(), if remote => match l {
                Some(l) => {
                    if !write_within(stream, l.as_bytes()).await {
                        return;
                    }
                }
                None if mine => remote = false,
                None => return,
            },
            r = stream.read(&mut sink) => match r {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            },
        }
    }
}
