//! One rank's Kineto/Chrome trace, as HTA and Perfetto read it.
//!
//! Layout (HTA's rules, `reference/anchors.md` §1):
//! - Top-level metadata first, `distributedInfo` before anything else that says `"rank"`, written
//!   as `"rank": N` (HTA finds the rank with `"rank":\s+(\d+)`), and `traceEvents` last.
//! - Each collective (Coll / P2p) is a GPU-kernel-like row: `cat: kernel`, `pid` 0 (the
//!   "device"), `tid` = its stream, args `stream` (> 0: HTA takes stream 0 for a CPU op) and
//!   `correlation`, PyTorch's collective metadata keys, and a `ncclKernel_` name.
//! - The call (CollApi / P2pApi) is a `cuda_runtime` row on the calling thread with the same
//!   `correlation` and no `stream`, so HTA links the two and gives the kernel the iteration of
//!   the `ProfilerStep#N` row that contains the call. A collective whose call was not recorded
//!   (NCCL before profiler v5) gets a call row made from its own host interval. Steps and the
//!   calls inside them are written in whole µs ([`StepGrid`]) so HTA's rounding keeps each call
//!   in its own step.
//! - Proxy rows are CPU rows of categories HTA does not analyse, on one lane per (channel, peer,
//!   direction); `ac2g` flow events draw call → kernel arrows in Perfetto (HTA drops rows
//!   without `dur`).
//!
//! Where the kernel-like row lies: in occl the Coll spans the whole operation; under NCCL it
//! stops at enqueue and its ProxyOps / KernelCh events run after, so the row is stretched over
//! those children when they start after the Coll's stop. A call on the copy engines has no
//! such child: its CeColl, a child of the call's API event (NCCL's v6 hierarchy), spans its
//! device time instead, and so does the row.

use super::config::ProxyDetail;
use super::names;
use super::record::Rec;
use super::step_grid::StepGrid;
use super::steps::Step;
use crate::event::EventDescr;
use crate::spans::CommMeta;
use std::collections::HashMap;
use std::io::{self, Write};
use std::sync::Arc;

/// Everything one file is made from.
pub(crate) struct FileView<'a> {
    /// The file's communicators; a record's `comm` indexes this.
    pub comms: &'a [Arc<CommMeta>],
    pub recs: Vec<&'a Rec>,
    pub steps: &'a [Step],
    pub threads: &'a [(u32, String)],
    pub pid: u32,
    pub host: &'a str,
    pub proxy: ProxyDetail,
    pub events_dropped: u64,
    pub max_events: usize,
    pub steps_dropped: u64,
}

/// The file's "world": its largest communicator (the first of equals). Its rank is the file's.
pub(crate) fn world(comms: &[Arc<CommMeta>]) -> Option<usize> {
    let mut best: Option<usize> = None;
    for (i, c) in comms.iter().enumerate() {
        if best.is_none_or(|b| c.nranks > comms[b].nranks) {
            best = Some(i);
        }
    }
    best
}

/// Microseconds with three decimals (ns precision), as Kineto writes them.
fn us(ns: u64) -> String {
    format!("{}.{:03}", ns / 1000, ns % 1000)
}

/// A JSON string literal.
fn q(s: &str) -> String {
    serde_json::Value::from(s).to_string()
}

fn ranks_list(n: i32) -> String {
    let v: Vec<String> = (0..n.max(0)).map(|r| r.to_string()).collect();
    format!("[{}]", v.join(", "))
}

/// Lane tids for proxy rows start here (thread numbers are small).
const LANE_TID_BASE: u64 = 1_000_000;
/// Tids per lane: the op row and one sub-lane per step slot (NCCL keeps 8 steps in flight).
const LANE_TIDS: u64 = 16;
const STEP_SLOTS: u64 = 8;
/// Correlation ids start here. HTA (0.5.0) keeps the column in the smallest integer type that
/// holds its values and later stores row indices in a column of that type: ids below 128 made
/// it int8 and loading failed. From 2^16 on it is int32, as with CUPTI's ids in real traces.
const FIRST_CORRELATION: u64 = 1 << 16;
/// The device-side "process" of kernel-like rows.
const DEVICE_PID: u32 = 0;

