//! The sysfs walk: NUMA nodes, GPUs (NVIDIA display/3D controllers on the PCI bus), IB ports
//! and PCI-backed network interfaces, each located by the chain of bridges above it.
//!
//! Symlinks are resolved by hand, one component at a time with the tree's root as `/`, so a
//! fixture directory reads exactly like the real `/sys`.

use super::cpuset::CpuSet;
use super::{Gpu, Nic, NicKind, NumaNode, PciDev, Topology};
use occl_events::files::{read_to_string_capped, MAX_SYSTEM_FILE};
use std::io::ErrorKind;
use std::path::{Component, Path, PathBuf};

const NVIDIA: u16 = 0x10de;
/// Symlinks followed while resolving one path before giving up (a loop).
const MAX_LINKS: usize = 40;

struct Sysfs<'a> {
    root: &'a Path,
}

/// Whether `s` looks like a PCI address, `DDDD:BB:DD.F` in hex.
fn is_bdf(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() == 12
        && b.iter().enumerate().all(|(i, &c)| match i {
            4 | 7 => c == b':',
            10 => c == b'.',
            _ => c.is_ascii_hexdigit(),
        })
}

fn parse_hex(s: &str) -> Option<u64> {
    u64::from_str_radix(s.trim().trim_start_matches("0x"), 16).ok()
}

impl Sysfs<'_> {
    fn abs(&self, rel: &[String]) -> PathBuf {
        let mut p = self.root.to_path_buf();
        p.extend(rel);
        p
    }

    /// A file's content, trimmed. Missing: `None` quietly; unreadable: `None` and a warning.
    fn read(&self, rel: &[String], file: &str) -> Option<String> {
        let p = self.abs(rel).join(file);
        match read_to_string_capped(&p, MAX_SYSTEM_FILE) {
            Ok(s) => Some(s.trim().to_string()),
            Err(e) if e.kind() == ErrorKind::NotFound => None,
            Err(e) => {
                tracing::warn!("occl: topo: cannot read {}: {e}", p.display());
                None
            }
        }
    }

    /// Reads and parses a file; content that does not parse is logged and dropped.
    fn parse<T>(&self, rel: &[String], file: &str, what: &str, f: impl FnOnce(&str) -> Option<T>) -> Option<T> {
        let text = self.read(rel, file)?;
        let v = f(&text);
        if v.is_none() {
            tracing::warn!("occl: topo: {}/{file}: {text:?} is not {what}; ignored", self.abs(rel).display());
        }
        v
    }

    fn cpus(&self, rel: &[String], file: &str) -> Option<CpuSet> {
        self.parse(rel, file, "a cpu list", |t| CpuSet::parse_list(t).ok())
    }

    /// Names in a directory, sorted; none if it is missing.
    fn list(&self, rel: &[String]) -> Vec<String> {
        let Ok(rd) = std::fs::read_dir(self.abs(rel)) else { return Vec::new() };
        let mut v: Vec<String> = rd.filter_map(|e| e.ok()?.file_name().into_string().ok()).collect();
        v.sort();
        v
    }

    /// The real location of `rel` (components under the root), following every symlink on
    /// the way; an absolute link target starts again at the root.
    fn resolve(&self, rel: &[String]) -> Option<Vec<String>> {
        let mut todo: Vec<String> = rel.iter().rev().cloned().collect();
        let mut done: Vec<String> = Vec::new();
        let mut links = 0;
        while let Some(c) = todo.pop() {
            match c.as_str() {
                "" | "." => continue,
                ".." => {
                    done.pop();
                    continue;
                }
                _ => done.push(c),
            }
            let Ok(target) = std::fs::read_link(self.abs(&done)) else { continue };
            links += 1;
            if links > MAX_LINKS {
                tracing::warn!("occl: topo: too many symlinks resolving {}", self.abs(rel).display());
                return None;
            }
            done.pop();
            if target.is_absolute() {
                done.clear();
            }
            let mut parts = Vec::new();
            for comp in target.components() {
                match comp {
                    Component::Normal(s) => parts.push(s.to_string_lossy().into_owned()),
                    Component::ParentDir => parts.push("..".into()),
                    _ => {}
                }
            }
            todo.extend(parts.into_iter().rev());
        }
        Some(done)
    }

    /// The PCI function at (or nearest above) the resolved location `loc`, if it lies under
    /// `sys/devices/pciDDDD:BB/`.
    fn pci_at(&self, loc: &[String]) -> Option<PciDev> {
        if loc.len() < 4 || loc[0] != "sys" || loc[1] != "devices" || !loc[2].starts_with("pci") {
            return None;
        }
        let last = loc.iter().rposition(|c| is_bdf(c)).filter(|&i| i >= 3)?;
        let dir = &loc[..=last];
        let path: Vec<String> = loc[2..=last].to_vec();
        let numa_node = self
            .parse(dir, "numa_node", "a NUMA node number", |t| t.parse::<i64>().ok())
            .and_then(|n| u32::try_from(n).ok());
        Some(PciDev {
            bdf: loc[last].clone(),
            path,
            class: self.parse(dir, "class", "a hex class code", parse_hex).and_then(|v| u32::try_from(v).ok()),
            vendor: self.parse(dir, "vendor", "a hex vendor id", parse_hex).and_then(|v| u16::try_from(v).ok()),
            device: self.parse(dir, "device", "a hex device id", parse_hex).and_then(|v| u16::try_from(v).ok()),
            numa_node,
            local_cpus: self.cpus(dir, "local_cpulist"),
        })
    }

    fn numa(&self) -> Vec<NumaNode> {
        let base = rel(&["sys", "devices", "system", "node"]);
        let mut out = Vec::new();
        for name in self.list(&base) {
            let Some(id) = name.strip_prefix("node").and_then(|n| n.parse::<u32>().ok()) else { continue };
            let mut dir = base.clone();
            dir.push(name);
            if let Some(cpus) = self.cpus(&dir, "cpulist") {
                out.push(NumaNode { id, cpus });
            }
        }
        out.sort_by_key(|n| n.id);
        out
    }

    fn gpus(&self) -> Vec<Gpu> {
        let base = rel(&["sys", "bus", "pci", "devices"]);
        let mut out = Vec::new();
        for name in self.list(&base) {
            let mut link = base.clone();
            link.push(name);
            let Some(dev) = self.resolve(&link).and_then(|loc| self.pci_at(&loc)) else { continue };
            // Display controllers: VGA (0x0300) and 3D (0x0302).
            let display = dev.class.is_some_and(|c| c >> 8 == 0x0300 || c >> 8 == 0x0302);
            if display && dev.vendor == Some(NVIDIA) {
                out.push(Gpu { index: out.len(), pci: dev });
            }
        }
        out
    }

    /// The PCI function behind `sys/class/<class>/<name>/device`, if there is one.
    fn class_device(&self, class: &str, name: &str) -> Option<PciDev> {
        let loc = self.resolve(&rel(&["sys", "class", class, name, "device"]))?;
        let dev = self.pci_at(&loc);
        if dev.is_none() {
            tracing::debug!("occl: topo: {class}/{name} is not backed by a PCI device");
        }
        dev
    }

    fn ib_ports(&self) -> Vec<Nic> {
        let mut out = Vec::new();
        for name in self.list(&rel(&["sys", "class", "infiniband"])) {
            let Some(pci) = self.class_device("infiniband", &name) else { continue };
            let ports_dir = rel(&["sys", "class", "infiniband", &name, "ports"]);
            let mut ports: Vec<(u32, String)> =
                self.list(&ports_dir).into_iter().filter_map(|p| Some((p.parse::<u32>().ok()?, p))).collect();
            ports.sort();
            for (port, pname) in ports {
                let mut dir = ports_dir.clone();
                dir.push(pname);
                out.push(Nic {
                    kind: NicKind::Ib,
                    name: name.clone(),
                    port: Some(port),
                    pci: pci.clone(),
                    state: self.parse(&dir, "state", "a port state (N: NAME)", |t| {
                        let (n, s) = t.split_once(':')?;
                        n.trim().parse::<u32>().ok()?;
                        Some(s.trim().to_string()).filter(|s| !s.is_empty())
                    }),
                    rate_gbps: self.parse(&dir, "rate", "a rate (N Gb/sec …)", |t| {
                        let mut it = t.split_whitespace();
                        let v = it.next()?.parse::<f64>().ok().filter(|v| v.is_finite() && *v >= 0.0)?;
                        (it.next() == Some("Gb/sec")).then_some(v)
                    }),
                    link_layer: self.read(&dir, "link_layer").filter(|s| !s.is_empty()),
                });
            }
        }
        out
    }

    fn interfaces(&self) -> Vec<Nic> {
        let mut out = Vec::new();
        for name in self.list(&rel(&["sys", "class", "net"])) {
            let Some(pci) = self.class_device("net", &name) else { continue };
            out.push(Nic {
                kind: NicKind::Socket,
                name,
                port: None,
                pci,
                state: None,
                rate_gbps: None,
                link_layer: None,
            });
        }
        out
    }
}

