//! Two "nodes" on one machine: network namespaces that a test creates and joins with veth pairs (root and
//! iproute2 needed; `usable` says why not), removed when the value drops. A rank runs on a node through
//! `ip netns exec`, with its own UTS namespace and host name (`node_shell`), so that occl sees two hosts.

use std::io::Write;
use std::process::Command;

pub struct Netns {
    pub a: String,
    pub b: String,
}

/// `ip args…`, its stderr as the error.
pub fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip").args(args).output().map_err(|e| format!("ip: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!("ip {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim()))
    }
}

/// `None` when namespaces can be made here, else why not (after printing `SKIPPED test: why` past the
/// harness's capture).
pub fn unusable(test: &str) -> Option<String> {
    // SAFETY: geteuid has no preconditions.
    let why = if unsafe { libc::geteuid() } != 0 {
        "needs root"
    } else if Command::new("ip").arg("-V").output().is_err() {
        "needs iproute2 (ip netns)"
    } else if Command::new("unshare").arg("--version").output().is_err() {
        "needs util-linux (unshare)"
    } else {
        return None;
    };
    let _ = writeln!(std::io::stderr(), "SKIPPED {test}: {why}");
    Some(why.to_string())
}

impl Netns {
    /// Two namespaces, `<prefix>A<tag>` and `<prefix>B<tag>`, with loopback up and no link yet.
    pub fn pair(prefix: &str, tag: u32) -> Result<Netns, String> {
        let n = Netns { a: format!("{prefix}A{tag}"), b: format!("{prefix}B{tag}") };
        ip(&["netns", "add", &n.a])?;
        ip(&["netns", "add", &n.b])?;
        for ns in [&n.a, &n.b] {
            ip(&["-n", ns, "link", "set", "lo", "up"])?;
        }
        Ok(n)
    }

    /// A veth pair `dev_a` (in a, address `addr_a` with its prefix length) to `dev_b` (in b, `addr_b`), up.
    /// IPv6 addresses skip duplicate address detection, so they are usable at once.
    pub fn link(&self, (dev_a, addr_a): (&str, &str), (dev_b, addr_b): (&str, &str)) -> Result<(), String> {
        ip(&["link", "add", dev_a, "type", "veth", "peer", "name", dev_b])?;
        for (ns, dev, addr) in [(&self.a, dev_a, addr_a), (&self.b, dev_b, addr_b)] {
            ip(&["link", "set", dev, "netns", ns])?;
            let mut args = vec!["-n", ns.as_str(), "addr", "add", addr, "dev", dev];
            if addr.contains(':') {
                args.push("nodad");
            }
            ip(&args)?;
            ip(&["-n", ns, "link", "set", dev, "up"])?;
        }
        Ok(())
    }

    /// nsA (10.77.x.1) and nsB (10.77.x.2) joined by veth `oca<tag>`–`ocb<tag>`.
    pub fn create(tag: u32) -> Result<Netns, String> {
        let n = Netns::pair("occl", tag)?;
        let net = 10 + tag % 200;
        n.link(
            (&format!("oca{tag}"), &format!("10.77.{net}.1/24")),
            (&format!("ocb{tag}"), &format!("10.77.{net}.2/24")),
        )?;
        Ok(n)
    }

    pub fn cut(&self, tag: u32) -> Result<(), String> {
        ip(&["-n", &self.a, "link", "set", &format!("oca{tag}"), "down"])
    }

    /// Bytes interface `dev` of namespace `ns` has sent.
    pub fn tx_bytes(ns: &str, dev: &str) -> Result<u64, String> {
        let out = Command::new("ip")
            .args(["-n", ns, "-s", "-j", "link", "show", "dev", dev])
            .output()
            .map_err(|e| format!("ip: {e}"))?;
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).map_err(|e| format!("ip -j: {e}"))?;
        v[0]["stats64"]["tx"]["bytes"].as_u64().ok_or_else(|| format!("no tx bytes for {dev} in {v}"))
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = ip(&["netns", "del", &self.a]);
        let _ = ip(&["netns", "del", &self.b]);
    }
}

/// Runs `f` on a thread inside namespace `ns` (sockets it creates live there; processes it starts start there).
pub fn in_netns<T: Send>(ns: &str, f: impl FnOnce() -> T + Send) -> T {
    std::thread::scope(|sc| {
        sc.spawn(|| {
            let file = std::fs::File::open(format!("/var/run/netns/{ns}")).expect("open netns");
            // SAFETY: setns on a valid namespace fd affects only this thread.
            let rc = unsafe { libc::setns(std::os::fd::AsRawFd::as_raw_fd(&file), libc::CLONE_NEWNET) };
            assert_eq!(rc, 0, "setns {ns}: {}", std::io::Error::last_os_error());
            f()
        })
        .join()
        .expect("netns thread")
    })
}

/// `/bin/sh` arguments that run `program args…` on a node: in namespace `$OCCL_TEST_NETNS` with host name
/// `$OCCL_TEST_NODE` (its own UTS namespace); the two variables are the test's, read by the shell only.
pub fn node_shell(program: &str, args: &[&str]) -> Vec<String> {
    let script = "exec ip netns exec \"$OCCL_TEST_NETNS\" unshare --uts /bin/sh -c \
                  'hostname \"$OCCL_TEST_NODE\" && exec \"$0\" \"$@\"' \"$0\" \"$@\"";
    ["-c", script, program].iter().chain(args).map(|s| s.to_string()).collect()
}
