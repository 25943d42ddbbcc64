//! The captures rebuilt from synthetic gathers: `render_text(analyze(..))` must equal NCCL 2.28.9's report byte for
//! byte apart from the version line. Then what the captures do not show: NOCOMM, ERROR, TIMEOUT, the outlier rule,
//! grouping of many communicators, uneven jobs, occl's stuck operations, and hostile records.

use super::*;
use crate::mesh::{PeerAddr, RequestId};
use crate::record::{step_state, CollType, Failure, InFlight, LiveSnapshot, RankInfo, RankRecord, ResultCode};
use crate::report::tests::{assert_matches_capture, json_of, version};
use crate::report::{
    render_json, render_text, CommRef, CommStatus, ErrorEntry, RankLoc, RankRef, StuckOp, WarningEntry,
};
use crate::wire::ProcessStatus;

const HOST: &str = "192.0.2.2";
/// The world communicator of the A captures.
const A_COMM: CommId =
    CommId { hash: 0xc41c5eeb26d2a80c, root_host_hash: 0xf03379eb66b7fbc8, root_pid_hash: 0x4e62fe4ddc7d9b10 };
const NOW: u64 = 1_800_000_000_000_000_000;
const SEC: u64 = 1_000_000_000;

fn comm(hash: u64) -> CommId {
    CommId { hash, root_host_hash: 0xf03379eb66b7fbc8, root_pid_hash: hash.rotate_left(7) }
}

/// A process of the job. `port` orders the peer table.
fn peer(host: &str, port: u16, pid: u32, devs: &[u32]) -> PeerAddr {
    PeerAddr {
        addr: format!("{host}:{port}"),
        host: host.into(),
        pid,
        cuda_devs: devs.to_vec(),
        nvml_devs: devs.to_vec(),
    }
}

/// `n` one-GPU processes on one node, pids from `pid0`, GPU i in process i.
fn one_node(n: u32, pid0: u32) -> PeerTable {
    PeerTable::new((0..n).map(|i| peer(HOST, 40000 + i as u16, pid0 + i, &[i])).collect()).unwrap()
}

/// Broadcast, Reduce, AllGather, ReduceScatter, AllReduce launched (and completed).
fn counts(c: [u64; 5]) -> LiveSnapshot {
    let mut launched = [0; CollType::COUNT];
    launched[..5].copy_from_slice(&c);
    LiveSnapshot { launched, completed: launched, init_state: 0, ..LiveSnapshot::default() }
}

/// As [`counts`], with no completions: what NCCL's own records, which carry launch counters only, tell.
fn launched_only(c: [u64; 5]) -> LiveSnapshot {
    LiveSnapshot { completed: [0; CollType::COUNT], ..counts(c) }
}

/// A rank record living in `table`'s process `peer`, on its first GPU.
fn rec(table: &PeerTable, peer: u32, id: CommId, size: u32, rank: u32, live: LiveSnapshot) -> RankRecord {
    let p = table.get(PeerId(peer)).unwrap();
    let dev = p.cuda_devs.first().copied();
    let info = RankInfo { comm: id, size, rank, pid: p.pid, host: p.host.clone(), cuda_dev: dev, nvml_dev: dev };
    RankRecord { info, live }
}

fn answer(table: &PeerTable, peer: u32, records: Vec<RankRecord>) -> ProcessStatus {
    let p = table.get(PeerId(peer)).unwrap();
    ProcessStatus {
        peer: PeerId(peer),
        addr: p.addr.clone(),
        host: p.host.clone(),
        pid: p.pid,
        epoch: 0,
        records,
        dead: vec![],
        unresponsive: vec![],
    }
}

fn gather(statuses: Vec<ProcessStatus>, missing: &[u32], dead: &[u32]) -> GatherResult {
    let ids = |v: &[u32]| v.iter().map(|&p| PeerId(p)).collect::<Vec<_>>();
    GatherResult {
        token: 0,
        id: RequestId { origin: PeerId(0), seq: 1 },
        statuses,
        missing: ids(missing),
        dead: ids(dead),
        unresponsive: missing.iter().filter(|p| !dead.contains(p)).map(|&p| PeerId(p)).collect(),
        leg_timeouts: 0,
        started: 5 * SEC,
        finished: 5 * SEC,
    }
}

/// What the answering process knows of a communicator: rank r lives in process `owners[r]`, on its first GPU.
fn known(table: &PeerTable, id: CommId, owners: &[u32]) -> KnownComm {
    let members = owners
        .iter()
        .enumerate()
        .map(|(r, &p)| {
            let dev = table.get(PeerId(p)).and_then(|a| a.cuda_devs.first().copied());
            KnownRank { rank: r as u32, peer: PeerId(p), cuda_dev: dev, nvml_dev: dev }
        })
        .collect();
    KnownComm { id, size: owners.len() as u32, members }
}

struct Case<'a> {
    gather: &'a GatherResult,
    peers: &'a PeerTable,
    known: &'a [KnownComm],
    verbose: bool,
}

