"""How long each collective's kernel held its SMs, from an NCCL profiler plugin's KernelCh events,
whichever library emitted them: NVIDIA's NCCL and occl's libnccl.so.2 both report a KernelCh per
channel of a collective with the GPU's %globaltimer at the channel's start and stop (pTimer).

Reads the logs of the v5 recorder plugin (telemetry/tests/plugins/recorder_v5.c, loaded with
NCCL_PROFILER_PLUGIN and OCCL_TEST_PLUGIN_MASK=66, Coll and KernelCh) and prints one JSON line per
log prefix: per Coll, its kernel's span from its first channel's start to its last channel's stop
(the time it held SMs, its waits for the peer included) and the spread of its channels' starts
(how long the first channel waited for the last to be placed), as percentiles in milliseconds.

    python3 bench/kernel-durations.py PREFIX...      (the plugin's logs are PREFIX-<comm>-<rank>.log)
"""
import glob
import json
import statistics
import sys

COLL, KERNEL_CH, KERNEL_CH_STOP = 0x2, 0x40, 22


def spans(path):
    """(span, start spread) in ns per Coll of one log whose every KernelCh has a start and a stop."""
    coll, start, stop, parent = set(), {}, {}, {}
    for line in open(path):
        tok = line.split()
        if not tok or tok[0] not in ("start", "state"):
            continue
        kv = dict(t.split("=", 1) for t in tok[1:] if "=" in t)
        h = int(kv["handle"])
        if tok[0] == "start" and int(kv["type"]) == COLL:
            coll.add(h)
        elif tok[0] == "start" and int(kv["type"]) == KERNEL_CH:
            start[h], parent[h] = int(kv["ptimer"]), int(kv["parent"])
        elif tok[0] == "state" and int(kv["state"]) == KERNEL_CH_STOP:
            stop[h] = int(kv["ptimer"])
    chans = {}
    for h, p in parent.items():
        if p in coll and h in stop:
            chans.setdefault(p, []).append((start[h], stop[h]))
    return [(max(e for _, e in c) - min(s for s, _ in c), max(s for s, _ in c) - min(s for s, _ in c))
            for c in chans.values()]


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def main():
    for prefix in sys.argv[1:]:
        logs = sorted(glob.glob(prefix + "-*.log"))
        rows = [r for path in logs for r in spans(path)]
        if not rows:
            print(json.dumps({"prefix": prefix, "logs": len(logs), "colls": 0}))
            continue
        ms = lambda ns: round(ns / 1e6, 3)
        span, spread = [r[0] for r in rows], [r[1] for r in rows]
        print(json.dumps({
            "prefix": prefix, "logs": len(logs), "colls": len(rows),
            "span_ms": {q: ms(pct(span, f)) for q, f in (("p10", .1), ("p50", .5), ("p90", .9), ("max", 1.0))},
            "span_mean_ms": ms(statistics.mean(span)),
            "start_spread_ms": {q: ms(pct(spread, f)) for q, f in (("p50", .5), ("p90", .9), ("max", 1.0))},
        }), flush=True)


if __name__ == "__main__":
    main()
