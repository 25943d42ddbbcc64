//! The device collectives' kernels (`cuda/coll.cu`): the layout of the shared region every rank
//! agrees on, the argument block, and the launch on the caller's stream.
//!
//! One program per element type (plus one that only moves bytes) is built at its first use, so
//! a job that reduces f32 never compiles fp8.

use crate::cache::{self, Cache};
use crate::dtype::{DataType, RedOp};
use crate::error::{check, driver, Error, Result};
use crate::kernels::{build_module, function, Func, THREADS};
use crate::peer_launch::{ClusterSize, PeerLaunch, SyncDomain};
use cudarc::driver::{CudaContext, CudaFunction, CudaModule, CudaStream, DeviceRepr, LaunchConfig};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Ranks one region can serve (`OCCL_MAXR` in the source).
pub const MAX_RANKS: usize = 8;
/// Channels one thread block of a collective can run (`OCCL_LANES_MAX` of the 256-thread lane).
pub const MAX_LANES: u32 = 4;
/// The most threads of a collective's thread block, whatever its lanes.
const BLOCK_THREADS: u32 = 1024;

/// Threads of one lane (`OCCL_LANE`) of the byte-moving program when a block runs `lanes`
/// channels: 512 for 1 or 2 lanes, 256 for 4, so that a block stays at most `BLOCK_THREADS`.
/// Each width is a program of its own, built with that constant: the strides of the copy loops
/// and the barrier's thread count stay immediates, and the 512-thread program is the one
/// without the define.
pub const fn lane_threads(lanes: u32) -> u32 {
    if lanes > BLOCK_THREADS / THREADS {
        BLOCK_THREADS / MAX_LANES
    } else {
        THREADS
    }
}

/// The threads of a reducing program's block (`OCCL_BLOCK`), whatever its lanes: at most half
/// of `BLOCK_THREADS`, so that a thread has 128 registers rather than 64, and a fold keeps a
/// whole turn of both its sources' loads in flight (on 4×H200 the ring's reduce-scatter moved
/// 1.03-1.06× more at NCCL's 24 CTAs, `bench/baselines/kernel-phases.md` run 6).
pub const REDUCE_BLOCK: u32 = 512;

/// Threads of one lane of a reducing program when a block runs `lanes` channels: 512, 256 or
/// 128 for 1, 2 or 4 lanes. The channels and the SMs they take are the byte mover's.
pub const fn reduce_lane_threads(lanes: u32) -> u32 {
    REDUCE_BLOCK / lanes
}
/// Bytes of one channel's control block per peer (`OCCL_CTRL`).
const CTRL_BYTES: u64 = 256;
/// The region starts with its error word (a timeout, or the host's abort).
pub const ERROR_WORD: usize = 0;

/// The shape of the shared region: `channels` blocks, each with a FIFO of `slots` buffers of
/// `slot_bytes` per peer. Every rank must use the same layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Layout {
    pub nranks: u32,
    pub channels: u32,
    pub slots: u32,
    pub slot_bytes: u64,
}

impl Layout {
    pub fn validate(&self) -> Result<()> {
        let bad = |w: String| Err(Error::InvalidArgument(w));
        if self.nranks == 0 || self.nranks as usize > MAX_RANKS {
            return bad(format!("{} ranks; device collectives serve 1 to {MAX_RANKS}", self.nranks));
        }
        if self.channels == 0 || self.channels > 1024 {
            return bad(format!("{} channels; 1 to 1024", self.channels));
        }
        if self.slots == 0 || self.slots > 64 {
            return bad(format!("{} slots per FIFO; 1 to 64", self.slots));
        }
        if self.slot_bytes < 4096 || !self.slot_bytes.is_multiple_of(4096) || self.slot_bytes > 1 << 30 {
            return bad(format!("{}-byte slots; a multiple of 4096 up to 1 GiB", self.slot_bytes));
        }
        Ok(())
    }

    pub fn ctrl_off(&self) -> u64 {
        CTRL_BYTES
    }

    pub fn data_off(&self) -> u64 {
        (CTRL_BYTES + u64::from(self.channels) * u64::from(self.nranks) * CTRL_BYTES).next_multiple_of(4096)
    }

    pub fn bytes(&self) -> u64 {
        self.data_off() + u64::from(self.channels) * u64::from(self.nranks) * u64::from(self.slots) * self.slot_bytes
    }

    /// The FIFO geometry, (slots, slot bytes), that a launch of `mode` posts its steps in when
    /// each channel moves `share` bytes to each peer. A reducing launch whose share spans at
    /// least two double slots takes its FIFO's slots (an even count, 4 or more) in pairs: half
    /// as many posts, which is what a GEMM beside it pays for (NVIDIA posts once per 1 MiB).
    /// A smaller share keeps single slots, whose longer pipeline it needs (paired, a 64 MiB
    /// all-reduce at 24 SMs moved 5-8% less); so does the byte mover. Measured in
    /// `bench/baselines/gpu-overlap.md` run 12. The region is the same either way; a channel's
    /// sender drains its FIFO when a call's geometry differs from its last one's (`drain_sends`
    /// in the source).
    pub fn steps(&self, mode: Mode, share: u64) -> (u32, u64) {
        // Pairs of an even count of at least 4, so that a sender still has a step in flight.
        let pair = mode.reduces() && self.slots >= 4 && self.slots.is_multiple_of(2) && share >= 4 * self.slot_bytes;
        if pair {
            (self.slots / 2, self.slot_bytes * 2)
        } else {
            (self.slots, self.slot_bytes)
        }
    }
}

