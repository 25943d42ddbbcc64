//! Finding the device ports occl may use: `discover` asks libibverbs what exists (the only part
//! that needs the library), `choose` applies `OCCL_IB_HCA`, port state and the GID choice as
//! pure logic, and says why nothing is usable when nothing is.

use crate::conn::{LinkLayer, Mtu};
use crate::error::{Error, Result};
use crate::hca::HcaFilter;
use crate::sys;
use crate::verbs::{check, Verbs};
use std::ffi::CStr;

/// Ports are numbered from 1 and contiguous; devices have one or two. Probing stops at the first
/// port the device refuses, so `ibv_query_device` (and its large struct) is not needed.
const MAX_PORTS: u8 = 32;
/// GID table entries looked at per RoCE port.
const MAX_GIDS: i32 = 256;

/// One GID table entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gid {
    pub index: u8,
    pub gid: [u8; 16],
    /// sysfs `gid_attrs/types/<index>` ("IB/RoCE v1", "RoCE v2"), when readable.
    pub kind: Option<String>,
}

impl Gid {
    fn is_ipv4_mapped(&self) -> bool {
        self.gid[..10].iter().all(|&b| b == 0) && self.gid[10] == 0xff && self.gid[11] == 0xff
    }

    fn is_roce_v2(&self) -> bool {
        self.kind.as_deref().is_some_and(|k| k.trim().eq_ignore_ascii_case("RoCE v2"))
    }
}

/// What discovery saw of one port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortInfo {
    pub device: String,
    pub port: u8,
    pub active: bool,
    /// `None`: a link layer other than InfiniBand or Ethernet.
    pub link: Option<LinkLayer>,
    pub lid: u16,
    pub mtu: Option<Mtu>,
    /// Non-empty GID entries (read for Ethernet ports only).
    pub gids: Vec<Gid>,
}

/// A port occl can use, with the GID index to route by on RoCE.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selected {
    pub device: String,
    pub port: u8,
    pub link: LinkLayer,
    pub mtu: Mtu,
    pub lid: u16,
    pub gid_index: Option<u8>,
    pub gid: [u8; 16],
}

/// The GID to route by on a RoCE port: `forced` if given (it must exist), else RoCE v2 with an
/// IPv4-mapped address, then any RoCE v2, then any IPv4-mapped, then the first entry.
pub fn pick_gid(gids: &[Gid], forced: Option<u8>) -> std::result::Result<&Gid, String> {
    if let Some(i) = forced {
        return gids.iter().find(|g| g.index == i).ok_or_else(|| format!("GID index {i} is empty or absent"));
    }
    gids.iter()
        .find(|g| g.is_roce_v2() && g.is_ipv4_mapped())
        .or_else(|| gids.iter().find(|g| g.is_roce_v2()))
        .or_else(|| gids.iter().find(|g| g.is_ipv4_mapped()))
        .or_else(|| gids.first())
        .ok_or_else(|| "its GID table is empty (no IP address on the interface?)".to_string())
}

/// The usable ports among `ports`, in order, or `Error::NoDevice` saying why there are none.
pub fn choose(ports: &[PortInfo], filter: &HcaFilter, gid_index: Option<u8>) -> Result<Vec<Selected>> {
    if ports.is_empty() {
        return Err(Error::NoDevice("libibverbs lists no RDMA device".into()));
    }
    let names = |ps: &[&PortInfo]| ps.iter().map(|p| format!("{}:{}", p.device, p.port)).collect::<Vec<_>>().join(", ");
    let allowed: Vec<&PortInfo> = ports.iter().filter(|p| filter.allows(&p.device, p.port)).collect();
    if allowed.is_empty() {
        let all: Vec<&PortInfo> = ports.iter().collect();
        return Err(Error::NoDevice(format!("the HCA list (OCCL_IB_HCA) leaves out every port ({})", names(&all))));
    }
    let mut out = Vec::new();
    let mut why = Vec::new();
    for p in allowed {
        let name = format!("{}:{}", p.device, p.port);
        let (Some(link), Some(mtu)) = (p.link, p.mtu) else {
            why.push(format!("{name} has an unsupported link layer or MTU"));
            continue;
        };
        if !p.active {
            why.push(format!("{name} is not active"));
            continue;
        }
        let (gid_index, gid) = match link {
            LinkLayer::Infiniband if p.lid == 0 => {
                why.push(format!("{name} has LID 0 (no subnet manager?)"));
                continue;
            }
            LinkLayer::Infiniband => (None, [0; 16]),
            LinkLayer::Ethernet => match pick_gid(&p.gids, gid_index) {
                Ok(g) => (Some(g.index), g.gid),
                Err(e) => {
                    why.push(format!("{name}: {e} (OCCL_IB_GID_INDEX)"));
                    continue;
                }
            },
        };
        out.push(Selected { device: p.device.clone(), port: p.port, link, mtu, lid: p.lid, gid_index, gid });
    }
    if out.is_empty() {
        return Err(Error::NoDevice(format!("no usable port: {}", why.join("; "))));
    }
    Ok(out)
}

