//! Encoding and decoding of message bodies. Both directions go through one pair of traits, so each type's layout is
//! written once for writing and once for reading, next to each other.

use super::*;
use crate::record::{CollType, CommId, Failure, InFlight, LiveSnapshot, RankInfo, MAX_COMM_RANKS, MAX_ERROR_BYTES};

/// Where encoded bytes go: a buffer, or a counter that only measures.
pub(crate) trait Sink {
    fn put(&mut self, bytes: &[u8]);
}

impl Sink for Vec<u8> {
    fn put(&mut self, bytes: &[u8]) {
        self.extend_from_slice(bytes);
    }
}

struct Counter(usize);

impl Sink for Counter {
    fn put(&mut self, bytes: &[u8]) {
        self.0 += bytes.len();
    }
}

type Res<T> = Result<T, WireError>;

/// A cursor over one frame's body. Every read checks the bytes left first.
pub(crate) struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    pub(crate) fn new(buf: &'a [u8]) -> Self {
        Self { buf }
    }

    pub(crate) fn remaining(&self) -> usize {
        self.buf.len()
    }

    fn take(&mut self, n: usize, what: &'static str) -> Res<&'a [u8]> {
        if self.buf.len() < n {
            return Err(WireError::Truncated(what));
        }
        let (head, tail) = self.buf.split_at(n);
        self.buf = tail;
        Ok(head)
    }

    fn array<const N: usize>(&mut self, what: &'static str) -> Res<[u8; N]> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N, what)?);
        Ok(out)
    }

    fn u8(&mut self, what: &'static str) -> Res<u8> {
        Ok(self.array::<1>(what)?[0])
    }

    fn u64_fixed(&mut self, what: &'static str) -> Res<u64> {
        Ok(u64::from_be_bytes(self.array(what)?))
    }

    fn bool(&mut self, what: &'static str) -> Res<bool> {
        match self.u8(what)? {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(WireError::Invalid(what)),
        }
    }

    fn varint(&mut self, what: &'static str) -> Res<u64> {
        let mut v = 0u64;
        for i in 0..10 {
            let b = self.u8(what)?;
            // The tenth byte may only carry the top bit of a u64.
            if i == 9 && b > 1 {
                return Err(WireError::Invalid(what));
            }
            v |= u64::from(b & 0x7f) << (7 * i);
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(WireError::Invalid(what))
    }

    fn u32(&mut self, what: &'static str) -> Res<u32> {
        u32::try_from(self.varint(what)?).map_err(|_| WireError::Invalid(what))
    }

    fn i32(&mut self, what: &'static str) -> Res<i32> {
        let z = self.u32(what)?;
        Ok(((z >> 1) as i32) ^ -((z & 1) as i32))
    }

    /// A list count, checked against its bound and against the bytes left (each item takes at least one byte), so
    /// that no reservation can exceed what the frame itself holds.
    fn count(&mut self, what: &'static str, max: usize) -> Res<usize> {
        let n = self.varint(what)?;
        let n = usize::try_from(n).unwrap_or(usize::MAX);
        if n > max {
            return Err(WireError::TooLong { what, len: n, max });
        }
        if n > self.remaining() {
            return Err(WireError::Truncated(what));
        }
        Ok(n)
    }

    fn string(&mut self, what: &'static str) -> Res<String> {
        self.text(what, MAX_STRING)
    }

    /// A string of at most `max` bytes.
    fn text(&mut self, what: &'static str, max: usize) -> Res<String> {
        let n = self.count(what, max)?;
        let bytes = self.take(n, what)?;
        std::str::from_utf8(bytes).map(str::to_owned).map_err(|_| WireError::Invalid(what))
    }

    fn option<T>(&mut self, what: &'static str, f: impl FnOnce(&mut Self) -> Res<T>) -> Res<Option<T>> {
        if self.bool(what)? {
            f(self).map(Some)
        } else {
            Ok(None)
        }
    }

    fn list<T>(&mut self, what: &'static str, max: usize, mut f: impl FnMut(&mut Self) -> Res<T>) -> Res<Vec<T>> {
        let n = self.count(what, max)?;
        // Grown as items arrive rather than reserved from the count: an item decodes to more memory than its bytes.
        let mut out = Vec::with_capacity(n.min(64));
        for _ in 0..n {
            out.push(f(self)?);
        }
        Ok(out)
    }
}

/// The writing half: mirrors [`Reader`], and refuses values a reader would reject.
struct Writer<'s, S: Sink> {
    sink: &'s mut S,
}

