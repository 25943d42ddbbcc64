//! Groups: grouped send/recv patterns that deadlock one call at a time (a receive-first ring
//! shift larger than a FIFO, all-to-all from grouped sends and receives), all-to-allv, gather
//! and scatter, in real processes over shm, tcp and both; one thread driving every rank of a
//! communicator through one group; the profiler's view of a group; and misuse.

mod common;

use common::{assert_all_ok, env, run_job};
use occl::telemetry::{EventDescr, EventId, EventMask, Sink, StateArgs};
use occl::{Comm, Config, DataType, ErrorKind, RedOp};
use occl_tests::launch::Spawn;
use std::sync::{Arc, Mutex};
use std::time::Duration;

#[test]
fn grouped_p2p_all_to_allv_gather_scatter_in_processes_shm_tcp_and_mixed() {
    let cases: [(usize, &str, Spawn); 4] = [
        (2, "shm", Spawn::default()),
        (4, "shm", Spawn::default()),
        (3, "tcp", Spawn { env: env(&[("OCCL_TRANSPORT", "tcp")]), ..Spawn::default() }),
        (
            4,
            "shm+tcp",
            Spawn {
                rank_env: ["a", "a", "b", "b"].iter().map(|h| env(&[("OCCL_HOSTID", h)])).collect(),
                ..Spawn::default()
            },
        ),
    ];
    for (n, transport, spawn) in cases {
        let spawn = Spawn { env: [spawn.env, env(&[("OCCL_TIMEOUT", "30")])].concat(), ..spawn };
        let outs = run_job(n, &["groups"], spawn, Duration::from_secs(60));
        assert_all_ok(&outs, &format!("groups n={n} {transport}"));
        for o in &outs {
            assert!(o.output.contains(&format!("transport={transport}")), "{}", o.output);
        }
    }
}

/// Every rank of an `init_all` communicator on one thread: only a group can drive them all.
#[test]
fn one_thread_drives_every_rank_through_one_group() {
    let n = 3;
    let comms = Comm::init_all_with(n, Config::default()).expect("init_all");
    let len = 300_000; // > one FIFO of 8 × 256 KiB in f32
    let outs: Vec<Vec<f32>> = (0..n).map(|r| vec![r as f32 + 1.0; len]).collect();
    let mut ins: Vec<Vec<f32>> = (0..n).map(|_| vec![0f32; len]).collect();
    let sums: Vec<Vec<f64>> = (0..n).map(|r| vec![r as f64; 1000]).collect();
    let mut reds: Vec<Vec<f64>> = (0..n).map(|_| vec![0f64; 1000]).collect();
    occl::group(|g| {
        for (r, ((c, o), (i, (s, d)))) in
            comms.iter().zip(&outs).zip(ins.iter_mut().zip(sums.iter().zip(reds.iter_mut()))).enumerate()
        {
            g.all_reduce(c, s, d, RedOp::Sum)?;
            g.recv(c, i, (r + n - 1) % n)?;
            g.send(c, o, (r + 1) % n)?;
        }
        Ok(())
    })
    .expect("group over three ranks");
    for r in 0..n {
        let prev = (r + n - 1) % n;
        assert!(ins[r].iter().all(|&v| v == prev as f32 + 1.0), "rank {r} got the wrong block");
        assert!(reds[r].iter().all(|&v| v == 3.0), "rank {r} all-reduce");
    }
    for c in comms {
        c.destroy().expect("destroy");
    }
}

/// One event's start: id, parent, type, and the GroupApi depth or the Coll/P2p parentGroup.
type Started = (u64, Option<u64>, String, i64);

/// The start and parent of every event a sink saw, and the states of GroupApi events.
#[derive(Default)]
struct Tape {
    events: Mutex<Vec<Started>>,
    states: Mutex<Vec<(u64, u32)>>,
}

impl Sink for Tape {
    fn interest(&self) -> EventMask {
        EventMask::ALL
    }
    fn start(&self, id: EventId, parent: Option<EventId>, ev: &EventDescr<'_>) {
        let extra = match *ev {
            EventDescr::GroupApi { group_depth, .. } => group_depth as i64,
            EventDescr::P2p { parent_group, .. } | EventDescr::Coll { parent_group, .. } => {
                parent_group.map_or(-1, |g| g.get() as i64)
            }
            _ => 0,
        };
        let mut e = self.events.lock().expect("tape");
        e.push((id.get(), parent.map(EventId::get), ev.event_type().name().to_string(), extra));
    }
    fn state(&self, id: EventId, st: &StateArgs<'_>) {
        if let StateArgs::GroupApi { .. } = st {
            self.states.lock().expect("tape").push((id.get(), st.state_raw()));
        }
    }
}

