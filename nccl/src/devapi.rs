//! The host side of NCCL's device API (`include/nccl_device.h`): device communicators, teams,
//! barrier requirements, and windows on device memory.
//!
//! occl offers the device API on a GPU communicator whose ranks are all on this host: every
//! rank is then an lsa peer, reached with the GPU's own loads and stores (CUDA IPC between
//! processes, plain pointers within one), and GIN is carried out the same way. Refused, with
//! the reason in `ncclGetLastError`: NVLink multicast (occl never creates multicast objects),
//! the low-latency all-to-all, and communicators with a rank on another host, whose traffic
//! occl stages through host memory (GPU-initiated networking across hosts is not offered).

use crate::abi::*;
use crate::error::{arg, guard, guard_value, usage, Result};
use crate::gpu::{self, DevComm};
use crate::group;
use crate::handle::{ncclComm_t, NcclComm};
use crate::lsa::abi::*;
use crate::lsa::mem::{DevMem, Mapped};
use crate::lsa::plan::{self, Extra, Plan, Want};
use crate::lsa::state::Window;
use crate::setup;
use std::ffi::c_void;
use std::sync::Arc;

/// The most entries occl follows in a requirement list (a guard against a cycle).
const MAX_LIST: usize = 4096;

fn count(what: &str, v: i32) -> Result<u32> {
    u32::try_from(v).map_err(|_| arg(format!("{what} is {v}; it must not be negative")))
}

/// The device communicator's GPU side, refusing a communicator the device API cannot serve.
fn device_of(c: &NcclComm) -> Result<&DevComm> {
    let d = c.device()?.ok_or_else(|| {
        usage(
            "the communicator was created without a current CUDA context, so it has no GPU; call cudaSetDevice \
             before ncclCommInitRank to use the device API",
        )
    })?;
    if d.cc.is_staged() {
        return Err(usage(
            "a rank of this communicator is on another host; occl offers the device API only among the GPUs of one \
             host (every rank load/store accessible): it stages traffic between hosts through host memory and does \
             not offer GPU-initiated networking across hosts",
        ));
    }
    Ok(d)
}

/// What `r` asks for, refusing what occl does not offer.
///
/// # Safety
/// The lists of `r` are NULL-terminated lists of readable entries (NCCL's contract).
unsafe fn wanted(r: &ncclDevCommRequirements) -> Result<Want> {
    if r.lsaMultimem != 0 {
        return Err(usage(
            "lsaMultimem: occl never uses NVLink multicast (it creates no multicast objects, cuMulticastCreate); \
             reduce through lsa pointers (ncclGetLsaPointer) and lsa barriers instead",
        ));
    }
    if r.lsaLLA2ABlockCount != 0 || r.lsaLLA2ASlotCount != 0 {
        return Err(usage("lsaLLA2ABlockCount/lsaLLA2ASlotCount: occl does not offer the low-latency all-to-all"));
    }
    let barriers = count("barrierCount", r.barrierCount)?;
    let mut want = Want {
        lsa_barriers: barriers.max(count("lsaBarrierCount", r.lsaBarrierCount)?),
        rail_barriers: barriers.max(count("railGinBarrierCount", r.railGinBarrierCount)?),
        signals: count("ginSignalCount", r.ginSignalCount)?,
        counters: count("ginCounterCount", r.ginCounterCount)?,
        extra: Vec::new(),
    };
    let mut t = r.teamRequirementsList;
    for _ in 0..MAX_LIST {
        if t.is_null() {
            break;
        }
        // SAFETY: a list entry (the caller's contract).
        let e = unsafe { t.read() };
        if e.multimem != 0 {
            return Err(usage("teamRequirementsList asks for multicast (multimem); occl never uses NVLink multicast"));
        }
        t = e.next;
    }
    if !t.is_null() {
        return Err(arg(format!("teamRequirementsList has more than {MAX_LIST} entries (is it a cycle?)")));
    }
    let mut p = r.resourceRequirementsList;
    for _ in 0..MAX_LIST {
        if p.is_null() {
            break;
        }
        // SAFETY: a list entry (the caller's contract).
        let e = unsafe { p.read() };
        want.extra.push(Extra {
            bytes: e.bufferSize,
            align: e.bufferAlign.max(1),
            signals: count("a resource requirement's ginSignalCount", e.ginSignalCount)?,
            counters: count("a resource requirement's ginCounterCount", e.ginCounterCount)?,
        });
        p = e.next;
    }
    if !p.is_null() {
        return Err(arg(format!("resourceRequirementsList has more than {MAX_LIST} entries (is it a cycle?)")));
    }
    Ok(want)
}