/// What a launch does (`M_*` in the source).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum Mode {
    AllReduceOneShot = 0,
    AllReduceTwoShot = 1,
    AllReduceRing = 2,
    ReduceScatter = 3,
    Reduce = 4,
    AllGather = 5,
    Broadcast = 6,
    AllToAll = 7,
    Send = 8,
    Recv = 9,
    /// Broadcast passed along the ring from the root, for rank counts where the root's link
    /// would carry every peer's copy.
    BroadcastRing = 10,
    /// Reduce-scatter around the ring (the first half of the ring all-reduce), for rank counts
    /// where every rank writing every peer at once costs more than the ring's extra hops.
    ReduceScatterRing = 11,
    /// Reduce passed along the ring towards the root, for rank counts where the root's link
    /// would carry every peer's copy.
    ReduceRing = 12,
}

impl Mode {
    pub const ALL: [Mode; 13] = [
        Mode::AllReduceOneShot,
        Mode::AllReduceTwoShot,
        Mode::AllReduceRing,
        Mode::ReduceScatter,
        Mode::Reduce,
        Mode::AllGather,
        Mode::Broadcast,
        Mode::AllToAll,
        Mode::Send,
        Mode::Recv,
        Mode::BroadcastRing,
        Mode::ReduceScatterRing,
        Mode::ReduceRing,
    ];

    /// The mode of a `CollArgs::mode` code, if it is one.
    pub fn of_code(code: u32) -> Option<Mode> {
        Mode::ALL.get(usize::try_from(code).ok()?).copied()
    }

    /// Modes with an element type and operator (the others move bytes).
    pub const fn reduces(self) -> bool {
        matches!(
            self,
            Mode::AllReduceOneShot
                | Mode::AllReduceTwoShot
                | Mode::AllReduceRing
                | Mode::ReduceScatter
                | Mode::Reduce
                | Mode::ReduceScatterRing
                | Mode::ReduceRing
        )
    }
}

/// The kernel's argument block, field for field `CollArgs` in `cuda/coll.cu`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CollArgs {
    pub input: u64,
    pub output: u64,
    /// Elements (bytes for the byte-moving modes) per rank block, the unit the grid splits.
    pub count: u64,
    /// Elements (bytes) between rank blocks of the input/output, the shard size of all-reduce.
    pub stride: u64,
    /// All-reduce: the whole buffer's elements (the last shards are clipped to it).
    pub total: u64,
    /// Every rank's region as this process maps it (its own at `rank`).
    pub regions: [u64; MAX_RANKS],
    pub ctrl_off: u64,
    pub data_off: u64,
    pub slot_bytes: u64,
    pub timeout_ns: u64,
    pub mode: u32,
    pub rank: u32,
    pub nranks: u32,
    /// The root of broadcast and reduce; the peer of send and recv.
    pub root: u32,
    /// Divide the result by this (the average), 0 for none.
    pub div: u32,
    pub nslots: u32,
    /// A pre-multiply sum's scalar: 0 none, 1 its bits in `scalar`, 2 its device address there
    /// (set through [`CollArgs::premul`]).
    pub pre: u32,
    /// Channels of this launch; set by [`CollKernels::launch`].
    pub nch: u32,
    /// Device address of this launch's slot of a [`crate::timer::TimerRing`] (one record per
    /// block); 0: the kernel writes no timestamps.
    pub timers: u64,
    pub scalar: u64,
    /// Device address of a [`crate::phases::PhaseBuf`]: the launch runs the phase-profiled
    /// program and writes one record per channel there; 0: the plain program.
    pub phases: u64,
    /// The windowed mode of all-gather, all-to-all and direct broadcast (`win_modes` in the
    /// source): where this rank's share lands in each rank's output, its own part at `rank`;
    /// all 0: through the slots.
    pub win: [u64; MAX_RANKS],
}

/// The scalar of a pre-multiply sum (NCCL's `ncclRedOpCreatePreMulSum`): each rank's input is
/// multiplied by its own rank's scalar as the collective kernel reads it, then summed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PreMul {
    /// The value: the element's bytes as they lie in memory, at the start of the u64's (where
    /// the kernel reads them).
    Immediate(u64),
    /// The device address of one element, read by the kernel when it runs: a graph replay sees
    /// the value of that moment.
    Device(u64),
}