/// Analyses, and checks what must hold for every report: valid JSON, the same communicators in the table and the
/// dump, and rows that cover every communicator exactly once.
fn run(c: Case) -> Report {
    let version = version();
    let input = AnalysisInput {
        gather: c.gather,
        peers: c.peers,
        known: c.known,
        version: &version,
        now_ns: NOW,
        timestamp: "2026-11-21 22:26:56",
        verbose: c.verbose,
        stuck: StuckPolicy::default(),
    };
    let r = analyze(&input);
    let json: serde_json::Value = serde_json::from_str(&render_json(&r)).expect("valid JSON");
    assert_eq!(json["communicators_count"], r.comms.len());
    assert_eq!(r.groups.iter().map(|g| g.comms_in_group as usize).sum::<usize>(), r.comms.len());
    assert_eq!(analyze(&input), r, "deterministic");
    r
}

fn simple(gather: &GatherResult, peers: &PeerTable, known: &[KnownComm]) -> Report {
    run(Case { gather, peers, known, verbose: false })
}

/// The A captures' job while a benchmark runs: ranks 0 and 1 (pids 734, 735) with these AllReduce counts, each with
/// an operation that started 200 µs ago (a busy job, not a stuck one). NCCL's records say nothing of completions,
/// so nothing proves that the counts, two apart, are only read a moment apart: NCCL's MISMATCH stands.
fn a_running(ar0: u64, ar1: u64) -> (PeerTable, GatherResult, Vec<KnownComm>) {
    let t = one_node(2, 734);
    let busy = |ar: u64| {
        let mut l = launched_only([4732, 0, 1032, 990, ar]);
        l.in_flight = Some(InFlight {
            seq: 1,
            coll: CollType::AllReduce,
            coll_seq: ar,
            bytes: 1024,
            start_ns: NOW - 200_000,
            peer: None,
            step_state: None,
        });
        l
    };
    let g = gather(
        vec![
            answer(&t, 0, vec![rec(&t, 0, A_COMM, 2, 0, busy(ar0))]),
            answer(&t, 1, vec![rec(&t, 1, A_COMM, 2, 1, busy(ar1))]),
        ],
        &[],
        &[],
    );
    let k = vec![known(&t, A_COMM, &[0, 1])];
    (t, g, k)
}

#[test]
fn status_normal_matches_capture() {
    let (t, g, k) = a_running(39422, 39424);
    let r = simple(&g, &t, &k);
    assert!(r.stuck.is_empty(), "counter drift under load is not a stuck operation");
    assert_matches_capture(&render_text(&r), include_str!("../../tests/fixtures/A_status_normal.txt"));
}

#[test]
fn status_verbose_matches_capture() {
    let (t, g, k) = a_running(39435, 39436);
    let r = run(Case { gather: &g, peers: &t, known: &k, verbose: true });
    assert_matches_capture(&render_text(&r), include_str!("../../tests/fixtures/A_status_verbose.txt"));
}

#[test]
fn two_comm_skew_matches_capture() {
    // The C2 job: the world communicator and a second one where rank 0 ran one more AllReduce.
    let t = one_node(2, 566);
    let (skewed, even) = (comm(0xa3f00cfe77903ff2), comm(0x1f82000200000001));
    let records = |peer: u32, ar: u64| {
        vec![
            rec(&t, peer, even, 2, peer, counts([1, 0, 2, 0, 7])),
            rec(&t, peer, skewed, 2, peer, launched_only([0, 0, 0, 0, ar])),
        ]
    };
    let g = gather(vec![answer(&t, 0, records(0, 20003)), answer(&t, 1, records(1, 20002))], &[], &[]);
    let r = simple(&g, &t, &[]);
    assert_matches_capture(&render_text(&r), include_str!("../../tests/fixtures/C2_skew_ncclras.txt"));
}

/// Rank 1 (pid 735) was SIGKILLed: only rank 0 answers; `dead` once the mesh declared it so.
fn a_killed(dead: bool) -> (PeerTable, GatherResult, Vec<KnownComm>) {
    let t = one_node(2, 734);
    let r0 = rec(&t, 0, A_COMM, 2, 0, counts([6930, 0, 1032, 990, 61419]));
    let g = gather(vec![answer(&t, 0, vec![r0])], &[1], if dead { &[1] } else { &[] });
    let k = vec![known(&t, A_COMM, &[0, 1])];
    (t, g, k)
}

#[test]
fn kill_plus1_matches_capture() {
    let (t, g, k) = a_killed(false);
    let r = simple(&g, &t, &k);
    assert_matches_capture(&render_text(&r), include_str!("../../tests/fixtures/A_kill_plus1_status.txt"));
    assert!(!r.comms[0].missing_ranks[0].considered_dead);
}

#[test]
fn kill_plus66_matches_capture() {
    let (t, g, k) = a_killed(true);
    let r = simple(&g, &t, &k);
    assert_matches_capture(&render_text(&r), include_str!("../../tests/fixtures/A_kill_plus66_status.txt"));
}

#[test]
fn json_matches_status_capture() {
    let t = one_node(2, 734);
    let c = [4732, 0, 1032, 990, 39443];
    let g = gather(
        vec![
            answer(&t, 0, vec![rec(&t, 0, A_COMM, 2, 0, counts(c))]),
            answer(&t, 1, vec![rec(&t, 1, A_COMM, 2, 1, counts(c))]),
        ],
        &[],
        &[],
    );
    let r = simple(&g, &t, &[]);
    let want: serde_json::Value = serde_json::from_str(include_str!("../../tests/fixtures/A_status_json.txt")).unwrap();
    assert_eq!(json_of(&r), want);
}