/// Tells each resource requirement where it landed, through its out pointers.
///
/// # Safety
/// As `wanted`; the out pointers are NULL or writable.
unsafe fn place_requirements(r: &ncclDevCommRequirements, plan: &Plan) {
    let mut p = r.resourceRequirementsList;
    for placed in &plan.extra {
        if p.is_null() {
            break;
        }
        // SAFETY: a list entry and its out pointers (the caller's contract).
        unsafe {
            let e = p.read();
            if !e.outBufferHandle.is_null() {
                e.outBufferHandle.write(placed.buffer);
            }
            if !e.outGinSignalStart.is_null() {
                e.outGinSignalStart.write(placed.signal0);
            }
            if !e.outGinCounterStart.is_null() {
                e.outGinCounterStart.write(placed.counter0);
            }
            p = e.next;
        }
    }
}

export! {
    /// Creates a device communicator for kernels (collective: every rank calls it with the same
    /// requirements; inside a group it completes at ncclGroupEnd, which must come before
    /// `*outDevComm` is used).
    fn ncclDevCommCreate / pncclDevCommCreate(
        comm: ncclComm_t,
        reqs: *const ncclDevCommRequirements,
        outDevComm: *mut ncclDevComm,
    ) -> ncclResult_t {
        guard("ncclDevCommCreate", || {
            // SAFETY: the caller's contract.
            let c = unsafe { NcclComm::from_handle(comm)? };
            if reqs.is_null() || outDevComm.is_null() {
                return Err(arg("reqs and outDevComm must not be NULL"));
            }
            let d = device_of(&c)?;
            // SAFETY: a readable ncclDevCommRequirements and its lists (the caller's contract).
            let r = unsafe { reqs.read() };
            let n = u32::try_from(d.cc.nranks()).map_err(|_| arg("nranks exceeds 32 bits"))?;
            let plan = unsafe { wanted(&r) }.and_then(|w| plan::plan(n, &w));
            if let Ok(p) = &plan {
                // SAFETY: as above.
                unsafe { place_requirements(&r, p) };
            }
            let _restore = gpu::Restore::new();
            let s = setup::dev_comm(&c, d, plan, outDevComm);
            setup::submit(s, group::is_open())?;
            Ok(ncclSuccess)
        })
    }
}

export! {
    /// Frees a device communicator (this rank's part; no kernel may be using it).
    fn ncclDevCommDestroy / pncclDevCommDestroy(comm: ncclComm_t, devComm: *const ncclDevComm) -> ncclResult_t {
        guard("ncclDevCommDestroy", || {
            // SAFETY: the caller's contract.
            let c = unsafe { NcclComm::from_handle(comm)? };
            if devComm.is_null() {
                return Err(arg("devComm is NULL"));
            }
            // SAFETY: a readable ncclDevComm (the caller's contract).
            let dc = unsafe { devComm.read() };
            let not_ours = || {
                arg(format!(
                    "devComm {devComm:p} is not a live device communicator of this communicator (made by \
                     ncclDevCommCreate on it and not destroyed yet)"
                ))
            };
            if dc.magic != DEVCOMM_MAGIC || c.device()?.is_none() {
                return Err(not_ours());
            }
            let _restore = gpu::Restore::new();
            let m = c.lsa().take_comm(dc.resourceWindow).ok_or_else(not_ours)?;
            drop(m);
            Ok(ncclSuccess)
        })
    }
}

