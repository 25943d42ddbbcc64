//! The collective setups of NCCL's device API: registering a window on device memory and
//! creating a device communicator. Each has a local part, done when the call is made
//! (checking and exporting the buffer, allocating the descriptor and the resource buffer), and
//! a collective part: every rank's record over the communicator's bootstrap, the peers' memory
//! opened, the descriptor written. Outside a group the collective part runs at once; inside
//! one it runs at the outermost `ncclGroupEnd`, one thread per communicator, because one
//! thread may be creating every rank of its process (nccl-tests' `-g 2`) and a blocking
//! exchange for the first would wait forever for the second.
//!
//! A rank whose local part failed still takes part in the exchange, saying so, so that its
//! peers fail at once naming it instead of waiting for a record that never comes.

use crate::error::{internal, usage, Result};
use crate::gpu::{self, DevComm};
use crate::handle::NcclComm;
use crate::lsa::abi::{ncclDevComm, ncclMultimemHandle, ncclWindow_vidmem, DEVCOMM_MAGIC};
use crate::lsa::mem::{self, DevMem, Exported, Record};
use crate::lsa::plan::Plan;
use crate::lsa::state::{DevCommMem, Window};
use occl::cuda::kernels::ipc::{DeviceRegion, IpcHandle};
use occl::Error;
use std::cell::RefCell;
use std::sync::Arc;

/// One setup of one communicator.
pub(crate) struct Setup {
    comm: Arc<NcclComm>,
    job: Job,
}

enum Job {
    Window(Result<WindowLocal>),
    DevComm { local: Result<DevCommLocal>, out: usize },
}

struct WindowLocal {
    desc: DevMem,
    ex: Exported,
    size: usize,
    /// Registered with `NCCL_WIN_COLL_SYMMETRIC`.
    symmetric: bool,
}

struct DevCommLocal {
    plan: Plan,
    region: DeviceRegion,
    handle: IpcHandle,
    desc: DevMem,
}

thread_local! {
    /// The setups of this thread's open group, in call order.
    static PENDING: RefCell<Vec<Setup>> = const { RefCell::new(Vec::new()) };
}

fn ordinal(d: &DevComm) -> u32 {
    u32::try_from(d.ordinal()).unwrap_or(u32::MAX)
}

/// The local part of registering `[buff, buff+size)` on `d`'s GPU (`symmetric`: with
/// `NCCL_WIN_COLL_SYMMETRIC`), and the descriptor's address (the caller's `ncclWindow_t`) when
/// it went well.
pub(crate) fn window(c: &Arc<NcclComm>, d: &DevComm, buff: u64, size: usize, symmetric: bool) -> (Option<u64>, Setup) {
    let local = (|| {
        let ctx = d.cc.context();
        let ex = mem::export(ctx, d.ordinal(), buff, size)?;
        let desc = DevMem::alloc(ctx, std::mem::size_of::<ncclWindow_vidmem>())?;
        Ok(WindowLocal { desc, ex, size, symmetric })
    })();
    let addr = local.as_ref().ok().map(|l| l.desc.ptr());
    (addr, Setup { comm: c.clone(), job: Job::Window(local) })
}

/// The local part of creating a device communicator laid out by `plan`, written at the
/// end into `*out` (the caller's `ncclDevComm`, which must stay valid until then).
pub(crate) fn dev_comm(c: &Arc<NcclComm>, d: &DevComm, plan: Result<Plan>, out: *mut ncclDevComm) -> Setup {
    let local = plan.and_then(|plan| {
        let ctx = d.cc.context();
        let region =
            DeviceRegion::alloc(ctx, plan.bytes).map_err(|e| crate::error::sys("allocate the resource buffer", e))?;
        let handle = region.ipc_handle().map_err(|e| crate::error::sys("export the resource buffer", e))?;
        let desc = DevMem::alloc(ctx, std::mem::size_of::<ncclWindow_vidmem>())?;
        Ok(DevCommLocal { plan, region, handle, desc })
    });
    Setup { comm: c.clone(), job: Job::DevComm { local, out: out as usize } }
}

