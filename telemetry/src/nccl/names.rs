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

const fn n(text: &'static str, c: &'static CStr, code: u8) -> Name {
    Name { text, c, code }
}

/// NCCL's `ncclFunc_t` spellings; codes are v1's (`ncclFuncBroadcast` 0 … `ncclFuncRecv` 7).
/// Functions v1 did not know get v1's fallback, Send (6), as NCCL's v1 adapter does.
const FUNCS: &[Name] = &[
    n("Broadcast", c"Broadcast", 0),
    n("Reduce", c"Reduce", 1),
    n("AllGather", c"AllGather", 2),
    n("ReduceScatter", c"ReduceScatter", 3),
    n("AllReduce", c"AllReduce", 4),
    n("SendRecv", c"SendRecv", 5),
    n("Send", c"Send", 6),
    n("Recv", c"Recv", 7),
    n("AlltoAll", c"AlltoAll", 6),
    n("Gather", c"Gather", 6),
    n("Scatter", c"Scatter", 6),
];
const FUNC_FALLBACK: u8 = 6;

/// `ncclDataType_t` spellings; codes are `ncclInt8` 0 … `ncclBfloat16` 9; newer types get v1's
/// fallback, Float64 (8).
const DATATYPES: &[Name] = &[
    n("ncclInt8", c"ncclInt8", 0),
    n("ncclUint8", c"ncclUint8", 1),
    n("ncclInt32", c"ncclInt32", 2),
    n("ncclUint32", c"ncclUint32", 3),
    n("ncclInt64", c"ncclInt64", 4),
    n("ncclUint64", c"ncclUint64", 5),
    n("ncclFloat16", c"ncclFloat16", 6),
    n("ncclFloat32", c"ncclFloat32", 7),
    n("ncclFloat64", c"ncclFloat64", 8),
    n("ncclBfloat16", c"ncclBfloat16", 9),
    n("ncclFloat8e4m3", c"ncclFloat8e4m3", 8),
    n("ncclFloat8e5m2", c"ncclFloat8e5m2", 8),
];
const DATATYPE_FALLBACK: u8 = 8;

/// Algorithm spellings; codes Tree 0 … PAT 6; unknown gets v1's fallback, PAT.
const ALGOS: &[Name] = &[
    n("TREE", c"TREE", 0),
    n("RING", c"RING", 1),
    n("COLLNET_DIRECT", c"COLLNET_DIRECT", 2),
    n("COLLNET_CHAIN", c"COLLNET_CHAIN", 3),
    n("NVLS", c"NVLS", 4),
    n("NVLS_TREE", c"NVLS_TREE", 5),
    n("PAT", c"PAT", 6),
];
const ALGO_FALLBACK: u8 = 6;

/// Protocol spellings; codes LL 0, LL128 1, Simple 2 (also v1's fallback).
const PROTOS: &[Name] = &[n("LL", c"LL", 0), n("LL128", c"LL128", 1), n("SIMPLE", c"SIMPLE", 2)];
const PROTO_FALLBACK: u8 = 2;

/// CE sync strategies (v6).
const SYNC_STRATEGIES: &[Name] = &[n("MC", c"MC", 0), n("UC", c"UC", 0)];

const UNKNOWN: &CStr = c"Unknown";

/// Exact spelling first; otherwise ASCII case-insensitively, so "Ring" or "simple" from a tuner
/// still maps to NCCL's spelling.
fn find(table: &'static [Name], s: &str) -> Option<&'static Name> {
    table.iter().find(|x| x.text == s).or_else(|| table.iter().find(|x| x.text.eq_ignore_ascii_case(s)))
}

fn c_of(table: &'static [Name], s: &str) -> &'static CStr {
    find(table, s).map_or(UNKNOWN, |x| x.c)
}

/// The descriptor field a string was read from, for [`exact`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Field {
    Func,
    Datatype,
    Algo,
    Proto,
    SyncStrategy,
}

/// `s` as spelled in `field`'s table, compared exactly: the fast path of [`known`] for a caller
/// that knows the field (a handful of comparisons instead of every table twice).
pub fn exact(field: Field, s: &str) -> Option<&'static str> {
    let table = match field {
        Field::Func => FUNCS,
        Field::Datatype => DATATYPES,
        Field::Algo => ALGOS,
        Field::Proto => PROTOS,
        Field::SyncStrategy => SYNC_STRATEGIES,
    };
    table.iter().find(|x| x.text == s).map(|x| x.text)
}

/// NCCL's own spelling of `s` (exactly, or ASCII case-insensitively) from any of the tables, as
/// a `'static` string: what a sink that keeps names uses instead of copying them.
pub fn known(s: &str) -> Option<&'static str> {
    [FUNCS, DATATYPES, ALGOS, PROTOS, SYNC_STRATEGIES].into_iter().find_map(|t| find(t, s)).map(|x| x.text)
}

/// `coll.func` / `p2p.func` / `collApi.func` …
pub fn func(s: &str) -> &'static CStr {
    c_of(FUNCS, s)
}

pub fn datatype(s: &str) -> &'static CStr {
    c_of(DATATYPES, s)
}

pub fn algo(s: &str) -> &'static CStr {
    c_of(ALGOS, s)
}

pub fn proto(s: &str) -> &'static CStr {
    c_of(PROTOS, s)
}

pub fn sync_strategy(s: &str) -> &'static CStr {
    c_of(SYNC_STRATEGIES, s)
}

