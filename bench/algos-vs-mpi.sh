#!/usr/bin/env bash
# occl's all-reduce algorithms against Open MPI, side by side in one run: for 2 and 4 ranks over
# shm and tcp, the tuner's choice and each forced algorithm (ring, tree, one-shot; on shm each
# also with the LL protocol at the latency sizes), alternating
# with Open MPI's MPI_Allreduce, ROUNDS times. Prints a markdown table (median over rounds):
# latency (µs) at 8 B–64 KiB, bus bandwidth (GB/s) at 1–64 MiB. See bench/README.md.
#
#   bash bench/algos-vs-mpi.sh > table.md
#
# Environment: ROUNDS=3, RANKS="2 4", TRANSPORTS="shm tcp", MPI_COLL_SRC (the anchor's source),
# MPI_MIN_SEC=0.3, KEEP=dir (keep the raw JSON lines there). On a machine without cargo or mpicc
# (the GPU machines, with Open MPI from bench/pack-openmpi.sh): PERF=prebuilt occl-perf,
# MPI_COLL_BIN=mpi_coll built elsewhere with this table's sizes (MPI_COLL_SIZES_ONLY=DIR writes
# that source to DIR/mpi_coll.c and exits). PIN=2-5 runs both under taskset -c 2-5.
set -euo pipefail
say() { printf '%s\n' "$*" >&2; }
die() { say "algos-vs-mpi: $*"; exit 1; }

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
ROUNDS=${ROUNDS:-3}
RANKS=${RANKS:-"2 4"}
TRANSPORTS=${TRANSPORTS:-"shm tcp"}
MPI_COLL_SRC=${MPI_COLL_SRC:-bench/anchors/mpi_coll.c}
MPI_MIN_SEC=${MPI_MIN_SEC:-0.3}
PIN=${PIN:-}
pin=()
[[ -n $PIN ]] && pin=(taskset -c "$PIN")
TMP=$(mktemp -d "${TMPDIR:-/tmp}/algos-vs-mpi.XXXXXX")
trap 'rm -rf "$TMP"' EXIT

# The anchor with the sizes of this table.
if [[ -z ${MPI_COLL_BIN:-} ]]; then
  [[ -f $MPI_COLL_SRC ]] || die "mpi_coll.c not found at $MPI_COLL_SRC"
  sed 's/^static const size_t SIZES\[\] = .*/static const size_t SIZES[] = {8, 64, 1024, 8192, 65536, 1 << 20, 4 << 20, 16 << 20, 64 << 20};/' \
    "$MPI_COLL_SRC" >"$TMP/mpi_coll.c"
  if [[ -n ${MPI_COLL_SIZES_ONLY:-} ]]; then
    cp "$TMP/mpi_coll.c" "$MPI_COLL_SIZES_ONLY/" && exit 0
  fi
  command -v mpicc >/dev/null || die "needs Open MPI (apt-get install openmpi-bin libopenmpi-dev)"
  mpicc -O2 -o "$TMP/mpi_coll" "$TMP/mpi_coll.c" -lm || die "mpicc failed"
  MPI_COLL_BIN=$TMP/mpi_coll
fi
command -v mpirun >/dev/null || die "needs Open MPI (apt-get install openmpi-bin libopenmpi-dev)"
if [[ -z ${PERF:-} ]]; then
  cargo build --release -p occl-tests --bin occl-perf >"$TMP/build.log" 2>&1 || { cat "$TMP/build.log" >&2; die "build failed"; }
  PERF="${CARGO_TARGET_DIR:-$ROOT/target}/release/occl-perf"
fi

