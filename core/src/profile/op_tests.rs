//! Summed steps: where a step's time starts.

use super::*;
use crate::transport::fifo::{region_size, Region};
use crate::wait::Patience;
use occl_events::Sink;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Takes only operation sums (so occl sums every shm leg); keeps each operation's step sums.
#[derive(Default)]
struct Sums(Mutex<Vec<[StepTotals; 2]>>);

impl Sink for Sums {
    fn interest(&self) -> EventMask {
        EventMask::OP_TOTALS | EventMask::STEP_TOTALS | EventType::Coll | EventType::ProxyOp
    }
    fn op_totals(&self, t: &OpTotals<'_>) {
        self.0.lock().expect("lock").push(t.steps);
    }
}

fn descr() -> OpDescr<'static> {
    OpDescr {
        func: "AllReduce",
        p2p: false,
        seq_number: 0,
        send_buff: 0,
        recv_buff: 0,
        count: 2,
        root: 0,
        peer: -1,
        datatype: "ncclFloat32",
        algo: "RING",
        proto: "SIMPLE",
        chunk_size: 1024,
        n_channels: 1,
    }
}

const PAUSE: Duration = Duration::from_millis(30);

/// One operation: optionally a send step, a pause, then a receive step (chained or not); returns
/// the receive side's RecvWait.
fn recv_wait(f: &Fanout, sums: &Sums, send_first: bool, chain: bool) -> u64 {
    let legs = || vec![Leg { peer: 1, send: true, steps: 1 }, Leg { peer: 1, send: false, steps: 1 }];
    let p = OpProf::begin(f, 0, descr, legs, |_| "shm").expect("every sink takes sums");
    let r = Arc::new(Region::map(-1, region_size(2, 4096)).expect("map"));
    r.init(2, 4096, 0, 0);
    let (send, recv) = (SendFifo::new(r.clone(), Patience::Eager), RecvFifo::new(r, Patience::Eager));
    if send_first {
        let mut s = p.steps(Some(1), None).expect("steps");
        s.send_peer_wait();
        s.send_posted(8, &send);
    }
    std::thread::sleep(PAUSE);
    let s = p.steps(None, Some(1)).expect("steps");
    let mut s = if chain { s.chained() } else { s };
    s.recv_begin(&recv);
    s.recv_arrived(8);
    s.recv_done();
    drop(s);
    p.end();
    let got = sums.0.lock().expect("lock");
    let last = got.last().expect("the operation's sums");
    assert_eq!((last[1].steps, last[1].bytes), (1, 8), "the receive counts whichever way it started");
    last[1].wait_ns[RECV_WAIT]
}

#[test]
fn a_chained_step_starts_where_the_operations_last_step_ended() {
    let f = Fanout::new();
    let sums = Arc::new(Sums::default());
    let _h = f.attach(sums.clone()).expect("attach");
    let pause = PAUSE.as_nanos() as u64;
    let plain = recv_wait(&f, &sums, true, false);
    assert!(plain < pause, "a step starts at its own mark: {plain} ns waited");
    let chained = recv_wait(&f, &sums, true, true);
    assert!(chained >= pause, "a chained step starts at the send's post: {chained} ns waited");
    let first = recv_wait(&f, &sums, false, true);
    assert!(first < pause, "with no step before it, a chained step reads the clock: {first} ns waited");
}
