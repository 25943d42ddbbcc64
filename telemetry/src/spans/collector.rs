//! [`Telemetry`] (the profiler) and [`CommSpans`] (its sink per communicator): open events, trace
//! roots (both in `open.rs`), and the hand-off of finished spans to the exporters.

use super::intern::intern_field;
use super::open::{OpenTable, RootRing, Start};
use super::{clock, CommMeta, Exporter, Span, Started, StateMark, MAX_PAYLOAD};
use crate::event::{EventDescr, EventId, EventType, OpTotals, StateArgs, StepTotals};
use crate::mask::EventMask;
use crate::profiler::{CommInfo, Profiler};
use crate::sink::{Note, Sink};
use std::sync::Arc;

/// The span collector: one per process in practice ([`crate::exporters::global`]), handing finished
/// spans of every communicator to its exporters.
pub struct Telemetry {
    exporters: Vec<Arc<dyn Exporter>>,
}

impl Telemetry {
    pub fn new(exporters: Vec<Arc<dyn Exporter>>) -> Telemetry {
        Telemetry { exporters }
    }

    pub fn exporters(&self) -> &[Arc<dyn Exporter>] {
        &self.exporters
    }

    /// Every exporter's metrics, in Prometheus text format.
    pub fn render_metrics(&self, out: &mut String) {
        for e in &self.exporters {
            e.render_metrics(out);
        }
    }

    /// Every exporter's metrics, as a snapshot.
    pub fn metrics(&self) -> Vec<crate::metrics::Family> {
        let mut v = Vec::new();
        for e in &self.exporters {
            e.metrics(&mut v);
        }
        v
    }

    /// Every exporter's metrics as one OpenMetrics 1.0 exposition (with its `# EOF`).
    pub fn render_openmetrics(&self) -> String {
        crate::metrics::text::openmetrics(&self.metrics())
    }

    /// Flushes every exporter.
    pub fn flush(&self) {
        for e in &self.exporters {
            e.flush();
        }
    }

    /// The sink for one communicator (what `init` returns, typed).
    pub fn comm_sink(&self, comm: CommMeta) -> Arc<CommSpans> {
        let comm = Arc::new(comm);
        let exporters: Vec<(u64, Arc<dyn Exporter>)> =
            self.exporters.iter().filter(|e| e.takes(&comm)).map(|e| (e.interest().0, e.clone())).collect();
        for (_, e) in &exporters {
            e.comm_init(&comm);
        }
        let mut mask = EventMask(exporters.iter().fold(0, |m, (i, _)| m | i));
        // Operation sums skip the spans: only if no exporter needs them.
        if !exporters.iter().all(|(i, _)| EventMask(*i).wants_op_totals()) {
            mask = EventMask(mask.0 & !EventMask::OP_TOTALS.0);
        }
        let starters = exporters.iter().filter(|(_, e)| e.wants_starts()).cloned().collect();
        Arc::new(CommSpans { comm, exporters, starters, mask, open: OpenTable::default(), roots: RootRing::default() })
    }
}

impl Profiler for Telemetry {
    fn name(&self) -> &str {
        "occl-telemetry"
    }

    /// Declines (`None`) a communicator that none of its exporters takes ([`Exporter::takes`]).
    fn init(&self, c: &CommInfo<'_>) -> Option<Arc<dyn Sink>> {
        let meta = CommMeta {
            name: c.comm_name.map(str::to_owned),
            hash: c.comm_hash,
            rank: c.rank,
            nranks: c.nranks,
            n_nodes: c.n_nodes,
        };
        if !self.exporters.is_empty() && !self.exporters.iter().any(|e| e.takes(&meta)) {
            return None;
        }
        Some(self.comm_sink(meta))
    }
}

/// The collector's sink for one communicator.
pub struct CommSpans {
    comm: Arc<CommMeta>,
    /// Each exporter with its interest bits.
    exporters: Vec<(u64, Arc<dyn Exporter>)>,
    /// Those of them that hear starts ([`Exporter::wants_starts`]).
    starters: Vec<(u64, Arc<dyn Exporter>)>,
    mask: EventMask,
    open: OpenTable,
    /// Trace root of each event that may still get children (kept a while after its stop).
    roots: RootRing,
}

impl CommSpans {
    pub fn comm(&self) -> &Arc<CommMeta> {
        &self.comm
    }

    /// Events started and not yet stopped.
    pub fn open_events(&self) -> usize {
        self.open.len()
    }

