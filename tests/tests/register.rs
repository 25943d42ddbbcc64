//! Buffer registration (`Comm::register`): registered all-reduce, reduce-scatter and all-gather
//! give the same bits as the normal path for process ranks over shm and for thread ranks;
//! windows are inactive where peers cannot reach each other's memory; errors are collective and
//! typed; a killed or mismatched peer ends in an error, not a hang or a wrong result.

mod common;

use common::{assert_all_ok, env, err_of, run_job, worker};
use occl_tests::launch::{Job, Spawn};
use std::time::{Duration, Instant};

fn spawn(pairs: &[(&str, &str)]) -> Spawn {
    Spawn { env: env(pairs), ..Spawn::default() }
}

#[test]
fn process_ranks_registered_matches_unregistered() {
    // 3 ranks with helper threads forced (the rank's share of a 2-core machine starts none).
    for (n, helpers) in [(2, None), (3, Some("3")), (4, None)] {
        let mut vars = vec![("OCCL_TIMEOUT", "60")];
        vars.extend(helpers.map(|h| ("OCCL_REG_THREADS", h)));
        let outs = run_job(n, &["register", "host", "shared"], spawn(&vars), Duration::from_secs(240));
        assert_all_ok(&outs, &format!("{n} process ranks, HostBuf windows, OCCL_REG_THREADS={helpers:?}"));
    }
}

#[test]
fn process_ranks_with_plain_buffers_are_inactive() {
    let outs = run_job(2, &["register", "vec", "inactive"], spawn(&[("OCCL_TIMEOUT", "60")]), Duration::from_secs(120));
    assert_all_ok(&outs, "plain Vec buffers in two processes");
}

#[test]
fn tcp_windows_are_inactive() {
    let outs = run_job(
        3,
        &["register", "host", "inactive"],
        spawn(&[("OCCL_TRANSPORT", "tcp"), ("OCCL_TIMEOUT", "60")]),
        Duration::from_secs(180),
    );
    assert_all_ok(&outs, "OCCL_TRANSPORT=tcp");
}

#[test]
fn thread_ranks_registered_matches_unregistered() {
    // The last two with helper threads forced (one rank's share of the 2-core CI machine
    // starts none): in the same process, every rank has its own.
    for (n, host, helpers) in
        [(2, false, None), (3, false, None), (4, false, None), (3, true, Some(2)), (2, false, Some(1))]
    {
        let config = occl::Config { reg_threads: helpers, ..occl::Config::from_env().expect("config") };
        let comms = occl::Comm::init_all_with(n, config).expect("init_all");
        let results: Vec<_> = std::thread::scope(|s| {
            let hs: Vec<_> =
                comms.iter().map(|c| s.spawn(move || occl_tests::register::all(c, host, true, helpers))).collect();
            hs.into_iter().map(|h| h.join().expect("rank thread")).collect()
        });
        // Every rank's error, not only the first joined: the root cause is usually another rank's.
        let errors: Vec<String> = results
            .iter()
            .enumerate()
            .filter_map(|(r, x)| x.as_ref().err().map(|e| format!("rank {r}: {e}")))
            .collect();
        assert!(errors.is_empty(), "{n} thread ranks (HostBuf: {host}):\n{}", errors.join("\n"));
        let wrong: Vec<String> = results.into_iter().flatten().flatten().collect();
        assert!(wrong.is_empty(), "{n} thread ranks (HostBuf: {host}):\n{}", wrong.join("\n"));
        for c in comms {
            c.destroy().expect("destroy");
        }
    }
}

#[test]
fn a_bad_helper_thread_count_is_refused_by_its_name() {
    for bad in ["17", "many", "-1"] {
        let outs =
            run_job(2, &["register", "host", "shared"], spawn(&[("OCCL_REG_THREADS", bad)]), Duration::from_secs(60));
        for o in &outs {
            let (kind, _, line) = err_of(o)
                .unwrap_or_else(|| panic!("OCCL_REG_THREADS={bad}: rank {} did not fail:\n{}", o.rank, o.output));
            assert_eq!(kind, "InvalidArgument", "{line}");
            assert!(line.contains("OCCL_REG_THREADS") && line.contains(bad), "{line}");
        }
    }
}