#[test]
fn a_group_is_one_group_api_enclosing_each_call_and_its_depth_counts_nesting() {
    let n = 2;
    let comms = Comm::init_all_with(n, Config::default()).expect("init_all");
    let tapes: Vec<Arc<Tape>> = comms.iter().map(|_| Arc::new(Tape::default())).collect();
    for (c, t) in comms.iter().zip(&tapes) {
        c.attach_sink(t.clone()).expect("attach");
    }
    std::thread::scope(|s| {
        for c in &comms {
            s.spawn(move || {
                let (r, peer) = (c.rank(), 1 - c.rank());
                let out = vec![r as u8; 1 << 20];
                let mut inp = vec![0u8; 1 << 20];
                let mut v = vec![1u32; 64];
                // Depth 2 (the user's group + NCCL's implicit one), then 3 when nested.
                occl::group(|g| {
                    g.recv(c, &mut inp, peer)?;
                    g.send(c, &out, peer)
                })
                .expect("group");
                occl::group_start();
                occl::group_start();
                // SAFETY: the buffers outlive group_end below.
                unsafe {
                    c.all_reduce_raw(v.as_ptr().cast(), v.as_mut_ptr().cast(), 64, DataType::U32, RedOp::Sum)
                        .expect("all_reduce_raw");
                    c.send_raw(out.as_ptr(), 100, DataType::U8, peer).expect("send_raw");
                    c.recv_raw(inp.as_mut_ptr(), 100, DataType::U8, peer).expect("recv_raw");
                }
                occl::group_end().expect("inner end");
                assert_eq!(occl::group_depth(), 1);
                occl::group_end().expect("outer end");
                assert_eq!(v, vec![2u32; 64]);
            });
        }
    });
    for (r, t) in tapes.iter().enumerate() {
        let ev = t.events.lock().expect("tape").clone();
        let states = t.states.lock().expect("tape").clone();
        let of = |ty: &str| ev.iter().filter(|e| e.2 == ty).cloned().collect::<Vec<_>>();
        let group_apis = of("GroupApi");
        assert_eq!(group_apis.len(), 2, "rank {r}: one GroupApi per group: {group_apis:?}");
        assert_eq!(group_apis.iter().map(|g| g.3).collect::<Vec<_>>(), [2, 3], "rank {r}: depths");
        for g in &group_apis {
            let st: Vec<u32> = states.iter().filter(|s| s.0 == g.0).map(|s| s.1).collect();
            assert_eq!(st, [23, 24], "rank {r}: GroupApi states StartApiStop, EndApiStart");
        }
        // Each call's API event under its group's GroupApi: 2 P2pApi in the first, 1 CollApi
        // and 2 P2pApi in the second.
        let under = |g: u64, ty: &str| ev.iter().filter(|e| e.1 == Some(g) && e.2 == ty).count();
        assert_eq!((under(group_apis[0].0, "P2pApi"), under(group_apis[0].0, "CollApi")), (2, 0), "rank {r}");
        assert_eq!((under(group_apis[1].0, "P2pApi"), under(group_apis[1].0, "CollApi")), (2, 1), "rank {r}");
        // Every P2p/Coll hangs under an API event and names one of the two Group events.
        let groups: Vec<u64> = of("Group").iter().map(|g| g.0).collect();
        assert_eq!(groups.len(), 2, "rank {r}: one Group per launch");
        for e in of("P2p").iter().chain(&of("Coll")) {
            let parent = e.1.and_then(|p| ev.iter().find(|x| x.0 == p)).map(|x| x.2.clone());
            assert!(matches!(parent.as_deref(), Some("P2pApi" | "CollApi")), "rank {r}: {e:?} under {parent:?}");
            assert!(groups.contains(&(e.3 as u64)), "rank {r}: {e:?} names no Group");
        }
        assert_eq!(of("P2p").len(), 4, "rank {r}");
        assert_eq!(of("Coll").len(), 1, "rank {r}");
        // 1 MiB in 256 KiB slices: the first group's ProxyOps carry 4 steps each way.
        assert!(of("ProxyStep").len() >= 8, "rank {r}: {} ProxySteps", of("ProxyStep").len());
    }
    for c in comms {
        c.destroy().expect("destroy");
    }
}

