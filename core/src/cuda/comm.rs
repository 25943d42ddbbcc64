//! The device communicator: a host `Comm` (bootstrap, telemetry, RAS) plus, on one GPU, the
//! shared region every peer maps. Set up collectively: allocate and export the region, swap
//! handles and settings over the bootstrap, open every peer's: through CUDA IPC for another
//! process, by address for a rank of this process (`CudaComm::init_all`). When a peer is on
//! another host there is nothing to map: every call is staged through host memory (`staged`).

use super::budget::{Channels, CtaBudget, CtaPolicy, EFFICIENT_SMS};
use super::ce::{CeArea, CeGeometry, CeSends, CeStreams};
use super::events::{DevEvents, RING_SLOTS, SLOT_RECORDS};
use super::kernels::coll::{CollKernels, Layout, ERROR_WORD, MAX_LANES, MAX_RANKS};
use super::kernels::cudarc::driver::CudaContext;
use super::kernels::ipc::{DeviceRegion, PeerRegion};
use super::kernels::phases::ChannelRecord;
use super::kernels::stamps::AnchorTime;
use super::kernels::timer::{ClockMap, TimerRing};
use super::kernels::{device, staging, ClusterSize, SyncDomain};
use super::names::FUNCS;
use super::phases::{KernelPhases, VAR as PHASES_VAR};
use super::staged::Staged;
use super::tune::DevTuner;
use super::watch::{Calls, Watch};
use super::windows::{WindowId, Windows};
use super::{err, parse_size};
use crate::comm::Comm;
use crate::config::Config;
use crate::error::{Error, Result};
use crate::id::UniqueId;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

/// The shape of the shared region (`OCCL_CUDA_CHANNELS`, `OCCL_CUDA_SLOTS`,
/// `OCCL_CUDA_SLOT_SIZE`, and the copy-engine area's `OCCL_CE_SLOTS`, `OCCL_CE_SLOT_BYTES`) and
/// the CTA budget (`budget.rs`), which every rank must share, and the channels per thread block
/// (`OCCL_CUDA_LANES`) and how the copy engines' sends are issued (`OCCL_CE_BATCH`,
/// `OCCL_CE_BATCH_CHUNKS`), which each rank picks for itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceSettings {
    /// The most channels an operation spreads over (the budget picks how many per call).
    pub channels: u32,
    /// Buffers per channel and peer.
    pub slots: u32,
    pub slot_bytes: u64,
    /// Channels per thread block: 1 or 2 of 512 threads, or 4 of 256.
    pub lanes: u32,
    pub budget: CtaBudget,
    /// The copy-engine collectives' slots (`ce/mod.rs`).
    pub ce: CeGeometry,
    /// How this rank's copy-engine sends are issued (`ce/mod.rs`).
    pub ce_sends: CeSends,
    /// The memory synchronization domain of the kernels that talk to peers
    /// (`NCCL_MEM_SYNC_DOMAIN`; occl-kernels' `peer_launch.rs`), which each rank picks for itself.
    pub sync_domain: SyncDomain,
    /// Thread blocks per cluster of the kernels that talk to peers (`NCCL_CGA_CLUSTER_SIZE`;
    /// `peer_launch.rs`), which each rank picks for itself; `None`: not set, NCCL's default.
    pub cluster: Option<ClusterSize>,
}

impl Default for DeviceSettings {
    /// At most 128 channels, two per thread block. 128 one-lane channels put every large
    /// collective level with or ahead of NCCL 2.28 on 2 and 4 H100/H200s
    /// (bench/baselines/gpu-collectives.md) but held nearly every SM; two lanes per block do
    /// the same channels on half the SMs at 0.95-1.0× of that bandwidth from 256 MiB. The
    /// default CTA policy takes 64 of them at most (32 SMs, `budget.rs`); the region holds 128
    /// so that `minCTAs` 64 or four lanes can have them. The shared region grows with the
    /// channels: channels × ranks × slots × slot bytes, 128 MiB per rank of the communicator.
    fn default() -> Self {
        DeviceSettings {
            channels: 128,
            slots: 4,
            slot_bytes: 256 << 10,
            lanes: 2,
            budget: CtaBudget::default(),
            ce: CeGeometry::default(),
            ce_sends: CeSends::default(),
            sync_domain: SyncDomain::default(),
            cluster: None,
        }
    }
}

impl DeviceSettings {
    pub fn from_env() -> Result<DeviceSettings> {
        let mut s = DeviceSettings::from_vars(|k| std::env::var(k).ok())?;
        s.budget = CtaBudget::from_env()?;
        Ok(s)
    }

