//! Buffer registration checks, run by every rank (a process of `occl-test-worker register` or a
//! thread of an `init_all` job): registered all-reduce and all-gather must give the same bits as
//! the unregistered path, and deregistering must leave a working normal path.

use occl::{Comm, Element, HostBuf, RedOp};
use std::fmt::Debug;
use std::ops::DerefMut;

/// What a check found wrong, or occl's error.
pub type Outcome = Result<Vec<String>, occl::Error>;

/// Element types whose test values are small integers, so every reduction order gives the
/// exact same result (the registered path reduces in rank order, the ring in ring order).
pub trait Val: Element + PartialEq + Debug + Default {
    fn of(i: i32) -> Self;
    fn bits(self) -> u64;
}

impl Val for f32 {
    fn of(i: i32) -> Self {
        i as f32
    }
    fn bits(self) -> u64 {
        u64::from(self.to_bits())
    }
}

impl Val for f64 {
    fn of(i: i32) -> Self {
        f64::from(i)
    }
    fn bits(self) -> u64 {
        self.to_bits()
    }
}

impl Val for i32 {
    fn of(i: i32) -> Self {
        i
    }
    fn bits(self) -> u64 {
        self as u32 as u64
    }
}

fn value(rank: usize, i: usize) -> i32 {
    ((i * 7 + rank * 13) % 17) as i32 - 8
}

type Buf<T> = Box<dyn DerefMut<Target = [T]>>;

/// `len` elements: a `HostBuf` (peers in other processes can map it) or a plain `Vec`.
fn alloc<T: Val>(len: usize, host: bool) -> occl::Result<Buf<T>> {
    Ok(if host { Box::new(HostBuf::<T>::alloc(len)?) } else { Box::new(vec![T::default(); len]) })
}

fn same<T: Val>(a: &[T], b: &[T]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.bits() == y.bits())
}

/// Element counts: empty, one, odd, 1 MiB of f32 plus an odd tail, and 4 MiB plus one (past
/// the size from which the registered paths stream their writes).
pub const SIZES: [usize; 5] = [0, 1, 1001, (1 << 18) + 7, (1 << 20) + 3];

fn last_algo(comm: &Comm) -> &'static str {
    comm.flight_recorder().snapshot().iter().max_by_key(|e| e.record_id).map_or("none", |e| e.info.algo)
}