struct Ctx<'v, 'a> {
    v: &'v FileView<'a>,
    world: Option<usize>,
    /// CollApi / P2pApi records by (comm, id).
    api: HashMap<(u16, u64), &'a Rec>,
    /// ProxyOp / KernelCh extent by (comm, parent id).
    extent: HashMap<(u16, u64), (u64, u64)>,
    /// CeColl extent by (comm, API event id).
    ce_extent: HashMap<(u16, u64), (u64, u64)>,
    /// ProxyOp lane by (comm, id).
    op_lane: HashMap<(u16, u64), u64>,
    lanes: Vec<(u16, u8, i32, bool)>,
    streams: HashMap<(u16, usize), u64>,
    stream_names: Vec<(u64, u16)>,
    corr: HashMap<(u16, u64), u64>,
    next_corr: u64,
    grid: StepGrid,
}

impl<'v, 'a> Ctx<'v, 'a> {
    fn new(v: &'v FileView<'a>) -> Ctx<'v, 'a> {
        let mut c = Ctx {
            v,
            world: world(v.comms),
            api: HashMap::new(),
            extent: HashMap::new(),
            ce_extent: HashMap::new(),
            op_lane: HashMap::new(),
            lanes: Vec::new(),
            streams: HashMap::new(),
            stream_names: Vec::new(),
            corr: HashMap::new(),
            next_corr: FIRST_CORRELATION,
            grid: StepGrid::new(v.steps),
        };
        let mut lane_of: HashMap<(u16, u8, i32, bool), u64> = HashMap::new();
        for &r in &v.recs {
            match r.descr {
                EventDescr::CollApi { .. } | EventDescr::P2pApi { .. } => {
                    c.api.insert((r.comm, r.id), r);
                }
                EventDescr::CeColl { .. } if r.parent != 0 => widen(&mut c.ce_extent, r),
                EventDescr::ProxyOp { .. } | EventDescr::KernelCh { .. } => {
                    if r.parent != 0 {
                        widen(&mut c.extent, r);
                    }
                    if let EventDescr::ProxyOp { channel_id, peer, is_send, .. } = r.descr {
                        let key = (r.comm, channel_id, peer, is_send);
                        let n = c.lanes.len() as u64;
                        let lane = *lane_of.entry(key).or_insert(n);
                        if lane == n {
                            c.lanes.push(key);
                        }
                        c.op_lane.insert((r.comm, r.id), lane);
                    }
                }
                _ => {}
            }
        }
        c
    }

    fn correlation(&mut self, comm: u16, api_id: u64) -> u64 {
        let next = &mut self.next_corr;
        *self.corr.entry((comm, api_id)).or_insert_with(|| {
            *next += 1;
            *next - 1
        })
    }

    fn fresh_correlation(&mut self) -> u64 {
        self.next_corr += 1;
        self.next_corr - 1
    }

    fn stream(&mut self, comm: u16, addr: usize) -> u64 {
        let n = self.streams.len() as u64 + 1;
        let s = *self.streams.entry((comm, addr)).or_insert(n);
        if s == n {
            self.stream_names.push((s, comm));
        }
        s
    }

    fn comm(&self, i: u16) -> Option<&Arc<CommMeta>> {
        self.v.comms.get(usize::from(i))
    }

    fn rank(&self) -> i32 {
        self.world.and_then(|w| self.v.comms.get(w)).map_or(0, |c| c.rank)
    }

    /// PyTorch's collective metadata for a kernel-like row.
    fn comm_args(&self, comm: u16, func: &str, count: usize, datatype: &str) -> String {
        let Some(c) = self.comm(comm) else { return String::new() };
        let (in_n, out_n) = names::msg_nelems(func, count, c.nranks.max(0) as usize);
        let mut a = format!(
            "\"Collective name\": {}, \"In msg nelems\": {in_n}, \"Out msg nelems\": {out_n}, \"Group size\": {}, \
             \"dtype\": {}, \"In split size\": \"[]\", \"Out split size\": \"[]\", \"Process Group Name\": \"{:016x}\", \
             \"Process Group Description\": {}, \"Rank\": {}",
            q(names::torch_collective(func)),
            c.nranks,
            q(names::torch_dtype(datatype)),
            c.hash,
            q(c.name.as_deref().unwrap_or("")),
            c.rank,
        );
        // Member ranks are known only for the world communicator (0..n); a sub-communicator's
        // global ranks are not in the events.
        if self.world == Some(usize::from(comm)) {
            a.push_str(&format!(
                ", \"Process Group Ranks\": {}, \"Global rank start\": 0, \"Global rank stride\": 1",
                q(&ranks_list(c.nranks))
            ));
        }
        a
    }
}