/// The sysfs GID type of `device:port` entry `index`, if the kernel exposes it.
fn gid_kind(device: &str, port: u8, index: i32) -> Option<String> {
    std::fs::read_to_string(format!("/sys/class/infiniband/{device}/ports/{port}/gid_attrs/types/{index}"))
        .ok()
        .map(|s| s.trim().to_string())
}

/// Every port of every device libibverbs lists. Devices that cannot be opened are logged and
/// left out (another process may hold them exclusively).
pub fn discover(v: &Verbs) -> Result<Vec<PortInfo>> {
    let mut n: libc::c_int = 0;
    // SAFETY: n is a valid out-pointer; the list is freed below.
    let list = unsafe { (v.get_device_list)(&mut n) };
    if list.is_null() {
        // rdma-core returns NULL (ENOSYS) when the kernel has no RDMA support at all.
        return Err(Error::NoDevice(format!(
            "ibv_get_device_list failed: {} (is an RDMA kernel driver loaded?)",
            std::io::Error::from_raw_os_error(crate::verbs::errno())
        )));
    }
    let mut ports = Vec::new();
    for i in 0..n.max(0) as usize {
        // SAFETY: the list has n entries.
        let dev = unsafe { *list.add(i) };
        if dev.is_null() {
            break;
        }
        // SAFETY: dev comes from the list; the name is NUL-terminated and lives with the list.
        let name_ptr = unsafe { (v.get_device_name)(dev) };
        if name_ptr.is_null() {
            continue;
        }
        // SAFETY: non-NULL, NUL-terminated.
        let name = unsafe { CStr::from_ptr(name_ptr) }.to_string_lossy().into_owned();
        // SAFETY: dev is valid until the list is freed; the context is closed below.
        let ctx = unsafe { (v.open_device)(dev) };
        if ctx.is_null() {
            tracing::info!("ib: cannot open {name}: {}", std::io::Error::last_os_error());
            continue;
        }
        for port in 1..=MAX_PORTS {
            let mut attr = sys::IbvPortAttr::default();
            // SAFETY: ctx is open; attr is zeroed and larger than the compat struct it fills.
            if check("ibv_query_port", unsafe { (v.query_port)(ctx, port, &mut attr) }).is_err() {
                break;
            }
            let link = match attr.link_layer {
                // Unspecified is what older InfiniBand drivers report.
                0 | sys::IBV_LINK_LAYER_INFINIBAND => Some(LinkLayer::Infiniband),
                sys::IBV_LINK_LAYER_ETHERNET => Some(LinkLayer::Ethernet),
                _ => None,
            };
            let mut gids = Vec::new();
            if link == Some(LinkLayer::Ethernet) {
                for index in 0..attr.gid_tbl_len.clamp(0, MAX_GIDS) {
                    let mut g = sys::IbvGid::default();
                    // SAFETY: ctx open, g a valid out-pointer.
                    let rc = unsafe { (v.query_gid)(ctx, port, index, &mut g) };
                    if rc == 0 && g.raw != [0; 16] {
                        let kind = gid_kind(&name, port, index);
                        gids.push(Gid { index: index as u8, gid: g.raw, kind });
                    }
                }
            }
            ports.push(PortInfo {
                device: name.clone(),
                port,
                active: attr.state == sys::IBV_PORT_ACTIVE,
                link,
                lid: attr.lid,
                mtu: Mtu::from_code(attr.active_mtu),
                gids,
            });
        }
        // SAFETY: opened above, nothing else refers to it.
        unsafe { (v.close_device)(ctx) };
    }
    // SAFETY: the list from ibv_get_device_list, freed once.
    unsafe { (v.free_device_list)(list) };
    Ok(ports)
}

