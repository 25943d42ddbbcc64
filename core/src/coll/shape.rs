//! The shape of one host operation: what every schedule (`ring`, `tree`, `pat`, `direct`)
//! walks, and what the planner (`plan`) counts the same walk over.

use super::algo::Algo;
use super::order::RingOrder;
use crate::record::CollType;

/// The shape of one operation.
pub(crate) struct Shape<'a> {
    pub coll: CollType,
    pub algo: Algo,
    pub nranks: usize,
    pub rank: usize,
    /// Elements per rank (per block for all-gather, reduce-scatter and all-to-all).
    pub count: usize,
    pub elem: usize,
    /// Bytes per slice and per ring chunk (`Ctx::slice`, `Ctx::chunk`).
    pub slice: usize,
    pub chunk: usize,
    pub root: usize,
    pub peer: usize,
    /// The host-grouped order that `rank` and `root` are positions in (rings, chains and trees;
    /// `None`: rank order). Blocks of the caller's buffers stay laid out by rank.
    pub order: Option<&'a RingOrder>,
}
