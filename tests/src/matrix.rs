//! The correctness matrix: every collective × datatype × operator × size × placement, run on a
//! communicator and checked element by element against an f64 reference. The same code runs in
//! each process of a multi-process job (`occl-test-worker`) and in each thread of `init_all`.

use crate::pattern::{self, aligned, bytes_of, bytes_of_mut};
use occl::{Comm, DataType, RedOp};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Coll {
    AllReduce,
    Broadcast,
    Reduce,
    AllGather,
    ReduceScatter,
    AllToAll,
    SendRecv,
}

impl Coll {
    pub const ALL: [Coll; 7] = [
        Coll::AllReduce,
        Coll::Broadcast,
        Coll::Reduce,
        Coll::AllGather,
        Coll::ReduceScatter,
        Coll::AllToAll,
        Coll::SendRecv,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Coll::AllReduce => "all_reduce",
            Coll::Broadcast => "broadcast",
            Coll::Reduce => "reduce",
            Coll::AllGather => "all_gather",
            Coll::ReduceScatter => "reduce_scatter",
            Coll::AllToAll => "all_to_all",
            Coll::SendRecv => "sendrecv",
        }
    }

    pub fn parse(s: &str) -> Option<Coll> {
        Coll::ALL.into_iter().find(|c| c.name() == s)
    }

    pub fn reduces(self) -> bool {
        matches!(self, Coll::AllReduce | Coll::Reduce | Coll::ReduceScatter)
    }
}

/// What to run.
#[derive(Debug, Clone)]
pub struct Spec {
    pub colls: Vec<Coll>,
    pub dtypes: Vec<DataType>,
    pub ops: Vec<RedOp>,
    /// Element counts per rank (per block for all-gather, reduce-scatter and all-to-all).
    pub counts: Vec<usize>,
    pub in_place: Vec<bool>,
}

impl Spec {
    pub fn full(counts: &[usize]) -> Spec {
        Spec {
            colls: Coll::ALL.to_vec(),
            dtypes: DataType::ALL.to_vec(),
            ops: RedOp::ALL.to_vec(),
            counts: counts.to_vec(),
            in_place: vec![false, true],
        }
    }

    /// `colls=a,b;dtypes=..;ops=..;counts=..;inplace=0,1` (any part may be omitted: all).
    pub fn parse(s: &str) -> Result<Spec, String> {
        let mut spec = Spec::full(&[0, 1, 7, 4099]);
        for part in s.split(';').filter(|p| !p.is_empty()) {
            let (k, v) = part.split_once('=').ok_or_else(|| format!("bad spec part {part:?}"))?;
            let items = v.split(',').filter(|x| !x.is_empty());
            match k {
                "colls" => {
                    spec.colls =
                        items.map(|x| Coll::parse(x).ok_or(format!("bad coll {x}"))).collect::<Result<_, _>>()?
                }
                "dtypes" => spec.dtypes = items.map(|x| x.parse()).collect::<Result<_, _>>()?,
                "ops" => spec.ops = items.map(|x| x.parse()).collect::<Result<_, _>>()?,
                "counts" => {
                    spec.counts =
                        items.map(|x| x.parse::<usize>().map_err(|e| e.to_string())).collect::<Result<_, _>>()?
                }
                "inplace" => spec.in_place = items.map(|x| x == "1").collect(),
                _ => return Err(format!("unknown spec key {k}")),
            }
        }
        Ok(spec)
    }
}

/// Checks done and the first failures (as readable lines).
#[derive(Debug, Default)]
pub struct Outcome {
    pub checked: usize,
    pub failures: Vec<String>,
}

/// Runs the whole spec on `comm`. Stops at the first error from occl (which poisons the
/// communicator); wrong results are collected and the run goes on.
pub fn run(comm: &Comm, spec: &Spec) -> Result<Outcome, String> {
    let mut out = Outcome::default();
    for &coll in &spec.colls {
        for &dt in &spec.dtypes {
            let ops: &[RedOp] = if coll.reduces() { &spec.ops } else { &[RedOp::Sum] };
            for &op in ops {
                for (ci, &count) in spec.counts.iter().enumerate() {
                    for &inp in &spec.in_place {
                        let what = format!(
                            "{} {} {} count={} {} nranks={} rank={}",
                            coll.name(),
                            dt,
                            op,
                            count,
                            if inp { "in-place" } else { "out-of-place" },
                            comm.nranks(),
                            comm.rank()
                        );
                        let wrong =
                            one(comm, coll, dt, op, count, ci, inp).map_err(|e| format!("{what}: occl error: {e}"))?;
                        out.checked += 1;
                        if wrong > 0 && out.failures.len() < 20 {
                            out.failures.push(format!("{what}: {wrong} wrong elements"));
                        }
                    }
                }
            }
        }
    }
    Ok(out)
}

