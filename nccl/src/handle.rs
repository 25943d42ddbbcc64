//! The communicator behind an `ncclComm_t`.
//!
//! An `ncclComm_t` is an `Arc<NcclComm>` turned into a raw pointer. Each call takes a reference
//! of its own for its duration, so `ncclCommAbort` or `ncclCommDestroy` on one thread never
//! frees a communicator that a call on another thread is still using: the `Comm` is destroyed
//! when the last of them returns. The `Comm` never moves once set, which occl's groups rely on
//! (a deferred call keeps its address until `ncclGroupEnd`).

use crate::abi::*;
use crate::error::{arg, is_fatal, usage, Result};
use crate::gpu::DevComm;
use occl::{Comm, Error};
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::mpsc::{Receiver, TryRecvError};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

/// `ncclComm_t`.
pub type ncclComm_t = *mut NcclComm;

/// A pre-multiply scalar: its bytes (`ncclScalarHostImmediate`), or where to read them when a
/// collective runs (`ncclScalarDevice`: the kernel reads it on a device call, the CPU on a host
/// call).
#[derive(Debug, Clone)]
pub(crate) enum Scalar {
    Immediate(Vec<u8>),
    Pointer(usize),
}

/// A user operator of `ncclRedOpCreatePreMulSum`.
#[derive(Debug, Clone)]
pub(crate) struct PreMul {
    pub dt: occl::DataType,
    pub scalar: Scalar,
}

/// A created communicator: host only, or on the GPU that was current at init.
pub(crate) enum Made {
    Host(Box<Comm>),
    Device(Box<DevComm>),
}

impl Made {
    fn comm(&self) -> &Comm {
        match self {
            Made::Host(c) => c,
            Made::Device(d) => d.cc.comm(),
        }
    }
}

pub struct NcclComm {
    /// The created communicator, or why its init failed (code and text).
    state: OnceLock<std::result::Result<Made, (ncclResult_t, String)>>,
    /// A background init (non-blocking, or begun inside a group) until it finishes.
    pending: Mutex<Option<Receiver<Result<Made>>>>,
    /// The first fatal error a call met (`ncclCommGetAsyncError`), 0 while none.
    async_err: AtomicI32,
    last_error: Mutex<Option<String>>,
    pub(crate) opts: Options,
    /// Operators from `ncclRedOpCreatePreMulSum`; op `NUM_OPS + i` is entry `i`.
    ops: Mutex<Vec<Option<PreMul>>>,
    /// Live `ncclCommRegister` and `ncclCommWindowRegister` handles (addresses of their boxes
    /// and the boxed type), so a stale or foreign handle is refused rather than freed.
    pub(crate) registrations: Mutex<Vec<(usize, std::any::TypeId)>>,
    /// `ncclCommRevoke` stopped it: no more operations, only shrink or destroy.
    revoked: AtomicBool,
    /// Device windows and device communicators (NCCL's device API). Declared after `state`, so
    /// the device communicator, with its symmetric windows, goes before their mappings close.
    pub(crate) lsa: Mutex<crate::lsa::State>,
}

