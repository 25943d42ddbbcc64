//! Which algorithms and protocols the tuner may choose: `OCCL_ALGO` / `OCCL_PROTO` (or
//! `NCCL_ALGO` / `NCCL_PROTO`) in NCCL's syntax (2.24+):
//!
//! ```text
//! ring,tree                      only these, for every collective
//! ^tree                          everything but these
//! ring;allreduce:tree            ring everywhere, but only tree for all-reduce
//! allreduce:^oneshot;allgather:pat
//! ```
//!
//! Entries are `;`-separated; only the first may omit the `collective:` prefix, and it applies
//! to all five collectives (broadcast, reduce, allgather, reducescatter, allreduce); a prefixed
//! entry replaces that collective's list. Lists are `,`-separated; a leading `^` excludes them
//! instead. Names are case-insensitive. NCCL's algorithms that occl does not run (collnetdirect,
//! collnetchain, nvls, nvlstree) and protocol LL128 are accepted and simply never chosen (LL runs
//! on shm only: see `Tuner::protocols`); a name neither knows is an error. All-to-all and send/recv take no part (they are direct).

use crate::error::{Error, Result};

/// Algorithm names: occl's (ring, tree, pat, and its own oneshot), then NCCL's others.
pub(crate) const ALGOS: [&str; 9] =
    ["ring", "tree", "pat", "oneshot", "collnetdirect", "collnetchain", "nvls", "nvlstree", "twoshot"];
/// Protocol names: NCCL's three.
pub(crate) const PROTOS: [&str; 3] = ["simple", "ll", "ll128"];
/// The collectives a list may name, indexed like `CollType` (NCCL's `ncclFunc_t`).
pub(crate) const FUNCS: [&str; 5] = ["broadcast", "reduce", "allgather", "reducescatter", "allreduce"];

/// Per collective, a bit per name: enabled or not.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct List {
    /// The variable and its text, for messages (`None`: not set, everything enabled).
    pub source: Option<(String, String)>,
    masks: [u32; 5],
}

impl List {
    /// Everything enabled (the variable is not set).
    pub(crate) fn all(names: &[&str]) -> List {
        List { source: None, masks: [(1u32 << names.len()) - 1; 5] }
    }

    /// Whether `name` (one of `names`) is enabled for collective `func` (a `FUNCS` index).
    pub(crate) fn allows(&self, func: usize, bit: usize) -> bool {
        self.masks.get(func).is_some_and(|m| m & (1 << bit) != 0)
    }

    /// Parses `text` (from variable `var`) over `names` in NCCL's syntax.
    pub(crate) fn parse(var: &str, text: &str, names: &[&str]) -> Result<List> {
        let all = (1u32 << names.len()) - 1;
        let mut masks = [all; 5];
        let bad = |what: String| Error::usage(format!("{var}={text:?}: {what}"));
        for (i, entry) in text.split(';').map(str::trim).enumerate() {
            if entry.is_empty() {
                continue;
            }
            let (prefix, list) = match entry.split_once(':') {
                Some((p, l)) => (Some(p.trim()), l.trim()),
                None if i == 0 => (None, entry),
                None => {
                    return Err(bad(format!(
                        "entry {entry:?} needs a collective prefix (only the first entry may omit it), e.g. allreduce:{entry}"
                    )))
                }
            };
            let funcs: Vec<usize> = match prefix {
                None => (0..FUNCS.len()).collect(),
                Some(p) => match FUNCS.iter().position(|f| f.eq_ignore_ascii_case(p)) {
                    Some(f) => vec![f],
                    None => return Err(bad(format!("unknown collective {p:?}; prefixes are {}", FUNCS.join(", ")))),
                },
            };
            let (exclude, list) = match list.strip_prefix('^') {
                Some(rest) => (true, rest),
                None => (false, list),
            };
            let mut picked = 0u32;
            for name in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
                match names.iter().position(|n| n.eq_ignore_ascii_case(name)) {
                    Some(b) => picked |= 1 << b,
                    None => return Err(bad(format!("unknown name {name:?}; known are {}", names.join(", ")))),
                }
            }
            for f in funcs {
                masks[f] = if exclude { all & !picked } else { picked };
            }
        }
        Ok(List { source: Some((var.to_string(), text.to_string())), masks })
    }

    /// `VAR="text"` for messages, or a note that nothing was forced.
    pub(crate) fn describe(&self) -> String {
        match &self.source {
            Some((v, t)) => format!("{v}={t:?}"),
            None => "no forcing variable".to_string(),
        }
    }

    /// A stable digest (ranks compare them at init).
    pub(crate) fn digest(&self) -> u64 {
        self.masks.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &m| (h ^ u64::from(m)).wrapping_mul(0x100_0000_01b3))
    }
}

