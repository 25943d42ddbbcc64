//! How an occl span reads in OpenTelemetry and `tracing`: span names, attributes and span
//! events, shared by the OTLP exporter, the OpenTelemetry bridge and the `tracing` spans.
//!
//! Names are low-cardinality, as the conventions ask: the NCCL API call for CollApi/P2pApi
//! (`ncclAllReduce`), the collective for Coll/P2p (`AllReduce`, `Send`), `ncclGroup` for the
//! GroupApi, `group launch` for the legacy Group, `proxy send`/`proxy recv` for a ProxyOp and
//! `proxy step send`/`proxy step recv` for a sampled ProxyStep. Everything that varies (seq,
//! count, bytes, peer, rank, communicator) is an attribute under `occl.`; every state change is
//! a span event named as NCCL names the state, with its byte count where it has one.

use crate::event::{EventDescr, EventType};
use crate::spans::{CommMeta, StateMark};
use std::borrow::Cow;

/// An attribute value.
#[derive(Clone, Debug, PartialEq)]
pub enum Val {
    Str(Cow<'static, str>),
    Int(i64),
    Bool(bool),
}

pub type Attr = (Cow<'static, str>, Val);

fn s(v: &'static str) -> Val {
    Val::Str(Cow::Borrowed(v))
}

fn int<T: TryInto<i64>>(v: T) -> Val {
    Val::Int(v.try_into().unwrap_or(i64::MAX))
}

fn a(k: &'static str, v: Val) -> Attr {
    (Cow::Borrowed(k), v)
}

/// Bytes of one element of an NCCL datatype; 0 when unknown.
pub fn datatype_size(dt: &str) -> u64 {
    occl_types::DataType::from_nccl_name(dt).map_or(0, |d| d.size() as u64)
}

/// NCCL's name of a state number (`Unknown` for one NCCL does not define).
pub fn state_name(state: u32) -> &'static str {
    crate::event::state_name(state).unwrap_or("Unknown")
}

/// A ProxyStep's direction from its first state (sends start in SendGPUWait, receives in RecvWait).
fn step_is_send(first_state: Option<u32>) -> Option<bool> {
    match first_state? {
        8 | 9 | 20 => Some(true),
        10..=12 => Some(false),
        _ => None,
    }
}

fn payload(count: usize, datatype: &'static str, attrs: &mut Vec<Attr>) {
    attrs.push(a("occl.count", int(count)));
    attrs.push(a("occl.datatype", s(datatype)));
    let size = datatype_size(datatype);
    if size > 0 {
        attrs.push(a("occl.bytes", int((count as u64).saturating_mul(size))));
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct OutEvent {
    pub t_ns: u64,
    pub name: &'static str,
    pub attrs: Vec<Attr>,
}

/// The name and attributes of a span of `comm`. `marks`: its state marks; `steps_done`: a
/// ProxyOp's finished steps, `None` where ProxySteps are not collected (the count means nothing).
pub fn describe(
    comm: &CommMeta,
    descr: &EventDescr<'static>,
    marks: &[StateMark],
    steps_done: Option<u32>,
) -> (Cow<'static, str>, Vec<Attr>) {
    let mut attrs: Vec<Attr> = Vec::with_capacity(14);
    attrs.push(a("occl.comm.hash", Val::Str(Cow::Owned(format!("{:016x}", comm.hash)))));
    if let Some(n) = &comm.name {
        attrs.push(a("occl.comm.name", Val::Str(Cow::Owned(n.clone()))));
    }
    attrs.push(a("occl.rank", int(comm.rank)));
    attrs.push(a("occl.nranks", int(comm.nranks)));
    let t = descr.event_type();
    attrs.push(a("occl.event", s(t.name())));
    let name: Cow<'static, str> = match *descr {
        EventDescr::GroupApi { graph_captured, group_depth } => {
            attrs.push(a("occl.group.depth", int(group_depth)));
            attrs.push(a("occl.graph_captured", Val::Bool(graph_captured)));
            Cow::Borrowed("ncclGroup")
        }
        EventDescr::CollApi { func, count, datatype, root, graph_captured, .. } => {
            attrs.push(a("occl.op", s(func)));
            payload(count, datatype, &mut attrs);
            attrs.push(a("occl.root", int(root)));
            attrs.push(a("occl.graph_captured", Val::Bool(graph_captured)));
            Cow::Owned(format!("nccl{func}"))
        }
        EventDescr::P2pApi { func, count, datatype, graph_captured, .. } => {
            attrs.push(a("occl.op", s(func)));
            payload(count, datatype, &mut attrs);
            attrs.push(a("occl.graph_captured", Val::Bool(graph_captured)));
            Cow::Owned(format!("nccl{func}"))
        }
        EventDescr::Group => Cow::Borrowed("group launch"),
        EventDescr::Coll { seq_number, func, count, root, datatype, n_channels, algo, proto, .. } => {
            attrs.push(a("occl.op", s(func)));
            attrs.push(a("occl.seq", int(seq_number)));
            payload(count, datatype, &mut attrs);
            attrs.push(a("occl.root", int(root)));
            attrs.push(a("occl.algo", s(algo)));
            attrs.push(a("occl.proto", s(proto)));
            attrs.push(a("occl.channels", int(n_channels)));
            Cow::Borrowed(func)
        }
        EventDescr::P2p { func, datatype, count, peer, n_channels, .. } => {
            attrs.push(a("occl.op", s(func)));
            payload(count, datatype, &mut attrs);
            attrs.push(a("occl.peer", int(peer)));
            attrs.push(a("occl.channels", int(n_channels)));
            Cow::Borrowed(func)
        }
        EventDescr::ProxyOp { pid, channel_id, peer, n_steps, chunk_size, is_send, .. } => {
            attrs.push(a("occl.peer", int(peer)));
            attrs.push(a("occl.direction", s(if is_send { "send" } else { "recv" })));
            attrs.push(a("occl.channel", int(channel_id)));
            attrs.push(a("occl.steps", int(n_steps)));
            attrs.push(a("occl.chunk.bytes", int(chunk_size)));
            attrs.push(a("process.pid", int(pid)));
            if let Some(done) = steps_done {
                attrs.push(a("occl.steps.done", int(done)));
            }
            Cow::Borrowed(if is_send { "proxy send" } else { "proxy recv" })
        }
        EventDescr::ProxyStep { step, .. } => {
            attrs.push(a("occl.step", int(step)));
            let bytes = marks.iter().map(|m| m.value).max().unwrap_or(0);
            attrs.push(a("occl.bytes", int(bytes)));
            match step_is_send(marks.first().map(|m| m.state)) {
                Some(true) => {
                    attrs.push(a("occl.direction", s("send")));
                    Cow::Borrowed("proxy step send")
                }
                Some(false) => {
                    attrs.push(a("occl.direction", s("recv")));
                    Cow::Borrowed("proxy step recv")
                }
                None => Cow::Borrowed("proxy step"),
            }
        }
        EventDescr::KernelCh { channel_id, .. } => {
            attrs.push(a("occl.channel", int(channel_id)));
            Cow::Borrowed("kernel channel")
        }
        EventDescr::KernelLaunch { .. } => Cow::Borrowed("kernel launch"),
        EventDescr::CeColl { seq_number, func, count, root, datatype, .. } => {
            attrs.push(a("occl.op", s(func)));
            attrs.push(a("occl.seq", int(seq_number)));
            payload(count, datatype, &mut attrs);
            attrs.push(a("occl.root", int(root)));
            Cow::Borrowed("copy-engine call")
        }
        _ => Cow::Borrowed(t.name()),
    };
    (name, attrs)
}

/// A span's state marks as span events.
pub fn events(t: EventType, marks: &[StateMark]) -> Vec<OutEvent> {
    marks
        .iter()
        .map(|m| {
            let mut ea = Vec::new();
            let with_bytes = matches!(t, EventType::ProxyStep | EventType::ProxyOp);
            if with_bytes && m.value > 0 {
                ea.push(a("occl.bytes", int(m.value)));
            }
            OutEvent { t_ns: m.t_ns, name: state_name(m.state), attrs: ea }
        })
        .collect()
}
