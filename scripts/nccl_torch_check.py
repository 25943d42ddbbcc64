import os, sys, time, torch, torch.distributed as dist
rank = int(os.environ["RANK"]); world = int(os.environ["WORLD_SIZE"])
torch.cuda.set_device(rank)
dev = torch.device("cuda", rank)
dist.init_process_group("nccl", device_id=dev)
res = {}
def check(name, ok):
    res[name] = bool(ok)
libs = sorted({l.split()[-1] for l in open("/proc/self/maps") if "libnccl" in l})
print(f"rank {rank}: nccl version {torch.cuda.nccl.version()} mapped {libs}", flush=True)
try:
    for n in [1, 1000, 1 << 20, 1 << 26]:
        x = torch.full((n,), float(rank + 1), device=dev)
        dist.all_reduce(x); check(f"all_reduce_sum_{n}", torch.all(x == world * (world + 1) / 2))
    x = torch.full((4096,), float(rank + 1), device=dev); dist.all_reduce(x, op=dist.ReduceOp.AVG)
    check("all_reduce_avg", torch.allclose(x, torch.full_like(x, (world + 1) / 2)))
    x = torch.full((4096,), float(rank + 1), device=dev); dist.all_reduce(x, op=dist.ReduceOp.MAX)
    check("all_reduce_max", torch.all(x == world))
    b = torch.arange(1 << 16, device=dev, dtype=torch.bfloat16) * (rank + 1); dist.all_reduce(b)
    check("all_reduce_bf16", torch.allclose(b.float(), (torch.arange(1 << 16, device=dev, dtype=torch.bfloat16) * 3).float(), rtol=1e-2))
    x = torch.full((1 << 20,), float(rank), device=dev); out = torch.empty(world << 20, device=dev)
    dist.all_gather_into_tensor(out, x); check("all_gather", all(torch.all(out[r << 20:(r + 1) << 20] == r) for r in range(world)))
    inp = torch.arange(world << 20, device=dev, dtype=torch.float32); o = torch.empty(1 << 20, device=dev)
    dist.reduce_scatter_tensor(o, inp); check("reduce_scatter", torch.all(o == world * torch.arange(rank << 20, (rank + 1) << 20, device=dev, dtype=torch.float32)))
    x = torch.full((1 << 20,), float(rank + 7), device=dev); dist.broadcast(x, src=1)
    check("broadcast", torch.all(x == 8))
    inp = torch.arange(world * 1024, device=dev, dtype=torch.float32) + 10000 * rank; o = torch.empty_like(inp)
    dist.all_to_all_single(o, inp)
    exp = torch.cat([torch.arange(rank * 1024, (rank + 1) * 1024, device=dev, dtype=torch.float32) + 10000 * r for r in range(world)])
    check("all_to_all", torch.equal(o, exp))
    s = torch.full((1 << 22,), float(rank), device=dev); r_ = torch.empty_like(s)
    ops = [dist.P2POp(dist.isend, s, (rank + 1) % world), dist.P2POp(dist.irecv, r_, (rank - 1) % world)]
    for w in dist.batch_isend_irecv(ops): w.wait()
    check("batch_isend_irecv", torch.all(r_ == (rank - 1) % world))
    g = dist.new_group([0, 1]); x = torch.ones(1000, device=dev); dist.all_reduce(x, group=g)
    check("new_group", torch.all(x == world))
    # DDP, 200 steps, same seed: print the losses for comparison with NVIDIA's NCCL
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10)).to(dev)
    ddp = torch.nn.parallel.DistributedDataParallel(m, device_ids=[rank])
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    gen = torch.Generator(device="cpu").manual_seed(100 + rank)
    losses = []
    t0 = time.time()
    for step in range(200):
        xb = torch.randn(64, 256, generator=gen).to(dev); yb = torch.randint(0, 10, (64,), generator=gen).to(dev)
        loss = torch.nn.functional.cross_entropy(ddp(xb), yb); opt.zero_grad(); loss.backward(); opt.step()
        losses.append(loss.item())
    torch.cuda.synchronize()
    if rank == 0:
        print("DDP_LOSSES " + " ".join(f"{l:.9g}" for l in losses), flush=True)
    print(f"rank {rank}: ddp 200 steps {time.time() - t0:.2f}s", flush=True)
    ras = os.environ.get("NCCLRAS")
    if ras:
        # Query RAS (port 28028) while both ranks are alive and idle on the host: rank 1 sleeps
        # on the host, not in a device collective that would wait out OCCL_TIMEOUT.
        torch.cuda.synchronize()
        if rank == 0:
            import subprocess
            for args in ([], ["-f", "json"]):
                p = subprocess.run([ras] + args, capture_output=True, text=True, timeout=15)
                print(f"NCCLRAS {' '.join(args)} rc={p.returncode}\n{p.stdout}{p.stderr}", flush=True)
        else:
            time.sleep(4)
        x = torch.ones(16, device=dev); dist.all_reduce(x); check("after_ncclras", torch.all(x == world))
