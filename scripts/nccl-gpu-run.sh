#!/bin/bash
# On a 2-GPU machine, from a folder holding nccl-tests' tree, occl/lib (occl's libnccl.so.2),
# ncclras (occl's client), torch_check.py and torch_kill.py:
#   PHASE=tests  builds nccl-tests (MPI=1 when mpicc works, against NVIDIA's nccl.h, linked with
#                occl's library) and runs sendrecv/alltoall with -g 2 and all 7 tests with -t 2,
#                each on occl's and NVIDIA's libnccl.so.2 in turn;
#   PHASE=mpi    the same 7 tests with mpirun -np 2;
#   PHASE=torch  the torchrun job on occl (ncclras queried while it runs) and the kill job;
#   PHASE=kill   the kill job with the default OCCL_TIMEOUT (600 s: only the dead-peer watcher
#                can make it fast), the torchrun job on occl and on NVIDIA's NCCL with their DDP
#                losses compared, and an all_reduce_perf -g 2 smoke on both.
#   PHASE=more   grouped p2p, all-to-all and all-reduce captured in CUDA graphs (-G 10, -g 2),
#                all 7 tests with -g 4 when the host has 4 GPUs, and two thread ranks on one GPU
#                (-t 2 on CUDA_VISIBLE_DEVICES=0), each on occl and on NVIDIA's NCCL.
#   PHASE=premul all_reduce/reduce_scatter/reduce_perf -o all -d all (every operator, mulsum
#                included, on every type) with -g 2 on occl and on NVIDIA's NCCL, all_reduce again
#                captured in a CUDA graph (-G 1), and the #wrong totals per library and operator.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
here=$(pwd); OUT=${OUT:-/tmp/out}; mkdir -p $OUT
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a $OUT/gpu.txt
nv=$(find /usr/local /opt /usr/lib -name 'libnvrtc.so.13*' 2>/dev/null | grep -v builtins | head -1)
nvdir=$(dirname "$nv")
export OCCL_KERNEL_CACHE_DIR=/tmp/occl-kernel-cache OCCL_TIMEOUT=${OCCL_TIMEOUT:-20}
OCCL_LD=$here/occl/lib:$nvdir
T="all_reduce_perf all_gather_perf reduce_scatter_perf broadcast_perf reduce_perf alltoall_perf sendrecv_perf"
A="-b 8 -e 1G -f 4 -c 1"
build() {
  [ -x $here/build/sendrecv_perf ] && return 0
  mkdir -p nvh/include nvh/lib; cp -r /usr/include/nccl*.h /usr/include/nccl_device* nvh/include/ 2>/dev/null
  cp occl/lib/* nvh/lib/
  export NVCC_GENCODE="-gencode=arch=compute_90,code=sm_90"
  inc=$(mpicc --showme:incdirs 2>/dev/null | awk '{print $1}')
  if [ -n "$inc" ] && timeout 240 make -j16 -C src NCCL_HOME=$here/nvh MPI=1 MPI_HOME=$(dirname $inc) BUILDDIR=$here/build > $OUT/build.txt 2>&1; then
    echo "built with MPI=1 (MPI_HOME=$(dirname $inc))"
  else
    tail -5 $OUT/build.txt; rm -rf $here/build
    timeout 240 make -j16 -C src NCCL_HOME=$here/nvh BUILDDIR=$here/build > $OUT/build.txt 2>&1 || { tail -30 $OUT/build.txt; exit 1; }
    echo "built without MPI"
  fi
}
run() { # lib-name log test args...
  local lib=$1 log=$2 t=$3; shift 3
  echo "== $lib $t $*" >> $OUT/$log
  if [ $lib = occl ]; then LD_LIBRARY_PATH=$OCCL_LD timeout ${TL:-60} "$@" >> $OUT/$log 2>&1
  else timeout ${TL:-60} "$@" >> $OUT/$log 2>&1; fi
  local rc=$?; echo "rc=$rc" >> $OUT/$log; echo "$lib $t $rc $(grep -h 'Avg bus' $OUT/$log | tail -1)"
}
kill_job() { # rank 1 SIGKILLs itself; rank 0's detection time on occl, then NVIDIA's NCCL
  for lib in occl nccl; do
    echo "== kill job on $lib"
    pre=""; [ $lib = occl ] && pre=$here/occl/lib/libnccl.so.2
    rm -f /tmp/occl-kill-ts
    for r in 0 1; do
      RANK=$r LOCAL_RANK=$r WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=2951$([ $lib = occl ] && echo 1 || echo 2) \
        LD_PRELOAD=$pre LD_LIBRARY_PATH=$nvdir KILL_WAIT=${KILL_WAIT:-30} NCCL_DEBUG=WARN \
        timeout $([ $lib = occl ] && echo 90 || echo 50) python3 torch_kill.py > $OUT/kill-$lib-rank$r.txt 2>&1 &
      eval pid$r=$!
    done
    wait $pid0; rc=$?; t1=$(date +%s.%N); wait $pid1
    k=$(cat /tmp/occl-kill-ts 2>/dev/null || echo nan)
    echo "rank 0 rc=$rc, exited $(python3 -c "print(f'{$t1-$k:.3f}')" 2>/dev/null) s after the kill"
    grep -hE "ERROR|NO ERROR|watchdog|Watchdog|ncclRemoteError|remote" $OUT/kill-$lib-rank0.txt | head -6 | cut -c1-400
  done
}
wrong_totals() { # log: data rows and the sum of both #wrong columns, per test and operator
  awk '/^== /{t=$3} !/^#/ && NF>=13 && $9 ~ /^[0-9][0-9.e+]*$/ && $13 ~ /^[0-9][0-9.e+]*$/ {
         k=t" "$4; rows[k]++; w[k]+=$9+$13; W+=$9+$13; R++ }
       END { for (k in rows) printf "  %-26s rows %4d  #wrong %d\n", k, rows[k], w[k];
             printf "  total: %d rows, #wrong %d\n", R, W }' "$1" | sort
}
case ${PHASE:-tests} in
premul)
  build
  # The first occl run builds every type's kernels (NVRTC; -g 2 loads them all at init).
  TL=${TL:-480}
  P="-o all -d all -b 8 -e 16M -f 8 -c 1 -g 2"
  for t in ${PREMUL_TESTS:-all_reduce_perf reduce_scatter_perf reduce_perf}; do
    for lib in occl nccl; do run $lib premul-$lib.txt $t $here/build/$t $P; done
  done
  for lib in occl nccl; do run $lib premul-graph-$lib.txt all_reduce_perf $here/build/all_reduce_perf $P -G 1; done
  for f in premul-occl premul-nccl premul-graph-occl premul-graph-nccl; do
    echo "== $f: #wrong by test and operator"; wrong_totals $OUT/$f.txt
    grep -hE "Out of bounds|rc=[1-9]|Error|error|failed|FAILED" $OUT/$f.txt | sort | uniq -c | head -8
  done ;;
more)
  build
  for t in sendrecv_perf alltoall_perf all_reduce_perf; do
    for lib in occl nccl; do
      CUDA_VISIBLE_DEVICES=0,1 run $lib graph-$lib.txt $t $here/build/$t -b 8 -e 256M -f 8 -c 1 -g 2 -G 10
    done
  done
  if [ "$(nvidia-smi -L | wc -l)" -ge 4 ]; then
    for t in ${G4_TESTS:-$T}; do
      for lib in occl nccl; do run $lib g4-$lib.txt $t $here/build/$t $A -g 4; done
    done
  fi
  for lib in occl nccl; do
    CUDA_VISIBLE_DEVICES=0 run $lib onegpu-$lib.txt all_reduce_perf $here/build/all_reduce_perf -b 8 -e 64M -f 8 -c 1 -t 2 -g 1
  done
  for f in graph-occl graph-nccl g4-occl g4-nccl onegpu-occl onegpu-nccl; do
    [ -e $OUT/$f.txt ] || continue
    echo "== $f: #wrong by test"; wrong_totals $OUT/$f.txt
    grep -hE "Duplicate|rc=[1-9]|Error|error|failed|FAILED" $OUT/$f.txt | sort | uniq -c | head -6
  done ;;
tests)
  build
  for t in ${G2_TESTS-sendrecv_perf alltoall_perf}; do
    for lib in occl nccl; do run $lib g2-$lib.txt $t $here/build/$t $A -g 2; done
  done
  for t in $T; do
    for lib in occl nccl; do run $lib t2-$lib.txt $t $here/build/$t $A -t 2 -g 1; done
  done ;;
mpi)
  build
  export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-/usr/lib}
  M="mpirun --allow-run-as-root --oversubscribe -np 2 -x LD_LIBRARY_PATH -x OCCL_TIMEOUT -x OCCL_KERNEL_CACHE_DIR -x NCCL_NVLS_ENABLE"
  for t in ${MPI_TESTS:-$T}; do
    for lib in occl nccl; do
      run $lib mpi-$lib.txt $t $M $here/build/$t $A -g 1
    done
  done ;;
torch)
  echo "== torch on occl (LD_PRELOAD), ncclras queried mid-job"
  NCCLRAS=$here/ncclras LD_PRELOAD=$here/occl/lib/libnccl.so.2 LD_LIBRARY_PATH=$nvdir timeout 150 \
    torchrun --nproc_per_node 2 torch_check.py > $OUT/torch.txt 2>&1; echo "rc=$?"
  grep -E "RESULTS|EXCEPTION|ddp" $OUT/torch.txt | head
  sed -n '/^NCCLRAS/,/^rank/p' $OUT/torch.txt | head -60
  kill_job ;;
kill)
  unset OCCL_TIMEOUT # the default, 600 s
  kill_job
  for lib in occl nccl; do
    echo "== torch check on $lib"
    pre=""; [ $lib = occl ] && pre=$here/occl/lib/libnccl.so.2
    LD_PRELOAD=$pre LD_LIBRARY_PATH=$nvdir timeout 150 torchrun --nproc_per_node 2 torch_check.py \
      > $OUT/torch-$lib.txt 2>&1; echo "rc=$?"
    grep -E "RESULTS|EXCEPTION|ddp|mapped" $OUT/torch-$lib.txt | head
  done
  python3 - $OUT/torch-occl.txt $OUT/torch-nccl.txt <<'PY'
import sys
a, b = ([float(v) for l in open(f) if l.startswith("DDP_LOSSES") for v in l.split()[1:]] for f in sys.argv[1:])
d = max((abs(x - y) for x, y in zip(a, b)), default=float("nan"))
print(f"DDP losses: {len(a)} occl, {len(b)} nccl, identical (9 digits) {a == b}, max |diff| {d:.3g}, "
      f"first {a[:1]} {b[:1]}, last {a[-1:]} {b[-1:]}")
PY
  build
  for lib in occl nccl; do run $lib smoke-$lib.txt all_reduce_perf $here/build/all_reduce_perf -b 8 -e 64M -f 2 -g 2; done
  ;;
esac
