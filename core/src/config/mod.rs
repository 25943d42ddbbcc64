//! One `Config`, read from the environment once at init and passed down; no other module reads
//! environment variables (unlike NCCL's function-static `NCCL_PARAM`s).

pub(crate) mod policy;

use crate::error::{Error, Result};
use std::time::Duration;

/// Which transport carries data between two ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransportKind {
    /// Shared-memory FIFOs between ranks of one host.
    Shm,
    /// TCP sockets, moved by the proxy thread.
    Tcp,
    /// RDMA through ibverbs RC queue pairs (feature `ib`), for peers on other hosts.
    Ib,
}

impl TransportKind {
    pub fn name(self) -> &'static str {
        match self {
            TransportKind::Shm => "shm",
            TransportKind::Tcp => "tcp",
            TransportKind::Ib => "ib",
        }
    }
}

/// Which profilers a communicator reports its events to.
#[derive(Clone, Default)]
pub enum Profilers {
    /// The process's (the default): those registered with
    /// `occl_events::profiler::register`, the NCCL profiler plugin `OCCL_PROFILER_PLUGIN` /
    /// `NCCL_PROFILER_PLUGIN` names, and the exporters the environment enables
    /// (`occl_telemetry::exporters::process_profilers`).
    #[default]
    Process,
    /// Exactly these, handed in by whoever creates the communicator (none: no events at all).
    Given(Vec<std::sync::Arc<dyn occl_events::Profiler>>),
}

impl std::fmt::Debug for Profilers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Profilers::Process => f.write_str("Process"),
            Profilers::Given(v) => f.debug_list().entries(v.iter().map(|p| p.name())).finish(),
        }
    }
}