    /// The settings of the variables `var` gives (all but the budget).
    fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<DeviceSettings> {
        let mut s = DeviceSettings::default();
        let num = |k: &str| -> Result<Option<u64>> {
            match var(k) {
                Some(v) => parse_size(&v).map(Some).ok_or_else(|| Error::arg(format!("{k}={v:?} is not a size"))),
                None => Ok(None),
            }
        };
        if let Some(v) = num("OCCL_CUDA_CHANNELS")? {
            s.channels = u32::try_from(v).map_err(|_| Error::arg("OCCL_CUDA_CHANNELS is too large"))?;
        }
        if let Some(v) = num("OCCL_CUDA_SLOTS")? {
            s.slots = u32::try_from(v).map_err(|_| Error::arg("OCCL_CUDA_SLOTS is too large"))?;
        }
        if let Some(v) = num("OCCL_CUDA_SLOT_SIZE")? {
            s.slot_bytes = v;
        }
        if let Some(v) = num("OCCL_CUDA_LANES")? {
            s.lanes = u32::try_from(v).ok().filter(|l| [1, 2, MAX_LANES].contains(l)).ok_or_else(|| {
                Error::arg(format!("OCCL_CUDA_LANES={v}: a thread block runs 1, 2 or {MAX_LANES} channels"))
            })?;
        }
        if let Some(v) = num("OCCL_CE_SLOTS")? {
            s.ce.slots = v;
        }
        if let Some(v) = num("OCCL_CE_SLOT_BYTES")? {
            s.ce.slot_bytes = v;
        }
        s.ce_sends = match var("OCCL_CE_BATCH").as_deref().map(str::trim) {
            Some("0") => CeSends::Lanes,
            None | Some("" | "1") => {
                let chunks = num("OCCL_CE_BATCH_CHUNKS")?.unwrap_or(1);
                if !(1..=CeSends::MAX_CHUNKS).contains(&chunks) {
                    return Err(Error::arg(format!(
                        "OCCL_CE_BATCH_CHUNKS={chunks}: a share is cut into 1 to {} pieces",
                        CeSends::MAX_CHUNKS
                    )));
                }
                CeSends::Batch { chunks }
            }
            Some(v) => return Err(Error::arg(format!("OCCL_CE_BATCH={v:?} is not 0 or 1"))),
        };
        if let Some(v) = var("NCCL_MEM_SYNC_DOMAIN") {
            s.sync_domain = SyncDomain::parse(&v).map_err(Error::arg)?;
        }
        if let Some(v) = var("NCCL_CGA_CLUSTER_SIZE") {
            s.cluster = Some(ClusterSize::parse(&v).map_err(Error::arg)?);
        }
        Ok(s)
    }

    /// These settings with `budget` in place of the environment's alone (a communicator's
    /// `ncclConfig_t` fields under the environment: [`CtaBudget::under_env`]).
    pub fn with_budget(self, budget: CtaBudget) -> Result<DeviceSettings> {
        Ok(DeviceSettings { budget: budget.checked()?, ..self })
    }
}

/// A communicator whose collectives run on one GPU's buffers.
pub struct CudaComm {
    pub(crate) comm: Arc<Comm>,
    pub(crate) ctx: Arc<CudaContext>,
    pub(crate) kernels: CollKernels,
    pub(crate) layout: Layout,
    pub(crate) regions: [u64; MAX_RANKS],
    pub(crate) tuner: DevTuner,
    /// How many channels (and SMs) each call takes.
    pub(crate) channels: Channels,
    /// The copy-engine area of every rank's region (`ce/mod.rs`).
    pub(crate) ce: CeArea,
    /// The streams copy-engine calls fork onto (`CTAPolicy` zero with peers), else `None`.
    pub(crate) ce_streams: Option<CeStreams>,
    /// Symmetric windows, whose buffers copy-engine calls write straight into (`windows.rs`).
    pub(crate) windows: Windows,
    pub(crate) timeout_ns: u64,
    /// A per-communicator override of the tuner (0: none, else 1 + the `DevAlgo::ALL` index).
    pub(crate) forced: std::sync::atomic::AtomicU8,
    /// Set when a peer is on another host: every call goes through host memory.
    pub(crate) staged: Option<Staged>,
    /// The KernelCh timer ring and clock map; `None` when they could not be set up (logged).
    pub(crate) events: Option<DevEvents>,
    /// NCCL's per-function sequence numbers of the profiler's Coll/P2p events.
    pub(crate) seqs: [AtomicU64; FUNCS],
    /// The kernels' phase profile (`OCCL_KERNEL_PHASES=1`), else `None`.
    pub(crate) phases: Option<KernelPhases>,
    /// The watcher's view of this communicator (`watch.rs`): its peers and copy-engine calls;
    /// `None` when no peer is another process on this host and no call runs on the copy
    /// engines, or when staged.
    pub(crate) watch: Option<Watch>,
    /// Channels of the latest call's launch (0: it ran on the copy engines), for
    /// [`CudaComm::last_launch`].
    pub(crate) last_channels: std::sync::atomic::AtomicU32,
    region: Arc<DeviceRegion>,
    _peers: Vec<PeerRegion>,
}

/// The KernelCh timer ring and the device clock's offset (`OCCL_CUDA_KERNEL_EVENTS=0`: none).
/// A failure costs the events, not the communicator.
fn kernel_events(ctx: &Arc<CudaContext>, k: &CollKernels) -> Option<DevEvents> {
    if std::env::var("OCCL_CUDA_KERNEL_EVENTS").is_ok_and(|v| v == "0") {
        return None;
    }
    let set_up = TimerRing::alloc(ctx, RING_SLOTS, SLOT_RECORDS)
        .and_then(|ring| Ok((ring, k.clock_probe(&occl_events::unix_nanos)?)));
    match set_up {
        Ok((ring, (probe, clock))) => {
            tracing::debug!("occl: device clock offset {} ns, ± {} ns", clock.offset_ns, clock.err_ns);
            Some(DevEvents::new(ring, clock, Some(probe)))
        }
        Err(e) => {
            tracing::warn!("occl: no KernelCh events on this device: {e}");
            None
        }
    }
}