/// Registers device memory as a window (`ncclCommWindowRegister` on a GPU buffer).
pub(crate) fn register_window(
    c: &Arc<NcclComm>,
    buff: *mut c_void,
    size: usize,
    win: *mut *mut c_void,
    symmetric: bool,
) -> Result<()> {
    let d = c.device()?.ok_or_else(|| {
        usage(format!(
            "buffer {buff:p} is GPU memory, but the communicator was created without a current CUDA context; call \
             cudaSetDevice before ncclCommInitRank"
        ))
    })?;
    let _restore = gpu::Restore::new();
    if d.cc.is_staged() {
        // Peers on other hosts cannot be mapped: the window holds this rank's buffer alone.
        let ctx = d.cc.context();
        crate::lsa::mem::export(ctx, d.ordinal(), buff as u64, size)?;
        let desc = DevMem::alloc(ctx, std::mem::size_of::<ncclWindow_vidmem>())?;
        let w = ncclWindow_vidmem::new(d.cc.rank(), 0, &[buff as u64], size as u64)
            .ok_or_else(|| crate::error::internal("a one-rank window"))?;
        desc.upload(&w.encode())?;
        // SAFETY: non-NULL (checked by the caller) and writable.
        unsafe { win.write(desc.ptr() as *mut c_void) };
        c.lsa().add_window(Window { desc, ce: None, _peers: Mapped::own(buff as u64) });
        return Ok(());
    }
    let (addr, s) = setup::window(c, d, buff as u64, size, symmetric);
    if let Some(a) = addr {
        // SAFETY: as above.
        unsafe { win.write(a as *mut c_void) };
    }
    setup::submit(s, group::is_open())
}

/// Releases a device window, if `win` is one of `c`'s (this rank's part: no barrier): later
/// copy-engine calls stop writing through it before its peers' buffers are unmapped.
pub(crate) fn deregister_window(c: &NcclComm, win: *mut c_void) -> bool {
    // A host communicator has none, and a process without the driver must not touch it.
    let Ok(Some(d)) = c.device() else { return false };
    let _restore = gpu::Restore::new();
    let w = c.lsa().take_window(win as u64);
    if let Some(id) = w.as_ref().and_then(|w| w.ce) {
        d.cc.remove_window(id);
    }
    w.is_some()
}

/// This rank's place in the lsa team: every rank on a GPU communicator of one host, else the
/// caller alone.
fn lsa_of(c: &NcclComm) -> Result<(i32, i32)> {
    let inner = c.comm()?;
    let int = |v: usize| i32::try_from(v).map_err(|_| arg("nranks exceeds int"));
    match c.device()? {
        Some(d) if !d.cc.is_staged() => Ok((int(inner.rank())?, int(inner.nranks())?)),
        _ => Ok((0, 1)),
    }
}

const NO_TEAM: ncclTeam = ncclTeam { nRanks: 0, rank: -1, stride: 0 };

/// # Safety
/// `comm` is NULL or a live handle.
unsafe fn team(
    name: &'static str,
    comm: ncclComm_t,
    f: impl FnOnce(&NcclComm, i32, i32) -> Result<ncclTeam>,
) -> ncclTeam {
    guard_value(name, NO_TEAM, || {
        // SAFETY: the caller's contract.
        let c = unsafe { NcclComm::from_handle(comm)? };
        let inner = c.comm()?;
        let rank = i32::try_from(inner.rank()).map_err(|_| arg("rank exceeds int"))?;
        let n = i32::try_from(inner.nranks()).map_err(|_| arg("nranks exceeds int"))?;
        f(&c, rank, n)
    })
}

export! {
    /// Every rank of the communicator.
    fn ncclTeamWorld / pncclTeamWorld(comm: ncclComm_t) -> ncclTeam {
        // SAFETY: the caller's contract.
        unsafe { team("ncclTeamWorld", comm, |_, rank, n| Ok(ncclTeam { nRanks: n, rank, stride: 1 })) }
    }
}

export! {
    /// The ranks this one reaches by load and store: all of a GPU communicator of one host.
    fn ncclTeamLsa / pncclTeamLsa(comm: ncclComm_t) -> ncclTeam {
        // SAFETY: the caller's contract.
        unsafe {
            team("ncclTeamLsa", comm, |c, _, _| {
                let (rank, n) = lsa_of(c)?;
                Ok(ncclTeam { nRanks: n, rank, stride: 1 })
            })
        }
    }
}

export! {
    /// The ranks at this one's position in every lsa team.
    fn ncclTeamRail / pncclTeamRail(comm: ncclComm_t) -> ncclTeam {
        // SAFETY: the caller's contract.
        unsafe {
            team("ncclTeamRail", comm, |c, rank, n| {
                let (_, lsa) = lsa_of(c)?;
                Ok(ncclTeam { nRanks: n / lsa, rank: rank / lsa, stride: lsa })
            })
        }
    }
}