#[test]
fn json_matches_kill_capture_with_the_comma_fixed() {
    let (t, g, k) = a_killed(true);
    let mut r = simple(&g, &t, &k);
    r.timestamp = "2026-11-21 22:28:06".into();
    let raw = include_str!("../../tests/fixtures/A_kill_plus68_json.txt");
    // NCCL 2.28 leaves out the comma after "nvml_dev" in missing_ranks[]; 2.29 and occl put it in.
    let fixed = raw.replace("\"nvml_dev\": 1\n          \"status\"", "\"nvml_dev\": 1,\n          \"status\"");
    let want: serde_json::Value = serde_json::from_str(&fixed).unwrap();
    assert_eq!(json_of(&r), want);
}

#[test]
fn destroyed_sub_communicator_is_nocomm() {
    // §4.5/§5.4: rank 1 destroyed a split communicator that rank 0 still has; both processes answer.
    let t = one_node(2, 734);
    let sub = comm(0x0123456789abcdef);
    let c = counts([0, 0, 0, 0, 5]);
    let g = gather(
        vec![
            answer(&t, 0, vec![rec(&t, 0, A_COMM, 2, 0, c.clone()), rec(&t, 0, sub, 2, 0, c.clone())]),
            answer(&t, 1, vec![rec(&t, 1, A_COMM, 2, 1, c.clone())]),
        ],
        &[],
        &[],
    );
    let r = simple(&g, &t, &[known(&t, A_COMM, &[0, 1]), known(&t, sub, &[0, 1])]);
    let text = render_text(&r);
    assert!(text.contains(
        "    0         1         1         1         2         1   RUNNING  MISMATCH\n    1         1         1         2         \
         2         2   RUNNING      OK\n\nErrors\n======\n\nWarnings\n========\n\n#0-0 (0123456789abcdef) MISMATCH\n  \
         Communicator ranks have different status\n  Rank 0 has status RUNNING -- GPU 0 managed by process 734 on node \
         192.0.2.2\n  Rank 1 has status NOCOMM -- GPU 1 managed by process 735 on node 192.0.2.2\n"
    ));
    assert!(text.ends_with("on node 192.0.2.2\n"), "no blank line after a status block, as NCCL");
    let missing = &r.comms.iter().find(|c| c.hash == sub.hash).unwrap().missing_ranks[0];
    assert!(!missing.unresponsive && !missing.considered_dead);

    // The same without knowing where rank 1 lives: still NOCOMM (everyone answered), location unknown.
    let r = simple(&g, &t, &[]);
    assert!(render_text(&r).ends_with("  Rank 1 has status NOCOMM -- [process information not found]\n"));
}

#[test]
fn errors_and_timeouts() {
    let t = one_node(4, 100);
    let id = comm(0xe);
    let bad = |peer: u32, init: i32, async_: i32| {
        let mut l = counts([0; 5]);
        (l.init_state, l.async_error) = (init, async_);
        rec(&t, peer, id, 4, peer, l)
    };
    let remote = ResultCode::RemoteError.code();
    let g = GatherResult {
        leg_timeouts: 2,
        ..gather(
            vec![
                answer(&t, 0, vec![bad(0, 0, remote)]),
                answer(&t, 1, vec![bad(1, 0, remote)]),
                answer(&t, 2, vec![bad(2, ResultCode::SystemError.code(), 0)]),
                answer(&t, 3, vec![bad(3, 0, 99)]),
            ],
            &[],
            &[],
        )
    };
    let text = render_text(&simple(&g, &t, &[]));
    // Rank 2's failed init is also a status mismatch (INIT among RUNNING), as in NCCL.
    assert!(text.contains("    0         1         1         4         4         4   RUNNING  ERROR,MISMATCH\n"));
    assert!(text.contains(
        "#0-0 (000000000000000e) ERROR\n  Initialization error on 1 rank\n  Rank 2 reported System error -- GPU 2 \
         managed by process 102 on node 192.0.2.2\n  Asynchronous errors on 3 ranks\n  2 ranks reported Remote process \
         error\n  Rank 0 -- GPU 0 managed by process 100 on node 192.0.2.2\n  Rank 1 -- GPU 1 managed by process 101 on \
         node 192.0.2.2\n  Rank 3 reported Unexpected error -- GPU 3 managed by process 103 on node 192.0.2.2\n\n\
         Warnings\n========\n\nTIMEOUT\n  Encountered 2 communication timeouts while gathering communicator data\n\n\
         #0-0 (000000000000000e) MISMATCH\n  Communicator ranks have different status\n  3 ranks have status RUNNING\n  \
         Rank 2 has status INIT -- GPU 2 managed by process 102 on node 192.0.2.2\n"
    ));
}

