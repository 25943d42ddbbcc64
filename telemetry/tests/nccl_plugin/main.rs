//! NCCL C-ABI profiler plugins, end to end: real C plugins (tests/plugins/*.c) are compiled with
//! the system C compiler, loaded through `NcclPlugin::load` / the environment, driven through a
//! `Fanout` with a realistic event tree, and their logs are checked.

mod support;

use occl_telemetry::event::EventType;
use occl_telemetry::nccl::{ApiVersion, LoadError, NcclPlugin};
use occl_telemetry::{activation, CommInfo, EventDescr, EventMask, Fanout, Profiler, Sink};
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use support::*;

fn comm(rank: i32) -> CommInfo<'static> {
    CommInfo { comm_name: Some("occl-test"), comm_hash: COMM_HASH, n_nodes: 1, nranks: 2, rank }
}

fn log_path(prefix: &Path, rank: i32) -> std::path::PathBuf {
    let mut s = prefix.as_os_str().to_owned();
    s.push(format!("-{COMM_HASH}-{rank}.log"));
    s.into()
}

/// Loads `lib`, inits rank `rank` with the given mask, attaches the sink to a fresh fan-out.
fn open(lib: &str, prefix: &Path, mask: &str, rank: i32) -> (Arc<NcclPlugin>, Arc<dyn Sink>, Fanout, String) {
    set_plugin_env(prefix, mask);
    let p = NcclPlugin::load(&fixtures().spec(lib)).unwrap_or_else(|e| panic!("load {lib}: {e}"));
    let (sink, logs) = capture(|| p.init(&comm(rank)));
    let sink = sink.unwrap_or_else(|| panic!("{lib} init gave no sink; log: {logs}"));
    let f = Fanout::new();
    f.attach(sink.clone()).expect("attach");
    f.capture();
    (p, sink, f, logs)
}

