//! `OCCL_TUNER_FILE`: the cost model's constants, one per line, over the defaults.
//!
//! ```text
//! # comments and blank lines are ignored
//! shm.alpha_us = 0.5                       # latency of one step (µs) on a link
//! shm.gamma_us = 0.1                       # cost of one more message for the rank handling it
//! tcp.gbps = 2.0                           # bytes through one rank (GB/s)
//! shm.ll.alpha_us = 0.2                    # the same two for the LL protocol
//! shm.ll.gbps = 1.0
//! tcp.allreduce.tree.base_us = 3           # fixed cost of one (collective, algorithm)
//! shm-shared.allgather.pat.simple.scale = 1.2   # factor on its byte term (protocol optional)
//! tcp.allreduce.oneshot.peer_us = 30       # cost per rank beyond two
//! ```
//!
//! Links are `shm`, `tcp` (also a mix of shm and tcp) and `shm-shared`, `tcp-shared` (the same
//! with more ranks on a host than cores); collectives `broadcast reduce allgather reducescatter
//! allreduce`; algorithms `ring tree pat oneshot`; the protocol, if named, `simple` or `ll`. An
//! unknown key or a value that is
//! not a finite non-negative number (positive for `gbps` and `scale`) is an error naming the line.

use super::model::{Consts, Link, MODELLED};
use crate::config::policy::FUNCS;
use crate::error::{Error, Result};
use std::path::Path;
use std::sync::OnceLock;

/// The defaults with `path`'s settings applied. The file is read up to 1 MiB (a real one is a
/// few hundred bytes): a path such as `/dev/zero` is an error, not an endless read.
pub(crate) fn load(path: &Path) -> Result<Consts> {
    use occl_telemetry::files::{read_to_string_capped, MAX_CONFIG_FILE};
    let text = read_to_string_capped(path, MAX_CONFIG_FILE).map_err(|e| match e.kind() {
        // Too large, or not text: the file is wrong, not the system.
        std::io::ErrorKind::InvalidData => Error::arg(format!("OCCL_TUNER_FILE {}: {e}", path.display())),
        _ => Error::sys(format!("reading OCCL_TUNER_FILE {}", path.display()), e),
    })?;
    parse(&text).map_err(|e| Error::arg(format!("OCCL_TUNER_FILE {}: {e}", path.display())))
}

/// Applies `text` over the defaults; the error names the line.
pub(crate) fn parse(text: &str) -> std::result::Result<Consts, String> {
    apply(Consts::default(), text)
}

/// Applies `text` over `base` (the defaults themselves are `defaults.conf` over
/// `Consts::blank`); the error names the line.
pub(crate) fn apply(base: Consts, text: &str) -> std::result::Result<Consts, String> {
    let mut c = base;
    for (i, raw) in text.lines().enumerate() {
        let line = raw.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let at = |what: String| format!("line {}: {what}: {raw:?}", i + 1);
        let (key, value) = line.split_once('=').ok_or_else(|| at("expected key = value".into()))?;
        let value: f64 = value.trim().parse().map_err(|_| at("the value is not a number".into()))?;
        let parts: Vec<&str> = key.trim().split('.').collect();
        let link = Link::ALL
            .iter()
            .position(|l| l.name() == parts[0])
            .ok_or_else(|| at("the key must start with shm, shm-shared, tcp or tcp-shared".into()))?;
        let param = *parts.last().unwrap_or(&"");
        let positive = matches!(param, "gbps" | "scale");
        if !value.is_finite() || value < 0.0 || (positive && value <= 0.0) {
            return Err(at(format!(
                "{param} must be a finite {} number",
                if positive { "positive" } else { "non-negative" }
            )));
        }
        match parts.as_slice() {
            [_, "alpha_us"] => c.links[link].alpha_us = value,
            [_, "gamma_us"] => c.links[link].gamma_us = value,
            [_, "gbps"] => c.links[link].gbps = value,
            [_, "ll", "alpha_us"] => c.links[link].ll_alpha_us = value,
            [_, "ll", "gbps"] => c.links[link].ll_gbps = value,
            [_, coll, algo, "base_us" | "scale" | "peer_us"]
            | [_, coll, algo, "simple" | "ll", "base_us" | "scale" | "peer_us"] => {
                let proto = usize::from(parts.len() == 5 && parts[3] == "ll");
                let f =
                    FUNCS.iter().position(|f| f == coll).ok_or_else(|| at(format!("unknown collective {coll:?}")))?;
                let a =
                    MODELLED.iter().position(|a| a == algo).ok_or_else(|| at(format!("unknown algorithm {algo:?}")))?;
                let adj = &mut c.adj[link][f][a][proto];
                match param {
                    "base_us" => adj.base_us = value,
                    "peer_us" => adj.peer_us = value,
                    _ => adj.scale = value,
                }
            }
            _ => return Err(at("unknown key".into())),
        }
    }
    Ok(c)
}

