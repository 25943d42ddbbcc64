//! Creating and ending communicators: unique ids, init (blocking, non-blocking, in a group,
//! scalable, all ranks of a process), split, shrink, finalize, destroy and abort.

use crate::abi::*;
use crate::error::{arg, guard, Result};
use crate::gpu::{self, DevComm};
use crate::group;
use crate::handle::{ncclComm_t, Made, NcclComm};
use occl::cuda::{CtaBudget, CtaPolicy, CudaComm, DeviceSettings};
use occl::{Comm, Config, Error, ShrinkMode, UniqueId};
use std::sync::mpsc;

fn count(what: &str, v: i32) -> Result<usize> {
    usize::try_from(v).map_err(|_| arg(format!("{what} is {v}; it must not be negative")))
}

fn rank_of(nranks: i32, rank: i32) -> Result<(usize, usize)> {
    let n = count("nranks", nranks)?;
    if n == 0 {
        return Err(arg("nranks is 0; a communicator has at least one rank"));
    }
    let r = count("rank", rank)?;
    if r >= n {
        return Err(arg(format!("rank {r} is out of range for nranks={n} (ranks are 0..{n})")));
    }
    Ok((n, r))
}

/// Writes `*out`, refusing a NULL `out`.
///
/// # Safety
/// `out` is NULL or writable.
unsafe fn put(out: *mut ncclComm_t, v: ncclComm_t) -> Result<()> {
    if out.is_null() {
        return Err(arg("the communicator out-pointer is NULL"));
    }
    // SAFETY: non-NULL and writable by the caller's contract.
    unsafe { out.write(v) };
    Ok(())
}

/// Puts a created host communicator on `device` (the device current at init; `None`: a
/// host-only process): a collective call, every rank makes it.
fn made(comm: Comm, device: Option<usize>, fields: DeviceFields) -> Result<Made> {
    let Some(d) = device else { return Ok(Made::Host(Box::new(comm))) };
    let _restore = gpu::Restore::new();
    // The environment overrides the config's fields, as in NCCL.
    let mut s = DeviceSettings::from_env()?;
    s.cluster = s.cluster.or(fields.cluster);
    let cta = fields.cta;
    let config = CtaBudget {
        min_ctas: cta.min.unwrap_or(0),
        max_ctas: cta.max.unwrap_or(0),
        policy: cta.policy.map(CtaPolicy::from_nccl).transpose()?.unwrap_or_default(),
        ..CtaBudget::default()
    };
    let s = s.with_budget(config.under_env()?)?;
    Ok(Made::Device(Box::new(DevComm::new(CudaComm::with_settings(comm, d, s)?)?)))
}

/// The device a communicator made from `parent` lives on: the parent's.
fn device_of(parent: &NcclComm) -> Result<Option<usize>> {
    Ok(parent.device()?.map(DevComm::ordinal))
}

/// Creates a communicator with `make` into `*out`: now, or on a thread of its own when the
/// config asks for non-blocking init (`ncclInProgress`) or a group is open on this thread (the
/// other ranks are often created by the same thread before `ncclGroupEnd`).
///
/// # Safety
/// `out` is writable.
unsafe fn create(
    out: *mut ncclComm_t,
    opts: Options,
    make: impl FnOnce() -> Result<Made> + Send + 'static,
) -> Result<ncclResult_t> {
    // SAFETY: the caller's contract.
    unsafe { put(out, std::ptr::null_mut())? };
    let in_group = group::is_open();
    if !opts.nonblocking && !in_group {
        let comm = make()?;
        // SAFETY: as above.
        unsafe { put(out, NcclComm::into_raw(NcclComm::ready(comm, opts)))? };
        return Ok(ncclSuccess);
    }
    let (tx, rx) = mpsc::channel();
    std::thread::Builder::new()
        .name("occl-nccl-init".into())
        .spawn(move || {
            let made = std::panic::catch_unwind(std::panic::AssertUnwindSafe(make))
                .unwrap_or_else(|_| Err(Error::InternalError("communicator init panicked".into())));
            let _ = tx.send(made);
        })
        .map_err(|e| Error::SystemError { context: "spawn the init thread".into(), source: e })?;
    let nonblocking = opts.nonblocking;
    let c = NcclComm::background(rx, opts);
    // SAFETY: as above.
    unsafe { put(out, NcclComm::into_raw(c.clone()))? };
    if in_group {
        group::hold_init(c);
    }
    Ok(if nonblocking { ncclInProgress } else { ncclSuccess })
}

