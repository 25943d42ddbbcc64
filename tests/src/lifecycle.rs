//! The worker's group and lifecycle scenarios (`occl-test-worker groups|split|abort|shrink|…`):
//! each runs on one rank of a real multi-process job and returns what it checked, or the occl
//! error that stopped it (the worker prints `ERR kind=…` for those).

use occl::{Comm, DataType, RedOp, ShrinkMode, OCCL_SPLIT_NOCOLOR};
use std::path::Path;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// What a scenario found wrong that occl did not report (a wrong value, a wrong rank).
#[derive(Debug)]
pub enum Failure {
    /// occl returned an error.
    Occl(occl::Error),
    /// occl returned success with a wrong result.
    Wrong(String),
}

impl From<occl::Error> for Failure {
    fn from(e: occl::Error) -> Self {
        Failure::Occl(e)
    }
}

pub type Outcome<T = ()> = Result<T, Failure>;

fn wrong<T>(msg: String) -> Outcome<T> {
    Err(Failure::Wrong(msg))
}

pub fn now_ns() -> u128 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0)
}

fn expect_eq<T: PartialEq + std::fmt::Debug>(what: &str, got: &[T], want: impl Fn(usize) -> T) -> Outcome {
    if let Some(i) = (0..got.len()).find(|&i| got[i] != want(i)) {
        return wrong(format!("{what}: element {i} is {:?}, expected {:?}", got[i], want(i)));
    }
    Ok(())
}

/// Grouped point-to-point: a ring shift where every rank receives before it sends (deadlocks
/// one call at a time once the message exceeds a FIFO), all-to-all from grouped raw sends and
/// receives (self included), all-to-allv with uneven and empty blocks, gather, scatter, a
/// collective between grouped calls, and nested groups. Returns the elements checked.
pub fn groups(comm: &Comm) -> Outcome<usize> {
    let (n, r) = (comm.nranks(), comm.rank());
    let (next, prev) = ((r + 1) % n, (r + n - 1) % n);
    let mut checked = 0;

    // More than a FIFO holds (8 slots of 256 KiB over shm, of 128 KiB over tcp).
    let len = (1 << 20) + 3;
    let out: Vec<f32> = (0..len).map(|i| (r * 1000 + i % 997) as f32).collect();
    let mut inp = vec![0f32; len];
    occl::group(|g| {
        g.recv(comm, &mut inp, prev)?;
        g.send(comm, &out, next)
    })?;
    expect_eq("ring shift", &inp, |i| (prev * 1000 + i % 997) as f32)?;
    checked += len;

    // All-to-all from grouped sends/receives, 70 000 u32 per block (several slices, and over
    // shm large enough to go by pointer).
    let count = 70_000;
    let val = |from: usize, to: usize, i: usize| (from * 1_000_000 + to * 10_000 + i % 9_999) as u32;
    let send: Vec<u32> = (0..n * count).map(|k| val(r, k / count, k % count)).collect();
    let mut recv = vec![0u32; n * count];
    occl::group_start();
    for j in 0..n {
        // SAFETY: both buffers outlive group_end below and hold block j.
        let res = unsafe {
            comm.send_raw(send[j * count..].as_ptr().cast(), count, DataType::U32, j)
                .and_then(|()| comm.recv_raw(recv[j * count..].as_mut_ptr().cast(), count, DataType::U32, j))
        };
        if let Err(e) = res {
            let _ = occl::group_end();
            return Err(e.into());
        }
    }
    occl::group_end()?;
    expect_eq("grouped all-to-all", &recv, |k| val(k / count, r, k % count))?;
    checked += recv.len();

    // All-to-allv: rank a sends rank b c(a, b) elements; c(0, 0) = 0.
    let c = |a: usize, b: usize| 1000 * ((a + b) % 3) + a + b;
    let prefix = |v: &[usize]| {
        v.iter()
            .scan(0, |s, &x| {
                let d = *s;
                *s += x;
                Some(d)
            })
            .collect::<Vec<_>>()
    };
    let scounts: Vec<usize> = (0..n).map(|j| c(r, j)).collect();
    let rcounts: Vec<usize> = (0..n).map(|i| c(i, r)).collect();
    let (sdispl, rdispl) = (prefix(&scounts), prefix(&rcounts));
    let v = |a: usize, b: usize, k: usize| (a * 1_000_000 + b * 10_000 + k) as f64;
    let mut sbuf = vec![0f64; scounts.iter().sum()];
    for j in 0..n {
        for k in 0..scounts[j] {
            sbuf[sdispl[j] + k] = v(r, j, k);
        }
    }
    let mut rbuf = vec![-1f64; rcounts.iter().sum()];
    comm.all_to_allv(&sbuf, &scounts, &sdispl, &mut rbuf, &rcounts, &rdispl)?;
    for i in 0..n {
        expect_eq(&format!("all_to_allv block from rank {i}"), &rbuf[rdispl[i]..][..rcounts[i]], |k| v(i, r, k))?;
    }
    checked += rbuf.len();

    // Gather to the last rank, scatter from it.
    let root = n - 1;
    let mine: Vec<i64> = (0..5000).map(|k| (r * 100_000 + k) as i64).collect();
    let mut all = if r == root { vec![0i64; n * 5000] } else { Vec::new() };
    comm.gather(&mine, &mut all, root)?;
    if r == root {
        expect_eq("gather", &all, |k| ((k / 5000) * 100_000 + k % 5000) as i64)?;
        checked += all.len();
    }
    let mut part = vec![0i64; 5000];
    comm.scatter(&all, &mut part, root)?;
    expect_eq("scatter", &part, |k| (r * 100_000 + k) as i64)?;
    checked += part.len();

    // A collective and a send/recv batch in one group, nested one level.
    let a = vec![r as f32 + 1.0; 1000];
    let mut sum = vec![0f32; 1000];
    let (tok_out, mut tok_in) = ([r as u64; 16], [0u64; 16]);
    occl::group(|g| {
        g.all_reduce(comm, &a, &mut sum, RedOp::Sum)?;
        g.nested(|g| {
            g.send(comm, &tok_out, next)?;
            g.recv(comm, &mut tok_in, prev)
        })
    })?;
    expect_eq("all_reduce in a group", &sum, |_| (n * (n + 1) / 2) as f32)?;
    expect_eq("token in a group", &tok_in, |_| prev as u64)?;
    checked += sum.len() + tok_in.len();
    Ok(checked)
}

