//! `OCCL_IB_HCA` (also `NCCL_IB_HCA`): which device ports the ib transport may use, in NCCL's
//! syntax. A comma-separated list of `name[:port]` entries; a name matches devices whose name
//! starts with it, unless the list begins with `=` (exact names). A leading `^` turns the list
//! into an exclusion list (`^` comes before `=` when both are given: `^=mlx5_1`).

use crate::error::{Error, Result};

/// One `name[:port]` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HcaEntry {
    pub name: String,
    /// `None`: every port of the device.
    pub port: Option<u8>,
}

/// A parsed HCA list. `HcaFilter::default()` lets every port through.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HcaFilter {
    /// `^`: the entries name ports to leave out.
    pub exclude: bool,
    /// `=`: names match exactly, not as prefixes.
    pub exact: bool,
    /// Empty only for the default filter.
    pub entries: Vec<HcaEntry>,
}

impl HcaFilter {
    /// Parses a list; an empty entry, an empty name, a bad port or an empty list is an error
    /// that names the value.
    pub fn parse(value: &str) -> Result<HcaFilter> {
        let bad = |why: &str| Error::HcaSyntax { value: value.to_string(), why: why.to_string() };
        let mut rest = value.trim();
        let exclude = rest.starts_with('^');
        if exclude {
            rest = rest[1..].trim_start();
        }
        let exact = rest.starts_with('=');
        if exact {
            rest = rest[1..].trim_start();
        }
        if rest.is_empty() {
            return Err(bad("no device named"));
        }
        let mut entries = Vec::new();
        for item in rest.split(',') {
            let item = item.trim();
            if item.is_empty() {
                return Err(bad("an empty entry (two commas, or a comma at an end)"));
            }
            let (name, port) = match item.split_once(':') {
                None => (item, None),
                Some((n, p)) => {
                    let port: u8 = p
                        .trim()
                        .parse()
                        .map_err(|_| bad(&format!("port {p:?} of {n:?} is not a number from 1 to 255")))?;
                    if port == 0 {
                        return Err(bad(&format!("port 0 of {n:?}: ports count from 1")));
                    }
                    (n.trim(), Some(port))
                }
            };
            if name.is_empty() {
                return Err(bad(&format!("entry {item:?} has no device name")));
            }
            if name.contains(|c: char| c.is_whitespace() || c == '^' || c == '=') {
                return Err(bad(&format!("device name {name:?} has a space, '^' or '='")));
            }
            entries.push(HcaEntry { name: name.to_string(), port });
        }
        Ok(HcaFilter { exclude, exact, entries })
    }

    /// Whether the list names this port (ignoring `^`).
    fn names(&self, device: &str, port: u8) -> bool {
        self.entries.iter().any(|e| {
            let name_ok = if self.exact { device == e.name } else { device.starts_with(&e.name) };
            name_ok && e.port.is_none_or(|p| p == port)
        })
    }

    /// Whether `device:port` may be used.
    pub fn allows(&self, device: &str, port: u8) -> bool {
        if self.entries.is_empty() {
            return true;
        }
        self.names(device, port) != self.exclude
    }

    /// The `(device, port)` pairs this filter lets through, in their order.
    pub fn filter<T: AsRef<str> + Clone>(&self, ports: &[(T, u8)]) -> Vec<(T, u8)> {
        ports.iter().filter(|(d, p)| self.allows(d.as_ref(), *p)).cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ports() -> Vec<(&'static str, u8)> {
        vec![("mlx5_0", 1), ("mlx5_1", 1), ("mlx5_1", 2), ("mlx5_10", 1), ("bnxt_re0", 1)]
    }

    fn pass(spec: &str) -> Vec<(&'static str, u8)> {
        HcaFilter::parse(spec).expect(spec).filter(&ports())
    }

    #[test]
    fn default_lets_everything_through() {
        assert_eq!(HcaFilter::default().filter(&ports()), ports());
    }

    #[test]
    fn prefix_match_is_the_default() {
        assert_eq!(pass("mlx5"), vec![("mlx5_0", 1), ("mlx5_1", 1), ("mlx5_1", 2), ("mlx5_10", 1)]);
        // mlx5_1 is also a prefix of mlx5_10.
        assert_eq!(pass("mlx5_1"), vec![("mlx5_1", 1), ("mlx5_1", 2), ("mlx5_10", 1)]);
        assert_eq!(pass("mlx5_0,bnxt"), vec![("mlx5_0", 1), ("bnxt_re0", 1)]);
    }

    #[test]
    fn exact_match_with_equals() {
        assert_eq!(pass("=mlx5_1"), vec![("mlx5_1", 1), ("mlx5_1", 2)]);
        assert_eq!(pass("=mlx5"), vec![]);
    }

    #[test]
    fn port_restricts_the_entry() {
        assert_eq!(pass("mlx5_1:2"), vec![("mlx5_1", 2)]);
        assert_eq!(pass("=mlx5_1:1,mlx5_0:1"), vec![("mlx5_0", 1), ("mlx5_1", 1)]);
        assert_eq!(pass(" mlx5_0 : 1 , bnxt_re0 "), vec![("mlx5_0", 1), ("bnxt_re0", 1)]);
    }

    #[test]
    fn caret_excludes() {
        assert_eq!(pass("^mlx5"), vec![("bnxt_re0", 1)]);
        assert_eq!(pass("^mlx5_1:2"), vec![("mlx5_0", 1), ("mlx5_1", 1), ("mlx5_10", 1), ("bnxt_re0", 1)]);
        assert_eq!(pass("^=mlx5_1"), vec![("mlx5_0", 1), ("mlx5_10", 1), ("bnxt_re0", 1)]);
        let f = HcaFilter::parse("^=mlx5_1:2").expect("valid");
        assert!(f.exclude && f.exact);
        assert_eq!(f.entries, vec![HcaEntry { name: "mlx5_1".into(), port: Some(2) }]);
    }

    #[test]
    fn malformed_lists_are_errors_that_name_the_value() {
        for spec in [
            "",
            "^",
            "=",
            "^=",
            "mlx5_0,,mlx5_1",
            "mlx5_0,",
            ",mlx5_0",
            ":1",
            "mlx5_0:",
            "mlx5_0:x",
            "mlx5_0:0",
            "mlx5_0:256",
            "mlx5_0:1:2",
            "=^mlx5_0",
            "mlx 5",
        ] {
            let e = HcaFilter::parse(spec).expect_err(spec);
            assert!(matches!(&e, Error::HcaSyntax { value, .. } if value == spec), "{spec:?}: {e}");
            assert!(e.to_string().contains("malformed HCA list"), "{e}");
        }
    }
}
