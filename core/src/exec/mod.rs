//! The executor: runs one checked operation on its communicator. The tuner picks the algorithm
//! and protocol; right after it, the executor that moves the data: the registered one when both
//! buffers lie in active windows (`register`), else the algorithm's schedule over the transport
//! (`coll`, `Ctx`). It stamps the operation's sequence number, rank record, flight record and
//! profiler events, runs it, and on failure poisons the communicator so that every peer learns
//! why. A closed group runs its operations here too (`group.rs`, with
//! its sends and receives batched by `p2p.rs`), never through the public API.

pub(crate) mod group;
mod p2p;

use crate::coll::algo::{Algo, Proto};
use crate::coll::plan;
use crate::coll::shape::Shape;
use crate::coll::tune::Choice;
use crate::coll::{self, Ctx};
use crate::comm::Comm;
use crate::dtype::RedOp;
use crate::error::Result;
use crate::op::{nccl_func, Op, NO_OP, NO_ROOT};
use crate::profile::{op::OpDescr, OpProf, Tally};
use crate::record::{self, CollType};
use crate::register::{InPlace, Plan};
use crate::transport::fifo::Desc;
use crate::wait::{Deadline, Drive};
use occl_telemetry::flight::{OpInfo, RootOrPeer};
use occl_telemetry::prometheus::{OpLabels, OpSlot};

/// Runs `o` on `comm` now (the caller's thread, no group open or the group being run).
pub(crate) fn run(comm: &Comm, o: &Op) -> Result<()> {
    let block = o.count * o.dt.size();
    let total = match o.coll {
        CollType::AllGather | CollType::ReduceScatter | CollType::AllToAll => block * comm.nranks(),
        _ => block,
    };
    // Before anything is stamped: a forced choice that is not supported fails the call alone,
    // on every rank alike, and leaves the communicator usable.
    let choice = comm.tuner.choose(o.coll, block)?;
    let executor = match registered(comm, o, block, total)? {
        Some(plan) => Executor::Registered(plan),
        None => Executor::Fifos,
    };
    stamp(comm, o, total, choice, &executor)
}

/// What moves an operation's data once the tuner has picked its algorithm and protocol.
enum Executor<'c> {
    /// The algorithm's schedule over the FIFOs (`coll`).
    Fifos,
    /// Loads and stores on every rank's registered buffers (`register`): the call's send and
    /// recv buffers lie in active windows, and its collective has a registered form.
    Registered(Plan<'c>),
}

/// Runs `o` with `algo` over the FIFOs of `c`.
fn on_fifos(c: &mut Ctx<'_>, o: &Op, algo: Algo) -> Result<()> {
    let (send, recv) = (o.send as *const u8, o.recv as *mut u8);
    let (block, root) = (o.count * o.dt.size(), o.root.unwrap_or(0));
    match o.coll {
        CollType::AllReduce => coll::all_reduce(c, algo, send, recv, o.count),
        CollType::Broadcast | CollType::Reduce => coll::rooted_coll(c, o.coll, algo, (send, recv), o.count, root),
        CollType::AllGather => coll::all_gather(c, algo, send, recv, o.count),
        CollType::ReduceScatter => coll::reduce_scatter(c, algo, send, recv, o.count),
        CollType::AllToAll => coll::direct::all_to_all(c, send, recv, block),
        CollType::Send => coll::direct::send(c, send, block, o.peer.unwrap_or(0)),
        CollType::Recv => coll::direct::recv(c, recv, block, o.peer.unwrap_or(0)),
    }
}

/// The registered path of an all-reduce, all-gather or reduce-scatter whose send and recv
/// buffers lie in active windows; `None` for the normal path.
fn registered<'c>(comm: &'c Comm, o: &Op, block: usize, total: usize) -> Result<Option<Plan<'c>>> {
    if !comm.reg.any() {
        return Ok(None);
    }
    let (send, recv, rank) = (o.send, o.recv, comm.rank());
    // What every rank's registered call must agree on (all-gather has no operator).
    let desc = [o.coll as u64, o.count as u64, o.dt as u64, o.op.unwrap_or(RedOp::Sum) as u64];
    let (s, r, layout, desc) = match o.coll {
        CollType::AllReduce => ((send, block), (recv, block), InPlace::No, &desc[..]),
        CollType::AllGather => {
            let layout = if send == recv + rank * block { InPlace::Gather(block) } else { InPlace::No };
            ((send, block), (recv, total), layout, &desc[..3])
        }
        CollType::ReduceScatter => {
            let layout = if recv == send + rank * block { InPlace::Scatter(block) } else { InPlace::No };
            ((send, total), (recv, block), layout, &desc[..])
        }
        _ => return Ok(None),
    };
    comm.reg.plan(rank, s, r, layout, desc)
}

