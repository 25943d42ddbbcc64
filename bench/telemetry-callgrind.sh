#!/bin/bash
# Telemetry cost as instructions (bench/baselines/telemetry-callgrind.md): deterministic and immune to
# the load of a shared machine, where wall-clock A/B ratios are not. For each given build of
# occl-perf, sink and size, a 2-rank shm all-reduce under callgrind with a B batch (sink attached)
# of 10 and of 30 calls; the instructions executed in occl-telemetry on each rank's main thread
# (bench/callgrind-entry.py), 30-call run minus 10-call run, per call and rank. Each run also has
# an A batch of as many calls without the sink: their telemetry cost (the flight recorder's ~320
# instructions a call) is in the figure too.
#
#   bench/telemetry-callgrind.sh DIR TAG...   runs DIR/occl-perf-TAG; output files in DIR/cg/
#   SINKS="prometheus otlp" SIZES="8 1M"      what to measure (default: all four sinks, 8 B and 1 MiB)
set -u
dir=$1
shift
entry="$(cd "$(dirname "$0")" && pwd)/callgrind-entry.py"
per_call() { # files of the 10-call run, files of the 30-call run
  local a b
  a=$(python3 "$entry" $1 | awk '/^total/ {print $2}')
  b=$(python3 "$entry" $2 | awk '/^total/ {print $2}')
  echo $(((b - a) / 40))
}
for tag in "$@"; do
  for sink in ${SINKS:-prometheus otlp trace collector}; do
    for size in ${SIZES:-8 1M}; do
      for n in 10 30; do
        d=$dir/cg/$tag-$sink-$size-$n
        rm -rf "$d" && mkdir -p "$d"
        timeout 600 valgrind --tool=callgrind --separate-threads=yes --trace-children=yes \
          --callgrind-out-file="$d/o.%p" "$dir/occl-perf-$tag" all_reduce -b $size -e $size --ranks 2 \
          -n $n -w 0 --events-ab 1 --events-sink $sink >"$d/log" 2>&1
      done
      # Thread 01 of each process is its main thread; the two largest are the ranks' (the third
      # process is the launcher).
      ir=$(per_call "$(ls -S $dir/cg/$tag-$sink-$size-10/o.*-01 | head -2)" "$(ls -S $dir/cg/$tag-$sink-$size-30/o.*-01 | head -2)")
      ev=$(grep -A1 "events/op" "$dir/cg/$tag-$sink-$size-30/log" | tail -1 | awk '{print $5}')
      echo "$tag $sink $size: $ir instructions in occl-telemetry per call and rank, $ev callbacks per call"
    done
  done
done
