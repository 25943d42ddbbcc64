//! The group running an operation on this thread: a group sets it around each collective it
//! runs through `Comm`'s normal path, and the operation's profiler reads it to hang its Coll
//! under the group's events (`OpProf::begin`).

use occl_events::{EventId, EventMask, Fanout};
use std::cell::Cell;

thread_local! {
    /// While a group runs one of its collectives: the events the group emitted for it.
    static RUNNING: Cell<Option<Enclosing>> = const { Cell::new(None) };
}

/// The events a group emitted for the operation it is running now on this thread.
#[derive(Clone, Copy)]
pub(crate) struct Enclosing {
    fanout: *const Fanout,
    pub mask: EventMask,
    pub api: Option<EventId>,
    pub group: Option<EventId>,
}

impl Enclosing {
    /// The events of a group on `fanout`'s communicator: its mask, the call's API event and the
    /// Group event.
    pub(crate) fn new(fanout: &Fanout, mask: EventMask, api: Option<EventId>, group: Option<EventId>) -> Enclosing {
        Enclosing { fanout, mask, api, group }
    }
}

/// The enclosing group's events, if a group is running an operation on `f`'s communicator on
/// this thread.
pub(crate) fn enclosing(f: &Fanout) -> Option<Enclosing> {
    RUNNING.with(Cell::get).filter(|e| std::ptr::eq(e.fanout, f))
}

/// Sets `RUNNING` for the life of the guard.
pub(crate) struct Running;

impl Running {
    pub(crate) fn set(e: Enclosing) -> Running {
        RUNNING.with(|r| r.set(Some(e)));
        Running
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        RUNNING.with(|r| r.set(None));
    }
}