fn reg_env(comm: &Comm) -> crate::register::Env<'_> {
    // Registered windows are active only with every rank on this host: the tuner's "shared"
    // link is this host's verdict (decided at init).
    crate::register::Env {
        rank: comm.rank(),
        pids: &comm.pids,
        abort: &comm.abort,
        deadline: Deadline::after(comm.config.timeout),
        patience: if comm.tuner.oversubscribed() { crate::wait::Patience::Share } else { crate::wait::Patience::Eager },
        threads: comm.config.reg_threads,
        host_share: comm.host_share,
        record: &comm.record,
    }
}

/// Bytes an operation reads from its input and writes to its output (`per_rank` = count ×
/// element size, `total` = what the record stamps).
fn io_bytes(coll: CollType, per_rank: usize, total: usize) -> (u64, u64) {
    let (i, o) = match coll {
        CollType::AllGather => (per_rank, total),
        CollType::ReduceScatter => (total, per_rank),
        CollType::Send => (per_rank, 0),
        CollType::Recv => (0, per_rank),
        _ => (total, total),
    };
    (i as u64, o as u64)
}

/// Runs one operation with `choice` on `executor`: checks the sticky error, stamps the record,
/// runs it, and on failure tells every peer. `bytes` is what the record counts.
fn stamp(comm: &Comm, o: &Op, bytes: usize, choice: Choice, executor: &Executor<'_>) -> Result<()> {
    let Op { coll, count, dt, op, root, peer: p2p_peer, send, recv } = *o;
    let algo = choice.algo;
    let registered = matches!(executor, Executor::Registered(_));
    let algo_name = if registered { crate::register::ALGO } else { algo.name() };
    let mut g = comm.lock_usable()?;
    let opseq = match (coll, p2p_peer) {
        (CollType::Send, Some(p)) => {
            g.p2p_sent[p] = g.p2p_sent[p].wrapping_add(1);
            g.p2p_sent[p]
        }
        (CollType::Recv, Some(p)) => {
            g.p2p_received[p] = g.p2p_received[p].wrapping_add(1);
            g.p2p_received[p]
        }
        _ => {
            g.coll_seq = g.coll_seq.wrapping_add(1);
            g.coll_seq
        }
    };
    // A receive checks against what the sender stamps: a Send.
    let wire_coll = if coll == CollType::Recv { CollType::Send } else { coll };
    let desc = Desc::new(
        wire_coll as u8,
        opseq,
        count as u64,
        dt as u8,
        op.map_or(NO_OP, |o| o as u8),
        root.map_or(NO_ROOT, |r| r as u32),
    );
    let t0 = record::now_ns();
    let seq = comm.record.launch(coll, bytes as u64, t0);
    g.func_seq[coll as usize] += 1;
    let (in_bytes, out_bytes) = io_bytes(coll, count * dt.size(), bytes);
    let flight = comm.flight.enqueue(
        &OpInfo {
            seq,
            coll_seq: g.func_seq[coll as usize],
            op: nccl_func(coll),
            dtype: dt.nccl_name(),
            redop: op.map(RedOp::name),
            count: count as u64,
            in_bytes,
            out_bytes,
            root_or_peer: match (root, p2p_peer) {
                (Some(r), _) => Some(RootOrPeer::Root(r as u32)),
                (_, Some(p)) => Some(RootOrPeer::Peer(p as u32)),
                _ => None,
            },
            algo: algo_name,
            proto: choice.proto.name(),
        },
        t0,
    );
    // The calling thread runs the operation at once: enqueued and started together.
    comm.flight.started(flight, t0);
    let inner = &mut *g;
    let (slot, func_seq) = (inner.slot, inner.func_seq[coll as usize]);
    let geo = coll::geometry(algo, choice.proto, slot, comm.config.fifo_slots, dt);
    // Rings, chains and trees run on positions in the host-grouped order (`coll::order`).
    let order =
        (matches!(algo, Algo::Ring | Algo::Chain | Algo::Tree) && !comm.ring.is_identity()).then_some(&comm.ring);
    let prof = OpProf::begin(
        comm.fanout(),
        comm.rank,
        || OpDescr {
            func: nccl_func(coll),
            p2p: matches!(coll, CollType::Send | CollType::Recv),
            seq_number: func_seq,
            send_buff: send,
            recv_buff: recv,
            count,
            root: root.unwrap_or(0) as i32,
            peer: p2p_peer.map_or(-1, |p| p as i32),
            datatype: dt.nccl_name(),
            algo: algo_name_nccl(registered, algo),
            proto: choice.proto.nccl_name(),
            chunk_size: geo.0,
            n_channels: 1,
        },
        || {
            if registered {
                return Vec::new(); // peers' memory is read directly: no proxy operation
            }
            // Planned in the order the algorithm runs in, reported with real peers.
            let pos = |r: usize| order.map_or(r, |o| o.pos(r));
            let mut legs = plan::legs(&Shape {
                coll,
                algo,
                nranks: comm.nranks,
                rank: pos(comm.rank),
                // Per rank or per block, as each algorithm takes it.
                count,
                elem: dt.size(),
                slice: geo.0,
                chunk: geo.1,
                root: pos(root.unwrap_or(0)),
                peer: p2p_peer.unwrap_or(0),
                order,
            });
            for l in &mut legs {
                l.peer = order.map_or(l.peer, |o| o.rank(l.peer));
            }
            legs
        },
        |p| inner.kind_name(p),
    );
    // The direct metrics route (`profile`): what the primitives move, counted without the clock.
    let tally = inner.metrics.as_ref().map(|_| Tally::default());
    let res = match executor {
        Executor::Registered(plan) => plan.run(&reg_env(comm), coll, count, dt, op.unwrap_or(RedOp::Sum)),
        Executor::Fifos => {
            let mut ctx = Ctx {
                rank: order.map_or(comm.rank, |o| o.pos(comm.rank)),
                nranks: comm.nranks,
                peers: &mut inner.peers,
                lazy: inner.lazy.as_ref(),
                abort: &comm.abort,
                deadline: Deadline::after(comm.config.timeout),
                desc,
                dt,
                op: op.unwrap_or(RedOp::Sum),
                proto: choice.proto,
                geo,
                staging: &mut inner.staging,
                drive: inner.net.as_ref().map(|n| n as &dyn Drive),
                prof: prof.as_ref(),
                tally: tally.as_ref(),
                record: &comm.record,
                members: Some(&comm.ends),
                order,
            };
            on_fifos(&mut ctx, o, algo)
        }
    };
    // Sends still in tcp FIFOs must reach their sockets before the call returns: nothing
    // would move them until the next operation.
    let res = res.and_then(|()| match &inner.net {
        Some(n) => n.flush(&comm.abort, &Deadline::after(comm.config.timeout)),
        None => Ok(()),
    });
    if let Some(p) = prof {
        p.end();
    }
    let t1 = record::now_ns();
    if let Some(m) = &mut inner.metrics {
        // Failed operations count too, as their spans do.
        let p2p = matches!(coll, CollType::Send | CollType::Recv);
        let slot = OpSlot { op: coll as u8, dtype: dt as u8, choice: choice_number(registered, algo, choice.proto) };
        let labels = || OpLabels {
            p2p,
            op: nccl_func(coll),
            algo: algo_name_nccl(registered, algo),
            proto: choice.proto.nccl_name(),
            dtype: dt.nccl_name(),
        };
        m.op(slot, labels, (count * dt.size()) as u64, t1.saturating_sub(t0));
        if let Some(t) = &tally {
            t.report(m);
        }
    }
    match res {
        Ok(()) => {
            comm.record.complete(coll);
            comm.flight.completed(flight, t1);
            Ok(())
        }
        Err(e) => {
            let e = if registered { e } else { comm.reg.explain(e) };
            comm.flight.failed(flight, t1, &e.to_string());
            Err(comm.poison(&mut g, coll, e))
        }
    }
}

/// The algorithm as profiler events and metrics name it (NCCL's spelling).
fn algo_name_nccl(registered: bool, algo: Algo) -> &'static str {
    if registered {
        crate::register::ALGO
    } else {
        algo.nccl_name()
    }
}

/// A number per (executor, algorithm, protocol), for the direct metrics' slots.
fn choice_number(registered: bool, algo: Algo, proto: Proto) -> u8 {
    u8::from(registered) << 7 | (algo as u8) << 2 | proto as u8
}