impl PreMul {
    /// An immediate scalar from the element's bytes as they lie in host memory (1 to 8).
    pub fn immediate(bytes: &[u8]) -> Result<PreMul> {
        if bytes.is_empty() || bytes.len() > 8 {
            return Err(Error::InvalidArgument(format!("a {}-byte scalar; elements have 1 to 8", bytes.len())));
        }
        let mut b = [0u8; 8];
        b[..bytes.len()].copy_from_slice(bytes);
        Ok(PreMul::Immediate(u64::from_ne_bytes(b)))
    }
}

impl CollArgs {
    /// Whether the launch writes the peers' outputs directly ([`CollArgs::win`]).
    pub fn windowed(&self) -> bool {
        usize::try_from(self.rank).ok().and_then(|r| self.win.get(r)).is_some_and(|&w| w != 0)
    }

    /// Makes the launch a pre-multiply sum with scalar `p` (the operator must be `Sum`).
    pub fn premul(&mut self, p: PreMul) {
        (self.pre, self.scalar) = match p {
            PreMul::Immediate(bits) => (1, bits),
            PreMul::Device(addr) => (2, addr),
        };
    }
}

/// Index of the pre-multiply sum in a program's functions, after one per operator.
const PREMUL_FUNC: usize = RedOp::ALL.len();
/// Index of the windowed mode's kernel in the byte-moving program.
const WIN_FUNC: usize = 3;

/// Which function of the program a launch of `args` runs: the operator's, the pre-multiply sum's,
/// or the byte mover's (index 0 of the byte-moving program, its windowed mode's at [`WIN_FUNC`]).
fn func_index(mode: Mode, args: &CollArgs, dt: DataType, op: RedOp) -> Result<usize> {
    if args.windowed() {
        if !matches!(mode, Mode::AllGather | Mode::AllToAll | Mode::Broadcast) || args.pre != 0 {
            return Err(Error::InvalidArgument(format!(
                "a windowed {mode:?} launch: only all-gather, all-to-all and direct broadcast write peers' outputs"
            )));
        }
        return Ok(WIN_FUNC);
    }
    if args.pre == 0 {
        return Ok(if mode.reduces() { op.index() } else { 0 });
    }
    if !mode.reduces() || op != RedOp::Sum {
        return Err(Error::InvalidArgument(format!(
            "a pre-multiply scalar on a {mode:?} launch with operator {op}: only reductions that sum take one"
        )));
    }
    if args.div != 0 {
        return Err(Error::InvalidArgument("a pre-multiply sum that also divides".into()));
    }
    match args.pre {
        1 => {}
        2 if args.scalar == 0 => {
            return Err(Error::InvalidArgument("the pre-multiply scalar is a null device address".into()))
        }
        2 if !args.scalar.is_multiple_of(dt.size() as u64) => {
            return Err(Error::InvalidArgument(format!(
                "the pre-multiply scalar at {:#x} is not aligned to its {}-byte {dt}",
                args.scalar,
                dt.size(),
                dt = dt.short_name()
            )))
        }
        2 => {}
        p => return Err(Error::InvalidArgument(format!("pre-multiply kind {p}: 1 (immediate) or 2 (device)"))),
    }
    Ok(PREMUL_FUNC)
}

// SAFETY: plain old data of u64/u32 fields laid out as the kernel's struct.
unsafe impl DeviceRepr for CollArgs {}

/// The launch of `channels` in lanes of `lane` threads, `lanes` of them to a block (fewer when
/// there are fewer channels): a block per `lanes` channels, whatever the lanes' width.
fn launch_shape(lanes: u32, channels: u32, lane: u32) -> LaunchConfig {
    let lanes = lanes.min(channels).max(1);
    LaunchConfig { grid_dim: (channels.div_ceil(lanes), 1, 1), block_dim: (lane * lanes, 1, 1), shared_mem_bytes: 0 }
}

/// The program for `dt` (`None`: the byte-moving one); with `phases`, the phase-profiled build
/// of it (`OCCL_PHASES`, a module of its own: the plain one carries no profiling instruction);
/// `lane` threads per lane ([`lane_threads`] for the byte mover, whose 512-thread program
/// defines nothing; [`reduce_lane_threads`] for an element type's, in blocks of
/// [`REDUCE_BLOCK`]).
pub fn source(dt: Option<DataType>, phases: bool, lane: u32) -> String {
    let mut s = String::new();
    if phases {
        s.push_str("#define OCCL_PHASES 1\n");
    }
    if dt.is_some() {
        s.push_str(&format!("#define OCCL_BLOCK {REDUCE_BLOCK}\n#define OCCL_REDUCING 1\n"));
    }
    if lane != THREADS {
        s.push_str(&format!("#define OCCL_LANE {lane}\n"));
    }
    for (name, text) in
        [("common.cuh", include_str!("../cuda/common.cuh")), ("coll.cu", include_str!("../cuda/coll.cu"))]
    {
        s.push_str(&format!("#line 1 \"{name}\"\n{text}\n"));
    }
    match dt {
        Some(dt) => s.push_str(&format!("OCCL_COLL_TYPE({}, {})\n", dt.short_name(), struct_name(dt))),
        None => s.push_str("OCCL_COLL_COPY\n"),
    }
    s
}

