//! Event descriptors the unit tests share.

use crate::event::EventDescr;

/// A CeColl as occl's core emits it: `func` of `count` f32 on the copy engines, `seq` both its
/// sequence numbers.
pub(crate) fn ce_coll(func: &'static str, count: usize, seq: u32) -> EventDescr<'static> {
    EventDescr::CeColl {
        seq_number: u64::from(seq),
        func,
        send_buff: 0,
        recv_buff: 0,
        count,
        root: 0,
        datatype: "ncclFloat32",
        sync_strategy: "UC",
        intra_batch_sync: false,
        batch_size: 0,
        num_batches: 0,
        ce_seq_num: seq,
        stream: 0,
    }
}
