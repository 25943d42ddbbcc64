#!/usr/bin/env python3
"""Summarises bench/algos-sweep.sh output: per (collective, ranks, transport, size) the median
time over rounds of the tuner's choice and of every forced algorithm/protocol, and how far the
tuner's choice is from the best forced one (the aim: never more than 10% slower).

    python3 bench/algos-report.py sweep.jsonl [--md] [--coll all_reduce]

Out-of-place rows only (in place is the same schedule). Sizes as occl-perf prints them (the
total buffer for all-gather and reduce-scatter).
"""
import argparse
import json
import statistics
import sys
from collections import defaultdict


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("files", nargs="+")
    ap.add_argument("--md", action="store_true", help="markdown table")
    ap.add_argument("--coll", default=None)
    ap.add_argument("--by-choice", action="store_true", help="judge the tuner by the forced rows of its choice")
    ap.add_argument("--slack", type=float, default=1.10, help="flag a tuner/best ratio above this")
    a = ap.parse_args()
    t = defaultdict(list)  # (coll, n, transport, size, forced) -> [time_us]
    picked = {}  # (coll, n, transport, size) -> "algo/proto" the tuner ran
    for f in a.files:
        for line in open(f):
            if not line.startswith("{"):
                continue
            r = json.loads(line)
            if r.get("failed") or r.get("inplace") or "collective" not in r:
                continue
            if a.coll and r["collective"] != a.coll:
                continue
            k = (r["collective"], r["nranks"], r["transport"], r["size_bytes"])
            t[k + (r["forced"],)].append(r["time_us"])
            if r["forced"] == "-":
                picked[k] = f'{r["algo"]}/{r["proto"]}'
    keys = sorted({k[:4] for k in t})
    bad = 0
    if a.md:
        print("| collective | ranks | transport | size | tuner (choice) µs | best forced µs | tuner/best | all forced (median µs) |")
        print("|---|---|---|---|---|---|---|---|")
    for k in keys:
        forced = {f: statistics.median(v) for (c, n, tr, s, f), v in t.items() if (c, n, tr, s) == k}
        tun = forced.pop("-", None)
        if tun is None or not forced:
            continue
        best_f, best = min(forced.items(), key=lambda x: x[1])
        ratio = tun / best if best > 0 else float("nan")
        # The same configuration forced: its median is the fairer figure for the choice (on a
        # noisy machine the tuner's own rows vary as much as any single row).
        algo, proto = picked.get(k, "?/?").split("/")
        name = {"one-shot": "oneshot", "chain": "ring"}.get(algo, algo)
        same = forced.get(name if proto == "simple" else f"{name}/{proto}")
        if same is not None and a.by_choice:
            ratio = same / best if best > 0 else float("nan")
        flag = " <-- over" if ratio > a.slack else ""
        bad += ratio > a.slack
        rest = ", ".join(f"{f} {v:.2f}" for f, v in sorted(forced.items()))
        if a.md:
            print(f"| {k[0]} | {k[1]} | {k[2]} | {k[3]} | {tun:.2f} ({picked.get(k, '?')}) | {best:.2f} ({best_f}) | {ratio:.2f}{'**' if flag else ''} | {rest} |")
        else:
            print(f"{k[0]:14} n={k[1]} {k[2]:3} {k[3]:>9} tuner {tun:9.2f} ({picked.get(k, '?'):14}) best {best:9.2f} ({best_f:12}) x{ratio:.2f}{flag}  [{rest}]")
    print(f"{bad} size(s) where the tuner's choice is more than {a.slack:.2f}x the best forced", file=sys.stderr)


if __name__ == "__main__":
    main()