#[test]
fn group_misuse_is_invalid_usage() {
    let kind = |r: occl::Result<()>| r.expect_err("expected an error").kind();
    assert_eq!(kind(occl::group_end()), ErrorKind::InvalidUsage);
    let comms = Comm::init_all_with(2, Config::default()).expect("init_all");
    std::thread::scope(|s| {
        for c in &comms {
            s.spawn(move || {
                let peer = 1 - c.rank();
                let a = [1.0f32; 8];
                let mut b = [0f32; 8];
                // A slice method inside group_start: refused, not deferred.
                occl::group_start();
                let e = c.send(&a, peer).expect_err("slice send in a group");
                assert_eq!(e.kind(), ErrorKind::InvalidUsage);
                assert!(e.to_string().contains("occl::group"), "{e}");
                assert_eq!(kind(c.all_reduce(&a, &mut b, RedOp::Sum)), ErrorKind::InvalidUsage);
                assert_eq!(
                    kind(c.all_to_allv(&a, &[4, 4], &[0, 4], &mut b, &[4, 4], &[0, 4])),
                    ErrorKind::InvalidUsage
                );
                // occl::group inside an open group, and split/shrink inside a group.
                assert_eq!(kind(occl::group(|_| Ok(()))), ErrorKind::InvalidUsage);
                assert_eq!(c.split(0, 0).expect_err("split in a group").kind(), ErrorKind::InvalidUsage);
                assert_eq!(
                    c.shrink(&[peer], occl::ShrinkMode::Default).expect_err("shrink in a group").kind(),
                    ErrorKind::InvalidUsage
                );
                occl::group_end().expect("empty group ends");
                // A closure that leaves a group_start open: nothing it collected runs.
                let e = occl::group(|g| {
                    g.send(c, &a, peer)?;
                    occl::group_start();
                    Ok(())
                })
                .expect_err("unbalanced closure");
                assert_eq!(e.kind(), ErrorKind::InvalidUsage);
                assert_eq!(occl::group_depth(), 0, "the closure's group is closed again");
                // A closure that fails: nothing it collected runs either.
                let e = occl::group(|g| {
                    g.send(c, &a, peer)?;
                    g.send(c, &a, 7)
                })
                .expect_err("bad peer");
                assert_eq!(e.kind(), ErrorKind::InvalidArgument);
                // Unmatched sends to itself in a group.
                let e = occl::group(|g| g.send(c, &a, c.rank())).expect_err("self send alone");
                assert_eq!(e.kind(), ErrorKind::InvalidUsage);
            });
        }
    });
    // The communicators failed on the unmatched self send (as a failed group fails the
    // communicator); a fresh pair still runs a clean group with self sends.
    drop(comms);
    let comms = Comm::init_all_with(2, Config::default()).expect("init_all");
    std::thread::scope(|s| {
        for c in &comms {
            s.spawn(move || {
                let a = [c.rank() as f32; 8];
                let mut b = [9f32; 8];
                occl::group(|g| {
                    g.recv(c, &mut b, c.rank())?;
                    g.send(c, &a, c.rank())
                })
                .expect("self send/recv pair");
                assert_eq!(b, a);
                // Nothing was left over from before: a plain collective works.
                let mut v = [1u8; 4];
                c.all_reduce_in_place(&mut v, RedOp::Sum).expect("all_reduce");
                assert_eq!(v, [2; 4]);
            });
        }
    });
}

/// A group blocked on a peer that never sends: `abort()` from a watchdog thread ends it (and
/// the peer learns of it) well within a second.
#[test]
fn abort_ends_a_blocked_group() {
    let comms = Comm::init_all_with(2, Config::default()).expect("init_all");
    let (c0, c1) = (&comms[0], &comms[1]);
    std::thread::scope(|s| {
        let blocked = s.spawn(move || {
            let mut inp = vec![0f32; 1 << 20];
            let out = vec![1f32; 1 << 20];
            let start = std::time::Instant::now();
            let e = occl::group(|g| {
                g.send(c0, &out, 1)?;
                g.recv(c0, &mut inp, 1)
            })
            .expect_err("rank 1 never takes part");
            (e, start.elapsed())
        });
        s.spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            c0.abort();
        });
        let (e, took) = blocked.join().expect("blocked thread");
        assert_eq!(e.kind(), ErrorKind::InvalidUsage, "{e}");
        assert!(e.to_string().contains("aborted"), "{e}");
        assert!(took < Duration::from_millis(1300), "returned {took:?} after its start (abort at 300 ms)");
        // Rank 1, which was never in a call, fails its next call: on rank 0's abort, or on the
        // send rank 0 had posted before it (data published before a failure is delivered).
        let mut v = [1u8; 4];
        let e = c1.all_reduce_in_place(&mut v, RedOp::Sum).expect_err("peer aborted");
        assert!(matches!(e.kind(), ErrorKind::RemoteError | ErrorKind::InvalidUsage), "{e}");
    });
}
