#!/bin/bash
# Runs every section of nvlink-probe, each in its own process (a fault in one, e.g. a bulk copy that
# the peer mapping refuses, loses only that section). Markdown on stdout and in results.md;
# diagnostics (which case failed and why) in errors.log, printed at the end.
# Expected: about 1.5-2.5 minutes on 2x H200.
set -u
cd "$(dirname "$0")"
[ -x ./nvlink-probe ] || bash build.sh
# Load every kernel at start: the FIFO case runs two kernels that wait on each other.
export CUDA_MODULE_LOADING=EAGER
: > errors.log
# bash run.sh [section...]: a subset (push pull tma-push tma-pull fifo ce local ce-fifo), all by default.
SECTIONS="${*:-push pull tma-push tma-pull fifo ce local ce-fifo}"
{
    echo "# nvlink-probe $(date -u +%FT%TZ) on $(hostname)"
    echo
    nvidia-smi --query-gpu=index,name,clocks.max.sm,clocks.max.mem --format=csv,noheader 2>/dev/null | sed 's/^/    /'
    nvidia-smi topo -m 2>/dev/null | head -3 | sed 's/^/    /'
    for s in ${SECTIONS}; do
        t0=$(date +%s)
        timeout 100 ./nvlink-probe "$s" 2>>errors.log
        rc=$?
        echo
        echo "_section $s: rc $rc, $(( $(date +%s) - t0 )) s_"
    done
    if [ -s errors.log ]; then
        echo
        echo "### errors.log"
        echo
        sed 's/^/    /' errors.log
    fi
} | tee results.md