#[test]
fn unregistered_rank_among_registered_ones_fails_every_rank() {
    let start = Instant::now();
    let opts = Spawn { capture_stdout: true, capture_stderr: true, ..spawn(&[("OCCL_TIMEOUT", "3")]) };
    let job = Job::spawn(worker(), &["register-mixed".to_string()], 3, &opts).expect("start");
    let pids: Vec<u32> = job.children.iter().map(|c| c.id()).collect();
    let outs = job.wait(Duration::from_secs(60)).expect("job ends");
    // Rank 0 created shm FIFOs that the registered ranks never attached (they failed first):
    // they went when those ranks' communicators ended.
    assert_eq!(common::shm_files_of(&pids), Vec::<String>::new(), "left in /dev/shm");
    let mut named = false;
    for o in &outs {
        assert!(!o.output.contains("RESULT"), "rank {} returned a result:\n{}", o.rank, o.output);
        let (_, _, line) = err_of(o).unwrap_or_else(|| panic!("rank {} did not fail:\n{}", o.rank, o.output));
        named |= line.contains("registered buffers");
    }
    assert!(named, "no rank's error names the likely cause: {outs:#?}");
    assert!(start.elapsed() < Duration::from_secs(30), "took {:?}", start.elapsed());
}

#[test]
fn killed_peer_fails_survivors_within_timeout() {
    let spawn =
        Spawn { env: env(&[("OCCL_TIMEOUT", "5")]), capture_stdout: true, capture_stderr: true, ..Spawn::default() };
    let job = Job::spawn(worker(), &["register-loop".to_string()], 3, &spawn).expect("start");
    job.wait_for_all("LOOPING", Duration::from_secs(60)).expect("ranks loop");
    let pids: Vec<u32> = job.children.iter().map(|c| c.id()).collect();
    job.signal(1, libc::SIGKILL).expect("kill rank 1");
    let killed = Instant::now();
    let outs = job.wait(Duration::from_secs(60)).expect("job ends");
    let took = killed.elapsed();
    for o in outs.iter().filter(|o| o.rank != 1) {
        let (kind, _, line) = err_of(o).unwrap_or_else(|| panic!("rank {} did not fail:\n{}", o.rank, o.output));
        assert!(kind == "RemoteError" || kind == "Timeout", "rank {}: {line}", o.rank);
    }
    assert!(took < Duration::from_secs(5 + 10), "survivors took {took:?}");
    // Host buffers are memory files with no name, so the killed rank leaves nothing behind.
    assert_eq!(common::shm_files_of(&pids), Vec::<String>::new(), "left in /dev/shm");
}

/// Records the algorithm of every Coll event and counts ProxyOps.
#[derive(Default)]
struct Colls {
    algos: std::sync::Mutex<Vec<(String, String)>>,
    proxy_ops: std::sync::atomic::AtomicUsize,
}