#[test]
fn v5_plugin_sees_the_full_tree() {
    let _g = global_lock();
    let prefix = log_prefix("v5-tree");
    let (p, sink, f, logs) = open("recorder_v5", &prefix, "0x7fff", 0);
    assert_eq!((p.version(), p.name()), (ApiVersion::V5, "occl-test-recorder-v5"));
    assert!(sink.dynamic());
    // The plugin set all v6 bits; a v5 plugin is not offered the copy-engine types.
    assert_eq!(activation::current(), EventMask::ALL);
    assert_eq!(sink.interest(), EventMask(0xFFF));
    // The C logger shim formatted the plugin's message (with its %%) into a tracing event.
    assert!(logs.contains("INFO") && logs.contains("recorder v5: comm") && logs.contains("is 100% ready"), "{logs}");

    drive_tree(&f, 0);
    let d = Driver(&f);
    let ce = d.start(None, EventDescr::CeSync { is_complete: false, n_ranks: 2 });
    assert!(ce.is_none(), "no sink wants CE events from a v5 plugin");
    sink.finalize();
    drop((sink, f));

    let log = Log::new(read_log(&log_path(&prefix, 0)));
    let init = &log.lines[0];
    assert_eq!(init.kind, "init");
    assert_eq!(init.num("v"), 5);
    assert_eq!(init.get("comm"), COMM_HASH.to_string());
    assert_eq!((init.num("nnodes"), init.num("nranks"), init.num("rank")), (1, 2, 0));
    assert_eq!((init.num("mask"), init.num("logfn")), (0x7fff, 1));
    assert_eq!(init.get("name"), "occl-test");

    assert_eq!(log.types(), vec![1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048]);
    let ga = log.one(0x100);
    assert_eq!((ga.num("parent"), ga.num("rank"), ga.num("captured"), ga.num("depth")), (0, 0, 0, 1));
    let gah = ga.num("handle");
    let ga_states: Vec<_> = log.states(gah).iter().map(|l| (l.num("state"), l.get("args").to_owned())).collect();
    assert_eq!(ga_states, vec![(23, "null".to_owned()), (24, "null".to_owned())]);

    let ca = log.one(0x200);
    assert_eq!(ca.num("parent"), gah);
    assert_eq!((ca.get("func"), ca.num("count"), ca.get("dtype")), ("AllReduce", 1024, "ncclFloat32"));
    assert_eq!((ca.num("root"), ca.num("stream"), ca.num("captured")), (0, STREAM as i64, 0));
    let pa = log.one(0x400);
    assert_eq!((pa.num("parent"), pa.get("func"), pa.num("count"), pa.get("dtype")), (gah, "Send", 256, "ncclInt32"));
    let kl = log.one(0x800);
    assert_eq!((kl.num("parent"), kl.num("stream")), (gah, STREAM as i64));

    let group = log.one(0x1);
    assert_eq!(group.num("parent"), 0);
    let coll = log.one(0x2);
    assert_eq!(coll.num("parent"), ca.num("handle"), "v5: Coll hangs under CollApi");
    assert_eq!(coll.num("pgroup"), group.num("handle"));
    assert_eq!((coll.num("rank"), coll.num("seq"), coll.get("func"), coll.num("count")), (0, 4, "AllReduce", 1024));
    assert_eq!((coll.num("send"), coll.num("recv"), coll.num("root")), (0x1000, 0x2000, 0));
    assert_eq!((coll.get("dtype"), coll.get("algo"), coll.get("proto")), ("ncclFloat32", "RING", "SIMPLE"));
    assert_eq!((coll.num("nch"), coll.num("nwarps")), (2, 16));
    let p2p = log.one(0x4);
    assert_eq!((p2p.num("parent"), p2p.num("pgroup")), (pa.num("handle"), group.num("handle")));
    assert_eq!((p2p.get("func"), p2p.num("buff"), p2p.num("peer"), p2p.num("nch")), ("Send", 0x3000, 1, 1));

    let ctl = log.one(0x20);
    assert_eq!(ctl.num("parent"), 0);
    let ctl_states: Vec<_> =
        log.states(ctl.num("handle")).iter().map(|l| (l.num("state"), l.num("appended"))).collect();
    assert_eq!(ctl_states, vec![(15, 0), (16, 0), (17, 0), (18, 3)]);

    let ops = log.starts(0x8);
    assert_eq!(ops.len(), 2);
    let (send, recv) = (ops[0], ops[1]);
    let pid = i64::from(std::process::id());
    for op in [send, recv] {
        assert_eq!(op.num("parent"), coll.num("handle"), "ProxyOp after the Coll's stop still gets its handle");
        assert_eq!((op.num("pid"), op.num("peer"), op.num("chunk")), (pid, 1, 4096));
        // InProgress (19) with zeroed args; the 2.23-style SendPosted (0) is not a v5 state.
        let st: Vec<_> = log.states(op.num("handle")).iter().map(|l| (l.num("state"), l.num("raw"))).collect();
        assert_eq!(st, vec![(19, 0)]);
    }
    assert_eq!((send.num("send"), send.num("nsteps"), send.num("ch")), (1, 2, 0));
    assert_eq!((recv.num("send"), recv.num("nsteps"), recv.num("ch")), (0, 1, 1));

    let steps = log.starts(0x10);
    assert_eq!(steps.len(), 3);
    let sizes = |h| log.states(h).iter().map(|l| (l.num("state"), l.num("size"))).collect::<Vec<_>>();
    for (i, s) in steps[..2].iter().enumerate() {
        assert_eq!((s.num("parent"), s.num("step")), (send.num("handle"), i as i64));
        assert_eq!(sizes(s.num("handle")), vec![(8, 0), (20, 0), (9, 4096)]);
    }
    assert_eq!(steps[2].num("parent"), recv.num("handle"));
    assert_eq!(sizes(steps[2].num("handle")), vec![(10, 0), (11, 2048), (12, 2048)]);

    let net = log.one(0x80);
    assert_eq!((net.num("parent"), net.num("id")), (steps[0].num("handle"), SOCK_ID));
    assert_eq!((net.num("sock_type"), net.num("fd"), net.num("op"), net.num("len")), (1, 7, 0, 4096));
    let upd = log.states(net.num("handle"));
    assert_eq!(upd.len(), 1);
    assert_eq!((upd[0].num("state"), upd[0].num("fd"), upd[0].num("len")), (21, 7, 8192));

    let kch = log.one(0x40);
    assert_eq!(
        (kch.num("parent"), kch.num("ch"), kch.num("ptimer"), kch.num("rank")),
        (coll.num("handle"), 0, 1000, 0)
    );
    let kst = log.states(kch.num("handle"));
    assert_eq!((kst.len(), kst[0].num("state"), kst[0].num("ptimer")), (1, 22, 2000));

    // Every started event was stopped once; nothing was called with a bad handle.
    let starts: Vec<i64> = log.kind("start").map(|l| l.num("handle")).collect();
    assert_eq!(starts, (1..=starts.len() as i64).collect::<Vec<_>>());
    for h in &starts {
        assert_eq!(log.kind("stop").filter(|l| l.num("handle") == *h).count(), 1, "stop of {h}");
    }
    let fin = log.kind("finalize").next().expect("finalize line");
    assert_eq!((fin.num("events"), fin.num("dropped"), fin.num("bad_calls")), (starts.len() as i64, 0, 0));
    assert_eq!(log.lines.last().map(|l| l.kind.as_str()), Some("finalize"));
}

