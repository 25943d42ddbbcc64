//! One communicator's view of a C plugin: `init` on creation, then a [`Sink`] that converts every
//! event to the plugin's API version and calls through its function table.

use super::abi::{DescrV1, DescrV2, DescrV3, DescrV4, DescrV5, DescrV6, StateArgsV1, StateArgsV4};
use super::convert::{self, CommRef, Links};
use super::load::{Init, Library};
use super::logger::logger;
use super::ApiVersion;
use crate::activation;
use crate::event::{EventDescr, EventId, StateArgs};
use crate::idtable::IdTable;
use crate::mask::EventMask;
use crate::profiler::CommInfo;
use crate::sink::Sink;
use std::ffi::{c_char, c_void, CString};
use std::ptr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// A communicator's plugin context and the handles of its events.
pub(crate) struct PluginSink {
    /// Keeps the library loaded (and the function pointers valid) while the sink lives.
    lib: Arc<Library>,
    /// The plugin's `context` (never NULL: a NULL context yields no sink).
    ctx: usize,
    /// NCCL's `commName` lives as long as the communicator; so does this copy.
    comm_name: Option<CString>,
    comm_hash: u64,
    handles: IdTable<usize>,
    finalized: AtomicBool,
}

/// Calls the plugin's `init` for one communicator. `None` when init fails (logged as a warning)
/// or leaves a NULL context (the plugin opted out of this communicator).
pub(crate) fn init(lib: Arc<Library>, comm: &CommInfo<'_>) -> Option<PluginSink> {
    // A name with an interior NUL cannot be a C string; the plugin gets NULL, as for no name.
    let comm_name = comm.comm_name.and_then(|n| CString::new(n).ok());
    let name_ptr: *const c_char = comm_name.as_ref().map_or(ptr::null(), |c| c.as_ptr());
    let mask = activation::global().as_ptr();
    let mut ctx: *mut c_void = ptr::null_mut();
    let (hash, n_nodes, nranks, rank) = (comm.comm_hash, comm.n_nodes, comm.nranks, comm.rank);
    // SAFETY: the function pointers are non-NULL entries of the table of this version (checked
    // at load) and the library is held by `lib`. `ctx` is a valid out-pointer, `mask` points to
    // the process-global mask (static, atomic), `name_ptr` is NULL or a C string that the sink
    // keeps alive, and the logger is the C shim with NCCL's signature.
    let rc = unsafe {
        match lib.funcs.init {
            Init::V1(f) => f(&mut ctx, mask),
            Init::V4(f) => f(&mut ctx, mask, name_ptr, hash, n_nodes, nranks, rank, Some(logger())),
            Init::V5(f) => f(&mut ctx, hash, mask, name_ptr, n_nodes, nranks, rank, Some(logger())),
        }
    };
    if rc != 0 {
        tracing::warn!(
            "profiler plugin {:?} ({}, {}): init for communicator {hash:#x} rank {rank} returned {rc}; \
             no events for this communicator",
            lib.name,
            lib.origin.describe(),
            lib.version.symbol_name(),
        );
        return None;
    }
    if ctx.is_null() {
        tracing::debug!("profiler plugin {:?}: NULL context for communicator {hash:#x} rank {rank}", lib.name);
        return None;
    }
    Some(PluginSink {
        lib,
        ctx: ctx as usize,
        comm_name,
        comm_hash: hash,
        handles: IdTable::default(),
        finalized: AtomicBool::new(false),
    })
}

impl PluginSink {
    fn ctx(&self) -> *mut c_void {
        self.ctx as *mut c_void
    }

    fn handle_of(&self, id: Option<EventId>) -> *mut c_void {
        id.and_then(|i| self.handles.get(i)).unwrap_or(0) as *mut c_void
    }

    /// `parentObj` (and v5+ `parentGroup`) for an event. Before v5, Coll/P2p hang under the
    /// legacy Group, as NCCL's v1–v4 adapters rewrite them.
    fn links(&self, parent: Option<EventId>, ev: &EventDescr<'_>) -> Links {
        let group = match *ev {
            EventDescr::Coll { parent_group, .. } | EventDescr::P2p { parent_group, .. } => parent_group,
            _ => None,
        };
        if self.lib.version < ApiVersion::V5 && group.is_some() {
            Links { parent: self.handle_of(group), group: ptr::null_mut() }
        } else {
            Links { parent: self.handle_of(parent), group: self.handle_of(group) }
        }
    }

    fn done(&self) -> bool {
        self.finalized.load(Ordering::Acquire)
    }

    /// Calls `startEvent` with a descriptor; the handle slot starts NULL.
    fn start_with<D>(&self, descr: Option<D>) -> Option<usize> {
        let mut d = descr?;
        let mut handle: *mut c_void = ptr::null_mut();
        // SAFETY: a non-NULL `startEvent` of the loaded library (held by `self.lib`); the context
        // came from this library's init; `d` is a descriptor of the plugin's version (chosen by
        // the caller) that lives for the call, and `handle` is a valid out-pointer. Return codes
        // are ignored, as NCCL ignores them.
        unsafe {
            (self.lib.funcs.start_event)(self.ctx(), &mut handle, ptr::from_mut(&mut d).cast());
        }
        Some(handle as usize)
    }
}

