//! Profiler events from real multi-process jobs: each rank registers a recording profiler (an
//! in-process sink, `occl_tests::events::Recorder`), runs every collective and p2p at three
//! sizes, and writes what it saw at finalize. The test checks the whole tree on every rank and
//! across ranks.

mod common;

use common::{assert_all_ok, env, run_job, scratch};
use occl_tests::launch::Spawn;
use serde_json::Value;
use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::time::Duration;

/// One event as the recorder wrote it.
#[derive(Debug, Default, Clone)]
struct Ev {
    ty: String,
    parent: Option<u64>,
    d: Value,
    states: Vec<(u64, Value)>,
    stops: usize,
    children: Vec<u64>,
    /// Start order within the rank.
    order: usize,
}

struct Rank {
    rank: usize,
    events: BTreeMap<u64, Ev>,
    /// Ids in start order.
    seq: Vec<u64>,
}

fn load(path: &Path) -> Rank {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut events: BTreeMap<u64, Ev> = BTreeMap::new();
    let (mut seq, mut rank, mut finalized) = (Vec::new(), usize::MAX, false);
    for (n, line) in text.lines().enumerate() {
        let v: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{}:{n}: {e}", path.display()));
        let id = v["id"].as_u64().unwrap_or(0);
        match v["ev"].as_str().unwrap_or("") {
            "init" => rank = v["rank"].as_u64().expect("init rank") as usize,
            "start" => {
                assert!(!events.contains_key(&id), "id {id} started twice");
                let parent = v["parent"].as_u64();
                if let Some(p) = parent {
                    events.get_mut(&p).unwrap_or_else(|| panic!("{line}: parent {p} never started")).children.push(id);
                }
                let ty = v["type"].as_str().expect("type").to_string();
                events.insert(id, Ev { ty, parent, d: v["d"].clone(), order: seq.len(), ..Ev::default() });
                seq.push(id);
            }
            "state" => {
                let e = events.get_mut(&id).unwrap_or_else(|| panic!("{line}: state of an unknown event"));
                assert_eq!(e.stops, 0, "{line}: state after stop");
                e.states.push((v["state"].as_u64().expect("state"), v["a"].clone()));
            }
            "stop" => {
                let e = events.get_mut(&id).unwrap_or_else(|| panic!("{line}: stop of an unknown event"));
                e.stops += 1;
            }
            "finalize" => finalized = true,
            other => panic!("unknown record {other:?}"),
        }
    }
    assert!(finalized, "{}: finalize never called", path.display());
    Rank { rank, events, seq }
}

fn states(e: &Ev) -> Vec<u64> {
    e.states.iter().map(|s| s.0).collect()
}