impl Drop for CudaComm {
    /// Launches still holding timer slots finish (kernels give up within `OCCL_TIMEOUT`) and
    /// their KernelCh events are reported before the ring is freed; copy-engine calls in flight
    /// finish before the region they copy through is freed (the watcher releases a stalled one
    /// at `OCCL_TIMEOUT`), and their CeColl events are reported.
    fn drop(&mut self) {
        let timed = self.events.as_ref().filter(|ev| ev.outstanding() > 0);
        let copying = self.ce_streams.as_ref().is_some_and(|s| s.calls().any());
        if timed.is_some() || copying {
            if let Err(e) = self.ctx.synchronize() {
                tracing::warn!("occl: synchronising the device before freeing a communicator: {e:?}");
            }
        }
        if let Some(ev) = timed {
            ev.collect(self.comm.fanout());
        }
        if let Some(ce) = &self.ce_streams {
            ce.spans().collect(self.comm.fanout());
        }
    }
}

/// What ranks swap: the IPC handle, a set-up flag, the rank's lanes (byte 65), the region's
/// shape (bytes 68..88), then the process id, the device and the region's address, which a rank
/// of the same process uses instead of the handle (IPC cannot open this process's own
/// allocations), then the CTA budget and the copy-engine slots. The shape, the budget and the
/// slots must be equal on every rank; the lanes may differ.
const RECORD: usize = 64 + 4 + 4 + 8 + 8 + 4 + 4 + 8 + 20 + 16;
const LANES: usize = 65;
const SETTINGS: std::ops::Range<usize> = 68..88;
const BUDGET: std::ops::Range<usize> = 104..124;
const CE: std::ops::Range<usize> = 124..140;

/// Rank `r`'s record `theirs` against this rank's `mine`: a usage error that names the
/// variables when a setting every rank must share differs.
fn agree(r: usize, mine: &[u8], theirs: &[u8]) -> Result<()> {
    let shared: [(std::ops::Range<usize>, &str); 3] = [
        (
            SETTINGS,
            "uses other device settings (OCCL_CUDA_CHANNELS, OCCL_CUDA_SLOTS, OCCL_CUDA_SLOT_SIZE must be the same \
             on every rank)",
        ),
        (
            BUDGET,
            "has another CTA budget (minCTAs, maxCTAs and CTAPolicy of ncclConfig_t, or NCCL_MIN_CTAS, \
             NCCL_MAX_CTAS, NCCL_CTA_POLICY, and OCCL_CE_MIN_SHARE must be the same on every rank)",
        ),
        (CE, "has other copy-engine slots (OCCL_CE_SLOTS, OCCL_CE_SLOT_BYTES must be the same on every rank)"),
    ];
    match shared.into_iter().find(|(at, _)| theirs.get(at.clone()) != mine.get(at.clone())) {
        Some((_, what)) => Err(Error::usage(format!("rank {r} {what}"))),
        None => Ok(()),
    }
}

/// Whether two ranks of one process (`hosts`: each rank's host id, `all`: their records) run on
/// one GPU. They share its hardware queues, where one's copy-engine wait can hold a step the
/// other needs (`ce/mod.rs`), so such a communicator keeps off the copy engines
/// ([`off_the_copy_engines`]). Every rank sees the same records, so every rank agrees.
fn shares_a_gpu(hosts: &[&str], all: &[Vec<u8>]) -> bool {
    let place = |r: usize| Some((hosts.get(r)?, all[r].get(88..96)?));
    (0..all.len()).any(|a| (a + 1..all.len()).any(|b| place(a).is_some() && place(a) == place(b)))
}

/// `budget` for a communicator with two ranks of one process on one GPU: no call on the copy
/// engines, `CTAPolicy` zero's calls on the kernels as under `Efficiency` (at most 24 SMs),
/// which zero runs every call it cannot put on the copy engines with. NVIDIA's NCCL refuses
/// such a communicator.
fn off_the_copy_engines(budget: CtaBudget) -> CtaBudget {
    if budget.policy == CtaPolicy::Zero {
        tracing::info!(
            "occl: two ranks of this process share a GPU, where copy-engine waits could stall each other: \
             CTAPolicy zero runs on at most {EFFICIENT_SMS} SMs' kernels"
        );
    }
    let policy = if budget.policy == CtaPolicy::Zero { CtaPolicy::Efficiency } else { budget.policy };
    CtaBudget { policy, ce_share: 0, ..budget }
}

/// The fewest lanes of any rank's record: the count every rank's channel choice follows.
fn common_lanes(all: &[Vec<u8>]) -> Result<u32> {
    let mut fewest = MAX_LANES;
    for (r, rec) in all.iter().enumerate() {
        let l = rec.get(LANES).map_or(0, |&l| u32::from(l));
        if !(1..=MAX_LANES).contains(&l) {
            return Err(Error::internal(format!("rank {r} sent {l} lanes per thread block; 1 to {MAX_LANES}")));
        }
        fewest = fewest.min(l);
    }
    Ok(fewest)
}

