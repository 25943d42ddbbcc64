//! The producer-facing registry of profilers: NCCL's five callbacks in Rust terms. A
//! [`Profiler`] is `init` (once per communicator, returning that communicator's [`Sink`], its
//! "context"); the sink's `start`/`state`/`stop` are `startEvent`/`recordEventState`/`stopEvent`,
//! and [`Sink::finalize`] is `finalize`. Applications and occl-telemetry's own sinks register
//! here; an NCCL C-ABI plugin is one more `Profiler`.

use crate::sink::Sink;
use std::sync::{Arc, Mutex, PoisonError};

/// What NCCL's `init` tells a profiler about the communicator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CommInfo<'a> {
    /// `config.commName`, if the application gave one.
    pub comm_name: Option<&'a str>,
    /// The communicator's 64-bit id, identical on every rank (NCCL's `commHash` / `commId`).
    pub comm_hash: u64,
    /// Hosts the communicator spans.
    pub n_nodes: i32,
    pub nranks: i32,
    pub rank: i32,
}

/// A profiler: creates one sink per communicator.
pub trait Profiler: Send + Sync + 'static {
    /// A short name for logs ("example-v5", "prometheus").
    fn name(&self) -> &str;

    /// Called once when a communicator is created; `None` opts out of this communicator (NCCL's
    /// `*context = NULL`). The communicator attaches the sink, calls `finalize` when it is
    /// destroyed, and then drops it.
    fn init(&self, comm: &CommInfo<'_>) -> Option<Arc<dyn Sink>>;
}

static REGISTRY: Mutex<Vec<Arc<dyn Profiler>>> = Mutex::new(Vec::new());

/// Registers a profiler for every communicator created from now on.
pub fn register(p: Arc<dyn Profiler>) {
    REGISTRY.lock().unwrap_or_else(PoisonError::into_inner).push(p);
}

/// Removes a registered profiler (compared by address); communicators that already hold its
/// sinks keep them until they are destroyed. Returns whether it was registered.
pub fn unregister(p: &Arc<dyn Profiler>) -> bool {
    let mut r = REGISTRY.lock().unwrap_or_else(PoisonError::into_inner);
    let before = r.len();
    r.retain(|q| !std::ptr::addr_eq(Arc::as_ptr(q), Arc::as_ptr(p)));
    r.len() != before
}

/// The registered profilers, in registration order.
pub fn registered() -> Vec<Arc<dyn Profiler>> {
    REGISTRY.lock().unwrap_or_else(PoisonError::into_inner).clone()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mask::EventMask;

    struct P;
    struct S;
    impl Sink for S {
        fn interest(&self) -> EventMask {
            EventMask::ALL
        }
    }
    impl Profiler for P {
        fn name(&self) -> &str {
            "p"
        }
        fn init(&self, comm: &CommInfo<'_>) -> Option<Arc<dyn Sink>> {
            (comm.rank == 0).then(|| Arc::new(S) as Arc<dyn Sink>)
        }
    }

    #[test]
    fn register_and_unregister_by_identity() {
        let p: Arc<dyn Profiler> = Arc::new(P);
        let q: Arc<dyn Profiler> = Arc::new(P);
        register(p.clone());
        assert!(registered().iter().any(|x| std::ptr::addr_eq(Arc::as_ptr(x), Arc::as_ptr(&p))));
        assert!(!unregister(&q));
        assert!(unregister(&p));
        assert!(!registered().iter().any(|x| std::ptr::addr_eq(Arc::as_ptr(x), Arc::as_ptr(&p))));
        let info = CommInfo { comm_name: None, comm_hash: 1, n_nodes: 1, nranks: 2, rank: 1 };
        assert!(p.init(&info).is_none());
        assert!(p.init(&CommInfo { rank: 0, ..info }).is_some());
    }
}
