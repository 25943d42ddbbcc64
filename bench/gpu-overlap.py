"""Collectives beside a model's matrix multiplies, one process per GPU through torch.distributed.

Each rank runs a bf16 GEMM stream (8192^3, back to back) and, on another stream of the same
process, a collective stream (all-reduce, all-gather, reduce-scatter, all-to-all, or sendrecv: a group
of a send to rank r+1 and a receive from r-1, as pipeline parallelism issues them; COLLS) started
together with it.
Printed per (collective, size), as one JSON line from rank 0: the GEMM's TFLOP/s alone, the
share of it lost beside the collective (the median of REPS rounds, default 5, after one that sizes the collective stream; each against the
GEMM alone in the same round, and their range), the collective's bus bandwidth alone (the median
of three batches of 20 calls) and beside the GEMM, and rank 0's GPU's median SM clock and power while the GEMM ran alone and beside
the collective (NVML, every 5 ms; absent where NVML is not).

The script is library-blind: `bench/gpu-overlap.sh` runs it once on NVIDIA's libnccl.so.2 and once
with occl's preloaded, in one command, and puts the two side by side.

    python3 bench/gpu-overlap.py NRANKS [SIZE_MiB ...]     (LIB=occl|nccl names the rows)

PROFILE=DIR runs one more round of each (collective, size) under PyTorch's profiler: a Chrome trace
per rank in DIR and rank 0's GPU totals by kernel name on stderr.

PERIOD_MS=P issues one collective every P milliseconds beside the GEMMs (as a training step issues
a layer's all-gather or gradient reduce-scatter between its matrix multiplies) instead of back to
back: every rank the same number of calls, as many as fit the GEMMs' time alone. "busbw_with" is
then the median call's rate from its launch to its end (its wait for SMs included), and the JSON
line has "period_ms" and "calls". The GEMM's loss is then a share of the calls' cost per period.
A PROFILE round still issues its calls back to back.

WINDOWS=1 puts each collective's input and output in symmetric windows, NCCL 2.28's condition
for its copy-engine collectives (NCCL_CTA_POLICY=2) and occl's for calls that write straight into
the peers' buffers: copy-engine calls, and under the default policy the kernels' windowed mode
(all-gather, out-of-place all-to-all, direct broadcast). With PyTorch 2.11's ProcessGroupNCCL, per (collective, size):
`backend = dist.group.WORLD._get_backend(device)`; `pool = torch.cuda.MemPool(backend.mem_allocator)`
(segments from `ncclMemAlloc`); the two tensors allocated under `torch.cuda.use_mem_pool(pool)`;
`backend.register_mem_pool(pool, True)` (the second argument: `symm`), which calls `ncclCommWindowRegister(...,
NCCL_WIN_COLL_SYMMETRIC)` on each of the pool's segments (every rank allocates the same sizes in
the same order, so every rank's buffers lie at the same offsets of their windows); after the
timing `backend.deregister_mem_pool(pool)` (`ncclCommWindowDeregister`). In that mode the input
holds rank-dependent values, and once the timing is done the collective runs once more on a fresh
input and every output element is checked: the JSON line's "wrong" counts the wrong elements over
every rank.
"""
import contextlib
import ctypes
import json
import os
import sys
import threading
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

M = 8192
GEMMS = 50


def gemm_flops():
    return 2 * M**3 * GEMMS


def timed(stream, fn, k):
    """Runs fn k times on stream between two events; returns the events."""
    with torch.cuda.stream(stream):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        for _ in range(k):
            fn()
        e1.record()
    return e0, e1


def value(r, idx):
    """Rank r's input element at index idx: small integers, so bf16 sums of 8 ranks are exact."""
    return (r + idx % 5).to(torch.bfloat16)