impl CudaComm {
    /// `Comm::init_rank` on device `device` (NCCL's cudaSetDevice + ncclCommInitRank).
    pub fn init_rank(nranks: usize, id: &UniqueId, rank: usize, config: Config, device: usize) -> Result<CudaComm> {
        CudaComm::new(Comm::init_rank(nranks, id, rank, config)?, device)
    }

    /// One communicator over several GPUs of this process, rank i on `devices[i]` (NCCL's
    /// ncclCommInitAll): thread ranks whose regions are shared by address, with peer access
    /// enabled between different GPUs. A GPU may appear more than once. Every element type's
    /// kernels are built and loaded here: ranks on one GPU share its context, where loading a
    /// kernel at its first launch could wait for a peer's kernel that waits for that launch.
    pub fn init_all(devices: &[usize]) -> Result<Vec<CudaComm>> {
        let s = DeviceSettings::from_env()?;
        let comms = Comm::init_all(devices.len())?;
        let made: Vec<Result<CudaComm>> = std::thread::scope(|sc| {
            let hs: Vec<_> = comms
                .into_iter()
                .zip(devices)
                .map(|(c, &d)| {
                    sc.spawn(move || {
                        let cc = CudaComm::with_settings(c, d, s)?;
                        cc.kernels.load_all().map_err(err("load every collective kernel"))?;
                        Ok(cc)
                    })
                })
                .collect();
            hs.into_iter()
                .map(|h| h.join().unwrap_or_else(|_| Err(Error::internal("device set-up thread panicked"))))
                .collect()
        });
        made.into_iter().collect()
    }

    /// Puts `comm` on GPU `device`: a collective call, every rank makes it with its own GPU.
    pub fn new(comm: Comm, device: usize) -> Result<CudaComm> {
        CudaComm::with_settings(comm, device, DeviceSettings::from_env()?)
    }

