//! What NCCL calls a device mode: the `func` and per-function sequence index of its profiler
//! events, the operation type RAS counts it under, and its algorithm's name.

use super::kernels::coll::Mode;
use crate::record::CollType;

/// NCCL's `func` of a mode, and its index among the communicator's per-function sequence
/// numbers.
pub(crate) fn func_of(mode: Mode) -> (&'static str, usize) {
    match mode {
        Mode::AllReduceOneShot | Mode::AllReduceTwoShot | Mode::AllReduceRing => ("AllReduce", 0),
        Mode::ReduceScatter | Mode::ReduceScatterRing => ("ReduceScatter", 1),
        Mode::Reduce | Mode::ReduceRing => ("Reduce", 2),
        Mode::AllGather => ("AllGather", 3),
        Mode::Broadcast | Mode::BroadcastRing => ("Broadcast", 4),
        Mode::AllToAll => ("AlltoAll", 5),
        Mode::Send => ("Send", 6),
        Mode::Recv => ("Recv", 7),
    }
}

/// The operation type RAS counts a mode under (NCCL's `ncclFunc_t`).
pub(crate) fn ras_type(mode: Mode) -> CollType {
    match mode {
        Mode::AllReduceOneShot | Mode::AllReduceTwoShot | Mode::AllReduceRing => CollType::AllReduce,
        Mode::ReduceScatter | Mode::ReduceScatterRing => CollType::ReduceScatter,
        Mode::Reduce | Mode::ReduceRing => CollType::Reduce,
        Mode::AllGather => CollType::AllGather,
        Mode::Broadcast | Mode::BroadcastRing => CollType::Broadcast,
        Mode::AllToAll => CollType::AllToAll,
        Mode::Send => CollType::Send,
        Mode::Recv => CollType::Recv,
    }
}

/// The algorithm name a mode's profiler events and flight records carry (NCCL's spelling).
pub(crate) fn algo_name(mode: Mode) -> &'static str {
    match mode {
        Mode::AllReduceOneShot => "ONE_SHOT",
        Mode::AllReduceTwoShot => "TWO_SHOT",
        Mode::AllReduceRing | Mode::BroadcastRing | Mode::ReduceScatterRing | Mode::ReduceRing => "RING",
        _ => "DIRECT",
    }
}

/// Device functions with a sequence number of their own.
pub(crate) const FUNCS: usize = 8;