#[test]
fn three_ranks_one_allreduce_behind() {
    // Ranks 0 and 1 finished AllReduce 10 and wait in 11 for rank 2, which is still in 10 waiting to receive from 1.
    let t = one_node(3, 100);
    let id = comm(0xabc);
    let live = |done: u64, waited_s: u64, peer: u32, state: u32| {
        let mut l = counts([0, 0, 0, 0, done]);
        l.launched[CollType::AllReduce as usize] = done + 1;
        l.launched[CollType::Send as usize] = 3;
        l.completed[CollType::Send as usize] = 3;
        l.in_flight = Some(InFlight {
            seq: done + 4,
            coll: CollType::AllReduce,
            coll_seq: done + 1,
            bytes: 1 << 20,
            start_ns: NOW - waited_s * SEC - 250_000_000,
            peer: Some(peer),
            step_state: Some(state),
        });
        l
    };
    let g = gather(
        vec![
            answer(&t, 0, vec![rec(&t, 0, id, 3, 0, live(10, 5, 2, step_state::SEND_WAIT))]),
            answer(&t, 1, vec![rec(&t, 1, id, 3, 1, live(10, 5, 2, step_state::SEND_WAIT))]),
            answer(&t, 2, vec![rec(&t, 2, id, 3, 2, live(9, 6, 1, step_state::RECV_WAIT))]),
        ],
        &[],
        &[],
    );
    let r = simple(&g, &t, &[]);
    let rank =
        |r: u32| RankRef { rank: r, loc: Some(RankLoc { cuda_dev: r, nvml_dev: r, pid: 100 + r, host: HOST.into() }) };
    let cref = CommRef { group: 0, index: 0, hash: 0xabc };
    assert_eq!(
        r.stuck[0],
        StuckOp {
            comm: cref,
            rank: rank(2),
            operation: "AllReduce".into(),
            seq: 10,
            waited_ms: 6250,
            peer: Some(1),
            step: "RecvWait".into(),
        }
    );
    assert_eq!(r.stuck.iter().map(|s| (s.rank.rank, s.seq)).collect::<Vec<_>>(), [(2, 10), (0, 11), (1, 11)]);
    let text = render_text(&r);
    // NCCL's warning names the lagging rank (a group of one is always listed); the two ahead are a majority.
    assert!(text.contains(
        "#0-0 (0000000000000abc) MISMATCH\n  Communicator ranks have different AllReduce operation counts\n  2 ranks have \
         launched up to operation 11\n  Rank 2 has launched up to operation 10 -- GPU 2 managed by process 102 on node \
         192.0.2.2\n\nStuck operations (occl)\n=======================\n\n#0-0 (0000000000000abc) STUCK\n  Rank 2 in \
         AllReduce operation 10 for 6.250s, waiting on rank 1 (RecvWait) -- GPU 2 managed by process 102 on \
         node 192.0.2.2\n\n"
    ));
    let json = json_of(&r);
    assert_eq!(json["stuck_operations"][0]["rank"], 2);
    assert_eq!(json["stuck_operations"][0]["step"], "RecvWait");

    // A stricter policy lists nothing; a lax one also lists operations that just started.
    let version = version();
    let mut input = AnalysisInput {
        gather: &g,
        peers: &t,
        known: &[],
        version: &version,
        now_ns: NOW,
        timestamp: "",
        verbose: false,
        stuck: StuckPolicy { min_wait_ns: 7 * SEC },
    };
    assert!(analyze(&input).stuck.is_empty());
    input.stuck.min_wait_ns = 0;
    input.now_ns = 0; // clocks that disagree give 0 ms, not a panic
    assert!(analyze(&input).stuck.iter().all(|s| s.waited_ms == 0));
}