/// Loads the library, discovers and chooses: the usable ports, or why there are none (a missing
/// library is `LibraryMissing`).
pub fn probe(filter: &HcaFilter, gid_index: Option<u8>) -> Result<Vec<Selected>> {
    let v = Verbs::load()?;
    choose(&discover(&v)?, filter, gid_index)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gid(index: u8, last: u8, v4: bool, kind: &str) -> Gid {
        let mut g = [0u8; 16];
        if v4 {
            g[10] = 0xff;
            g[11] = 0xff;
        } else {
            g[0] = 0xfe;
            g[1] = 0x80;
        }
        g[15] = last;
        Gid { index, gid: g, kind: Some(kind.to_string()) }
    }

    fn roce(device: &str, port: u8, gids: Vec<Gid>) -> PortInfo {
        PortInfo {
            device: device.into(),
            port,
            active: true,
            link: Some(LinkLayer::Ethernet),
            lid: 0,
            mtu: Some(Mtu::M1024),
            gids,
        }
    }

    fn ib(device: &str, port: u8, active: bool, lid: u16) -> PortInfo {
        PortInfo {
            device: device.into(),
            port,
            active,
            link: Some(LinkLayer::Infiniband),
            lid,
            mtu: Some(Mtu::M4096),
            gids: vec![],
        }
    }

    #[test]
    fn gid_choice_prefers_roce_v2_ipv4() {
        let table = vec![
            gid(0, 1, false, "IB/RoCE v1"),
            gid(1, 1, false, "RoCE v2"),
            gid(2, 9, true, "IB/RoCE v1"),
            gid(3, 9, true, "RoCE v2"),
        ];
        assert_eq!(pick_gid(&table, None).expect("auto").index, 3);
        assert_eq!(pick_gid(&table[..3], None).expect("auto").index, 1, "RoCE v2 before IPv4 v1");
        assert_eq!(pick_gid(&table[..1], None).expect("auto").index, 0);
        let untyped = vec![Gid { kind: None, ..gid(0, 1, false, "") }, Gid { kind: None, ..gid(4, 9, true, "") }];
        assert_eq!(pick_gid(&untyped, None).expect("auto").index, 4, "IPv4-mapped without sysfs types");
        assert_eq!(pick_gid(&table, Some(0)).expect("forced").index, 0);
        assert!(pick_gid(&table, Some(7)).expect_err("absent").contains("GID index 7"));
        assert!(pick_gid(&[], None).is_err());
    }

    #[test]
    fn choose_explains_why_nothing_is_usable() {
        let all = HcaFilter::default();
        let e = choose(&[], &all, None).expect_err("none");
        assert!(e.to_string().contains("no RDMA device"), "{e}");
        let ports = vec![ib("mlx5_0", 1, false, 5), ib("mlx5_1", 1, true, 0), roce("rxe0", 1, vec![])];
        let e = choose(&ports, &all, None).expect_err("none usable").to_string();
        assert!(e.contains("mlx5_0:1 is not active"), "{e}");
        assert!(e.contains("mlx5_1:1 has LID 0"), "{e}");
        assert!(e.contains("rxe0:1: its GID table is empty"), "{e}");
        let e = choose(&ports, &HcaFilter::parse("bnxt").expect("valid"), None).expect_err("filtered");
        assert!(e.to_string().contains("OCCL_IB_HCA") && e.to_string().contains("mlx5_0:1, mlx5_1:1, rxe0:1"), "{e}");
    }

    #[test]
    fn choose_keeps_usable_ports_in_order() {
        let ports = vec![
            ib("mlx5_0", 1, true, 5),
            ib("mlx5_0", 2, false, 6),
            roce("mlx5_2", 1, vec![gid(0, 1, false, "IB/RoCE v1"), gid(3, 9, true, "RoCE v2")]),
        ];
        let s = choose(&ports, &HcaFilter::default(), None).expect("usable");
        assert_eq!(
            s.iter().map(|s| (s.device.as_str(), s.port, s.gid_index)).collect::<Vec<_>>(),
            vec![("mlx5_0", 1, None), ("mlx5_2", 1, Some(3))]
        );
        let s = choose(&ports, &HcaFilter::parse("^mlx5_0").expect("valid"), Some(0)).expect("usable");
        assert_eq!((s.len(), s[0].gid_index), (1, Some(0)));
    }

    /// Runs discovery against the real library where there is one; no device is a valid answer.
    #[test]
    fn discover_on_this_machine() {
        match Verbs::load() {
            Err(e) => println!("SKIPPED ib discovery because {e}"),
            Ok(v) => match discover(&v) {
                Ok(ports) => {
                    println!("ib discovery: {} port(s): {ports:?}", ports.len());
                    if let Err(e) = choose(&ports, &HcaFilter::default(), None) {
                        assert!(matches!(e, Error::NoDevice(_)), "{e}");
                        println!("ib: {e}");
                    }
                }
                Err(e) => {
                    assert!(matches!(e, Error::NoDevice(_)), "{e}");
                    println!("ib: {e}");
                }
            },
        }
    }
}
