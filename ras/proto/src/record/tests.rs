use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use super::*;
use crate::report::MissingRankData;

fn info(comm: u64, size: u32, rank: u32) -> RankInfo {
    RankInfo {
        comm: CommId { hash: comm, root_host_hash: 0x11, root_pid_hash: 0x22 },
        size,
        rank,
        pid: 100 + rank,
        host: "192.0.2.2".into(),
        cuda_dev: Some(rank),
        nvml_dev: Some(rank),
    }
}

#[test]
fn result_codes() {
    assert_eq!(ResultCode::from_code(7), Some(ResultCode::InProgress));
    assert_eq!(ResultCode::report_name(6), "Remote process error");
    assert_eq!(ResultCode::report_name(42), "Unexpected error");
    assert!(!ResultCode::is_error(0) && !ResultCode::is_error(7) && ResultCode::is_error(2));
}

#[test]
fn live_record_counts_launched_and_completed_and_tracks_the_op_in_flight() {
    let r = LiveRecord::new();
    assert_eq!(r.in_flight(), None);
    assert_eq!(r.snapshot(), LiveSnapshot::default());
    assert_eq!(r.launch(CollType::AllReduce, 1024, 5_000), 1);
    r.waiting_on(Some(3), Some(step_state::RECV_WAIT));
    let f = r.in_flight().expect("in flight");
    assert_eq!((f.seq, f.coll, f.coll_seq, f.bytes, f.start_ns), (1, CollType::AllReduce, 1, 1024, 5_000));
    assert_eq!((f.peer, f.step_state), (Some(3), Some(10)));
    assert_eq!(f.waiting_label(), "RecvWait on rank 3");
    assert_eq!(f.waited_ns(7_500), 2_500);
    r.complete(CollType::AllReduce);
    assert_eq!(r.in_flight(), None);

    assert_eq!(r.launch(CollType::Send, 8, 6_000), 2);
    r.complete(CollType::Send);
    assert_eq!(r.launch(CollType::AllReduce, 64, 7_000), 3);
    // A new launch never shows the previous operation's wait.
    let f = r.in_flight().expect("in flight");
    assert_eq!((f.seq, f.coll_seq, f.peer, f.step_state), (3, 2, None, None));
    assert_eq!(f.waiting_label(), "");
    r.waiting_on(None, Some(99));
    assert_eq!(r.in_flight().expect("in flight").waiting_label(), "step state 99");
    // Still running: never completed.
    assert_eq!(r.launched(CollType::AllReduce), 2);
    assert_eq!(r.completed(CollType::AllReduce), 1);
    assert_eq!(r.launched(CollType::Send), 1);
    assert_eq!(r.completed(CollType::Send), 1);
    assert_eq!(r.total(), 3);

    r.set_init_state(ResultCode::Success);
    r.set_error(ResultCode::RemoteError);
    r.set_flag(Flag::Aborted);
    r.set_flag(Flag::Finalized);
    let s = r.snapshot();
    assert_eq!((s.init_state, s.async_error), (0, 6));
    assert_eq!((s.finalize_called, s.destroy_flag, s.abort_flag), (true, false, true));
    assert_eq!(s.launched, [0, 0, 0, 0, 2, 1, 0, 0]);
    assert_eq!(s.completed, [0, 0, 0, 0, 1, 1, 0, 0]);
    assert_eq!(s.in_flight.map(|f| f.seq), Some(3));
}

#[test]
fn a_failed_operation_leaves_flight_and_is_kept_with_its_error() {
    let r = LiveRecord::new();
    r.launch(CollType::AllReduce, 64, 1_000);
    r.complete(CollType::AllReduce);
    r.launch(CollType::AllReduce, 64, 2_000);
    r.waiting_on(Some(2), Some(step_state::RECV_WAIT));
    r.fail(ResultCode::RemoteError, "peer rank 2 died", 5_000);
    // Not in flight (a report would call it stuck, its wait growing for ever), but kept as the last failure.
    assert_eq!(r.in_flight(), None);
    let s = r.snapshot();
    assert_eq!((s.in_flight.as_ref(), s.failed, s.async_error), (None, 1, ResultCode::RemoteError.code()));
    let f = s.last_failure.expect("the failure is kept");
    let op = f.op.as_ref().expect("the operation it was in");
    assert_eq!((op.coll, op.coll_seq, op.peer, op.step_state), (CollType::AllReduce, 2, Some(2), Some(10)));
    assert_eq!((f.at_ns, f.ran_ns(), f.result, f.error.as_str()), (5_000, 3_000, 6, "peer rank 2 died"));
    assert_eq!((r.launched(CollType::AllReduce), r.completed(CollType::AllReduce)), (2, 1));
    // Outside an operation, and an error longer than the record keeps (cut at a character boundary).
    let long = format!("x{}", "é".repeat(MAX_ERROR_BYTES));
    r.fail(ResultCode::InternalError, &long, 6_000);
    let f = r.last_failure().expect("the last failure");
    assert_eq!((f.op.as_ref(), f.ran_ns(), r.failed()), (None, 0, 2));
    assert_eq!(f.error.len(), MAX_ERROR_BYTES - 1);
    assert!(long.starts_with(&f.error));
}

