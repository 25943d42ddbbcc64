#!/bin/bash
# Small-message latency of several occl-perf builds side by side: each round runs every build
# (order rotating) on every collective, pinned (--bind), 5 batches of ITERS calls, out of place;
# the table is the median over rounds. A refactor's "speed does not move" is read here.
#   bench/builds-ab.sh DIR NAME...   runs DIR/occl-perf-NAME for each NAME (the first is the base)
#   RANKS="2 4" COLLS="all_reduce sendrecv all_gather" ROUNDS=12 ITERS=1000 OUT=dir
#   ENV_<NAME>="VAR=VALUE ..." runs build NAME with those variables (e.g. ENV_off="OCCL_METRICS=0").
# ITERS matters: a process's first milliseconds run before the span clock has calibrated.
set -euo pipefail
dir=$1; shift
vs=("$@")
out=${OUT:-$(mktemp -d)}
export OCCL_TIMEOUT=30
for ranks in ${RANKS:-2 4}; do
  for round in $(seq 1 "${ROUNDS:-12}"); do
    k=$((round % ${#vs[@]})); order=("${vs[@]:k}" "${vs[@]:0:k}")
    for v in "${order[@]}"; do
      for coll in ${COLLS:-all_reduce sendrecv all_gather}; do
        envs=ENV_$v
        env ${!envs:-} "$dir/occl-perf-$v" "$coll" -b 8 -e 4096 -f 8 -c 0 -n "${ITERS:-1000}" --ranks "$ranks" --bind \
          --batches 5 --json 2>/dev/null | sed "s/^/$v $coll$ranks $round /" >> "$out/builds-ab.txt"
      done
    done
  done
done
python3 - "$out/builds-ab.txt" "${vs[@]}" <<'PY'
import sys, json, statistics as st
vs = sys.argv[2:]
rows = {}
for l in open(sys.argv[1]):
    try:
        v, coll, rnd, js = l.split(" ", 3); r = json.loads(js)
    except ValueError:
        continue
    if r.get("inplace"):
        continue
    rows.setdefault((coll, r["size_bytes"]), {}).setdefault(v, []).append(r["time_us"])
print("| collective, ranks | bytes | " + " | ".join(f"{v} µs" for v in vs) + " | " + " | ".join(f"{v}/{vs[0]}" for v in vs[1:]) + " |")
print("|---|---|" + "---|" * (2 * len(vs) - 1))
for (coll, size), d in sorted(rows.items()):
    if all(v in d for v in vs):
        med = [st.median(d[v]) for v in vs]
        print(f"| {coll} | {size} | " + " | ".join(f"{m:.3f}" for m in med) + " | " + " | ".join(f"{m / med[0]:.3f}" for m in med[1:]) + " |")
PY
