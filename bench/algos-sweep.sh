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
#                          forced choice, as before session 11 (choices seconds apart, each in its
#                          own processes).
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

run() { # transport ranks coll algo min max factor iters warmup
  local t=$1 n=$2 c=$3 a=$4 r=$ROUND pin=()
  [[ -n $PIN ]] && pin=(taskset -c "$PIN")
  local env=(OCCL_TRANSPORT="$t") f=${c//_/}
  # Forced for this collective only (NCCL's per-collective syntax): occl-perf's own all-reduce
  # (barrier, result check) keeps the tuner's choice, and "pat" leaves it one.
  [[ $a != - ]] && env+=(OCCL_ALGO="$f:${a%%/*}")
  # A plain ALGO is that algorithm with Simple (what occl-tune reads it as), not the tuner's protocol.
  if [[ $a == */* ]]; then env+=(OCCL_PROTO="$f:${a#*/}"); elif [[ $a != - ]]; then env+=(OCCL_PROTO="$f:simple"); fi
  env "${env[@]}" timeout 600 "${pin[@]}" "$PERF" "$c" -b "$5" -e "$6" -f "$7" -n "$8" -w "$9" -c 1 \
    --ranks "$n" --json ${EXTRA:-} 2>/dev/null \
    | python3 -c '
import json, sys
forced, rnd = sys.argv[1], int(sys.argv[2])
for l in sys.stdin:
    if l.startswith("{"):
        r = json.loads(l)
        r["forced"] = forced
        r["round"] = rnd
        print(json.dumps(r), flush=True)
' "$a" "$r" || echo "{\"failed\": true, \"collective\": \"$c\", \"nranks\": $n, \"transport\": \"$t\", \"forced\": \"$a\"}"
}

compare() { # transport ranks coll list min max factor iters warmup
  local t=$1 n=$2 c=$3 list r=$ROUND pin=() a
  # As in run(): a plain ALGO runs with Simple; its rows keep the plain name.
  list=$(for a in ${4//,/ }; do if [[ $a == - || $a == */* ]]; then echo -n "$a,"; else echo -n "$a/simple,"; fi; done)
  list=${list%,}
  [[ -n $PIN ]] && pin=(taskset -c "$PIN")
  OCCL_TRANSPORT="$t" timeout 1200 "${pin[@]}" "$PERF" "$c" -b "$5" -e "$6" -f "$7" -n "$8" -w "$9" -c 1 \
    --ranks "$n" --compare="$list" ${EXTRA:-} 2>/dev/null \
    | python3 -c '
import json, sys
rnd = int(sys.argv[1])
for l in sys.stdin:
    if l.startswith("{"):
        r = json.loads(l)
        r["round"] = rnd
        if r["forced"].endswith("/simple"):
            r["forced"] = r["forced"][: -len("/simple")]
        print(json.dumps(r), flush=True)
' "$r" || echo "{\"failed\": true, \"collective\": \"$c\", \"nranks\": $n, \"transport\": \"$t\", \"forced\": \"$list\"}"
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