impl Sink for PluginSink {
    /// The global mask the plugin controls, less the types its version does not have (as NCCL
    /// clears the CE bits for a v5 plugin).
    fn interest(&self) -> EventMask {
        if self.done() {
            return EventMask::NONE;
        }
        activation::current() & self.lib.version.known_types()
    }

    fn dynamic(&self) -> bool {
        true
    }

    fn start(&self, id: EventId, parent: Option<EventId>, ev: &EventDescr<'_>) {
        let version = self.lib.version;
        if self.done() || !version.known_types().contains(ev.event_type()) {
            return;
        }
        let links = self.links(parent, ev);
        let comm = CommRef { name: self.comm_name.as_ref().map_or(ptr::null(), |c| c.as_ptr()), hash: self.comm_hash };
        let handle = match version {
            ApiVersion::V1 => self.start_with(convert::descr::<DescrV1>(ev, links, comm)),
            ApiVersion::V2 => self.start_with(convert::descr::<DescrV2>(ev, links, comm)),
            ApiVersion::V3 => self.start_with(convert::descr::<DescrV3>(ev, links, comm)),
            ApiVersion::V4 => self.start_with(convert::descr::<DescrV4>(ev, links, comm)),
            ApiVersion::V5 => self.start_with(convert::descr::<DescrV5>(ev, links, comm)),
            ApiVersion::V6 => self.start_with(convert::descr::<DescrV6>(ev, links, comm)),
        };
        // Stored even when NULL, so the event's states and stop are skipped rather than lost.
        if let Some(h) = handle {
            self.handles.insert(id, ev.event_type(), h);
        }
    }

    /// An event reported after it ran, at times measured elsewhere. occl reports its CeColl so,
    /// at a copy-engine call's device start and end. A v6 plugin times a CeColl itself instead:
    /// it records CUDA events on the descriptor's stream at the start and the stop, which NCCL
    /// calls around the enqueue. Called after the call has run, the plugin would time later
    /// work, or put its events into a graph the stream is capturing. So the plugin does not get
    /// these CeColl events, as NCCL 2.28 emits none. Any other event goes on as at its start.
    fn start_at(&self, id: EventId, parent: Option<EventId>, ev: &EventDescr<'_>, _t_ns: u64) {
        if !matches!(ev, EventDescr::CeColl { .. }) {
            self.start(id, parent, ev);
        }
    }

    fn state(&self, id: EventId, st: &StateArgs<'_>) {
        if self.done() {
            return;
        }
        let h = match self.handles.get(id) {
            Some(h) if h != 0 => h as *mut c_void,
            _ => return,
        };
        let record = self.lib.funcs.record_event_state;
        if self.lib.version < ApiVersion::V4 {
            let Some((state, mut args)) = convert::state_v1(st) else { return };
            // SAFETY: a non-NULL `recordEventState` of the held library, a handle this plugin
            // returned, and 16-byte v1–v3 arguments that live for the call.
            unsafe {
                record(h, state, ptr::from_mut::<StateArgsV1>(&mut args).cast());
            }
        } else {
            let Some((state, mut args)) = convert::state_v4(st, self.lib.version) else { return };
            let p = args.as_mut().map_or(ptr::null_mut(), |a| ptr::from_mut::<StateArgsV4>(a).cast());
            // SAFETY: as above, with 8-byte v4+ arguments or NULL (GroupApi states, as in NCCL).
            unsafe {
                record(h, state, p);
            }
        }
    }

    fn stop(&self, id: EventId) {
        if self.done() {
            return;
        }
        match self.handles.stop(id) {
            // SAFETY: a non-NULL `stopEvent` of the held library and a non-NULL handle this
            // plugin returned for a started event.
            Some(h) if h != 0 => unsafe {
                (self.lib.funcs.stop_event)(h as *mut c_void);
            },
            _ => {}
        }
    }

    fn finalize(&self) {
        if self.finalized.swap(true, Ordering::AcqRel) {
            return;
        }
        // SAFETY: a non-NULL `finalize` of the held library, with the non-NULL context its init
        // returned; called once (the swap above), and no call follows it.
        let rc = unsafe { (self.lib.funcs.finalize)(self.ctx()) };
        if rc != 0 {
            tracing::debug!("profiler plugin {:?}: finalize returned {rc}", self.lib.name);
        }
    }
}

impl Drop for PluginSink {
    /// A communicator dropped without `finalize` still lets the plugin release its context before
    /// the library may be closed.
    fn drop(&mut self) {
        Sink::finalize(self);
    }
}

/// Wraps a sink for the registry.
pub(crate) fn into_sink(s: PluginSink) -> Arc<dyn Sink> {
    Arc::new(s)
}