#[test]
fn v1_plugin_sees_the_legacy_tree() {
    let _g = global_lock();
    let prefix = log_prefix("v1-tree");
    let (p, sink, f, _) = open("recorder_v1", &prefix, "4095", 0);
    assert_eq!(p.version(), ApiVersion::V1);
    assert_eq!(sink.interest(), EventMask(0x3F));
    drive_tree(&f, 0);
    sink.finalize();
    drop((sink, f));

    let files: Vec<_> = std::fs::read_dir(prefix.parent().expect("dir"))
        .expect("logs")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("v1-tree-v1-")))
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    let name = files[0].file_name().expect("name").to_string_lossy().into_owned();
    assert!(name.starts_with(&format!("v1-tree-v1-{}-", std::process::id())), "{name}");
    let log = Log::new(read_log(&files[0]));
    assert_eq!((log.lines[0].kind.as_str(), log.lines[0].num("v"), log.lines[0].num("mask")), ("init", 1, 4095));

    // No API events, no KernelCh/NetPlugin (v3+).
    assert_eq!(log.types(), vec![1, 2, 4, 8, 16, 32]);
    let group = log.one(0x1);
    let coll = log.one(0x2);
    assert_eq!(coll.num("parent"), group.num("handle"), "v1: Coll hangs under the legacy Group");
    // Numeric codes: AllReduce 4, Float32 7, RING 1, SIMPLE 2; op and trafficBytes unknown (0).
    assert_eq!((coll.num("func"), coll.num("dtype"), coll.num("algo"), coll.num("proto")), (4, 7, 1, 2));
    assert_eq!((coll.num("op"), coll.num("traffic"), coll.num("collnet"), coll.num("nvls")), (0, 0, 0, 0));
    assert_eq!((coll.num("seq"), coll.num("count"), coll.num("nch"), coll.num("nwarps")), (4, 1024, 2, 16));
    assert_eq!((coll.get("cname"), coll.get("comm")), ("occl-test", COMM_HASH.to_string().as_str()));
    let p2p = log.one(0x4);
    assert_eq!(p2p.num("parent"), group.num("handle"));
    assert_eq!((p2p.num("func"), p2p.num("dtype"), p2p.num("count"), p2p.num("peer")), (6, 2, 256, 1));

    let ctl = log.one(0x20);
    let ctl_states: Vec<_> =
        log.states(ctl.num("handle")).iter().map(|l| (l.num("state"), l.num("appended"))).collect();
    assert_eq!(ctl_states, vec![(15, 0), (16, 0), (17, 0), (18, 3)]);

    let ops = log.starts(0x8);
    assert_eq!(ops.len(), 2);
    // No InProgress (19); the 2.23-style SendPosted (0) arrives with transSize and steps.
    let st: Vec<_> =
        log.states(ops[0].num("handle")).iter().map(|l| (l.num("state"), l.num("size"), l.num("steps"))).collect();
    assert_eq!(st, vec![(0, 64, 2)]);
    assert!(log.states(ops[1].num("handle")).is_empty());
    let steps = log.starts(0x10);
    assert_eq!(steps.len(), 3);
    for s in &steps[..2] {
        assert_eq!(s.num("parent"), ops[0].num("handle"));
        // No SendPeerWait (20, v4+); the arguments are all zero.
        let st: Vec<_> =
            log.states(s.num("handle")).iter().map(|l| (l.num("state"), l.num("raw0"), l.num("raw1"))).collect();
        assert_eq!(st, vec![(8, 0, 0), (9, 0, 0)]);
    }
    assert_eq!(log.state_numbers(steps[2].num("handle")), vec![10, 11, 12]);
    let fin = log.kind("finalize").next().expect("finalize");
    assert_eq!(fin.num("bad_calls"), 0);
}

