//! The parsers on NCCL 2.28.9's real reports (ras/proto/tests/fixtures) and on occl's own renderings of a hung job.

use super::*;
use occl_ras_proto::report::{
    render_json, render_text, CommData, CommGroupRow, CommRef, CommStatus, ErrorEntry, ErrorSet, FailedOp, JobSummary,
    MissingRankData, OpTotals, ProcessRef, RankData, RankLoc, RankRef, Report, StuckOp, VersionInfo,
};

const NORMAL: &str = include_str!("../../../ras/proto/tests/fixtures/A_status_normal.txt");
const KILL1: &str = include_str!("../../../ras/proto/tests/fixtures/A_kill_plus1_status.txt");
const KILL66: &str = include_str!("../../../ras/proto/tests/fixtures/A_kill_plus66_status.txt");
const KILL68_JSON: &str = include_str!("../../../ras/proto/tests/fixtures/A_kill_plus68_json.txt");
const STATUS_JSON: &str = include_str!("../../../ras/proto/tests/fixtures/A_status_json.txt");
const SKEW: &str = include_str!("../../../ras/proto/tests/fixtures/C2_skew_ncclras.txt");

#[test]
fn nccl_text_after_a_kill_names_the_dead_process_and_its_rank() {
    let s = parse(KILL66).expect("parses");
    assert_eq!((s.source, s.server.as_str()), (Source::Text, "NCCL 2.28.9"));
    assert_eq!(s.totals, Some(Totals { nodes: 1, processes: 2, gpus: 2 }));
    assert_eq!(s.gather_secs, Some(0.0));
    assert_eq!(s.dead, vec![Proc { host: "192.0.2.2".into(), pid: 735, gpus: "1".into() }]);
    assert!(s.unresponsive.is_empty());
    assert_eq!(s.comms.len(), 1);
    let c = &s.comms[0];
    assert_eq!(
        (c.hash, c.label.as_deref(), c.size, c.verdict().as_str()),
        (0xc41c5eeb26d2a80c, Some("#0-0"), 2, "INCOMPLETE")
    );
    assert_eq!(c.ranks.len(), 1);
    assert_eq!((c.ranks[0].rank, c.ranks[0].state.as_str(), c.ranks[0].pid), (1, "DEAD", 735));
}

#[test]
fn nccl_text_one_second_after_a_kill_is_unresponsive_not_dead() {
    let s = parse(KILL1).expect("parses");
    assert!(s.dead.is_empty());
    assert_eq!(s.unresponsive.iter().map(|p| p.pid).collect::<Vec<_>>(), vec![735]);
    assert_eq!(s.comms[0].ranks[0].state, "UNRESPONSIVE");
}

#[test]
fn nccl_text_mismatch_puts_the_laggard_first() {
    let s = parse(SKEW).expect("parses");
    assert_eq!(s.comms.len(), 2);
    let bad = s.comms.iter().find(|c| c.mismatch).expect("a mismatched comm");
    assert_eq!((bad.hash, bad.label.as_deref()), (0xa3f00cfe77903ff2, Some("#0-0")));
    let order: Vec<(u32, Option<u64>)> = bad.laggards_first().iter().map(|r| (r.rank, r.launched)).collect();
    assert_eq!(order, vec![(1, Some(20002)), (0, Some(20003))]);
    assert_eq!(bad.lagging(), 1);
    let ok = s.comms.iter().find(|c| c.label.as_deref() == Some("#1-0")).expect("second comm");
    assert!(ok.healthy() && ok.ranks.is_empty());
    // Normal report: two ranks of one comm in a counter drift.
    let n = parse(NORMAL).expect("parses");
    assert_eq!(n.comms[0].laggards_first()[0].launched, Some(39422));
}

#[test]
fn nccl_228_json_with_its_missing_comma_parses() {
    assert!(serde_json::from_str::<serde_json::Value>(KILL68_JSON).is_err(), "the capture has NCCL 2.28's bug");
    let s = parse(KILL68_JSON).expect("repaired and parsed");
    assert_eq!((s.source, s.server.as_str()), (Source::Json, "NCCL 2.28.9"));
    assert_eq!(s.dead.iter().map(|p| p.pid).collect::<Vec<_>>(), vec![735]);
    let c = &s.comms[0];
    assert!(c.incomplete && !c.mismatch);
    assert_eq!(c.laggards_first()[0].state, "DEAD");
    // Valid JSON goes through the repair unchanged in meaning.
    let a: serde_json::Value = serde_json::from_str(STATUS_JSON).expect("valid");
    let b: serde_json::Value = serde_json::from_str(&repair_json(STATUS_JSON)).expect("still valid");
    assert_eq!(a, b);
    let s = parse(STATUS_JSON).expect("parses");
    assert_eq!(s.totals, Some(Totals { nodes: 1, processes: 2, gpus: 2 }));
    assert_eq!(s.comms[0].ranks[0].launched, Some(4732 + 1032 + 990 + 39443));
}

#[test]
fn garbage_is_an_error_not_a_panic() {
    assert!(parse("").is_err());
    assert!(parse("HTTP/1.1 400 Bad Request\r\n").is_err());
    assert!(parse("{ nope").is_err());
    // A truncated text report still yields what it had.
    let cut = &KILL66[..KILL66.find("Errors").expect("section")];
    assert!(parse(cut).expect("partial").dead.is_empty());
    for n in (0..KILL66.len()).step_by(7) {
        let _ = parse(&KILL66[..n]);
    }
}

