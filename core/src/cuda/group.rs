//! A group of device sends and receives (NCCL's ncclGroupStart, ncclSend/ncclRecv...,
//! ncclGroupEnd): one `occl_p2p_group` launch whose connections have channels of their own
//! (`kernels/src/p2p.rs`), or, under `CTAPolicy` zero, the copy engines (`ce/`): each pair's
//! messages one after another through that pair's slots, with no thread block of occl's. Every
//! device send and receive of a communicator under zero runs on the copy engines, lone or
//! grouped, so the two ends of a pair always take the same path. Sends and receives to this
//! rank itself are copies on the caller's stream either way.

use super::ce::{ce_coll, Flows, Route, Share};
use super::comm::CudaComm;
use super::err;
use super::events::Owner;
use super::kernels::coll::Mode;
use super::kernels::cudarc::driver::CudaStream;
use super::kernels::memops::StreamOps;
use super::kernels::p2p::{plan, records, P2pConn, Transfer};
use super::names::{func_of, ras_type};
use super::ops::capturing;
use crate::dtype::DataType;
use crate::error::{Error, Result};
use crate::op::Op;
use crate::profile::op::OpDescr;
use crate::profile::OpProf;
use crate::record::CollType;
use occl_telemetry::{EventType, Note};

/// One send or receive of [`CudaComm::p2p_group_raw`]: `count` elements of `dt` at device
/// address `buf`, to (`send`) or from `peer`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct P2p {
    pub send: bool,
    pub peer: usize,
    pub buf: u64,
    pub count: usize,
    pub dt: DataType,
}

impl P2p {
    fn mode(&self) -> Mode {
        if self.send {
            Mode::Send
        } else {
            Mode::Recv
        }
    }

    fn coll(&self) -> CollType {
        ras_type(self.mode())
    }

    fn bytes(&self) -> u64 {
        (self.count * self.dt.size()) as u64
    }
}

/// The copies of a group's operations with peers, as rank `me` makes them: its sends and its
/// receives in call order (several with one peer follow each other through that pair's slots,
/// matched in order by the peer's), through the slots; those with itself are not among them.
fn flows(ops: &[P2p], me: usize) -> Flows {
    let shares = |send: bool| -> Vec<Share> {
        let mine = ops.iter().filter(|o| o.send == send && o.peer != me);
        mine.map(|o| Share { peer: o.peer, at: o.buf, bytes: o.bytes() }).collect()
    };
    Flows { sends: shares(true), recvs: shares(false), local: None, route: Route::Slots }
}

impl CudaComm {
    /// Checks one send or receive of [`CudaComm::p2p_group_raw`] as every call is checked
    /// (peer in range, buffer non-null and aligned, size within the address space) and returns
    /// its bytes. One to this rank itself is allowed: the group matches it with its other half.
    pub fn check_p2p(&self, o: &P2p) -> Result<u64> {
        let (send, recv) = if o.send { (o.buf, 0) } else { (0, o.buf) };
        let t = Op::new(o.coll(), o.count, o.dt, send as usize, recv as usize)
            .peer(o.peer)
            .check(self.rank(), self.nranks())?;
        Ok((t.send + t.recv) as u64)
    }