/// Communicator settings. `Config::default()` is what a job gets with no variables set;
/// `Config::from_env()` applies `OCCL_*` (and, where NCCL has the same knob, `NCCL_*`).
#[derive(Debug, Clone)]
pub struct Config {
    /// Bound on every wait (`OCCL_TIMEOUT`, seconds). A wait that exceeds it fails with
    /// `Timeout` instead of hanging.
    pub timeout: Duration,
    /// Forces one transport for every peer (`OCCL_TRANSPORT=shm|tcp|ib`); `None` picks by host
    /// (and by RDMA devices, with feature `ib`).
    pub transport: Option<TransportKind>,
    /// TCP sockets per peer (`OCCL_NSOCKS`, also `NCCL_NSOCKS_PERTHREAD`×`NCCL_SOCKET_NTHREADS`).
    pub nsocks: usize,
    /// Bytes per FIFO slot for shared memory (`OCCL_SHM_SLOT_SIZE`).
    pub shm_slot_size: usize,
    /// Bytes per FIFO slot for TCP (`OCCL_TCP_SLOT_SIZE`).
    pub tcp_slot_size: usize,
    /// Slots per FIFO (`OCCL_FIFO_SLOTS`), like NCCL_STEPS.
    pub fifo_slots: usize,
    /// The address this rank's listeners (transport, bootstrap, RAS mesh) bind and advertise
    /// (`OCCL_SOCKET_ADDR`). `None`: chosen at init (`netif`): loopback when the bootstrap root
    /// is on loopback, else an interface `socket_ifname` allows or, without it, the one whose
    /// route reaches the root. A communicator's own `Config` holds the address it chose.
    pub listen_addr: Option<std::net::IpAddr>,
    /// The interfaces the listeners may use when `listen_addr` is unset (`OCCL_SOCKET_IFNAME`,
    /// also `NCCL_SOCKET_IFNAME`), in NCCL's syntax: `eth,ib` (name prefixes), `^docker,lo`
    /// (all but), `=eth0` (exact names), `^=docker0`. Checked at parse time.
    pub socket_ifname: Option<String>,
    /// Single-copy transfers between processes of a host (`OCCL_SHM_DIRECT=0` turns them off):
    /// large messages are read straight from the sender's buffer with `process_vm_readv`
    /// instead of passing through the shared-memory FIFO.
    pub shm_direct: bool,
    /// Connect shared-memory peers on first use (`OCCL_RUNTIME_CONNECT`, also
    /// `NCCL_RUNTIME_CONNECT`; default 1) rather than all of them at init (0), so init does
    /// not grow with nranks² when each rank talks to a few peers.
    pub runtime_connect: bool,
    /// Host identity override (`OCCL_HOSTID`): ranks with the same id share memory. Tests use it
    /// to put the ranks of one machine on "different hosts".
    pub host_id: Option<String>,
    /// The flight recorder: operations kept per communicator (`OCCL_FLIGHT_RECORDER_SIZE`,
    /// default 2048, 0 turns it off) and where dumps go (`OCCL_FLIGHT_RECORDER_DIR`: on a
    /// timeout, an error and SIGUSR1; unset: nowhere, the record is still kept for RAS).
    pub flight: occl_telemetry::FlightConfig,
    /// The algorithms the tuner may choose (`OCCL_ALGO`, also `NCCL_ALGO`), in NCCL's syntax:
    /// `ring,tree`, `^tree`, `ring;allreduce:tree` (see `coll::tune::policy`). `None`: all.
    pub algo: Option<String>,
    /// The protocols it may choose (`OCCL_PROTO`, also `NCCL_PROTO`): `simple`, `ll`, `ll128`
    /// in the same syntax. `None`: all.
    pub proto: Option<String>,
    /// Constants of the tuner's cost model (`OCCL_TUNER_FILE`; format in `coll::tune::file`).
    /// `None`: the built-in defaults.
    pub tuner_file: Option<std::path::PathBuf>,
    /// Where the first rank of each host writes the topology at init (`OCCL_TOPO_DUMP_FILE`,
    /// also `NCCL_TOPO_DUMP_FILE`): XML when the name ends in `.xml`, JSON otherwise.
    pub topo_dump_file: Option<std::path::PathBuf>,
    /// How far apart NICs may be and still fuse into one virtual NIC (`OCCL_NET_MERGE_LEVEL`,
    /// also `NCCL_NET_MERGE_LEVEL`): LOC, PORT (default, as NCCL), PIX, PXB, PHB or SYS.
    pub net_merge_level: crate::topo::PathType,
    /// NIC groups fused whatever their distance (`OCCL_NET_FORCE_MERGE`, also
    /// `NCCL_NET_FORCE_MERGE`): `mlx5_0,mlx5_1;mlx5_2,mlx5_3`.
    pub net_force_merge: Option<crate::topo::ForceMerge>,
    /// The RDMA device ports the ib transport may use (`OCCL_IB_HCA`, also `NCCL_IB_HCA`), in
    /// NCCL's syntax: `mlx5_0:1,mlx5_1`, `=mlx5_0` (exact names), `^mlx5_2` (all but).
    /// `None`: every active port. Checked at parse time with feature `ib`, unused without it.
    pub ib_hca: Option<String>,
    /// The GID table entry to route by on RoCE ports (`OCCL_IB_GID_INDEX`, also
    /// `NCCL_IB_GID_INDEX`; -1 or unset: a RoCE v2 IPv4 entry if there is one).
    pub ib_gid_index: Option<u8>,
    /// Helper threads per rank for large registered all-reduces, all-gathers and
    /// reduce-scatters (`OCCL_REG_THREADS`, 0 to 16). `None`: the rank's share of the host's
    /// cores less one, at most 7 (see `register::threads`).
    pub reg_threads: Option<usize>,
    /// Where the communicator's profiler events go: the process's profilers, or those handed
    /// in. Local to each rank (not compared between ranks).
    pub profilers: Profilers,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            timeout: Duration::from_secs(600),
            transport: None,
            nsocks: 2,
            shm_slot_size: 256 << 10,
            tcp_slot_size: 128 << 10,
            fifo_slots: 8,
            listen_addr: None,
            socket_ifname: None,
            host_id: None,
            flight: occl_telemetry::FlightConfig::default(),
            shm_direct: true,
            runtime_connect: true,
            algo: None,
            proto: None,
            tuner_file: None,
            topo_dump_file: None,
            net_merge_level: crate::topo::PathType::Port,
            net_force_merge: None,
            ib_hca: None,
            ib_gid_index: None,
            reg_threads: None,
            profilers: Profilers::Process,
        }
    }
}