impl<S: Sink> Writer<'_, S> {
    fn u8(&mut self, v: u8) {
        self.sink.put(&[v]);
    }

    fn bytes(&mut self, v: &[u8]) {
        self.sink.put(v);
    }

    fn u64_fixed(&mut self, v: u64) {
        self.sink.put(&v.to_be_bytes());
    }

    fn bool(&mut self, v: bool) {
        self.u8(u8::from(v));
    }

    fn varint(&mut self, mut v: u64) {
        let mut buf = [0u8; 10];
        let mut n = 0;
        loop {
            let b = (v & 0x7f) as u8;
            v >>= 7;
            if v == 0 {
                buf[n] = b;
                n += 1;
                break;
            }
            buf[n] = b | 0x80;
            n += 1;
        }
        self.sink.put(&buf[..n]);
    }

    fn i32(&mut self, v: i32) {
        self.varint(u64::from(((v << 1) ^ (v >> 31)) as u32));
    }

    fn count(&mut self, what: &'static str, n: usize, max: usize) -> Res<()> {
        if n > max {
            return Err(WireError::TooLong { what, len: n, max });
        }
        self.varint(n as u64);
        Ok(())
    }

    fn string(&mut self, what: &'static str, s: &str) -> Res<()> {
        self.text(what, s, MAX_STRING)
    }

    fn text(&mut self, what: &'static str, s: &str, max: usize) -> Res<()> {
        self.count(what, s.len(), max)?;
        self.bytes(s.as_bytes());
        Ok(())
    }

    fn option<T>(&mut self, v: &Option<T>, f: impl FnOnce(&mut Self, &T)) {
        self.bool(v.is_some());
        if let Some(v) = v {
            f(self, v);
        }
    }

    fn list<T>(
        &mut self,
        what: &'static str,
        items: &[T],
        max: usize,
        mut f: impl FnMut(&mut Self, &T) -> Res<()>,
    ) -> Res<()> {
        self.count(what, items.len(), max)?;
        items.iter().try_for_each(|i| f(self, i))
    }

    fn peers(&mut self, what: &'static str, items: &[PeerId], max: usize) -> Res<()> {
        self.list(what, items, max, |w, p| {
            w.varint(p.0.into());
            Ok(())
        })
    }
}

fn read_peers(r: &mut Reader<'_>, what: &'static str, max: usize) -> Res<Vec<PeerId>> {
    r.list(what, max, |r| r.u32(what).map(PeerId))
}

// ---- rank records ----

const FLAG_FINALIZE: u8 = 1;
const FLAG_DESTROY: u8 = 2;
const FLAG_ABORT: u8 = 4;