/// Splits by parity (key: descending parent rank), or with `nocolor` the last rank takes no
/// part; then runs 20 all-reduces on the child on this thread while another thread runs 20 on
/// the parent. Returns the child's rank and size.
pub fn split(comm: &Comm, nocolor: bool) -> Outcome<Option<(usize, usize)>> {
    let (n, r) = (comm.nranks(), comm.rank());
    let color = if nocolor && r == n - 1 { OCCL_SPLIT_NOCOLOR } else { (r % 2) as i32 };
    let child = comm.split(color, (n - r) as i32)?;
    let Some(child) = child else {
        if color != OCCL_SPLIT_NOCOLOR {
            return wrong(format!("rank {r} with color {color} got no communicator"));
        }
        parent_all_reduces(comm)?;
        return Ok(None);
    };
    if color == OCCL_SPLIT_NOCOLOR {
        return wrong(format!("rank {r} with OCCL_SPLIT_NOCOLOR got a communicator"));
    }
    // Members of my color in descending parent rank (the key), excluding a NOCOLOR rank.
    let members: Vec<usize> = (0..n).rev().filter(|&q| q % 2 == r % 2 && !(nocolor && q == n - 1)).collect();
    let want_rank = members.iter().position(|&q| q == r).unwrap_or(usize::MAX);
    if child.rank() != want_rank || child.nranks() != members.len() {
        return wrong(format!(
            "rank {r}: child rank {}/{} but expected {want_rank}/{}",
            child.rank(),
            child.nranks(),
            members.len()
        ));
    }
    if child.id() == comm.id() {
        return wrong("the child has the parent's id".into());
    }
    let child_sum: usize = members.iter().map(|q| q + 1).sum();
    std::thread::scope(|s| -> Outcome {
        let parent = s.spawn(|| parent_all_reduces(comm));
        let mut w = vec![0f64; 10_000];
        for _ in 0..20 {
            w.fill(r as f64 + 1.0);
            child.all_reduce_in_place(&mut w, RedOp::Sum)?;
            expect_eq("child all_reduce", &w, |_| child_sum as f64)?;
        }
        parent.join().unwrap_or_else(|_| wrong("parent thread panicked".into()))
    })?;
    let (cr, cn) = (child.rank(), child.nranks());
    child.destroy()?;
    Ok(Some((cr, cn)))
}