impl Setup {
    fn name(&self) -> &'static str {
        match self.job {
            Job::Window(_) => "ncclCommWindowRegister",
            Job::DevComm { .. } => "ncclDevCommCreate",
        }
    }

    /// The local part's failure, for the call to report at once.
    fn local_error(&self) -> Option<Error> {
        match &self.job {
            Job::Window(Err(e)) | Job::DevComm { local: Err(e), .. } => Some(crate::error::again(e)),
            _ => None,
        }
    }

    /// This setup with its local part failed: after an earlier setup of the group failed on
    /// this rank, the later ones still take part in their exchanges, so that peers fail too
    /// instead of waiting for records that never come.
    fn poisoned(self) -> Setup {
        let why = || usage("an earlier window or device communicator of this group failed on this rank");
        let job = match self.job {
            Job::Window(_) => Job::Window(Err(why())),
            Job::DevComm { out, .. } => Job::DevComm { local: Err(why()), out },
        };
        Setup { comm: self.comm, job }
    }

    /// The collective part.
    fn run(self) -> Result<()> {
        let name = self.name();
        let c = self.comm;
        let d = c.device()?.ok_or_else(|| internal(format!("{name} on a communicator without a GPU")))?;
        let r = match self.job {
            Job::Window(local) => run_window(&c, d, local),
            Job::DevComm { local, out } => run_dev_comm(&c, d, local, out),
        };
        r.inspect_err(|e| c.note(name, e))
    }
}

/// This rank's record: its part of the memory, or that it failed.
fn record(d: &DevComm, part: Option<(u64, u64, IpcHandle, u64)>) -> Record {
    match part {
        Some((base, offset, handle, fingerprint)) => Record {
            ok: true,
            pid: std::process::id(),
            device: ordinal(d),
            base,
            offset,
            fingerprint,
            handle,
            ..Record::failed()
        },
        None => Record::failed(),
    }
}

fn run_window(c: &NcclComm, d: &DevComm, local: Result<WindowLocal>) -> Result<()> {
    let me = d.cc.rank();
    let mut rec = record(d, local.as_ref().ok().map(|l| (l.ex.base, l.ex.offset, l.ex.handle, 0)));
    if let Ok(l) = &local {
        (rec.size, rec.symmetric) = (l.size as u64, l.symmetric);
    }
    let all = d.cc.exchange(&rec.encode())?;
    let l = local?;
    let recs = mem::records(&all, me, "ncclCommWindowRegister")?;
    let peers = mem::map_peers(d.cc.context(), me, &recs)?;
    // Copy-engine calls write straight into the window only when every rank promised symmetry,
    // so every rank decides alike (`occl::cuda`'s `ce/mod.rs`).
    let ce = match mem::symmetric_len(&recs) {
        Some(len) => Some(d.cc.add_symmetric_window(&peers.ptrs, len)?),
        None => None,
    };
    // Every rank is an lsa peer: lsa ranks are the communicator's.
    let w = ncclWindow_vidmem::new(me, me, &peers.ptrs, l.size as u64)
        .ok_or_else(|| internal(format!("a window of {} ranks", peers.ptrs.len())))?;
    l.desc.upload(&w.encode())?;
    tracing::debug!(
        "occl-nccl: rank {me}: device window {:#x} ({} bytes) over {} ranks",
        l.desc.ptr(),
        l.size,
        recs.len()
    );
    c.lsa().add_window(Window { desc: l.desc, ce, _peers: peers });
    Ok(())
}