/// Registered vs unregistered all-reduce and reduce-scatter (sum, max; in place and not) and
/// all-gather (in place and not) of `T` at every size; `shared` is whether windows must be active. Deregisters, then
/// checks the normal path on the same buffers.
pub fn check<T: Val>(comm: &Comm, host: bool, shared: bool) -> Outcome {
    let (r, n) = (comm.rank(), comm.nranks());
    let cap = SIZES[SIZES.len() - 1];
    let mut wrong = Vec::new();
    let ty = std::any::type_name::<T>();
    let mut send = alloc::<T>(cap * n, host)?;
    let mut recv = alloc::<T>(cap * n, host)?;
    let hs = comm.register(&send[..])?;
    let hr = comm.register(&recv[..])?;
    if hs.shared() != shared || hr.shared() != shared {
        wrong.push(format!("{ty}: windows shared={} {}, expected {shared}", hs.shared(), hr.shared()));
    }
    let want_algo = |c: usize| if shared && c > 0 { "registered" } else { "other" };
    let algo_ok = |what: String, c: usize, wrong: &mut Vec<String>| {
        let a = last_algo(comm);
        if (a == "registered") != (want_algo(c) == "registered") {
            wrong.push(format!("{what}: ran algorithm {a}"));
        }
    };
    for &c in &SIZES {
        let input: Vec<T> = (0..c).map(|i| T::of(value(r, i))).collect();
        for op in [RedOp::Sum, RedOp::Max] {
            // Reference: the normal path on plain memory.
            let mut plain = vec![T::default(); c];
            comm.all_reduce(&input, &mut plain, op)?;
            let exact: Vec<T> = (0..c)
                .map(|i| {
                    let vals = (0..n).map(|q| value(q, i));
                    T::of(if op == RedOp::Sum { vals.sum() } else { vals.max().unwrap_or(0) })
                })
                .collect();
            if !same(&plain, &exact) {
                wrong.push(format!("{ty} all_reduce {op:?} count {c}: the normal path is wrong"));
            }
            send[..c].copy_from_slice(&input);
            comm.all_reduce(&send[..c], &mut recv[..c], op)?;
            algo_ok(format!("{ty} registered all_reduce {op:?} count {c}"), c, &mut wrong);
            if !same(&recv[..c], &plain) {
                wrong.push(format!("{ty} registered all_reduce {op:?} count {c}: differs from the normal path"));
            }
            recv[..c].copy_from_slice(&input);
            comm.all_reduce_in_place(&mut recv[..c], op)?;
            algo_ok(format!("{ty} registered all_reduce_in_place {op:?} count {c}"), c, &mut wrong);
            if !same(&recv[..c], &plain) {
                wrong.push(format!("{ty} registered all_reduce_in_place {op:?} count {c}: differs"));
            }
        }
        // Reduce-scatter: every rank's n blocks of c; rank r gets block r of the reduction.
        let full: Vec<T> = (0..c * n).map(|i| T::of(value(r, i))).collect();
        for op in [RedOp::Sum, RedOp::Max] {
            let mut plain = vec![T::default(); c];
            comm.reduce_scatter(&full, &mut plain, op)?;
            let exact: Vec<T> = (0..c)
                .map(|i| {
                    let vals = (0..n).map(|q| value(q, r * c + i));
                    T::of(if op == RedOp::Sum { vals.sum() } else { vals.max().unwrap_or(0) })
                })
                .collect();
            if !same(&plain, &exact) {
                wrong.push(format!("{ty} reduce_scatter {op:?} count {c}: the normal path is wrong"));
            }
            send[..c * n].copy_from_slice(&full);
            comm.reduce_scatter(&send[..c * n], &mut recv[..c], op)?;
            algo_ok(format!("{ty} registered reduce_scatter {op:?} count {c}"), c, &mut wrong);
            if !same(&recv[..c], &plain) {
                wrong.push(format!("{ty} registered reduce_scatter {op:?} count {c}: differs from the normal path"));
            }
            recv[..c * n].copy_from_slice(&full);
            comm.reduce_scatter_in_place(&mut recv[..c * n], op)?;
            algo_ok(format!("{ty} registered reduce_scatter_in_place {op:?} count {c}"), c, &mut wrong);
            if !same(&recv[r * c..(r + 1) * c], &plain) {
                wrong.push(format!("{ty} registered reduce_scatter_in_place {op:?} count {c}: differs"));
            }
        }
        let mut plain = vec![T::default(); c * n];
        comm.all_gather(&input, &mut plain)?;
        send[..c].copy_from_slice(&input);
        comm.all_gather(&send[..c], &mut recv[..c * n])?;
        algo_ok(format!("{ty} registered all_gather count {c}"), c, &mut wrong);
        if !same(&recv[..c * n], &plain) {
            wrong.push(format!("{ty} registered all_gather count {c}: differs from the normal path"));
        }
        recv[..c * n].fill(T::default());
        recv[r * c..(r + 1) * c].copy_from_slice(&input);
        comm.all_gather_in_place(&mut recv[..c * n])?;
        algo_ok(format!("{ty} registered all_gather_in_place count {c}"), c, &mut wrong);
        if !same(&recv[..c * n], &plain) {
            wrong.push(format!("{ty} registered all_gather_in_place count {c}: differs"));
        }
    }
    comm.deregister(hs)?;
    comm.deregister(hr)?;
    // Deregistered: the same buffers take the normal path and still give the right answer.
    let c = 1001;
    let input: Vec<T> = (0..c).map(|i| T::of(value(r, i))).collect();
    let mut plain = vec![T::default(); c];
    comm.all_reduce(&input, &mut plain, RedOp::Sum)?;
    send[..c].copy_from_slice(&input);
    comm.all_reduce(&send[..c], &mut recv[..c], RedOp::Sum)?;
    if last_algo(comm) == "registered" || !same(&recv[..c], &plain) {
        wrong.push(format!("{ty}: after deregister all_reduce ran {} or differs", last_algo(comm)));
    }
    Ok(wrong)
}