/// The checks that hold within one rank; returns the Coll signature list and per-peer step
/// totals (sent to, received from) for the cross-rank checks.
fn check_rank(r: &Rank, tcp: bool) -> (Vec<String>, HashMap<(usize, bool), i64>) {
    let want_parent = |ty: &str| -> Option<&[&str]> {
        Some(match ty {
            "CollApi" | "P2pApi" => &["GroupApi"],
            "Coll" => &["CollApi"],
            "P2p" => &["P2pApi"],
            "ProxyOp" => &["Coll", "P2p"],
            "ProxyStep" => &["ProxyOp"],
            "NetPlugin" => &["ProxyStep"],
            _ => return None,
        })
    };
    let mut colls = Vec::new();
    let mut per_peer: HashMap<(usize, bool), i64> = HashMap::new();
    let mut count = HashMap::<&str, usize>::new();
    let mut per_type = HashMap::<&str, usize>::new();
    for id in &r.seq {
        let e = &r.events[id];
        *count.entry(e.ty.as_str()).or_default() += 1;
        assert_eq!(e.stops, 1, "rank {}: {} {id} stopped {} times", r.rank, e.ty, e.stops);
        match (want_parent(&e.ty), e.parent) {
            (Some(ok), Some(p)) => {
                let pt = &r.events[&p].ty;
                assert!(ok.contains(&pt.as_str()), "rank {}: {} has a {pt} parent", r.rank, e.ty);
            }
            // A frame read before its receive step began (the sender ran ahead) has no step yet.
            (Some(_), None) if e.ty == "NetPlugin" && e.d["op"] == 1 => {}
            (Some(_), None) => panic!("rank {}: {} {id} has no parent", r.rank, e.ty),
            (None, Some(p)) => panic!("rank {}: {} {id} has parent {p}; it stands alone", r.rank, e.ty),
            (None, None) => {}
        }
        let st = states(e);
        match e.ty.as_str() {
            "GroupApi" => {
                assert_eq!(st, [23, 24], "rank {}: GroupApi states", r.rank);
                assert_eq!(e.d["depth"], 1);
            }
            "Coll" | "P2p" => {
                assert!(st.is_empty(), "{} has states {st:?}", e.ty);
                let g = e.d["pgroup"].as_u64().expect("parentGroup set");
                assert_eq!(r.events[&g].ty, "Group", "parentGroup names a Group");
                assert_eq!(e.d["rank"], r.rank as u64);
                if e.ty == "Coll" {
                    colls.push(format!("{} seq={} count={} {}", e.d["func"], e.d["seq"], e.d["count"], e.d["dtype"]));
                }
            }
            "ProxyOp" => {
                assert_eq!(st, [19], "rank {}: ProxyOp states (InProgress once)", r.rank);
                let nsteps = e.d["nsteps"].as_i64().expect("nsteps");
                let steps: Vec<i64> = e
                    .children
                    .iter()
                    .map(|c| &r.events[c])
                    .filter(|c| c.ty == "ProxyStep")
                    .map(|c| c.d["step"].as_i64().expect("step"))
                    .collect();
                assert_eq!(steps.len() as i64, nsteps, "rank {}: ProxyOp {:?} saw {} steps", r.rank, e.d, steps.len());
                assert_eq!(steps, (0..nsteps).collect::<Vec<_>>(), "steps numbered in order");
                let send = e.d["send"].as_bool().expect("send");
                let want: &[u64] = if send { &[8, 20, 9] } else { &[10, 11, 12] };
                for c in &e.children {
                    let s = &r.events[c];
                    assert_eq!(states(s), want, "rank {}: step states (send={send})", r.rank);
                    let size = s.states.last().map_or(0, |x| x.1["size"].as_u64().unwrap_or(0));
                    assert!(size > 0 && size <= e.d["chunk"].as_u64().unwrap_or(0), "trans size {size}");
                    // Over tcp every sent slice is one socket request under its step, with
                    // NCCL's socket payload.
                    let net: Vec<&Ev> = s.children.iter().map(|n| &r.events[n]).collect();
                    if tcp && send {
                        assert_eq!(net.len(), 1, "rank {}: a tcp send step has {} NetPlugin events", r.rank, net.len());
                        let d = &net[0].d;
                        assert_eq!((d["plugin_id"].as_i64(), d["data_len"].as_u64()), (Some(0x20001), Some(24)));
                        assert_eq!((d["kind"].as_u64(), d["op"].as_i64()), (Some(1), Some(0)));
                        assert_eq!(d["length"].as_u64(), Some(size), "socket request length = step size");
                        assert!(d["fd"].as_i64().unwrap_or(-1) > 2);
                    }
                    if !tcp {
                        assert!(net.is_empty(), "NetPlugin events over shm");
                    }
                    *per_type.entry("NetPlugin(child)").or_default() += net.len();
                }
                *per_peer.entry((e.d["peer"].as_u64().expect("peer") as usize, send)).or_default() += nsteps;
            }
            "ProxyCtrl" => {
                assert!(
                    matches!(st.as_slice(), [13] | [14] | [15, 16] | [17, 18]),
                    "rank {}: ProxyCtrl states {st:?}",
                    r.rank
                );
                if st == [17, 18] {
                    // AppendEnd counts the ProxyOps started inside the Append bracket.
                    let n = e.states[1].1["appended"].as_u64().expect("appended") as usize;
                    let inside = r.seq[e.order + 1..].iter().take_while(|i| r.events[i].ty == "ProxyOp").count();
                    assert_eq!(n, inside, "AppendEnd count");
                }
            }
            "ProxyStep" | "NetPlugin" => {} // checked with their ProxyOp
            _ => assert!(st.is_empty(), "{} has states {st:?}", e.ty),
        }
    }
    // 3 sizes × (2 all-reduce + 5 other collectives); 3 × (send + recv).
    assert_eq!(count.get("Coll"), Some(&21), "rank {}: {count:?}", r.rank);
    assert_eq!(count.get("P2p"), Some(&6), "rank {}: {count:?}", r.rank);
    assert_eq!(count.get("GroupApi"), Some(&27));
    assert_eq!(count.get("Group"), Some(&27));
    assert_eq!(count.get("CollApi"), Some(&21));
    assert!(count.get("ProxyStep").copied().unwrap_or(0) > 50, "{count:?}");
    if tcp {
        // Receives too are socket requests (most under their step).
        let all = count.get("NetPlugin").copied().unwrap_or(0);
        let under_steps = per_type.get("NetPlugin(child)").copied().unwrap_or(0);
        assert!(all > under_steps && under_steps > 0, "NetPlugin {all}, under steps {under_steps}");
    }
    (colls, per_peer)
}

