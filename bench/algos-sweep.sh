#!/usr/bin/env bash
# Sweeps every algorithm occl can be forced to (and the tuner's own choice) with occl-perf and
# writes one JSON line per (collective, ranks, transport, forced, size, in-place) row. The raw
# material for fitting the tuner's cost model and for bench/algos-vs-mpi.sh. See bench/README.md.
#
#   PERF=target/release/occl-perf bash bench/algos-sweep.sh > sweep.jsonl
#
# Environment:
#   PERF=…                 the occl-perf binary (default: target/release/occl-perf)
#   RANKS="2 4"            rank counts
#   TRANSPORTS="shm tcp"   transports
#   COLLS="all_reduce broadcast reduce all_gather reduce_scatter"
#   LAT="8 64K 2 1000 100" latency sweep: min max factor iters warmup
#   BW="256K 64M 4 6 2"    bandwidth sweep: min max factor iters warmup
#   EXTRA="--batches 15"   more occl-perf flags (median of batches: robust on a busy machine)
#   PROTOS="simple ll"     protocols forced on shm (each algorithm once per protocol; tcp runs
#                          Simple only); a forced row's "forced" is ALGO or ALGO/PROTO
#   PIN="0,1"              run under taskset -c PIN (empty: no pinning)
#   ROUNDS=1               repeat everything, interleaved (rows carry "round"): on a shared,
#                          noisy machine take the minimum or median over rounds
#   COMPARE=1              one occl-perf per (ranks, transport, collective, sweep) with
#                          --compare: the tuner and every forced choice take turns batch by batch
#                          in one run (same buffers, same minutes of the machine). 0: one run per
#                          forced choice (choices seconds apart, each in its own processes,
#                          which alone moves a point by more than 10% on a shared host).
set -euo pipefail
PERF=${PERF:-target/release/occl-perf}
RANKS=${RANKS:-"2 4"}
TRANSPORTS=${TRANSPORTS:-"shm tcp"}
COLLS=${COLLS:-"all_reduce broadcast reduce all_gather reduce_scatter"}
read -r -a LAT <<<"${LAT:-8 64K 2 1000 100}"
read -r -a BW <<<"${BW:-256K 64M 4 6 2}"
PIN=${PIN:-}
ROUNDS=${ROUNDS:-1}
PROTOS=${PROTOS:-"simple ll"}
COMPARE=${COMPARE:-1}
[[ -x $PERF ]] || { echo "algos-sweep: $PERF is not executable" >&2; exit 1; }

# The forced lists per collective: the tuner (-), then each algorithm alone, with each protocol
# on shm (ALGO/PROTO; Simple alone is plain ALGO).
forced() { # collective transport
  local algos a p
  case $1 in
    all_reduce) algos="ring tree oneshot" ;;
    broadcast | reduce) algos="ring tree" ;;
    all_gather | reduce_scatter) algos="ring pat" ;;
  esac
  echo -n "-"
  for a in $algos; do
    for p in $PROTOS; do
      if [[ $p == simple ]]; then echo -n " $a"; elif [[ $2 == shm ]]; then echo -n " $a/$p"; fi
    done
  done
  echo
}

# A plain ALGO means that algorithm with Simple (what occl-tune reads it as), not the tuner's
# protocol: ALGO/simple. The tuner (-) and ALGO/PROTO stay as they are.
explicit() { if [[ $1 == - || $1 == */* ]]; then echo "$1"; else echo "$1/simple"; fi; }

# occl-perf's JSON rows, each tagged with the round and its forced choice (FORCED, or the row's
# own from --compare), "ALGO/simple" written back as the plain "ALGO".
rows() { # forced-or-empty
  python3 -c '
import json, sys
forced, rnd = sys.argv[1], int(sys.argv[2])
for l in sys.stdin:
    if l.startswith("{"):
        r = json.loads(l)
        r["forced"] = forced or r["forced"]
        if r["forced"].endswith("/simple"):
            r["forced"] = r["forced"][: -len("/simple")]
        r["round"] = rnd
        print(json.dumps(r), flush=True)
' "$1" "$ROUND"
}

failed() { # transport ranks coll forced
  echo "{\"failed\": true, \"collective\": \"$3\", \"nranks\": $2, \"transport\": \"$1\", \"forced\": \"$4\"}"
}

run() { # transport ranks coll algo min max factor iters warmup
  local t=$1 n=$2 c=$3 a=$4 pin=() e
  [[ -n $PIN ]] && pin=(taskset -c "$PIN")
  local env=(OCCL_TRANSPORT="$t") f=${c//_/}
  # Forced for this collective only (NCCL's per-collective syntax): occl-perf's own all-reduce
  # (barrier, result check) keeps the tuner's choice, and "pat" leaves it one.
  e=$(explicit "$a")
  [[ $a != - ]] && env+=(OCCL_ALGO="$f:${e%%/*}" OCCL_PROTO="$f:${e#*/}")
  env "${env[@]}" timeout 600 "${pin[@]}" "$PERF" "$c" -b "$5" -e "$6" -f "$7" -n "$8" -w "$9" -c 1 \
    --ranks "$n" --json ${EXTRA:-} 2>/dev/null | rows "$a" || failed "$t" "$n" "$c" "$a"
}

compare() { # transport ranks coll list min max factor iters warmup
  local t=$1 n=$2 c=$3 list="" pin=() a
  for a in ${4//,/ }; do list+="${list:+,}$(explicit "$a")"; done
  [[ -n $PIN ]] && pin=(taskset -c "$PIN")
  OCCL_TRANSPORT="$t" timeout 1200 "${pin[@]}" "$PERF" "$c" -b "$5" -e "$6" -f "$7" -n "$8" -w "$9" -c 1 \
    --ranks "$n" --compare="$list" ${EXTRA:-} 2>/dev/null | rows "" || failed "$t" "$n" "$c" "$4"
}

for ((ROUND = 1; ROUND <= ROUNDS; ROUND++)); do
  for n in $RANKS; do
    for t in $TRANSPORTS; do
      for c in $COLLS; do
        if [[ $COMPARE == 1 ]]; then
          all=$(forced "$c" "$t")
          if [[ ${LAT[0]} != - ]]; then compare "$t" "$n" "$c" "${all// /,}" "${LAT[@]}"; fi
          # LL only in the latency sweep: half of every line is flag, it never pays at 256 KiB+.
          bw=$(for a in $all; do [[ $a == */ll ]] || echo -n "$a "; done)
          bw=${bw% }
          if [[ ${BW[0]} != - ]]; then compare "$t" "$n" "$c" "${bw// /,}" "${BW[@]}"; fi
          continue
        fi
        for a in $(forced "$c" "$t"); do
          if [[ ${LAT[0]} != - ]]; then run "$t" "$n" "$c" "$a" "${LAT[@]}"; fi
          # LL only in the latency sweep: half of every line is flag, it never pays at 256 KiB+.
          if [[ ${BW[0]} != - && $a != */ll ]]; then run "$t" "$n" "$c" "$a" "${BW[@]}"; fi
        done
      done
    done
  done
done
