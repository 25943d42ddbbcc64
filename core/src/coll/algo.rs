//! The algorithms and protocols a host collective runs with (the tuner's choice), and the
//! names benchmarks, logs and the profiler give them.

/// The algorithms `Comm` chooses among.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Algo {
    Ring,
    /// Double binary tree (all-reduce), one tree rooted at the root (broadcast, reduce).
    Tree,
    /// Bruck-style log-step exchanges (all-gather, reduce-scatter).
    Pat,
    OneShot,
    Chain,
    Direct,
}

impl Algo {
    /// What benchmarks and logs print.
    pub(crate) const fn name(self) -> &'static str {
        match self {
            Algo::Ring => "ring",
            Algo::Tree => "tree",
            Algo::Pat => "pat",
            Algo::OneShot => "one-shot",
            Algo::Chain => "chain",
            Algo::Direct => "direct",
        }
    }

    /// The profiler's `algo` string: NCCL's where the algorithm is NCCL's (a broadcast or
    /// reduce chain is NCCL's RING algorithm), our own otherwise.
    pub(crate) const fn nccl_name(self) -> &'static str {
        match self {
            Algo::Ring | Algo::Chain => "RING",
            Algo::Tree => "TREE",
            Algo::Pat => "PAT",
            Algo::OneShot => "ONE_SHOT",
            Algo::Direct => "DIRECT",
        }
    }
}

/// The protocols: how a message's arrival is signalled.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Proto {
    /// A slot's data, then its sequence word (NCCL's Simple).
    Simple,
    /// Lines that carry their own flag (NCCL's LL; `transport::fifo::ll`), shm only.
    Ll,
}

impl Proto {
    pub(crate) const fn name(self) -> &'static str {
        match self {
            Proto::Simple => "simple",
            Proto::Ll => "ll",
        }
    }

    /// NCCL's spelling, for the profiler.
    pub(crate) const fn nccl_name(self) -> &'static str {
        match self {
            Proto::Simple => "SIMPLE",
            Proto::Ll => "LL",
        }
    }
}
