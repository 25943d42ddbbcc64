#!/usr/bin/env bash
# Registered buffers (Comm::register, occl-perf --registered) against unregistered buffers and
# Open MPI, side by side in one run: shm all-reduce, all-gather and reduce-scatter at 1, 4, 16
# and 64 MiB (nccl-tests' sizes: the whole send buffer of a reduce-scatter), for 2
# and 4 ranks, the four variants below one after another, ROUNDS times. Prints a markdown table
# of median bus bandwidth (GB/s) over rounds, and the registered/unregistered ratios.
#
#   PERF=target/release/occl-perf MPI_COLL_BIN=path/to/mpi_coll bash bench/registered-vs-mpi.sh
#
# Every occl run pins rank r to its own share of the CPUs (the PIN list, or all this process
# may use, divided by the rank count: --bind --cpus-per-rank). Unregistered, a rank runs on one
# thread whatever its share; registered, its helper threads (OCCL_REG_THREADS, automatic: the
# share less one, at most 7) take parts of large operations. A fourth row, "registered, 1 CPU",
# pins each rank to one CPU, where no helper starts. Open MPI runs as mpirun places it.
#
# Environment: ROUNDS=5, RANKS="2 4", PIN=cpu list for taskset (both tools), MPI_MIN_SEC=0.3,
# KEEP=dir (keep the raw JSON lines). mpi_coll is bench/anchors/mpi_coll.c built with
# mpicc, its SIZES set to {1 << 20, 4 << 20, 16 << 20, 64 << 20} (bench/baselines/registered-vs-mpi.md).
set -euo pipefail
say() { printf '%s\n' "$*" >&2; }
die() { say "registered-vs-mpi: $*"; exit 1; }

PERF=${PERF:-target/release/occl-perf}
MPI_COLL_BIN=${MPI_COLL_BIN:?set MPI_COLL_BIN to a built mpi_coll}
ROUNDS=${ROUNDS:-5}
RANKS=${RANKS:-"2 4"}
MPI_MIN_SEC=${MPI_MIN_SEC:-0.3}
PIN=${PIN:-}
pin=()
[[ -n $PIN ]] && pin=(taskset -c "$PIN")
cpus=$("${pin[@]}" nproc)
[[ -x $PERF ]] || die "$PERF is not executable"
command -v mpirun >/dev/null || die "needs Open MPI (source the env.sh of bench/pack-openmpi.sh)"
TMP=$(mktemp -d "${TMPDIR:-/tmp}/registered-vs-mpi.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
RAW="$TMP/raw.jsonl"

occl() { # n coll tool cpus-per-rank [flags]
  local n=$1 c=$2 tool=$3 per=$4
  shift 4
  OCCL_TRANSPORT=shm timeout 600 "${pin[@]}" "$PERF" "$c" -b 1M -e 64M -f 4 -n 5 -w 3 -c 0 --batches 9 --bind \
    --cpus-per-rank "$per" --json --ranks "$n" "$@" 2>"$TMP/err" |
    python3 -c '
import json, sys
tool, rnd = sys.argv[1], sys.argv[2]
for line in sys.stdin:
    if line.startswith("{"):
        d = json.loads(line)
        if not d["inplace"]:
            print(json.dumps({"tool": tool, "coll": d["collective"], "nranks": d["nranks"], "size_bytes": d["size_bytes"],
                              "busbw_gbps": d["busbw_gbps"], "algo": d["algo"], "round": int(rnd)}))
' "$tool" "$round" >>"$RAW" || { cat "$TMP/err" >&2; say "registered-vs-mpi: occl-perf failed ($n ranks, $c, $tool)"; }
}

for ((round = 1; round <= ROUNDS; round++)); do
  for n in $RANKS; do
    for c in all_reduce all_gather reduce_scatter; do
      say "registered-vs-mpi: round $round/$ROUNDS, $n ranks, $c"
      share=$((cpus / n > 0 ? cpus / n : 1))
      occl "$n" "$c" occl "$share"
      occl "$n" "$c" occl-registered "$share" --registered
      occl "$n" "$c" occl-registered-1cpu 1 --registered
    done
    say "registered-vs-mpi: round $round/$ROUNDS, $n ranks, Open MPI"
    timeout 600 "${pin[@]}" mpirun --allow-run-as-root --oversubscribe -np "$n" "$MPI_COLL_BIN" allreduce,allgather,reducescatter \
      "$MPI_MIN_SEC" 2>/dev/null | awk -v n="$n" -v r="$round" '
        ($1 == "allreduce" || $1 == "allgather" || $1 == "reducescatter") && NF >= 9 {
          c = ($1 == "allreduce") ? "all_reduce" : ($1 == "allgather") ? "all_gather" : "reduce_scatter"
          printf "{\"tool\": \"mpi\", \"coll\": \"%s\", \"nranks\": %s, \"size_bytes\": %s, \"busbw_gbps\": %s, \"round\": %s}\n", c, n, $2, $8, r }' \
      >>"$RAW" || say "registered-vs-mpi: mpirun failed ($n ranks)"
  done
done
[[ -n ${KEEP:-} ]] && mkdir -p "$KEEP" && cp "$RAW" "$KEEP/"

python3 - "$RAW" <<'PY'
import json, statistics, sys
cells = {}
for line in open(sys.argv[1]):
    if line.startswith("{"):
        d = json.loads(line)
        cells.setdefault((d["coll"], d["nranks"], d["size_bytes"], d["tool"]), []).append(d["busbw_gbps"])
med = {k: statistics.median(v) for k, v in cells.items()}
print("| collective | ranks | size | unregistered | registered | registered, 1 CPU | Open MPI | registered / unregistered | registered, 1 CPU / unregistered | registered / Open MPI |")
print("|---|---|---|---|---|---|---|---|---|---|")
keys = sorted({k[:3] for k in med})
for coll, n, size in keys:
    g = lambda t: med.get((coll, n, size, t))
    u, r, r1, m = g("occl"), g("occl-registered"), g("occl-registered-1cpu"), g("mpi")
    f = lambda x: "–" if x is None else f"{x:.2f}"
    ratio = lambda a, b: "–" if a is None or not b else f"{a / b:.2f}×"
    print(f"| {coll} | {n} | {size >> 20} MiB | {f(u)} | {f(r)} | {f(r1)} | {f(m)} | {ratio(r, u)} | {ratio(r1, u)} | {ratio(r, m)} |")
print()
print("Bus bandwidth in GB/s (nccl-tests' factors), out of place, median over rounds.")
PY