fn load_dir(dir: &Path) -> Vec<Rank> {
    let mut ranks: Vec<Rank> =
        std::fs::read_dir(dir).expect("read dir").map(|e| load(&e.expect("entry").path())).collect();
    ranks.sort_by_key(|r| r.rank);
    ranks
}

fn run(nranks: usize, extra: &[(&str, &str)]) -> Vec<Rank> {
    let dir = scratch(&format!("events-{nranks}-{}", extra.len()));
    let dirs = dir.to_string_lossy().to_string();
    let mut vars = vec![("OCCL_TEST_EVENTS_DIR", dirs.as_str())];
    vars.extend_from_slice(extra);
    let outs = run_job(nranks, &["events"], Spawn { env: env(&vars), ..Spawn::default() }, Duration::from_secs(120));
    assert_all_ok(&outs, "events job");
    let mut ranks: Vec<Rank> =
        std::fs::read_dir(&dir).expect("read dir").map(|e| load(&e.expect("entry").path())).collect();
    ranks.sort_by_key(|r| r.rank);
    assert_eq!(ranks.len(), nranks, "one event file per rank");
    let _ = std::fs::remove_dir_all(&dir);
    ranks
}

fn check_job(ranks: &[Rank], tcp: bool) {
    let per: Vec<_> = ranks.iter().map(|r| check_rank(r, tcp)).collect();
    // Every rank saw the same collectives with the same sequence numbers.
    for (r, (colls, _)) in per.iter().enumerate() {
        assert_eq!(colls, &per[0].0, "rank {r}'s Coll sequence differs from rank 0's");
    }
    // Slices rank a sent to b equal the slices b received from a.
    for (a, (_, pa)) in per.iter().enumerate() {
        for (&(b, send), &k) in pa {
            if send {
                let back = per[b].1.get(&(a, false)).copied().unwrap_or(0);
                assert_eq!(k, back, "{a} sent {k} slices to {b}, which received {back}");
            }
        }
    }
}