/// The longest `OCCL_TIMEOUT`: a year is "never" for a job, and every deadline `now + timeout`
/// stays far inside what `Instant` can hold (1e30 s would overflow it).
pub const MAX_TIMEOUT: Duration = Duration::from_secs(365 * 24 * 3600);
const TIMEOUT_RANGE: &str = "a number of seconds greater than 0 and at most 31536000 (a year)";
/// Sockets per tcp peer (`OCCL_NSOCKS`).
const NSOCKS: std::ops::RangeInclusive<usize> = 1..=64;
/// Slots per FIFO (`OCCL_FIFO_SLOTS`).
const FIFO_SLOTS: std::ops::RangeInclusive<usize> = 2..=64;
const SLOT_SIZE_RANGE: &str = "a multiple of 64 between 4096 and 64 MiB";
const MAX_SLOT_SIZE: usize = 64 << 20;
/// Slots per FIFO that a `Config` built in code may ask for (tests use few and small ones).
const MAX_FIFO_SLOTS_IN_CODE: usize = 4096;
/// The most ranks a communicator may have: every rank's bootstrap root and peer table hold an
/// entry per rank, so a mistyped `OCCL_NRANKS` (1e18) must fail at once, not as an allocation
/// of its size.
pub const MAX_NRANKS: usize = 1 << 20;

/// The most helper threads a rank's registered collectives may use (`OCCL_REG_THREADS`).
pub(crate) const MAX_REG_THREADS: usize = 16;

/// `secs` as a timeout, if it is in range: positive, finite, at most [`MAX_TIMEOUT`].
fn timeout_from_secs(secs: f64) -> Option<Duration> {
    Duration::try_from_secs_f64(secs).ok().filter(|d| !d.is_zero() && *d <= MAX_TIMEOUT)
}

fn slot_size_ok(b: usize) -> bool {
    (4096..=MAX_SLOT_SIZE).contains(&b) && b.is_multiple_of(64)
}

fn parse<T: std::str::FromStr>(name: &str, v: &str, what: &str) -> Result<T> {
    v.trim().parse().map_err(|_| Error::arg(format!("{name}={v:?} is not {what}")))
}

impl Config {
    /// The settings that must be alike on every rank, by the variable that sets them, as text:
    /// the ends of a connection build it from their own (how it is carried, how many sockets,
    /// the FIFO's slots and their size, when it is made), so ranks that differ wait for
    /// connections that never come. Exchanged at init before anything connects
    /// (`check_alike`). An unset transport is the empty string.
    pub(crate) fn shared(&self) -> Vec<(String, String)> {
        let flag = |b: bool| if b { "1" } else { "0" };
        [
            ("OCCL_TRANSPORT", self.transport.map_or(String::new(), |t| t.name().to_string())),
            ("OCCL_NSOCKS", self.nsocks.to_string()),
            ("OCCL_FIFO_SLOTS", self.fifo_slots.to_string()),
            ("OCCL_SHM_SLOT_SIZE", self.shm_slot_size.to_string()),
            ("OCCL_TCP_SLOT_SIZE", self.tcp_slot_size.to_string()),
            ("OCCL_RUNTIME_CONNECT", flag(self.runtime_connect).to_string()),
        ]
        .into_iter()
        .map(|(n, v)| (n.to_string(), v))
        .collect()
    }

    /// The defaults with the environment applied. A malformed value is an `InvalidArgument`
    /// that names the variable.
    pub fn from_env() -> Result<Config> {
        Config::from_lookup(|k| std::env::var_os(k))
    }