    /// Runs a group's sends and receives on this communicator together, on `stream`, in one
    /// launch (or on the copy engines under `CTAPolicy` zero): every peer makes the matching
    /// calls, to each peer in the same order with the same byte counts. A send to this rank
    /// itself is matched, in order, with a receive from it and runs as a device copy.
    /// Stream-ordered and capturable; not for a staged communicator (peers on another host).
    ///
    /// # Safety
    /// As [`CudaComm::all_reduce_raw`], for every operation's buffer and count.
    pub unsafe fn p2p_group_raw(&self, stream: &CudaStream, ops: &[P2p]) -> Result<()> {
        self.check_stream(stream)?;
        self.check_usable()?;
        if self.staged.is_some() {
            return Err(Error::usage(
                "grouped device send/recv on a communicator with peers on another host: it is staged through host \
                 memory, so run its sends and receives through the host path",
            ));
        }
        let mut transfers = Vec::with_capacity(ops.len());
        let (mut to_me, mut from_me) = (Vec::new(), Vec::new());
        for o in ops {
            let bytes = self.check_p2p(o)?;
            if o.peer == self.rank() {
                if o.send { &mut from_me } else { &mut to_me }.push((o.buf, bytes));
                continue;
            }
            transfers.push(Transfer { send: o.send, peer: o.peer as u32, buf: o.buf, bytes });
        }
        if to_me.len() != from_me.len() || to_me.iter().zip(&from_me).any(|(r, s)| r.1 != s.1) {
            return Err(Error::usage(format!(
                "rank {}: {} sends to itself and {} receives from itself in this group, matched in order with \
                 equal byte counts only: make each send to self match a receive of the same size",
                self.rank(),
                from_me.len(),
                to_me.len()
            )));
        }
        let on_ce = self.on_copy_engines(CollType::Send);
        let base = self.args(Mode::Send, 0, 0, 0, 0, 0);
        let planned = match on_ce {
            true => None,
            false => plan(base, &transfers, self.channels.p2p_budget()).map_err(err("group sends and receives"))?,
        };
        if !from_me.is_empty() {
            let ops = StreamOps::new(stream).map_err(err("a send to this rank"))?;
            for ((dst, bytes), (src, _)) in to_me.iter().zip(&from_me) {
                if *bytes == 0 || dst == src {
                    continue;
                }
                // SAFETY: both are device buffers of `bytes` (the caller's promise), on this stream.
                unsafe { ops.copy(*dst, *src, *bytes) }.map_err(err("a send to this rank"))?;
            }
        }
        if on_ce {
            // SAFETY: the caller's promise.
            return unsafe { self.group_on_copy_engines(stream, ops) };
        }
        let Some((mut args, channels)) = planned else { return Ok(()) };
        let conns = &args.conns[..args.nconns as usize];
        // The channels of the connection an operation runs on (none for an empty one).
        let conn_of = |o: &P2p| conns.iter().find(|c| c.peer as usize == o.peer && (c.send == 1) == o.send);
        let chans_of = |o: &P2p| if o.count == 0 { 0 } else { conn_of(o).map_or(0, |c| c.channels) };
        let profs = self.begin_group(ops, "DIRECT", self.layout.slot_bytes, chans_of);
        // The P2p of operation i of connection c (its operations that move bytes, in call order).
        let parent = |c: &P2pConn, i: u32| {
            let (_, p) = profs.iter().filter(|(o, _)| conn_of(o) == Some(c) && o.count > 0).nth(i as usize)?;
            p.coll_id().filter(|_| p.mask().contains(EventType::KernelCh))
        };
        // A KernelCh per operation and channel of its connection (NCCL's, one per work item).
        let owners =
            || records(conns).map(|(c, i)| Owner { parent: parent(c, i), channels: c.channels }).collect::<Vec<_>>();
        let captured = std::cell::OnceCell::new();
        let captured = || *captured.get_or_init(|| capturing(stream));
        let wanted = profs.iter().any(|(_, p)| p.mask().contains(EventType::KernelCh));
        let n_records = conns.iter().map(|c| c.nops.saturating_mul(c.channels)).sum();
        let slot = self.timer_slot(wanted, n_records, captured);
        if let Some(s) = slot {
            args.base.timers = s.dev;
        }
        let launch = profs.first().and_then(|(_, p)| p.start_launch(stream.cu_stream() as usize));
        self.last_channels.store(channels, std::sync::atomic::Ordering::Relaxed);
        // SAFETY: the caller's promise about the buffers; the regions are this communicator's,
        // the timer slot is this launch's alone until its records are collected.
        let r = unsafe { self.kernels.launch_p2p(stream, &args, channels) }.map_err(err("launch grouped send/recv"));
        if let (Ok(()), Some(w)) = (&r, &self.watch) {
            w.launched(captured());
        }
        if let Some((_, p)) = profs.first() {
            p.stop_launch(launch);
        }
        self.timed(slot, r.is_ok(), owners);
        self.end_group(ops, profs, &r);
        r
    }

