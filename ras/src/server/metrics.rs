//! What the client port serves, built from a gather: the report (text or JSON), Prometheus metrics, and the
//! monitor events' names and wording.

use std::fmt::Write as _;
use std::time::Duration;

use super::actor::Shared;
use super::client::gather;
use super::report::build_report;
use super::{Gathered, NodeMetrics};
use crate::client::Format;
use crate::mesh::{DeadCause, MonitorEvent};
use crate::record::CollType;
use crate::report::{render_json, render_text};

/// Gathers and renders the report as a `STATUS` client gets it (the whole text, then EOF).
pub(crate) async fn report_text(sh: &Shared, budget: Duration, verbose: bool, format: Format) -> String {
    match gather(sh, budget).await {
        Ok(g) => {
            let r = build_report(&g, verbose || format == Format::Json);
            match format {
                Format::Text => render_text(&r),
                Format::Json => render_json(&r),
            }
        }
        Err(e) => format!("occl RAS: the status could not be gathered: {e}\n"),
    }
}

/// Prometheus text exposition (version 0.0.4) for the processes of this node, from a gather: per-rank operation
/// counters and the age of the operation in flight, and RAS's own view (peers by state, gather time).
pub(crate) fn prometheus(g: &Gathered, my_host: &str) -> String {
    let mut o = String::new();
    let r = &g.result;
    let help = |o: &mut String, name: &str, kind: &str, text: &str| {
        let _ = writeln!(o, "# HELP {name} {text}\n# TYPE {name} {kind}");
    };
    help(&mut o, "occl_ras_peers", "gauge", "Processes of the job by RAS state, as the answering process sees them.");
    let dead = r.dead.len();
    let unresp = r.unresponsive.len();
    let alive = g.table.len().saturating_sub(r.missing.len());
    let _ = writeln!(o, "occl_ras_peers{{state=\"alive\"}} {alive}");
    let _ = writeln!(o, "occl_ras_peers{{state=\"unresponsive\"}} {unresp}");
    let _ = writeln!(o, "occl_ras_peers{{state=\"dead\"}} {dead}");
    let _ = writeln!(o, "occl_ras_peers{{state=\"missing\"}} {}", r.missing.len());
    help(&mut o, "occl_ras_gather_duration_seconds", "gauge", "How long the status gather behind this scrape took.");
    let _ = writeln!(o, "occl_ras_gather_duration_seconds {:.6}", r.finished.saturating_sub(r.started) as f64 / 1e9);
    help(&mut o, "occl_ras_gather_leg_timeouts", "gauge", "Legs of the status gather that timed out.");
    let _ = writeln!(o, "occl_ras_gather_leg_timeouts {}", r.leg_timeouts);

    // Job-wide agreement, from every answer: how far apart the ranks' launch counters are per communicator and
    // operation (a busy healthy job differs by a few for a moment; a hung one stays apart), and whether the report
    // calls the communicator a MISMATCH.
    let mut spread: std::collections::BTreeMap<(u64, CollType), (u64, u64)> = std::collections::BTreeMap::new();
    for rec in r.statuses.iter().flat_map(|s| s.records.iter()) {
        for c in CollType::ALL {
            let v = rec.launched(c);
            let e = spread.entry((rec.info.comm.hash, c)).or_insert((v, v));
            e.0 = e.0.min(v);
            e.1 = e.1.max(v);
        }
    }
    help(
        &mut o,
        "occl_ras_op_count_spread",
        "gauge",
        "Launched operations of a type: highest rank minus lowest rank, per communicator.",
    );
    for ((comm, c), (lo, hi)) in &spread {
        let _ = writeln!(o, "occl_ras_op_count_spread{{comm=\"{comm:016x}\",op=\"{}\"}} {}", c.name(), hi - lo);
    }
    let report = build_report(g, false);
    let mismatched: std::collections::BTreeSet<u64> = report
        .warnings
        .iter()
        .filter_map(|w| match w {
            crate::report::WarningEntry::CommMismatch { comm, .. } => Some(comm.hash),
            _ => None,
        })
        .collect();
    help(&mut o, "occl_ras_comm_mismatch", "gauge", "1 when the RAS report has a MISMATCH for the communicator.");
    let comms: std::collections::BTreeSet<u64> = spread.keys().map(|(c, _)| *c).collect();
    for comm in comms {
        let _ = writeln!(o, "occl_ras_comm_mismatch{{comm=\"{comm:016x}\"}} {}", u8::from(mismatched.contains(&comm)));
    }

    let local: Vec<_> = r.statuses.iter().filter(|s| s.host == my_host).collect();
    type Counter = fn(&crate::record::RankRecord, CollType) -> u64;
    let counters: [(&str, &str, Counter); 2] = [
        ("occl_operations_launched_total", "Operations started, per communicator rank and type.", |r, c| r.launched(c)),
        ("occl_operations_completed_total", "Operations that returned successfully.", |r, c| r.completed(c)),
    ];
    for (name, text, value) in counters {
        help(&mut o, name, "counter", text);
        for rec in local.iter().flat_map(|s| s.records.iter()) {
            for c in CollType::ALL {
                let (comm, rank, pid) = (rec.info.comm.hash, rec.info.rank, rec.info.pid);
                let _ = writeln!(
                    o,
                    "{name}{{comm=\"{comm:016x}\",rank=\"{rank}\",pid=\"{pid}\",op=\"{}\"}} {}",
                    c.name(),
                    value(rec, c)
                );
            }
        }
    }
    help(
        &mut o,
        "occl_operation_in_flight_age_seconds",
        "gauge",
        "How long the operation a rank is running now has run (0 when idle).",
    );
    for s in &local {
        for rec in &s.records {
            let age = rec.live.in_flight.as_ref().map_or(0.0, |f| f.waited_ns(g.unix_ns) as f64 / 1e9);
            let _ = writeln!(
                o,
                "occl_operation_in_flight_age_seconds{{comm=\"{:016x}\",rank=\"{}\",pid=\"{}\"}} {age:.6}",
                rec.info.comm.hash, rec.info.rank, rec.info.pid
            );
        }
    }
    o
}

