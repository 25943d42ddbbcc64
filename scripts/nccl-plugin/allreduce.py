"""One rank of the GPU check of libnccl-profiler-occl.so (run by check_nccl.sh under torchrun).

A few hundred NCCL all-reduces at two sizes (8 B and 1 MiB) in training steps marked through
the plugin's occlProfilerStepBegin/End (ProfilerStep#N rows in the traces), a correctness
check, and then,
while the process group still lives (the plugin's /metrics server stops at the last NCCL
communicator's finalize), this rank's /metrics saved to <out>/metrics-rank<N>.txt.
"""

import argparse
import ctypes
import os
import time
import urllib.request

import torch
import torch.distributed as dist


def metrics_url() -> str:
    # The plugin listens on OCCL_METRICS_ADDR's port plus the local rank.
    addr = os.environ.get("OCCL_METRICS_ADDR", "127.0.0.1:9464")
    host, _, port = addr.rpartition(":")
    port = int(port) + int(os.environ.get("LOCAL_RANK", "0"))
    return f"http://{host or '127.0.0.1'}:{port}/metrics"


def step_marker():
    """The plugin's step functions: the library NCCL loaded (same path, so the same mapping)."""
    path = os.environ.get("NCCL_PROFILER_PLUGIN", "")
    if not os.path.isabs(path):
        return None
    lib = ctypes.CDLL(path)
    lib.occlProfilerStepBegin.argtypes = [ctypes.c_uint64]
    return lib


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=300, help="all-reduces per size")
    ap.add_argument("--steps", type=int, default=5, help="training steps the iterations are split into")
    ap.add_argument("--out", required=True, help="directory for this rank's /metrics text")
    args = ap.parse_args()

    local = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    device = torch.device("cuda", local)
    try:
        dist.init_process_group("nccl", device_id=device)  # eager init: NCCL loads the plugin now
    except TypeError:
        dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()

    sizes = {"8B": 2, "1MiB": 1 << 18}  # float32 elements
    bufs = {k: torch.ones(n, device=device) for k, n in sizes.items()}
    torch.cuda.synchronize()
    marker = step_marker()
    per_step = max(1, args.iters // max(1, args.steps))
    t0 = time.perf_counter()
    for i in range(args.iters):
        if marker is not None and i % per_step == 0:
            torch.cuda.synchronize()  # a step's collectives end inside it
            marker.occlProfilerStepBegin(i // per_step + 1)
        for b in bufs.values():
            dist.all_reduce(b)
            b.div_(world)
    torch.cuda.synchronize()
    if marker is not None:
        marker.occlProfilerStepEnd()
    dt = time.perf_counter() - t0
    for k, b in bufs.items():
        if not torch.allclose(b, torch.ones_like(b)):
            raise SystemExit(f"rank {rank}: wrong all-reduce result at {k}")
    n = args.iters * len(bufs)
    print(f"rank {rank}/{world}: {n} all-reduces correct in {dt:.3f} s ({dt / n * 1e6:.1f} us each)", flush=True)

    url = metrics_url()
    try:
        body = urllib.request.urlopen(url, timeout=10).read().decode()
    except Exception as e:  # the check prints what it got either way
        body = f"# scraping {url} failed: {e}\n"
    with open(os.path.join(args.out, f"metrics-rank{rank}.txt"), "w") as f:
        f.write(body)

    dist.barrier()
    dist.destroy_process_group()  # NCCL finalizes the plugin: exporters flush


if __name__ == "__main__":
    main()