#[test]
fn v4_plugin_gets_the_v4_hierarchy_and_init_order() {
    let _g = global_lock();
    let prefix = log_prefix("v4-tree");
    let (p, sink, f, logs) = open("recorder_v4", &prefix, "0x7fff", 1);
    assert_eq!(p.version(), ApiVersion::V4);
    assert_eq!(sink.interest(), EventMask(0xFF));
    assert!(logs.contains("recorder v4: comm") && logs.contains("rank 1 is 100% ready"), "{logs}");
    drive_tree(&f, 1);
    sink.finalize();
    drop((sink, f));

    let log = Log::new(read_log(&log_path(&prefix, 1)));
    let init = &log.lines[0];
    assert_eq!((init.num("v"), init.get("comm"), init.num("rank")), (4, COMM_HASH.to_string().as_str(), 1));
    assert_eq!((init.num("nranks"), init.num("nnodes"), init.get("name")), (2, 1, "occl-test"));
    assert_eq!(log.types(), vec![1, 2, 4, 8, 16, 32, 64, 128]);
    let group = log.one(0x1);
    assert_eq!(log.one(0x2).num("parent"), group.num("handle"));
    assert_eq!(log.one(0x4).num("parent"), group.num("handle"));
    assert_eq!(log.one(0x2).num("rank"), 1);
    let ops = log.starts(0x8);
    assert_eq!(log.state_numbers(ops[0].num("handle")), vec![19]);
    let steps = log.starts(0x10);
    assert_eq!(log.state_numbers(steps[0].num("handle")), vec![8, 20, 9]);
    assert_eq!(log.state_numbers(log.one(0x80).num("handle")), vec![21]);
    assert_eq!(log.state_numbers(log.one(0x40).num("handle")), vec![22]);
}

#[test]
fn v6_plugin_gets_copy_engine_events() {
    let _g = global_lock();
    let prefix = log_prefix("v6-ce");
    let (p, sink, f, _) = open("recorder_v6", &prefix, "0x7fff", 0);
    assert_eq!(p.version(), ApiVersion::V6);
    assert_eq!(sink.interest(), EventMask::ALL);
    let d = Driver(&f);
    let ga = d.start(None, EventDescr::GroupApi { graph_captured: false, group_depth: 1 });
    let ca = d.start(
        ga,
        EventDescr::CollApi {
            func: "AllGather",
            count: 64,
            datatype: "ncclBfloat16",
            root: 0,
            stream: STREAM,
            graph_captured: true,
        },
    );
    let ce = d.start(
        ca,
        EventDescr::CeColl {
            seq_number: 3,
            func: "AllGather",
            send_buff: 0x10,
            recv_buff: 0x20,
            count: 64,
            root: 0,
            datatype: "ncclBfloat16",
            sync_strategy: "MC",
            intra_batch_sync: false,
            batch_size: 0,
            num_batches: 0,
            ce_seq_num: 9,
            stream: STREAM,
        },
    );
    let sync = d.start(ce, EventDescr::CeSync { is_complete: true, n_ranks: 2 });
    d.state(sync, occl_telemetry::StateArgs::Ce { state: occl_telemetry::CeState::SyncStart });
    d.stop(sync);
    let batch = d.start(ce, EventDescr::CeBatch { num_ops: 4, total_bytes: 1 << 20, use_intra_sync: true });
    d.stop(batch);
    d.stop(ce);
    d.stop(ca);
    // occl's own CeColl, reported after the call ran at its device times (`start_at`): a v6
    // plugin would time it on its stream at the wrong moment, so it gets none.
    let late = f.start_at(
        ca,
        &EventDescr::CeColl {
            seq_number: 4,
            func: "AllGather",
            send_buff: 0x30,
            recv_buff: 0x40,
            count: 64,
            root: 0,
            datatype: "ncclBfloat16",
            sync_strategy: "UC",
            intra_batch_sync: false,
            batch_size: 0,
            num_batches: 0,
            ce_seq_num: 10,
            stream: STREAM,
        },
        1_000,
    );
    if let Some(id) = late {
        f.stop_at(id, 2_000);
    }
    d.stop(ga);
    sink.finalize();
    drop((sink, f));

    let log = Log::new(read_log(&log_path(&prefix, 0)));
    assert_eq!(log.lines[0].num("v"), 6);
    let ca = log.one(0x200);
    assert_eq!((ca.num("captured"), ca.get("dtype")), (1, "ncclBfloat16"));
    let ce = log.one(0x1000);
    assert_eq!(ce.num("ceseq"), 9, "only the CeColl started at its enqueue reaches the plugin");
    assert_eq!(ce.num("parent"), ca.num("handle"));
    assert_eq!((ce.num("seq"), ce.get("func"), ce.get("sync"), ce.num("ceseq")), (3, "AllGather", "MC", 9));
    let sync = log.one(0x2000);
    assert_eq!((sync.num("parent"), sync.num("complete"), sync.num("nranks")), (ce.num("handle"), 1, 2));
    assert!(log.states(sync.num("handle")).is_empty(), "CE states are never delivered");
    let batch = log.one(0x4000);
    assert_eq!((batch.num("parent"), batch.num("nops"), batch.num("bytes")), (ce.num("handle"), 4, 1 << 20));
    assert_eq!(batch.num("intra"), 1);
}

