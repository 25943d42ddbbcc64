#!/usr/bin/env bash
# occl vs Open MPI on the CPU, one host, 2 ranks, side by side in one run.
#
#   bash bench/cpu-vs-mpi.sh            # from the repository root (or anywhere: it finds it)
#
# For each transport (shm, tcp) it runs occl-perf and the Open MPI anchor (mpi_coll.c)
# alternately, ROUNDS times each (occl, mpi, occl, mpi, ...), takes the median over rounds of
# each figure, and prints one table: op, size, transport, occl time/busbw, mpi time/busbw,
# ratio. See bench/README.md.
#
# Environment:
#   ROUNDS=3                 rounds per transport (each round: every occl case, then one mpi run)
#   TRANSPORTS="shm tcp"     which transports to compare
#   MPI_COLL_SRC=bench/anchors/mpi_coll.c   the anchor's source (relative to the repo root)
#   MPI_MIN_SEC=0.3          mpi_coll's minimum timed seconds per (op, size)
#   RUN_TIMEOUT=600          seconds before one occl-perf or mpirun run counts as hung
#   OUT_JSON=path            also write the final table there, one JSON object per line
#   NO_INSTALL=1             never apt-get install Open MPI (fail instead when mpirun is absent)
#   OCCL_PERF=path           run this occl-perf instead of building one (a machine without Rust,
#                            or a build of another commit)
set -euo pipefail

say() { printf '%s\n' "$*" >&2; }
die() { say "cpu-vs-mpi: $*"; exit 1; }

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
ROUNDS=${ROUNDS:-3}
TRANSPORTS=${TRANSPORTS:-"shm tcp"}
MPI_COLL_SRC=${MPI_COLL_SRC:-bench/anchors/mpi_coll.c}
MPI_MIN_SEC=${MPI_MIN_SEC:-0.3}
RUN_TIMEOUT=${RUN_TIMEOUT:-600}
NP=2

[[ $ROUNDS =~ ^[1-9][0-9]*$ ]] || die "ROUNDS must be a positive integer (got '$ROUNDS')"
for t in $TRANSPORTS; do
  [[ $t == shm || $t == tcp ]] || die "TRANSPORTS may hold shm and tcp only (got '$t')"
done
command -v python3 >/dev/null || die "python3 is needed to parse and summarize the results"
[[ -n ${OCCL_PERF:-} ]] || command -v cargo >/dev/null || die "cargo is needed to build occl-perf (or set OCCL_PERF)"
command -v timeout >/dev/null || die "timeout (coreutils) is needed"

# --- Open MPI ---------------------------------------------------------------------------------
if ! command -v mpirun >/dev/null || ! command -v mpicc >/dev/null; then
  [[ ${NO_INSTALL:-0} == 1 ]] && die "mpirun/mpicc not found and NO_INSTALL=1; install openmpi-bin libopenmpi-dev"
  command -v apt-get >/dev/null || die "mpirun not found and no apt-get here; install Open MPI (mpirun, mpicc) by hand"
  SUDO=
  if [[ $(id -u) != 0 ]]; then
    command -v sudo >/dev/null || die "mpirun not found; installing Open MPI needs root or sudo"
    SUDO=sudo
  fi
  say "cpu-vs-mpi: installing Open MPI (apt-get install openmpi-bin libopenmpi-dev)..."
  $SUDO apt-get update -qq >&2 || die "apt-get update failed"
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq openmpi-bin libopenmpi-dev >&2 \
    || die "apt-get install openmpi-bin libopenmpi-dev failed"
fi