/// The parent's part of `split`: 20 all-reduces, checked.
fn parent_all_reduces(comm: &Comm) -> Outcome {
    let (n, r) = (comm.nranks(), comm.rank());
    let mut v = vec![0f64; 10_000];
    for _ in 0..20 {
        v.fill(r as f64 + 1.0);
        comm.all_reduce_in_place(&mut v, RedOp::Sum)?;
        expect_eq("parent all_reduce", &v, |_| (n * (n + 1) / 2) as f64)?;
    }
    Ok(())
}

/// Three all-reduces, then rank `hang` stops calling while the others start a fourth and
/// block; after 500 ms each rank in `aborters` calls `abort()` from a watchdog thread (and
/// prints `ABORT at_ns=`). Returns the blocked call's error (rank `hang` returns `Ok`).
pub fn abort(comm: &Comm, hang: usize, aborters: &[usize]) -> Outcome {
    let r = comm.rank();
    let a = vec![1.0f32; 1 << 16];
    let mut b = vec![0f32; 1 << 16];
    for _ in 0..3 {
        comm.all_reduce(&a, &mut b, RedOp::Sum)?;
    }
    println!("READY rank={r} pid={}", std::process::id());
    std::thread::scope(|s| {
        if aborters.contains(&r) {
            s.spawn(|| {
                std::thread::sleep(Duration::from_millis(500));
                println!("ABORT rank={r} at_ns={}", now_ns());
                comm.abort();
            });
        }
        let res = if r == hang {
            // Stay out of the collective, and keep the communicator, well past the others'
            // deadline: their calls must end because of the abort, not of this rank leaving.
            std::thread::sleep(Duration::from_millis(3000));
            Ok(())
        } else {
            comm.all_reduce(&a, &mut b, RedOp::Sum).map_err(Failure::from)
        };
        match res {
            Ok(()) if r != hang => wrong("the blocked all-reduce succeeded".into()),
            other => other,
        }
    })
}