def expected(coll, rank, n, nel, out_nel):
    """What `coll` leaves in this rank's output when every rank r's input is value(r, index)."""
    dev = torch.device("cuda")
    if coll == "all_gather":
        return torch.cat([value(q, torch.arange(nel, device=dev)) for q in range(n)])
    if coll == "sendrecv":
        return value((rank - 1) % n, torch.arange(nel, device=dev))
    if coll == "all_to_all":
        blk = nel // n
        return torch.cat([value(q, torch.arange(rank * blk, (rank + 1) * blk, device=dev)) for q in range(n)])
    idx = torch.arange(out_nel, device=dev) + (rank * out_nel if coll == "reduce_scatter" else 0)
    return (n * (idx % 5) + n * (n - 1) // 2).to(torch.bfloat16)


class Clocks:
    """This rank's GPU's SM clock (MHz) and power draw (W), sampled by NVML every 5 ms while a
    phase runs: a GEMM near the power limit runs at the clock the board leaves it, so a
    collective that draws more power costs the GEMM through the clock as well as through SMs.
    Silent (no samples) where NVML cannot be loaded."""

    def __init__(self, device):
        self.dev, self.lib = ctypes.c_void_p(), None
        try:
            lib = ctypes.CDLL("libnvidia-ml.so.1")
            uuid = f"GPU-{torch.cuda.get_device_properties(device).uuid}".encode()
            if lib.nvmlInit_v2() == 0 and lib.nvmlDeviceGetHandleByUUID(uuid, ctypes.byref(self.dev)) == 0:
                self.lib = lib
        except (OSError, AttributeError) as e:
            print(f"no NVML clocks: {e}", file=sys.stderr)
        self.samples = {}

    def sample(self):
        mhz, mw = ctypes.c_uint(), ctypes.c_uint()
        if self.lib.nvmlDeviceGetClockInfo(self.dev, 1, ctypes.byref(mhz)) == 0 and \
                self.lib.nvmlDeviceGetPowerUsage(self.dev, ctypes.byref(mw)) == 0:
            return mhz.value, mw.value / 1e3
        return None

    @contextlib.contextmanager
    def phase(self, name):
        """Samples into `name` until the block ends (it must end with a synchronize); `None`
        samples nothing."""
        if self.lib is None or name is None:
            yield
            return
        stop = threading.Event()

        def run():
            while not stop.is_set():
                s = self.sample()
                if s:
                    self.samples.setdefault(name, []).append(s)
                time.sleep(0.005)

        t = threading.Thread(target=run, daemon=True)
        t.start()
        try:
            yield
        finally:
            stop.set()
            t.join()

    def medians(self):
        """{phase: (median MHz, median W)}, and the samples are cleared."""
        med = lambda v: sorted(v)[len(v) // 2]
        out = {k: (med([m for m, _ in v]), round(med([w for _, w in v]))) for k, v in self.samples.items() if v}
        self.samples = {}
        return out


def profile_round(out, lib, coll, mib, rank, issue):
    """One more round of the collectives beside the GEMMs under PyTorch's profiler (CUPTI): every
    kernel, copy and memset of the process, by stream, as a Chrome trace in `out`, and the GPU
    work's totals by name on stderr (rank 0), to see what a library runs that the other does not."""
    from torch.profiler import profile, ProfilerActivity

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        # After both profilers are up (CUPTI's start takes a few hundred ms on the first round).
        dist.barrier()
        torch.cuda.synchronize()
        issue()
        torch.cuda.synchronize()
    tag = "".join(ch if ch.isalnum() else "_" for ch in f"{lib}-{coll}-{mib}")
    os.makedirs(out, exist_ok=True)
    prof.export_chrome_trace(os.path.join(out, f"{tag}-rank{rank}.json"))
    if rank == 0:
        print(f"# profile {lib} {coll} {mib} MiB", file=sys.stderr)
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=12, max_name_column_width=70),
              file=sys.stderr, flush=True)


