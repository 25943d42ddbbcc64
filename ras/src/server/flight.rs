//! `GET /api/v1/flight-recorder`: the flight records of every communicator rank on the node, read on request (no
//! signal, no file), for every job of the node or the one `?job=` names. The port's owner renders its own process's
//! and asks each other process registered in the node's directory (`node`: private to this user, so no stranger is
//! asked or believed) for its own over that process's socket; a process that cannot answer is listed with the
//! reason. occl-ras knows nothing of the flight recorder: the library registers a renderer once
//! ([`set_flight_provider`]); a process without one has no records to give.
//!
//! ```text
//! { "host": str,
//!   "processes": [ { "job": str, "pid": u32, "records": [ <one dump document per communicator rank> ] }
//!                | { "job": str, "pid": u32|null, "error": str }, ... ] }     by job, then pid
//! ```

use std::path::Path;
use std::sync::{Arc, OnceLock};

use axum::extract::{Query, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

use super::ask::{ask_async, Ask};
use super::node_dir::other_processes;
use super::shared::Shared;

/// Writes the process's flight records into the string: `{"pid": u32, "records": [...]}`.
pub type FlightProvider = Arc<dyn Fn(&mut String) + Send + Sync>;

static PROVIDER: OnceLock<FlightProvider> = OnceLock::new();

/// Registers the renderer of `/api/v1/flight-recorder`; the first registration stays.
pub fn set_flight_provider(p: FlightProvider) {
    let _ = PROVIDER.set(p);
}

/// This process's flight records (the provider's document); `None` without a provider.
pub(crate) async fn render() -> Option<String> {
    let p = PROVIDER.get().cloned()?;
    // Reading the rings never blocks their writers, but a large ring takes a while to render.
    tokio::task::spawn_blocking(move || {
        let mut out = String::new();
        p(&mut out);
        out
    })
    .await
    .ok()
}

#[derive(serde::Deserialize)]
pub(crate) struct FlightQuery {
    /// One of the node's jobs (default: all of them).
    job: Option<String>,
}

/// The pid in a node socket's name, `<pid>-<n>.sock`.
fn pid_of(socket: &Path) -> Option<u32> {
    socket.file_name()?.to_str()?.split('-').next()?.parse().ok()
}

/// One process's entry from its provider's document.
fn process(job: &str, pid: Option<u32>, doc: Option<String>) -> Value {
    let Some(text) = doc.filter(|t| !t.is_empty()) else {
        return json!({ "job": job, "pid": pid, "error": "this process has no flight recorder" });
    };
    match serde_json::from_str::<Value>(&text) {
        Ok(v) => json!({ "job": job, "pid": v.get("pid").cloned().unwrap_or(json!(pid)), "records": v["records"] }),
        Err(e) => json!({ "job": job, "pid": pid, "error": format!("unreadable flight records: {e}") }),
    }
}

pub(crate) async fn flight_recorder(State(sh): State<Shared>, Query(q): Query<FlightQuery>) -> Response {
    let others = other_processes(sh.node.as_ref()).await;
    let job = q.job.as_deref();
    if let Some(j) = job.filter(|j| *j != &*sh.job && !others.iter().any(|(o, _)| o == j)) {
        let mut names: Vec<&str> = others.iter().map(|(o, _)| o.as_str()).chain([&*sh.job]).collect();
        names.sort_unstable();
        names.dedup();
        return (StatusCode::NOT_FOUND, format!("No job {j} on this node (its jobs: {})\n", names.join(", ")))
            .into_response();
    }
    let wanted = |j: &str| job.is_none_or(|w| w == j);
    let mine = async {
        match wanted(&sh.job) {
            true => Some(process(&sh.job, Some(std::process::id()), render().await)),
            false => None,
        }
    };
    let asks = others.into_iter().filter(|(j, _)| wanted(j)).map(|(j, p)| async move {
        let pid = pid_of(&p);
        match ask_async(p, Ask::Flight).await {
            Ok(text) => process(&j, pid, Some(text)),
            Err(e) => json!({ "job": j, "pid": pid, "error": format!("did not answer: {e}") }),
        }
    });
    let (mine, theirs) = tokio::join!(mine, futures_util::future::join_all(asks));
    let mut procs: Vec<Value> = mine.into_iter().chain(theirs).collect();
    procs.sort_by_key(|p| (p["job"].as_str().unwrap_or_default().to_owned(), p["pid"].as_u64()));
    let body = json!({ "host": sh.cfg.host_name, "processes": procs });
    ([(header::CONTENT_TYPE, "application/json")], format!("{body}\n")).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_entry_carries_its_job_pid_and_records_or_why_not() {
        assert_eq!(pid_of(Path::new("/run/occl-ras/28028/4242-0.sock")), Some(4242));
        assert_eq!(pid_of(Path::new("x.sock")), None);
        let ok = process("j", Some(1), Some(r#"{"pid":7,"records":[{"comm":{"rank":0}}]}"#.into()));
        assert_eq!(ok, json!({ "job": "j", "pid": 7, "records": [{"comm": {"rank": 0}}] }));
        let none = process("j", Some(1), Some(String::new()));
        assert_eq!(none["error"], "this process has no flight recorder");
        let bad = process("j", None, Some("{".into()));
        assert!(bad["error"].as_str().is_some_and(|e| e.starts_with("unreadable flight records")), "{bad}");
    }
}