#[test]
fn failed_operations_are_reported_failed_with_their_error_not_stuck() {
    // Three ranks failed their 6th all-reduce: rank 1 first (the mismatch it caused), ranks 0 and 2 after it.
    let t = one_node(3, 100);
    let id = comm(0xabc);
    let op = |start_ns| InFlight {
        seq: 6,
        coll: CollType::AllReduce,
        coll_seq: 6,
        bytes: 64,
        start_ns,
        peer: Some(1),
        step_state: Some(step_state::RECV_WAIT),
    };
    let failed = |at_ns, result: ResultCode, error: &str| {
        let mut l = counts([0, 0, 0, 0, 5]);
        l.launched[CollType::AllReduce as usize] = 6;
        l.failed = 1;
        l.async_error = result.code();
        l.last_failure =
            Some(Failure { op: Some(op(NOW - 10 * SEC)), at_ns, result: result.code(), error: error.into() });
        l
    };
    let mut slow = failed(NOW - 9 * SEC, ResultCode::RemoteError, "peer rank 1 failed");
    // Read at the instant it failed: still in flight as well. It is failed, not stuck.
    slow.in_flight = Some(op(NOW - 10 * SEC));
    let g = gather(
        vec![
            answer(
                &t,
                0,
                vec![rec(&t, 0, id, 3, 0, failed(NOW - 9 * SEC, ResultCode::RemoteError, "peer rank 1 failed"))],
            ),
            answer(
                &t,
                1,
                vec![rec(
                    &t,
                    1,
                    id,
                    3,
                    1,
                    failed(NOW - 9500 * 1_000_000, ResultCode::InvalidUsage, "operation mismatch"),
                )],
            ),
            answer(&t, 2, vec![rec(&t, 2, id, 3, 2, slow)]),
        ],
        &[],
        &[],
    );
    let r = simple(&g, &t, &[]);
    assert!(r.stuck.is_empty(), "{:?}", r.stuck);
    assert_eq!(r.failed.iter().map(|f| f.rank.rank).collect::<Vec<_>>(), [1, 0, 2], "earliest failure first");
    let first = &r.failed[0];
    assert_eq!(
        (first.operation.clone(), first.ran_ms, first.ago_ms, first.result, first.error.as_str()),
        (Some(("AllReduce".into(), 6)), 500, 9500, 5, "operation mismatch")
    );
    let text = render_text(&r);
    assert!(!text.contains("Stuck operations"), "{text}");
    assert!(
        text.contains(
            "Failed operations (occl)\n========================\n\n#0-0 (0000000000000abc) FAILED\n  Rank 1 in AllReduce \
             operation 6 failed after 0.500s, 9.500s ago -- GPU 1 managed by process 101 on node 192.0.2.2\n  \
             operation mismatch\n\n"
        ),
        "{text}"
    );
    // The async errors still make NCCL's ERROR entry.
    assert!(text.contains("ERROR"), "{text}");
    let json = json_of(&r);
    assert!(json.get("stuck_operations").is_none(), "{json}");
    let f = &json["failed_operations"][0];
    assert_eq!((f["rank"].as_u64(), f["operation"].as_str(), f["seq"].as_u64()), (Some(1), Some("AllReduce"), Some(6)));
    assert_eq!(
        (f["result"].as_i64(), f["error"].as_str(), f["ran_ms"].as_u64()),
        (Some(5), Some("operation mismatch"), Some(500))
    );
    let full: serde_json::Value = serde_json::from_str(&render_json(&r)).expect("valid JSON");
    let ops = &full["communicators"][0]["ranks"][0]["occl_operations"];
    assert_eq!(
        (ops["launched"].as_u64(), ops["completed"].as_u64(), ops["failed"].as_u64()),
        (Some(6), Some(5), Some(1))
    );
}

#[test]
fn dead_and_unresponsive_are_told_apart() {
    // Four processes: 2 answers, 3 is silent (INCOMPLETE), 1 is dead (DEAD); a missing id outside the table too.
    let t = one_node(4, 200);
    let id = comm(0x77);
    let c = counts([1, 0, 0, 0, 3]);
    let mut g = gather(
        vec![
            answer(&t, 0, vec![rec(&t, 0, id, 4, 0, c.clone())]),
            answer(&t, 2, vec![rec(&t, 2, id, 4, 2, c.clone())]),
        ],
        &[1, 3, 9],
        &[1],
    );
    g.statuses.push(answer(&t, 0, vec![])); // a second answer from one process is ignored
    let r = simple(&g, &t, &[known(&t, id, &[0, 1, 2, 3])]);
    let text = render_text(&r);
    assert!(text.contains("    0         1         1         2         4         2   RUNNING  INCOMPLETE\n"));
    assert!(text.contains(
        "INCOMPLETE\n  Missing communicator data from 2 job processes\n  Process 203 on node 192.0.2.2 managing GPU 3\n  \
         [could not find information on 1 process]\n\nDEAD\n  1 job process is considered dead (unreachable via the \
         RAS network)\n  Process 201 on node 192.0.2.2 managing GPU 1\n\n#0-0 (0000000000000077) INCOMPLETE\n  Missing \
         communicator data from 2 ranks\n  Rank 1 -- GPU 1 managed by process 201 on node 192.0.2.2\n  Rank 3 -- GPU 3 \
         managed by process 203 on node 192.0.2.2\n\nWarnings"
    ));
    let m = &r.comms[0].missing_ranks;
    assert_eq!((m[0].rank, m[0].unresponsive, m[0].considered_dead), (1, true, true));
    assert_eq!((m[1].rank, m[1].unresponsive, m[1].considered_dead), (3, true, false));
}

/// `ranks` ranks spread over two nodes, rank i in process i; rank 0's node gets the first `on_first` processes.
fn two_nodes(ranks: u32, on_first: u32) -> PeerTable {
    PeerTable::new(
        (0..ranks)
            .map(|i| {
                let host = if i < on_first { "192.0.2.2" } else { "192.0.2.3" };
                peer(host, 40000 + i as u16, 300 + i, &[i % on_first.max(1)])
            })
            .collect(),
    )
    .unwrap()
}

