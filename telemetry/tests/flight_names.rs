//! The name table is bounded: past it, names read back as "?" and nothing else breaks. A test
//! binary of its own, since it fills the process-wide table.

use occl_telemetry::flight::{names::OVERFLOW_NAME, FlightComm, FlightRecorder, OpInfo};

#[test]
fn names_past_the_table_read_back_as_overflow() {
    let comm = FlightComm { comm_hash: 1, rank: 0, nranks: 1, pid: 1, host: "h".into(), comm_name: None };
    let n = 700;
    let rec = FlightRecorder::new(comm, n);
    let names: Vec<&'static str> = (0..n).map(|i| &*Box::leak(format!("Op{i}").into_boxed_str())).collect();
    for (i, name) in names.iter().enumerate() {
        let op = OpInfo {
            seq: i as u64,
            coll_seq: i as u64,
            op: name,
            dtype: "ncclInt8",
            redop: None,
            count: 1,
            in_bytes: 1,
            out_bytes: 1,
            root_or_peer: None,
            algo: "RING",
            proto: "SIMPLE",
        };
        let s = rec.enqueue(&op, i as u64);
        rec.completed(s, i as u64 + 1);
    }
    let entries = rec.snapshot();
    assert_eq!(entries.len(), n);
    let mut kept = 0;
    for (e, name) in entries.iter().zip(&names) {
        assert!(e.info.op == *name || e.info.op == OVERFLOW_NAME, "{} read back as {}", name, e.info.op);
        kept += usize::from(e.info.op == *name);
        assert_eq!((e.info.dtype, e.info.algo, e.info.proto), ("ncclInt8", "RING", "SIMPLE"));
    }
    // 512 cells: three taken by dtype, algo and proto, the rest by the first op names.
    assert_eq!(kept, 509);
    // Names seen before the table filled still resolve.
    assert_eq!(rec.to_json("x")["entries"][0]["op"], "Op0");
}