    pub fn with_settings(mut comm: Comm, device: usize, s: DeviceSettings) -> Result<CudaComm> {
        // Device operations are timed by their kernels' events: the span route (`profile`).
        comm.metrics_to_spans();
        let n = comm.nranks();
        let layout = Layout { nranks: n as u32, channels: s.channels, slots: s.slots, slot_bytes: s.slot_bytes };
        layout.validate().map_err(err("device communicator"))?;
        let tuner = DevTuner::new(comm.config(), n)?;
        // Every rank gets this far, or says why not to all (no rank waits on one that left).
        let local = device::context(device).map_err(err("open the GPU")).and_then(|ctx| {
            let k = CollKernels::load(&ctx, s.lanes)
                .map_err(err("load the collective kernels"))?
                .launching(s.sync_domain, s.cluster.unwrap_or_default());
            let phases = KernelPhases::from_env(&ctx, &k, s.channels)?;
            s.ce.checked(n)?;
            let area = CeArea::after(layout.bytes(), n, s.ce);
            let bytes = usize::try_from(area.end()).map_err(|_| Error::arg("region too large"))?;
            let r = DeviceRegion::alloc(&ctx, bytes).map_err(err("allocate the shared region"))?;
            for (at, v) in area.at_rest() {
                r.write_u64(at, v).map_err(err("set up the copy-engine words"))?;
            }
            let h = r.ipc_handle().map_err(err("export the shared region"))?;
            let streams = (s.budget.may_use_copy_engines() && n > 1)
                .then(|| CeStreams::new(&ctx, n, comm.config().timeout, s.ce_sends))
                .transpose()
                .map_err(err("make the copy-engine streams"))?;
            Ok((ctx, k, r, h, streams, phases))
        });
        let mut mine = vec![0u8; RECORD];
        if let Ok((_, _, _, h, _, _)) = &local {
            mine[..64].copy_from_slice(h);
            mine[64] = 1;
        }
        mine[LANES] = u8::try_from(s.lanes).map_err(|_| Error::arg("OCCL_CUDA_LANES is too large"))?;
        mine[68..72].copy_from_slice(&s.channels.to_le_bytes());
        mine[72..80].copy_from_slice(&u64::from(s.slots).to_le_bytes());
        mine[80..88].copy_from_slice(&s.slot_bytes.to_le_bytes());
        mine[88..92].copy_from_slice(&std::process::id().to_le_bytes());
        mine[92..96].copy_from_slice(&(device as u32).to_le_bytes());
        if let Ok((_, _, r, _, _, _)) = &local {
            mine[96..104].copy_from_slice(&r.ptr().to_le_bytes());
        }
        mine[BUDGET].copy_from_slice(&s.budget.encode());
        mine[CE].copy_from_slice(&s.ce.encode());
        let all = comm.boot_all_gather(&mine)?;
        let (ctx, kernels, region, _, ce_streams, phases) = local?;
        for (r, rec) in all.iter().enumerate() {
            if rec.len() != RECORD {
                return Err(Error::internal(format!("rank {r} sent a {}-byte device record", rec.len())));
            }
            if rec[64] != 1 {
                return Err(Error::remote(r, "could not set up its GPU (its own error says why)"));
            }
            agree(r, &mine, rec)?;
        }
        let common_lanes = common_lanes(&all)?;
        let mut regions = [0u64; MAX_RANKS];
        let mut peers = Vec::new();
        let me = &comm.table[comm.rank()];
        let remote = comm.table.iter().any(|p| p.host_id != me.host_id);
        let word = |rec: &[u8], at: usize| u64::from_le_bytes(rec[at..at + 8].try_into().unwrap_or_default());
        let half = |rec: &[u8], at: usize| u32::from_le_bytes(rec[at..at + 4].try_into().unwrap_or_default());
        let hosts: Vec<&str> = comm.table.iter().map(|p| p.host_id.as_str()).collect();
        let budget = if shares_a_gpu(&hosts, &all) { off_the_copy_engines(s.budget) } else { s.budget };
        // With a peer on another host the regions go unused (every call is staged), so none is
        // opened: IPC handles of another host's GPUs mean nothing here.
        for (r, rec) in all.iter().enumerate().filter(|_| !remote) {
            if r == comm.rank() {
                regions[r] = region.ptr();
            } else if half(rec, 88) == std::process::id() {
                let theirs = device::context(half(rec, 92) as usize).map_err(err("open a peer's GPU"))?;
                staging::enable_peer_access(&ctx, &theirs)
                    .map_err(err("enable peer access to a GPU of this process"))?;
                regions[r] = word(rec, 96);
            } else {
                let mut h = [0u8; 64];
                h.copy_from_slice(&rec[..64]);
                let p = PeerRegion::open(&ctx, &h).map_err(err("open a peer's region (cuIpcOpenMemHandle)"))?;
                regions[r] = p.ptr();
                peers.push(p);
            }
        }
        // No rank writes a peer's region before every rank has mapped everyone's.
        comm.boot_all_gather(&[])?;
        let comm = Arc::new(comm);
        let staged = if remote { Some(Staged::new(&ctx, comm.clone())?) } else { None };
        let timeout_ns = u64::try_from(comm.config().timeout.as_nanos()).unwrap_or(u64::MAX);
        let events = kernel_events(&ctx, &kernels);
        let region = Arc::new(region);
        let ce = CeArea::after(layout.bytes(), n, s.ce);
        let watch = if staged.is_some() {
            None
        } else {
            let peers: Vec<_> = comm.table.iter().map(|p| (p.rank, p.pid)).collect();
            let r = region.clone();
            let calls = ce_streams.as_ref().map(|s| s.calls().clone() as Arc<dyn Calls>);
            Watch::start(comm.rank(), &peers, comm.config().timeout, calls, Box::new(move || abort(&r, ce)))
        };
        tracing::debug!(
            "occl: rank {} on GPU {device}: {} to {} peers, {} MiB region",
            comm.rank(),
            if staged.is_some() { "staged through host memory" } else { "cuda-p2p" },
            n - 1,
            layout.bytes() >> 20
        );
        Ok(CudaComm {
            comm,
            ctx,
            kernels,
            layout,
            regions,
            tuner,
            channels: Channels { region: s.channels, lanes: s.lanes, common_lanes, budget },
            ce,
            ce_streams,
            windows: Windows::default(),
            timeout_ns,
            forced: Default::default(),
            staged,
            events,
            seqs: Default::default(),
            phases,
            watch,
            last_channels: Default::default(),
            region,
            _peers: peers,
        })
    }

    pub fn comm(&self) -> &Comm {
        &self.comm
    }

    pub fn rank(&self) -> usize {
        self.comm.rank()
    }

    pub fn nranks(&self) -> usize {
        self.comm.nranks()
    }

    /// Whether calls are staged through host memory (a peer is on another host).
    pub fn is_staged(&self) -> bool {
        self.staged.is_some()
    }

    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// Builds the kernels of `dt` now (before a graph captures its first use).
    pub fn prepare(&self, dt: crate::DataType) -> Result<()> {
        self.kernels.prepare(dt).map_err(err("build the collective kernels"))?;
        if self.phases.is_some() {
            self.kernels.prepare_phases(Some(dt)).map_err(err("build the phase-profiled kernels"))?;
        }
        Ok(())
    }

    /// The device's error word: a kernel that waited past `OCCL_TIMEOUT` for a peer set it, or
    /// the watcher did when a peer process exited (a `RemoteError` naming the rank) or a
    /// copy-engine call ran past `OCCL_TIMEOUT` (a `Timeout` naming the call); the results are
    /// garbage, and so are every later call's. After the watcher's, later calls are refused.
    pub fn device_error(&self) -> Result<()> {
        if let Some(e) = self.staged.as_ref().and_then(Staged::error) {
            return Err(e);
        }
        if let Some(e) = self.watch.as_ref().and_then(Watch::error) {
            return Err(e);
        }
        match self.region.read_u64(ERROR_WORD).map_err(err("read the device error word"))? {
            0 => Ok(()),
            _ => Err(Error::Timeout {
                what: "a device collective waiting for a peer".into(),
                secs: self.comm.config().timeout.as_secs_f64(),
            }),
        }
    }

