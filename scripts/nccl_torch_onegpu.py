# Two ranks on one GPU (both set cuda:0): an all-reduce and a broadcast, or the error the library
# gives (NVIDIA's NCCL refuses a communicator with two ranks on one device).
import os, torch, torch.distributed as dist
rank = int(os.environ["RANK"]); world = int(os.environ["WORLD_SIZE"])
torch.cuda.set_device(0)
dev = torch.device("cuda", 0)
try:
    dist.init_process_group("nccl", device_id=dev)
    x = torch.full((1 << 20,), float(rank + 1), device=dev); dist.all_reduce(x)
    y = torch.full((1000,), float(rank), device=dev); dist.broadcast(y, src=1)
    torch.cuda.synchronize()
    ok = bool(torch.all(x == world * (world + 1) / 2)) and bool(torch.all(y == 1))
    print(f"rank {rank}: ONEGPU {'ok' if ok else 'WRONG'}", flush=True)
    dist.destroy_process_group()
except Exception as e:
    print(f"rank {rank}: ONEGPU EXCEPTION {type(e).__name__}: {str(e)[:300]}", flush=True)