/// The file name NVRTC reports for the program of `dt`, `phases` and `lane` ([`source`]).
fn program_name(dt: Option<DataType>, phases: bool, lane: u32) -> String {
    format!(
        "occl-coll-{}{}{}.cu",
        dt.map_or("copy", |dt| dt.short_name()),
        if phases { "-phases" } else { "" },
        if lane != THREADS { format!("-lane{lane}") } else { String::new() }
    )
}

/// Every collective program a communicator may build, as (name, source): the byte mover and
/// each element type's, for each count of `lanes` (lanes per block, as `OCCL_CUDA_LANES`; each
/// gives a lane width of the byte mover, [`lane_threads`], and of the reducing programs,
/// [`reduce_lane_threads`]), and with `phases` their phase-profiled builds too
/// (`crate::prebuild`). The 512-thread byte mover is always there: every communicator builds it
/// (the grouped p2p kernel, the clock probe).
pub fn programs(lanes: &[u32], phases: bool) -> Vec<(String, String)> {
    let widths = |width: fn(u32) -> u32| {
        let mut w: Vec<u32> = lanes.iter().map(|&l| width(l)).collect();
        w.sort_unstable();
        w.dedup();
        w
    };
    let builds: &[bool] = if phases { &[false, true] } else { &[false] };
    let program = |dt: Option<DataType>, ph: bool, lane: u32| (program_name(dt, ph, lane), source(dt, ph, lane));
    let bytes = widths(lane_threads);
    let mut v: Vec<(String, String)> =
        bytes.iter().flat_map(|&lane| builds.iter().map(move |&ph| program(None, ph, lane))).collect();
    if !bytes.contains(&THREADS) {
        v.push(program(None, false, THREADS));
    }
    for lane in widths(reduce_lane_threads) {
        for dt in DataType::ALL {
            v.extend(builds.iter().map(|&ph| program(Some(dt), ph, lane)));
        }
    }
    v
}

/// The element struct of `dt` in `common.cuh`.
fn struct_name(dt: DataType) -> &'static str {
    match dt {
        DataType::I8 => "I8",
        DataType::U8 => "U8",
        DataType::I32 => "I32",
        DataType::U32 => "U32",
        DataType::I64 => "I64",
        DataType::U64 => "U64",
        DataType::F16 => "F16",
        DataType::Bf16 => "BF16",
        DataType::F32 => "F32",
        DataType::F64 => "F64",
        DataType::F8E4M3 => "F8E4M3",
        DataType::F8E5M2 => "F8E5M2",
    }
}

/// A program's element type (`None`: the byte-moving program), whether it is phase-profiled,
/// and its threads per lane.
type ProgramKey = (Option<DataType>, bool, u32);

pub(crate) struct Program {
    pub(crate) funcs: Vec<Func>,
    _module: Arc<CudaModule>,
}

/// The collective kernels of one device, built per element type at first use, for one count of
/// lanes per thread block.
pub struct CollKernels {
    pub(crate) ctx: Arc<CudaContext>,
    /// Channels per thread block of a collective launch: 1, 2 or [`MAX_LANES`].
    lanes: u32,
    /// How the launches that talk to peers run (`peer_launch.rs`).
    peer: PeerLaunch,
    cache: Option<Cache>,
    programs: Mutex<HashMap<ProgramKey, Arc<Program>>>,
}

impl std::fmt::Debug for CollKernels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CollKernels")
            .field("device", &self.ctx.ordinal())
            .field("lanes", &self.lanes)
            .field("peer", &self.peer)
            .finish()
    }
}

impl CollKernels {
    /// The kernels of `ctx`'s device, cached in [`cache::default_dir`], whose collective
    /// launches run `lanes` channels per thread block (1 or 2 lanes of 512 threads, or
    /// [`MAX_LANES`] of 256). Builds the byte-moving program now, so that a missing NVRTC or an
    /// unsupported device shows at once.
    pub fn load(ctx: &Arc<CudaContext>, lanes: u32) -> Result<CollKernels> {
        if ![1, 2, MAX_LANES].contains(&lanes) {
            return Err(Error::InvalidArgument(format!("{lanes} lanes per block; 1, 2 or {MAX_LANES}")));
        }
        let (major, _) = ctx.compute_capability().map_err(driver("cuDeviceGetAttribute(compute capability)"))?;
        let k = CollKernels {
            ctx: ctx.clone(),
            lanes,
            peer: PeerLaunch::for_device(major),
            cache: cache::default_dir().map(Cache::new),
            programs: Mutex::default(),
        };
        k.program(None, false, k.lane())?;
        Ok(k)
    }

    /// Channels per thread block of a collective launch.
    pub fn lanes(&self) -> u32 {
        self.lanes
    }

