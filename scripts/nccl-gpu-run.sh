#!/bin/bash
# On a 2-GPU machine, from a folder holding nccl-tests' tree (src/, verifiable/, os/), occl/lib
# (occl's libnccl.so and libnccl.so.2), occl/include (occl's nccl.h, nccl_device.h and
# nccl_device/), occl/device_api.cu (nccl/tests/cuda/device_api.cu), ncclras (occl's client),
# torch_check.py, torch_kill.py, torch_onegpu.py and torch_p2p_events.py (scripts/nccl_torch_*.py),
# recorder_v5.c and recorder.h (telemetry/tests/plugins/). Staged from a checkout with
#   cargo build --release -p occl-nccl && d=DIR/occl && mkdir -p $d/lib && cp -r nccl/include $d/ &&
#   cp target/release/libnccl.so $d/lib/ && cp target/release/libnccl.so $d/lib/libnccl.so.2 &&
#   cp nccl/tests/cuda/device_api.cu $d/ && cp scripts/nccl-gpu-run.sh DIR/run.sh
# nccl-tests is built against occl's headers (make NCCL_HOME=occl), so one set of binaries runs
# on either library, LD_LIBRARY_PATH choosing (occl/lib, or the system's NVIDIA libnccl.so.2).
#   PHASE=tests  builds nccl-tests (MPI=1 when mpicc works) and runs $G2_TESTS (default
#                sendrecv/alltoall) with -g 2 and $T2_TESTS (default all 7) with -t 2, each on
#                occl's and NVIDIA's libnccl.so.2 in turn;
#   PHASE=mpi    the same 7 tests with mpirun -np 2;
#   PHASE=devapi NCCL's device API on occl: device_api (one process driving both GPUs, then two
#                processes), nccl-tests' device kernels (all_reduce_perf -D 1/2, alltoall_perf
#                -D 1..4, with -R 2 -g 2; -D 1 and -D 3 also with mpirun -np 2 when MPI is
#                there), and -R 2 without -D (host collectives on registered windows) on both
#                libraries. NVIDIA's library is not run with -D: the device communicator's layout
#                in these binaries is occl's;
#   PHASE=ce     the copy-engine paths: all_gather, alltoall, gather, scatter and sendrecv with
#                -g 2 under NCCL_CTA_POLICY=2 on both libraries, without and with -R 2 windows;
#   PHASE=torch  the torchrun job on occl (ncclras queried while it runs) and the kill job;
#   PHASE=kill   the kill job with the default OCCL_TIMEOUT (600 s: only the dead-peer watcher
#                can make it fast), the torchrun job on occl and on NVIDIA's NCCL with their DDP
#                losses compared, and an all_reduce_perf -g 2 smoke on both.
#   PHASE=build  only builds nccl-tests against occl's headers (what the other phases start with).
#   PHASE=more   grouped p2p, all-to-all and all-reduce captured in CUDA graphs (-G 10, -g 2),
#                all 7 tests with -g 4 and with -g 8 when the host has that many GPUs, each on
#                occl and on NVIDIA's NCCL, and two torch ranks on one GPU (torch_onegpu.py, occl also
#                under NCCL_CTA_POLICY=2;
#                nccl-tests cannot ask for that: -t 2 -g 1 on one visible GPU stops in nccl-tests
#                itself), and the KernelCh events of PyTorch's grouped sends and receives through
#                an NCCL profiler plugin on both libraries (torch_p2p_events.py).
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
  # Rebuilt when occl's headers change (a tree built against other headers is not reused).
  stamp=$(cat occl/include/nccl.h occl/include/nccl_device.h occl/include/nccl_device/*.h | md5sum | cut -c1-32)
  [ -x $here/build/sendrecv_perf ] && [ "$(cat $here/build/.headers 2>/dev/null)" = "$stamp" ] && return 0
  rm -rf $here/build
  export NVCC_GENCODE="-gencode=arch=compute_90,code=sm_90"
  inc=$(mpicc --showme:incdirs 2>/dev/null | awk '{print $1}')
  if [ -n "$inc" ] && timeout 400 make -j16 -C src NCCL_HOME=$here/occl MPI=1 MPI_HOME=$(dirname $inc) BUILDDIR=$here/build > $OUT/build.txt 2>&1; then
    echo "built against occl's headers with MPI=1 (MPI_HOME=$(dirname $inc))"
  else
    tail -5 $OUT/build.txt; rm -rf $here/build
    timeout 400 make -j16 -C src NCCL_HOME=$here/occl BUILDDIR=$here/build > $OUT/build.txt 2>&1 || { tail -30 $OUT/build.txt; exit 1; }
    echo "built against occl's headers without MPI"
  fi
  echo "$stamp" > $here/build/.headers
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
  awk '/^== /{t=$3} !/^#/ && NF>=13 && $9 ~ /^[0-9][0-9.e+]*$/ && $13 ~ /^([0-9][0-9.e+]*|N\/A)$/ {
         x=$9+($13=="N/A"?0:$13); k=t" "$4; rows[k]++; w[k]+=x; W+=x; R++ }
       END { for (k in rows) printf "  %-26s rows %4d  #wrong %d\n", k, rows[k], w[k];
             printf "  total: %d rows, #wrong %d\n", R, W }' "$1" | sort
}
case ${PHASE:-tests} in
build)
  build ;;
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
  ngpu=$(nvidia-smi -L | wc -l)
  for g in 4 8; do
    [ "$ngpu" -ge $g ] || continue
    for t in ${G4_TESTS:-$T}; do
      for lib in occl nccl; do run $lib g$g-$lib.txt $t $here/build/$t $A -g $g; done
    done
  done
  # occl-ce: occl under NCCL_CTA_POLICY=2, its sends and receives on the copy engines.
  for lib in occl occl-ce nccl; do
    pre=""; [ $lib != nccl ] && pre=$here/occl/lib/libnccl.so.2
    policy=0; [ $lib = occl-ce ] && policy=2
    for r in 0 1; do
      RANK=$r LOCAL_RANK=$r WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=2953$([ $lib = nccl ] && echo 2 || echo $((policy + 1))) \
        NCCL_CTA_POLICY=$policy LD_PRELOAD=$pre LD_LIBRARY_PATH=$nvdir timeout 60 python3 torch_onegpu.py \
        > $OUT/onegpu-$lib-$r.txt 2>&1 &
    done
    wait
    echo "two ranks on one GPU, $lib: $(grep -h ONEGPU $OUT/onegpu-$lib-*.txt | tr '\n' ' ')"
  done
  for lib in occl nccl; do
    pre=""; [ $lib = occl ] && pre=$here/occl/lib/libnccl.so.2
    CHECK=1 LIB=$lib RECORDER_SRC=$here/recorder_v5.c LD_PRELOAD=$pre LD_LIBRARY_PATH=$nvdir timeout 200 \
      python3 torch_p2p_events.py 2 16 > $OUT/p2p-events-$lib.txt 2>&1
    echo "KernelCh of grouped sends and receives, $lib: $(tail -1 $OUT/p2p-events-$lib.txt)"
  done
  for f in graph-occl graph-nccl g4-occl g4-nccl g8-occl g8-nccl; do
    [ -e $OUT/$f.txt ] || continue
    echo "== $f: #wrong by test"; wrong_totals $OUT/$f.txt
    grep -hE "Duplicate|rc=[1-9]|Error|error|failed|FAILED" $OUT/$f.txt | sort | uniq -c | head -6
  done ;;
tests)
  build
  for t in ${G2_TESTS-sendrecv_perf alltoall_perf}; do
    for lib in occl nccl; do run $lib g2-$lib.txt $t $here/build/$t $A -g 2; done
  done
  for t in ${T2_TESTS-$T}; do
    for lib in occl nccl; do run $lib t2-$lib.txt $t $here/build/$t $A -t 2 -g 1; done
  done ;;
ce)
  # Both libraries under NCCL_CTA_POLICY=2, -g 2: without windows, then on symmetric windows
  # (-R 2, NVIDIA's condition for its copy-engine collectives); occl runs all of these on the
  # copy engines, NVIDIA its all-gather and all-to-all (on windows) and kernels for the rest.
  build
  for R in 0 2; do
    for t in ${CE_TESTS:-all_gather_perf alltoall_perf gather_perf scatter_perf sendrecv_perf}; do
      for lib in occl nccl; do
        NCCL_CTA_POLICY=2 run $lib ce-R$R-$lib.txt $t $here/build/$t -b 1M -e 1G -f 4 -c 1 -R $R -g 2
      done
    done
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
devapi)
  build
  nvcc=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
  $nvcc -std=c++17 -arch=sm_90 -I occl/include occl/device_api.cu -L occl/lib -lnccl -o $here/build/device_api \
    > $OUT/device_api-build.txt 2>&1 || { cat $OUT/device_api-build.txt; exit 1; }
  echo "== device_api threads (one process, both GPUs)"
  LD_LIBRARY_PATH=$OCCL_LD timeout 240 $here/build/device_api threads > $OUT/device_api.txt 2>&1; echo "rc=$?"
  echo "== device_api rank 0/1 (two processes, CUDA IPC)"
  rm -f /tmp/occl-devapi-id
  for r in 0 1; do
    LD_LIBRARY_PATH=$OCCL_LD timeout 240 $here/build/device_api rank $r 2 /tmp/occl-devapi-id \
      > $OUT/device_api-rank$r.txt 2>&1 &
    eval dpid$r=$!
  done
  wait $dpid0; echo "rank 0 rc=$?"; wait $dpid1; echo "rank 1 rc=$?"
  cat $OUT/device_api.txt $OUT/device_api-rank*.txt | head -20
  D="-b 8 -e 64M -f 4 -c 1"
  for d in 1 2; do run occl devapi.txt "all_reduce_perf -D $d" $here/build/all_reduce_perf $D -R 2 -D $d -g 2; done
  for d in 1 2 3 4; do run occl devapi.txt "alltoall_perf -D $d" $here/build/alltoall_perf $D -R 2 -D $d -g 2; done
  if command -v mpirun >/dev/null 2>&1 && ldd $here/build/all_reduce_perf | grep -q libmpi; then
    M="mpirun --allow-run-as-root --oversubscribe -np 2 -x LD_LIBRARY_PATH -x OCCL_TIMEOUT -x OCCL_KERNEL_CACHE_DIR -x NCCL_NVLS_ENABLE"
    run occl devapi.txt "all_reduce_perf -D 1 (mpirun)" $M $here/build/all_reduce_perf $D -R 2 -D 1 -g 1
    run occl devapi.txt "alltoall_perf -D 3 (mpirun)" $M $here/build/alltoall_perf $D -R 2 -D 3 -g 1
  fi
  for t in all_reduce_perf alltoall_perf; do
    for lib in occl nccl; do run $lib devapi-R2-$lib.txt "$t -R 2" $here/build/$t $D -R 2 -g 2; done
  done
  grep -hE "^== |^ +[0-9]+ |Out of bounds|Avg bus|rc=|WARN|rror" $OUT/devapi.txt | head -150 ;;
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