/// The algorithm and protocol lists of a communicator.
#[derive(Clone, Debug)]
pub(crate) struct Policy {
    pub algos: List,
    pub protos: List,
}

impl Policy {
    /// From the configuration's `algo` and `proto` (`OCCL_ALGO` / `OCCL_PROTO` or their NCCL_
    /// spellings).
    pub(crate) fn new(algo: Option<&str>, proto: Option<&str>) -> Result<Policy> {
        Ok(Policy {
            algos: match algo {
                Some(t) => List::parse("OCCL_ALGO", t, &ALGOS)?,
                None => List::all(&ALGOS),
            },
            protos: match proto {
                Some(t) => List::parse("OCCL_PROTO", t, &PROTOS)?,
                None => List::all(&PROTOS),
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn algos(text: &str) -> List {
        List::parse("OCCL_ALGO", text, &ALGOS).expect("parses")
    }
    const RING: usize = 0;
    const TREE: usize = 1;
    const PAT: usize = 2;
    const AR: usize = 4;
    const AG: usize = 2;

    #[test]
    fn nccl_syntax() {
        let l = algos("ring,tree");
        assert!(l.allows(AR, RING) && l.allows(AR, TREE) && !l.allows(AR, PAT) && l.allows(0, TREE));
        let l = algos("^tree");
        assert!(!l.allows(AR, TREE) && l.allows(AR, RING) && l.allows(AG, PAT) && !l.allows(1, TREE));
        let l = algos("ring;allreduce:tree");
        assert!(l.allows(AG, RING) && !l.allows(AG, PAT) && l.allows(AR, TREE) && !l.allows(AR, RING));
        let l = algos("AllReduce:^OneShot ; allgather:pat");
        assert!(l.allows(AR, RING) && !l.allows(AR, 3) && l.allows(AG, PAT) && !l.allows(AG, RING));
        assert!(l.allows(0, RING) && l.allows(3, PAT), "unnamed collectives keep everything");
        let p = List::parse("NCCL_PROTO", "^LL128;allreduce:LL128", &PROTOS).expect("parses");
        assert!(p.allows(0, 0) && p.allows(0, 1) && !p.allows(0, 2) && p.allows(AR, 2) && !p.allows(AR, 0));
    }

    #[test]
    fn bad_lists_name_what_is_accepted() {
        let e = List::parse("OCCL_ALGO", "ring,bogus", &ALGOS).unwrap_err();
        assert_eq!(e.kind(), crate::ErrorKind::InvalidUsage);
        assert!(e.to_string().contains("\"bogus\"") && e.to_string().contains("ring, tree, pat"), "{e}");
        let e = List::parse("OCCL_ALGO", "allreduce:tree;ring", &ALGOS).unwrap_err();
        assert!(e.to_string().contains("needs a collective prefix"), "{e}");
        let e = List::parse("OCCL_ALGO", "alltoall:ring", &ALGOS).unwrap_err();
        assert!(e.to_string().contains("allreduce"), "{e}");
    }
}