/// The scrape's own account of the node's processes: how many answered with their metrics, did not answer in time
/// (skipped) or are dead, and how many of their lines the merge dropped.
pub(crate) fn node_metrics_gauges(o: &mut String, n: &NodeMetrics, dropped: usize) {
    let _ = writeln!(
        o,
        "# HELP occl_ras_node_metrics_processes Processes of this node by whether this scrape got their metrics \
         (timeout: skipped after the per-process timeout).\n# TYPE occl_ras_node_metrics_processes gauge"
    );
    for (result, v) in [("answered", n.parts.len()), ("timeout", n.timed_out), ("dead", n.dead)] {
        let _ = writeln!(o, "occl_ras_node_metrics_processes{{result=\"{result}\"}} {v}");
    }
    let _ = writeln!(
        o,
        "# HELP occl_ras_node_metrics_dropped_lines Lines of the processes' metrics this scrape dropped as malformed \
         or duplicate.\n# TYPE occl_ras_node_metrics_dropped_lines gauge\noccl_ras_node_metrics_dropped_lines {dropped}"
    );
}

/// NCCL's event name, whether it is in the lifecycle group (else trace), and the details text.
pub(crate) fn describe_event(e: &MonitorEvent) -> (&'static str, bool, String) {
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

/// `YYYY-MM-DD HH:MM:SS` for Unix seconds, in UTC (the RAS thread reads no time zone database).
pub(crate) fn local_time(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}", rem / 3600, rem / 60 % 60, rem % 60)
}

#[cfg(test)]
mod tests {
    use super::local_time;

    #[test]
    fn civil_time() {
        assert_eq!(local_time(0), "1970-01-01 00:00:00");
        assert_eq!(local_time(951_782_400), "2000-02-29 00:00:00");
        assert_eq!(local_time(1_795_306_325), "2026-11-22 00:12:05");
    }
}