    /// The group's operations with peers on the copy engines: its sends and receives as the
    /// flows of one call (`ce/plan.rs`), each pair's messages in call order. A group that moves
    /// no byte to or from a peer enqueues nothing, as the kernels' path launches nothing.
    ///
    /// # Safety
    /// As [`CudaComm::p2p_group_raw`], whose checks `ops` passed.
    unsafe fn group_on_copy_engines(&self, stream: &CudaStream, ops: &[P2p]) -> Result<()> {
        let me = self.rank();
        let flows = flows(ops, me);
        if flows.largest() == 0 {
            return Ok(());
        }
        let profs = self.begin_group(ops, "CE", self.ce.geo.slot_bytes, |_| 0);
        let func = match (flows.sends.is_empty(), flows.recvs.is_empty()) {
            (false, true) => "Send",
            (true, false) => "Recv",
            _ => "SendRecv",
        };
        let captured = capturing(stream);
        // One CeColl per operation (under its P2pApi), each spanning the whole call.
        let timed = profs.iter().filter_map(|(o, p)| Some((o, p.ce_parent()?))).filter(|_| !captured);
        let ce_ops = timed
            .map(|(o, parent)| {
                let bufs = if o.send { (o.buf as usize, 0) } else { (0, o.buf as usize) };
                let func = func_of(o.mode()).0;
                let d = ce_coll(func, bufs, o.count, o.peer as i32, o.dt.nccl_name(), stream.cu_stream() as usize);
                (parent, d)
            })
            .collect();
        let launch = profs.first().and_then(|(_, p)| p.start_launch(stream.cu_stream() as usize));
        self.last_channels.store(0, std::sync::atomic::Ordering::Relaxed);
        // SAFETY: the caller's promise about the buffers.
        let r = unsafe { self.enqueue_ce(stream, &flows, captured, func, ce_ops) };
        if let (Ok(()), Some(w)) = (&r, &self.watch) {
            w.launched(captured);
        }
        if let Some((_, p)) = profs.first() {
            p.stop_launch(launch);
        }
        self.end_group(ops, profs, &r);
        r
    }

    /// Begins the P2p events of a group's operations with peers (not this rank), as run by
    /// `algo` in chunks of `chunk` bytes on `chans(op)` channels, and counts each as launched
    /// for RAS (NCCL's RAS counts operations as they are enqueued). The pending KernelCh and
    /// CeColl events are collected first.
    fn begin_group<'o>(
        &self,
        ops: &'o [P2p],
        algo: &'static str,
        chunk: u64,
        chans: impl Fn(&P2p) -> u32,
    ) -> Vec<(&'o P2p, OpProf<'_>)> {
        let f = self.comm.fanout();
        self.flush_events();
        let t0 = crate::record::now_ns();
        ops.iter()
            .filter(|o| o.peer != self.rank())
            .filter_map(|o| {
                let (func, fi) = func_of(o.mode());
                self.comm.record().launch(o.coll(), o.bytes(), t0);
                OpProf::begin_device(f, self.rank(), || OpDescr {
                    func,
                    p2p: true,
                    seq_number: self.seqs[fi].fetch_add(1, std::sync::atomic::Ordering::Relaxed),
                    send_buff: if o.send { o.buf as usize } else { 0 },
                    recv_buff: if o.send { 0 } else { o.buf as usize },
                    count: o.count,
                    root: 0,
                    peer: o.peer as i32,
                    datatype: o.dt.nccl_name(),
                    algo,
                    proto: "SIMPLE",
                    chunk_size: chunk as usize,
                    n_channels: u8::try_from(chans(o)).unwrap_or(u8::MAX),
                })
                .map(|p| (o, p))
            })
            .collect()
    }

    /// Ends a group's events: RAS's completion of each operation with a peer, or the failure's
    /// note, then the P2p events.
    fn end_group(&self, ops: &[P2p], profs: Vec<(&P2p, OpProf)>, r: &Result<()>) {
        for o in ops.iter().filter(|o| o.peer != self.rank()) {
            match r {
                Ok(()) => self.comm.record().complete(o.coll()),
                Err(e) => self.comm.fanout().note(&Note::OpFailed { func: func_of(o.mode()).0, kind: e.kind().name() }),
            }
        }
        for (_, p) in profs {
            p.end();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_groups_copies_are_its_operations_with_peers_in_call_order() {
        let op = |send: bool, peer: usize, buf: u64, count: usize| P2p { send, peer, buf, count, dt: DataType::F32 };
        let ops = [
            op(true, 1, 0x1000, 25),
            op(false, 2, 0x2000, 7),
            op(true, 0, 0x3000, 4),
            op(false, 0, 0x4000, 4),
            op(true, 1, 0x5000, 0),
            op(false, 1, 0x6000, 3),
        ];
        let f = flows(&ops, 0);
        let share = |peer: usize, at: u64, bytes: u64| Share { peer, at, bytes };
        assert_eq!(f.sends, [share(1, 0x1000, 100), share(1, 0x5000, 0)]);
        assert_eq!(f.recvs, [share(2, 0x2000, 28), share(1, 0x6000, 12)]);
        assert_eq!((f.largest(), f.local, f.route), (100, None, Route::Slots));
        assert_eq!(flows(&ops[2..4], 0).largest(), 0, "only this rank itself: nothing for the copy engines");
    }
}
