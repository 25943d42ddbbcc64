//! This job's `/metrics`: RAS's own series, built from a status gather, merged with the series of every process of
//! this node (fetched over the mesh), each labelled with its process, its node and the job.
//!
//! **RAS's series on `/metrics`**, beside every local process's own (`occl-telemetry`'s table in
//! `telemetry/src/prometheus/mod.rs`, each sample labelled here with the process's `pid` and the node's `host` name).
//! Every series has the `job` label (the first of `OCCL_JOB_ID`, `SLURM_JOB_ID`, `TORCHELASTIC_RUN_ID`, else a name
//! the job's processes derive alike), and `host` is the host name of a rank on this node; a rank on another node is
//! named by the address reports print for it. Job-wide series are the answering process's view of the whole job, so every node of a
//! job writes them: aggregate them with `max`, never `sum`. `dashboards/` builds its boards and alerts on these.
//!
//! | Metric | Type | Labels | What |
//! |---|---|---|---|
//! | `occl_ras_peers` | gauge | state (alive, unresponsive, dead, missing) | job-wide: processes by RAS state |
//! | `occl_ras_rank_missing` | gauge | comm, rank, pid, host, state (dead, unresponsive, missing) | job-wide: 1 per communicator rank whose process did not answer; absent ranks only, at most [`MAX_MISSING_RANKS`] |
//! | `occl_ras_op_count_spread` | gauge | comm, op | job-wide: launched operations of a type, highest rank minus lowest |
//! | `occl_ras_comm_mismatch` | gauge | comm | job-wide: 1 when the report calls the communicator a MISMATCH |
//! | `occl_ras_gather_duration_seconds`, `occl_ras_gather_leg_timeouts` | gauge | | the gather behind this scrape |
//! | `occl_operations_launched_total`, `occl_operations_completed_total` | counter | comm, rank, pid, host, op | this node's ranks: operations started, and returned successfully (launched − completed: in flight or failed) |
//! | `occl_operation_in_flight_age_seconds` | gauge | comm, rank, pid, host | this node's ranks: how long the running operation has run (0 when idle) |
//! | `occl_ras_node_metrics_processes` | gauge | result (answered, timeout, dead) | this node's processes by whether this scrape got their metrics |
//! | `occl_ras_node_metrics_dropped_lines` | gauge | | their lines this scrape dropped as malformed or duplicate |
//! | `occl_ras_job_running` | gauge | | 1 while the job runs in the answering process, 0 once it ends there without a failed communicator (`ending`): its last value tells a crash from a normal end |

use std::fmt::Write as _;
use std::time::Duration;

use super::report::build_report;
use super::shared::{gather, node_metrics, Shared};
use super::{Gathered, NodeMetrics};
use crate::exposition::{escape_label, merge, Part};
use crate::record::CollType;

/// The longest a scrape waits for another process of the node to send its metrics.
const PEER_METRICS_TIMEOUT: Duration = Duration::from_secs(2);

/// This process's job on `/metrics`: RAS's view of the job (from a status gather) and the metrics of every process of
/// this node (fetched over the mesh at the same time), merged into one exposition; each process's series carry its
/// `pid` and the node's `host`, and every series the job's name (`job`).
pub(crate) async fn job_metrics(sh: &Shared, b: Duration) -> Result<String, String> {
    let (g, node) = tokio::join!(gather(sh, b), node_metrics(sh, b.min(PEER_METRICS_TIMEOUT)));
    // The node as RAS reports name it (an address): this process's own entry of the gather, else its mesh address.
    let my_addr = g
        .as_ref()
        .ok()
        .and_then(|g| g.result.statuses.first().map(|s| s.host.clone()))
        .unwrap_or_else(|| sh.mesh_addr.ip().to_string());
    let ras = match &g {
        Ok(g) => prometheus(g, &my_addr, &sh.cfg.host_name),
        Err(e) => {
            tracing::debug!("occl-ras: /metrics without RAS's view: {e}");
            String::new()
        }
    };
    let node = node?;
    let mut parts = vec![Part { text: &ras, ..Part::default() }];
    let host = Some(sh.cfg.host_name.as_str());
    parts.extend(node.parts.iter().map(|(pid, text)| Part { text, pid: Some(*pid), host, job: None }));
    let merged = merge(&parts);
    if merged.dropped > 0 {
        tracing::debug!("occl-ras: /metrics dropped {} malformed or duplicate lines", merged.dropped);
    }
    let mut body = merged.text;
    node_metrics_gauges(&mut body, &node, merged.dropped);
    sh.ending.render(&mut body);
    // Every series, RAS's own and the scrape's account of it included, names the job.
    Ok(merge(&[Part { text: &body, job: Some(&sh.job), ..Part::default() }]).text)
}

