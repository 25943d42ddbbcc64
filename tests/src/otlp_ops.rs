//! The operations of the OTLP exporter tests' job, each announced on stdout as
//! `OTLPOP func=… count=… dtype=… root=… peer=… algo=…` with NCCL's spellings, so the test can
//! check every span attribute against what the job actually ran.

use occl::{CollType, Comm, RedOp};

/// NCCL's spelling of the algorithm occl runs (its Coll events use the same).
fn nccl_algo(name: &str) -> &'static str {
    match name {
        "ring" | "chain" => "RING",
        "one-shot" => "ONE_SHOT",
        "direct" => "DIRECT",
        _ => "Unknown",
    }
}

fn announce(func: &str, count: usize, dtype: &str, root: i64, peer: i64, algo: &str) {
    println!("OTLPOP func={func} count={count} dtype={dtype} root={root} peer={peer} algo={algo}");
}

/// 1 MiB and 4 KB all-reduces, a broadcast from rank 1, an all-gather, and a send/recv pair with
/// the next rank (2 ranks or more).
pub fn run(comm: &Comm) -> occl::Result<()> {
    let (n, r) = (comm.nranks(), comm.rank());
    let big = 1usize << 18;
    let a = vec![1.0f32; big];
    let mut b = vec![0f32; big];
    announce("AllReduce", big, "ncclFloat32", 0, -1, nccl_algo(comm.algorithm(CollType::AllReduce, big * 4)));
    comm.all_reduce(&a, &mut b, RedOp::Sum)?;
    announce("AllReduce", 1000, "ncclFloat32", 0, -1, nccl_algo(comm.algorithm(CollType::AllReduce, 4000)));
    comm.all_reduce_in_place(&mut b[..1000], RedOp::Max)?;
    let root = 1 % n;
    announce(
        "Broadcast",
        10_000,
        "ncclFloat32",
        root as i64,
        -1,
        nccl_algo(comm.algorithm(CollType::Broadcast, 40_000)),
    );
    comm.broadcast(&a[..10_000], &mut b[..10_000], root)?;
    announce("AllGather", 1000, "ncclFloat32", 0, -1, nccl_algo(comm.algorithm(CollType::AllGather, 4000 * n)));
    comm.all_gather(&a[..1000], &mut b[..1000 * n])?;
    if n > 1 {
        let (to, from) = ((r + 1) % n, (r + n - 1) % n);
        let mut c = vec![0f64; 5000];
        let send = vec![2.0f64; 5000];
        let (s_algo, r_algo) = (comm.algorithm(CollType::Send, 40_000), comm.algorithm(CollType::Recv, 40_000));
        if r % 2 == 0 {
            announce("Send", 5000, "ncclFloat64", 0, to as i64, nccl_algo(s_algo));
            comm.send(&send, to)?;
            announce("Recv", 5000, "ncclFloat64", 0, from as i64, nccl_algo(r_algo));
            comm.recv(&mut c, from)?;
        } else {
            announce("Recv", 5000, "ncclFloat64", 0, from as i64, nccl_algo(r_algo));
            comm.recv(&mut c, from)?;
            announce("Send", 5000, "ncclFloat64", 0, to as i64, nccl_algo(s_algo));
            comm.send(&send, to)?;
        }
    }
    Ok(())
}