fn write_record<S: Sink>(w: &mut Writer<'_, S>, r: &RankRecord) -> Res<()> {
    let i = &r.info;
    if i.size > MAX_COMM_RANKS || i.rank >= i.size {
        return Err(WireError::Invalid("rank record: rank or size"));
    }
    w.u64_fixed(i.comm.hash);
    w.u64_fixed(i.comm.root_host_hash);
    w.u64_fixed(i.comm.root_pid_hash);
    w.varint(i.size.into());
    w.varint(i.rank.into());
    w.varint(i.pid.into());
    w.string("rank record: host", &i.host)?;
    w.option(&i.cuda_dev, |w, d| w.varint((*d).into()));
    w.option(&i.nvml_dev, |w, d| w.varint((*d).into()));
    let l = &r.live;
    l.launched.iter().for_each(|&n| w.varint(n));
    l.completed.iter().for_each(|&n| w.varint(n));
    w.i32(l.init_state);
    w.i32(l.async_error);
    let flags = (u8::from(l.finalize_called) * FLAG_FINALIZE)
        | (u8::from(l.destroy_flag) * FLAG_DESTROY)
        | (u8::from(l.abort_flag) * FLAG_ABORT);
    w.u8(flags);
    w.option(&l.in_flight, write_in_flight);
    w.varint(l.failed);
    w.bool(l.last_failure.is_some());
    if let Some(f) = &l.last_failure {
        w.option(&f.op, write_in_flight);
        w.varint(f.at_ns);
        w.i32(f.result);
        w.text("rank record: error", &f.error, MAX_ERROR_BYTES)?;
    }
    Ok(())
}

fn write_in_flight<S: Sink>(w: &mut Writer<'_, S>, f: &InFlight) {
    w.varint(f.seq);
    w.u8(f.coll as u8);
    w.varint(f.coll_seq);
    w.varint(f.bytes);
    w.varint(f.start_ns);
    w.option(&f.peer, |w, p| w.varint((*p).into()));
    w.option(&f.step_state, |w, s| w.varint((*s).into()));
}

fn read_in_flight(r: &mut Reader<'_>) -> Res<InFlight> {
    const W: &str = "rank record";
    Ok(InFlight {
        seq: r.varint(W)?,
        coll: CollType::from_u8(r.u8(W)?).ok_or(WireError::Invalid("rank record: collective type"))?,
        coll_seq: r.varint(W)?,
        bytes: r.varint(W)?,
        start_ns: r.varint(W)?,
        peer: r.option(W, |r| r.u32(W))?,
        step_state: r.option(W, |r| r.u32(W))?,
    })
}

fn read_record(r: &mut Reader<'_>) -> Res<RankRecord> {
    const W: &str = "rank record";
    let comm = CommId { hash: r.u64_fixed(W)?, root_host_hash: r.u64_fixed(W)?, root_pid_hash: r.u64_fixed(W)? };
    let size = r.u32(W)?;
    let rank = r.u32(W)?;
    if size > MAX_COMM_RANKS || rank >= size {
        return Err(WireError::Invalid("rank record: rank or size"));
    }
    let info = RankInfo {
        comm,
        size,
        rank,
        pid: r.u32(W)?,
        host: r.string("rank record: host")?,
        cuda_dev: r.option(W, |r| r.u32(W))?,
        nvml_dev: r.option(W, |r| r.u32(W))?,
    };
    let mut launched = [0u64; CollType::COUNT];
    for n in &mut launched {
        *n = r.varint(W)?;
    }
    let mut completed = [0u64; CollType::COUNT];
    for n in &mut completed {
        *n = r.varint(W)?;
    }
    let init_state = r.i32(W)?;
    let async_error = r.i32(W)?;
    let flags = r.u8(W)?;
    if flags & !(FLAG_FINALIZE | FLAG_DESTROY | FLAG_ABORT) != 0 {
        return Err(WireError::Invalid("rank record: flags"));
    }
    let in_flight = r.option(W, read_in_flight)?;
    let failed = r.varint(W)?;
    let last_failure = r.option(W, |r| {
        Ok(Failure {
            op: r.option(W, read_in_flight)?,
            at_ns: r.varint(W)?,
            result: r.i32(W)?,
            error: r.text("rank record: error", MAX_ERROR_BYTES)?,
        })
    })?;
    Ok(RankRecord {
        info,
        live: LiveSnapshot {
            launched,
            completed,
            init_state,
            async_error,
            finalize_called: flags & FLAG_FINALIZE != 0,
            destroy_flag: flags & FLAG_DESTROY != 0,
            abort_flag: flags & FLAG_ABORT != 0,
            in_flight,
            failed,
            last_failure,
        },
    })
}