    /// The map from the device clock to the span clock measured at creation (`None`: KernelCh
    /// events are off, see the log).
    pub fn clock_map(&self) -> Option<ClockMap> {
        self.events.as_ref().map(DevEvents::clock)
    }

    /// Reports the KernelCh events of every launch and the CeColl events of every copy-engine
    /// call that has finished (call it after synchronising the streams to have them all);
    /// returns how many launches and calls it reported. Operations also report them as they
    /// start, and so does the communicator's drop.
    pub fn flush_events(&self) -> usize {
        let f = self.comm.fanout();
        let launches = self.events.as_ref().map_or(0, |e| e.collect(f));
        launches + self.ce_streams.as_ref().map_or(0, |c| c.spans().collect(f))
    }

    /// Timed launches whose KernelCh events are not reported yet, and launches that wanted
    /// them but ran untimed (every timer slot outstanding).
    pub fn kernel_events_pending(&self) -> (usize, u64) {
        self.events.as_ref().map_or((0, 0), |e| (e.outstanding(), e.untimed()))
    }

    /// The anchor of the device's event clock, which places copy-engine calls' CeColl events
    /// on the span clock; every communicator of this context shares it (`None`: no copy-engine
    /// streams, or no measurement succeeded yet).
    pub fn ce_clock(&self) -> Option<AnchorTime> {
        self.ce_streams.as_ref().and_then(|c| c.spans().anchor())
    }

    /// Timed copy-engine calls whose CeColl events are not reported yet, and calls that wanted
    /// them but ran untimed (every stamp pair in flight, or no anchor for the device clock).
    pub fn ce_events_pending(&self) -> (usize, u64) {
        self.ce_streams.as_ref().map_or((0, 0), |c| c.spans().pending())
    }

    /// Every rank's `mine` over the bootstrap, in rank order (a collective call: every rank
    /// makes it). For layers above that share more device memory with the same peers
    /// (occl-nccl's windows and device communicators) and must swap handles the way this
    /// communicator swapped its regions.
    pub fn exchange(&self, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
        self.comm.boot_all_gather(mine)
    }

    /// Adds a window that every rank registered with `NCCL_WIN_COLL_SYMMETRIC`: `len` bytes on
    /// every rank, rank `r`'s buffer mapped here at `bases[r]` (this rank's own included). An
    /// all-gather, all-to-all or broadcast whose output lies wholly in it, on the copy engines or
    /// in the kernels' windowed mode, writes each peer's part straight into that peer's buffer
    /// at the same offset, which holds only if every rank's buffers of the call lie at the same
    /// offset of its window (the flag's promise, as in NCCL). Remove it with
    /// [`CudaComm::remove_window`] before the peers' buffers are unmapped.
    pub fn add_symmetric_window(&self, bases: &[u64], len: u64) -> Result<WindowId> {
        if bases.len() != self.nranks() {
            return Err(Error::internal(format!("a window of {} ranks on {} ranks", bases.len(), self.nranks())));
        }
        self.windows.add(self.rank(), bases, len)
    }

    /// Removes a window of [`CudaComm::add_symmetric_window`]; false when it is not live. Later
    /// calls on its buffers go through the slots (the copy engines' or the kernels').
    pub fn remove_window(&self, id: WindowId) -> bool {
        self.windows.remove(id)
    }

    /// The device address of this rank's error word (a `u64`). Nonzero once a kernel waited
    /// past `OCCL_TIMEOUT`, a same-host peer process died or `abort_device` ran; `device_error`
    /// reports it. Kernels of other layers that wait on peers poll it so that they give up with
    /// occl's, and set it when they time out themselves.
    pub fn error_word(&self) -> u64 {
        self.region.ptr() + ERROR_WORD as u64
    }

    /// Makes every kernel of this rank that waits on a peer give up (and mark the error word),
    /// and releases every copy-engine wait, now and (by the watcher) until the copy-engine
    /// calls in flight have drained.
    pub fn abort_device(&self) -> Result<()> {
        if let Some(w) = &self.watch {
            w.aborted();
        }
        abort(&self.region, self.ce)
    }

    /// Whether this communicator profiles its kernels' phases on request (`OCCL_KERNEL_PHASES=1`
    /// when it was created; `phases.rs`).
    pub fn kernel_phases_enabled(&self) -> bool {
        self.phases.is_some()
    }

    /// Runs the next kernel this communicator launches (outside a graph capture) with the
    /// phase profile. A usage error unless `OCCL_KERNEL_PHASES=1` was set at creation.
    pub fn profile_next_call(&self) -> Result<()> {
        match &self.phases {
            Some(p) => {
                p.arm();
                Ok(())
            }
            None => Err(Error::usage(format!("kernel phases need {PHASES_VAR}=1 when the communicator is created"))),
        }
    }

    /// The records of the launch [`CudaComm::profile_next_call`] marked, one per channel, once
    /// the caller has synchronised its stream; `None` when that call launched no kernel (copy
    /// engines, staged through host memory, nothing to move) or profiling is off. The mark ends
    /// here either way: no later call is profiled by it.
    pub fn kernel_phases(&self) -> Result<Option<Vec<ChannelRecord>>> {
        self.phases.as_ref().map_or(Ok(None), KernelPhases::read)
    }
}