    /// As [`Config::from_env`], with variables from `get` (tests).
    pub fn from_lookup(get: impl Fn(&str) -> Option<std::ffi::OsString>) -> Result<Config> {
        // The first of `names` that is set, UTF-8 and not empty.
        let var = |names: &[&str]| -> Option<(String, String)> {
            names.iter().find_map(|n| {
                let v = get(n)?.into_string().ok().filter(|v| !v.is_empty())?;
                Some((n.to_string(), v))
            })
        };
        let mut c = Config::default();
        if let Some((n, v)) = var(&["OCCL_TIMEOUT"]) {
            let secs: f64 = parse(&n, &v, "a number of seconds")?;
            c.timeout =
                timeout_from_secs(secs).ok_or_else(|| Error::arg(format!("{n}={v:?}: expected {TIMEOUT_RANGE}")))?;
        }
        if let Some((n, v)) = var(&["OCCL_TRANSPORT"]) {
            c.transport = Some(match v.trim().to_ascii_lowercase().as_str() {
                "shm" => TransportKind::Shm,
                "tcp" | "socket" | "net" => TransportKind::Tcp,
                "ib" | "rdma" => TransportKind::Ib,
                _ => return Err(Error::arg(format!("{n}={v:?}: supported transports are shm, tcp and ib"))),
            });
        }
        if let Some((n, v)) = var(&["OCCL_NSOCKS", "NCCL_NSOCKS_PERTHREAD"]) {
            c.nsocks = parse(&n, &v, "a socket count")?;
            if !NSOCKS.contains(&c.nsocks) {
                return Err(Error::arg(format!("{n}={v:?} must be between 1 and {}", NSOCKS.end())));
            }
        }
        for (names, field) in
            [(&["OCCL_SHM_SLOT_SIZE"][..], &mut c.shm_slot_size), (&["OCCL_TCP_SLOT_SIZE"][..], &mut c.tcp_slot_size)]
        {
            if let Some((n, v)) = var(names) {
                let b: usize = parse(&n, &v, "a byte count")?;
                if !slot_size_ok(b) {
                    return Err(Error::arg(format!("{n}={v:?} must be {SLOT_SIZE_RANGE}")));
                }
                *field = b;
            }
        }
        if let Some((n, v)) = var(&["OCCL_FIFO_SLOTS"]) {
            c.fifo_slots = parse(&n, &v, "a slot count")?;
            if !FIFO_SLOTS.contains(&c.fifo_slots) {
                return Err(Error::arg(format!(
                    "{n}={v:?} must be between {} and {}",
                    FIFO_SLOTS.start(),
                    FIFO_SLOTS.end()
                )));
            }
        }
        if let Some((n, v)) = var(&["OCCL_REG_THREADS"]) {
            let t: usize = parse(&n, &v, "a thread count")?;
            if t > MAX_REG_THREADS {
                return Err(Error::arg(format!("{n}={v:?} must be between 0 and {}", MAX_REG_THREADS)));
            }
            c.reg_threads = Some(t);
        }
        if let Some((n, v)) = var(&["OCCL_SOCKET_ADDR"]) {
            c.listen_addr = Some(parse(&n, &v, "an IP address")?);
        }
        if let Some((n, v)) = var(&crate::netif::IFNAME_VARS) {
            crate::netif::IfFilter::parse(&n, &v)?;
            c.socket_ifname = Some(v);
        }
        for (names, field) in [
            (&["OCCL_SHM_DIRECT"][..], &mut c.shm_direct),
            (&["OCCL_RUNTIME_CONNECT", "NCCL_RUNTIME_CONNECT"][..], &mut c.runtime_connect),
        ] {
            if let Some((n, v)) = var(names) {
                *field = match v.trim() {
                    "1" | "true" | "on" => true,
                    "0" | "false" | "off" => false,
                    _ => return Err(Error::arg(format!("{n}={v:?} must be 0 or 1"))),
                };
            }
        }
        if let Some((_, v)) = var(&["OCCL_HOSTID"]) {
            c.host_id = Some(v);
        }
        // Checked here so that a mistake names the variable the user set.
        use policy::{List, ALGOS, PROTOS};
        if let Some((n, v)) = var(&["OCCL_ALGO", "NCCL_ALGO"]) {
            List::parse(&n, &v, &ALGOS)?;
            c.algo = Some(v);
        }
        if let Some((n, v)) = var(&["OCCL_PROTO", "NCCL_PROTO"]) {
            List::parse(&n, &v, &PROTOS)?;
            c.proto = Some(v);
        }
        if let Some((_, v)) = var(&["OCCL_TUNER_FILE"]) {
            c.tuner_file = Some(v.into());
        }
        if let Some((_, v)) = var(&["OCCL_TOPO_DUMP_FILE", "NCCL_TOPO_DUMP_FILE"]) {
            c.topo_dump_file = Some(v.into());
        }
        if let Some((n, v)) = var(&["OCCL_NET_MERGE_LEVEL", "NCCL_NET_MERGE_LEVEL"]) {
            c.net_merge_level = crate::topo::fuse::parse_level(&n, &v)?;
        }
        if let Some((n, v)) = var(&["OCCL_NET_FORCE_MERGE", "NCCL_NET_FORCE_MERGE"]) {
            c.net_force_merge = Some(crate::topo::ForceMerge::parse(&n, &v)?);
        }
        if let Some((n, v)) = var(&["OCCL_IB_HCA", "NCCL_IB_HCA"]) {
            #[cfg(feature = "ib")]
            ibverbs::hca::HcaFilter::parse(&v).map_err(|e| Error::arg(format!("{n}: {e}")))?;
            #[cfg(not(feature = "ib"))]
            let _ = n;
            c.ib_hca = Some(v);
        }
        if let Some((n, v)) = var(&["OCCL_IB_GID_INDEX", "NCCL_IB_GID_INDEX"]) {
            let i: i32 = parse(&n, &v, "a GID index")?;
            c.ib_gid_index = match i {
                -1 => None,
                0..=255 => Some(i as u8),
                _ => return Err(Error::arg(format!("{n}={v:?} must be -1 (automatic) or 0 to 255"))),
            };
        }
        c.flight = occl_telemetry::FlightConfig::from_lookup(&get).map_err(|e| Error::arg(e.to_string()))?;
        Ok(c)
    }