/// All-reduces until one fails (the test kills rank `dead`), then shrinks without it and runs
/// an all-reduce on the survivors. Returns (new rank, new size, the all-reduce's value).
pub fn shrink(comm: &Comm, dead: usize, mode: ShrinkMode) -> Outcome<(usize, usize, f32)> {
    let r = comm.rank();
    let a = vec![1.0f32; 1 << 14];
    let mut b = vec![0f32; 1 << 14];
    println!("READY rank={r} pid={}", std::process::id());
    let start = Instant::now();
    let e = loop {
        if let Err(e) = comm.all_reduce(&a, &mut b, RedOp::Sum) {
            break e;
        }
        if start.elapsed() > Duration::from_secs(60) {
            return wrong("no rank died within 60 s".into());
        }
    };
    println!("FAILED rank={r} at_ns={} kind={:?} msg={e}", now_ns(), e.kind());
    let t = Instant::now();
    let new = comm.shrink(&[dead], mode)?;
    let init = t.elapsed();
    let mut v = vec![r as f32 + 1.0; 4096];
    new.all_reduce_in_place(&mut v, RedOp::Sum)?;
    println!("SHRUNK rank={r} new_rank={} init_ms={:.1} total_ms={:.1}", new.rank(), ms(init), ms(t.elapsed()));
    let want = (0..comm.nranks()).filter(|&q| q != dead).map(|q| q as f32 + 1.0).sum::<f32>();
    expect_eq("all_reduce after shrink", &v, |_| want)?;
    let out = (new.rank(), new.nranks(), v[0]);
    new.destroy()?;
    Ok(out)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// All-reduces while rank `stopped` is suspended by the test (SIGSTOP): a survivor's
/// all-reduce blocks, and a watchdog thread, once the file `go` exists, shrinks with
/// `ShrinkMode::Abort` (which makes the blocked call return), then the survivors run an
/// all-reduce on the new communicator. Returns (new rank, new size, value).
pub fn shrink_hung(comm: &Comm, stopped: usize, go: &Path) -> Outcome<(usize, usize, f32)> {
    let (n, r) = (comm.nranks(), comm.rank());
    let a = vec![1.0f32; 1 << 14];
    let mut b = vec![0f32; 1 << 14];
    println!("READY rank={r} pid={}", std::process::id());
    let new = std::thread::scope(|s| -> Outcome<Comm> {
        let watchdog = s.spawn(|| -> Outcome<Comm> {
            while !go.exists() {
                std::thread::sleep(Duration::from_millis(10));
            }
            println!("SHRINK rank={r} at_ns={}", now_ns());
            Ok(comm.shrink(&[stopped], ShrinkMode::Abort)?)
        });
        let start = Instant::now();
        let e = loop {
            if let Err(e) = comm.all_reduce(&a, &mut b, RedOp::Sum) {
                break e;
            }
            if start.elapsed() > Duration::from_secs(60) {
                return wrong("the all-reduce never failed".into());
            }
        };
        println!("FAILED rank={r} at_ns={} kind={:?} msg={e}", now_ns(), e.kind());
        watchdog.join().unwrap_or_else(|_| wrong("watchdog panicked".into()))
    })?;
    let mut v = vec![r as f32 + 1.0; 4096];
    new.all_reduce_in_place(&mut v, RedOp::Sum)?;
    println!("SHRUNK rank={r} new_rank={} at_ns={}", new.rank(), now_ns());
    let want = (0..n).filter(|&q| q != stopped).map(|q| q as f32 + 1.0).sum::<f32>();
    expect_eq("all_reduce after shrink", &v, |_| want)?;
    let out = (new.rank(), new.nranks(), v[0]);
    new.destroy()?;
    Ok(out)
}

/// Joins from `OCCL_RANK`/`OCCL_NRANKS`/`OCCL_UNIQUE_ID` without blocking, rank 1 starting
/// `late_ms` after the others; polls until ready and counts the in-progress answers, then
/// checks an all-reduce. Returns the comm and the number of polls that said InProgress.
pub fn init_nonblocking(late_ms: u64) -> Outcome<(Comm, usize)> {
    let var = |k: &str| std::env::var(k).map_err(|_| Failure::Wrong(format!("{k} is not set")));
    let parse =
        |k: &str| -> Outcome<usize> { var(k)?.parse().map_err(|_| Failure::Wrong(format!("{k} is not a number"))) };
    let (r, n) = (parse("OCCL_RANK")?, parse("OCCL_NRANKS")?);
    let id: occl::UniqueId = var("OCCL_UNIQUE_ID")?.parse()?;
    if r == 1 {
        std::thread::sleep(Duration::from_millis(late_ms));
    }
    let mut pending = Comm::init_rank_nonblocking(n, &id, r, occl::Config::from_env()?)?;
    let mut in_progress = 0;
    while pending.poll()? == occl::InitState::InProgress {
        in_progress += 1;
        std::thread::sleep(Duration::from_millis(1));
    }
    let comm = pending.wait()?;
    let mut v = [r as u64 + 1; 32];
    comm.all_reduce_in_place(&mut v, RedOp::Sum)?;
    expect_eq("all_reduce after a non-blocking init", &v, |_| (n * (n + 1) / 2) as u64)?;
    Ok((comm, in_progress))
}
