//! Which address a rank's listeners bind (transport, bootstrap tree, RAS mesh): the host's
//! interfaces (`getifaddrs`), the `OCCL_SOCKET_IFNAME` / `NCCL_SOCKET_IFNAME` filter in NCCL's
//! syntax, and the routing lookup that finds the interface reaching the bootstrap root.
//!
//! The rule: `OCCL_SOCKET_ADDR` wins; a root on loopback means a job on one host, which binds
//! loopback; otherwise the filter's interfaces (the one that routes to the root first), or
//! without a filter the address the kernel would send to the root from, never loopback.

use crate::error::{Error, Result};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};

/// The variables that name the interfaces, in order of precedence.
pub const IFNAME_VARS: [&str; 2] = ["OCCL_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"];

/// An interface filter in NCCL's syntax: a comma-separated list of name prefixes (`eth,ib`);
/// `^` in front excludes the listed ones (`^docker,lo`); `=` in front (after any `^`) matches
/// names exactly (`=eth0`, `^=docker0`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IfFilter {
    exclude: bool,
    exact: bool,
    names: Vec<String>,
}

impl IfFilter {
    /// Parses `text`; `var` names the variable in the error.
    pub fn parse(var: &str, text: &str) -> Result<IfFilter> {
        let mut rest = text.trim();
        let exclude = rest.starts_with('^');
        if exclude {
            rest = &rest[1..];
        }
        let exact = rest.starts_with('=');
        if exact {
            rest = &rest[1..];
        }
        let names: Vec<String> = rest.split(',').map(str::trim).filter(|n| !n.is_empty()).map(str::to_string).collect();
        if names.is_empty() {
            return Err(Error::arg(format!(
                "{var}={text:?} names no interface; expected a list such as eth,ib or ^docker,lo or =eth0"
            )));
        }
        if let Some(bad) = names.iter().find(|n| n.contains(|c: char| c.is_whitespace() || c == '^' || c == '=')) {
            return Err(Error::arg(format!(
                "{var}={text:?}: {bad:?} is not an interface name (^ and = go once, in front of the whole list)"
            )));
        }
        Ok(IfFilter { exclude, exact, names })
    }

    /// Whether interface `name` passes the filter.
    pub fn matches(&self, name: &str) -> bool {
        let listed = self.names.iter().any(|n| if self.exact { name == n } else { name.starts_with(n.as_str()) });
        listed != self.exclude
    }
}

/// One address of an interface that is up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Interface {
    pub name: String,
    pub addr: IpAddr,
}

/// IPv6 link-local addresses need a scope id that a peer cannot use: they are left out.
fn usable(addr: &IpAddr) -> bool {
    match addr {
        IpAddr::V4(a) => !a.is_unspecified(),
        IpAddr::V6(a) => !a.is_unspecified() && (a.segments()[0] & 0xffc0) != 0xfe80,
    }
}

/// Every usable address of every interface that is up, in the kernel's order.
pub(crate) fn interfaces() -> Result<Vec<Interface>> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs writes a list head we free below with freeifaddrs.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return Err(Error::sys("getifaddrs (list the network interfaces)", std::io::Error::last_os_error()));
    }
    let mut out = Vec::new();
    let mut p = head;
    while !p.is_null() {
        // SAFETY: p is a node of the list getifaddrs returned, alive until freeifaddrs.
        let ifa = unsafe { &*p };
        p = ifa.ifa_next;
        if ifa.ifa_addr.is_null() || ifa.ifa_name.is_null() || ifa.ifa_flags & libc::IFF_UP as u32 == 0 {
            continue;
        }
        // SAFETY: ifa_addr is non-null and its family says which sockaddr it is.
        let addr = unsafe {
            match i32::from((*ifa.ifa_addr).sa_family) {
                libc::AF_INET => {
                    let sin = &*ifa.ifa_addr.cast::<libc::sockaddr_in>();
                    IpAddr::V4(Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)))
                }
                libc::AF_INET6 => {
                    let sin6 = &*ifa.ifa_addr.cast::<libc::sockaddr_in6>();
                    IpAddr::V6(Ipv6Addr::from(sin6.sin6_addr.s6_addr))
                }
                _ => continue,
            }
        };
        if !usable(&addr) {
            continue;
        }
        // SAFETY: ifa_name is a NUL-terminated string owned by the list.
        let name = unsafe { std::ffi::CStr::from_ptr(ifa.ifa_name) }.to_string_lossy().into_owned();
        out.push(Interface { name, addr });
    }
    // SAFETY: head came from getifaddrs and is freed once.
    unsafe { libc::freeifaddrs(head) };
    Ok(out)
}

