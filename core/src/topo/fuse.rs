//! NIC fusion: NICs close enough to each other become one virtual NIC whose bandwidth is their
//! sum. NCCL's rules (2.24 and later):
//! - `NCCL_NET_FORCE_MERGE` groups are made first: `;` between groups, `,` between names in
//!   `NCCL_IB_HCA` notation (`mlx5_0` for every port of a device, `mlx5_0:1` for one; a leading
//!   `=` is allowed and changes nothing, names match exactly). Each name must match exactly
//!   one NIC, so `mlx5_0` on a two-port device is an error: name its ports.
//! - Then, in NIC order, the first NIC not yet placed takes every later unplaced NIC within
//!   `NCCL_NET_MERGE_LEVEL` of it (default `PORT`: the ports of one device), up to
//!   [`MAX_DEVS_PER_VNIC`]. NICs of different link layers never merge (NCCL's IB plugin
//!   refuses to make such a device).

use super::path::{nic_distance, PathType};
use super::Nic;
use crate::error::{Error, Result};

/// NCCL_NET_MAX_DEVS_PER_NIC.
pub const MAX_DEVS_PER_VNIC: usize = 4;

/// One name of a force-merge group: a device, and optionally one of its ports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NicPattern {
    pub name: String,
    pub port: Option<u32>,
}

impl NicPattern {
    fn matches(&self, nic: &Nic) -> bool {
        nic.name == self.name && self.port.is_none_or(|p| nic.port == Some(p))
    }
}

/// A parsed `OCCL_NET_FORCE_MERGE` / `NCCL_NET_FORCE_MERGE`; keeps the variable's name so that
/// an error found later, against the NICs, still names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ForceMerge {
    var: String,
    groups: Vec<Vec<NicPattern>>,
}

impl ForceMerge {
    /// Parses `text` (the value of variable `var`). Empty groups (a trailing `;`) are skipped;
    /// an empty name, a bad port, a `^` exclusion or a group over [`MAX_DEVS_PER_VNIC`] is an
    /// `InvalidArgument` naming `var`.
    pub fn parse(var: &str, text: &str) -> Result<ForceMerge> {
        let bad = |why: String| {
            Error::arg(format!("{var}={text:?}: {why} (expected groups like \"mlx5_0,mlx5_1;mlx5_2:1,mlx5_3:1\")"))
        };
        let mut groups = Vec::new();
        for group in text.split(';').map(str::trim).filter(|g| !g.is_empty()) {
            let mut pats = Vec::new();
            for item in group.split(',').map(str::trim) {
                let item = item.strip_prefix('=').unwrap_or(item);
                if item.is_empty() {
                    return Err(bad(format!("group {group:?} has an empty name")));
                }
                if item.starts_with('^') {
                    return Err(bad(format!("{item:?}: exclusions (^) mean nothing in a merge group")));
                }
                let (name, port) = match item.split_once(':') {
                    Some((n, p)) => {
                        let port =
                            p.parse::<u32>().map_err(|_| bad(format!("{item:?}: port {p:?} is not a number")))?;
                        (n, Some(port))
                    }
                    None => (item, None),
                };
                if name.is_empty() {
                    return Err(bad(format!("{item:?} has no device name")));
                }
                pats.push(NicPattern { name: name.to_string(), port });
            }
            if pats.len() > MAX_DEVS_PER_VNIC {
                return Err(bad(format!("group {group:?} has {} NICs, at most {MAX_DEVS_PER_VNIC} fuse", pats.len())));
            }
            groups.push(pats);
        }
        if groups.is_empty() {
            return Err(bad("no group".into()));
        }
        Ok(ForceMerge { var: var.to_string(), groups })
    }

    pub fn var(&self) -> &str {
        &self.var
    }

    pub fn groups(&self) -> &[Vec<NicPattern>] {
        &self.groups
    }
}

/// A virtual NIC: one or more physical NICs used as one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VirtualNic {
    /// Members' labels joined by `+`, as NCCL names fused devices: `mlx5_0:1+mlx5_1:1`.
    pub name: String,
    /// Members' labels, in NIC order.
    pub members: Vec<String>,
    /// Made by `OCCL_NET_FORCE_MERGE` rather than by distance.
    pub forced: bool,
}

