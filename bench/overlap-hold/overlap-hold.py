"""What holding SMs costs a model's matrix multiplies, with nothing else going on.

The GEMM stream of bench/gpu-overlap.py (bf16 8192^3, 50 back to back) runs beside a stream of
kernels that each hold K SMs for T microseconds and do nothing (hold.cu: one block an SM, by its
shared memory, which a GEMM block cannot share), issued back to back so that they span the GEMMs,
as a collective stream does. Per (K, T): the GEMM's loss (1 - alone / beside, median of REPS
rounds, each against the GEMMs alone in the same round, and their range), the share of the GPU's
SM time the holds took while the GEMMs ran (K x holds x T / (SMs x the GEMMs' time beside them)),
and how long the hold stream ran against the GEMMs (its span includes each hold's wait for SMs).
If the loss follows K x T, a collective costs the GEMM what its SMs hold, however few; if it
follows T alone, fewer SMs for as long cost as much.

PERIOD_US=P issues one hold every P microseconds from the host for as long as the GEMMs ran alone,
instead of back to back: the holds then take T / P of the time. K:T:C launches each hold as
clusters of C blocks spread over the GPU's processing clusters, as NCCL launches its kernels on
sm90 (cgaClusterSize 4 unless told otherwise); C = 1, the default, is a plain launch, as occl's.
The first line names the GEMM's kernels, whose names say their own cluster shape. Paced, each
row also gives how long the holds waited from their launch to their end beyond T (their wait for
SMs), as percentiles in ms.

    python3 bench/overlap-hold/overlap-hold.py [K:T_us[:C] ...]     (one GPU; nvcc on PATH)
"""
import ctypes
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch

M = 8192
GEMMS = 50
SMEM = 160 * 1024  # more than half an H100/H200 SM's 228 KiB: one block an SM


def build():
    here = os.path.dirname(os.path.abspath(__file__))
    out = os.path.join(tempfile.mkdtemp(prefix="occl-hold-"), "libhold.so")
    subprocess.run(["nvcc", "-O3", "-arch=sm_90", "-shared", "-Xcompiler", "-fPIC", "-o", out,
                    os.path.join(here, "hold.cu")], check=True)
    lib = ctypes.CDLL(out)
    lib.occl_hold.argtypes = [ctypes.c_int, ctypes.c_ulonglong, ctypes.c_int, ctypes.c_int, ctypes.c_void_p]
    return lib


def main():
    configs = [tuple(int(x) for x in (c + ":1").split(":")[:3]) for c in sys.argv[1:]] or \
        [(k, t, 1) for t in (300, 1000) for k in (4, 8, 16, 24, 32)]
    lib = build()
    torch.cuda.set_device(0)
    a = torch.randn(M, M, device="cuda", dtype=torch.bfloat16)
    b = torch.randn_like(a)
    gemm_s, hold_s = torch.cuda.Stream(), torch.cuda.Stream()
    for _ in range(3):
        torch.mm(a, b)
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        torch.mm(a, b)
        torch.cuda.synchronize()
    print(json.dumps({"gemm_kernels": sorted({e.name for e in prof.events() if e.device_type.name == "CUDA"})}),
          flush=True)

    def gemms():
        with torch.cuda.stream(gemm_s):
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            for _ in range(GEMMS):
                torch.mm(a, b)
            e1.record()
        return e0, e1

    def hold(k, t_us, c):
        rc = lib.occl_hold(k, t_us * 1000, SMEM, c, ctypes.c_void_p(hold_s.cuda_stream))
        if rc != 0:
            raise RuntimeError(f"hold launch failed: CUDA error {rc}")

    def holds(k, t_us, c, n):
        with torch.cuda.stream(hold_s):
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            for _ in range(n):
                hold(k, t_us, c)
            e1.record()
        return e0, e1

    def paced(k, t_us, c, period_us, ms):
        """GEMMs beside a hold issued every period_us by this thread, for ms: a duty cycle. Also
        each hold's events, one before its launch and one after its end."""
        g, marks = gemms(), []
        with torch.cuda.stream(hold_s):
            start, n = time.perf_counter(), 0
            while (time.perf_counter() - start) * 1000 < ms:
                e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                e0.record()
                hold(k, t_us, c)
                e1.record()
                marks.append((e0, e1))
                n += 1
                time.sleep(max(0.0, start + n * period_us / 1e6 - time.perf_counter()))
        return g, n, marks

    reps = int(os.environ.get("REPS", "5"))
    period = int(os.environ.get("PERIOD_US", "0"))
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for k, t_us, c in configs:
        losses, share, span, waits = [], [], [], []
        for i in range(1 + reps):
            g0, g1 = gemms()
            torch.cuda.synchronize()
            alone = g0.elapsed_time(g1)
            if period:
                (g0, g1), n, marks = paced(k, t_us, c, period, alone)
                torch.cuda.synchronize()
                beside, held = g0.elapsed_time(g1), float("nan")
                if i:
                    waits += [a.elapsed_time(b) - t_us / 1000 for a, b in marks]
            else:
                n = max(1, int(alone * 1000 / t_us))
                h0, h1 = holds(k, t_us, c, n)
                g0, g1 = gemms()
                torch.cuda.synchronize()
                beside = g0.elapsed_time(g1)
                held = h0.elapsed_time(h1) / beside
            if i:
                losses.append(1 - alone / beside)
                share.append(k * n * t_us / 1000 / (beside * sms))
                span.append(held)
        print(json.dumps({"sms": k, "hold_us": t_us, "cluster": c, "period_us": period, "gemm_loss": round(statistics.median(losses), 4),
                          "gemm_loss_range": [round(min(losses), 4), round(max(losses), 4)],
                          "sm_share_held": round(statistics.median(share), 4),
                          "hold_span_per_gemms": round(statistics.median(span), 3) if not period else None,
                          "paced_wait_ms": {q: round(sorted(waits)[min(len(waits) - 1, int(f * len(waits)))], 3)
                                            for q, f in (("p50", .5), ("p90", .9), ("max", 1.0))} if waits else None}),
              flush=True)


if __name__ == "__main__":
    main()