/// Two communicators in one process (3 + 2 ranks, one thread each) run every operation at the same time; one
/// registered profiler gets a sink per communicator rank, and each sees its own complete tree.
#[test]
fn several_communicators_on_threads_keep_their_trees_apart() {
    let dir = scratch("events-threads");
    let prof: std::sync::Arc<dyn occl::telemetry::Profiler> =
        std::sync::Arc::new(occl_tests::events::Recorder { dir: dir.clone(), mask: occl::telemetry::EventMask::ALL });
    occl::telemetry::profiler::register(prof.clone());
    let (a, b) = std::thread::scope(|sc| {
        let ha = sc.spawn(|| occl::Comm::init_all(3).expect("comm A"));
        let hb = sc.spawn(|| occl::Comm::init_all(2).expect("comm B"));
        (ha.join().expect("A"), hb.join().expect("B"))
    });
    occl::telemetry::profiler::unregister(&prof);
    let ids = (a[0].id(), b[0].id());
    assert_ne!(ids.0, ids.1);
    std::thread::scope(|sc| {
        for c in a.iter().chain(b.iter()) {
            sc.spawn(move || occl_tests::events::every_operation(c).expect("operations"));
        }
    });
    for c in a.into_iter().chain(b) {
        c.destroy().expect("destroy");
    }
    let all = load_dir(&dir);
    assert_eq!(all.len(), 5, "one event file per communicator rank");
    for (id, n) in [(ids.0, 3), (ids.1, 2)] {
        let tag = format!("{id:016x}");
        let mut ranks: Vec<Rank> = Vec::new();
        for e in std::fs::read_dir(&dir).expect("read dir") {
            let p = e.expect("entry").path();
            if p.to_string_lossy().contains(&tag) {
                ranks.push(load(&p));
            }
        }
        ranks.sort_by_key(|r| r.rank);
        assert_eq!(ranks.len(), n, "communicator {tag}");
        check_job(&ranks, false);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The mask is read when an operation starts: a sink whose interest changes at run time (as an NCCL plugin
/// storing into the global mask) gets events exactly for the operations started while it wanted them.
#[test]
fn the_mask_changes_at_run_time() {
    use occl_tests::events::Counter;
    use std::sync::atomic::Ordering::Relaxed;
    let comms = occl::Comm::init_all(2).expect("comms");
    let counters: Vec<std::sync::Arc<Counter>> = comms
        .iter()
        .map(|c| {
            let k = std::sync::Arc::new(Counter::default());
            c.attach_sink(k.clone()).expect("attach");
            k
        })
        .collect();
    let round = |comms: &[occl::Comm]| {
        std::thread::scope(|sc| {
            for c in comms {
                sc.spawn(move || {
                    let mut v = vec![1.0f32; 1 << 16];
                    c.all_reduce_in_place(&mut v, occl::RedOp::Sum).expect("all-reduce");
                });
            }
        })
    };
    round(&comms);
    assert!(counters.iter().all(|k| k.total() == 0), "events with an empty mask");
    for k in &counters {
        k.mask.store(occl::telemetry::EventMask::of(occl::telemetry::EventType::ProxyStep).0, Relaxed);
    }
    round(&comms);
    let on: Vec<u64> = counters.iter().map(|k| k.starts.load(Relaxed)).collect();
    // GroupApi, CollApi, Group, Coll, two ProxyOps and at least one ProxyStep each way.
    assert!(on.iter().all(|n| *n >= 8), "ProxySteps and their ancestors: {on:?}");
    for k in &counters {
        k.mask.store(0, Relaxed);
    }
    round(&comms);
    let off: Vec<u64> = counters.iter().map(|k| k.starts.load(Relaxed)).collect();
    assert_eq!(on, off, "events after the mask went back to 0");
    for c in comms {
        c.destroy().expect("destroy");
    }
}

#[test]
fn shm_job_emits_nccls_tree() {
    check_job(&run(3, &[]), false);
}

#[test]
fn shm_job_with_small_slots_and_single_copy_off() {
    // Many slices per operation and every slice through the FIFO: the plan must still match.
    check_job(&run(4, &[("OCCL_SHM_SLOT_SIZE", "4096"), ("OCCL_SHM_DIRECT", "0")]), false);
}

#[test]
fn tcp_job_emits_nccls_tree() {
    // Small slots: many slices per operation, so FIFOs fill and waits block (Sleep/Wakeup).
    check_job(&run(2, &[("OCCL_TRANSPORT", "tcp"), ("OCCL_TCP_SLOT_SIZE", "8192"), ("OCCL_FIFO_SLOTS", "4")]), true);
}

/// Trees, PAT and one-shot announce what they really send: with each forced (and small slots,
/// so pieces and both all-reduce trees come into play), the steps seen equal the planned ones on
/// every rank, sends match receives across ranks, and Coll names NCCL's algorithm.
#[test]
fn forced_trees_pat_and_one_shot_emit_matching_steps() {
    let small = [("OCCL_SHM_SLOT_SIZE", "4096"), ("OCCL_SHM_DIRECT", "0")];
    for (algo, want) in [
        (
            "ring;allreduce:tree;broadcast:tree;reduce:tree;allgather:pat;reducescatter:pat",
            [
                ("AllReduce", "TREE"),
                ("Broadcast", "TREE"),
                ("Reduce", "TREE"),
                ("AllGather", "PAT"),
                ("ReduceScatter", "PAT"),
            ],
        ),
        (
            "ring;allreduce:oneshot",
            [
                ("AllReduce", "ONE_SHOT"),
                ("Broadcast", "RING"),
                ("Reduce", "RING"),
                ("AllGather", "RING"),
                ("ReduceScatter", "RING"),
            ],
        ),
    ] {
        let mut vars = small.to_vec();
        vars.push(("OCCL_ALGO", algo));
        let ranks = run(5, &vars);
        check_job(&ranks, false);
        for r in &ranks {
            for e in r.events.values().filter(|e| e.ty == "Coll") {
                let func = e.d["func"].as_str().unwrap_or("");
                if let Some((_, a)) = want.iter().find(|(f, _)| *f == func) {
                    assert_eq!(e.d["algo"], *a, "rank {} {func} with OCCL_ALGO={algo}", r.rank);
                    // Small operations may run LL where each rank has a core of its own.
                    assert!(["SIMPLE", "LL"].contains(&e.d["proto"].as_str().unwrap_or("")), "{:?}", e.d["proto"]);
                }
            }
        }
    }
}