/// Writes the whole file.
pub(crate) fn render(v: &FileView<'_>, out: &mut dyn Write) -> io::Result<()> {
    let mut c = Ctx::new(v);
    let rank = c.rank();
    let world_size = c.world.and_then(|w| v.comms.get(w)).map_or(1, |m| m.nranks);
    writeln!(out, "{{")?;
    writeln!(out, "  \"schemaVersion\": 1,")?;
    writeln!(out, "  \"distributedInfo\": {{")?;
    writeln!(out, "    \"rank\": {rank},")?;
    writeln!(out, "    \"world_size\": {world_size},")?;
    writeln!(out, "    \"backend\": \"occl\",")?;
    writeln!(out, "    \"pg_count\": {},", v.comms.len())?;
    writeln!(out, "    \"pg_config\": [")?;
    for (i, m) in v.comms.iter().enumerate() {
        let ranks = if c.world == Some(i) { format!(", \"ranks\": {}", ranks_list(m.nranks)) } else { String::new() };
        let sep = if i + 1 < v.comms.len() { "," } else { "" };
        writeln!(
            out,
            "      {{\"pg_name\": \"{:016x}\", \"pg_desc\": {}, \"backend_config\": \"cpu:occl\", \"pg_size\": {}{ranks}}}{sep}",
            m.hash,
            q(m.name.as_deref().unwrap_or("")),
            m.nranks
        )?;
    }
    writeln!(out, "    ],")?;
    writeln!(out, "    \"occl_version\": {}", q(env!("CARGO_PKG_VERSION")))?;
    writeln!(out, "  }},")?;
    writeln!(out, "  \"traceName\": {},", q(&format!("occl rank {rank} on {} pid {}", v.host, v.pid)))?;
    writeln!(out, "  \"displayTimeUnit\": \"ms\",")?;
    let proxy = match v.proxy {
        ProxyDetail::None => "none",
        ProxyDetail::Ops => "ops",
        ProxyDetail::Steps => "steps",
    };
    writeln!(
        out,
        "  \"occl\": {{\"host\": {}, \"pid\": {}, \"events_recorded\": {}, \"events_dropped\": {}, \"max_events\": {}, \
         \"steps_recorded\": {}, \"steps_dropped\": {}, \"proxy_rows\": \"{proxy}\"}},",
        q(v.host),
        v.pid,
        v.recs.len(),
        v.events_dropped,
        v.max_events,
        v.steps.len(),
        v.steps_dropped
    )?;
    writeln!(out, "  \"traceEvents\": [")?;
    let mut first = true;
    let mut ev = |out: &mut dyn Write, line: String| -> io::Result<()> {
        if !first {
            writeln!(out, ",")?;
        }
        first = false;
        write!(out, "    {line}")
    };

    for (i, s) in v.steps.iter().enumerate() {
        let (start_us, end_us) = c.grid.step_us(i);
        ev(
            out,
            format!(
                "{{\"ph\": \"X\", \"cat\": \"user_annotation\", \"name\": \"ProfilerStep#{}\", \"pid\": {}, \"tid\": {}, \"ts\": {}, \"dur\": {}, \"args\": {{}}}}",
                s.n,
                v.pid,
                s.tid,
                us(start_us * 1000),
                us((end_us - start_us) * 1000)
            ),
        )?;
    }

    for &r in &v.recs {
        match r.descr {
            EventDescr::CollApi { func, count, datatype, root, .. } => {
                let corr = c.correlation(r.comm, r.id);
                ev(
                    out,
                    api_row(
                        &c.grid,
                        v.pid,
                        r,
                        func,
                        corr,
                        &format!(", \"count\": {count}, \"datatype\": {}, \"root\": {root}", q(datatype)),
                    ),
                )?;
            }
            EventDescr::P2pApi { func, count, datatype, .. } => {
                let corr = c.correlation(r.comm, r.id);
                ev(
                    out,
                    api_row(
                        &c.grid,
                        v.pid,
                        r,
                        func,
                        corr,
                        &format!(", \"count\": {count}, \"datatype\": {}", q(datatype)),
                    ),
                )?;
            }
            EventDescr::Coll { func, count, root, datatype, algo, proto, seq_number, n_channels, .. } => {
                let extra = format!(
                    ", \"Seq\": {seq_number}, \"algorithm\": {}, \"protocol\": {}, \"nChannels\": {n_channels}, \"root\": {root}",
                    q(algo),
                    q(proto)
                );
                let name = names::kernel_name(func, Some((algo, proto)), datatype);
                kernel(&mut c, out, &mut ev, r, &name, func, count, datatype, &extra)?;
            }
            EventDescr::P2p { func, count, datatype, peer, n_channels, .. } => {
                let peer_key = if func == "Recv" { "Src Rank" } else { "Dst Rank" };
                let extra = format!(", \"{peer_key}\": {peer}, \"nChannels\": {n_channels}");
                let name = names::kernel_name(func, None, datatype);
                kernel(&mut c, out, &mut ev, r, &name, func, count, datatype, &extra)?;
            }
            EventDescr::ProxyOp { peer, n_steps, chunk_size, is_send, channel_id, .. }
                if v.proxy != ProxyDetail::None =>
            {
                let lane = c.op_lane.get(&(r.comm, r.id)).copied().unwrap_or(0);
                let dir = if is_send { "Send" } else { "Recv" };
                ev(
                    out,
                    format!(
                        "{{\"ph\": \"X\", \"cat\": \"occl_proxy\", \"name\": \"ProxyOp {dir}\", \"pid\": {}, \"tid\": {}, \"ts\": {}, \"dur\": {}, \
                         \"args\": {{\"peer\": {peer}, \"channel\": {channel_id}, \"nSteps\": {n_steps}, \"chunkSize\": {chunk_size}, \"states\": {}}}}}",
                        v.pid,
                        LANE_TID_BASE + lane * LANE_TIDS,
                        us(r.start_ns),
                        us(r.end_ns - r.start_ns),
                        q(&marks_text(r))
                    ),
                )?;
            }
            EventDescr::ProxyStep { step, .. } if v.proxy == ProxyDetail::Steps => {
                let lane = c.op_lane.get(&(r.comm, r.parent)).copied();
                let dir = lane.and_then(|l| c.lanes.get(l as usize)).map_or("", |l| if l.3 { "Send" } else { "Recv" });
                let slot = u64::try_from(step).unwrap_or(0) % STEP_SLOTS;
                // A step whose ProxyOp was not kept goes to a lane past the known ones.
                let lane = lane.unwrap_or(c.lanes.len() as u64);
                ev(
                    out,
                    format!(
                        "{{\"ph\": \"X\", \"cat\": \"occl_proxy_step\", \"name\": \"{dir}Step\", \"pid\": {}, \"tid\": {}, \"ts\": {}, \"dur\": {}, \
                         \"args\": {{\"step\": {step}, \"size\": {}, \"states\": {}}}}}",
                        v.pid,
                        LANE_TID_BASE + lane * LANE_TIDS + 1 + slot,
                        us(r.start_ns),
                        us(r.end_ns - r.start_ns),
                        r.bytes,
                        q(&marks_text(r))
                    ),
                )?;
            }
            _ => {}
        }
    }

    // Names for Perfetto's tracks.
    let meta = |pid: u32, tid: u64, what: &str, name: &str| {
        format!(
            "{{\"ph\": \"M\", \"name\": \"{what}\", \"pid\": {pid}, \"tid\": {tid}, \"args\": {{\"name\": {}}}}}",
            q(name)
        )
    };
    ev(out, meta(v.pid, 0, "process_name", &format!("occl rank {rank} (pid {})", v.pid)))?;
    ev(out, meta(DEVICE_PID, 0, "process_name", &format!("occl rank {rank} collectives")))?;
    for (tid, name) in v.threads {
        ev(out, meta(v.pid, u64::from(*tid), "thread_name", name))?;
    }
    for (s, comm) in c.stream_names.clone() {
        let hash = c.comm(comm).map_or(0, |m| m.hash);
        ev(out, meta(DEVICE_PID, s, "thread_name", &format!("stream {s} (comm {hash:016x})")))?;
    }
    for (i, (comm, ch, peer, send)) in c.lanes.clone().into_iter().enumerate() {
        let hash = c.comm(comm).map_or(0, |m| m.hash);
        let dir = if send { format!("send to {peer}") } else { format!("recv from {peer}") };
        let base = LANE_TID_BASE + i as u64 * LANE_TIDS;
        ev(out, meta(v.pid, base, "thread_name", &format!("proxy comm {hash:016x} ch {ch} {dir}")))?;
        if v.proxy == ProxyDetail::Steps {
            for k in 0..STEP_SLOTS {
                ev(out, meta(v.pid, base + 1 + k, "thread_name", &format!("  steps {dir} slot {k}")))?;
            }
        }
    }
    writeln!(out)?;
    writeln!(out, "  ]")?;
    writeln!(out, "}}")?;
    Ok(())
}