#[test]
fn many_communicators_group_as_nccl() {
    // 8 processes, 4 per node: the world comm, two node-local comms, four cross-node pairs (one skewed), and two
    // comms of 4 spread 2+2 and 1+3 (the group's "Ranks per node" becomes 1-3).
    let t = two_nodes(8, 4);
    let c = counts([0, 0, 0, 0, 1]);
    let mut per_process: Vec<Vec<RankRecord>> = vec![vec![]; 8];
    let mut add = |id: CommId, members: &[u32], skew: Option<u32>| {
        for (rank, &p) in members.iter().enumerate() {
            let mut l = c.clone();
            if skew == Some(rank as u32) {
                l.launched[CollType::AllReduce as usize] += 1;
            }
            per_process[p as usize].push(rec(&t, p, id, members.len() as u32, rank as u32, l));
        }
    };
    add(comm(0x100), &[0, 1, 2, 3, 4, 5, 6, 7], None);
    add(comm(0x200), &[0, 1, 2, 3], None);
    add(comm(0x201), &[4, 5, 6, 7], None);
    for (i, pair) in [[0, 4], [1, 5], [2, 6], [3, 7]].iter().enumerate() {
        add(comm(0x300 + i as u64), pair, (i == 2).then_some(1));
    }
    add(comm(0x400), &[0, 1, 4, 5], None);
    add(comm(0x401), &[3, 5, 6, 7], None);
    let statuses = per_process.into_iter().enumerate().map(|(p, recs)| answer(&t, p as u32, recs)).collect();
    let r = simple(&gather(statuses, &[], &[]), &t, &[]);
    let text = render_text(&r);
    assert!(text.contains(
        "  Nodes  Processes         GPUs  Processes     GPUs\n(total)   per node  per process    (total)  (total)\n      \
         2          4            1          8        8\n"
    ));
    assert!(text.contains(
        "    #  in group  per comm  per node  per comm  in group\n    0         1         2         4         8         \
         8   RUNNING      OK\n    1         2         2       1-3         4         7   RUNNING      OK\n    2         2         \
         1         4         4         8   RUNNING      OK\n    3         1         2         1         2         2   \
         RUNNING  MISMATCH\n    4         3         2         1         2         6   RUNNING      OK\n"
    ));
    // The skewed pair is #3-0; the other pairs keep commId order within their group.
    assert!(text.contains("#3-0 (0000000000000302) MISMATCH\n"));
}

#[test]
fn outlier_rule_hides_large_groups_unless_verbose() {
    // 16 ranks, 5 of them one Broadcast behind: more than a quarter, so NCCL hides them unless verbose (< half).
    let t = one_node(16, 500);
    let id = comm(0x16);
    let statuses = (0..16)
        .map(|p| answer(&t, p, vec![rec(&t, p, id, 16, p, counts([if p % 3 == 1 { 4 } else { 5 }, 0, 0, 0, 0]))]))
        .collect();
    let g = gather(statuses, &[], &[]);
    let plain = render_text(&simple(&g, &t, &[]));
    assert!(plain.ends_with(
        "Communicator ranks have different Broadcast operation counts\n  11 ranks have launched up to operation 5\n  5 \
         ranks have launched up to operation 4\n\n"
    ));
    let verbose = render_text(&run(Case { gather: &g, peers: &t, known: &[], verbose: true }));
    assert!(verbose.contains(
        "  5 ranks have launched up to operation 4\n  Rank 1 -- GPU 1 managed by process 501 on node 192.0.2.2\n  Rank 4 \
         --"
    ));
    assert!(verbose.ends_with("  Rank 13 -- GPU 13 managed by process 513 on node 192.0.2.2\n\n"));
}

#[test]
fn uneven_jobs_get_nccl_spread_tables() {
    // Three processes on 192.0.2.2 and one on .3, one GPU each: one table by processes per node, plus the outlier.
    let t = two_nodes(4, 3);
    let r = simple(&gather(vec![], &[], &[]), &t, &[]);
    let want = [
        "Job summary",
        "===========",
        "",
        "  Nodes  Processes         GPUs",
        "          per node  per process",
        "      1          3            1",
        "      1          1            1",
        "",
        "  Nodes  Processes         GPUs",
        "(total)    (total)      (total)",
        "      2          4            4",
        "",
        "The outlier node:",
        "  Node 192.0.2.3 running process 303",
        "",
        "Communicators...",
    ];
    assert!(render_text(&r).contains(&want.join("\n")));

    // A host-only process next to GPU ones: processes per node and GPUs per process are tabled apart.
    let mixed = PeerTable::new(vec![
        peer(HOST, 1, 10, &[0, 1]),
        peer(HOST, 2, 11, &[]),
        peer("192.0.2.3", 1, 12, &[0, 1]),
        peer("192.0.2.3", 2, 13, &[2, 3]),
    ])
    .unwrap();
    let r = simple(&gather(vec![], &[], &[0, 1, 2, 3]), &mixed, &[]);
    let text = render_text(&r);
    let want = [
        "  Nodes  Processes",
        "          per node",
        "      2          2",
        "",
        "         Processes         GPUs",
        "                    per process",
        "                 3            2",
        "                 1            0",
        "",
        "  Nodes  Processes         GPUs",
        "(total)    (total)      (total)",
        "      2          4            6",
        "",
        "Communicators...",
    ];
    assert!(text.contains(&want.join("\n")));
    assert!(text.contains("  Process 11 on node 192.0.2.2 (host memory, no GPU)\n"), "a process without a GPU");
}

