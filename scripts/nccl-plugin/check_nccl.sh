#!/usr/bin/env bash
# GPU check of libnccl-profiler-occl.so under NVIDIA's NCCL (issue 6): a 2-GPU torchrun job of a
# few hundred all-reduces with NCCL_PROFILER_PLUGIN set to the plugin, then what NCCL said about
# the plugin (NCCL_DEBUG=INFO names the version it chose), each rank's /metrics (scraped by the
# job before it destroyed its process group), and the trace files.
#
#   scripts/nccl-plugin/check_nccl.sh [--iters N] [--test-spans] [--otlp]
#
# Needs: 2 GPUs, python3 with torch (CUDA), cargo (unless PLUGIN=<path to the .so> is given).
# Environment: OUT_DIR (default: a new /tmp/occl-nccl-check.* directory), METRICS_PORT (base
# port, rank r listens on +r; default 9464), and any OCCL_* / OTEL_* exporter settings, which
# are passed through (OTEL_EXPORTER_OTLP_ENDPOINT turns OTLP on). --test-spans adds the plugin's
# test-only span log (OCCL_PROFILER_TEST_SPANS, feature test-support: a PLUGIN given must be
# built with it) next to the real exporters. --otlp starts a
# loopback OTLP/HTTP receiver (otlp_sink.py, port 4318) that saves each request under $out/otlp;
# decode_otlp.py (needs the opentelemetry-proto package) prints the span tree from them.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
iters=300
test_spans=0
otlp=0
while [ $# -gt 0 ]; do
    case "$1" in
        --iters) iters=$2; shift 2 ;;
        --test-spans) test_spans=1; shift ;;
        --otlp) otlp=1; shift ;;
        *) echo "usage: $0 [--iters N] [--test-spans] [--otlp]" >&2; exit 2 ;;
    esac
done

out=${OUT_DIR:-$(mktemp -d /tmp/occl-nccl-check.XXXXXX)}
mkdir -p "$out/traces"
if [ -z "${PLUGIN:-}" ]; then
    # The test span log is a test-only part of the plugin, built in only on request.
    features=()
    if [ "$test_spans" = 1 ]; then features=(--features test-support); fi
    (cd "$root" && cargo build --release -p occl-profiler ${features[@]+"${features[@]}"})
    PLUGIN="$root/target/release/libnccl_profiler_occl.so"
fi
# NCCL's own name for it; an absolute path works on NCCL 2.23-2.30 except 2.27.3.
cp "$PLUGIN" "$out/libnccl-profiler-occl.so"

python3 - <<'PY'
import torch
n = torch.cuda.device_count()
print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, NCCL {'.'.join(map(str, torch.cuda.nccl.version()))}, {n} GPU(s)")
if n < 2:
    raise SystemExit("this check needs 2 GPUs")
PY

export NCCL_PROFILER_PLUGIN="$out/libnccl-profiler-occl.so"
export NCCL_DEBUG=INFO
export NCCL_DEBUG_SUBSYS=${NCCL_DEBUG_SUBSYS:-INIT,ENV}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export OCCL_METRICS_ADDR="127.0.0.1:${METRICS_PORT:-9464}"
export OCCL_METRICS=${OCCL_METRICS:-1}
export OCCL_TRACE_DIR=${OCCL_TRACE_DIR:-$out/traces}
if [ "$test_spans" = 1 ]; then
    export OCCL_PROFILER_TEST_SPANS="$out/spans"
fi

sink=
if [ "$otlp" = 1 ]; then
    python3 "$here/otlp_sink.py" 4318 "$out/otlp" &
    sink=$!
    export OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4318 OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf
    export OTEL_SERVICE_NAME=${OTEL_SERVICE_NAME:-nccl-check}
fi

echo "== job (log: $out/job.log)"
set +e
torchrun --standalone --nproc_per_node=2 "$here/allreduce.py" --iters "$iters" --out "$out" >"$out/job.log" 2>&1
rc=$?
set -e
if [ -n "$sink" ]; then
    sleep 2
    kill "$sink"
    echo "== OTLP requests received: $(ls "$out/otlp" | wc -l) (decode: python3 $here/decode_otlp.py $out/otlp)"
fi
grep -E "^rank [0-9]" "$out/job.log" || true

echo "== what NCCL and the plugin said about the plugin"
grep -iE "profiler|occl" "$out/job.log" | sort | uniq -c | sort -rn | head -40 || true

for f in "$out"/metrics-rank*.txt; do
    [ -e "$f" ] || { echo "== no /metrics text was saved"; break; }
    echo "== $(basename "$f")"
    cat "$f"
done

echo "== trace files in $OCCL_TRACE_DIR"
ls -la "$OCCL_TRACE_DIR"
if [ "$test_spans" = 1 ]; then
    echo "== test span log (spans per type)"
    cat "$out"/spans-*.jsonl 2>/dev/null | python3 -c '
import json, sys, collections
c = collections.Counter(json.loads(l).get("type", "-") for l in sys.stdin if "\"span\"" in l)
print(dict(sorted(c.items())))'
fi
echo "== job exit status $rc; everything is in $out"
exit "$rc"