except Exception as e:
    print(f"rank {rank}: EXCEPTION {type(e).__name__}: {e}", flush=True)

def premul(factor):
    # A Python float becomes an ncclScalarHostImmediate scalar, a device tensor an
    # ncclScalarDevice one (its address, read by the kernel). Older bindings take a list.
    try:
        return dist._make_nccl_premul_sum(factor)
    except TypeError:
        return dist._make_nccl_premul_sum([factor])

pre = []
def pcheck(name, ok):
    check(name, ok); pre.append(name)
try:
    tri = world * (world + 1) / 2  # the sum of every rank's (rank + 1)
    x = torch.arange(1 << 22, device=dev, dtype=torch.float32) * (rank + 1); dist.all_reduce(x, op=dist.ReduceOp.AVG)
    pcheck("avg_4M", torch.equal(x, torch.arange(1 << 22, device=dev, dtype=torch.float32) * tri / world))
    f = torch.tensor(0.25, device=dev)  # 0-dim, float32 like the data
    for name, factor in (("float", 0.25), ("tensor", f)):
        for n in (1000, 1 << 20):
            x = torch.arange(n, device=dev, dtype=torch.float32) * (rank + 1); dist.all_reduce(x, op=premul(factor))
            pcheck(f"premul_all_reduce_{name}_{n}", torch.equal(x, torch.arange(n, device=dev, dtype=torch.float32) * 0.25 * tri))
        inp = torch.arange(world << 16, device=dev, dtype=torch.float32) * (rank + 1); o = torch.empty(1 << 16, device=dev)
        dist.reduce_scatter_tensor(o, inp, op=premul(factor))
        want = torch.arange(rank << 16, (rank + 1) << 16, device=dev, dtype=torch.float32) * 0.25 * tri
        pcheck(f"premul_reduce_scatter_{name}", torch.equal(o, want))
    # The device scalar is read when the kernel runs: a captured graph replays with the value of
    # the moment.
    x = torch.empty(1 << 16, device=dev); x0 = torch.arange(1 << 16, device=dev, dtype=torch.float32) * (rank + 1)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        x.copy_(x0); dist.all_reduce(x, op=premul(f))
    got = []
    for v in (0.5, 2.0):
        f.fill_(v); g.replay(); torch.cuda.synchronize()
        got.append(torch.equal(x, torch.arange(1 << 16, device=dev, dtype=torch.float32) * v * tri))
    pcheck("premul_graph_replay", all(got))
except Exception as e:
    print(f"rank {rank}: EXCEPTION in the pre-multiply checks {type(e).__name__}: {e}", flush=True)
    pcheck("premul_exception", False)
# ncclGroupSimulateEnd through PyTorch's time estimator (when this PyTorch has one): an
# estimate in µs for a group it never runs; the tensor must stay untouched.
try:
    est = getattr(dist.distributed_c10d, "_time_estimator", None)
    if est is None:
        print(f"rank {rank}: SIMULATE SKIPPED: this PyTorch has no distributed_c10d._time_estimator", flush=True)
    else:
        times = []
        for n in (1 << 10, 1 << 26):
            x = torch.full((n,), float(rank + 1), device=dev)
            with est(device=dev) as cm:
                dist.all_reduce(x)
            torch.cuda.synchronize()
            times.append(cm.estimated_time)
            check(f"simulate_untouched_{n}", torch.all(x == rank + 1))
        print(f"rank {rank}: SIMULATE all_reduce 4 KiB {times[0]} us, 256 MiB {times[1]} us", flush=True)
        check("simulate_estimates", 0 < times[0] < times[1])
except Exception as e:
    print(f"rank {rank}: EXCEPTION in the simulate check {type(e).__name__}: {e}", flush=True)
    check("simulate_exception", False)
bad = [k for k in pre if not res[k]]
print(f"rank {rank}: PREMUL {'PASS' if pre and not bad else 'FAIL'} ({len(pre) - len(bad)}/{len(pre)} ok"
      + (f"; wrong: {' '.join(bad)}" if bad else "") + ")", flush=True)
print(f"rank {rank}: RESULTS " + " ".join(f"{k}={'ok' if v else 'WRONG'}" for k, v in res.items()), flush=True)
dist.destroy_process_group()
