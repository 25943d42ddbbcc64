#!/bin/bash
# Device builds of occl side by side on a GPU machine, NCCL's bandwidth in the same call: the A/B
# that decides whether a kernel change lands (results go to the baseline of what it changes,
# e.g. bench/baselines/kernel-phases.md). Two halves, as scripts/gpu-collectives.sh:
#
#   bash bench/gpu-ab.sh pack NAME          here, in the checkout (or worktree) to measure: builds
#                                           occl-gpu and its kernel cache (gpu-collectives.sh
#                                           build) into $GPU_AB_DIR/NAME.txz (default
#                                           target/gpu-ab). Packed with xz a build is about 4.6 MB,
#                                           so several fit one device call's carry (64 MiB):
#                                           carry the directory.
#   bash bench/gpu-ab.sh run NRANKS NAME... there: NCCL once (nccl_bench.py, its channel count
#                                           from NCCL_DEBUG=INFO), then ROUNDS rounds of every
#                                           configuration and every build, the builds' order
#                                           rotating per round; prints per (collective, bytes,
#                                           configuration) each build's median busbw, its ratio
#                                           to the first build's and to NCCL's
#
#   CONFIGS="NCCL_MAX_CTAS=24;default"  configurations, ';' between them, each VAR=VALUE ...
#   ENV_<NAME>="VAR=VALUE ..."          variables for build NAME alone (ENV_l4="OCCL_CUDA_LANES=4")
#   LABEL:NAME (as a build)             build NAME again under a column of its own, with
#                                       ENV_<LABEL>: one pack, several settings
#                                       (`run 2 main s1m:main` with ENV_s1m="OCCL_CUDA_SLOT_SIZE=1M")
#   SIZES=64M,256M,1G  COLLS=all_reduce,reduce_scatter,all_gather  ROUNDS=2  OUT=dir
#
# NVLink multicast stays off (the shared machines require it).
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
root=$(cd "$(dirname "$0")/.." && pwd)
ab=${GPU_AB_DIR:-$root/target/gpu-ab}

case "${1:-}" in
pack)
    name=${2:?usage: gpu-ab.sh pack NAME}
    mkdir -p "$ab"
    rm -rf "${ab:?}/$name"
    bash "$root/scripts/gpu-collectives.sh" build "$ab/$name" || exit 1
    tar cJf "$ab/$name.txz" -C "$ab" "$name" && rm -rf "${ab:?}/$name"
    ls -la "$ab/$name.txz"
    ;;
run)
    n=${2:?usage: gpu-ab.sh run NRANKS NAME...}
    shift 2
    [ $# -ge 1 ] || { echo "gpu-ab.sh run: name at least one build" >&2; exit 2; }
    names=("$@")
    nv=$(find /usr/local /opt /usr/lib -name 'libnvrtc.so.13*' 2>/dev/null | grep -v builtins | head -1)
    export LD_LIBRARY_PATH=$(dirname "$nv")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    export OCCL_KERNEL_CACHE_DIR=${OCCL_KERNEL_CACHE_DIR:-/tmp/occl-kernel-cache} OCCL_TIMEOUT=${OCCL_TIMEOUT:-30}
    work=$(mktemp -d)
    mkdir -p -m 700 "$OCCL_KERNEL_CACHE_DIR"
    declare -A pack
    for v in "${names[@]}"; do
        pack[${v%%:*}]=${v#*:}
        [ -d "$work/${v#*:}" ] && continue
        tar xJf "$ab/${v#*:}.txz" -C "$work" || exit 1
        # Copied, so that the files belong to this user with no one else's write bit.
        cp -n "$work/${v#*:}"/kernel-cache/*.cubin "$OCCL_KERNEL_CACHE_DIR"/ 2>/dev/null
    done
    names=("${names[@]%%:*}")
    chmod 600 "$OCCL_KERNEL_CACHE_DIR"/*.cubin 2>/dev/null
    out=${OUT:-$(mktemp -d)}
    mkdir -p "$out"
    sizes=${SIZES:-64M,256M,1G}
    colls=${COLLS:-all_reduce,reduce_scatter,all_gather}
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1
    NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT timeout 150 python3 "$work/${pack[${names[0]}]}/nccl_bench.py" --nranks "$n" \
        --sizes "$sizes" --collectives "$colls" > "$out/nccl.txt" 2>&1
    echo "nccl: $(grep -ohE '[0-9]+ coll channels' "$out/nccl.txt" | sort | uniq -c | tr '\n' ' ')"
    IFS=';' read -ra configs <<< "${CONFIGS:-NCCL_MAX_CTAS=24;default}"
    : > "$out/ab.txt"
    for round in $(seq 1 "${ROUNDS:-2}"); do
        k=$((round % ${#names[@]}))
        order=("${names[@]:k}" "${names[@]:0:k}")
        for c in "${configs[@]}"; do
            for v in "${order[@]}"; do
                envs=ENV_$v
                env ${c/default/} ${!envs:-} timeout 150 "$work/${pack[$v]}/occl-gpu" bench --ranks "$n" --sizes "$sizes" "$colls" \
                    > "$out/last.txt" 2>&1 || { echo "$v ($c): failed"; tail -5 "$out/last.txt"; }
                grep '^{' "$out/last.txt" | sed "s/^/$v\t$c\t/" >> "$out/ab.txt"
            done
        done
    done
    python3 - "$out/ab.txt" "$out/nccl.txt" "${names[@]}" <<'PY'
import json, statistics as st, sys
names = sys.argv[3:]
nccl = {}
for l in open(sys.argv[2]):
    if l.startswith("{"):
        j = json.loads(l)
        nccl[(j["collective"], j["size_bytes"])] = j["busbw_gbps"]
rows = {}
for l in open(sys.argv[1]):
    v, c, js = l.rstrip("\n").split("\t", 2)
    j = json.loads(js)
    rows.setdefault((j["collective"], j["size_bytes"], c), {}).setdefault(v, []).append((j["busbw_gbps"], j.get("sms")))
head = " | ".join(f"{v}: SMs, busbw, / {names[0]}, / NCCL" for v in names)
print(f"| collective | bytes | config | NCCL busbw | {head} |")
print("|---|---|---|---|" + "---|" * len(names))
for (coll, size, c), per in sorted(rows.items()):
    ref = nccl.get((coll, size))
    base = st.median(b for b, _ in per[names[0]]) if names[0] in per else None
    cells = []
    for v in names:
        if v not in per:
            cells.append("-")
            continue
        bw = st.median(b for b, _ in per[v])
        sms = per[v][-1][1]
        vs_base = f"{bw / base:.2f}" if base else "-"
        cells.append(f"{sms}, {bw:.0f}, {vs_base}, " + (f"{bw / ref:.2f}" if ref else "-"))
    print(f"| {coll} | {size >> 20} MiB | {c} | {ref if ref else '-'} | " + " | ".join(cells) + " |")
PY
    rm -rf "$work"
    ;;
*)
    echo "usage: gpu-ab.sh pack NAME | run NRANKS NAME..." >&2
    exit 2
    ;;
esac
