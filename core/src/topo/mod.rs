//! The host's topology: NUMA nodes, this process's CPU affinity, and the GPUs and NICs found in
//! sysfs with their PCI paths, so that NICs close to each other can be fused into virtual NICs
//! (`OCCL_NET_MERGE_LEVEL`, `OCCL_NET_FORCE_MERGE`) and the whole can be dumped
//! (`OCCL_TOPO_DUMP_FILE`).
//!
//! Reading is tolerant: a missing file leaves its field `None`, malformed content does too and
//! logs a warning; nothing here fails because of what sysfs holds.

pub(crate) mod cores;
pub mod cpuset;
pub mod dump;
pub mod fuse;
pub mod path;
mod pci;

pub use cpuset::CpuSet;
pub use fuse::{fuse, ForceMerge, Fusion, NicPattern, VirtualNic, MAX_DEVS_PER_VNIC};
pub use path::PathType;

use std::path::Path;

/// A NUMA node and its CPUs (`/sys/devices/system/node/nodeN/cpulist`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NumaNode {
    pub id: u32,
    pub cpus: CpuSet,
}

/// A PCI function and where it sits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PciDev {
    /// Its address, `0000:07:00.0`.
    pub bdf: String,
    /// The chain from the root complex down to the function itself: `["pci0000:00",
    /// "0000:00:01.0", …, "0000:07:00.0"]`. Every element after the first is a bridge except
    /// the last.
    pub path: Vec<String>,
    /// `class`, e.g. 0x030200 for a 3D controller.
    pub class: Option<u32>,
    pub vendor: Option<u16>,
    pub device: Option<u16>,
    /// `numa_node`; the kernel's -1 (unknown) is `None`, except on a host with a single NUMA
    /// node where it can only mean that node.
    pub numa_node: Option<u32>,
    /// `local_cpulist`: the CPUs nearest the device.
    pub local_cpus: Option<CpuSet>,
}

impl PciDev {
    /// The path as one string, `pci0000:00/0000:00:01.0/…`.
    pub fn path_string(&self) -> String {
        self.path.join("/")
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Gpu {
    /// Its position among the GPUs found, in PCI address order.
    pub index: usize,
    pub pci: PciDev,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum NicKind {
    /// An InfiniBand/RoCE port (`/sys/class/infiniband/X/ports/N`).
    Ib,
    /// A network interface backed by a PCI function (`/sys/class/net/X`).
    Socket,
}

impl NicKind {
    pub const fn name(self) -> &'static str {
        match self {
            NicKind::Ib => "ib",
            NicKind::Socket => "socket",
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Nic {
    pub kind: NicKind,
    /// The IB device (`mlx5_0`) or interface (`eth0`) name.
    pub name: String,
    /// The IB port number; `None` for interfaces.
    pub port: Option<u32>,
    pub pci: PciDev,
    /// The port's state name (`ACTIVE`, `DOWN`, from `4: ACTIVE`).
    pub state: Option<String>,
    /// The port's rate in Gb/s (from `400 Gb/sec (4X NDR)`).
    pub rate_gbps: Option<f64>,
    /// `InfiniBand` or `Ethernet`.
    pub link_layer: Option<String>,
}

impl Nic {
    /// How logs and `OCCL_NET_FORCE_MERGE` name it: `mlx5_0:1` for an IB port, `eth0`.
    pub fn label(&self) -> String {
        match self.port {
            Some(p) => format!("{}:{p}", self.name),
            None => self.name.clone(),
        }
    }

    /// Whether a transport could use it: IB ports that are not known to be down (NCCL skips
    /// ports that are not ACTIVE); interfaces always.
    pub fn usable(&self) -> bool {
        self.kind == NicKind::Socket || self.state.as_deref().is_none_or(|s| s == "ACTIVE")
    }
}

/// The host a topology was read on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Host {
    pub name: String,
    /// The hash of the host's identity (hostname and boot id, or `OCCL_HOSTID`): ranks with
    /// equal hashes share memory.
    pub hash: u64,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Topology {
    pub host: Option<Host>,
    pub numa: Vec<NumaNode>,
    /// This process's CPU affinity; `None` when not asked for (a fixture) or refused.
    pub affinity: Option<CpuSet>,
    pub gpus: Vec<Gpu>,
    /// IB ports first (by device name, then port), then interfaces (by name).
    pub nics: Vec<Nic>,
}

impl Topology {
    /// Reads the sysfs tree under `root` (`/` for this host, a fixture directory in tests).
    /// The result has no host and no affinity: those belong to the running process, not to
    /// the tree.
    pub fn read(root: &Path) -> Topology {
        pci::read(root)
    }

    /// This host's topology, with this process's affinity.
    pub fn detect(host: Host) -> Topology {
        let mut t = Topology::read(Path::new("/"));
        t.host = Some(host);
        t.affinity = cpuset::process_affinity();
        t
    }

    /// The NICs that fusion considers: the usable ones of `kind`, in `nics` order.
    pub fn fusion_candidates(&self, kind: NicKind) -> Vec<&Nic> {
        self.nics.iter().filter(|n| n.kind == kind && n.usable()).collect()
    }

    /// Fuses the usable IB ports, or the interfaces where there are none (NCCL fuses within
    /// one network plugin, and uses IB when it has any).
    pub fn fuse(&self, level: PathType, force: Option<&ForceMerge>) -> crate::Result<Fusion> {
        let ib = self.fusion_candidates(NicKind::Ib);
        if ib.is_empty() {
            fuse(&self.fusion_candidates(NicKind::Socket), level, force)
        } else {
            fuse(&ib, level, force)
        }
    }

    pub fn nic(&self, label: &str) -> Option<&Nic> {
        self.nics.iter().find(|n| n.label() == label)
    }
}