/// Sets the error word and writes every copy-engine word past any wait on it.
fn abort(region: &DeviceRegion, ce: CeArea) -> Result<()> {
    region.write_u64(ERROR_WORD, 1).map_err(err("write the device error word"))?;
    for (at, v) in ce.release_all() {
        region.write_u64(at, v).map_err(err("release the copy-engine waits"))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::CollType;

    fn vars<'a>(kv: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| kv.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string())
    }

    #[test]
    fn copy_engine_slots_come_from_the_environment() {
        let s = DeviceSettings::from_vars(vars(&[])).unwrap();
        assert_eq!(s.ce, CeGeometry::default());
        assert_eq!(s.ce, CeGeometry { slots: 2, slot_bytes: 8 << 20 });
        let s = DeviceSettings::from_vars(vars(&[("OCCL_CE_SLOTS", "4"), ("OCCL_CE_SLOT_BYTES", "16M")])).unwrap();
        assert_eq!(s.ce, CeGeometry { slots: 4, slot_bytes: 16 << 20 });
        let s = DeviceSettings::from_vars(vars(&[("OCCL_CE_SLOT_BYTES", "2097152")])).unwrap();
        assert_eq!(s.ce, CeGeometry { slots: 2, slot_bytes: 2 << 20 });
        let e = DeviceSettings::from_vars(vars(&[("OCCL_CE_SLOTS", "two")])).unwrap_err().to_string();
        assert!(e.contains("OCCL_CE_SLOTS=\"two\" is not a size"), "{e}");
    }

    #[test]
    fn the_sync_domain_is_nccls_variable() {
        assert_eq!(DeviceSettings::from_vars(vars(&[])).unwrap().sync_domain, SyncDomain::Remote);
        let s = DeviceSettings::from_vars(vars(&[("NCCL_MEM_SYNC_DOMAIN", "0")])).unwrap();
        assert_eq!(s.sync_domain, SyncDomain::Default);
        let e = DeviceSettings::from_vars(vars(&[("NCCL_MEM_SYNC_DOMAIN", "4")])).unwrap_err().to_string();
        assert!(e.contains("NCCL_MEM_SYNC_DOMAIN=4"), "{e}");
    }

    /// Unset, the cluster size is left to the communicator's config or NCCL's default.
    #[test]
    fn the_cluster_size_is_nccls_variable() {
        assert_eq!(DeviceSettings::from_vars(vars(&[])).unwrap().cluster, None);
        let s = DeviceSettings::from_vars(vars(&[("NCCL_CGA_CLUSTER_SIZE", "0")])).unwrap();
        assert_eq!(s.cluster, Some(ClusterSize::NONE));
        let s = DeviceSettings::from_vars(vars(&[("NCCL_CGA_CLUSTER_SIZE", "2")])).unwrap();
        assert_eq!(s.cluster, Some(ClusterSize::new(2)));
        let e = DeviceSettings::from_vars(vars(&[("NCCL_CGA_CLUSTER_SIZE", "-1")])).unwrap_err().to_string();
        assert!(e.contains("NCCL_CGA_CLUSTER_SIZE=-1"), "{e}");
    }

    /// `OCCL_CE_BATCH` (0 or 1, default 1) and its pieces per share.
    #[test]
    fn the_copy_engines_batch_their_sends_unless_told_not_to() {
        let sends = |v: &[(&'static str, &'static str)]| DeviceSettings::from_vars(vars(v)).map(|s| s.ce_sends);
        assert_eq!(sends(&[]).ok(), Some(CeSends::Batch { chunks: 1 }));
        assert_eq!(sends(&[("OCCL_CE_BATCH", "0"), ("OCCL_CE_BATCH_CHUNKS", "4")]).ok(), Some(CeSends::Lanes));
        assert_eq!(sends(&[("OCCL_CE_BATCH", "1")]).ok(), Some(CeSends::Batch { chunks: 1 }));
        let four = sends(&[("OCCL_CE_BATCH", "1"), ("OCCL_CE_BATCH_CHUNKS", "4")]);
        assert_eq!(four.ok(), Some(CeSends::Batch { chunks: 4 }));
        let e = sends(&[("OCCL_CE_BATCH", "yes")]).unwrap_err().to_string();
        assert!(e.contains("OCCL_CE_BATCH=\"yes\" is not 0 or 1"), "{e}");
        for bad in ["0", "65"] {
            let e = sends(&[("OCCL_CE_BATCH", "1"), ("OCCL_CE_BATCH_CHUNKS", bad)]).unwrap_err().to_string();
            assert!(e.contains("1 to 64 pieces"), "{e}");
        }
    }

    fn record(s: &DeviceSettings) -> Vec<u8> {
        let mut r = vec![0u8; RECORD];
        r[LANES] = s.lanes as u8;
        r[68..72].copy_from_slice(&s.channels.to_le_bytes());
        r[BUDGET].copy_from_slice(&s.budget.encode());
        r[CE].copy_from_slice(&s.ce.encode());
        r
    }

    #[test]
    fn lanes_are_each_ranks_own_and_the_channels_follow_the_fewest() {
        let s = DeviceSettings::from_vars(vars(&[])).unwrap();
        assert_eq!(s.lanes, 2);
        for l in [1, 2, 4] {
            let s = DeviceSettings::from_vars(vars(&[("OCCL_CUDA_LANES", &l.to_string())])).unwrap();
            assert_eq!(s.lanes, l);
        }
        for bad in ["0", "3", "5", "8"] {
            let e = DeviceSettings::from_vars(vars(&[("OCCL_CUDA_LANES", bad)])).unwrap_err().to_string();
            assert!(e.contains(&format!("OCCL_CUDA_LANES={bad}: a thread block runs 1, 2 or 4")), "{e}");
        }
        let d = DeviceSettings::default();
        let four = DeviceSettings { lanes: 4, ..d };
        // Other lanes are no disagreement; the count follows the fewest.
        assert!(agree(1, &record(&d), &record(&four)).is_ok());
        assert_eq!(common_lanes(&[record(&four), record(&four)]).unwrap(), 4);
        assert_eq!(common_lanes(&[record(&four), record(&d), record(&four)]).unwrap(), 2);
        assert_eq!(common_lanes(&[record(&DeviceSettings { lanes: 1, ..d }), record(&four)]).unwrap(), 1);
        let e = common_lanes(&[record(&d), record(&DeviceSettings { lanes: 0, ..d })]).unwrap_err();
        assert!(e.to_string().contains("rank 1 sent 0 lanes"), "{e}");
        assert!(common_lanes(&[record(&d), vec![0u8; 16]]).is_err(), "a short record");
    }

    /// Ranks of one process on one GPU: the process id and device (bytes 88..96) and the host
    /// match.
    #[test]
    fn two_ranks_of_a_process_on_one_gpu_are_found() {
        let rec = |pid: u32, dev: u32| {
            let mut r = vec![0u8; RECORD];
            r[88..92].copy_from_slice(&pid.to_le_bytes());
            r[92..96].copy_from_slice(&dev.to_le_bytes());
            r
        };
        let one = ["a", "a", "a"];
        assert!(!shares_a_gpu(&one, &[rec(7, 0), rec(7, 1), rec(8, 0)]), "threads on two GPUs, a process on one");
        assert!(shares_a_gpu(&one, &[rec(7, 0), rec(8, 1), rec(7, 0)]), "ranks 0 and 2");
        assert!(!shares_a_gpu(&["a", "b"], &[rec(7, 0), rec(7, 0)]), "the same pid on two hosts");
        assert!(!shares_a_gpu(&["a"], &[rec(7, 0)]));
        assert!(!shares_a_gpu(&one[..2], &[rec(7, 0), vec![0u8; 16]]), "a short record is no match");
        assert!(!shares_a_gpu(&one[..2], &[vec![0u8; 16], vec![0u8; 16]]));
        // Such a communicator runs every call on the kernels, zero's as under efficiency.
        for policy in [CtaPolicy::Default, CtaPolicy::Efficiency, CtaPolicy::Zero] {
            let b = off_the_copy_engines(CtaBudget { policy, ..CtaBudget::default() });
            let want = if policy == CtaPolicy::Zero { CtaPolicy::Efficiency } else { policy };
            assert_eq!((b.policy, b.ce_share), (want, 0));
            assert!(!b.may_use_copy_engines(), "{policy:?}");
            assert!(!b.on_copy_engines(CollType::AllGather, 1 << 30, true), "{policy:?}");
        }
    }

    #[test]
    fn ranks_must_agree_on_the_copy_engine_slots() {
        let d = DeviceSettings::default();
        assert!(agree(1, &record(&d), &record(&d)).is_ok());
        let other = DeviceSettings { ce: CeGeometry { slots: 4, ..d.ce }, ..d };
        let e = agree(1, &record(&d), &record(&other)).unwrap_err();
        assert!(matches!(e, Error::InvalidUsage(_)), "{e:?}");
        let e = e.to_string();
        assert!(e.contains("rank 1 has other copy-engine slots") && e.contains("OCCL_CE_SLOT_BYTES"), "{e}");
        let other = DeviceSettings { ce: CeGeometry { slot_bytes: 4 << 20, ..d.ce }, ..d };
        assert!(agree(3, &record(&d), &record(&other)).unwrap_err().to_string().contains("rank 3 has other copy"));
        let other = DeviceSettings { channels: 64, ..d };
        assert!(agree(2, &record(&d), &record(&other)).unwrap_err().to_string().contains("OCCL_CUDA_CHANNELS"));
        let other = DeviceSettings { budget: CtaBudget { policy: CtaPolicy::Zero, ..d.budget }, ..d };
        assert!(agree(2, &record(&d), &record(&other)).unwrap_err().to_string().contains("CTA budget"));
        let other = DeviceSettings { budget: CtaBudget { ce_share: 1 << 30, ..d.budget }, ..d };
        let e = agree(2, &record(&d), &record(&other)).unwrap_err().to_string();
        assert!(e.contains("CTA budget") && e.contains("OCCL_CE_MIN_SHARE"), "{e}");
        assert!(agree(2, &record(&d), &[0u8; 16]).is_err(), "a short record differs");
    }
}
