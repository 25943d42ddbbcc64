//! Monitor events as NCCL's `MONITOR` clients read them (reference §1.5): each event's name, group (lifecycle or
//! trace) and wording, and its line in text or JSON. `MONITOR` on the client port, `/api/v1/events` and the asks
//! among the node's processes all print these lines.

use super::timestamp::local_time;
use super::Event;
use crate::client::{EventGroups, Format};
use crate::mesh::{DeadCause, MonitorEvent};

/// NCCL's monitor line for an event (reference §1.5), or `None` if the client did not ask for its group.
pub(crate) fn event_line(e: &Event, groups: EventGroups, format: Format) -> Option<String> {
    let (name, lifecycle, details) = describe_event(&e.event);
    if !(if lifecycle { groups.lifecycle } else { groups.trace }) {
        return None;
    }
    let ts = local_time(e.unix_ms / 1000);
    let who = match &e.peer {
        Some(p) => format!("Process {} on node {}", p.pid, p.host),
        None => "Unknown peer".to_string(),
    };
    Some(match format {
        Format::Text => format!("[{ts}] {name}: {who} {details}\n"),
        Format::Json => {
            let peer = match &e.peer {
                Some(p) => {
                    serde_json::json!({"host": p.host, "pid": p.pid, "cuda_devs": p.cuda_devs, "nvml_devs": p.nvml_devs})
                }
                None => serde_json::json!({}),
            };
            let group = if lifecycle { "LIFECYCLE" } else { "TRACE" };
            format!(
                "{}\n",
                serde_json::json!({"timestamp": ts, "group": group, "event": name, "peer": peer, "details": details})
            )
        }
    })
}

/// NCCL's event name, whether it is in the lifecycle group (else trace), and the details text.
fn describe_event(e: &MonitorEvent) -> (&'static str, bool, String) {
    match e {
        MonitorEvent::PeerConnected { .. } => ("PEER_CONNECTED", false, "connection established successfully".into()),
        MonitorEvent::PeerDisconnected { .. } => {
            ("PEER_DISCONNECTED", false, "peer closed current connection during receive operation".into())
        }
        MonitorEvent::PeerUnresponsive { silent_ns, .. } => (
            "PEER_UNRESPONSIVE",
            false,
            format!("peer not responding for {}s (keepalive warning)", silent_ns / 1_000_000_000),
        ),
        MonitorEvent::PeerAlive { from_dead, .. } => ("PEER_RECOVERED", *from_dead, "peer responding again".into()),
        MonitorEvent::PeerDead { cause, .. } => ("PEER_DEAD", true, dead_cause(cause)),
        MonitorEvent::AuthFailed { .. } => {
            ("PEER_AUTH_FAILED", false, "connection closed: the job secret did not match".into())
        }
        MonitorEvent::DeclaredDead { epoch } => {
            ("PEER_DECLARED_DEAD", true, format!("this process was declared dead; alive again at epoch {epoch}"))
        }
    }
}

fn dead_cause(c: &DeadCause) -> String {
    format!("{c:?}").to_lowercase()
}
