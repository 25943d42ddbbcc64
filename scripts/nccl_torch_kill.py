# Rank 1 SIGKILLs itself in the middle of a job; rank 0 keeps all-reducing and reports how long
# its ProcessGroupNCCL took to raise the error. Launched without torchrun (whose agent would
# tear down rank 0 as soon as rank 1 dies): RANK, WORLD_SIZE, MASTER_ADDR/PORT from the caller.
import os, signal, sys, time, torch, torch.distributed as dist
rank = int(os.environ["RANK"]); mark = os.environ.get("KILL_MARK", "/tmp/occl-kill-ts")
torch.cuda.set_device(rank); dev = torch.device("cuda", rank)
dist.init_process_group("nccl", device_id=dev)
x = torch.ones(1 << 20, device=dev)
for _ in range(20):
    dist.all_reduce(x)
torch.cuda.synchronize()
dist.barrier(); torch.cuda.synchronize()
if rank == 1:
    time.sleep(1)
    with open(mark, "w") as f:
        f.write(repr(time.time()))
    os.kill(os.getpid(), signal.SIGKILL)
t0 = time.time(); n = 0
try:
    while time.time() - t0 < float(os.environ.get("KILL_WAIT", "60")):
        w = dist.all_reduce(x, async_op=True)
        while not w.is_completed():
            time.sleep(0.001)
            if time.time() - t0 > float(os.environ.get("KILL_WAIT", "60")):
                break
        w.wait(); torch.cuda.synchronize(); n += 1
    print(f"rank 0: NO ERROR after {time.time() - t0:.1f}s, {n} all-reduces", flush=True)
except Exception as e:
    t = time.time()
    k = float(open(mark).read()) if os.path.exists(mark) else float("nan")
    print(f"rank 0: ERROR {t - k:.3f}s after the kill ({n} all-reduces completed): {type(e).__name__}: {str(e)[:400]}", flush=True)
    os._exit(3)