    /// Whether an exporter wants the ProxyStep `id` as a span (or its sums).
    fn keeps_step(&self, id: EventId) -> bool {
        let bit = EventType::ProxyStep.bit();
        self.mask.wants_totals() || self.exporters.iter().any(|(i, e)| i & bit != 0 && e.keeps_step(id))
    }

    /// Step sums to the exporters that want them.
    fn totals(&self, t: &StepTotals) {
        for (interest, e) in &self.exporters {
            if interest & EventMask::STEP_TOTALS.0 != 0 {
                e.step_totals(&self.comm, t);
            }
        }
    }

    fn root_of(&self, parent: EventId) -> Option<EventId> {
        self.roots.get(parent).or_else(|| self.open.with(parent, |o| o.root))
    }
}

/// The descriptor with `'static` names; a NetPlugin payload is returned beside it.
fn own<'a>(ev: &EventDescr<'a>) -> (EventDescr<'static>, &'a [u8]) {
    use crate::nccl::names::Field;
    use EventDescr as D;
    let (f, dt) = (|s| intern_field(Field::Func, s), |s| intern_field(Field::Datatype, s));
    let d = match *ev {
        D::Group => D::Group,
        D::Coll {
            rank,
            seq_number,
            func,
            send_buff,
            recv_buff,
            count,
            root,
            datatype,
            n_channels,
            n_warps,
            algo,
            proto,
            parent_group,
        } => D::Coll {
            rank,
            seq_number,
            func: f(func),
            send_buff,
            recv_buff,
            count,
            root,
            datatype: dt(datatype),
            n_channels,
            n_warps,
            algo: intern_field(Field::Algo, algo),
            proto: intern_field(Field::Proto, proto),
            parent_group,
        },
        D::P2p { rank, func, buff, datatype, count, peer, n_channels, parent_group } => {
            D::P2p { rank, func: f(func), buff, datatype: dt(datatype), count, peer, n_channels, parent_group }
        }
        D::ProxyOp { rank, pid, channel_id, peer, n_steps, chunk_size, is_send } => {
            D::ProxyOp { rank, pid, channel_id, peer, n_steps, chunk_size, is_send }
        }
        D::ProxyStep { rank, step } => D::ProxyStep { rank, step },
        D::ProxyCtrl => D::ProxyCtrl,
        D::KernelCh { channel_id, p_timer } => D::KernelCh { channel_id, p_timer },
        D::NetPlugin { rank, id, data } => {
            return (D::NetPlugin { rank, id, data: &[] }, &data[..data.len().min(MAX_PAYLOAD)]);
        }
        D::GroupApi { graph_captured, group_depth } => D::GroupApi { graph_captured, group_depth },
        D::CollApi { func, count, datatype, root, stream, graph_captured } => {
            D::CollApi { func: f(func), count, datatype: dt(datatype), root, stream, graph_captured }
        }
        D::P2pApi { func, count, datatype, stream, graph_captured } => {
            D::P2pApi { func: f(func), count, datatype: dt(datatype), stream, graph_captured }
        }
        D::KernelLaunch { stream } => D::KernelLaunch { stream },
        D::CeColl {
            seq_number,
            func,
            send_buff,
            recv_buff,
            count,
            root,
            datatype,
            sync_strategy,
            intra_batch_sync,
            batch_size,
            num_batches,
            ce_seq_num,
            stream,
        } => D::CeColl {
            seq_number,
            func: f(func),
            send_buff,
            recv_buff,
            count,
            root,
            datatype: dt(datatype),
            sync_strategy: intern_field(Field::SyncStrategy, sync_strategy),
            intra_batch_sync,
            batch_size,
            num_batches,
            ce_seq_num,
            stream,
        },
        D::CeSync { is_complete, n_ranks } => D::CeSync { is_complete, n_ranks },
        D::CeBatch { num_ops, total_bytes, use_intra_sync } => D::CeBatch { num_ops, total_bytes, use_intra_sync },
    };
    (d, &[])
}

/// A state's number worth keeping (see [`StateMark::value`]).
fn state_value(st: &StateArgs<'_>) -> u64 {
    match *st {
        StateArgs::ProxyOp { trans_size, .. } | StateArgs::ProxyStep { trans_size, .. } => trans_size as u64,
        StateArgs::ProxyCtrl { appended_proxy_ops, .. } => appended_proxy_ops.max(0) as u64,
        StateArgs::KernelChStop { p_timer } => p_timer,
        StateArgs::NetPluginUpdate { .. } | StateArgs::GroupApi { .. } | StateArgs::Ce { .. } => 0,
    }
}