// Calls on one communicator come from several threads (a collective on one, an abort or an
// error poll on another), so the handle must be shareable.
const _: fn() = || {
    fn shared<T: Send + Sync>() {}
    shared::<NcclComm>();
};

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl NcclComm {
    pub(crate) fn ready(comm: Made, opts: Options) -> Arc<NcclComm> {
        let c = NcclComm::empty(opts);
        let _ = c.state.set(Ok(comm));
        Arc::new(c)
    }

    pub(crate) fn background(rx: Receiver<Result<Made>>, opts: Options) -> Arc<NcclComm> {
        let c = NcclComm::empty(opts);
        *lock(&c.pending) = Some(rx);
        Arc::new(c)
    }

    fn empty(opts: Options) -> NcclComm {
        NcclComm {
            state: OnceLock::new(),
            pending: Mutex::new(None),
            async_err: AtomicI32::new(ncclSuccess),
            last_error: Mutex::new(None),
            opts,
            ops: Mutex::new(Vec::new()),
            registrations: Mutex::new(Vec::new()),
            revoked: AtomicBool::new(false),
            lsa: Mutex::default(),
        }
    }

    /// Gives the handle to C: one reference that `ncclCommDestroy`/`ncclCommAbort` release.
    pub(crate) fn into_raw(c: Arc<NcclComm>) -> ncclComm_t {
        Arc::into_raw(c).cast_mut()
    }

    /// A reference of the call's own to the communicator behind `p`.
    ///
    /// # Safety
    /// `p` is NULL or a handle from this library that has not been destroyed.
    pub(crate) unsafe fn from_handle(p: ncclComm_t) -> Result<Arc<NcclComm>> {
        if p.is_null() {
            return Err(arg("comm is NULL; pass a communicator from ncclCommInitRank or its kin"));
        }
        // SAFETY: p came from Arc::into_raw and still holds the handle's reference.
        unsafe {
            Arc::increment_strong_count(p.cast_const());
            Ok(Arc::from_raw(p.cast_const()))
        }
    }

    /// Takes back the handle's own reference (`ncclCommDestroy`, `ncclCommAbort`).
    ///
    /// # Safety
    /// As `from_handle`; `p` is not used again.
    pub(crate) unsafe fn release(p: ncclComm_t) {
        // SAFETY: the handle's reference, given by into_raw.
        drop(unsafe { Arc::from_raw(p.cast_const()) });
    }

    /// Moves a finished background init into `state`; true once the init has ended. A blocking
    /// wait takes the receiver out of the lock, so another thread polling meanwhile
    /// (`ncclCommGetAsyncError`) sees `ncclInProgress` instead of blocking too.
    pub(crate) fn settle(&self, block: bool) -> bool {
        if self.state.get().is_some() {
            return true;
        }
        let got = if block {
            let Some(rx) = lock(&self.pending).take() else { return self.state.get().is_some() };
            rx.recv().map_err(|_| TryRecvError::Disconnected)
        } else {
            let mut pending = lock(&self.pending);
            let Some(rx) = pending.as_ref() else { return self.state.get().is_some() };
            let got = rx.try_recv();
            if !matches!(got, Err(TryRecvError::Empty)) {
                *pending = None;
            }
            got
        };
        let outcome = match got {
            Ok(r) => r,
            Err(TryRecvError::Empty) => return false,
            Err(TryRecvError::Disconnected) => {
                Err(Error::InternalError("the init thread ended without a result".into()))
            }
        };
        let _ = self.state.set(outcome.map_err(|e| {
            let text = format!("communicator init: {e}");
            tracing::warn!("{text}");
            crate::error::set_last(text.clone());
            *lock(&self.last_error) = Some(text.clone());
            (crate::error::code_of(e.kind()), text)
        }));
        true
    }

    /// The communicator, once created.
    pub(crate) fn comm(&self) -> Result<&Comm> {
        self.made().map(Made::comm)
    }

    /// The device communicator, when the communicator was created on a GPU.
    pub(crate) fn device(&self) -> Result<Option<&DevComm>> {
        Ok(match self.made()? {
            Made::Device(d) => Some(d),
            Made::Host(_) => None,
        })
    }

    fn made(&self) -> Result<&Made> {
        if !self.settle(false) {
            return Err(usage(
                "the communicator is still being created (non-blocking init): poll ncclCommGetAsyncError until it \
                 returns ncclSuccess before using it",
            ));
        }
        match self.state.get() {
            Some(Ok(c)) => Ok(c),
            Some(Err((_, text))) => Err(usage(format!("the communicator failed to initialise ({text}); destroy it"))),
            None => Err(Error::InternalError("communicator state missing after init".into())),
        }
    }

    /// Marks the communicator revoked; false if it already was.
    pub(crate) fn revoke(&self) -> bool {
        !self.revoked.swap(true, Ordering::AcqRel)
    }

    /// Refuses an operation on a revoked communicator.
    pub(crate) fn check_live(&self, name: &str) -> Result<()> {
        if self.revoked.load(Ordering::Acquire) {
            return Err(usage(format!(
                "{name}: the communicator was revoked (ncclCommRevoke); shrink it (ncclCommShrink) or destroy it"
            )));
        }
        Ok(())
    }

    /// Forgets the errors that revoking caused in the operations it stopped: a revoked
    /// communicator is quiescent, and reports success until it is destroyed.
    pub(crate) fn quiesced(&self) {
        self.async_err.store(ncclSuccess, Ordering::Release);
    }

    /// What `ncclCommGetAsyncError` reports: `ncclInProgress` during a background init, the
    /// init's failure, success once revoked, else the first fatal error a call met.
    pub(crate) fn async_error(&self) -> ncclResult_t {
        if !self.settle(false) {
            return ncclInProgress;
        }
        match self.state.get() {
            Some(Err((code, _))) => *code,
            Some(Ok(_)) if self.revoked.load(Ordering::Acquire) => ncclSuccess,
            Some(Ok(Made::Device(d))) if self.async_err.load(Ordering::Acquire) == ncclSuccess => {
                // A device kernel that waited past OCCL_TIMEOUT for a peer, or a staged host
                // collective that failed, is the communicator's asynchronous error.
                let _restore = crate::gpu::Restore::new();
                if let Err(e) = d.cc.device_error() {
                    self.fail("a device collective", &e);
                }
                self.async_err.load(Ordering::Acquire)
            }
            _ => self.async_err.load(Ordering::Acquire),
        }
    }

    /// Records a call's error on the communicator: its text for `ncclGetLastError`, and a
    /// fatal one (a peer died, a timeout, an abort) as the asynchronous error.
    pub(crate) fn note(&self, name: &str, e: &Error) {
        *lock(&self.last_error) = Some(format!("{name}: {e}"));
        if is_fatal(e.kind()) {
            let _ = self.async_err.compare_exchange(
                ncclSuccess,
                crate::error::code_of(e.kind()),
                Ordering::AcqRel,
                Ordering::Acquire,
            );
        }
    }

    /// Records a failure no caller can be told of (a staged send/recv that ran in a host
    /// function) as the communicator's asynchronous error, whatever its kind.
    pub(crate) fn fail(&self, name: &str, e: &Error) {
        *lock(&self.last_error) = Some(format!("{name}: {e}"));
        let _ = self.async_err.compare_exchange(
            ncclSuccess,
            crate::error::code_of(e.kind()),
            Ordering::AcqRel,
            Ordering::Acquire,
        );
    }

    /// The device-API memory this communicator holds.
    pub(crate) fn lsa(&self) -> MutexGuard<'_, crate::lsa::State> {
        lock(&self.lsa)
    }

    pub(crate) fn last_error(&self) -> Option<String> {
        lock(&self.last_error).clone()
    }

    pub(crate) fn add_op(&self, op: PreMul) -> Result<ncclRedOp_t> {
        let mut ops = lock(&self.ops);
        let i = match ops.iter().position(Option::is_none) {
            Some(i) => {
                ops[i] = Some(op);
                i
            }
            None => {
                ops.push(Some(op));
                ops.len() - 1
            }
        };
        i32::try_from(i).ok().and_then(|i| i.checked_add(NUM_OPS)).ok_or_else(|| usage("too many reduction operators"))
    }

    pub(crate) fn op(&self, v: ncclRedOp_t) -> Result<PreMul> {
        let ops = lock(&self.ops);
        v.checked_sub(NUM_OPS)
            .and_then(|i| usize::try_from(i).ok())
            .and_then(|i| ops.get(i).cloned().flatten())
            .ok_or_else(|| {
                arg(format!(
                    "reduction operator {v} is neither built in (0 ncclSum … 4 ncclAvg) nor a live operator of this \
                     communicator from ncclRedOpCreatePreMulSum"
                ))
            })
    }

    pub(crate) fn remove_op(&self, v: ncclRedOp_t) -> Result<()> {
        self.op(v)?;
        let mut ops = lock(&self.ops);
        if let Some(slot) = usize::try_from(v - NUM_OPS).ok().and_then(|i| ops.get_mut(i)) {
            *slot = None;
        }
        Ok(())
    }
}