    /// Runs the launches that talk to peers (collectives, grouped sends and receives) in
    /// `domain` and clusters of `cluster` blocks (NCCL's defaults unless told otherwise), where
    /// the device has domains and clusters.
    pub fn launching(mut self, domain: SyncDomain, cluster: ClusterSize) -> CollKernels {
        self.peer = self.peer.with(domain, cluster);
        self
    }

    /// Launches `f` with its argument struct as this table launches kernels that talk to peers
    /// (`peer_launch.rs`).
    ///
    /// # Safety
    /// As [`crate::peer_launch::launch`].
    pub(crate) unsafe fn launch_peers<T: DeviceRepr>(
        &self,
        stream: &CudaStream,
        f: &CudaFunction,
        arg: &T,
        cfg: LaunchConfig,
        call: &'static str,
    ) -> Result<()> {
        // SAFETY: the caller's promise.
        unsafe { crate::peer_launch::launch(stream, f, arg, cfg, self.peer, call) }
    }

    /// Threads of one lane of this table's byte-moving launches.
    pub(crate) fn lane(&self) -> u32 {
        lane_threads(self.lanes)
    }

    /// Threads of one lane of `dt`'s program under this table's lanes: the byte mover's
    /// ([`CollKernels::lane`]) for `None`, a reducing program's for an element type.
    fn lane_of(&self, dt: Option<DataType>) -> u32 {
        match dt {
            Some(_) => reduce_lane_threads(self.lanes),
            None => self.lane(),
        }
    }

    /// The launch shape of `channels` in this table's lanes of `lane` threads ([`launch_shape`]).
    fn shape(&self, channels: u32, lane: u32) -> LaunchConfig {
        launch_shape(self.lanes, channels, lane)
    }

    /// The launch shape of `channels` of the byte mover (collectives that only move bytes and
    /// grouped sends and receives).
    pub(crate) fn grid(&self, channels: u32) -> LaunchConfig {
        self.shape(channels, self.lane())
    }

    /// Builds (or reads) the program of `dt` now rather than at its first launch: a launch that
    /// a CUDA graph captures should not be the first.
    pub fn prepare(&self, dt: DataType) -> Result<()> {
        self.program(Some(dt), false, self.lane_of(Some(dt))).map(|_| ())
    }

    /// Builds (or reads) the phase-profiled programs: the byte mover's and, with `dt`, that
    /// type's.
    pub fn prepare_phases(&self, dt: Option<DataType>) -> Result<()> {
        self.program(None, true, self.lane())?;
        dt.map_or(Ok(()), |dt| self.program(Some(dt), true, self.lane_of(Some(dt))).map(|_| ()))
    }