/// occl's hung 3-rank job: rank 2 dead, rank 1 waiting on it in AllReduce #6, rank 0's AllReduce #6 failed.
fn occl_report() -> Report {
    let loc = |r: u32| RankRef {
        rank: r,
        loc: Some(RankLoc { cuda_dev: u32::MAX, nvml_dev: u32::MAX, pid: 100 + r, host: "127.0.0.1".into() }),
    };
    let comm = CommRef { group: 0, index: 0, hash: 0xfeed };
    let rd = |r: u32, launched: u64, completed: u64| RankData {
        rank: r,
        host: "127.0.0.1".into(),
        pid: 100 + r,
        cuda_dev: u32::MAX,
        nvml_dev: u32::MAX,
        init_state: 0,
        async_error: 0,
        finalize_called: false,
        destroy_flag: false,
        abort_flag: false,
        collective_counts: [0, 0, 0, 0, launched],
        occl_ops: Some(OpTotals { launched, completed, failed: u64::from(r == 0) }),
    };
    Report {
        version: VersionInfo {
            occl_version: "0.1.0".into(),
            nccl_compat_version: "2.28.9".into(),
            cuda_compiled: None,
            cuda_runtime: 0,
            cuda_driver: 0,
        },
        timestamp: "2026-11-22 05:00:00".into(),
        collection_time_sec: 0.004,
        timeouts_count: 0,
        summary: JobSummary {
            nodes: 1,
            processes_per_node: 3,
            gpus_per_process: 0,
            processes_total: 3,
            gpus_total: 0,
            spread: None,
        },
        groups: vec![CommGroupRow {
            comms_in_group: 1,
            nodes_per_comm: 1,
            ranks_per_node: (2, 2),
            ranks_per_comm: 3,
            ranks_in_group: 2,
            status: CommStatus::Running,
            errors: ErrorSet { incomplete: true, error: false, mismatch: false },
        }],
        errors: vec![
            ErrorEntry::Dead {
                processes: vec![ProcessRef {
                    pid: 102,
                    host: "127.0.0.1".into(),
                    cuda_devs: vec![],
                    nvml_devs: vec![],
                }],
                dead: 1,
                not_found: 0,
            },
            ErrorEntry::CommIncomplete { comm, missing: 1, ranks: vec![loc(2)] },
        ],
        warnings: vec![],
        stuck: vec![StuckOp {
            comm,
            rank: loc(1),
            operation: "AllReduce".into(),
            seq: 6,
            waited_ms: 3004,
            peer: Some(2),
            step: "recv step 0/1".into(),
        }],
        failed: vec![FailedOp {
            comm,
            rank: loc(0),
            operation: Some(("AllReduce".into(), 6)),
            ran_ms: 12,
            ago_ms: 1503,
            result: 6,
            error: "peer rank 2 (process 102): the connection was lost: it died".into(),
        }],
        comms: vec![CommData {
            hash: 0xfeed,
            secondary_hash: (1, 2),
            size: 3,
            ranks: vec![rd(0, 6, 5), rd(1, 6, 5)],
            missing_ranks: vec![MissingRankData {
                rank: 2,
                host: "127.0.0.1".into(),
                pid: 102,
                cuda_dev: u32::MAX,
                nvml_dev: u32::MAX,
                unresponsive: true,
                considered_dead: true,
            }],
        }],
    }
}

#[test]
fn occls_text_and_json_give_the_same_triage() {
    let r = occl_report();
    let t = parse(&render_text(&r)).expect("text");
    let j = parse(&render_json(&r)).expect("json");
    assert_eq!(t.server, "occl 0.1.0");
    assert_eq!(j.server, "occl 0.1.0");
    for s in [&t, &j] {
        assert_eq!(s.dead.iter().map(|p| p.pid).collect::<Vec<_>>(), vec![102], "{:?}", s.source);
        assert_eq!(s.stuck.len(), 1);
        let st = &s.stuck[0];
        assert_eq!(
            (st.comm, st.rank, st.operation.as_str(), st.seq, st.waited_ms, st.peer),
            (0xfeed, 1, "AllReduce", 6, 3004, Some(2))
        );
        assert_eq!(st.step, "recv step 0/1");
        let f = &s.failed[..];
        assert_eq!(f.len(), 1, "{:?}", s.source);
        assert_eq!(
            (f[0].comm, f[0].rank, f[0].operation.clone(), f[0].ago_ms, f[0].error.as_str()),
            (
                0xfeed,
                0,
                Some(("AllReduce".into(), 6)),
                1503,
                "peer rank 2 (process 102): the connection was lost: it died"
            ),
            "{:?}",
            s.source
        );
        let c = &s.comms[0];
        assert!(c.incomplete, "{:?}", s.source);
        assert_eq!(c.laggards_first()[0].rank, 2);
        assert_eq!(c.laggards_first()[0].state, "DEAD");
    }
    // JSON has occl's completed counts for the bars.
    assert_eq!(j.comms[0].ranks[0].completed, Some(5));
    // The event log sees the death and the stuck operation appear.
    let mut before = j.clone();
    before.dead.clear();
    before.stuck.clear();
    before.failed.clear();
    let changes = j.changes_since(&before);
    assert!(changes.iter().any(|c| c.starts_with("FAILED: rank 0 in AllReduce #6")), "{changes:?}");
    assert!(changes.iter().any(|c| c.starts_with("DEAD: process 102")), "{changes:?}");
    assert!(changes.iter().any(|c| c.starts_with("STUCK: rank 1 in AllReduce #6")), "{changes:?}");
}
