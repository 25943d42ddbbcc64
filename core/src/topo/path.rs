//! How far apart two devices are, in NCCL's path types: the kind of link a transfer between
//! them crosses at worst.
//!
//! A PCIe switch appears in sysfs as two bridge levels (its upstream port, then a downstream
//! port per slot), so like NCCL we climb a device's path two levels at a time: each step up
//! lands on a switch's upstream port, until the next step would reach the root complex (the
//! host bridge, the CPU).

use super::{Nic, PciDev};
use std::fmt;

/// Path types, nearest first; the order is what a merge level compares against.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PathType {
    /// The same device.
    Loc,
    /// Two ports (or two functions) of one PCI device.
    Port,
    /// Through a single PCIe switch.
    Pix,
    /// Through several PCIe switches, without reaching the host bridge.
    Pxb,
    /// Through the host bridge of one CPU (same NUMA node).
    Phb,
    /// Across CPUs (different NUMA nodes), or where we cannot tell.
    Sys,
}

impl PathType {
    pub const ALL: [PathType; 6] =
        [PathType::Loc, PathType::Port, PathType::Pix, PathType::Pxb, PathType::Phb, PathType::Sys];

    pub const fn name(self) -> &'static str {
        match self {
            PathType::Loc => "LOC",
            PathType::Port => "PORT",
            PathType::Pix => "PIX",
            PathType::Pxb => "PXB",
            PathType::Phb => "PHB",
            PathType::Sys => "SYS",
        }
    }

    /// NCCL's names, any case. `P2C` and `PXN` are accepted as NCCL accepts them: between two
    /// NICs they mean the same as `PXB`.
    pub fn parse(s: &str) -> Option<PathType> {
        let s = s.trim().to_ascii_uppercase();
        PathType::ALL.into_iter().find(|p| p.name() == s).or(match s.as_str() {
            "P2C" | "PXN" => Some(PathType::Pxb),
            _ => None,
        })
    }
}

impl fmt::Display for PathType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Indexes into `path` of the switches above the device, nearest first (see the module doc).
fn switches(path: &[String]) -> Vec<usize> {
    let mut out = Vec::new();
    let mut p = path.len().saturating_sub(1);
    while p > 2 {
        p -= 2;
        out.push(p);
    }
    out
}

/// `0000:07:00.1` → `0000:07:00`: the functions of one device share it.
fn device_part(bdf: &str) -> &str {
    bdf.rsplit_once('.').map_or(bdf, |(d, _)| d)
}

/// The path type between two PCI functions.
pub fn pci_distance(a: &PciDev, b: &PciDev) -> PathType {
    if a.path == b.path {
        return PathType::Loc;
    }
    let n = a.path.len();
    if n == b.path.len()
        && a.path[..n - 1] == b.path[..n - 1]
        && device_part(&a.path[n - 1]) == device_part(&b.path[n - 1])
    {
        return PathType::Port;
    }
    let (sa, sb) = (switches(&a.path), switches(&b.path));
    let same = |i: usize, j: usize| i == j && a.path[..=i] == b.path[..=j];
    if let (Some(&i), Some(&j)) = (sa.first(), sb.first()) {
        if same(i, j) {
            return PathType::Pix;
        }
    }
    if sa.iter().any(|&i| sb.iter().any(|&j| same(i, j))) {
        return PathType::Pxb;
    }
    if a.path.first() == b.path.first() {
        return PathType::Phb;
    }
    match (a.numa_node, b.numa_node) {
        (Some(x), Some(y)) if x == y => PathType::Phb,
        _ => PathType::Sys,
    }
}

/// The path type between two NICs: `Loc` for the same port, `Port` for two ports (or two
/// interfaces) of one PCI device, otherwise their PCI distance.
pub fn nic_distance(a: &Nic, b: &Nic) -> PathType {
    if a.kind == b.kind && a.name == b.name && a.port == b.port {
        return PathType::Loc;
    }
    match pci_distance(&a.pci, &b.pci) {
        PathType::Loc => PathType::Port,
        d => d,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dev(path: &str, numa: Option<u32>) -> PciDev {
        let path: Vec<String> = path.split('/').map(String::from).collect();
        PciDev {
            bdf: path.last().cloned().unwrap_or_default(),
            path,
            class: None,
            vendor: None,
            device: None,
            numa_node: numa,
            local_cpus: None,
        }
    }

    #[test]
    fn names_parse_like_nccl() {
        for p in PathType::ALL {
            assert_eq!(PathType::parse(p.name()), Some(p));
            assert_eq!(PathType::parse(&p.name().to_lowercase()), Some(p));
        }
        assert_eq!(PathType::parse("P2C"), Some(PathType::Pxb));
        assert_eq!(PathType::parse("PXN"), Some(PathType::Pxb));
        assert_eq!(PathType::parse("PATH_PORT"), None);
        assert_eq!(PathType::parse("NVL"), None);
    }

    #[test]
    fn two_functions_of_one_device_are_port() {
        let a = dev("pci0000:00/0000:00:02.0/0000:3b:00.0", Some(0));
        let b = dev("pci0000:00/0000:00:02.0/0000:3b:00.1", Some(0));
        assert_eq!(pci_distance(&a, &b), PathType::Port);
        assert_eq!(pci_distance(&a, &a), PathType::Loc);
    }

    #[test]
    fn switch_levels() {
        // Root port 00:01.0, switch 01:00.0 (downstream ports 02:0x.0) over switch 03:00.0.
        let top = "pci0000:00/0000:00:01.0/0000:01:00.0";
        let a = dev(&format!("{top}/0000:02:00.0/0000:03:00.0/0000:04:02.0/0000:07:00.0"), Some(0));
        let b = dev(&format!("{top}/0000:02:00.0/0000:03:00.0/0000:04:03.0/0000:08:00.0"), Some(0));
        let c = dev(&format!("{top}/0000:02:01.0/0000:09:00.0/0000:0a:02.0/0000:0d:00.0"), Some(0));
        // Directly below the top switch.
        let d = dev(&format!("{top}/0000:02:02.0/0000:20:00.0"), Some(0));
        // On its own root port of the same root complex; on another root complex, same node.
        let e = dev("pci0000:00/0000:00:1c.0/0000:0f:00.0", Some(0));
        let f = dev("pci0000:40/0000:40:01.0/0000:41:00.0", Some(0));
        let g = dev("pci0000:80/0000:80:01.0/0000:81:00.0", Some(1));
        let unknown = dev("pci0000:c0/0000:c0:01.0/0000:c1:00.0", None);
        assert_eq!(pci_distance(&a, &b), PathType::Pix);
        assert_eq!(pci_distance(&a, &c), PathType::Pxb);
        assert_eq!(pci_distance(&a, &d), PathType::Pxb);
        assert_eq!(pci_distance(&a, &e), PathType::Phb);
        assert_eq!(pci_distance(&e, &f), PathType::Phb);
        assert_eq!(pci_distance(&a, &g), PathType::Sys);
        assert_eq!(pci_distance(&f, &unknown), PathType::Sys);
        for (x, y) in [(&a, &b), (&a, &c), (&a, &g), (&e, &f)] {
            assert_eq!(pci_distance(x, y), pci_distance(y, x));
        }
    }
}
