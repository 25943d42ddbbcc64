#!/usr/bin/env bash
# Device collectives on a GPU machine without a Rust toolchain, in two halves:
#   scripts/gpu-collectives.sh build DIR   here: builds occl-gpu (release, feature cuda) and copies
#                                          it, stripped, with this script and nccl_bench.py into DIR;
#                                          with NVRTC here, also every kernel program for GPU_ARCH
#                                          (sm_90) and lane width GPU_LANES (1,2,4) into
#                                          DIR/kernel-cache (occl-gpu prebuild), which
#                                          run seeds the GPU machine's kernel cache with
#   DIR/gpu-collectives.sh run [N]         there: the correctness matrix on N GPUs (default: all;
#                                          N ranks share the GPUs there are, round-robin), also
#                                          as thread ranks, staged across N host ids and on the
#                                          copy engines (NCCL_CTA_POLICY=2), a copy-engine call
#                                          whose peers stop calling (occl-gpu stall), the
#                                          KernelCh and CeColl event checks (occl-gpu events),
#                                          then occl's and NCCL's benchmarks side by side (JSON
#                                          lines under $OUT)
#   DIR/gpu-collectives.sh run N check|windows|bench   only one part (each fits a 10-minute
#                                          device call); windows: all-gather, all-to-all and
#                                          broadcast into symmetric windows (check --windows), on
#                                          the kernels and on the copy engines
# NVLink multicast stays off (the shared machines require it).
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1

case "${1:-}" in
build)
    dir=${2:?usage: gpu-collectives.sh build DIR}
    cd "$(dirname "$0")/.."
    mkdir -p "$dir"
    CARGO_BUILD_JOBS=${CARGO_BUILD_JOBS:-1} cargo build -p occl-tests --features cuda --release --bin occl-gpu || exit 1
    # Cargo's own target directory (CARGO_TARGET_DIR), where a worktree may share another's.
    bin=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')/release/occl-gpu
    strip -o "$dir/occl-gpu" "$bin" || exit 1
    nv=$(find target/nvrtc /usr/local -name 'libnvrtc.so.13' 2>/dev/null | head -1)
    if [ -n "$nv" ]; then
        # Every lane width (OCCL_CUDA_LANES=1, 2, 4), so that no run there waits for NVRTC: a
        # check at a width it lacks compiles for tens of seconds before its first case.
        LD_LIBRARY_PATH=$(dirname "$nv") "$dir/occl-gpu" prebuild "$dir/kernel-cache" --arch "${GPU_ARCH:-sm_90}" \
            --lanes "${GPU_LANES:-1,2,4}" || exit 1
    else
        echo "no libnvrtc.so.13 here: the GPU machine compiles the kernels at first use"
    fi
    cp scripts/gpu-collectives.sh "$dir/"
    [ -e bench/anchors/nccl_bench.py ] && cp bench/anchors/nccl_bench.py "$dir/"
    ls -la "$dir"
    ;;