RAW="$TMP/raw.jsonl"
for ((round = 1; round <= ROUNDS; round++)); do
  for n in $RANKS; do
    for t in $TRANSPORTS; do
      say "algos-vs-mpi: round $round/$ROUNDS, $n ranks, $t: occl"
      PERF=$PERF PIN=$PIN ROUNDS=1 RANKS=$n TRANSPORTS=$t COLLS=all_reduce LAT="8 64K 2 100 50" BW="1M 64M 4 1 1" EXTRA="--batches 15 --bind" \
        bash bench/algos-sweep.sh | sed "s/\"round\": 1/\"round\": $round/" >>"$RAW"
      say "algos-vs-mpi: round $round/$ROUNDS, $n ranks, $t: Open MPI"
      extra=()
      [[ $t == tcp ]] && extra=(--mca pml ob1 --mca btl self,tcp)
      timeout 600 "${pin[@]}" mpirun --allow-run-as-root --oversubscribe -np "$n" "${extra[@]}" "$MPI_COLL_BIN" allreduce \
        "$MPI_MIN_SEC" 2>/dev/null | awk -v n="$n" -v t="$t" -v r="$round" '
          $1 == "allreduce" && NF >= 9 {
            printf "{\"tool\": \"mpi\", \"nranks\": %s, \"transport\": \"%s\", \"size_bytes\": %s, \"time_us\": %s, \"busbw_gbps\": %s, \"round\": %s}\n", n, t, $2, $5, $8, r }' \
        >>"$RAW" || say "algos-vs-mpi: mpirun failed ($n ranks, $t)"
    done
  done
done
[[ -n ${KEEP:-} ]] && mkdir -p "$KEEP" && cp "$RAW" "$KEEP/"

python3 - "$RAW" "$RANKS" "$TRANSPORTS" <<'PY'
import json, statistics, sys
raw, ranks, transports = sys.argv[1], sys.argv[2].split(), sys.argv[3].split()
cells = {}
for line in open(raw):
    if not line.startswith("{"):
        continue
    r = json.loads(line)
    if r.get("failed"):
        print(f"<!-- failed run: {r} -->")
        continue
    if r.get("inplace"):
        continue
    who = "mpi" if r.get("tool") == "mpi" else ("tuner" if r["forced"] == "-" else r["forced"])
    key = (int(r["nranks"]), r["transport"], int(r["size_bytes"]), who)
    cells.setdefault(key, []).append((float(r["time_us"]), float(r["busbw_gbps"]), r.get("algo", ""), r.get("wrong", 0)))
LAT = [8, 64, 1024, 8192, 65536]
BW = [1 << 20, 4 << 20, 16 << 20, 64 << 20]
LLS = ["ring/ll", "tree/ll", "oneshot/ll"]
WHO = ["tuner", "ring", "tree", "oneshot", "mpi"] + LLS
def size(b):
    return f"{b >> 20} MiB" if b >= 1 << 20 else (f"{b >> 10} KiB" if b >= 1024 else f"{b} B")
for n in ranks:
    for t in transports:
        n_ = int(n)
        print(f"\n### {n} ranks, {t}\n")
        print("| size | tuner (choice) | ring | tree | one-shot | best LL (shm) | Open MPI | tuner / best forced | tree / ring |")
        print("|---|---|---|---|---|---|---|---|---|")
        for s in LAT + BW:
            lat = s in LAT
            med = {}
            choice = ""
            for w in WHO:
                v = cells.get((n_, t, s, w))
                if not v:
                    continue
                med[w] = statistics.median(x[0] if lat else x[1] for x in v)
                if w == "tuner":
                    choice = statistics.mode(x[2] for x in v)
                if any(x[3] for x in v):
                    choice += f" WRONG({w})"
            fmt = (lambda x: f"{x:.1f} µs") if lat else (lambda x: f"{x:.2f} GB/s")
            col = lambda w: fmt(med[w]) if w in med else "-"
            forced = [med[w] for w in ["ring", "tree", "oneshot"] + LLS if w in med]
            lls = [(med[w], w) for w in LLS if w in med]
            best_ll = f"{fmt(min(lls)[0])} ({min(lls)[1]})" if lls else "-"
            ratio = tr = "-"
            if "tuner" in med and forced:
                best = min(forced) if lat else max(forced)
                ratio = f"{med['tuner'] / best:.2f}" if lat else f"{best / med['tuner']:.2f}"
            if "tree" in med and "ring" in med:
                tr = f"{med['tree'] / med['ring']:.2f}" if lat else f"{med['ring'] / med['tree']:.2f}"
            print(f"| {size(s)} | {col('tuner')} ({choice}) | {col('ring')} | {col('tree')} | {col('oneshot')} | {best_ll} | {col('mpi')} | {ratio} | {tr} |")
print("\nRatios are time ratios (above 1: slower than the reference), for bandwidth rows too "
      "(best busbw / tuner busbw, ring busbw / tree busbw).")
PY