export! {
    /// Starts a bootstrap root in this process and returns its id for every rank to pass.
    fn ncclGetUniqueId / pncclGetUniqueId(uniqueId: *mut ncclUniqueId) -> ncclResult_t {
        guard("ncclGetUniqueId", || {
            if uniqueId.is_null() {
                return Err(arg("uniqueId is NULL"));
            }
            let id = UniqueId::new_for(&Config::from_env()?)?;
            // SAFETY: non-NULL, and the caller's ncclUniqueId is writable.
            unsafe { uniqueId.write(ncclUniqueId::from_occl(&id)?) };
            Ok(ncclSuccess)
        })
    }
}

/// The body of the InitRank family.
///
/// # Safety
/// `comm` writable; `config` NULL or a readable `ncclConfig_t` of its `size`.
unsafe fn init_rank(
    comm: *mut ncclComm_t,
    nranks: i32,
    id: &ncclUniqueId,
    rank: i32,
    config: *const ncclConfig_t,
) -> Result<ncclResult_t> {
    // SAFETY: the caller's contract.
    let opts = unsafe { Options::read(config)? };
    let (n, r) = rank_of(nranks, rank)?;
    let id = id.to_occl()?;
    let cfg = Config::from_env()?;
    // NCCL's rule: the communicator lives on the device current when init is called.
    let dev = gpu::current_device();
    let fields = opts.device;
    // SAFETY: the caller's contract.
    unsafe { create(comm, opts, move || made(Comm::init_rank(n, &id, r, cfg)?, dev, fields)) }
}

export! {
    /// Joins rank `rank` of `nranks` with the defaults.
    fn ncclCommInitRank / pncclCommInitRank(
        comm: *mut ncclComm_t,
        nranks: i32,
        commId: ncclUniqueId,
        rank: i32,
    ) -> ncclResult_t {
        // SAFETY: the caller's contract.
        guard("ncclCommInitRank", || unsafe { init_rank(comm, nranks, &commId, rank, std::ptr::null()) })
    }
}

export! {
    /// Joins rank `rank` of `nranks` with `config` (`blocking = 0`: returns `ncclInProgress`).
    fn ncclCommInitRankConfig / pncclCommInitRankConfig(
        comm: *mut ncclComm_t,
        nranks: i32,
        commId: ncclUniqueId,
        rank: i32,
        config: *mut ncclConfig_t,
    ) -> ncclResult_t {
        // SAFETY: the caller's contract.
        guard("ncclCommInitRankConfig", || unsafe { init_rank(comm, nranks, &commId, rank, config) })
    }
}

export! {
    /// Joins through `nId` roots, each serving a share of the ranks.
    fn ncclCommInitRankScalable / pncclCommInitRankScalable(
        newcomm: *mut ncclComm_t,
        nranks: i32,
        myrank: i32,
        nId: i32,
        commIds: *mut ncclUniqueId,
        config: *mut ncclConfig_t,
    ) -> ncclResult_t {
        guard("ncclCommInitRankScalable", || {
            // SAFETY: the caller's contract.
            let opts = unsafe { Options::read(config)? };
            let (n, r) = rank_of(nranks, myrank)?;
            let k = count("nId", nId)?;
            if k == 0 || commIds.is_null() {
                return Err(arg("ncclCommInitRankScalable needs nId >= 1 ids in commIds (non-NULL)"));
            }
            // SAFETY: commIds points to nId ids (the caller's contract).
            let ids = unsafe { std::slice::from_raw_parts(commIds, k) };
            let ids = ids.iter().map(ncclUniqueId::to_occl).collect::<Result<Vec<_>>>()?;
            let cfg = Config::from_env()?;
            let dev = gpu::current_device();
            let fields = opts.device;
            // SAFETY: the caller's contract.
            unsafe { create(newcomm, opts, move || made(Comm::init_rank_scalable(n, &ids, r, cfg)?, dev, fields)) }
        })
    }
}

