//! NCCL's spellings as static C strings, and the numeric codes v1 plugins receive instead.
//!
//! Descriptors carry `const char*` that must outlive the plugin's copy (NCCL passes literals
//! inside libnccl), so every string we hand out is `&'static CStr`. A spelling we do not know
//! becomes "Unknown" rather than a pointer to the emitter's temporary.

use std::ffi::CStr;

/// One known spelling: its C string and its v1 code (where v1 has one).
struct Name {
    text: &'static str,
    c: &'static CStr,
    code: u8,
}

const fn n(c: &'static CStr, code: u8) -> Name {
    let text = match c.to_str() {
        Ok(s) => s,
        Err(_) => panic!("NCCL's spellings are ASCII"),
    };
    Name { text, c, code }
}

/// NCCL's `ncclFunc_t` spellings; codes are v1's (`ncclFuncBroadcast` 0 … `ncclFuncRecv` 7).
/// Functions v1 did not know get v1's fallback, Send (6), as NCCL's v1 adapter does.
const FUNCS: &[Name] = &[
    n(c"Broadcast", 0),
    n(c"Reduce", 1),
    n(c"AllGather", 2),
    n(c"ReduceScatter", 3),
    n(c"AllReduce", 4),
    n(c"SendRecv", 5),
    n(c"Send", 6),
    n(c"Recv", 7),
    n(c"AlltoAll", 6),
    n(c"Gather", 6),
    n(c"Scatter", 6),
];

/// `ncclDataType_t` spellings; codes are `ncclInt8` 0 … `ncclBfloat16` 9; newer types get v1's
/// fallback, Float64 (8).
const DATATYPES: &[Name] = &[
    n(c"ncclInt8", 0),
    n(c"ncclUint8", 1),
    n(c"ncclInt32", 2),
    n(c"ncclUint32", 3),
    n(c"ncclInt64", 4),
    n(c"ncclUint64", 5),
    n(c"ncclFloat16", 6),
    n(c"ncclFloat32", 7),
    n(c"ncclFloat64", 8),
    n(c"ncclBfloat16", 9),
    n(c"ncclFloat8e4m3", 8),
    n(c"ncclFloat8e5m2", 8),
];

/// Algorithm spellings; codes Tree 0 … PAT 6; unknown gets v1's fallback, PAT.
const ALGOS: &[Name] = &[
    n(c"TREE", 0),
    n(c"RING", 1),
    n(c"COLLNET_DIRECT", 2),
    n(c"COLLNET_CHAIN", 3),
    n(c"NVLS", 4),
    n(c"NVLS_TREE", 5),
    n(c"PAT", 6),
];

/// Protocol spellings; codes LL 0, LL128 1, Simple 2 (also v1's fallback).
const PROTOS: &[Name] = &[n(c"LL", 0), n(c"LL128", 1), n(c"SIMPLE", 2)];

/// CE sync strategies (v6; no v1 code).
const SYNC_STRATEGIES: &[Name] = &[n(c"MC", 0), n(c"UC", 0)];

const UNKNOWN: &CStr = c"Unknown";

/// The descriptor field a string belongs to: which table spells it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Field {
    Func,
    Datatype,
    Algo,
    Proto,
    SyncStrategy,
}

impl Field {
    /// The field's spellings, and the v1 code of a spelling not among them.
    fn table(self) -> (&'static [Name], u8) {
        match self {
            Field::Func => (FUNCS, 6),
            Field::Datatype => (DATATYPES, 8),
            Field::Algo => (ALGOS, 6),
            Field::Proto => (PROTOS, 2),
            Field::SyncStrategy => (SYNC_STRATEGIES, 0),
        }
    }
}

/// Exact spelling first; otherwise ASCII case-insensitively, so "Ring" or "simple" from a tuner
/// still maps to NCCL's spelling.
fn find(table: &'static [Name], s: &str) -> Option<&'static Name> {
    table.iter().find(|x| x.text == s).or_else(|| table.iter().find(|x| x.text.eq_ignore_ascii_case(s)))
}

/// `s` as spelled in `field`'s table, compared exactly: the fast path of [`known`] for a caller
/// that knows the field (a handful of comparisons instead of every table twice).
pub fn exact(field: Field, s: &str) -> Option<&'static str> {
    field.table().0.iter().find(|x| x.text == s).map(|x| x.text)
}

/// NCCL's own spelling of `s` (exactly, or ASCII case-insensitively) from any of the tables, as
/// a `'static` string: what a sink that keeps names uses instead of copying them.
pub fn known(s: &str) -> Option<&'static str> {
    [FUNCS, DATATYPES, ALGOS, PROTOS, SYNC_STRATEGIES].into_iter().find_map(|t| find(t, s)).map(|x| x.text)
}

/// The C string a descriptor carries for `s` in `field` (`coll.func`, `collApi.datatype` …);
/// "Unknown" for a spelling NCCL does not have.
pub fn c_str(field: Field, s: &str) -> &'static CStr {
    find(field.table().0, s).map_or(UNKNOWN, |x| x.c)
}