impl CommSpans {
    /// `start`, at `at` or now.
    fn begin(&self, id: EventId, parent: Option<EventId>, ev: &EventDescr<'_>, at: Option<u64>) {
        // A parent this sink no longer knows (retired long ago) still names a tree: use it.
        let root = parent.map_or(id, |p| self.root_of(p).unwrap_or(p));
        self.roots.insert(id, root);
        if self.mask.0 & EventMask::route_bits(ev.event_type()) == 0 {
            // An ancestor that no exporter wants (the fan-out sends NCCL's implied parents):
            // only its children's trace root is kept; its states and stop find no entry.
            return;
        }
        if let EventDescr::ProxyStep { .. } = ev {
            if !self.keeps_step(id) {
                // Counted in its ProxyOp's steps_done, nothing more: no clock, no span.
                let (descr, payload) = (EventDescr::ProxyStep { rank: 0, step: 0 }, &[][..]);
                self.open.start(id, Start { light: true, parent, root, start_ns: 0, descr, payload });
                return;
            }
        }
        let start_ns = at.unwrap_or_else(clock::unix_nanos);
        let (descr, payload) = own(ev);
        let bit = descr.event_type().bit();
        for (interest, e) in &self.starters {
            if interest & bit != 0 {
                e.start(&Started { comm: &self.comm, id, parent, root, start_ns, descr: &descr });
            }
        }
        self.open.start(id, Start { light: false, parent, root, start_ns, descr, payload });
    }

    /// `stop`, at `at` or now.
    fn end(&self, id: EventId, at: Option<u64>) {
        let step_of = self.open.stop(id, |o, states, steps_done| {
            if o.light {
                return o.parent;
            }
            let end_ns = at.unwrap_or_else(clock::unix_nanos);
            let span = Span {
                comm: &self.comm,
                id,
                parent: o.parent,
                root: o.root,
                start_ns: o.start_ns,
                end_ns,
                descr: o.descr,
                payload: &o.payload,
                states,
                states_dropped: o.states_dropped,
                steps_done,
            };
            let bit = span.event_type().bit();
            for (interest, e) in &self.exporters {
                if interest & bit != 0 {
                    e.span(&span);
                }
            }
            if bit == EventType::ProxyStep.bit() && self.mask.wants_totals() {
                if let Some(t) = span.as_step_totals() {
                    self.totals(&t);
                }
            }
            o.parent.filter(|_| matches!(o.descr, EventDescr::ProxyStep { .. }))
        });
        // Counted after the step's own entry is released: two entries are never held at once.
        if let Some(op) = step_of.flatten() {
            self.open.count_steps(op, 1);
        }
    }
}

impl Sink for CommSpans {
    fn interest(&self) -> EventMask {
        self.mask
    }

    fn start(&self, id: EventId, parent: Option<EventId>, ev: &EventDescr<'_>) {
        self.begin(id, parent, ev, None);
    }

    fn start_at(&self, id: EventId, parent: Option<EventId>, ev: &EventDescr<'_>, t_ns: u64) {
        self.begin(id, parent, ev, Some(t_ns));
    }

    fn state(&self, id: EventId, st: &StateArgs<'_>) {
        // The clock is read only for an event this sink keeps.
        self.open.state(id, || StateMark { t_ns: clock::unix_nanos(), state: st.state_raw(), value: state_value(st) });
    }

    fn stop(&self, id: EventId) {
        self.end(id, None);
    }

    fn stop_at(&self, id: EventId, t_ns: u64) {
        self.end(id, Some(t_ns));
    }

    fn step_totals(&self, op: EventId, totals: &StepTotals) {
        self.totals(totals);
        self.open.count_steps(op, totals.steps);
    }

    fn op_totals(&self, totals: &OpTotals<'_>) {
        for (_, e) in &self.exporters {
            e.op_totals(&self.comm, totals);
        }
    }

    fn note(&self, note: &Note) {
        for (_, e) in &self.exporters {
            e.note(&self.comm, note);
        }
    }

    fn finalize(&self) {
        for (_, e) in &self.exporters {
            e.comm_finalize(&self.comm);
        }
    }
}

#[cfg(test)]
mod tests;