#[test]
fn callbacks_from_many_threads() {
    let _g = global_lock();
    let prefix = log_prefix("threads");
    let (_p, sink, f, _) = open("recorder_v5", &prefix, "0x18", 0);
    let (threads, ops, steps) = (4, 100, 4);
    let d = Driver(&f);
    let g = d.start(None, EventDescr::Group);
    let c = d.start(None, coll_descr(0, g));
    d.stop(c);
    d.stop(g);
    std::thread::scope(|s| {
        for t in 0..threads {
            let d = Driver(&f);
            s.spawn(move || {
                for _ in 0..ops {
                    let op = d.start(
                        c,
                        EventDescr::ProxyOp {
                            rank: 0,
                            pid: 1,
                            channel_id: t,
                            peer: 1,
                            n_steps: steps,
                            chunk_size: 1,
                            is_send: true,
                        },
                    );
                    for step in 0..steps {
                        let st = d.start(op, EventDescr::ProxyStep { rank: 0, step });
                        d.state(
                            st,
                            occl_telemetry::StateArgs::ProxyStep {
                                state: occl_telemetry::ProxyStepState::SendWait,
                                trans_size: 1,
                            },
                        );
                        d.stop(st);
                    }
                    d.stop(op);
                }
            });
        }
    });
    sink.finalize();
    drop((sink, f));
    let log = Log::new(read_log(&log_path(&prefix, 0)));
    let n_ops = usize::from(threads) * ops;
    let n_steps = n_ops * steps as usize;
    assert_eq!(log.starts(0x8).len(), n_ops);
    assert_eq!(log.starts(0x10).len(), n_steps);
    assert_eq!(log.kind("state").count(), n_steps);
    assert_eq!(log.kind("stop").count(), 2 + n_ops + n_steps);
    let op_handles: std::collections::HashSet<i64> = log.starts(0x8).iter().map(|l| l.num("handle")).collect();
    let coll = log.one(0x2).num("handle");
    assert!(log.starts(0x8).iter().all(|l| l.num("parent") == coll));
    assert!(log.starts(0x10).iter().all(|l| op_handles.contains(&l.num("parent"))));
    assert_eq!(log.kind("finalize").next().expect("finalize").num("bad_calls"), 0);
}

#[test]
fn library_is_closed_after_the_last_communicator_and_opened_again() {
    let _g = global_lock();
    let prefix = log_prefix("refcount");
    set_plugin_env(&prefix, "0x2");
    let spec = fixtures().spec("recorder_v5_refcount");
    let mapped = || std::fs::read_to_string("/proc/self/maps").expect("maps").contains(&spec);
    let p = NcclPlugin::load(&spec).expect("load");
    assert!(p.is_loaded() && mapped());
    let a = p.init(&comm(0)).expect("rank 0");
    let b = p.init(&comm(1)).expect("rank 1");
    a.finalize();
    drop(a);
    assert!(p.is_loaded() && mapped(), "rank 1 still holds the library");
    b.finalize();
    drop(b);
    assert!(!p.is_loaded(), "the last communicator is gone");
    assert!(!mapped(), "dlclose unmapped {spec}");
    // A later communicator loads it again and works.
    let c = p.init(&CommInfo { comm_hash: 7, ..comm(0) }).expect("reopened");
    assert!(p.is_loaded() && mapped());
    let f = Fanout::new();
    f.attach(c.clone()).expect("attach");
    f.capture();
    let g = f.start(None, &EventDescr::Group);
    let coll = f.start(g, &coll_descr(0, g)).expect("coll wanted");
    f.stop(coll);
    c.finalize();
    drop((c, f));
    let mut path = prefix.as_os_str().to_owned();
    path.push("-7-0.log");
    let log = Log::new(read_log(Path::new(&path)));
    assert_eq!(log.one(0x2).num("parent"), log.one(0x1).num("handle"));
    assert!(!p.is_loaded());
}