/// Prometheus text exposition (version 0.0.4) for the processes of this node, from a gather: per-rank operation
/// counters and the age of the operation in flight, and RAS's own view (peers by state, gather time).
pub(crate) fn prometheus(g: &Gathered, my_addr: &str, host_name: &str) -> String {
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

    missing_ranks(&mut o, g, &report, my_addr, host_name);

    let local: Vec<_> = r.statuses.iter().filter(|s| s.host == my_addr).collect();
    let host = escape_label(host_name);
    type Counter = fn(&crate::record::RankRecord, CollType) -> u64;
    let counters: [(&str, &str, Counter); 2] = [
        ("occl_operations_launched_total", "Operations started, per communicator rank and type.", |r, c| r.launched(c)),
        ("occl_operations_completed_total", "Operations that returned successfully.", |r, c| r.completed(c)),
    ];
    for (name, text, value) in counters {
        help(&mut o, name, "counter", text);
        for s in &local {
            for rec in &s.records {
                for c in CollType::ALL {
                    let (comm, rank, pid) = (rec.info.comm.hash, rec.info.rank, rec.info.pid);
                    let _ = writeln!(
                        o,
                        "{name}{{comm=\"{comm:016x}\",rank=\"{rank}\",pid=\"{pid}\",host=\"{host}\",op=\"{}\"}} {}",
                        c.name(),
                        value(rec, c)
                    );
                }
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
                "occl_operation_in_flight_age_seconds{{comm=\"{:016x}\",rank=\"{}\",pid=\"{}\",host=\"{host}\"}} \
                 {age:.6}",
                rec.info.comm.hash, rec.info.rank, rec.info.pid
            );
        }
    }
    o
}

/// Series of `occl_ras_rank_missing` one scrape writes at most: a node that loses many processes with many
/// communicators each must not flood the time series database (`occl_ras_peers` still counts them all).
pub(crate) const MAX_MISSING_RANKS: usize = 1024;