fn rel(parts: &[&str]) -> Vec<String> {
    parts.iter().map(|s| s.to_string()).collect()
}

pub(super) fn read(root: &Path) -> Topology {
    let fs = Sysfs { root };
    let numa = fs.numa();
    let mut gpus = fs.gpus();
    let mut nics = fs.ib_ports();
    nics.extend(fs.interfaces());
    // With one NUMA node, "unknown" (-1, common on single-socket machines) can only be it.
    if let [only] = numa.as_slice() {
        let devs = gpus.iter_mut().map(|g| &mut g.pci).chain(nics.iter_mut().map(|n| &mut n.pci));
        for d in devs {
            d.numa_node.get_or_insert(only.id);
        }
    }
    tracing::debug!(
        "occl: topo: {} NUMA node(s), {} GPU(s), {} NIC(s) under {}",
        numa.len(),
        gpus.len(),
        nics.len(),
        root.display()
    );
    Topology { host: None, numa, affinity: None, gpus, nics }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bdf_shape() {
        assert!(is_bdf("0000:07:00.0"));
        assert!(is_bdf("000a:ff:1f.7"));
        assert!(!is_bdf("pci0000:00"));
        assert!(!is_bdf("0000:07:00"));
        assert!(!is_bdf("infiniband"));
    }

    #[test]
    fn a_missing_root_reads_as_empty() {
        let t = read(Path::new("/nonexistent/occl-topo"));
        assert!(t.numa.is_empty() && t.gpus.is_empty() && t.nics.is_empty());
    }
}