    /// Refuses what no transport can run with, for a `Config` built in code (init calls it; the
    /// environment's own ranges are narrower): a zero socket or slot count divides by zero, a
    /// zero slot moves nothing, a timeout past `Instant`'s range overflows every deadline, and a
    /// huge slot or slot count is a mapping of that size.
    pub fn check(&self) -> Result<()> {
        let bad = |field: &str, var: &str, want: String| {
            Err(Error::arg(format!("Config::{field} (OCCL_{var}) must be {want}")))
        };
        if self.timeout.is_zero() || self.timeout > MAX_TIMEOUT {
            return bad("timeout", "TIMEOUT", format!("{TIMEOUT_RANGE}, not {:?}", self.timeout));
        }
        if let Some(t) = &self.socket_ifname {
            crate::netif::IfFilter::parse("Config::socket_ifname (OCCL_SOCKET_IFNAME)", t)?;
        }
        if !NSOCKS.contains(&self.nsocks) {
            return bad("nsocks", "NSOCKS", format!("between 1 and {}, not {}", NSOCKS.end(), self.nsocks));
        }
        for (field, var, b) in [
            ("shm_slot_size", "SHM_SLOT_SIZE", self.shm_slot_size),
            ("tcp_slot_size", "TCP_SLOT_SIZE", self.tcp_slot_size),
        ] {
            if !(1..=MAX_SLOT_SIZE).contains(&b) {
                return bad(field, var, format!("between 1 byte and 64 MiB, not {b}"));
            }
        }
        if !(1..=MAX_FIFO_SLOTS_IN_CODE).contains(&self.fifo_slots) {
            return bad(
                "fifo_slots",
                "FIFO_SLOTS",
                format!("between 1 and {MAX_FIFO_SLOTS_IN_CODE}, not {}", self.fifo_slots),
            );
        }
        if self.reg_threads.is_some_and(|t| t > MAX_REG_THREADS) {
            return bad("reg_threads", "REG_THREADS", format!("at most {}", MAX_REG_THREADS));
        }
        Ok(())
    }
}