fn run_dev_comm(c: &NcclComm, d: &DevComm, local: Result<DevCommLocal>, out: usize) -> Result<()> {
    let (me, n) = (d.cc.rank(), d.cc.nranks());
    let rec = record(d, local.as_ref().ok().map(|l| (l.region.ptr(), 0, l.handle, l.plan.fingerprint())));
    let all = d.cc.exchange(&rec.encode())?;
    let l = local?;
    let recs = mem::records(&all, me, "ncclDevCommCreate")?;
    let peers = mem::map_peers(d.cc.context(), me, &recs)?;
    let p = &l.plan;
    let w = ncclWindow_vidmem::new(me, me, &peers.ptrs, p.bytes as u64)
        .ok_or_else(|| internal(format!("a resource window of {n} ranks")))?;
    l.desc.upload(&w.encode())?;
    let int = |v: usize| i32::try_from(v).map_err(|_| internal("a count exceeds int"));
    let timeout = d.cc.comm().config().timeout.as_nanos();
    let dc = ncclDevComm {
        rank: int(me)?,
        nRanks: int(n)?,
        lsaRank: int(me)?,
        lsaSize: int(n)?,
        resourceWindow: l.desc.ptr(),
        lsaBarrier: p.lsa_barrier,
        railGinBarrier: p.rail_barrier,
        lsaMultimem: ncclMultimemHandle { mcBasePtr: std::ptr::null_mut() },
        ginContextCount: 1,
        ginSignalCount: i32::try_from(p.signals).map_err(|_| internal("signals exceed int"))?,
        ginCounterCount: i32::try_from(p.counters).map_err(|_| internal("counters exceed int"))?,
        ginSignalOffset: u32::try_from(p.signal_offset).map_err(|_| internal("signal offset exceeds 4 GiB"))?,
        ginCounters: l.region.ptr() + p.counter_offset as u64,
        ginSignalShadows: l.region.ptr() + p.shadow_offset as u64,
        errorWord: d.cc.error_word(),
        timeoutNs: u64::try_from(timeout).unwrap_or(u64::MAX),
        magic: DEVCOMM_MAGIC,
        reserved: 0,
    };
    // SAFETY: the caller's ncclDevComm (checked non-NULL when the call was made), valid until
    // this setup has run (NCCL's contract for calls inside a group).
    unsafe { (out as *mut ncclDevComm).write(dc) };
    tracing::debug!(
        "occl-nccl: rank {me}: device communicator over {n} ranks, {} bytes of resources, {} signals",
        p.bytes,
        p.signals
    );
    c.lsa().add_comm(DevCommMem { desc: l.desc, _peers: peers, _region: l.region });
    Ok(())
}

/// Runs `s` now, or keeps it for the open group's end (then returning its local failure, if
/// any, at once).
pub(crate) fn submit(s: Setup, in_group: bool) -> Result<()> {
    if in_group {
        let failed = s.local_error();
        PENDING.with(|p| p.borrow_mut().push(s));
        return failed.map_or(Ok(()), Err);
    }
    let _restore = gpu::Restore::new();
    s.run()
}

/// Runs the group's setups: one thread per communicator, each running that communicator's
/// in call order (every rank makes them in the same order). The first failure is returned.
pub(crate) fn flush() -> Result<()> {
    let all = PENDING.with(|p| std::mem::take(&mut *p.borrow_mut()));
    if all.is_empty() {
        return Ok(());
    }
    let mut per: Vec<Vec<Setup>> = Vec::new();
    for s in all {
        match per.iter_mut().find(|v| Arc::ptr_eq(&v[0].comm, &s.comm)) {
            Some(v) => v.push(s),
            None => per.push(vec![s]),
        }
    }
    let run = |v: Vec<Setup>| {
        let mut first = Ok(());
        for s in v {
            let s = if first.is_err() { s.poisoned() } else { s };
            let r = s.run();
            if first.is_ok() {
                first = r;
            }
        }
        first
    };
    if per.len() == 1 {
        let _restore = gpu::Restore::new();
        return per.into_iter().try_for_each(run);
    }
    let results: Vec<Result<()>> = std::thread::scope(|sc| {
        let hs: Vec<_> = per
            .into_iter()
            .map(|v| {
                std::thread::Builder::new()
                    .name("occl-nccl-setup".into())
                    .spawn_scoped(sc, move || run(v))
                    .map_err(|e| Error::SystemError { context: "spawn a setup thread".into(), source: e })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.and_then(|h| h.join().unwrap_or_else(|_| Err(internal("a device-API setup panicked")))))
            .collect()
    });
    results.into_iter().collect()
}
