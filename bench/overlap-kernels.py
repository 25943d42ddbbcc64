"""What the collective's kernels did beside the GEMMs, from bench/gpu-overlap.py's PROFILE traces.

    python3 bench/overlap-kernels.py DIR       (DIR: gpu-overlap.py's PROFILE=DIR)

Per trace (a library, a collective and a size, one rank): the calls that ran beside the GEMMs (a
rank's first call is left out: it may wait for the other rank's profiler), their kernels'
median duration, the median gap from one kernel's end to the next one's start, the share of the
GEMMs' span the kernels covered, and the GEMM's median duration. A kernel that starts at once
after the last one and runs for a whole GEMM holds its SMs all along; one that waits for SMs
between calls leaves them to the GEMM (gpu-overlap.md, run 10).
"""
import glob
import json
import statistics as st
import sys


def main(d):
    for f in sorted(glob.glob(d + "/*.json")):
        ev = json.load(open(f))["traceEvents"]
        ks = sorted((e for e in ev if e.get("ph") == "X" and e.get("cat") == "kernel"), key=lambda e: e["ts"])
        gemm = [e for e in ks if e["name"].startswith("nvjet") or "gemm" in e["name"].lower()]
        coll = [e for e in ks if e not in gemm and "probe" not in e["name"]]
        name = f.rsplit("/", 1)[-1]
        if not gemm or len(coll) < 6:
            print(f"{name}: too few kernels")
            continue
        lo, hi = gemm[0]["ts"], gemm[-1]["ts"] + gemm[-1]["dur"]
        coll = [e for e in coll[1:] if e["ts"] < hi and e["ts"] + e["dur"] > lo]
        if len(coll) < 4:
            print(f"{name}: too few calls beside the GEMMs")
            continue
        dur = [e["dur"] for e in coll]
        gaps = [b["ts"] - a["ts"] - a["dur"] for a, b in zip(coll, coll[1:])]
        print(f"{name}: {len(coll)} calls, kernel {st.median(dur):.0f} us ({min(dur):.0f}-{max(dur):.0f}), "
              f"gap {st.median(gaps):.0f} us, cover {sum(dur) / (hi - lo):.2f}, "
              f"GEMM {st.median(e['dur'] for e in gemm):.0f} us, {coll[0]['name'][:40]}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