/// The built-in constants, in `OCCL_TUNER_FILE`'s format: `defaults.conf`, whose header names the
/// command that fits them. `apply` reads it over `Consts::blank`.
pub(crate) const DEFAULTS: &str = include_str!("defaults.conf");

impl Default for Consts {
    /// `defaults.conf`, parsed once. It is part of the library, not input: the unit test
    /// `the_embedded_defaults_parse_and_are_the_fitted_constants` parses it, so this cannot fail.
    fn default() -> Self {
        static PARSED: OnceLock<Consts> = OnceLock::new();
        PARSED
            .get_or_init(|| {
                apply(Consts::blank(), DEFAULTS).unwrap_or_else(|e| panic!("core/src/coll/tune/defaults.conf: {e}"))
            })
            .clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The digest of the constants the tuner was fitted with. A change to `defaults.conf` changes
    /// it on purpose: refit (the file's header), check (bench/baselines/algos-sweep.md), update.
    const FITTED_DIGEST: u64 = 0xcea0_e042_1395_f804;

    #[test]
    fn the_embedded_defaults_parse_and_are_the_fitted_constants() {
        let c = apply(Consts::blank(), DEFAULTS).expect("defaults.conf parses");
        for (l, name) in c.links.iter().zip(Link::ALL.map(Link::name)) {
            assert!(l.alpha_us > 0.0 && l.ll_alpha_us > 0.0, "{name}: every latency is set");
            assert!(l.gbps > 0.0 && l.ll_gbps > 0.0, "{name}: every bandwidth is set");
        }
        assert_eq!(c.digest(), FITTED_DIGEST);
        assert_eq!(Consts::default(), c);
        // Each setting once: a second line for a key would silently win over the first.
        let keys: Vec<&str> =
            DEFAULTS.lines().filter_map(|l| l.split('#').next()?.split_once('=').map(|(k, _)| k.trim())).collect();
        let mut unique = keys.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), keys.len(), "a key is set twice in defaults.conf");
    }

    #[test]
    fn settings_apply_over_the_defaults() {
        let c = parse("# tuned\nshm.alpha_us = 0.25\ntcp.gbps=3 # inline\n\ntcp.allreduce.tree.base_us = 4\nshm-shared.allgather.pat.simple.scale = 1.5\n")
            .expect("parses");
        let d = Consts::default();
        assert_eq!(c.links[0].alpha_us, 0.25);
        assert_eq!(c.links[2].gbps, 3.0);
        assert_eq!(c.links[1], d.links[1]);
        assert_eq!(c.adj[2][4][1][0].base_us, 4.0);
        assert_eq!(c.adj[1][2][2][0].scale, 1.5);
        let c = parse("tcp.allreduce.oneshot.peer_us = 7").expect("parses");
        assert_eq!(c.adj[2][4][3][0].peer_us, 7.0);
        let c = parse("shm.ll.alpha_us = 0.1\nshm.allreduce.ring.ll.base_us = 2\nshm.ll.gbps = 0.8").expect("parses");
        assert_eq!((c.links[0].ll_alpha_us, c.links[0].ll_gbps), (0.1, 0.8));
        assert_eq!((c.adj[0][4][0][1].base_us, c.adj[0][4][0][0].base_us), (2.0, 0.0));
        assert_ne!(c.digest(), d.digest());
    }

    #[test]
    fn mistakes_name_the_line() {
        for (text, want) in [
            ("shm.alpha = 1", "line 1: unknown key"),
            ("\nnvlink.alpha_us = 1", "line 2"),
            ("tcp.gbps = 0", "positive"),
            ("tcp.alpha_us = -1", "non-negative"),
            ("tcp.alpha_us = fast", "not a number"),
            ("tcp.allreduce.nvls.scale = 1", "unknown algorithm"),
            ("tcp.alltoall.ring.scale = 1", "unknown collective"),
            ("tcp.allreduce.ring.ll128.scale = 1", "unknown key"),
            ("shm alpha_us 1", "key = value"),
        ] {
            let e = parse(text).expect_err(text);
            assert!(e.contains(want), "{text:?}: {e}");
        }
    }

    /// `OCCL_TUNER_FILE=/dev/zero` read forever (380 MB/s of memory); a huge file the same.
    #[test]
    fn an_endless_or_huge_file_is_refused_by_size() {
        let e = load(Path::new("/dev/zero")).expect_err("endless");
        assert_eq!(e.kind(), crate::ErrorKind::InvalidArgument, "{e}");
        assert!(e.to_string().contains("OCCL_TUNER_FILE /dev/zero") && e.to_string().contains("1 MiB"), "{e}");
        let e = load(Path::new("/nonexistent/tuner.conf")).expect_err("missing");
        assert_eq!(e.kind(), crate::ErrorKind::SystemError, "{e}");
    }
}