fn write_status<S: Sink>(w: &mut Writer<'_, S>, p: &ProcessStatus) -> Res<()> {
    w.varint(p.peer.0.into());
    w.string("process status: addr", &p.addr)?;
    w.string("process status: host", &p.host)?;
    w.varint(p.pid.into());
    w.varint(p.epoch.into());
    w.list("process status: records", &p.records, MAX_RECORDS, write_record)?;
    w.peers("process status: dead", &p.dead, MAX_PEERS)?;
    w.peers("process status: unresponsive", &p.unresponsive, MAX_PEERS)
}

fn read_status(r: &mut Reader<'_>) -> Res<ProcessStatus> {
    const W: &str = "process status";
    Ok(ProcessStatus {
        peer: PeerId(r.u32(W)?),
        addr: r.string("process status: addr")?,
        host: r.string("process status: host")?,
        pid: r.u32(W)?,
        epoch: r.u32(W)?,
        records: r.list("process status: records", MAX_RECORDS, read_record)?,
        dead: read_peers(r, "process status: dead", MAX_PEERS)?,
        unresponsive: read_peers(r, "process status: unresponsive", MAX_PEERS)?,
    })
}

// ---- messages ----

fn write_reply<S: Sink>(w: &mut Writer<'_, S>, p: &StatusReply) -> Res<()> {
    w.varint(p.id.origin.0.into());
    w.varint(p.id.seq);
    w.bool(p.duplicate);
    w.varint(p.leg_timeouts.into());
    w.list("status reply: statuses", &p.statuses, MAX_PEERS, write_status)
}

/// The frame size of a status reply, without building a `Msg` around it.
pub(crate) fn reply_len(reply: &StatusReply) -> Res<usize> {
    let mut c = Counter(0);
    write_reply(&mut Writer { sink: &mut c }, reply)?;
    Ok(HEADER_LEN + 2 + c.0)
}

fn write_body<S: Sink>(w: &mut Writer<'_, S>, msg: &Msg) -> Res<()> {
    match msg {
        Msg::Hello(h) => {
            w.u64_fixed(h.table_hash);
            w.varint(h.from.0.into());
            w.string("hello: address", &h.from_addr)?;
            w.varint(h.epoch.into());
            w.bytes(&h.nonce);
        }
        Msg::HelloAck(h) => {
            w.varint(h.from.0.into());
            w.varint(h.epoch.into());
            w.bytes(&h.nonce);
            w.bytes(&h.proof);
        }
        Msg::HelloFinish(h) => w.bytes(&h.proof),
        Msg::KeepAlive(k) => {
            w.u64_fixed(k.table_hash);
            w.u64_fixed(k.news_digest);
            w.varint(k.dead.into());
            w.varint(k.unresponsive.into());
            w.bool(k.link);
        }
        Msg::PeerNews(n) => {
            w.varint(n.id.origin.0.into());
            w.varint(n.id.seq);
            w.list("peer news: items", &n.items, MAX_PEERS, |w, i| {
                w.varint(i.peer.0.into());
                w.varint(i.epoch.into());
                w.bool(i.dead);
                Ok(())
            })?;
        }
        Msg::StatusRequest(q) => {
            w.varint(q.id.origin.0.into());
            w.varint(q.id.seq);
            w.varint(q.budget_ns);
            w.peers("status request: path", &q.path, MAX_PATH)?;
        }
        Msg::StatusReply(p) => write_reply(w, p)?,
        Msg::Bye(reason) => w.u8(reason.code()),
        Msg::MetricsRequest(q) => w.varint(q.seq),
        Msg::MetricsReply(r) => {
            w.varint(r.seq);
            w.text("metrics reply: text", &r.text, MAX_METRICS_TEXT)?;
        }
    }
    Ok(())
}