/// Fails when some rank's `Config::shared` settings (`all`, in rank order) differ from rank 0's,
/// naming the first variable that differs, rank 0's value and that rank's. Every rank checks
/// the same table, so every rank fails alike and at once.
pub(crate) fn check_alike<'a>(all: impl IntoIterator<Item = &'a [(String, String)]>) -> Result<()> {
    let mut all = all.into_iter().enumerate();
    let Some((_, first)) = all.next() else { return Ok(()) };
    let shown = |v: &str| if v.is_empty() { "it unset".to_string() } else { v.to_string() };
    for (r, theirs) in all {
        for (name, mine) in first {
            let other = theirs.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str());
            if other != Some(mine.as_str()) {
                return Err(Error::usage(format!(
                    "{name} differs: rank 0 has {}, rank {r} has {}; every rank must set it alike",
                    shown(mine),
                    other.map_or("no value for it (a different occl build?)".to_string(), shown)
                )));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::OsString;

    fn with(vars: &[(&str, &str)]) -> Result<Config> {
        let vars: Vec<(String, OsString)> = vars.iter().map(|(k, v)| (k.to_string(), OsString::from(v))).collect();
        Config::from_lookup(|k| vars.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone()))
    }

    /// Every hostile value of a numeric variable is an InvalidArgument that names the variable
    /// and the range; none panics (1e30 s did: `Duration::from_secs_f64`).
    #[test]
    fn hostile_numbers_are_refused_by_name() {
        let huge = "99999999999999999999999999";
        for var in ["OCCL_TIMEOUT", "OCCL_NSOCKS", "OCCL_SHM_SLOT_SIZE", "OCCL_TCP_SLOT_SIZE", "OCCL_FIFO_SLOTS"] {
            for v in ["1e30", "inf", "-inf", "NaN", "-1", "0", "-0", huge, "18446744073709551616", "1e-300", "0x10"] {
                // A few are fine for some variables (OCCL_TIMEOUT=1e-300 is not: it rounds to 0).
                let Err(e) = with(&[(var, v)]) else { continue };
                assert_eq!(e.kind(), crate::ErrorKind::InvalidArgument, "{var}={v}: {e}");
                assert!(e.to_string().contains(var), "{var}={v}: {e}");
            }
        }
        for v in ["1e30", "1e10", "inf", "NaN", "-5", "0", "31536001"] {
            let e = with(&[("OCCL_TIMEOUT", v)]).expect_err(v).to_string();
            assert!(e.contains("OCCL_TIMEOUT") && e.contains("at most 31536000"), "{v}: {e}");
        }
        assert_eq!(with(&[("OCCL_TIMEOUT", "31536000")]).expect("a year").timeout, MAX_TIMEOUT);
        assert_eq!(with(&[("OCCL_TIMEOUT", "0.25")]).expect("fraction").timeout, Duration::from_millis(250));
        for (var, v, range) in [
            ("OCCL_FIFO_SLOTS", "4294967296", "between 2 and 64"),
            ("OCCL_NSOCKS", "100000", "between 1 and 64"),
            ("OCCL_TCP_SLOT_SIZE", "1099511627776", "64 MiB"),
            ("OCCL_FLIGHT_RECORDER_SIZE", "1e12", "0 to 1048576"),
            ("OCCL_FLIGHT_RECORDER_SIZE", huge, "at most 1048576"),
            ("OCCL_REG_THREADS", huge, "a thread count"),
            ("OCCL_IB_GID_INDEX", "4096", "0 to 255"),
        ] {
            let e = with(&[(var, v)]).expect_err(var).to_string();
            assert!(e.contains(var) && e.contains(range), "{var}={v}: {e}");
        }
        // Only the OCCL_TIMEOUT range matters to the defaults: they pass their own check.
        Config::default().check().expect("defaults");
    }

    /// A `Config` built in code is checked at init for what would panic or hang.
    #[test]
    fn check_refuses_what_no_transport_runs_with() {
        for (c, field) in [
            (Config { timeout: Duration::MAX, ..Config::default() }, "timeout"),
            (Config { timeout: Duration::ZERO, ..Config::default() }, "timeout"),
            (Config { fifo_slots: 0, ..Config::default() }, "fifo_slots"),
            (Config { nsocks: 0, ..Config::default() }, "nsocks"),
            (Config { tcp_slot_size: 0, ..Config::default() }, "tcp_slot_size"),
            (Config { shm_slot_size: usize::MAX, ..Config::default() }, "shm_slot_size"),
        ] {
            let e = c.check().expect_err(field);
            assert_eq!(e.kind(), crate::ErrorKind::InvalidArgument);
            assert!(e.to_string().contains(field), "{e}");
        }
        let id = crate::UniqueId::new().expect("id");
        let e = crate::Comm::init_rank(1, &id, 0, Config { timeout: Duration::MAX, ..Config::default() })
            .expect_err("init checks the config");
        assert!(e.to_string().contains("OCCL_TIMEOUT"), "{e}");
        let e = crate::Comm::init_rank(usize::MAX, &id, 0, Config::default()).expect_err("nranks");
        assert!(e.to_string().contains("1048576"), "{e}");
    }

    #[test]
    fn socket_variables_are_checked_at_parse_time() {
        assert_eq!(Config::default().listen_addr, None);
        let c = with(&[("OCCL_SOCKET_ADDR", "fd00::1"), ("NCCL_SOCKET_IFNAME", "^docker,lo")]).expect("parse");
        assert_eq!(c.listen_addr, Some("fd00::1".parse().expect("ip")));
        assert_eq!(c.socket_ifname.as_deref(), Some("^docker,lo"));
        let c = with(&[("OCCL_SOCKET_IFNAME", "=eth0"), ("NCCL_SOCKET_IFNAME", "ib")]).expect("parse");
        assert_eq!(c.socket_ifname.as_deref(), Some("=eth0"), "OCCL_ wins over NCCL_");
        for (var, v) in [("NCCL_SOCKET_IFNAME", "^"), ("OCCL_SOCKET_IFNAME", "eth0,=lo"), ("OCCL_SOCKET_ADDR", "eth0")]
        {
            let e = with(&[(var, v)]).expect_err(v);
            assert_eq!(e.kind(), crate::ErrorKind::InvalidArgument, "{var}={v}: {e}");
            assert!(e.to_string().contains(var), "{var}={v}: {e}");
        }
        let e = Config { socket_ifname: Some("=".into()), ..Config::default() }.check().expect_err("empty filter");
        assert!(e.to_string().contains("socket_ifname"), "{e}");
    }

    #[test]
    fn settings_that_differ_name_the_variable_and_both_values() {
        let base = Config::default();
        let check = |all: &[Vec<(String, String)>]| check_alike(all.iter().map(Vec::as_slice));
        check(&[base.shared(), base.shared(), base.shared()]).expect("identical settings agree");
        let nsocks = Config { nsocks: 4, ..Config::default() };
        let e = check(&[base.shared(), base.shared(), nsocks.shared()]).expect_err("nsocks differs");
        assert_eq!(e.kind(), crate::ErrorKind::InvalidUsage);
        assert!(e.to_string().contains("OCCL_NSOCKS differs: rank 0 has 2, rank 2 has 4"), "{e}");
        let tcp = Config { transport: Some(TransportKind::Tcp), ..Config::default() };
        let e = check(&[base.shared(), tcp.shared()]).expect_err("transport differs");
        assert!(e.to_string().contains("OCCL_TRANSPORT differs: rank 0 has it unset, rank 1 has tcp"), "{e}");
        let e = check(&[tcp.shared(), Vec::new()]).expect_err("a rank without the setting");
        assert!(e.to_string().contains("rank 1 has no value"), "{e}");
    }
}