/// `occl_ras_rank_missing`: one series per communicator rank whose process did not answer the gather, naming where
/// it ran and why it is absent, so that an alert can say which rank on which node to look at. Only absent ranks have
/// a series (a healthy job writes none); a rank that answered without the communicator (NCCL's NOCOMM) is a status
/// mismatch, not an absence, and is left to `occl_ras_comm_mismatch`.
fn missing_ranks(o: &mut String, g: &Gathered, report: &crate::report::Report, my_addr: &str, host_name: &str) {
    let silent: std::collections::BTreeSet<(&str, u32)> =
        g.result.unresponsive.iter().filter_map(|id| g.table.get(*id)).map(|p| (p.host.as_str(), p.pid)).collect();
    let _ = writeln!(
        o,
        "# HELP occl_ras_rank_missing 1 per communicator rank whose process did not answer RAS: dead (its loss is \
         confirmed), unresponsive (silent past the keep-alive warning) or missing (no answer in time).\n\
         # TYPE occl_ras_rank_missing gauge"
    );
    let absent = report.comms.iter().flat_map(|c| c.missing_ranks.iter().map(move |m| (c.hash, m)));
    for (comm, m) in absent.filter(|(_, m)| m.unresponsive).take(MAX_MISSING_RANKS) {
        let state = if m.considered_dead {
            "dead"
        } else if silent.contains(&(m.host.as_str(), m.pid)) {
            "unresponsive"
        } else {
            "missing"
        };
        let _ = writeln!(
            o,
            "occl_ras_rank_missing{{comm=\"{comm:016x}\",rank=\"{}\",pid=\"{}\",host=\"{}\",state=\"{state}\"}} 1",
            m.rank,
            m.pid,
            escape_label(if m.host == my_addr { host_name } else { &m.host })
        );
    }
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

#[cfg(test)]
mod tests {
    use super::{prometheus, Gathered};
    use crate::analysis::{KnownComm, KnownRank};
    use crate::mesh::{GatherResult, PeerAddr, PeerId, PeerTable, RequestId};
    use crate::record::{CollType, CommId, InFlight, LiveSnapshot, RankInfo, RankRecord};
    use crate::wire::ProcessStatus;

    const HOST: &str = "192.0.2.7";
    const NAME: &str = "node7";
    const NOW: u64 = 1_800_000_000_000_000_000;
    const COMM: CommId = CommId { hash: 0xab, root_host_hash: 1, root_pid_hash: 2 };

    /// Four one-rank processes on one node (pids 100…103) of one communicator; processes `answering` answer the
    /// gather, the rest are missing, `dead` of them dead and `silent` of them unresponsive. Rank 0 has run an
    /// all-reduce for 2.5 s.
    fn gathered(answering: &[u32], dead: &[u32], silent: &[u32]) -> Gathered {
        let addr = |i: u32| PeerAddr {
            addr: format!("{HOST}:{}", 40000 + i),
            host: HOST.into(),
            pid: 100 + i,
            cuda_devs: vec![],
            nvml_devs: vec![],
        };
        let table = PeerTable::new((0..4).map(addr).collect()).expect("table");
        let statuses = answering
            .iter()
            .map(|&i| {
                let mut live = LiveSnapshot { init_state: 0, ..LiveSnapshot::default() };
                live.launched[CollType::AllReduce as usize] = 5;
                live.completed[CollType::AllReduce as usize] = 4;
                live.in_flight = (i == 0).then_some(InFlight {
                    seq: 5,
                    coll: CollType::AllReduce,
                    coll_seq: 5,
                    bytes: 4096,
                    start_ns: NOW - 2_500_000_000,
                    peer: Some(1),
                    step_state: None,
                });
                let info = RankInfo {
                    comm: COMM,
                    size: 4,
                    rank: i,
                    pid: 100 + i,
                    host: HOST.into(),
                    cuda_dev: None,
                    nvml_dev: None,
                };
                let a = addr(i);
                ProcessStatus {
                    peer: PeerId(i),
                    addr: a.addr,
                    host: a.host,
                    pid: a.pid,
                    epoch: 0,
                    records: vec![RankRecord { info, live }],
                    dead: vec![],
                    unresponsive: vec![],
                }
            })
            .collect();
        let ids = |v: &[u32]| v.iter().map(|&p| PeerId(p)).collect::<Vec<_>>();
        let result = GatherResult {
            token: 0,
            id: RequestId { origin: PeerId(0), seq: 1 },
            statuses,
            missing: (0..4).filter(|i| !answering.contains(i)).map(PeerId).collect(),
            dead: ids(dead),
            unresponsive: ids(silent),
            leg_timeouts: 0,
            started: 0,
            finished: 1,
        };
        let members = (0..4).map(|r| KnownRank { rank: r, peer: PeerId(r), cuda_dev: None, nvml_dev: None }).collect();
        Gathered { result, table, known: vec![KnownComm { id: COMM, size: 4, members }], unix_ns: NOW }
    }

    fn samples<'a>(text: &'a str, name: &str) -> Vec<&'a str> {
        text.lines().filter(|l| l.starts_with(&format!("{name}{{"))).collect()
    }

    #[test]
    fn absent_ranks_are_named_with_their_node_pid_and_why() {
        // Process 2 is dead, 3 silent, 1 just has not answered in time.
        let text = prometheus(&gathered(&[0], &[2], &[3]), HOST, NAME);
        let c = "comm=\"00000000000000ab\"";
        assert_eq!(
            samples(&text, "occl_ras_rank_missing"),
            [
                format!("occl_ras_rank_missing{{{c},rank=\"1\",pid=\"101\",host=\"{NAME}\",state=\"missing\"}} 1"),
                format!("occl_ras_rank_missing{{{c},rank=\"2\",pid=\"102\",host=\"{NAME}\",state=\"dead\"}} 1"),
                format!("occl_ras_rank_missing{{{c},rank=\"3\",pid=\"103\",host=\"{NAME}\",state=\"unresponsive\"}} 1"),
            ],
            "{text}"
        );
        // Seen from another node, the ranks are named by the address reports print for them.
        let text = prometheus(&gathered(&[0], &[2], &[3]), "198.51.100.1", NAME);
        assert!(text.contains(&format!("rank=\"2\",pid=\"102\",host=\"{HOST}\",state=\"dead\"")), "{text}");
        assert!(text.contains("occl_ras_peers{state=\"dead\"} 1\n"), "{text}");
        // A healthy job writes the family's header and no series.
        let text = prometheus(&gathered(&[0, 1, 2, 3], &[], &[]), HOST, NAME);
        assert!(text.contains("# TYPE occl_ras_rank_missing gauge\n"), "{text}");
        assert!(samples(&text, "occl_ras_rank_missing").is_empty(), "{text}");
    }

    #[test]
    fn per_rank_series_carry_the_node() {
        let text = prometheus(&gathered(&[0, 1], &[], &[]), HOST, NAME);
        let c = "comm=\"00000000000000ab\"";
        let h = format!("host=\"{NAME}\"");
        assert!(text.contains(&format!(
            "occl_operations_launched_total{{{c},rank=\"1\",pid=\"101\",{h},op=\"AllReduce\"}} 5\n"
        )));
        assert!(text.contains(&format!(
            "occl_operations_completed_total{{{c},rank=\"0\",pid=\"100\",{h},op=\"AllReduce\"}} 4\n"
        )));
        assert!(text
            .contains(&format!("occl_operation_in_flight_age_seconds{{{c},rank=\"0\",pid=\"100\",{h}}} 2.500000\n")));
        assert!(text
            .contains(&format!("occl_operation_in_flight_age_seconds{{{c},rank=\"1\",pid=\"101\",{h}}} 0.000000\n")));
        // Only this node's processes: another host's records are not this scrape's to write.
        assert!(samples(
            &prometheus(&gathered(&[0, 1], &[], &[]), "198.51.100.1", NAME),
            "occl_operations_launched_total"
        )
        .is_empty());
        // promtool-valid exposition: the merge reads it back without dropping a line.
        let m = crate::exposition::merge(&[crate::exposition::Part { text: &text, ..Default::default() }]);
        assert_eq!(m.dropped, 0, "{text}");
    }
}