/// The address the kernel would send to `root` from: a UDP socket connected to it sends
/// nothing, but its local address is the routing table's answer.
fn route_source(root: SocketAddr) -> Option<IpAddr> {
    let any = match root {
        SocketAddr::V4(_) => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        SocketAddr::V6(_) => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
    };
    let s = UdpSocket::bind((any, 0)).ok()?;
    s.connect(root).ok()?;
    s.local_addr().ok().map(|a| a.ip()).filter(usable)
}

fn loopback_like(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::LOCALHOST),
    }
}

/// NCCL's default preference when nothing else decides: not docker, not loopback.
fn preferred(i: &Interface) -> bool {
    !i.addr.is_loopback() && !i.name.starts_with("docker") && !i.name.starts_with("lo")
}

fn names(ifs: &[Interface]) -> String {
    let mut n: Vec<&str> = ifs.iter().map(|i| i.name.as_str()).collect();
    n.dedup();
    if n.is_empty() {
        "none".into()
    } else {
        n.join(", ")
    }
}

/// The choice itself, from the host's interfaces `ifs` and the routing table's answer `routed`
/// for a job whose bootstrap root is `root` (sans-IO, for the tests).
pub(crate) fn pick(
    filter: Option<(&str, &IfFilter)>,
    root: SocketAddr,
    ifs: &[Interface],
    routed: Option<IpAddr>,
) -> Result<IpAddr> {
    if root.ip().is_loopback() {
        return Ok(loopback_like(root.ip()));
    }
    let same_family = |i: &&Interface| i.addr.is_ipv4() == root.is_ipv4();
    let routed_if = routed.and_then(|r| ifs.iter().find(|i| i.addr == r));
    match filter {
        Some((text, f)) => {
            let allowed: Vec<&Interface> = ifs.iter().filter(|i| f.matches(&i.name)).collect();
            routed_if
                .filter(|i| f.matches(&i.name))
                .or_else(|| allowed.iter().copied().find(same_family))
                .or_else(|| allowed.first().copied())
                .map(|i| i.addr)
                .ok_or_else(|| {
                    Error::arg(format!(
                        "socket interface filter {text:?} ({}) matches no interface with an address; this host has: {}",
                        IFNAME_VARS.join(" / "),
                        names(ifs)
                    ))
                })
        }
        None => routed_if
            .filter(|i| !i.addr.is_loopback())
            .or_else(|| ifs.iter().filter(same_family).find(|i| preferred(i)))
            .or_else(|| ifs.iter().find(|i| !i.addr.is_loopback()))
            .map(|i| i.addr)
            .ok_or_else(|| {
                Error::usage(format!(
                    "the bootstrap root {root} is on another host, but this host has no interface besides loopback \
                     to reach it (interfaces: {})",
                    names(ifs)
                ))
            }),
    }
}

/// The address this rank's listeners bind in a job whose bootstrap root is `root`: `explicit`
/// (`OCCL_SOCKET_ADDR`) if set, else by [`pick`] from this host's interfaces.
pub(crate) fn listen_ip(explicit: Option<IpAddr>, ifname: Option<&str>, root: SocketAddr) -> Result<IpAddr> {
    if let Some(ip) = explicit {
        return Ok(ip);
    }
    if root.ip().is_loopback() {
        return Ok(loopback_like(root.ip()));
    }
    let filter = ifname.map(|t| IfFilter::parse(IFNAME_VARS[0], t).map(|f| (t, f))).transpose()?;
    let ip = pick(filter.as_ref().map(|(t, f)| (*t, f)), root, &interfaces()?, route_source(root))?;
    tracing::debug!("occl: listeners bind {ip} (bootstrap root {root}, interface filter {ifname:?})");
    Ok(ip)
}

