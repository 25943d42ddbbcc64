#!/usr/bin/env bash
# Runs every check occl has: formatting, clippy with warnings as errors, and all tests (unit
# tests, multi-process integration tests over shm and tcp, threads mode, error cases, and the
# ib feature as far as a machine without an RDMA device can test it).
# Installs what the tests need on a fresh Debian machine; needs only a Rust toolchain.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v cargo >/dev/null 2>&1; then
    echo "scripts/test.sh: cargo not found; install a Rust toolchain (https://rustup.rs) first" >&2
    exit 1
fi
# gcc for crates that build C and for the test profiler plugins; iproute2 for the network-namespace
# test; Debian's prometheus (prometheus and promtool) for the metrics test; python3 with venv for
# HolisticTraceAnalysis (below); clippy and rustfmt for the lints.
need=()
command -v cc >/dev/null 2>&1 || need+=(gcc)
# g++ is nvcc's host compiler (the device-API test, below).
command -v c++ >/dev/null 2>&1 || need+=(g++)
command -v ip >/dev/null 2>&1 || need+=(iproute2)
# tmux drives `ncclras --tui` in its test.
command -v tmux >/dev/null 2>&1 || need+=(tmux)
{ command -v prometheus && command -v promtool; } >/dev/null 2>&1 || need+=(prometheus)
command -v python3 >/dev/null 2>&1 || need+=(python3)
python3 -c 'import venv, ensurepip' >/dev/null 2>&1 || need+=(python3-venv)
if [ ${#need[@]} -gt 0 ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
    else
        echo "scripts/test.sh: cannot install ${need[*]} (not root or no apt-get); tests that need them say so (and fail under CI=1)" >&2
    fi
fi
for comp in clippy rustfmt; do
    if ! cargo "${comp/rustfmt/fmt}" --version >/dev/null 2>&1; then
        rustup component add "$comp"
    fi
done

# NVRTC, which needs no GPU, so that the kernel crate's tests compile the real CUDA sources (they
# print that they skipped if it cannot be had). 13.0 is the GPU machines' CUDA version.
nvrtc_lib=target/nvrtc/nvidia/cu13/lib
if [ ! -e "$nvrtc_lib/libnvrtc.so.13" ] && command -v python3 >/dev/null 2>&1; then
    rm -rf target/nvrtc && mkdir -p target/nvrtc
    if python3 -m pip download -q --no-deps --only-binary=:all: --dest target/nvrtc nvidia-cuda-nvrtc==13.0.88; then
        python3 -m zipfile -e target/nvrtc/nvidia_cuda_nvrtc-*.whl target/nvrtc
    else
        echo "scripts/test.sh: could not fetch NVRTC; the kernel compile tests will report that they skipped" >&2
    fi
fi
if [ -e "$nvrtc_lib/libnvrtc.so.13" ]; then
    export LD_LIBRARY_PATH="$PWD/$nvrtc_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi

# nvcc, with CUDA's runtime headers and libcu++ (<cuda/atomic>), from NVIDIA's wheels, so that the
# device-API test compiles tests/cuda/device_api.cu against nccl/include (it needs no GPU to
# compile; CUDA 13.0 like NVRTC above: the 12.x nvcc wheels after 12.8 carry no nvcc binary).
nvcc_dir=target/nvcc/nvidia/cu13
if [ ! -x "$nvcc_dir/bin/nvcc" ] && command -v python3 >/dev/null 2>&1; then
    rm -rf target/nvcc && mkdir -p target/nvcc
    if python3 -m pip download -q --no-deps --only-binary=:all: --dest target/nvcc nvidia-cuda-nvcc==13.0.88 \
        nvidia-nvvm==13.0.88 nvidia-cuda-crt==13.0.88 nvidia-cuda-runtime==13.0.88 nvidia-cuda-cccl==13.0.85; then
        for w in target/nvcc/*.whl; do python3 -m zipfile -e "$w" target/nvcc && rm "$w"; done
        chmod +x "$nvcc_dir"/bin/* "$nvcc_dir"/nvvm/bin/*  # zip extraction drops the modes
    else
        echo "scripts/test.sh: could not fetch nvcc; the device-API test will fail under CI=1" >&2
    fi
fi

# HolisticTraceAnalysis from PyPI, pinned, in a venv under target/ (kept between runs), for the
# trace test (tests/tests/trace_hta.rs). If it cannot be installed, that test fails under CI.
# pandas and numpy are pinned too: HTA 0.5.0 asks only for minimum versions.
hta_version=0.5.0
hta_pins=("HolisticTraceAnalysis==$hta_version" "pandas==3.1.1" "numpy==2.4.6")
hta_venv="$PWD/target/hta-venv"
hta_have() {
    "$hta_venv/bin/python" -c "import importlib.metadata as m, sys; sys.exit([m.version(p) for p in ('HolisticTraceAnalysis', 'pandas', 'numpy')] != ['$hta_version', '3.1.1', '2.4.6'])" >/dev/null 2>&1
}
if ! hta_have; then
    echo "== installing HolisticTraceAnalysis $hta_version into $hta_venv"
    rm -rf "$hta_venv"
    if ! { python3 -m venv "$hta_venv" && "$hta_venv/bin/pip" install -q --disable-pip-version-check "${hta_pins[@]}"; }; then
        echo "scripts/test.sh: could not install HolisticTraceAnalysis $hta_version; the HTA trace test will fail" >&2
    fi
fi
export OCCL_HTA_PYTHON="$hta_venv/bin/python"

# PyTorch's Flight Recorder analyzer (`torchfrtrace`) from PyPI's torch 2.11.0 wheel, for the flight
# test (tests/tests/flight.rs). The package is pure Python and imports nothing else of torch (its
# parents load as namespace packages without their __init__), so only it is unpacked, from the
# smallest wheel (macOS arm64, ~80 MB against ~900 MB for Linux x86_64; the same Python files),
# fetched by pip without dependencies. If it cannot be fetched, that test says SKIPPED (fails under CI).
torchfr_dir="$PWD/target/torch-fr"
if [ ! -e "$torchfr_dir/torch/distributed/flight_recorder/fr_trace.py" ] && command -v python3 >/dev/null 2>&1; then
    echo "== fetching PyTorch 2.11.0's Flight Recorder analyzer into $torchfr_dir"
    rm -rf "$torchfr_dir" && mkdir -p "$torchfr_dir/wheel"
    if python3 -m pip download -q --no-deps --only-binary=:all: --platform macosx_11_0_arm64 --python-version 3.12 \
        --dest "$torchfr_dir/wheel" torch==2.11.0; then
        python3 -c 'import glob, sys, zipfile
z = zipfile.ZipFile(glob.glob(sys.argv[1] + "/wheel/torch-2.11.0-*.whl")[0])
z.extractall(sys.argv[1], [n for n in z.namelist() if n.startswith("torch/distributed/flight_recorder/")])' "$torchfr_dir"
    else
        echo "scripts/test.sh: could not fetch torch 2.11.0 from PyPI; the torchfrtrace test will say SKIPPED" >&2
    fi
    rm -rf "$torchfr_dir/wheel"
fi
export OCCL_TORCHFR_PATH="$torchfr_dir"

# Segments of jobs killed during setup fill /dev/shm and starve everything after (pip itself can
# be killed for memory); show its use up front so such a run explains itself.
echo "== /dev/shm: $(df -h /dev/shm 2>/dev/null | awk 'NR==2 {print $3 " used of " $2}')"
echo "== rustfmt"
cargo fmt --all -- --check
echo "== clippy"
# Profile `ci` (Cargo.toml): release optimisation, no LTO, no debug info; its build scripts and
# dependencies are shared by the lints and the tests.
cargo clippy --workspace --all-targets --profile ci -- -D warnings
# The cuda feature builds without CUDA (the libraries are loaded at run time).
cargo clippy -p occl --features cuda --all-targets --profile ci -- -D warnings
# So does the ib feature (libibverbs.so.1 is loaded at run time; no rdma-core headers needed).
cargo clippy -p occl --features ib --all-targets --profile ci -- -D warnings
# occl-tests with both: occl-gpu (the GPU machine's checker and benchmark) and the ib suite.
cargo clippy -p occl-tests --features cuda,ib --all-targets --profile ci -- -D warnings
# The libraries as they ship, without the test-support feature that their tests and fuzzers turn on
# (the lines above build every crate's tests, so they lint these with it).
cargo clippy -p occl-profiler -p occl-kernels -p occl-ras-proto -p occl-ras -p ibverbs --lib --profile ci -- -D warnings
# occl without its default features (ras, exporters): no async runtime, HTTP stack or compression
# in its dependency tree (nor the RAS server crate: the records are occl-ras-proto's), and it still
# lints and runs its collectives (below).
cargo clippy -p occl --no-default-features --all-targets --profile ci -- -D warnings
if cargo tree -p occl -e normal --no-default-features --prefix none | grep -E '^(tokio|hyper|axum|flate2|occl-ras) '; then
    echo "scripts/test.sh: occl --no-default-features depends on the crates above; keep them behind features" >&2
    exit 1
fi
echo "== tests"
# Optimised: the integration tests move hundreds of MiB through real processes.
cargo test --workspace --profile ci -- --test-threads 2
# occl's own tests without its default features: collectives with no RAS thread or exporters.
cargo test -p occl --no-default-features --profile ci --lib -- --test-threads 2
# occl's unit tests of the cuda and ib features, built together (one build instead of two).
cargo test -p occl --features cuda,ib --profile ci --lib -- --test-threads 2 cuda:: transport::
# The GPU tools' pure parts (occl-gpu's windowed check model, event and stall helpers).
cargo test -p occl-tests --features cuda --profile ci --lib -- --test-threads 2 gpu_
# ib: the verbs crate's state machines and layouts, and the integration test that forces
# OCCL_TRANSPORT=ib (it says SKIPPED for the suite without a device).
cargo test -p ibverbs --profile ci -- --test-threads 2
cargo test -p occl-tests --features ib --profile ci --test ib -- --test-threads 2 --nocapture