/// v1 `func` code.
pub fn func_code(s: &str) -> u8 {
    find(FUNCS, s).map_or(FUNC_FALLBACK, |x| x.code)
}

/// v1 `datatype` code.
pub fn datatype_code(s: &str) -> u8 {
    find(DATATYPES, s).map_or(DATATYPE_FALLBACK, |x| x.code)
}

/// v1 `algo` code.
pub fn algo_code(s: &str) -> u8 {
    find(ALGOS, s).map_or(ALGO_FALLBACK, |x| x.code)
}

/// v1 `proto` code.
pub fn proto_code(s: &str) -> u8 {
    find(PROTOS, s).map_or(PROTO_FALLBACK, |x| x.code)
}

/// The spelling of a v1 code: the first entry of `table` with that code (the tables list v1's
/// own names before the later names that share a fallback code); "Unknown" when none has it.
fn of_code(table: &'static [Name], code: u8) -> &'static str {
    table.iter().find(|x| x.code == code).map_or("Unknown", |x| x.text)
}

/// The spelling of a v1 `func` code (`ncclFuncBroadcast` 0 … `ncclFuncRecv` 7).
pub fn func_of_code(code: u8) -> &'static str {
    of_code(FUNCS, code)
}

/// The spelling of a v1 `datatype` code (`ncclInt8` 0 … `ncclBfloat16` 9).
pub fn datatype_of_code(code: u8) -> &'static str {
    of_code(DATATYPES, code)
}

/// The spelling of a v1 `algo` code (Tree 0 … PAT 6).
pub fn algo_of_code(code: u8) -> &'static str {
    of_code(ALGOS, code)
}

/// The spelling of a v1 `proto` code (LL 0, LL128 1, Simple 2).
pub fn proto_of_code(code: u8) -> &'static str {
    of_code(PROTOS, code)
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
    use super::*;

    #[test]
    fn spellings_map_to_static_c_strings() {
        assert_eq!(func("AllReduce"), c"AllReduce");
        assert_eq!(func("AlltoAll"), c"AlltoAll");
        assert_eq!(func("allreduce"), c"AllReduce");
        assert_eq!(func("Frobnicate"), c"Unknown");
        assert_eq!(datatype("ncclFloat32"), c"ncclFloat32");
        assert_eq!(datatype("f32"), c"Unknown");
        assert_eq!(algo("RING"), c"RING");
        assert_eq!(algo("Ring"), c"RING");
        assert_eq!(proto("SIMPLE"), c"SIMPLE");
        assert_eq!(proto("Simple"), c"SIMPLE");
        assert_eq!(sync_strategy("MC"), c"MC");
        assert_eq!(sync_strategy(""), c"Unknown");
    }

    #[test]
    fn v1_codes_are_nccls() {
        let funcs = ["Broadcast", "Reduce", "AllGather", "ReduceScatter", "AllReduce", "SendRecv", "Send", "Recv"];
        for (i, f) in funcs.iter().enumerate() {
            assert_eq!(usize::from(func_code(f)), i, "{f}");
        }
        assert_eq!(func_code("AlltoAll"), 6);
        let types = ["ncclInt8", "ncclUint8", "ncclInt32", "ncclUint32", "ncclInt64", "ncclUint64"];
        for (i, t) in types.iter().enumerate() {
            assert_eq!(usize::from(datatype_code(t)), i, "{t}");
        }
        assert_eq!(datatype_code("ncclFloat16"), 6);
        assert_eq!(datatype_code("ncclFloat32"), 7);
        assert_eq!(datatype_code("ncclFloat64"), 8);
        assert_eq!(datatype_code("ncclBfloat16"), 9);
        assert_eq!(datatype_code("ncclFloat8e4m3"), 8);
        let algos = ["TREE", "RING", "COLLNET_DIRECT", "COLLNET_CHAIN", "NVLS", "NVLS_TREE", "PAT"];
        for (i, a) in algos.iter().enumerate() {
            assert_eq!(usize::from(algo_code(a)), i, "{a}");
        }
        assert_eq!((proto_code("LL"), proto_code("LL128"), proto_code("SIMPLE")), (0, 1, 2));
        assert!(is_collnet("COLLNET_CHAIN") && !is_collnet("RING") && !is_collnet("bogus"));
        assert!(is_nvls("NVLS_TREE") && !is_nvls("PAT"));
    }

    #[test]
    fn v1_codes_name_nccls_spellings() {
        let funcs = ["Broadcast", "Reduce", "AllGather", "ReduceScatter", "AllReduce", "SendRecv", "Send", "Recv"];
        for (i, f) in funcs.iter().enumerate() {
            assert_eq!(func_of_code(i as u8), *f);
            assert_eq!(func_of_code(func_code(f)), *f, "round trip");
        }
        assert_eq!(func_of_code(8), "Unknown");
        assert_eq!(datatype_of_code(7), "ncclFloat32");
        assert_eq!(datatype_of_code(8), "ncclFloat64", "v1's own name, not a later type sharing the code");
        assert_eq!(datatype_of_code(9), "ncclBfloat16");
        assert_eq!(datatype_of_code(10), "Unknown");
        assert_eq!((algo_of_code(1), algo_of_code(6), algo_of_code(7)), ("RING", "PAT", "Unknown"));
        assert_eq!((proto_of_code(0), proto_of_code(2), proto_of_code(3)), ("LL", "SIMPLE", "Unknown"));
        assert_eq!(proto_of_code(255), "Unknown");
    }
}