#[test]
fn a_reader_never_sees_a_torn_operation() {
    // The writer encodes the sequence number into every in-flight field; a reader that ever mixes two operations'
    // fields sees a mismatch.
    let rec = Arc::new(LiveRecord::new());
    let stop = Arc::new(AtomicBool::new(false));
    let seen = Arc::new(AtomicU64::new(0));
    let reader = {
        let (rec, stop, seen) = (rec.clone(), stop.clone(), seen.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                if let Some(f) = rec.in_flight() {
                    assert_eq!(f.coll, CollType::ALL[(f.seq % 8) as usize]);
                    assert_eq!(f.bytes, f.seq * 3);
                    assert_eq!(f.start_ns, f.seq * 7);
                    if let Some(p) = f.peer {
                        assert_eq!(u64::from(p), f.seq % 1000, "wait of another operation");
                    }
                    seen.fetch_add(1, Ordering::Relaxed);
                }
            }
        })
    };
    // Writes until the reader has checked enough reads (two shared cores: it may start late).
    let mut seq = 0u64;
    while seen.load(Ordering::Relaxed) < 20_000 && seq < 50_000_000 {
        seq += 1;
        let coll = CollType::ALL[(seq % 8) as usize];
        assert_eq!(rec.launch(coll, seq * 3, seq * 7), seq);
        rec.waiting_on(Some((seq % 1000) as u32), Some(9));
        if !seq.is_multiple_of(3) {
            rec.complete(coll);
        }
    }
    stop.store(true, Ordering::Relaxed);
    reader.join().expect("reader");
    assert!(seen.load(Ordering::Relaxed) >= 20_000, "{seq} launches");
}

#[test]
fn process_records_hold_weak_references_and_sort() {
    let reg = ProcessRecords::new();
    let a = Arc::new(CommRecord::new(info(0xbb, 2, 1)));
    let b = Arc::new(CommRecord::new(info(0xaa, 2, 0)));
    let c = Arc::new(CommRecord::new(info(0xbb, 2, 0)));
    for r in [&a, &b, &c] {
        reg.register(r);
    }
    a.live().launch(CollType::AllGather, 4, 1);
    let snap = reg.snapshot_all();
    let order: Vec<(u64, u32)> = snap.iter().map(|r| (r.info.comm.hash, r.info.rank)).collect();
    assert_eq!(order, [(0xaa, 0), (0xbb, 0), (0xbb, 1)]);
    assert_eq!(snap[2].launched(CollType::AllGather), 1);
    drop(b);
    assert_eq!(reg.len(), 2);
    assert_eq!(reg.snapshot_all().len(), 2);
    let d = Arc::new(CommRecord::new(info(0xcc, 1, 0)));
    reg.register(&d);
    assert_eq!(reg.len(), 3);
}

#[test]
fn conversion_to_the_report_model() {
    let r = CommRecord::new(info(0xc41c5eeb26d2a80c, 4, 1));
    r.live().set_init_state(ResultCode::Success);
    for _ in 0..3 {
        r.live().launch(CollType::AllReduce, 8, 1);
    }
    r.live().launch(CollType::AllToAll, 8, 1);
    let snap = r.snapshot();
    let d = snap.to_rank_data();
    assert_eq!(d.collective_counts, [0, 0, 0, 0, 3]);
    assert_eq!((d.rank, d.pid, d.cuda_dev, d.nvml_dev, d.init_state), (1, 101, 1, 1, 0));

    let mut host_only = snap.clone();
    host_only.info.rank = 3;
    host_only.info.cuda_dev = None;
    host_only.info.nvml_dev = None;
    let other = RankRecord { info: info(0x01, 1, 0), ..Default::default() };
    let comms = convert::comm_data([&snap, &host_only, &snap, &other], |_, rank| MissingRankData {
        rank,
        host: "?".into(),
        pid: 0,
        cuda_dev: rank,
        nvml_dev: rank,
        unresponsive: true,
        considered_dead: false,
    });
    assert_eq!(comms.len(), 2);
    assert_eq!(comms[0].hash, 0x01);
    let c = &comms[1];
    assert_eq!((c.size, c.secondary_hash), (4, (0x11, 0x22)));
    assert_eq!(c.ranks.iter().map(|r| r.rank).collect::<Vec<_>>(), [1, 3]);
    assert_eq!(c.ranks[1].cuda_dev, convert::NO_DEVICE);
    assert_eq!(c.missing_ranks.iter().map(|m| m.rank).collect::<Vec<_>>(), [0, 2]);
}

#[test]
fn rank_records_are_plain_serde_values() {
    let r = CommRecord::new(info(7, 2, 0));
    r.live().launch(CollType::Broadcast, 1, 2);
    r.live().waiting_on(Some(1), Some(step_state::SEND_PEER_WAIT));
    let snap = r.snapshot();
    let json = serde_json::to_string(&snap).expect("serialize");
    assert!(json.contains("\"Broadcast\""), "{json}");
    assert_eq!(serde_json::from_str::<RankRecord>(&json).expect("deserialize"), snap);
}

#[test]
fn claimed_sizes_cannot_make_the_missing_list_unbounded() {
    // 64 communicators, each claiming the largest size with one rank present: 64 × (2^20 - 1) absent ranks.
    let recs: Vec<RankRecord> =
        (0..64u64).map(|c| CommRecord::new(info(c + 1, MAX_COMM_RANKS, 0)).snapshot()).collect();
    let mut asked = 0usize;
    let data = convert::comm_data(recs.iter(), |_, rank| {
        asked += 1;
        MissingRankData {
            rank,
            host: String::new(),
            pid: 0,
            cuda_dev: 0,
            nvml_dev: 0,
            unresponsive: true,
            considered_dead: false,
        }
    });
    let listed: usize = data.iter().map(|d| d.missing_ranks.len()).sum();
    assert_eq!(listed, convert::MAX_MISSING_LISTED);
    assert_eq!(asked, listed, "entries past the bound are not even built");
    assert!(data.iter().all(|d| d.size == MAX_COMM_RANKS), "sizes are still reported");
}