/// Widens the extent of `r`'s parent over `r`.
fn widen(extent: &mut HashMap<(u16, u64), (u64, u64)>, r: &Rec) {
    let e = extent.entry((r.comm, r.parent)).or_insert((r.start_ns, r.end_ns));
    *e = (e.0.min(r.start_ns), e.1.max(r.end_ns));
}

/// The call's CPU row, at its start as the step grid writes it.
fn api_row(grid: &StepGrid, pid: u32, r: &Rec, func: &str, corr: u64, extra: &str) -> String {
    let ts = grid.call_ns(r.start_ns);
    format!(
        "{{\"ph\": \"X\", \"cat\": \"cuda_runtime\", \"name\": {}, \"pid\": {pid}, \"tid\": {}, \"ts\": {}, \"dur\": {}, \"args\": {{\"correlation\": {corr}{extra}}}}}",
        q(&names::api_name(func)),
        r.tid,
        us(ts),
        us(r.end_ns.saturating_sub(ts))
    )
}

/// A collective's kernel-like row, its call row if the call was not recorded, and the flow
/// arrow between them.
#[allow(clippy::too_many_arguments)]
fn kernel(
    c: &mut Ctx<'_, '_>,
    out: &mut dyn Write,
    ev: &mut dyn FnMut(&mut dyn Write, String) -> io::Result<()>,
    r: &Rec,
    name: &str,
    func: &str,
    count: usize,
    datatype: &str,
    extra: &str,
) -> io::Result<()> {
    let pid = c.v.pid;
    let api = (r.parent != 0).then(|| c.api.get(&(r.comm, r.parent)).copied()).flatten();
    let (corr, stream, launch) = match api {
        Some(a) => {
            let addr = match a.descr {
                EventDescr::CollApi { stream, .. } | EventDescr::P2pApi { stream, .. } => stream,
                _ => 0,
            };
            (c.correlation(r.comm, a.id), c.stream(r.comm, addr), a)
        }
        None => {
            let corr = c.fresh_correlation();
            ev(out, api_row(&c.grid, pid, r, func, corr, ", \"synthesized\": true"))?;
            (corr, c.stream(r.comm, 0), r)
        }
    };
    let children = c.extent.get(&(r.comm, r.id)).or_else(|| c.ce_extent.get(&(r.comm, r.parent)));
    let (ts, end) = match children {
        Some(&(s, e)) if s >= r.end_ns => (s, e),
        Some(&(_, e)) => (r.start_ns, e.max(r.end_ns)),
        None => (r.start_ns, r.end_ns),
    };
    let args = c.comm_args(r.comm, func, count, datatype);
    ev(
        out,
        format!(
            "{{\"ph\": \"X\", \"cat\": \"kernel\", \"name\": {}, \"pid\": {DEVICE_PID}, \"tid\": {stream}, \"ts\": {}, \"dur\": {}, \
             \"args\": {{\"device\": {DEVICE_PID}, \"stream\": {stream}, \"correlation\": {corr}, {args}{extra}}}}}",
            q(name),
            us(ts),
            us(end - ts)
        ),
    )?;
    ev(
        out,
        format!(
            "{{\"ph\": \"s\", \"id\": {corr}, \"pid\": {pid}, \"tid\": {}, \"ts\": {}, \"cat\": \"ac2g\", \"name\": \"ac2g\"}}",
            launch.tid,
            us(c.grid.call_ns(launch.start_ns))
        ),
    )?;
    ev(
        out,
        format!(
            "{{\"ph\": \"f\", \"id\": {corr}, \"pid\": {DEVICE_PID}, \"tid\": {stream}, \"ts\": {}, \"cat\": \"ac2g\", \"name\": \"ac2g\", \"bp\": \"e\"}}",
            us(ts)
        ),
    )
}

/// "SendGPUWait +0.000us, SendWait +1.234us": a row's state changes after its start.
fn marks_text(r: &Rec) -> String {
    let parts: Vec<String> = r
        .marks()
        .iter()
        .map(|&(s, dt)| format!("{} +{}us", names::state_name(u32::from(s)), us(u64::from(dt))))
        .collect();
    parts.join(", ")
}