export! {
    /// `ndev` ranks in this process, one per `comm[i]`; drive them from one thread inside a
    /// group or from a thread each. In a GPU process rank i lives on `devlist[i]` (NULL:
    /// device i); in a host-only process `devlist` is not read.
    fn ncclCommInitAll / pncclCommInitAll(comm: *mut ncclComm_t, ndev: i32, devlist: *const i32) -> ncclResult_t {
        guard("ncclCommInitAll", || {
            let n = count("ndev", ndev)?;
            if n == 0 || comm.is_null() {
                return Err(arg("ncclCommInitAll needs ndev >= 1 and a non-NULL array of ndev communicators"));
            }
            let comms: Vec<Made> = if gpu::current_device().is_some() {
                let devices = if devlist.is_null() {
                    (0..n).collect()
                } else {
                    // SAFETY: devlist holds ndev ordinals (the caller's contract).
                    let list = unsafe { std::slice::from_raw_parts(devlist, n) };
                    list.iter().map(|&d| count("a devlist entry", d)).collect::<Result<Vec<_>>>()?
                };
                let _restore = gpu::Restore::new();
                let made = CudaComm::init_all(&devices)?;
                made.into_iter().map(|cc| Ok(Made::Device(Box::new(DevComm::new(cc)?)))).collect::<Result<_>>()?
            } else {
                Comm::init_all(n)?.into_iter().map(|c| Made::Host(Box::new(c))).collect()
            };
            for (i, c) in comms.into_iter().enumerate() {
                // SAFETY: comm has room for ndev handles (the caller's contract).
                unsafe { comm.add(i).write(NcclComm::into_raw(NcclComm::ready(c, Options::default()))) };
            }
            Ok(ncclSuccess)
        })
    }
}

export! {
    /// Splits by colour (NCCL_SPLIT_NOCOLOR: `*newcomm` = NULL), ranked by (key, parent rank).
    /// A NULL config inherits the parent's.
    fn ncclCommSplit / pncclCommSplit(
        comm: ncclComm_t,
        color: i32,
        key: i32,
        newcomm: *mut ncclComm_t,
        config: *mut ncclConfig_t,
    ) -> ncclResult_t {
        guard("ncclCommSplit", || {
            // SAFETY: the caller's contract.
            let parent = unsafe { NcclComm::from_handle(comm)? };
            if parent.check_live("ncclCommSplit").is_err() {
                return Err(crate::error::usage(
                    "ncclCommSplit: the communicator was revoked (ncclCommRevoke), which stops its bootstrap as well; \
                     ncclCommShrink (excluding no rank) makes a working copy of it, which can be split",
                ));
            }
            let opts = if config.is_null() { parent.opts.clone() } else { unsafe { Options::read(config)? } };
            // SAFETY: newcomm writable (the caller's contract).
            unsafe { put(newcomm, std::ptr::null_mut())? };
            let dev = device_of(&parent)?;
            let split = parent.comm()?.split(color, key).inspect_err(|e| parent.note("ncclCommSplit", e))?;
            if let Some(c) = split {
                let c = made(c, dev, opts.device).inspect_err(|e| parent.note("ncclCommSplit", e))?;
                // SAFETY: as above.
                unsafe { put(newcomm, NcclComm::into_raw(NcclComm::ready(c, opts)))? };
            }
            Ok(ncclSuccess)
        })
    }
}

export! {
    /// A communicator of the parent's ranks less `excludeRanksList`, made by the remaining
    /// ranks alone (the excluded ones do not call). `NCCL_SHRINK_ABORT` first aborts an
    /// operation still blocked on the parent.
    fn ncclCommShrink / pncclCommShrink(
        comm: ncclComm_t,
        excludeRanksList: *mut i32,
        excludeRanksCount: i32,
        newcomm: *mut ncclComm_t,
        config: *mut ncclConfig_t,
        shrinkFlags: i32,
    ) -> ncclResult_t {
        guard("ncclCommShrink", || {
            // SAFETY: the caller's contract.
            let parent = unsafe { NcclComm::from_handle(comm)? };
            let opts = if config.is_null() { parent.opts.clone() } else { unsafe { Options::read(config)? } };
            let mode = match shrinkFlags {
                0 => ShrinkMode::Default,
                1 => ShrinkMode::Abort,
                f => {
                    return Err(arg(format!(
                        "shrinkFlags {f:#x}: use NCCL_SHRINK_DEFAULT (0) or NCCL_SHRINK_ABORT (1)"
                    )))
                }
            };
            let k = count("excludeRanksCount", excludeRanksCount)?;
            if k > 0 && excludeRanksList.is_null() {
                return Err(arg(format!("excludeRanksList is NULL but excludeRanksCount is {k}")));
            }
            let list = if k == 0 { &[][..] } else { unsafe { std::slice::from_raw_parts(excludeRanksList, k) } };
            let exclude = list.iter().map(|&r| count("an excluded rank", r)).collect::<Result<Vec<_>>>()?;
            // SAFETY: newcomm writable (the caller's contract).
            unsafe { put(newcomm, std::ptr::null_mut())? };
            let dev = device_of(&parent)?;
            let c = parent.comm()?.shrink(&exclude, mode).inspect_err(|e| parent.note("ncclCommShrink", e))?;
            let c = made(c, dev, opts.device).inspect_err(|e| parent.note("ncclCommShrink", e))?;
            // SAFETY: as above.
            unsafe { put(newcomm, NcclComm::into_raw(NcclComm::ready(c, opts)))? };
            Ok(ncclSuccess)
        })
    }
}