pub(crate) fn read_body(ty: u8, r: &mut Reader<'_>) -> Res<Msg> {
    let msg = match ty {
        1 => Msg::Hello(Hello {
            table_hash: r.u64_fixed("hello")?,
            from: PeerId(r.u32("hello")?),
            from_addr: r.string("hello: address")?,
            epoch: r.u32("hello")?,
            nonce: r.array("hello")?,
        }),
        2 => Msg::HelloAck(HelloAck {
            from: PeerId(r.u32("hello ack")?),
            epoch: r.u32("hello ack")?,
            nonce: r.array("hello ack")?,
            proof: r.array("hello ack")?,
        }),
        3 => Msg::HelloFinish(HelloFinish { proof: r.array("hello finish")? }),
        4 => Msg::KeepAlive(KeepAlive {
            table_hash: r.u64_fixed("keepalive")?,
            news_digest: r.u64_fixed("keepalive")?,
            dead: r.u32("keepalive")?,
            unresponsive: r.u32("keepalive")?,
            link: r.bool("keepalive")?,
        }),
        5 => Msg::PeerNews(PeerNews {
            id: NewsId { origin: PeerId(r.u32("peer news")?), seq: r.varint("peer news")? },
            items: r.list("peer news: items", MAX_PEERS, |r| {
                Ok(NewsItem {
                    peer: PeerId(r.u32("peer news")?),
                    epoch: r.u32("peer news")?,
                    dead: r.bool("peer news")?,
                })
            })?,
        }),
        6 => Msg::StatusRequest(StatusRequest {
            id: RequestId { origin: PeerId(r.u32("status request")?), seq: r.varint("status request")? },
            budget_ns: r.varint("status request")?,
            path: read_peers(r, "status request: path", MAX_PATH)?,
        }),
        7 => Msg::StatusReply(StatusReply {
            id: RequestId { origin: PeerId(r.u32("status reply")?), seq: r.varint("status reply")? },
            duplicate: r.bool("status reply")?,
            leg_timeouts: r.u32("status reply")?,
            statuses: r.list("status reply: statuses", MAX_PEERS, read_status)?,
        }),
        8 => Msg::Bye(ByeReason::from_code(r.u8("bye")?)),
        9 => Msg::MetricsRequest(MetricsRequest { seq: r.varint("metrics request")? }),
        10 => Msg::MetricsReply(MetricsReply {
            seq: r.varint("metrics reply")?,
            text: r.text("metrics reply: text", MAX_METRICS_TEXT)?,
        }),
        t => return Err(WireError::UnknownType(t)),
    };
    if r.remaining() != 0 {
        return Err(WireError::TrailingBytes(r.remaining()));
    }
    Ok(msg)
}

/// The size of `msg`'s whole frame, length field included, or the bound it breaks.
pub fn encoded_len(msg: &Msg) -> Result<usize, WireError> {
    let mut c = Counter(0);
    write_body(&mut Writer { sink: &mut c }, msg)?;
    let len = c.0 + 2;
    if len > MAX_FRAME {
        return Err(WireError::FrameTooLarge { len, max: MAX_FRAME });
    }
    Ok(HEADER_LEN + len)
}

/// Appends `msg` as one frame to `out`. Fails, leaving `out` as it was, when a string, list or the frame breaks its
/// bound; a decoder accepts everything this writes.
pub fn encode(msg: &Msg, out: &mut Vec<u8>) -> Result<(), WireError> {
    let start = out.len();
    out.extend_from_slice(&[0, 0, 0, 0, VERSION, msg.type_byte()]);
    let res = write_body(&mut Writer { sink: out }, msg).and_then(|()| {
        let len = out.len() - start - HEADER_LEN;
        if len > MAX_FRAME {
            return Err(WireError::FrameTooLarge { len, max: MAX_FRAME });
        }
        Ok(len as u32)
    });
    match res {
        Ok(len) => {
            out[start..start + HEADER_LEN].copy_from_slice(&len.to_be_bytes());
            Ok(())
        }
        Err(e) => {
            out.truncate(start);
            Err(e)
        }
    }
}