[[ -f $MPI_COLL_SRC ]] || die "mpi_coll.c not found at '$MPI_COLL_SRC' (relative to $ROOT); set MPI_COLL_SRC"
TMP=$(mktemp -d "${TMPDIR:-/tmp}/cpu-vs-mpi.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
say "cpu-vs-mpi: building mpi_coll from $MPI_COLL_SRC"
mpicc -O2 -o "$TMP/mpi_coll" "$MPI_COLL_SRC" -lm || die "mpicc failed on $MPI_COLL_SRC"

# --- occl-perf --------------------------------------------------------------------------------
if [[ -n ${OCCL_PERF:-} ]]; then
  PERF=$OCCL_PERF
else
  say "cpu-vs-mpi: building occl-perf (release)"
  if ! cargo build --release -p occl-tests --bin occl-perf >"$TMP/build.log" 2>&1; then
    cat "$TMP/build.log" >&2
    die "cargo build of occl-perf failed (output above)"
  fi
  PERF="${CARGO_TARGET_DIR:-$ROOT/target}/release/occl-perf"
fi
[[ -x $PERF ]] || die "occl-perf not found at $PERF after the build"

MPIRUN=(mpirun --allow-run-as-root --oversubscribe -np "$NP")
MPI_OPS=allreduce,allgather,reducescatter,bcast,alltoall

# The cases: "occl-collective size iters warmup". The size is what both tools call the size:
# the per-rank buffer for all_reduce and broadcast, the total (nranks blocks) for all_gather,
# reduce_scatter and alltoall. Iteration counts make each timed batch last about 0.3 s or more.
CASES=(
  "all_reduce 8 20000 2000"
  "all_reduce 1024 10000 1000"
  "all_reduce 1048576 1000 100"
  "all_reduce 67108864 20 5"
  "all_gather 67108864 20 5"
  "reduce_scatter 67108864 20 5"
  "broadcast 67108864 20 5"
  "alltoall 67108864 20 5"
)

RAW="$TMP/raw.txt"   # lines: tool transport op size time_us busbw status
: >"$RAW"
FAILED=0

# occl-perf prints an out-of-place and an in-place row per size; MPI's collectives are
# out-of-place except MPI_Bcast, which works in one buffer, so broadcast takes occl's in-place
# row and everything else the out-of-place one.
run_occl() {
  local transport=$1 coll=$2 size=$3 iters=$4 warmup=$5 out rc=0
  out=$(OCCL_TRANSPORT=$transport timeout "$RUN_TIMEOUT" "$PERF" "$coll" -b "$size" -e "$size" \
        -n "$iters" -w "$warmup" -c 1 -d float -o sum --ranks "$NP" --json 2>"$TMP/occl.err") || rc=$?
  if [[ $rc != 0 ]]; then
    say "cpu-vs-mpi: occl-perf $coll $size ($transport) failed with status $rc$([[ $rc == 124 ]] && echo ' (timed out: hung?)'):"
    sed 's/^/    /' "$TMP/occl.err" >&2
    echo "occl $transport $coll $size nan nan FAIL" >>"$RAW"
    FAILED=1
    return 0
  fi
  [[ -s $TMP/occl.err ]] && sed 's/^/    occl-perf stderr: /' "$TMP/occl.err" >&2
  local want_inplace=false
  [[ $coll == broadcast ]] && want_inplace=true
  printf '%s\n' "$out" | python3 -c '
import json, sys
transport, coll, size, inplace = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] == "true"
rows = [json.loads(l) for l in sys.stdin if l.startswith("{")]
row = [r for r in rows if r["inplace"] == inplace]
if not row:
    sys.exit(f"cpu-vs-mpi: occl-perf printed no row for {coll} {size}")
r = row[0]
ran = r["size_bytes"]
if ran != size:
    print(f"cpu-vs-mpi: note: occl-perf ran {coll} at {ran} B for {size} B", file=sys.stderr)
wrong = sum((x["wrong"] or 0) for x in rows)
status = "ok" if wrong == 0 else f"WRONG={wrong}"
print("occl", transport, coll, size, r["time_us"], r["busbw_gbps"], status)
' "$transport" "$coll" "$size" "$want_inplace" >>"$RAW" || FAILED=1
}

run_mpi() {
  local transport=$1 out rc=0 extra=()
  [[ $transport == tcp ]] && extra=(--mca pml ob1 --mca btl self,tcp)
  out=$(timeout "$RUN_TIMEOUT" "${MPIRUN[@]}" "${extra[@]}" "$TMP/mpi_coll" "$MPI_OPS" "$MPI_MIN_SEC" \
        2>"$TMP/mpi.err") || rc=$?
  if [[ $rc != 0 ]]; then
    say "cpu-vs-mpi: mpirun mpi_coll ($transport) failed with status $rc:"
    sed 's/^/    /' "$TMP/mpi.err" >&2
    FAILED=1
    return 0
  fi
  # "  allreduce  8  iters batch median_us min_us algbw busbw check"
  printf '%s\n' "$out" | awk -v t="$transport" '
    BEGIN { m["allreduce"]="all_reduce"; m["allgather"]="all_gather"; m["reducescatter"]="reduce_scatter";
            m["bcast"]="broadcast"; m["alltoall"]="alltoall" }
    /^#/ { next }
    ($1 in m) && NF >= 9 { print "mpi", t, m[$1], $2, $5, $8, $9 }' >>"$RAW"
}

