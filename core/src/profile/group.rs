//! The events of a user's group (`occl::group_start` … `group_end`) on one communicator, as
//! NCCL 2.28+ emits them: one GroupApi, started at the group's first call on the communicator
//! with `groupDepth` = the user's nesting + 1 and StartApiStop; each call's CollApi/P2pApi as a
//! child, started and stopped inside the call; EndApiStart when the outermost `group_end` runs
//! the group; then one Group event, under which every operation's Coll/P2p starts (parent: its
//! API event, `parentGroup`: the Group); both stop when the last operation is done.
//!
//! The mask is captured at the first call and applies to the whole group (NCCL captures it when
//! a task is enqueued).

use super::op::{self, OpDescr};
use super::running::{Enclosing, Running};
use occl_events::event::ProxyCtrlState;
use occl_events::{EventDescr, EventId, EventMask, Fanout, GroupApiState, StateArgs};
use std::sync::Arc;

/// A group's events on one communicator. Dropping it stops whatever it started, so a group
/// that is discarded (an error, a panic) leaves no event open.
pub(crate) struct GroupProf {
    f: Arc<Fanout>,
    mask: EventMask,
    group_api: Option<EventId>,
    group: Option<EventId>,
    launched: bool,
}

impl GroupProf {
    /// Captures the mask and starts the GroupApi event at `depth`.
    pub(crate) fn open(f: &Arc<Fanout>, depth: usize) -> GroupProf {
        let mask = f.capture();
        let mut g = GroupProf { f: f.clone(), mask, group_api: None, group: None, launched: false };
        if mask.contains(occl_events::EventType::GroupApi) {
            let depth = depth.min(i32::MAX as usize) as i32;
            g.group_api = g.f.start(None, &EventDescr::GroupApi { graph_captured: false, group_depth: depth });
            g.state(GroupApiState::StartApiStop);
        }
        g
    }

    fn state(&self, state: GroupApiState) {
        if let Some(id) = self.group_api {
            self.f.state(id, &StateArgs::GroupApi { state });
        }
    }

    /// The mask every operation of the group uses.
    pub(crate) fn mask(&self) -> EventMask {
        self.mask
    }

    /// The Group event, once launched: the `parentGroup` of every Coll/P2p.
    pub(crate) fn group(&self) -> Option<EventId> {
        self.group
    }

    pub(crate) fn fanout(&self) -> &Fanout {
        &self.f
    }

    /// Marks this group as running one of its collectives on this thread, with `api` its API
    /// event, until the guard drops: the operation's Coll hangs under the group's events.
    pub(crate) fn running(&self, api: Option<EventId>) -> Running {
        Running::set(Enclosing::new(&self.f, self.mask, api, self.group))
    }

    /// The API event of one call of the group (started and stopped now, during the call).
    pub(crate) fn api(&self, d: &OpDescr<'_>) -> Option<EventId> {
        op::api_event(&self.f, self.mask, self.group_api, d)
    }

    /// The outermost `group_end` runs the group: EndApiStart, the progress engine turns
    /// active, and the Group event starts.
    pub(crate) fn launch(&mut self) {
        if self.launched || self.mask.is_empty() {
            return;
        }
        self.launched = true;
        self.state(GroupApiState::EndApiStart);
        op::marker(&self.f, self.mask, ProxyCtrlState::Active);
        if self.mask.contains(occl_events::EventType::Group) {
            self.group = self.f.start(None, &EventDescr::Group);
        }
    }
}

impl Drop for GroupProf {
    fn drop(&mut self) {
        if let Some(id) = self.group.take() {
            self.f.stop(id);
        }
        if let Some(id) = self.group_api.take() {
            self.f.stop(id);
        }
        if self.launched {
            op::marker(&self.f, self.mask, ProxyCtrlState::Idle);
        }
    }
}