/// The v1 code of `s` in `field`, or the field's fallback code.
pub fn code(field: Field, s: &str) -> u8 {
    let (table, fallback) = field.table();
    find(table, s).map_or(fallback, |x| x.code)
}

/// The spelling of a v1 code: the first entry of the field's table with that code (the tables
/// list v1's own names before the later names that share a fallback code); "Unknown" when none
/// has it.
pub fn of_code(field: Field, code: u8) -> &'static str {
    field.table().0.iter().find(|x| x.code == code).map_or("Unknown", |x| x.text)
}

/// v1 `isCollnet`: the algorithm is one of the CollNet ones.
pub fn is_collnet(algo: &str) -> bool {
    matches!(find(ALGOS, algo).map(|x| x.code), Some(2 | 3))
}

/// v1 `isNvls`: the algorithm is NVLS or NVLS_TREE.
pub fn is_nvls(algo: &str) -> bool {
    matches!(find(ALGOS, algo).map(|x| x.code), Some(4 | 5))
}

#[cfg(test)]
mod tests {
    use super::Field::*;
    use super::*;

    #[test]
    fn spellings_map_to_static_c_strings() {
        let c = |field, s| c_str(field, s).to_str().unwrap_or("not UTF-8");
        let funcs = [c(Func, "AllReduce"), c(Func, "AlltoAll"), c(Func, "allreduce"), c(Func, "Frobnicate")];
        assert_eq!(funcs, ["AllReduce", "AlltoAll", "AllReduce", "Unknown"]);
        assert_eq!([c(Datatype, "ncclFloat32"), c(Datatype, "f32")], ["ncclFloat32", "Unknown"]);
        assert_eq!(
            [c(Algo, "RING"), c(Algo, "Ring"), c(Proto, "SIMPLE"), c(Proto, "Simple")],
            ["RING", "RING", "SIMPLE", "SIMPLE"]
        );
        assert_eq!([c(SyncStrategy, "MC"), c(SyncStrategy, "")], ["MC", "Unknown"]);
        assert_eq!(c_str(Func, "AllReduce"), c"AllReduce", "a static C string");
    }

    #[test]
    fn v1_codes_are_nccls() {
        let funcs = ["Broadcast", "Reduce", "AllGather", "ReduceScatter", "AllReduce", "SendRecv", "Send", "Recv"];
        for (i, f) in funcs.iter().enumerate() {
            assert_eq!(usize::from(code(Func, f)), i, "{f}");
        }
        assert_eq!(code(Func, "AlltoAll"), 6);
        let types = ["ncclInt8", "ncclUint8", "ncclInt32", "ncclUint32", "ncclInt64", "ncclUint64"];
        for (i, t) in types.iter().enumerate() {
            assert_eq!(usize::from(code(Datatype, t)), i, "{t}");
        }
        assert_eq!(code(Datatype, "ncclFloat16"), 6);
        assert_eq!(code(Datatype, "ncclFloat32"), 7);
        assert_eq!(code(Datatype, "ncclFloat64"), 8);
        assert_eq!(code(Datatype, "ncclBfloat16"), 9);
        assert_eq!(code(Datatype, "ncclFloat8e4m3"), 8);
        let algos = ["TREE", "RING", "COLLNET_DIRECT", "COLLNET_CHAIN", "NVLS", "NVLS_TREE", "PAT"];
        for (i, a) in algos.iter().enumerate() {
            assert_eq!(usize::from(code(Algo, a)), i, "{a}");
        }
        assert_eq!((code(Proto, "LL"), code(Proto, "LL128"), code(Proto, "SIMPLE")), (0, 1, 2));
        assert_eq!(
            (code(Func, "bogus"), code(Datatype, "bogus"), code(Algo, "bogus"), code(Proto, "bogus")),
            (6, 8, 6, 2)
        );
        assert!(is_collnet("COLLNET_CHAIN") && !is_collnet("RING") && !is_collnet("bogus"));
        assert!(is_nvls("NVLS_TREE") && !is_nvls("PAT"));
    }

    #[test]
    fn v1_codes_name_nccls_spellings() {
        let funcs = ["Broadcast", "Reduce", "AllGather", "ReduceScatter", "AllReduce", "SendRecv", "Send", "Recv"];
        for (i, f) in funcs.iter().enumerate() {
            assert_eq!(of_code(Func, i as u8), *f);
            assert_eq!(of_code(Func, code(Func, f)), *f, "round trip");
        }
        assert_eq!(of_code(Func, 8), "Unknown");
        assert_eq!(of_code(Datatype, 7), "ncclFloat32");
        assert_eq!(of_code(Datatype, 8), "ncclFloat64", "v1's own name, not a later type sharing the code");
        assert_eq!(of_code(Datatype, 9), "ncclBfloat16");
        assert_eq!(of_code(Datatype, 10), "Unknown");
        assert_eq!((of_code(Algo, 1), of_code(Algo, 6), of_code(Algo, 7)), ("RING", "PAT", "Unknown"));
        assert_eq!((of_code(Proto, 0), of_code(Proto, 2), of_code(Proto, 3)), ("LL", "SIMPLE", "Unknown"));
        assert_eq!(of_code(Proto, 255), "Unknown");
    }
}
