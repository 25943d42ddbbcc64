#!/bin/bash
# Builds nccl-tests against occl's header (falls back to NVIDIA's), runs them on occl's and NVIDIA's
# libnccl.so.2, then a torchrun job on each.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
here=$(pwd); OUT=${OUT:-/tmp/out}; mkdir -p $OUT
nvidia-smi --query-gpu=name,driver_version --format=csv | tee $OUT/gpu.txt
nv=$(find /usr/local /opt /usr/lib -name 'libnvrtc.so.13*' 2>/dev/null | grep -v builtins | head -1)
nvdir=$(dirname "$nv"); echo "nvrtc: $nv"
export OCCL_KERNEL_CACHE_DIR=/tmp/occl-kernel-cache OCCL_TIMEOUT=${OCCL_TIMEOUT:-20}
sysnccl=$(ldconfig -p | grep 'libnccl.so.2 ' | head -1 | awk '{print $NF}'); echo "system nccl: $sysnccl"
# nccl-tests >= 2.28 headers include nccl_device.h (the device API): take NVIDIA's next to ours.
cp -r /usr/include/nccl_device* occl/include/ 2>/dev/null
export NVCC_GENCODE="-gencode=arch=compute_90,code=sm_90"
if timeout 300 make -j16 -C src NCCL_HOME=$here/occl BUILDDIR=$here/build-occl > $OUT/build-occl.txt 2>&1; then
  B=$here/build-occl; echo "built against occl's nccl.h"
else
  tail -30 $OUT/build-occl.txt
  mkdir -p nvh/include nvh/lib; cp -r /usr/include/nccl*.h /usr/include/nccl_device* nvh/include/ 2>/dev/null; cp occl/lib/* nvh/lib/
  timeout 300 make -j16 -C src NCCL_HOME=$here/nvh BUILDDIR=$here/build-nv > $OUT/build-nv.txt 2>&1 || { tail -30 $OUT/build-nv.txt; exit 1; }
  B=$here/build-nv; echo "built against NVIDIA's nccl.h (occl's failed, see build-occl.txt)"
fi
ldd $B/all_reduce_perf | grep nccl; rm -f $OUT/build-nv.txt; [ $B = $here/build-occl ] && rm -f $OUT/build-occl.txt
T="all_reduce_perf all_gather_perf reduce_scatter_perf broadcast_perf reduce_perf alltoall_perf sendrecv_perf"
for t in $T; do
  echo "== occl $t" | tee -a $OUT/occl-tests.txt; LD_LIBRARY_PATH=$here/occl/lib:$nvdir timeout ${TL:-60} $B/$t -b 8 -e 1G -f 4 -c 1 -g 2 >> $OUT/occl-tests.txt 2>&1; echo "rc=$?" | tee -a $OUT/occl-tests.txt
done
for t in $T; do
  echo "== nccl $t" | tee -a $OUT/nccl-tests.txt; timeout 60 $B/$t -b 8 -e 1G -f 4 -c 1 -g 2 >> $OUT/nccl-tests.txt 2>&1; echo "rc=$?" | tee -a $OUT/nccl-tests.txt
done
[ "${TORCH:-1}" = 1 ] || exit 0
echo "== torch on occl (LD_PRELOAD)"
LD_PRELOAD=$here/occl/lib/libnccl.so.2 LD_LIBRARY_PATH=$nvdir timeout 150 torchrun --nproc_per_node 2 torch_check.py > $OUT/torch.txt 2>&1; echo "rc=$?"
grep -E "version|RESULTS|EXCEPTION|ddp|Error" $OUT/torch.txt | head -20
echo "== torch on NVIDIA's NCCL"
timeout 90 torchrun --nproc_per_node 2 torch_check.py > $OUT/torch-nv.txt 2>&1; echo "rc=$?"
grep -E "version|RESULTS|EXCEPTION|ddp" $OUT/torch-nv.txt | head -10
python3 - $OUT <<'PY'
import sys
o=sys.argv[1]
def losses(f):
    for l in open(f"{o}/{f}"):
        if l.startswith("DDP_LOSSES"): return [float(x) for x in l.split()[1:]]
a,b=losses("torch.txt"),losses("torch-nv.txt")
if a and b:
    d=max(abs(x-y) for x,y in zip(a,b)); print(f"DDP losses: {len(a)} vs {len(b)} steps, identical={a==b}, max abs diff={d:.3g}, last occl={a[-1]:.6f} nccl={b[-1]:.6f}")
else: print("DDP losses missing", bool(a), bool(b))
PY
cat $OUT/torch-nv.txt >> $OUT/torch.txt; rm $OUT/torch-nv.txt
grep -hE "Avg bus|rc=|== " $OUT/occl-tests.txt $OUT/nccl-tests.txt
