//! The operations a communicator runs.

/// An operation, numbered as NCCL's `ncclFunc_t` where it has one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[repr(u8)]
pub enum CollType {
    Broadcast = 0,
    Reduce = 1,
    AllGather = 2,
    ReduceScatter = 3,
    AllReduce = 4,
    Send = 5,
    Recv = 6,
    AllToAll = 7,
}

impl CollType {
    /// Every type, in numeric order (index `i` holds the type numbered `i`).
    pub const ALL: [CollType; 8] = [
        CollType::Broadcast,
        CollType::Reduce,
        CollType::AllGather,
        CollType::ReduceScatter,
        CollType::AllReduce,
        CollType::Send,
        CollType::Recv,
        CollType::AllToAll,
    ];

    /// How many types there are: the length of per-type counter arrays.
    pub const COUNT: usize = 8;

    /// The five collectives whose launch counters NCCL's RAS report compares (its `collective_counts`).
    pub const NCCL_COUNTED: [CollType; 5] =
        [CollType::Broadcast, CollType::Reduce, CollType::AllGather, CollType::ReduceScatter, CollType::AllReduce];

    /// NCCL's spelling, as RAS reports and profiler plugins print it.
    pub const fn name(self) -> &'static str {
        match self {
            CollType::Broadcast => "Broadcast",
            CollType::Reduce => "Reduce",
            CollType::AllGather => "AllGather",
            CollType::ReduceScatter => "ReduceScatter",
            CollType::AllReduce => "AllReduce",
            CollType::Send => "Send",
            CollType::Recv => "Recv",
            CollType::AllToAll => "AllToAll",
        }
    }

    pub fn from_u8(v: u8) -> Option<CollType> {
        CollType::ALL.get(usize::from(v)).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::CollType;

    #[test]
    fn numbers_and_names_are_ncclfunc_t() {
        let want = ["Broadcast", "Reduce", "AllGather", "ReduceScatter", "AllReduce", "Send", "Recv", "AllToAll"];
        for (i, c) in CollType::ALL.iter().enumerate() {
            assert_eq!(*c as usize, i);
            assert_eq!(c.name(), want[i]);
            assert_eq!(CollType::from_u8(i as u8), Some(*c));
        }
        assert_eq!(CollType::from_u8(8), None);
        assert_eq!(CollType::ALL.len(), CollType::COUNT);
        assert_eq!(CollType::NCCL_COUNTED.map(|c| c as u8), [0, 1, 2, 3, 4]);
    }
}