export! {
    /// Host collectives have completed when their call returns; device ones are waited for.
    /// Checks that the communicator is usable.
    fn ncclCommFinalize / pncclCommFinalize(comm: ncclComm_t) -> ncclResult_t {
        guard("ncclCommFinalize", || {
            // SAFETY: the caller's contract.
            let c = unsafe { NcclComm::from_handle(comm)? };
            c.check_live("ncclCommFinalize")?;
            c.comm()?;
            if let Some(d) = c.device()? {
                d.synchronize();
            }
            Ok(ncclSuccess)
        })
    }
}

export! {
    /// Releases the communicator once its device work has run (as NCCL's, which finalizes
    /// first): peers learn this rank left once no call uses it any more.
    fn ncclCommDestroy / pncclCommDestroy(comm: ncclComm_t) -> ncclResult_t {
        guard("ncclCommDestroy", || {
            if !comm.is_null() {
                // SAFETY: the caller's contract.
                let c = unsafe { NcclComm::from_handle(comm)? };
                if let Ok(Some(d)) = c.device() {
                    d.synchronize();
                }
                // SAFETY: the handle's own reference, not used again (the caller's contract).
                unsafe { NcclComm::release(comm) };
            }
            Ok(ncclSuccess)
        })
    }
}

export! {
    /// Aborts: a call blocked on this communicator in another thread returns an error, peers
    /// waiting on this rank fail, and the communicator is released.
    fn ncclCommAbort / pncclCommAbort(comm: ncclComm_t) -> ncclResult_t {
        guard("ncclCommAbort", || {
            if comm.is_null() {
                return Ok(ncclSuccess);
            }
            // SAFETY: the caller's contract.
            let c = unsafe { NcclComm::from_handle(comm)? };
            if let Ok(inner) = c.comm() {
                inner.abort();
            }
            // Kernels waiting on a peer give up, then the device drains: staged host functions
            // read the communicator that the release below may free.
            if let Ok(Some(d)) = c.device() {
                let _restore = gpu::Restore::new();
                if let Err(e) = d.cc.abort_device() {
                    tracing::warn!("occl-nccl: ncclCommAbort could not stop the device kernels: {e}");
                }
                d.synchronize();
            }
            // SAFETY: the handle's own reference, not used again.
            unsafe { NcclComm::release(comm) };
            Ok(ncclSuccess)
        })
    }
}

export! {
    /// Stops every operation in flight on the communicator, here and (through occl's abort) on
    /// its peers, and returns once it is quiescent (device work drained). Operations on it are
    /// refused from then on; it can be shrunk (excluding no rank gives a working copy) or
    /// destroyed.
    fn ncclCommRevoke / pncclCommRevoke(comm: ncclComm_t, revokeFlags: i32) -> ncclResult_t {
        guard("ncclCommRevoke", || {
            if comm.is_null() {
                return Ok(ncclSuccess);
            }
            if revokeFlags != 0 {
                return Err(arg(format!("revokeFlags {revokeFlags:#x}: use NCCL_REVOKE_DEFAULT (0)")));
            }
            // SAFETY: the caller's contract.
            let c = unsafe { NcclComm::from_handle(comm)? };
            let inner = c.comm()?;
            if !c.revoke() {
                return Err(arg("the communicator is already revoked"));
            }
            inner.abort();
            if let Some(d) = c.device()? {
                let _restore = gpu::Restore::new();
                if let Err(e) = d.cc.abort_device() {
                    tracing::warn!("occl-nccl: ncclCommRevoke could not stop the device kernels: {e}");
                }
                d.synchronize();
            }
            c.quiesced();
            Ok(ncclSuccess)
        })
    }
}