run)
    cd "$(dirname "$0")"
    OUT=${OUT:-/tmp/occl-gpu-out}
    mkdir -p "$OUT"
    n=${2:-$(nvidia-smi -L | wc -l)}
    part=${3:-all}
    nvidia-smi --query-gpu=name,driver_version,clocks.sm,memory.total --format=csv
    nvidia-smi topo -m
    nv=$(find /usr/local /opt /usr/lib -name 'libnvrtc.so.13*' 2>/dev/null | grep -v builtins | head -1)
    export LD_LIBRARY_PATH=$(dirname "$nv")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    export OCCL_KERNEL_CACHE_DIR=/tmp/occl-kernel-cache OCCL_TIMEOUT=${OCCL_TIMEOUT:-30}
    if [ -d kernel-cache ]; then
        # Copied, so that the files belong to this user with no one else's write bit (the cache
        # reads nothing else).
        mkdir -p -m 700 "$OCCL_KERNEL_CACHE_DIR"
        cp -n kernel-cache/*.cubin "$OCCL_KERNEL_CACHE_DIR"/ 2>/dev/null
        chmod 600 "$OCCL_KERNEL_CACHE_DIR"/*.cubin 2>/dev/null
        echo "kernel cache: $(ls "$OCCL_KERNEL_CACHE_DIR" | wc -l) programs"
    fi
    if [ "$part" = all ] || [ "$part" = windows ]; then
    echo "== correctness into symmetric windows on $n GPUs: by default (kernels; from 32 MiB a peer, copy engines), then NCCL_CTA_POLICY=2"
    # At 4 ranks on H200 the halves take about 42 and 24 s.
    timeout "${CHECK_LIMIT:-150}" ./occl-gpu check --ranks "$n" --windows 2>&1 | tee "$OUT/check-windows.txt" | tail -6
    NCCL_CTA_POLICY=2 timeout "${CHECK_LIMIT:-150}" ./occl-gpu check --ranks "$n" --windows --big 256M 2>&1 | tee "$OUT/check-windows-ce.txt" | tail -6
    fi
    [ "$part" = windows ] && exit 0
    if [ "$part" != bench ]; then
    echo "== correctness on $n GPUs"
    timeout "${CHECK_LIMIT:-200}" ./occl-gpu check --ranks "$n" 2>&1 | tee "$OUT/check.txt" | tail -20
    echo "== correctness: $n thread ranks of one process (CudaComm::init_all), and staged as if on $n hosts"
    timeout "${CHECK_LIMIT:-200}" ./occl-gpu check --threads "$n" --big 64M 2>&1 | tee "$OUT/check-threads.txt" | tail -4
    timeout "${CHECK_LIMIT:-200}" ./occl-gpu check --ranks "$n" --hosts "$n" --big 64M 2>&1 | tee "$OUT/check-staged.txt" | tail -4
    echo "== correctness on the copy engines (NCCL_CTA_POLICY=2: all-gather, all-to-all, broadcast, sends and receives)"
    NCCL_CTA_POLICY=2 timeout "${CHECK_LIMIT:-200}" ./occl-gpu check --ranks "$n" 2>&1 | tee "$OUT/check-ce.txt" | tail -4
    echo "== a copy-engine call whose peers stop calling times out (occl-gpu stall, OCCL_TIMEOUT=5)"
    NCCL_CTA_POLICY=2 OCCL_TIMEOUT=5 timeout 60 ./occl-gpu stall --ranks "$n" 2>&1 | tee "$OUT/stall.txt" | tail -6
    echo "== KernelCh events"
    OCCL_METRICS=0 timeout 120 ./occl-gpu events --ranks "$n" 2>&1 | tee "$OUT/events.txt" | tail -3
    echo "== CeColl events of the calls on the copy engines (NCCL_CTA_POLICY=2)"
    OCCL_METRICS=0 NCCL_CTA_POLICY=2 timeout 120 ./occl-gpu events --ranks "$n" 2>&1 | tee "$OUT/events-ce.txt" | tail -3
    fi
    [ "$part" = check ] && exit 0
    echo "== occl bench"
    sizes=8,64K,1M,64M,256M,1G
    {
        timeout 150 ./occl-gpu bench --ranks "$n" --sizes $sizes all_reduce,all_gather,reduce_scatter,broadcast,all_to_all
        timeout 40 ./occl-gpu bench --ranks "$n" --sizes $sizes -d bfloat16 all_reduce
        timeout 30 ./occl-gpu bench --ranks "$n" --sizes 8,64K --graph all_reduce
        for a in oneshot twoshot ring; do
            timeout 30 ./occl-gpu bench --ranks "$n" --sizes 8,1M,16M,256M --algo $a all_reduce
        done
    } 2>&1 | tee "$OUT/occl.jsonl" | grep -v '^{' | tail -20
    echo "== nccl bench"
    {
        timeout 150 python3 nccl_bench.py --nranks "$n" --sizes $sizes
        timeout 60 python3 nccl_bench.py --nranks "$n" --sizes $sizes --dtypes bfloat16 --collectives all_reduce
        timeout 60 python3 nccl_bench.py --nranks "$n" --sizes 8,64K --graph --collectives all_reduce
    } 2>&1 | tee "$OUT/nccl.jsonl" | grep -v '^{' | tail -5
    python3 - "$OUT/occl.jsonl" "$OUT/nccl.jsonl" <<'PY'
import json, sys
rows = {}
for lib, path in (("occl", sys.argv[1]), ("nccl", sys.argv[2])):
    for l in open(path):
        if l.startswith("{"):
            j = json.loads(l)
            if lib == "occl" and j.get("algorithm") not in (None, "direct") and "--algo" in l:
                pass
            rows.setdefault((j["collective"], j["dtype"], j["size_bytes"], j["graph"], j.get("algorithm", "") if lib == "occl" else ""), {})[lib] = j
print("| collective | dtype | bytes | graph | occl algo | occl µs | occl busbw | nccl µs | nccl busbw | busbw ratio | time ratio |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
nccl = {(k[0], k[1], k[2], k[3]): v["nccl"] for k, v in rows.items() if "nccl" in v}
for k, v in sorted(rows.items()):
    if "occl" not in v: continue
    o = v["occl"]; c = nccl.get(k[:4])
    if c:
        print(f"| {k[0]} | {k[1]} | {k[2]} | {k[3]} | {o.get('algorithm')} | {o['time_us']} | {o['busbw_gbps']} | {c['time_us']} | {c['busbw_gbps']} | {o['busbw_gbps']/max(c['busbw_gbps'],1e-9):.2f} | {o['time_us']/c['time_us']:.2f} |")
    else:
        print(f"| {k[0]} | {k[1]} | {k[2]} | {k[3]} | {o.get('algorithm')} | {o['time_us']} | {o['busbw_gbps']} | - | - | - | - |")
PY
    ;;
*)
    echo "usage: gpu-collectives.sh build DIR | run [NGPUS [check|bench]]" >&2
    exit 2
    ;;
esac