impl occl::telemetry::Sink for Colls {
    fn interest(&self) -> occl::telemetry::EventMask {
        occl::telemetry::EventMask::ALL
    }
    fn start(
        &self,
        _: occl::telemetry::EventId,
        _: Option<occl::telemetry::EventId>,
        ev: &occl::telemetry::EventDescr<'_>,
    ) {
        match ev {
            occl::telemetry::EventDescr::Coll { func, algo, .. } => {
                self.algos.lock().expect("lock").push((func.to_string(), algo.to_string()))
            }
            occl::telemetry::EventDescr::ProxyOp { .. } => {
                self.proxy_ops.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            _ => {}
        }
    }
}

/// The profiler sees a registered operation as a Coll event with algorithm "registered" (and no
/// ProxyOp: no FIFO moves its data); an unregistered one as a FIFO algorithm, with ProxyOps.
#[test]
fn profiler_sees_registered_operations() {
    let comms = occl::Comm::init_all(2).expect("init_all");
    let sinks: Vec<std::sync::Arc<Colls>> = comms
        .iter()
        .map(|c| {
            let s = std::sync::Arc::new(Colls::default());
            c.attach_sink(s.clone()).expect("attach");
            s
        })
        .collect();
    std::thread::scope(|sc| {
        for c in &comms {
            sc.spawn(move || {
                let mut reg = vec![1.0f32; 4096];
                let h = c.register(&reg[..]).expect("register");
                assert!(h.shared());
                c.all_reduce_in_place(&mut reg, occl::RedOp::Sum).expect("registered all-reduce");
                assert_eq!(reg[0], 2.0);
                let mut plain = vec![1.0f32; 4096];
                c.all_reduce_in_place(&mut plain, occl::RedOp::Sum).expect("all-reduce");
                c.deregister(h).expect("deregister");
            });
        }
    });
    for (r, s) in sinks.iter().enumerate() {
        let algos = s.algos.lock().expect("lock").clone();
        assert_eq!(algos.len(), 2, "rank {r}: {algos:?}");
        assert_eq!(algos[0], ("AllReduce".to_string(), "registered".to_string()), "rank {r}");
        assert_ne!(algos[1].1, "registered", "rank {r}");
        assert!(s.proxy_ops.load(std::sync::atomic::Ordering::Relaxed) > 0, "the normal path's ProxyOps");
    }
    for c in comms {
        c.destroy().expect("destroy");
    }
}

#[test]
fn a_rank_blocked_in_a_registered_collective_names_the_peer_it_waits_for() {
    let comms = occl::Comm::init_all(2).expect("init_all");
    let (go, gate) = std::sync::mpsc::channel::<()>();
    let gate = std::sync::Mutex::new(gate);
    let seen = std::thread::scope(|s| {
        let ranks: Vec<_> = comms
            .iter()
            .map(|c| {
                let gate = &gate;
                s.spawn(move || -> occl::Result<Vec<f32>> {
                    let send = vec![c.rank() as f32 + 1.0; 1024];
                    let mut recv = vec![0f32; 1024];
                    let hs = c.register(&send[..])?;
                    let hr = c.register(&recv[..])?;
                    if c.rank() == 1 {
                        // Rank 0 enters first and must wait for this rank's buffers.
                        let _ = gate.lock().map(|g| g.recv_timeout(Duration::from_secs(20)));
                    }
                    c.all_reduce(&send, &mut recv, occl::RedOp::Sum)?;
                    c.deregister(hs)?;
                    c.deregister(hr)?;
                    Ok(recv)
                })
            })
            .collect();
        // Rank 0's record shows the all-reduce in flight, waiting on rank 1 for its buffers.
        let t = Instant::now();
        let mut seen = None;
        while t.elapsed() < Duration::from_secs(15) {
            if let Some(f) = comms[0].record().in_flight() {
                if f.peer.is_some() {
                    seen = Some(f);
                    break;
                }
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        let _ = go.send(());
        for h in ranks {
            let recv = h.join().expect("rank thread").expect("the all-reduce completes");
            assert!(recv.iter().all(|&x| x == 3.0), "sum of 1 and 2");
        }
        seen
    });
    let f = seen.expect("rank 0's record never named the peer it waits for");
    assert_eq!(f.coll, occl::CollType::AllReduce);
    assert_eq!(f.peer, Some(1));
    assert_eq!(f.step_state, Some(20), "NCCL's SendPeerWait: the peer's buffers are not posted");
    assert_eq!(comms[0].record().in_flight().map(|f| f.seq), None, "nothing in flight afterwards");
    let last = comms[0].flight_recorder().snapshot().into_iter().max_by_key(|e| e.record_id).map(|e| e.info.algo);
    assert_eq!(last, Some("registered"));
    for c in comms {
        c.destroy().expect("destroy");
    }
}