export! {
    /// The communicator rank of member `rank` of `team`.
    fn ncclTeamRankToWorld / pncclTeamRankToWorld(comm: ncclComm_t, team: ncclTeam, rank: i32) -> i32 {
        guard_value("ncclTeamRankToWorld", -1, || {
            // SAFETY: the caller's contract.
            let c = unsafe { NcclComm::from_handle(comm)? };
            let me = i32::try_from(c.comm()?.rank()).map_err(|_| arg("rank exceeds int"))?;
            Ok(me + (rank - team.rank) * team.stride)
        })
    }
}

export! {
    /// The lsa-team index of member `rank` of `team`.
    fn ncclTeamRankToLsa / pncclTeamRankToLsa(comm: ncclComm_t, team: ncclTeam, rank: i32) -> i32 {
        guard_value("ncclTeamRankToLsa", -1, || {
            // SAFETY: the caller's contract.
            let c = unsafe { NcclComm::from_handle(comm)? };
            let (lsa_rank, _) = lsa_of(&c)?;
            Ok(lsa_rank + (rank - team.rank) * team.stride)
        })
    }
}

/// A requirement with nothing in it yet.
fn empty_requirement() -> ncclDevResourceRequirements {
    ncclDevResourceRequirements {
        next: std::ptr::null_mut(),
        bufferSize: 0,
        bufferAlign: RESOURCE_UNIT,
        outBufferHandle: std::ptr::null_mut(),
        ginSignalCount: 0,
        ginCounterCount: 0,
        outGinSignalStart: std::ptr::null_mut(),
        outGinCounterStart: std::ptr::null_mut(),
    }
}

export! {
    /// A requirement for `nBarriers` lsa barriers over `team`; link `outReq` into the
    /// requirements' resourceRequirementsList. `*outHandle` is complete once ncclDevCommCreate
    /// has run, and must stay where it is until then.
    fn ncclLsaBarrierCreateRequirement / pncclLsaBarrierCreateRequirement(
        team: ncclTeam,
        nBarriers: i32,
        outHandle: *mut ncclLsaBarrierHandle,
        outReq: *mut ncclDevResourceRequirements,
    ) -> ncclResult_t {
        guard("ncclLsaBarrierCreateRequirement", || {
            if outHandle.is_null() || outReq.is_null() {
                return Err(arg("outHandle and outReq must not be NULL"));
            }
            let b = count("nBarriers", nBarriers)? as usize;
            let members = count("team.nRanks", team.nRanks)? as usize;
            // Each barrier: an epoch, then one inbox word per member (lsa_barrier.h).
            let bytes = b.checked_mul(1 + members).and_then(|w| w.checked_mul(4)).ok_or_else(|| arg("too many barriers"))?;
            // SAFETY: both writable (the caller's contract).
            unsafe {
                outHandle.write(ncclLsaBarrierHandle { bufHandle: 0, nBarriers });
                outReq.write(ncclDevResourceRequirements {
                    bufferSize: bytes,
                    outBufferHandle: &raw mut (*outHandle).bufHandle,
                    ..empty_requirement()
                });
            }
            Ok(ncclSuccess)
        })
    }
}

