#!/usr/bin/env bash
# Small all-reduce latency (8 B, 64 B, 1 KiB) of one or more occl-perf builds against Open MPI,
# interleaved in one run: long batches (20,000 calls, median of 15) so that sub-microsecond
# differences show, which bench/algos-vs-mpi.sh's 100-call batches do not resolve.
#
#   MPI_SMALL_BIN=path/to/mpi_coll bash bench/latency-vs-mpi.sh PERF...
#
# mpi_coll is bench/anchors/mpi_coll.c built with its SIZES set to {8, 64, 1024}
# (bench/baselines/latency-vs-mpi.md, with the current figures). Environment: ROUNDS=3, RANKS="2 4", PIN=2-9 (taskset
# list for both tools). Prints one line per round, rank count and tool: µs at 8 B, 64 B, 1 KiB.
set -euo pipefail
MPI_SMALL_BIN=${MPI_SMALL_BIN:?set MPI_SMALL_BIN to mpi_coll built with the sizes 8, 64 and 1024}
(($# > 0)) || { echo "usage: latency-vs-mpi.sh PERF..." >&2; exit 2; }
pin=(taskset -c "${PIN:-2-9}")
for ((round = 1; round <= ${ROUNDS:-3}; round++)); do
  for n in ${RANKS:-2 4}; do
    for perf in "$@"; do
      t=$(OCCL_TRANSPORT=shm "${pin[@]}" "$perf" all_reduce -b 8 -e 1K -f 8 --ranks "$n" -n 20000 -w 2000 -c 0 \
        --batches 15 --bind 2>&1 | awk '!/^#/ && NF >= 6 {printf "%s ", $6}')
      echo "round $round, $n ranks, $perf: $t"
    done
    t=$("${pin[@]}" mpirun --allow-run-as-root --oversubscribe -np "$n" "$MPI_SMALL_BIN" allreduce 0.2 2>/dev/null |
      awk '$1 == "allreduce" {printf "%s ", $5}')
    echo "round $round, $n ranks, Open MPI: $t"
  done
done