def rank_main(rank, n, sizes, port, lib):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=n, device_id=torch.device("cuda", rank))
    a = torch.randn(M, M, device="cuda", dtype=torch.bfloat16)
    b = torch.randn_like(a)
    gemm_stream, coll_stream = torch.cuda.Stream(), torch.cuda.Stream()
    mm = lambda: torch.mm(a, b)
    for _ in range(3):
        mm()
    torch.cuda.synchronize()

    clocks = Clocks(rank)

    def gemm_alone(phase=None):
        with clocks.phase(phase):
            e0, e1 = timed(gemm_stream, mm, GEMMS)
            torch.cuda.synchronize()
        return e0.elapsed_time(e1)

    tflops = lambda ms: gemm_flops() / (ms / 1e3) / 1e12
    windows = os.environ.get("WINDOWS") == "1"
    device = torch.device("cuda", rank)
    backend = dist.group.WORLD._get_backend(device) if windows else None
    for coll in os.environ.get("COLLS", "all_reduce,all_gather,reduce_scatter").split(","):
        for mib in sizes:
            nel = mib * 2**20 // 2
            outs = {"all_gather": nel * n, "all_to_all": nel, "sendrecv": nel}
            pool = torch.cuda.MemPool(backend.mem_allocator) if windows else None
            with torch.cuda.use_mem_pool(pool) if windows else contextlib.nullcontext():
                x = torch.ones(nel, device="cuda", dtype=torch.bfloat16)
                out = torch.empty(outs.get(coll, nel // n), device="cuda", dtype=torch.bfloat16)
            if windows:
                backend.register_mem_pool(pool, True)  # symm: the binding may not name it
                x.copy_(value(rank, torch.arange(nel, device="cuda")))

            def op():
                if coll == "all_reduce":
                    dist.all_reduce(x)
                elif coll == "all_gather":
                    dist.all_gather_into_tensor(out, x)
                elif coll == "all_to_all":
                    dist.all_to_all_single(out, x)
                elif coll == "sendrecv":
                    pair = [dist.P2POp(dist.isend, x, (rank + 1) % n), dist.P2POp(dist.irecv, out, (rank - 1) % n)]
                    for w in dist.batch_isend_irecv(pair):
                        w.wait()
                else:
                    dist.reduce_scatter_tensor(out, x)

            for _ in range(3):
                timed(coll_stream, op, 1)
            torch.cuda.synchronize()
            # The median of three batches of 20: one batch alone can catch a slow moment and
            # misstate the collective's rate by a third (gpu-overlap.md run 19).
            batches = []
            for _ in range(3):
                c0, c1 = timed(coll_stream, op, 20)
                torch.cuda.synchronize()
                batches.append(c0.elapsed_time(c1) / 20)
            t_alone = sorted(batches)[1]
            # Enough collectives to span the GEMMs, launched first so both streams start together;
            # every rank must issue the same number, so the ranks agree on the largest. The first
            # round's results are dropped: it only finds the count. Paced, the count is what fits
            # the GEMMs' time alone at one call a period.
            period = float(os.environ.get("PERIOD_MS", "0"))
            g_ms = gemm_alone()
            k = torch.tensor([max(1, int(g_ms / period)) if period else max(5, int(2 * g_ms / t_alone) + 1)],
                             device="cuda")
            dist.all_reduce(k, op=dist.ReduceOp.MAX)
            k = int(k.item())
            # REPS rounds of (GEMMs alone, GEMMs beside the collectives): the GPU's clocks and
            # the other rank's timing move from round to round, so each loss is taken against
            # the GEMMs' rate of its own round and the median is reported.
            losses, both, alone = [], [], []
            for i in range(1 + int(os.environ.get("REPS", "5"))):
                a_ms = gemm_alone("alone" if i else None)
                dist.barrier()
                with clocks.phase("with" if i else None):
                    if period:
                        e0, e1 = timed(gemm_stream, mm, GEMMS)
                        calls, t0 = [], time.perf_counter()
                        for j in range(k):
                            calls.append(timed(coll_stream, op, 1))
                            time.sleep(max(0.0, t0 + (j + 1) * period / 1e3 - time.perf_counter()))
                    else:
                        c0, c1 = timed(coll_stream, op, k)
                        e0, e1 = timed(gemm_stream, mm, GEMMS)
                    torch.cuda.synchronize()
                w_ms = e0.elapsed_time(e1)
                losses.append(1 - a_ms / w_ms)
                both.append(sorted(c.elapsed_time(d) for c, d in calls)[k // 2] if period else c0.elapsed_time(c1) / k)
                alone.append(tflops(a_ms))
                if period:
                    continue
                # Next round: as many collectives as fit the GEMMs at the rate seen beside them,
                # so that both streams end together and neither runs alone for long.
                kt = torch.tensor([max(5, int(w_ms / both[-1]) + 1)], device="cuda")
                dist.all_reduce(kt, op=dist.ReduceOp.MAX)
                k = int(kt.item())
            losses, both, alone = losses[1:], both[1:], alone[1:]
            if os.environ.get("PROFILE"):
                profile_round(os.environ["PROFILE"], lib, coll, mib, rank, lambda: (timed(coll_stream, op, k),
                                                                                     timed(gemm_stream, mm, GEMMS)))
            clk = clocks.medians()
            wrong = None
            if windows:
                x.copy_(value(rank, torch.arange(nel, device="cuda")))
                torch.cuda.synchronize()
                # On the collective stream, as every timed call: NCCL 2.28.9 under
                # NCCL_CTA_POLICY=2 failed this call on the default stream ('invalid argument').
                timed(coll_stream, op, 1)
                torch.cuda.synchronize()
                got = x if coll == "all_reduce" else out
                bad = torch.tensor([int((got != expected(coll, rank, n, nel, got.numel())).sum())], device="cuda")
                dist.all_reduce(bad)
                wrong = int(bad.item())
                torch.cuda.synchronize()
                backend.deregister_mem_pool(pool)
                del x, out, got
                del pool
            med = lambda v: sorted(v)[len(v) // 2]
            size = nel * 2 * (n if coll == "all_gather" else 1)
            factor = {"all_reduce": 2 * (n - 1) / n, "sendrecv": 1.0}.get(coll, (n - 1) / n)
            bus = lambda ms: size / (ms / 1e3) / 1e9 * factor
            if rank == 0:
                print(json.dumps(dict(lib=lib, collective=coll, nranks=n, size_mib=mib,
                                      gemm_tflops_alone=round(med(alone), 1),
                                      gemm_loss=round(med(losses), 4),
                                      gemm_loss_range=[round(min(losses), 4), round(max(losses), 4)],
                                      busbw_alone=round(bus(t_alone), 1), busbw_with=round(bus(med(both)), 1),
                                      **(dict(period_ms=period, calls=k) if period else {}),
                                      **({f"sm_mhz_{k}": v[0] for k, v in clk.items()}),
                                      **({f"power_w_{k}": v[1] for k, v in clk.items()}),
                                      **(dict(windows=True, wrong=wrong) if windows else {}))),
                      flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    n = int(sys.argv[1])
    sizes = [int(s) for s in sys.argv[2:]] or [64, 256, 1024]
    port = 29500 + os.getpid() % 1000
    mp.spawn(rank_main, args=(n, sizes, port, os.environ.get("LIB", "nccl")), nprocs=n)