#[test]
fn a_library_without_the_symbol_is_refused() {
    let spec = fixtures().spec("no_symbol");
    let e = NcclPlugin::load(&spec).expect_err("no ncclProfiler_v*");
    assert_eq!(e, LoadError::NoSymbol { origin: spec.clone() });
    let msg = e.to_string();
    assert!(msg.contains(&spec) && msg.contains("ncclProfiler_v6") && msg.contains("ncclProfiler_v1"), "{msg}");
}

#[test]
fn a_null_function_pointer_is_refused() {
    let spec = fixtures().spec("null_fn");
    let e = NcclPlugin::load(&spec).expect_err("NULL recordEventState");
    assert_eq!(e, LoadError::NullEntry { origin: spec.clone(), symbol: "ncclProfiler_v4", field: "recordEventState" });
    assert!(e.to_string().contains("ncclProfiler_v4.recordEventState is NULL"), "{e}");
}

#[test]
fn a_failing_init_disables_only_that_communicator() {
    let _g = global_lock();
    set_plugin_env(&log_prefix("init-fails"), "0x7fff");
    let p = NcclPlugin::load(&fixtures().spec("init_fails")).expect("load");
    let (ok, _) = capture(|| p.init(&comm(0)));
    let ok = ok.expect("rank 0 succeeds");
    let (failed, logs) = capture(|| p.init(&comm(1)));
    assert!(failed.is_none());
    assert!(logs.contains("WARN") && logs.contains("returned 3") && logs.contains("occl-test-init-fails"), "{logs}");
    assert!(logs.contains(&format!("{COMM_HASH:#x}")) && logs.contains("rank 1"), "{logs}");
    let (opted_out, logs) = capture(|| p.init(&comm(2)));
    assert!(opted_out.is_none(), "a NULL context is no sink");
    assert!(!logs.contains("WARN"), "{logs}");
    // The plugin stays loaded for the communicator that has it, and NULL handles are harmless.
    assert!(p.is_loaded());
    let f = Fanout::new();
    f.attach(ok.clone()).expect("attach");
    f.capture();
    drive_tree(&f, 0);
    ok.finalize();
}

#[test]
fn null_handles_are_stored_and_skipped() {
    let _g = global_lock();
    let prefix = log_prefix("null-handles");
    let (p, sink, f, _) = open("null_handles", &prefix, "0x7fff", 0);
    assert_eq!(p.version(), ApiVersion::V6);
    drive_tree(&f, 0);
    sink.finalize();
    assert!(sink.interest().is_empty(), "a finalized sink wants nothing");
    drop((sink, f));
    let mut path = prefix.as_os_str().to_owned();
    path.push(format!("-nullh-{COMM_HASH}-0.log"));
    let before = std::fs::read_to_string(&path).expect("null-handles log");
    let kv = &parse_log(&format!("counts {before}"))[0];
    assert!(kv.num("starts") >= 15, "{before}");
    assert_eq!(kv.num("with_parent"), 0, "parents of NULL handles are NULL");
    for k in ["stops", "states", "stops_null", "states_null"] {
        assert_eq!(kv.num(k), 0, "{k}: {before}");
    }
}

// ---- name resolution and the environment, in child processes (the dynamic linker reads
// LD_LIBRARY_PATH at start, and `plugin_from_env` loads once per process) ----

const CHILD_CASE: &str = "OCCL_TEST_CHILD_CASE";

fn run_child(case: &str, env: &[(&str, String)]) -> String {
    let search = fixtures().lib("named").parent().expect("dir").to_owned();
    let ld = match std::env::var("LD_LIBRARY_PATH") {
        Ok(old) if !old.is_empty() => format!("{}:{old}", search.display()),
        _ => search.display().to_string(),
    };
    let mut cmd = Command::new(std::env::current_exe().expect("test binary"));
    cmd.args(["--exact", "child_case", "--ignored", "--nocapture", "--test-threads", "1"])
        .env(CHILD_CASE, case)
        .env("LD_LIBRARY_PATH", ld)
        .env_remove("OCCL_PROFILER_PLUGIN")
        .env_remove("NCCL_PROFILER_PLUGIN")
        .env_remove("RUST_LOG");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("run child");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success() && text.contains("1 passed"), "child {case} failed:\n{text}");
    text
}