export! {
    /// A requirement for `nBarriers` GIN barriers over `team` (on their own signals); link
    /// `outReq` as for ncclLsaBarrierCreateRequirement.
    fn ncclGinBarrierCreateRequirement / pncclGinBarrierCreateRequirement(
        comm: ncclComm_t,
        team: ncclTeam,
        nBarriers: i32,
        outHandle: *mut ncclGinBarrierHandle,
        outReq: *mut ncclDevResourceRequirements,
    ) -> ncclResult_t {
        guard("ncclGinBarrierCreateRequirement", || {
            // SAFETY: the caller's contract.
            let c = unsafe { NcclComm::from_handle(comm)? };
            c.comm()?;
            if outHandle.is_null() || outReq.is_null() {
                return Err(arg("outHandle and outReq must not be NULL"));
            }
            count("team.nRanks", team.nRanks)?;
            let b = count("nBarriers", nBarriers)?;
            // Each barrier: an epoch here, and a signal of its own (gin_barrier.h).
            let bytes = (b as usize).checked_mul(4).ok_or_else(|| arg("too many barriers"))?;
            // SAFETY: both writable (the caller's contract).
            unsafe {
                outHandle.write(ncclGinBarrierHandle { signal0: 0, bufHandle: 0 });
                outReq.write(ncclDevResourceRequirements {
                    bufferSize: bytes,
                    outBufferHandle: &raw mut (*outHandle).bufHandle,
                    ginSignalCount: nBarriers,
                    outGinSignalStart: &raw mut (*outHandle).signal0,
                    ..empty_requirement()
                });
            }
            Ok(ncclSuccess)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reqs() -> ncclDevCommRequirements {
        ncclDevCommRequirements {
            resourceRequirementsList: std::ptr::null_mut(),
            teamRequirementsList: std::ptr::null_mut(),
            lsaMultimem: 0,
            barrierCount: 0,
            lsaBarrierCount: 0,
            railGinBarrierCount: 0,
            lsaLLA2ABlockCount: 0,
            lsaLLA2ASlotCount: 0,
            ginForceEnable: 0,
            ginContextCount: 0,
            ginSignalCount: 0,
            ginCounterCount: 0,
        }
    }

    #[test]
    fn world_barriers_count_as_lsa_and_rail_barriers() {
        let r = ncclDevCommRequirements { barrierCount: 16, lsaBarrierCount: 4, ginSignalCount: 16, ..reqs() };
        let w = unsafe { wanted(&r) }.unwrap();
        assert_eq!((w.lsa_barriers, w.rail_barriers, w.signals), (16, 16, 16));
        let r = ncclDevCommRequirements { lsaBarrierCount: 16, ..reqs() };
        let w = unsafe { wanted(&r) }.unwrap();
        assert_eq!((w.lsa_barriers, w.rail_barriers), (16, 0));
    }

    #[test]
    fn multicast_and_the_low_latency_all_to_all_are_refused() {
        let e = unsafe { wanted(&ncclDevCommRequirements { lsaMultimem: 1, ..reqs() }) }.unwrap_err();
        assert!(e.to_string().contains("multicast"), "{e}");
        let e = unsafe { wanted(&ncclDevCommRequirements { lsaLLA2ABlockCount: 2, ..reqs() }) }.unwrap_err();
        assert!(e.to_string().contains("low-latency"), "{e}");
        let mut t = ncclTeamRequirements {
            next: std::ptr::null_mut(),
            team: ncclTeam { nRanks: 2, rank: 0, stride: 1 },
            multimem: 1,
            outMultimemHandle: std::ptr::null_mut(),
        };
        let e = unsafe { wanted(&ncclDevCommRequirements { teamRequirementsList: &raw mut t, ..reqs() }) };
        assert!(e.is_err());
        let e = unsafe { wanted(&ncclDevCommRequirements { ginSignalCount: -1, ..reqs() }) }.unwrap_err();
        assert!(e.to_string().contains("ginSignalCount is -1"), "{e}");
    }

    #[test]
    fn barrier_requirements_land_in_the_plan_and_fill_their_handles() {
        let mut lsa = ncclLsaBarrierHandle::default();
        let mut lreq = empty_requirement();
        let team = ncclTeam { nRanks: 4, rank: 1, stride: 1 };
        assert_eq!(unsafe { ncclLsaBarrierCreateRequirement(team, 3, &raw mut lsa, &raw mut lreq) }, ncclSuccess);
        assert_eq!(lreq.bufferSize, 3 * 5 * 4);
        // A GIN barrier requirement needs a communicator; build its entry by hand as the call does.
        let mut gin = ncclGinBarrierHandle::default();
        let mut greq = ncclDevResourceRequirements {
            bufferSize: 8,
            outBufferHandle: &raw mut gin.bufHandle,
            ginSignalCount: 2,
            outGinSignalStart: &raw mut gin.signal0,
            ..empty_requirement()
        };
        lreq.next = &raw mut greq;
        let r = ncclDevCommRequirements { resourceRequirementsList: &raw mut lreq, ginSignalCount: 5, ..reqs() };
        let w = unsafe { wanted(&r) }.unwrap();
        let p = plan::plan(4, &w).unwrap();
        unsafe { place_requirements(&r, &p) };
        assert_eq!(lsa.nBarriers, 3);
        assert_eq!(lsa.bufHandle, p.extra[0].buffer);
        assert_eq!(gin.bufHandle, p.extra[1].buffer);
        assert_eq!(gin.signal0, 5, "after the requirements' own signals");
        assert_ne!(lsa.bufHandle, gin.bufHandle);
    }

    #[test]
    fn teams_of_a_null_communicator_are_empty() {
        let t = unsafe { ncclTeamWorld(std::ptr::null_mut()) };
        assert_eq!(t, NO_TEAM);
        assert_eq!(unsafe { ncclTeamRankToWorld(std::ptr::null_mut(), t, 0) }, -1);
    }
}