/// The fusion of a set of NICs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fusion {
    pub level: PathType,
    /// Forced groups first (in the variable's order), then the rest in NIC order.
    pub vnics: Vec<VirtualNic>,
}

impl Fusion {
    /// The virtual NICs' names, for logs and tests.
    pub fn names(&self) -> Vec<&str> {
        self.vnics.iter().map(|v| v.name.as_str()).collect()
    }
}

fn vnic(nics: &[&Nic], mut members: Vec<usize>, forced: bool) -> VirtualNic {
    members.sort_unstable();
    let members: Vec<String> = members.iter().map(|&i| nics[i].label()).collect();
    VirtualNic { name: members.join("+"), members, forced }
}

/// Fuses `nics` (one kind, in order) at `level`, after the groups `force` names.
pub fn fuse(nics: &[&Nic], level: PathType, force: Option<&ForceMerge>) -> Result<Fusion> {
    let mut placed = vec![false; nics.len()];
    let mut vnics = Vec::new();
    if let Some(f) = force {
        for group in &f.groups {
            let text =
                group.iter().map(|p| p.port.map_or(p.name.clone(), |n| format!("{}:{n}", p.name))).collect::<Vec<_>>();
            let matched: Vec<usize> = (0..nics.len()).filter(|&i| group.iter().any(|p| p.matches(nics[i]))).collect();
            if matched.len() != group.len() {
                let found: Vec<String> = matched.iter().map(|&i| nics[i].label()).collect();
                return Err(Error::usage(format!(
                    "{}: group {:?} names {} NIC(s) but matches {} ({found:?}); each name must match exactly one usable \
                     NIC (write device:port for a multi-port device)",
                    f.var,
                    text.join(","),
                    group.len(),
                    matched.len()
                )));
            }
            if let Some(&i) = matched.iter().find(|&&i| placed[i]) {
                return Err(Error::usage(format!("{}: {} is in more than one group", f.var, nics[i].label())));
            }
            for &i in &matched {
                placed[i] = true;
            }
            vnics.push(vnic(nics, matched, true));
        }
    }
    for i in 0..nics.len() {
        if placed[i] {
            continue;
        }
        placed[i] = true;
        let mut members = vec![i];
        for j in i + 1..nics.len() {
            if members.len() == MAX_DEVS_PER_VNIC {
                break;
            }
            if !placed[j] && nics[i].link_layer == nics[j].link_layer && nic_distance(nics[i], nics[j]) <= level {
                placed[j] = true;
                members.push(j);
            }
        }
        vnics.push(vnic(nics, members, false));
    }
    for v in vnics.iter().filter(|v| v.members.len() > 1) {
        tracing::info!("occl: topo: fused NICs {} ({})", v.name, if v.forced { "forced" } else { level.name() });
    }
    Ok(Fusion { level, vnics })
}

/// Parses a merge level (`OCCL_NET_MERGE_LEVEL` / `NCCL_NET_MERGE_LEVEL`).
pub fn parse_level(var: &str, text: &str) -> Result<PathType> {
    PathType::parse(text).ok_or_else(|| {
        Error::arg(format!(
            "{var}={text:?} is not a merge level: use LOC, PORT, PIX, PXB, PHB or SYS (NCCL's P2C and PXN mean PXB)"
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn force_merge_syntax() {
        let f = ForceMerge::parse("V", "mlx5_0,mlx5_1; =mlx5_2:1 ,mlx5_3:1;").unwrap();
        assert_eq!(f.groups().len(), 2);
        assert_eq!(f.groups()[1][0], NicPattern { name: "mlx5_2".into(), port: Some(1) });
        assert_eq!(f.groups()[0][1], NicPattern { name: "mlx5_1".into(), port: None });
        for bad in ["", ";", "a,,b", "a:x", "^a,b", ":1", "a,b,c,d,e"] {
            let e = ForceMerge::parse("OCCL_NET_FORCE_MERGE", bad).unwrap_err();
            assert!(e.to_string().contains("OCCL_NET_FORCE_MERGE"), "{bad:?}: {e}");
        }
    }

    #[test]
    fn level_errors_name_the_variable() {
        assert_eq!(parse_level("X", "pix").unwrap(), PathType::Pix);
        let e = parse_level("NCCL_NET_MERGE_LEVEL", "PATH_PORT").unwrap_err();
        assert!(e.to_string().contains("NCCL_NET_MERGE_LEVEL"));
    }
}