#[test]
fn bare_names_are_found_on_the_library_path() {
    run_child("bare_name", &[]);
}

#[test]
fn environment_selects_the_plugin_once_per_process() {
    let prefix = log_prefix("env");
    run_child(
        "env_nccl_var",
        &[
            ("NCCL_PROFILER_PLUGIN", "occlrec".to_owned()),
            ("OCCL_TEST_PLUGIN_LOG", prefix.display().to_string()),
            ("OCCL_TEST_PLUGIN_MASK", "2".to_owned()),
        ],
    );
    let log = Log::new(read_log(&log_path(&prefix, 0)));
    assert_eq!(log.one(0x2).get("func"), "AllReduce");
    // OCCL_PROFILER_PLUGIN wins over NCCL_PROFILER_PLUGIN; a failure is one warning, not retried.
    run_child(
        "env_failure",
        &[
            ("OCCL_PROFILER_PLUGIN", "/nonexistent/libnope.so".to_owned()),
            ("NCCL_PROFILER_PLUGIN", "occlrec".to_owned()),
        ],
    );
    run_child("env_default", &[]);
    run_child("env_none", &[("NCCL_PROFILER_PLUGIN", "NoNe".to_owned())]);
}

/// Runs one scenario in a child process (see `run_child`); does nothing when run directly.
#[test]
#[ignore = "runs only as a child process of the tests above"]
fn child_case() {
    let Ok(case) = std::env::var(CHILD_CASE) else { return };
    match case.as_str() {
        "bare_name" => {
            let p = NcclPlugin::load("occlrec").expect("libnccl-profiler-occlrec.so via LD_LIBRARY_PATH");
            assert_eq!((p.origin(), p.version()), ("libnccl-profiler-occlrec.so".to_owned(), ApiVersion::V5));
            let p = NcclPlugin::load("libnccl-profiler-occlrec.so").expect("lib*.so form");
            assert_eq!(p.origin(), "libnccl-profiler-occlrec.so");
            // The `lib*.so` form is not expanded further.
            let e = NcclPlugin::load("libocclrec.so").expect_err("no such library");
            let LoadError::NotFound { attempts, .. } = e else { panic!("{e:?}") };
            assert_eq!(attempts.len(), 1);
        }
        "env_nccl_var" => {
            let (p, logs) = capture(occl_telemetry::plugin_from_env);
            let p = p.expect("plugin from NCCL_PROFILER_PLUGIN");
            assert!(logs.contains("occl-test-recorder-v5") && logs.contains("libnccl-profiler-occlrec.so"), "{logs}");
            let again = occl_telemetry::plugin_from_env().expect("cached");
            assert!(Arc::ptr_eq(&p, &again), "loaded once per process");
            let sink = p.init(&comm(0)).expect("init");
            let f = Fanout::new();
            f.attach(sink.clone()).expect("attach");
            f.capture();
            assert!(f.enabled(EventType::Coll));
            let g = f.start(None, &EventDescr::Group);
            let c = f.start(None, &coll_descr(0, g)).expect("coll");
            f.stop(c);
            sink.finalize();
        }
        "env_failure" => {
            let (p, logs) = capture(occl_telemetry::plugin_from_env);
            assert!(p.is_none());
            assert!(logs.contains("WARN") && logs.contains("OCCL_PROFILER_PLUGIN"), "{logs}");
            assert!(logs.contains("/nonexistent/libnope.so (") && logs.contains("No such file"), "{logs}");
            let (p, logs) = capture(occl_telemetry::plugin_from_env);
            assert!(p.is_none() && logs.is_empty(), "not retried, not logged again: {logs}");
        }
        "env_default" => {
            let (p, logs) = capture(occl_telemetry::plugin_from_env);
            assert!(p.is_none());
            assert!(!logs.contains("WARN") && logs.contains("DEBUG") && logs.contains("libnccl-profiler.so"), "{logs}");
        }
        "env_none" => {
            let (p, logs) = capture(occl_telemetry::plugin_from_env);
            assert!(p.is_none() && !logs.contains("WARN") && logs.contains("disabled"), "{logs}");
        }
        other => panic!("unknown child case {other}"),
    }
}