for transport in $TRANSPORTS; do
  for ((round = 1; round <= ROUNDS; round++)); do
    say "cpu-vs-mpi: $transport round $round/$ROUNDS: occl-perf"
    for c in "${CASES[@]}"; do
      # shellcheck disable=SC2086
      run_occl "$transport" $c
    done
    say "cpu-vs-mpi: $transport round $round/$ROUNDS: Open MPI"
    run_mpi "$transport"
  done
done

# --- summary ----------------------------------------------------------------------------------
CASE_LIST=$(printf '%s\n' "${CASES[@]}")
python3 - "$RAW" "${OUT_JSON:-}" "$CASE_LIST" "$TRANSPORTS" <<'PY'
import json, math, statistics, sys

raw, out_json, case_list, transports = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4].split()
cases = [(l.split()[0], int(l.split()[1])) for l in case_list.splitlines() if l.strip()]
data = {}
for line in open(raw):
    f = line.split()
    if len(f) != 7:
        continue
    tool, transport, op, size, t, bw, status = f
    data.setdefault((tool, transport, op, int(size)), []).append((float(t), float(bw), status))

def med(tool, transport, op, size):
    rows = [r for r in data.get((tool, transport, op, size), []) if not math.isnan(r[0])]
    bad = [r[2] for r in data.get((tool, transport, op, size), []) if r[2] not in ("ok",)]
    if not rows:
        return None, None, 0, bad
    return statistics.median(r[0] for r in rows), statistics.median(r[1] for r in rows), len(rows), bad

def size_str(b):
    for unit, s in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if b >= 1 << s and b % (1 << s) == 0:
            return f"{b >> s} {unit}"
    return f"{b} B"

fmt = "{:<15} {:>8} {:>5} {:>12} {:>9} {:>12} {:>9} {:>8} {:>4} {}"
print()
print("# occl vs Open MPI, 2 ranks, float32, median over rounds (time per op; busbw as nccl-tests)")
print("# ratio: occl busbw / mpi busbw (bw, >1 = occl faster); for <= 1 KiB occl time / mpi time (lat, <1 = occl faster)")
print(fmt.format("op", "size", "tr", "occl_us", "occl_GB/s", "mpi_us", "mpi_GB/s", "ratio", "kind", "notes"))
lines = []
for transport in transports:
    for op, size in cases:
        ot, ob, on, obad = med("occl", transport, op, size)
        mt, mb, mn, mbad = med("mpi", transport, op, size)
        kind = "lat" if size <= 1024 else "bw"
        ratio = None
        if ot is not None and mt is not None:
            if kind == "lat":
                ratio = ot / mt if mt > 0 else None
            else:
                ratio = ob / mb if mb > 0 else None
        notes = []
        if obad:
            notes.append("occl:" + ",".join(sorted(set(obad))))
        if mbad:
            notes.append("mpi:" + ",".join(sorted(set(mbad))))
        notes.append(f"n={on}/{mn}")
        f = lambda v, d: "-" if v is None else f"{v:.{d}f}"
        print(fmt.format(op, size_str(size), transport, f(ot, 2), f(ob, 3), f(mt, 2), f(mb, 3), f(ratio, 3), kind, " ".join(notes)))
        lines.append({
            "op": op, "size_bytes": size, "transport": transport,
            "occl_time_us": ot, "occl_busbw_gbps": ob, "mpi_time_us": mt, "mpi_busbw_gbps": mb,
            "ratio": ratio, "ratio_kind": "occl_busbw/mpi_busbw" if kind == "bw" else "occl_time/mpi_time",
            "rounds_occl": on, "rounds_mpi": mn, "occl_status": sorted(set(obad)) or ["ok"],
            "mpi_status": sorted(set(mbad)) or ["ok"],
        })
if out_json:
    with open(out_json, "w") as fh:
        for l in lines:
            fh.write(json.dumps(l) + "\n")
    print(f"# JSON lines written to {out_json}")
PY

[[ $FAILED == 0 ]] || die "some runs failed (see the messages above); their cells show '-'"
