#!/bin/bash
# Telemetry overhead, A/B in one run per sink (bench/baselines/telemetry-ab.md): for each
# sink (collector, prometheus, split: prometheus's A/A check with OCCL_METRICS=0, otlp to a
# loopback receiver, trace) and size (8 B, 1 MiB), a 2-rank shm all-reduce with
# `occl-perf --events-ab`, for each given build of occl-perf.
#
#   bench/telemetry-ab.sh DIR TAG...   runs DIR/occl-perf-TAG (and DIR/event_cost-TAG, if there)
#   CPUS=2-5 ROUNDS=31 NOMICRO=1       pinning (taskset list), A/B rounds, skip event_cost
#   SINKS="prometheus otlp" SIZES=1M    the sinks and sizes to measure (default all five, 8 and 1M)
set -u
dir=$1
shift
CPUS=${CPUS:-2-5}
ROUNDS=${ROUNDS:-31}
echo "# host: $(nproc) cpus, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2), clocksource $(cat /sys/devices/system/clocksource/clocksource0/current_clocksource), pinned to $CPUS"
for tag in "$@"; do
  if [ -x "$dir/event_cost-$tag" ] && [ -z "${NOMICRO:-}" ]; then
    for a in "null 1" "prometheus 1" "null 16" "sums 1" "clock 1"; do
      echo "event_cost-$tag $a: $(taskset -c 3 "$dir/event_cost-$tag" $a)"
    done
  fi
done
for sink in ${SINKS:-collector prometheus split otlp trace}; do
  # split compares the job's communicator with its split, neither with metrics.
  metrics=1
  [ $sink = split ] && metrics=0
  for size in ${SIZES:-8 1M}; do
    if [ $size = 8 ]; then it="-n 2000 -w 200"; else it="-n 200 -w 20"; fi
    for tag in "$@"; do
      echo "## $tag $sink $size: taskset -c $CPUS occl-perf all_reduce -b $size -e $size --ranks 2 $it --events-ab $ROUNDS --events-sink $sink"
      OCCL_METRICS=$metrics timeout 120 taskset -c "$CPUS" "$dir/occl-perf-$tag" all_reduce -b $size -e $size --ranks 2 $it \
        --events-ab "$ROUNDS" --events-sink $sink 2>&1 | grep -v "^#  *size" | tail -3
    done
  done
done