/// Handle errors every rank sees alike: a handle deregistered twice, an empty buffer, a window
/// overlapping another. Returns what was not refused as it should be.
pub fn bad_handles(comm: &Comm, host: bool) -> Outcome {
    let mut wrong = Vec::new();
    let buf = alloc::<f32>(4096, host)?;
    let h = comm.register(&buf[..])?;
    let expect = |what: &str, res: occl::Result<()>, wrong: &mut Vec<String>| match res {
        Err(e) if e.kind() == occl::ErrorKind::InvalidArgument => {}
        other => wrong.push(format!("{what}: expected InvalidArgument, got {other:?}")),
    };
    expect("overlapping window", comm.register(&buf[100..200]).map(|_| ()), &mut wrong);
    expect("empty buffer", comm.register(&buf[..0]).map(|_| ()), &mut wrong);
    comm.deregister(h)?;
    expect("deregister twice", comm.deregister(h), &mut wrong);
    // The communicator is still usable.
    let mut x = vec![1.0f32; 10];
    comm.all_reduce_in_place(&mut x, RedOp::Sum)?;
    if x[0] != comm.nranks() as f32 {
        wrong.push(format!("all_reduce after refused registrations gave {}", x[0]));
    }
    Ok(wrong)
}

/// Every check of one rank: f32, i32, f64, and the handle errors. `helpers`: how many helper
/// threads the rank must have started by the end (`OCCL_REG_THREADS`), when the test set it.
pub fn all(comm: &Comm, host: bool, shared: bool, helpers: Option<usize>) -> Outcome {
    let mut wrong = check::<f32>(comm, host, shared)?;
    wrong.extend(check::<i32>(comm, host, shared)?);
    wrong.extend(check::<f64>(comm, host, shared)?);
    wrong.extend(bad_handles(comm, host)?);
    if let Some(want) = helpers {
        // The largest sizes split (a rank's range of at least 2 MiB), so active windows start
        // every helper asked for, and inactive ones none.
        let want = if shared { want } else { 0 };
        // A thread takes its name once it first runs: a helper that got no part yet may not
        // have, on a loaded machine. Give the names a bounded while to appear.
        let until = std::time::Instant::now() + std::time::Duration::from_secs(5);
        let mut got = helper_threads(comm.rank());
        while got != want && std::time::Instant::now() < until {
            std::thread::sleep(std::time::Duration::from_millis(10));
            got = helper_threads(comm.rank());
        }
        if got != want {
            wrong.push(format!("rank {}: {got} registered-collective helper threads, expected {want}", comm.rank()));
        }
    }
    Ok(wrong)
}

/// Threads of this process named as rank `rank`'s registered-collective helpers.
pub fn helper_threads(rank: usize) -> usize {
    let prefix = format!("occl-reg-r{rank}-");
    std::fs::read_dir("/proc/self/task")
        .map(|d| {
            d.flatten()
                .filter(|t| std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.starts_with(&prefix)))
                .count()
        })
        .unwrap_or(0)
}

/// A registered all-reduce loop for the kill test: prints `LOOPING` once running.
pub fn loop_until_error(comm: &Comm) -> occl::Result<()> {
    let count = 1 << 20;
    let send = HostBuf::<f32>::alloc(count)?;
    let mut recv = HostBuf::<f32>::alloc(count)?;
    let _hs = comm.register(&send[..])?;
    let _hr = comm.register(&recv[..])?;
    for i in 0u64.. {
        comm.all_reduce(&send[..], &mut recv[..], RedOp::Sum)?;
        if i == 10 {
            println!("LOOPING rank={}", comm.rank());
        }
    }
    Ok(())
}

/// Rank 0 passes plain memory while the others pass registered windows: every rank must fail
/// (the registered ranks at the latest by OCCL_TIMEOUT, naming the likely cause), none may
/// return a result.
pub fn mixed(comm: &Comm) -> occl::Result<()> {
    let count = 4096;
    let send = HostBuf::<f32>::alloc(count)?;
    let mut recv = HostBuf::<f32>::alloc(count)?;
    let _hs = comm.register(&send[..])?;
    let _hr = comm.register(&recv[..])?;
    if comm.rank() == 0 {
        let mut out = vec![0f32; count];
        comm.all_reduce(&vec![1.0f32; count], &mut out, RedOp::Sum)
    } else {
        comm.all_reduce(&send[..], &mut recv[..], RedOp::Sum)
    }
}
