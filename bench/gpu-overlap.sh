#!/bin/bash
# occl against NVIDIA's NCCL with a model's matrix multiplies beside each collective, side by side
# in one command: bench/gpu-overlap.py run once on NVIDIA's libnccl.so.2 and once per occl
# configuration with occl's libnccl.so.2 preloaded into the same PyTorch (results:
# bench/baselines/gpu-overlap.md).
#
#   bash bench/gpu-overlap.sh LIBDIR [NRANKS...]      LIBDIR holds occl's libnccl.so.2
#   SIZES="64 256"  COLLS=all_reduce,all_gather,reduce_scatter (also all_to_all, and sendrecv:
#                   a group of a send to r+1 and a receive from r-1)
#   OCCL_CONFIGS="default;NCCL_CTA_POLICY=1;OCCL_CUDA_CHANNELS=32"   occl's rows, ';' between
#                                  rows, each row's variables separated by spaces
#   NCCL_ENV="NCCL_CTA_POLICY=2"   variables of NVIDIA's row (space-separated; default none)
#   REPS=25                        rounds per (collective, size) (gpu-overlap.py; default 5). A
#                                  round's loss spreads over 10-20 points, and medians of 5-9
#                                  rounds moved 3-7 points between calls (gpu-overlap.md run 9):
#                                  compare libraries to a point or two only with 25 or more
#   PROFILE=DIR                    one more round per (collective, size) under PyTorch's profiler:
#                                  Chrome traces in DIR (an absolute path), summed up by
#                                  bench/overlap-kernels.py DIR
#   WINDOWS=1                      inputs and outputs in symmetric windows (ncclMemAlloc pool,
#                                  ncclCommWindowRegister), checked after timing ("wrong")
#   PERIOD_MS=P                    one collective every P ms beside the GEMMs instead of back to
#                                  back (a training step's pace; gpu-overlap.py)
#   KERNELS=DIR                    every library through NCCL's v5 profiler ABI: the recorder
#                                  plugin (telemetry/tests/plugins/recorder_v5.c, built with cc)
#                                  logs each collective's KernelCh events into DIR, and
#                                  bench/kernel-durations.py prints each row's kernel spans (how
#                                  long its kernels held their SMs, alone and beside the GEMMs)
#
# NVIDIA's rows name the channel count NCCL chose (its NCCL_DEBUG=INFO line). Needs 2+ GPUs,
# PyTorch, and NVLink multicast off (set here, as the shared machines require).
set -u
lib=${1:?usage: gpu-overlap.sh LIBDIR [NRANKS...]}
shift
here=$(cd "$(dirname "$0")" && pwd)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export OCCL_KERNEL_CACHE_DIR=${OCCL_KERNEL_CACHE_DIR:-/tmp/occl-kernel-cache}
nv=$(find /usr/local /opt /usr/lib -name 'libnvrtc.so.1[0-9]*' 2>/dev/null | grep -v builtins | head -1)
out=$(mktemp -d)
# The recorder plugin's variables for the row labelled $1 on $2 GPUs, or nothing.
plugin() {
  [ -n "${KERNELS:-}" ] && echo "NCCL_PROFILER_PLUGIN=$KERNELS/librecorder.so OCCL_TEST_PLUGIN_MASK=66 OCCL_TEST_PLUGIN_LOG=$KERNELS/$1-$2"
}
if [ -n "${KERNELS:-}" ]; then
  mkdir -p "$KERNELS"
  ${CC:-cc} -O2 -shared -fPIC -pthread -o "$KERNELS/librecorder.so" "$here/../telemetry/tests/plugins/recorder_v5.c" || exit 1
fi
for n in ${@:-2}; do
  gpus=$(seq -s, 0 $((n - 1)))
  echo "# $n GPUs: NVIDIA's NCCL${NCCL_ENV:+ ($NCCL_ENV)}"
  env ${NCCL_ENV:-} $(plugin nccl "$n") CUDA_VISIBLE_DEVICES=$gpus NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT LIB=nccl timeout "${RUN_TIMEOUT:-300}" \
    python3 "$here/gpu-overlap.py" "$n" ${SIZES:-64 256} > "$out/nccl-$n.txt" 2>&1
  echo "# nccl channels: $(grep -ohE '[0-9]+ coll channels' "$out/nccl-$n.txt" | sort | uniq -c | tr '\n' ' ')"
  grep '^{' "$out/nccl-$n.txt" || tail -20 "$out/nccl-$n.txt"
  [ -n "${KERNELS:-}" ] && python3 "$here/kernel-durations.py" "$KERNELS/nccl-$n"
  IFS=';' read -ra configs <<< "${OCCL_CONFIGS:-default}"
  for i in "${!configs[@]}"; do
    c=${configs[$i]}
    vars=${c/default/}
    echo "# $n GPUs: occl ($c)"
    env $vars $(plugin "occl$i" "$n") CUDA_VISIBLE_DEVICES=$gpus LIB="occl $c" LD_PRELOAD="$lib/libnccl.so.2" \
      LD_LIBRARY_PATH="$lib${nv:+:$(dirname "$nv")}" timeout "${RUN_TIMEOUT:-300}" \
      python3 "$here/gpu-overlap.py" "$n" ${SIZES:-64 256} > "$out/occl-$i-$n.txt" 2>&1
    grep '^{' "$out/occl-$i-$n.txt" || tail -20 "$out/occl-$i-$n.txt"
    [ -n "${KERNELS:-}" ] && python3 "$here/kernel-durations.py" "$KERNELS/occl$i-$n"
  done
done
rm -rf "$out"