#[test]
fn empty_gather_has_no_communicators() {
    let t = one_node(1, 1);
    let r = simple(&gather(vec![answer(&t, 0, vec![])], &[], &[]), &t, &[]);
    let text = render_text(&r);
    assert!(
        text.contains("=============\n\nNo communicator data collected!\n\nErrors\n======\n\nWarnings\n========\n\n")
    );
    assert!(text.ends_with("Warnings\n========\n\n"));
    assert!(r.comms.is_empty() && r.errors.is_empty() && r.warnings.is_empty() && r.stuck.is_empty());
}

#[test]
fn a_known_communicator_nobody_reported_still_shows() {
    // The answering process's own record is not in the gather; its peer is dead.
    let t = one_node(2, 734);
    let g = gather(vec![answer(&t, 0, vec![])], &[1], &[1]);
    let r = simple(&g, &t, &[known(&t, A_COMM, &[0, 1])]);
    assert_eq!(r.comms.len(), 1);
    assert_eq!(r.comms[0].missing_ranks.len(), 2);
    let text = render_text(&r);
    assert!(text.contains("    0         1         0         0         2         0    NOCOMM  INCOMPLETE,MISMATCH\n"));
    assert!(
        text.contains("#0-0 (c41c5eeb26d2a80c) INCOMPLETE\n  Missing communicator data from 1 rank\n  Rank 1 -- GPU 1")
    );
}

#[test]
fn hostile_records_neither_panic_nor_disagree() {
    let t = one_node(2, 900);
    let id = comm(0xbad);
    let odd = |rank: u32, size: u32| rec(&t, 0, id, size, rank, counts([0, 0, 0, 0, u64::MAX]));
    let mut host_only =
        rec(&t, 1, comm(0xc0), 3, 0, LiveSnapshot { init_state: -5, async_error: i32::MIN, ..counts([0; 5]) });
    host_only.info.cuda_dev = None;
    host_only.info.nvml_dev = None;
    let mut second_host_only = host_only.clone();
    second_host_only.info.rank = 1;
    let mut stranger = answer(&t, 1, vec![odd(0, 1)]);
    stranger.peer = PeerId(77); // not in the table
    let g = gather(
        vec![
            answer(&t, 0, vec![odd(0, 2), odd(0, 3), odd(9, 2), odd(u32::MAX, 0), odd(1, 5000)]),
            answer(&t, 1, vec![host_only, second_host_only, rec(&t, 1, id, 2, 0, counts([1; 5]))]),
            stranger,
        ],
        &[1, 4242],
        &[4242],
    );
    let weird_known = KnownComm {
        id,
        size: u32::MAX,
        members: vec![KnownRank { rank: 3, peer: PeerId(12345), cuda_dev: None, nvml_dev: Some(7) }],
    };
    let r = simple(&g, &t, &[weird_known, KnownComm { id: comm(0xe0), size: 0, members: vec![] }]);
    let bad = r.comms.iter().find(|c| c.hash == 0xbad).unwrap();
    assert_eq!(bad.size, 5000, "the largest claimed size");
    // First report of rank 0 wins; ranks outside the size still count as reported, as in the JSON dump.
    assert_eq!(bad.ranks.iter().map(|r| r.rank).collect::<Vec<_>>(), [0, 1, 9, u32::MAX]);
    assert_eq!(bad.ranks[0].collective_counts[4], u64::MAX);
    assert_eq!(bad.missing_ranks.len(), 4997);
    // A member the peer table does not know: described as NCCL describes one.
    let m3 = &bad.missing_ranks[1];
    assert_eq!((m3.rank, m3.host.as_str(), m3.pid, m3.nvml_dev, m3.unresponsive), (3, "unknown", 0, 7, true));
    let text = render_text(&r);
    assert!(text.contains("    0         1         1         4      5000         1   RUNNING  INCOMPLETE\n"));
    // The two host-only ranks of one process count as two ranks of the group; their odd codes are "Unexpected".
    assert!(text.contains("    1         1         1         2         3         2      INIT  INCOMPLETE,ERROR\n"));
    assert!(text.contains("  Rank 2 -- [process information not found]\n"));
    assert!(text.contains("Initialization errors on 2 ranks\n  2 ranks reported Unexpected error\n"));
    assert!(
        text.contains("DEAD\n  1 job process is considered dead (unreachable via the RAS network)\n  [could not find")
    );
}

#[test]
fn every_status_and_the_error_order() {
    // Each status alone, so the table shows them worst first.
    let t = one_node(1, 1);
    let with = |f: fn(&mut LiveSnapshot)| {
        let mut l = counts([0; 5]);
        f(&mut l);
        l
    };
    let lives = [
        with(|l| l.abort_flag = true),
        with(|l| l.destroy_flag = true),
        with(|l| l.finalize_called = true),
        with(|_| ()),
        with(|l| l.init_state = ResultCode::InProgress.code()),
    ];
    let recs = lives.into_iter().enumerate().map(|(i, l)| rec(&t, 0, comm(i as u64 + 1), 1, 0, l)).collect();
    let r = simple(&gather(vec![answer(&t, 0, recs)], &[], &[]), &t, &[]);
    let statuses: Vec<_> = r.groups.iter().map(|g| (g.status, g.comms_in_group)).collect();
    assert_eq!(
        statuses,
        [(CommStatus::Abort, 1), (CommStatus::Finalize, 2), (CommStatus::Running, 1), (CommStatus::Init, 1)]
    );
    assert!(r.errors.is_empty() && r.warnings.is_empty());
    assert!(!matches!(r.errors.first(), Some(ErrorEntry::Dead { .. })));
    assert!(!matches!(r.warnings.first(), Some(WarningEntry::Timeout { .. })));
}