/// One operation; returns the number of wrong elements this rank sees.
pub fn one(
    comm: &Comm,
    coll: Coll,
    dt: DataType,
    op: RedOp,
    count: usize,
    variant: usize,
    in_place: bool,
) -> occl::Result<usize> {
    let (n, r, es) = (comm.nranks(), comm.rank(), dt.size());
    let b = count * es;
    let fill = |rank: usize, first: usize, buf: &mut [u8]| pattern::fill(dt, op, rank, first, buf);
    let wrong = |buf: &[u8], want: &dyn Fn(usize) -> f64| pattern::wrong_exact(dt, buf, want);
    let wrong_red = |buf: &[u8], first: usize| pattern::wrong_reduced(dt, op, n, buf, first);
    let val = |rank: usize, i: usize| pattern::value(dt, op, rank, i);
    let root = (variant + 1) % n;
    // SAFETY (all raw calls below): buffers are sized per the raw API's contract.
    unsafe {
        match coll {
            Coll::AllReduce => {
                let mut s = aligned(b);
                fill(r, 0, bytes_of_mut(&mut s, b));
                if in_place {
                    let p = s.as_mut_ptr().cast::<u8>();
                    comm.all_reduce_raw(p, p, count, dt, op)?;
                    Ok(wrong_red(bytes_of(&s, b), 0))
                } else {
                    let mut d = aligned(b);
                    comm.all_reduce_raw(s.as_ptr().cast(), d.as_mut_ptr().cast(), count, dt, op)?;
                    Ok(wrong_red(bytes_of(&d, b), 0))
                }
            }
            Coll::Broadcast => {
                let mut s = aligned(b);
                fill(r, 0, bytes_of_mut(&mut s, b));
                if in_place {
                    let p = s.as_mut_ptr().cast::<u8>();
                    comm.broadcast_raw(p, p, count, dt, root)?;
                    Ok(wrong(bytes_of(&s, b), &|i| val(root, i)))
                } else {
                    let mut d = aligned(b);
                    comm.broadcast_raw(s.as_ptr().cast(), d.as_mut_ptr().cast(), count, dt, root)?;
                    Ok(wrong(bytes_of(&d, b), &|i| val(root, i)))
                }
            }
            Coll::Reduce => {
                let mut s = aligned(b);
                fill(r, 0, bytes_of_mut(&mut s, b));
                let res = if in_place {
                    let p = s.as_mut_ptr().cast::<u8>();
                    comm.reduce_raw(p, p, count, dt, op, root)?;
                    s
                } else {
                    let mut d = aligned(b);
                    comm.reduce_raw(s.as_ptr().cast(), d.as_mut_ptr().cast(), count, dt, op, root)?;
                    d
                };
                Ok(if r == root { wrong_red(bytes_of(&res, b), 0) } else { 0 })
            }
            Coll::AllGather => {
                let mut d = aligned(b * n);
                if in_place {
                    fill(r, 0, &mut bytes_of_mut(&mut d, b * n)[r * b..(r + 1) * b]);
                    let p = d.as_mut_ptr().cast::<u8>();
                    comm.all_gather_raw(p.add(r * b), p, count, dt)?;
                } else {
                    let mut s = aligned(b);
                    fill(r, 0, bytes_of_mut(&mut s, b));
                    comm.all_gather_raw(s.as_ptr().cast(), d.as_mut_ptr().cast(), count, dt)?;
                }
                Ok(wrong(bytes_of(&d, b * n), &|i| val(i / count.max(1), i % count.max(1))))
            }
            Coll::ReduceScatter => {
                let mut s = aligned(b * n);
                fill(r, 0, bytes_of_mut(&mut s, b * n));
                if in_place {
                    let p = s.as_mut_ptr().cast::<u8>();
                    comm.reduce_scatter_raw(p, p.add(r * b), count, dt, op)?;
                    Ok(wrong_red(&bytes_of(&s, b * n)[r * b..(r + 1) * b], r * count))
                } else {
                    let mut d = aligned(b);
                    comm.reduce_scatter_raw(s.as_ptr().cast(), d.as_mut_ptr().cast(), count, dt, op)?;
                    Ok(wrong_red(bytes_of(&d, b), r * count))
                }
            }
            Coll::AllToAll => {
                // Block j of rank r's input is (r → j): values of rank r at j*count + i.
                let mut s = aligned(b * n);
                fill(r, 0, bytes_of_mut(&mut s, b * n));
                let want = |i: usize| val(i / count.max(1), r * count + i % count.max(1));
                if in_place {
                    let p = s.as_mut_ptr().cast::<u8>();
                    comm.all_to_all_raw(p, p, count, dt)?;
                    Ok(wrong(bytes_of(&s, b * n), &want))
                } else {
                    let mut d = aligned(b * n);
                    comm.all_to_all_raw(s.as_ptr().cast(), d.as_mut_ptr().cast(), count, dt)?;
                    Ok(wrong(bytes_of(&d, b * n), &want))
                }
            }
            Coll::SendRecv => {
                if n == 1 {
                    return Ok(0);
                }
                // A ring of blocking sends: rank 0 sends first, every other rank receives first.
                let (next, prev) = ((r + 1) % n, (r + n - 1) % n);
                let mut s = aligned(b);
                fill(r, 0, bytes_of_mut(&mut s, b));
                let mut d = aligned(b);
                if r == 0 {
                    comm.send_raw(s.as_ptr().cast(), count, dt, next)?;
                    comm.recv_raw(d.as_mut_ptr().cast(), count, dt, prev)?;
                } else {
                    comm.recv_raw(d.as_mut_ptr().cast(), count, dt, prev)?;
                    comm.send_raw(s.as_ptr().cast(), count, dt, next)?;
                }
                Ok(wrong(bytes_of(&d, b), &|i| val(prev, i)))
            }
        }
    }
}