/// Where a new bootstrap root listens when no root is known yet (`ncclGetUniqueId`):
/// `explicit` if set, else the first address (IPv4 first) of an interface `ifname` allows,
/// else loopback.
pub(crate) fn root_ip(explicit: Option<IpAddr>, ifname: Option<&str>) -> Result<IpAddr> {
    if let Some(ip) = explicit {
        return Ok(ip);
    }
    let Some(text) = ifname else { return Ok(IpAddr::V4(Ipv4Addr::LOCALHOST)) };
    let f = IfFilter::parse(IFNAME_VARS[0], text)?;
    let ifs = interfaces()?;
    let allowed: Vec<&Interface> = ifs.iter().filter(|i| f.matches(&i.name)).collect();
    allowed.iter().find(|i| i.addr.is_ipv4()).or(allowed.first()).map(|i| i.addr).ok_or_else(|| {
        Error::arg(format!(
            "socket interface filter {text:?} ({}) matches no interface with an address; this host has: {}",
            IFNAME_VARS.join(" / "),
            names(&ifs)
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(text: &str) -> IfFilter {
        IfFilter::parse("OCCL_SOCKET_IFNAME", text).expect(text)
    }

    fn iface(name: &str, addr: &str) -> Interface {
        Interface { name: name.into(), addr: addr.parse().expect("addr") }
    }

    #[test]
    fn ifname_syntax_is_nccls() {
        let prefix = f("eth,ib");
        assert!(prefix.matches("eth0") && prefix.matches("ib1") && prefix.matches("eth"));
        assert!(!prefix.matches("lo") && !prefix.matches("docker0") && !prefix.matches("veth0"));
        let excl = f("^docker,lo");
        assert!(excl.matches("eth0") && excl.matches("veth3"));
        assert!(!excl.matches("docker0") && !excl.matches("lo") && !excl.matches("lo2"));
        let exact = f("=eth0");
        assert!(exact.matches("eth0") && !exact.matches("eth01") && !exact.matches("eth"));
        let both = f("^=docker0");
        assert!(both.matches("docker01") && both.matches("eth0") && !both.matches("docker0"));
        assert_eq!(f(" eth0 , ,ib "), f("eth0,ib"));
        for bad in ["", "^", "=", "^=", ",", "eth0,^lo", "eth 0", "=^eth"] {
            let e = IfFilter::parse("NCCL_SOCKET_IFNAME", bad).expect_err(bad);
            assert_eq!(e.kind(), crate::ErrorKind::InvalidArgument, "{bad}");
            assert!(e.to_string().contains("NCCL_SOCKET_IFNAME"), "{bad}: {e}");
        }
    }

    fn host() -> Vec<Interface> {
        vec![
            iface("lo", "127.0.0.1"),
            iface("docker0", "172.17.0.1"),
            iface("eth0", "10.0.0.5"),
            iface("eth0", "fd00::5"),
            iface("ib0", "192.168.1.5"),
            iface("lo", "::1"),
        ]
    }

    #[test]
    fn the_route_to_the_root_decides_without_a_filter() {
        let root: SocketAddr = "192.168.1.9:29500".parse().expect("root");
        let ip = pick(None, root, &host(), Some("192.168.1.5".parse().expect("ip"))).expect("pick");
        assert_eq!(ip, "192.168.1.5".parse::<IpAddr>().expect("ip"));
        // No route known: the first interface that is neither docker nor loopback, of the root's family.
        assert_eq!(pick(None, root, &host(), None).expect("pick"), "10.0.0.5".parse::<IpAddr>().expect("ip"));
        // A route through loopback for a root elsewhere is never taken.
        let ip = pick(None, root, &host(), Some("127.0.0.1".parse().expect("ip"))).expect("pick");
        assert_eq!(ip, "10.0.0.5".parse::<IpAddr>().expect("ip"));
        let v6: SocketAddr = "[fd00::9]:29500".parse().expect("root");
        assert_eq!(pick(None, v6, &host(), None).expect("pick"), "fd00::5".parse::<IpAddr>().expect("ip"));
        let only_lo = vec![iface("lo", "127.0.0.1")];
        let e = pick(None, root, &only_lo, None).expect_err("loopback only");
        assert!(e.to_string().contains("no interface besides loopback"), "{e}");
    }

    #[test]
    fn a_root_on_loopback_binds_loopback() {
        for (root, want) in [("127.0.0.1:1", "127.0.0.1"), ("[::1]:1", "::1"), ("127.0.1.1:1", "127.0.0.1")] {
            let root: SocketAddr = root.parse().expect("root");
            let got = pick(Some(("eth", &f("eth"))), root, &host(), None).expect("pick");
            assert_eq!(got, want.parse::<IpAddr>().expect("ip"));
            assert_eq!(listen_ip(None, None, root).expect("listen"), want.parse::<IpAddr>().expect("ip"));
        }
    }

    #[test]
    fn the_filter_chooses_among_interfaces() {
        let root: SocketAddr = "10.0.0.9:29500".parse().expect("root");
        let routed = Some("10.0.0.5".parse().expect("ip"));
        let ip = |text: &str| pick(Some((text, &f(text))), root, &host(), routed);
        // The routed interface when the filter allows it, else the first allowed one of the root's family.
        assert_eq!(ip("eth,ib").expect("eth"), "10.0.0.5".parse::<IpAddr>().expect("ip"));
        assert_eq!(ip("ib").expect("ib"), "192.168.1.5".parse::<IpAddr>().expect("ip"));
        assert_eq!(ip("^eth,lo").expect("not eth"), "172.17.0.1".parse::<IpAddr>().expect("ip"));
        assert_eq!(ip("=docker0").expect("docker"), "172.17.0.1".parse::<IpAddr>().expect("ip"));
        let v6: SocketAddr = "[fd00::9]:1".parse().expect("root");
        assert_eq!(
            pick(Some(("eth", &f("eth"))), v6, &host(), None).expect("v6"),
            "fd00::5".parse::<IpAddr>().expect("ip")
        );
        // Only the other family left: taken.
        assert_eq!(ip("=lo").expect("lo"), "127.0.0.1".parse::<IpAddr>().expect("ip"));
        let e = ip("=eth1").expect_err("no such interface");
        assert_eq!(e.kind(), crate::ErrorKind::InvalidArgument);
        let msg = e.to_string();
        assert!(msg.contains("\"=eth1\"") && msg.contains("lo, docker0, eth0, ib0, lo"), "{msg}");
        assert_eq!(
            listen_ip(Some("10.1.1.1".parse().expect("ip")), Some("=eth1"), root).expect("explicit"),
            "10.1.1.1".parse::<IpAddr>().expect("ip")
        );
    }

    #[test]
    fn the_kernel_lists_loopback_and_routes_to_it() {
        let ifs = interfaces().expect("getifaddrs");
        assert!(ifs.iter().any(|i| i.addr == IpAddr::V4(Ipv4Addr::LOCALHOST)), "{ifs:?}");
        assert!(ifs.iter().all(|i| usable(&i.addr)), "{ifs:?}");
        assert_eq!(route_source("127.0.0.1:9".parse().expect("root")), Some(IpAddr::V4(Ipv4Addr::LOCALHOST)));
        assert_eq!(root_ip(None, None).expect("root"), IpAddr::V4(Ipv4Addr::LOCALHOST));
        assert_eq!(root_ip(None, Some("=lo")).expect("lo"), IpAddr::V4(Ipv4Addr::LOCALHOST));
        assert!(root_ip(None, Some("=no-such-if0")).is_err());
    }
}