/// A two-rank communicator in which rank 1 has `l1` and rank 0 `l0`, judged at `now`.
fn two_ranks_at(l0: LiveSnapshot, l1: LiveSnapshot, now: u64) -> Report {
    let t = one_node(2, 100);
    let id = comm(0x2a);
    let g = gather(
        vec![answer(&t, 0, vec![rec(&t, 0, id, 2, 0, l0)]), answer(&t, 1, vec![rec(&t, 1, id, 2, 1, l1)])],
        &[],
        &[],
    );
    let version = version();
    analyze(&AnalysisInput {
        gather: &g,
        peers: &t,
        known: &[],
        version: &version,
        now_ns: now,
        timestamp: "",
        verbose: false,
        stuck: StuckPolicy::default(),
    })
}

fn mismatched(r: &Report) -> bool {
    r.warnings.iter().any(|w| matches!(w, WarningEntry::CommMismatch { .. }))
}

/// `done` all-reduces completed, and the next one launched at `start` and in flight.
fn next_in_flight(done: u64, start: u64) -> LiveSnapshot {
    let mut l = counts([0, 0, 0, 0, done]);
    l.launched[CollType::AllReduce as usize] = done + 1;
    l.in_flight = Some(InFlight {
        seq: done + 1,
        coll: CollType::AllReduce,
        coll_seq: done + 1,
        bytes: 8,
        start_ns: start,
        peer: Some(0),
        step_state: Some(step_state::RECV_WAIT),
    });
    l
}

#[test]
fn a_rank_that_launched_the_next_operation_is_ahead_until_the_grace_period_ends() {
    let grace = StuckPolicy::default().min_wait_ns;
    let start = NOW;
    // Rank 1 has launched all-reduce 8; rank 0 finished 7 and has not launched 8 yet.
    for now in [start, start + grace / 2, start + grace - 1] {
        let r = two_ranks_at(counts([0, 0, 0, 0, 7]), next_in_flight(7, start), now);
        assert!(!mismatched(&r), "at +{} ns: {:?}", now - start, r.warnings);
        assert!(!r.groups[0].errors.mismatch);
    }
    // Rank 1 still waits in 8 once the grace period is over and rank 0 never launched it: apart, and stuck.
    let r = two_ranks_at(counts([0, 0, 0, 0, 7]), next_in_flight(7, start), start + grace);
    assert!(mismatched(&r) && r.groups[0].errors.mismatch, "{:?}", r.warnings);
    assert_eq!(r.stuck.len(), 1);
    let text = render_text(&r);
    assert!(text.contains("Communicator ranks have different AllReduce operation counts"), "{text}");
}

#[test]
fn records_read_a_moment_apart_are_not_a_mismatch() {
    // Rank 0's record was read between all-reduces 7 and 8; rank 1's a moment later, after 8 completed and 9
    // started: rank 1 could only finish 8 because rank 0 launched it.
    let r = two_ranks_at(counts([0, 0, 0, 0, 7]), next_in_flight(8, NOW), NOW);
    assert!(!mismatched(&r), "{:?}", r.warnings);
    // A broadcast's root can finish before the others start, so that proof holds only for collectives in which
    // every rank needs every other's data: a root one broadcast ahead and idle is apart.
    let r = two_ranks_at(counts([3, 0, 0, 0, 7]), counts([4, 0, 0, 0, 7]), NOW);
    assert!(mismatched(&r), "{:?}", r.warnings);
    // Ranks that stopped with different counts are apart at once, whatever the clock says: rank 1 launched two
    // all-reduces more than rank 0 and finished neither.
    let mut ahead = counts([0, 0, 0, 0, 9]);
    ahead.completed[CollType::AllReduce as usize] = 7;
    for now in [0, NOW, NOW + 100 * SEC] {
        let r = two_ranks_at(counts([0, 0, 0, 0, 7]), ahead.clone(), now);
        assert!(mismatched(&r), "{:?}", r.warnings);
    }
}

#[test]
fn a_healthy_loop_read_at_any_moment_never_mismatches() {
    // Two ranks looping all-reduces of 50 µs, rank 1 starting each 20 µs after rank 0, records read 30 µs apart
    // at a moment that sweeps across whole operations on the virtual clock.
    let (op, lag, skew) = (50_000u64, 20_000u64, 30_000u64);
    let live = |t: u64, offset: u64| {
        let t = t - offset;
        let done = t / op;
        let into = t % op;
        if into < op - 5_000 {
            next_in_flight(done, NOW - 10 * SEC + offset + done * op)
        } else {
            counts([0, 0, 0, 0, done + 1])
        }
    };
    for step in 0..500u64 {
        let t = 10 * SEC + step * 1_100;
        let r = two_ranks_at(live(t, 0), live(t + skew, lag), NOW);
        assert!(!mismatched(&r), "at step {step}: {:?}", r.warnings);
    }
}