    /// Builds every element type's program the device supports and loads each kernel onto
    /// it now. Ranks that share one context (thread ranks on one GPU) need this: a kernel loaded
    /// at its first launch may wait for the context's running kernels (CUDA's lazy loading),
    /// and those spin until that very launch runs: a deadlock.
    pub fn load_all(&self) -> Result<()> {
        // The grouped p2p kernel and the clock probe come from the 512-thread byte mover.
        let mut progs = vec![self.program(None, false, THREADS)?];
        if self.lane() != THREADS {
            progs.push(self.program(None, false, self.lane())?);
        }
        for dt in DataType::ALL {
            match self.program(Some(dt), false, self.lane_of(Some(dt))) {
                Ok(p) => progs.push(p),
                Err(Error::Unsupported { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        self.ctx.bind_to_thread().map_err(driver("cuCtxSetCurrent"))?;
        for f in progs.iter().flat_map(|p| p.funcs.iter()) {
            // SAFETY: a live function of a module this table keeps loaded.
            check("cuFuncLoad", unsafe { cudarc::driver::sys::cuFuncLoad(f.f.cu_function()) })?;
        }
        Ok(())
    }

    /// The program of `dt` (`None`: the byte mover), profiled or not, with `lane` threads per
    /// lane ([`CollKernels::lane_of`]; the clock probe takes the 512-thread byte mover whatever
    /// the lanes).
    pub(crate) fn program(&self, dt: Option<DataType>, phases: bool, lane: u32) -> Result<Arc<Program>> {
        let mut g = self.programs.lock().map_err(|_| poisoned())?;
        if let Some(p) = g.get(&(dt, phases, lane)) {
            return Ok(p.clone());
        }
        let name = program_name(dt, phases, lane);
        let (module, report) = build_module(&self.ctx, self.cache.as_ref(), &name, &source(dt, phases, lane))?;
        if let Some(dt) = dt {
            if dt.is_fp8() && !report.device.has_fp8() {
                return Err(Error::Unsupported {
                    what: format!("{} collectives", dt.short_name()),
                    needs: "sm_89 or later",
                    arch: report.arch,
                });
            }
        }
        let names: Vec<String> = match dt {
            Some(dt) => RedOp::ALL
                .iter()
                .map(|op| op.name())
                .chain(["premulsum"])
                .map(|op| format!("occl_coll_{}_{op}", dt.short_name()))
                .collect(),
            None => {
                ["occl_coll_copy", "occl_clock_probe", "occl_p2p_group", "occl_coll_win"].map(String::from).to_vec()
            }
        };
        let funcs = names.iter().map(|n| function(&module, &report.device, n)).collect::<Result<Vec<_>>>()?;
        let p = Arc::new(Program { funcs, _module: module });
        g.insert((dt, phases, lane), p.clone());
        Ok(p)
    }

    /// A clock probe of this device ([`crate::timer::Probe`]) and its first measurement of the
    /// device clock (`%globaltimer`) against `host_clock`.
    pub fn clock_probe(&self, host_clock: &dyn Fn() -> u64) -> Result<(crate::timer::Probe, crate::timer::ClockMap)> {
        let prog = self.program(None, false, THREADS)?;
        let f = prog.funcs.get(1).ok_or_else(|| Error::InvalidArgument("no clock probe kernel".into()))?;
        let mut probe = crate::timer::Probe::new(&self.ctx, f.f.clone())?;
        let map = crate::timer::calibrate(&mut probe, host_clock)?;
        Ok((probe, map))
    }

    /// Enqueues one collective kernel of `channels` channels on `stream`, [`CollKernels::lanes`]
    /// of them per thread block: each lane keeps a channel in flight on the block's SM
    /// (`cuda/coll.cu`), so the launch takes `⌈channels / lanes⌉` SMs.
    ///
    /// # Safety
    /// `args` names live device memory: input and output valid for what `mode` reads and writes,
    /// and regions laid out as `args` says and mapped in this context; every rank launches the
    /// matching call with the same channels, in the same order on its channels.
    pub unsafe fn launch(
        &self,
        stream: &CudaStream,
        args: &CollArgs,
        dt: DataType,
        op: RedOp,
        channels: u32,
    ) -> Result<()> {
        if stream.context() != &self.ctx {
            return Err(Error::InvalidArgument("the stream belongs to another device context".into()));
        }
        if channels == 0 {
            return Err(Error::InvalidArgument("a collective launch of 0 channels".into()));
        }
        let mode =
            Mode::of_code(args.mode).ok_or_else(|| Error::InvalidArgument(format!("collective mode {}", args.mode)))?;
        let i = func_index(mode, args, dt, op)?;
        let program = mode.reduces().then_some(dt);
        let lane = self.lane_of(program);
        let prog = self.program(program, args.phases != 0, lane)?;
        let f = prog.funcs.get(i).ok_or_else(|| Error::InvalidArgument(format!("no collective kernel {i}")))?;
        let args = CollArgs { nch: channels, ..*args };
        let cfg = self.shape(channels, lane);
        // SAFETY: one argument, the struct the kernel takes by value; the caller vouches for it.
        unsafe { self.launch_peers(stream, &f.f, &args, cfg, "cuLaunchKernel(occl_coll)") }
    }
}

fn poisoned() -> Error {
    Error::InvalidArgument("the collective kernel table's lock was poisoned by a panic".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_argument_block_has_the_kernels_layout() {
        // 5 addresses/counts, 8 regions, 4 u64, 8 u32, the timers, the scalar, the phase
        // records and 8 window addresses: no padding.
        assert_eq!(std::mem::size_of::<CollArgs>(), 5 * 8 + 8 * 8 + 4 * 8 + 8 * 4 + 8 + 8 + 8 + 8 * 8);
        assert_eq!(std::mem::align_of::<CollArgs>(), 8);
        use std::mem::offset_of;
        assert_eq!(offset_of!(CollArgs, regions), 5 * 8);
        assert_eq!(offset_of!(CollArgs, timers), 5 * 8 + 8 * 8 + 4 * 8 + 8 * 4);
        assert_eq!(offset_of!(CollArgs, phases), offset_of!(CollArgs, timers) + 16);
        assert_eq!(offset_of!(CollArgs, win), offset_of!(CollArgs, phases) + 8, "win follows phases, as in coll.cu");
    }

    #[test]
    fn only_byte_moving_collectives_take_the_windowed_mode() {
        let mut a = CollArgs { rank: 2, nranks: 3, ..CollArgs::default() };
        assert!(!a.windowed());
        a.win[0] = 0x1000;
        assert!(!a.windowed(), "the rank's own part decides");
        a.win[2] = 0x3000;
        assert!(a.windowed());
        for mode in [Mode::AllGather, Mode::AllToAll, Mode::Broadcast] {
            assert_eq!(func_index(mode, &a, DataType::U8, RedOp::Sum).unwrap(), WIN_FUNC, "{mode:?}");
            assert_eq!(func_index(mode, &CollArgs { win: [0; MAX_RANKS], ..a }, DataType::U8, RedOp::Sum).unwrap(), 0);
        }
        for mode in Mode::ALL.into_iter().filter(|m| !matches!(m, Mode::AllGather | Mode::AllToAll | Mode::Broadcast)) {
            let e = func_index(mode, &a, DataType::F32, RedOp::Sum).unwrap_err();
            assert!(e.to_string().contains("windowed"), "{mode:?}: {e}");
        }
        assert!(!CollArgs { rank: 9, ..a }.windowed(), "a rank past the table");
    }

    #[test]
    fn large_reducing_shares_pair_their_slots() {
        let l = Layout { nranks: 2, channels: 128, slots: 4, slot_bytes: 256 << 10 };
        // Each channel's share to each peer: two double slots and more pair, less does not.
        assert_eq!(l.steps(Mode::AllReduceTwoShot, 1 << 20), (2, 512 << 10));
        assert_eq!(l.steps(Mode::ReduceScatterRing, 64 << 20), (2, 512 << 10));
        assert_eq!(l.steps(Mode::AllReduceTwoShot, (1 << 20) - 16), (4, 256 << 10));
        // The byte mover and odd slot counts keep the region's geometry.
        assert_eq!(l.steps(Mode::AllGather, 64 << 20), (4, 256 << 10));
        assert_eq!(Layout { slots: 3, ..l }.steps(Mode::AllReduceRing, 64 << 20), (3, 256 << 10));
        assert_eq!(Layout { slots: 2, ..l }.steps(Mode::AllReduceRing, 64 << 20), (2, 256 << 10), "depth 1");
        assert_eq!(Layout { slots: 8, ..l }.steps(Mode::AllReduceRing, 64 << 20), (4, 512 << 10));
        // Paired or not, a FIFO spans the same bytes: the region does not change.
        for share in [0, 1 << 20, 1 << 30] {
            for mode in Mode::ALL {
                let (n, b) = l.steps(mode, share);
                assert_eq!(u64::from(n) * b, u64::from(l.slots) * l.slot_bytes, "{mode:?} {share}");
            }
        }
    }

    #[test]
    fn layouts_are_validated_and_aligned() {
        let l = Layout { nranks: 2, channels: 32, slots: 4, slot_bytes: 256 << 10 };
        assert!(l.validate().is_ok());
        assert_eq!(l.data_off() % 4096, 0);
        assert!(l.data_off() >= l.ctrl_off() + 32 * 2 * 256);
        assert_eq!(l.bytes(), l.data_off() + 32 * 2 * 4 * (256 << 10));
        assert!(Layout { nranks: 9, ..l }.validate().is_err());
        assert!(Layout { slot_bytes: 1000, ..l }.validate().is_err());
        assert!(Layout { slots: 0, ..l }.validate().is_err());
    }

    #[test]
    fn an_immediate_scalar_keeps_its_bytes_at_the_start() {
        let PreMul::Immediate(bits) = PreMul::immediate(&0.5f32.to_ne_bytes()).unwrap() else { panic!() };
        assert_eq!(bits.to_ne_bytes()[..4], 0.5f32.to_ne_bytes());
        assert_eq!(bits.to_ne_bytes()[4..], [0; 4]);
        assert_eq!(
            PreMul::immediate(&[0xff]).unwrap(),
            PreMul::Immediate(u64::from_ne_bytes([0xff, 0, 0, 0, 0, 0, 0, 0]))
        );
        assert!(PreMul::immediate(&[]).is_err() && PreMul::immediate(&[0; 9]).is_err());
        let mut a = CollArgs::default();
        a.premul(PreMul::Device(0x1000));
        assert_eq!((a.pre, a.scalar), (2, 0x1000));
        a.premul(PreMul::Immediate(7));
        assert_eq!((a.pre, a.scalar), (1, 7));
    }

    #[test]
    fn a_premultiplied_launch_runs_the_premulsum_kernel_of_a_summing_reduction() {
        let plain = CollArgs::default();
        assert_eq!(func_index(Mode::AllReduceRing, &plain, DataType::F32, RedOp::Max).unwrap(), RedOp::Max.index());
        assert_eq!(func_index(Mode::AllGather, &plain, DataType::U8, RedOp::Sum).unwrap(), 0);
        let mut pre = CollArgs::default();
        pre.premul(PreMul::Immediate(1));
        for mode in Mode::ALL.into_iter().filter(|m| m.reduces()) {
            assert_eq!(func_index(mode, &pre, DataType::Bf16, RedOp::Sum).unwrap(), PREMUL_FUNC, "{mode:?}");
            assert!(func_index(mode, &pre, DataType::Bf16, RedOp::Prod).is_err(), "{mode:?}");
        }
        let e = func_index(Mode::Broadcast, &pre, DataType::U8, RedOp::Sum).unwrap_err();
        assert!(e.to_string().contains("only reductions that sum"), "{e}");
        assert!(func_index(Mode::Reduce, &CollArgs { div: 2, ..pre }, DataType::F32, RedOp::Sum).is_err());
        pre.premul(PreMul::Device(0x1002));
        let e = func_index(Mode::Reduce, &pre, DataType::F32, RedOp::Sum).unwrap_err();
        assert!(e.to_string().contains("0x1002 is not aligned to its 4-byte f32"), "{e}");
        assert_eq!(func_index(Mode::Reduce, &pre, DataType::F16, RedOp::Sum).unwrap(), PREMUL_FUNC);
        pre.premul(PreMul::Device(0));
        assert!(func_index(Mode::Reduce, &pre, DataType::F16, RedOp::Sum).unwrap_err().to_string().contains("null"));
        assert!(func_index(Mode::Reduce, &CollArgs { pre: 3, ..pre }, DataType::F16, RedOp::Sum).is_err());
    }

    #[test]
    fn lanes_are_programs_whose_blocks_hold_1024_threads_or_512_for_reductions() {
        assert_eq!([1, 2, 4].map(lane_threads), [512, 512, 256]);
        assert_eq!([1, 2, 4].map(reduce_lane_threads), [512, 256, 128]);
        for lanes in [1, 2, 4] {
            assert!(lane_threads(lanes) * lanes <= BLOCK_THREADS, "{lanes}");
            assert_eq!(reduce_lane_threads(lanes) * lanes, REDUCE_BLOCK, "{lanes}");
        }
        // The 512-thread byte mover is the source without the define (the same build and cache
        // key as a program that never heard of lanes); the 256-thread one defines it after the
        // phase switch, so the profiled build still only adds its first line.
        let (plain, four) = (source(None, false, 512), source(None, false, 256));
        assert!(plain.starts_with("#line 1 \"common.cuh\""), "no define before the sources");
        assert_eq!(four.strip_prefix("#define OCCL_LANE 256\n"), Some(plain.as_str()));
        assert_eq!(source(None, true, 256).strip_prefix("#define OCCL_PHASES 1\n"), Some(four.as_str()));
        // A reducing program names its block and that it reduces (the step protocol follows),
        // then its lane, after the phase switch.
        let dt = Some(DataType::F32);
        let (one, two) = (source(dt, false, 512), source(dt, false, 256));
        let head = "#define OCCL_BLOCK 512\n#define OCCL_REDUCING 1\n";
        assert!(one.starts_with(&format!("{head}#line 1")), "one lane of 512: the block alone");
        assert!(two.starts_with(&format!("{head}#define OCCL_LANE 256\n#line 1")));
        assert_eq!(source(dt, true, 256).strip_prefix("#define OCCL_PHASES 1\n"), Some(two.as_str()));
    }

    #[test]
    fn a_reducing_launch_takes_as_many_blocks_as_the_byte_mover_of_512_threads() {
        for lanes in [1, 2, MAX_LANES] {
            for channels in [1, 3, 24, 48, 96, 128] {
                let bytes = launch_shape(lanes, channels, lane_threads(lanes));
                let reduce = launch_shape(lanes, channels, reduce_lane_threads(lanes));
                assert_eq!(bytes.grid_dim, reduce.grid_dim, "the same SMs, {lanes} lanes, {channels} channels");
                assert!(bytes.grid_dim.0 * lanes >= channels, "every channel has a lane");
                assert!(bytes.block_dim.0 <= BLOCK_THREADS && reduce.block_dim.0 <= REDUCE_BLOCK);
                if channels >= lanes {
                    assert_eq!(reduce.block_dim.0, REDUCE_BLOCK, "{lanes} lanes, {channels} channels");
                    assert_eq!(bytes.block_dim.0, lane_threads(lanes) * lanes);
                }
            }
        }
        // Fewer channels than lanes: one block of just those lanes.
        assert_eq!(launch_shape(4, 3, 128).block_dim.0, 384);
        assert_eq!(launch_shape(4, 3, 128).grid_dim.0, 1);
    }

    #[test]
    fn every_type_has_a_program_and_modes_split_by_reduction() {
        for dt in DataType::ALL {
            assert!(source(Some(dt), false, THREADS).ends_with(&format!(
                "OCCL_COLL_TYPE({}, {})\n",
                dt.short_name(),
                struct_name(dt)
            )));
        }
        assert!(source(None, false, THREADS).ends_with("OCCL_COLL_COPY\n"));
        // The profiled build is the same program with OCCL_PHASES defined first.
        for dt in [None, Some(DataType::Bf16)] {
            let (plain, profiled) = (source(dt, false, THREADS), source(dt, true, THREADS));
            assert!(!plain.contains("#define OCCL_PHASES"));
            assert_eq!(profiled.strip_prefix("#define OCCL_PHASES 1\n"), Some(plain.as_str()));
        }
        assert!(Mode::AllReduceRing.reduces() && Mode::Reduce.reduces() && Mode::ReduceScatterRing.reduces());
        assert!(Mode::ReduceRing.reduces() && Mode::of_code(12) == Some(Mode::ReduceRing));
        assert!(!Mode::AllGather.reduces() && !Mode::Recv.reduces() && !Mode::BroadcastRing.reduces());
        for (i, m) in Mode::ALL.into_iter().enumerate() {
            assert_eq!(m as usize, i, "ALL is in code order");
            assert_eq!(Mode::of_code(m as u32), Some(m));
        }
        assert_eq!(Mode::of_code(Mode::ALL.len() as u32), None);
    }
}
