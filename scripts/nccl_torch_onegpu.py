# Two ranks on one GPU (both set cuda:0): an all-reduce and a broadcast, then sends and
# receives (a ring of isend/irecv, batch_isend_irecv of several sizes, gather, scatter), or the
# error the library gives (NVIDIA's NCCL refuses a communicator with two ranks on one device).
# Under NCCL_CTA_POLICY=2 occl runs the sends and receives on the copy engines.
import os, torch, torch.distributed as dist
rank = int(os.environ["RANK"]); world = int(os.environ["WORLD_SIZE"])
torch.cuda.set_device(0)
dev = torch.device("cuda", 0)
try:
    dist.init_process_group("nccl", device_id=dev)
    x = torch.full((1 << 20,), float(rank + 1), device=dev); dist.all_reduce(x)
    y = torch.full((1000,), float(rank), device=dev); dist.broadcast(y, src=1)
    nxt, prv = (rank + 1) % world, (rank + world - 1) % world
    # A ring: each rank's tensor goes to the next.
    r1 = torch.empty(3 << 20, device=dev)
    reqs = [dist.isend(torch.full((3 << 20,), float(rank), device=dev), nxt), dist.irecv(r1, prv)]
    # Several messages of different sizes to one peer, matched in order.
    sizes = [5, 1 << 16, (9 << 20) + 3]
    outs = [torch.empty(n, device=dev) for n in sizes]
    ops = [dist.P2POp(dist.isend, torch.full((n,), float(100 * rank + i), device=dev), nxt) for i, n in enumerate(sizes)]
    ops += [dist.P2POp(dist.irecv, o, prv) for o in outs]
    reqs += dist.batch_isend_irecv(ops)
    for q in reqs:
        q.wait()
    g = [torch.empty(1 << 18, device=dev) for _ in range(world)] if rank == 0 else None
    dist.gather(torch.full((1 << 18,), float(rank + 7), device=dev), g, dst=0)
    sc = torch.empty(1 << 18, device=dev)
    dist.scatter(sc, [torch.full((1 << 18,), float(40 + r), device=dev) for r in range(world)] if rank == 1 else None, src=1)
    torch.cuda.synchronize()
    ok = bool(torch.all(x == world * (world + 1) / 2)) and bool(torch.all(y == 1))
    ok = ok and bool(torch.all(r1 == prv)) and all(bool(torch.all(o == 100 * prv + i)) for i, o in enumerate(outs))
    ok = ok and (rank != 0 or all(bool(torch.all(t == r + 7)) for r, t in enumerate(g))) and bool(torch.all(sc == 40 + rank))
    print(f"rank {rank}: ONEGPU {'ok' if ok else 'WRONG'}", flush=True)
    dist.destroy_process_group()
except Exception as e:
    print(f"rank {rank}: ONEGPU EXCEPTION {type(e).__name__}: {str(e)[:300]}", flush=True)
