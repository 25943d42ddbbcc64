#!/usr/bin/env bash
# occl-kernels on a GPU machine that has no Rust toolchain, in two halves:
#   scripts/gpu-kernels.sh build DIR   here: builds the check tool and the test binaries (release)
#                                      and copies them, stripped, with this script into DIR
#   DIR/gpu-kernels.sh run             there: 4 processes build the kernels into one empty cache
#                                      at once, the cache is read back, the SASS is checked for
#                                      16-byte accesses, the test binaries run, then the full
#                                      check and the bandwidth table (written under $OUT)
# Needs libnvrtc.so.13 on the GPU machine (found under /usr/local, /opt or /usr/lib).
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1

case "${1:-}" in
build)
    dir=${2:?usage: gpu-kernels.sh build DIR}
    cd "$(dirname "$0")/.."
    mkdir -p "$dir"
    CARGO_BUILD_JOBS=${CARGO_BUILD_JOBS:-1} cargo build -p occl-kernels --features test-support --release --bins || exit 1
    CARGO_BUILD_JOBS=${CARGO_BUILD_JOBS:-1} cargo test -p occl-kernels --release --no-run --message-format=json 2>/dev/null |
        python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["kind"] == ["test"]:
        print(m["target"]["name"], m["executable"])' |
        while read -r name exe; do strip -o "$dir/$name" "$exe"; done
    strip -o "$dir/occl-kernels-check" target/release/occl-kernels-check
    cp scripts/gpu-kernels.sh "$dir/"
    ls -la "$dir"
    ;;
run)
    cd "$(dirname "$0")"
    OUT=${OUT:-/tmp/occl-kernels-out}
    mkdir -p "$OUT"
    uname -r
    nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,memory.total --format=csv
    nv=$(find /usr/local /opt /usr/lib -name 'libnvrtc.so.13*' 2>/dev/null | grep -v builtins | head -1)
    echo "nvrtc: $nv"
    export LD_LIBRARY_PATH=$(dirname "$nv")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    echo "== 4 processes build into one empty cache at once"
    c=/tmp/occl-kernels-cache-$$
    rm -rf "$c"
    for i in 1 2 3 4; do OCCL_KERNEL_CACHE_DIR=$c ./occl-kernels-check --load-only >"/tmp/occl-load$i.txt" 2>&1 & done
    wait
    cat /tmp/occl-load*.txt
    ls -la "$c"
    echo "== again, from the cache"
    OCCL_KERNEL_CACHE_DIR=$c ./occl-kernels-check --load-only
    echo "== SASS: 128-bit loads and stores, registers"
    # A cache file is a 32-byte header and the cubin.
    tail -c +33 "$(ls "$c"/*.cubin | head -1)" >/tmp/occl-kernels.cubin
    for k in occl_reduce_f32_sum occl_reduce_bf16_sum occl_reduce_f8e4m3_sum occl_copy; do
        echo "$k:"
        cuobjdump -sass -fun "$k" /tmp/occl-kernels.cubin | grep -oE "(LDG|STG)[.A-Z0-9]*" | sort | uniq -c
    done
    cuobjdump -res-usage /tmp/occl-kernels.cubin 2>&1 | grep -A1 -E "Function (occl_reduce_(f32|bf16|f8e4m3|f64)_sum|occl_copy)\b" | grep -v "^--"
    echo "== test binaries"
    for t in gpu nvrtc cache; do
        echo "-- $t"
        ./$t --test-threads 1 2>&1 | tail -12
    done
    echo "== full check and bandwidth"
    ./occl-kernels-check --bench-sizes 64K,1M,16M,256M,1G --out "$OUT/kernels.md" 2>&1 | tee "$OUT/check.log"
    ;;
*)
    echo "usage: $0 build DIR | run" >&2
    exit 2
    ;;
esac
