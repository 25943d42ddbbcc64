#!/usr/bin/env bash
# Runs every check occl has: formatting, clippy with warnings as errors, and all tests (unit
# tests, multi-process integration tests over shm and tcp, threads mode, error cases).
# Installs what the tests need on a fresh Debian machine; needs only a Rust toolchain.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v cargo >/dev/null 2>&1; then
    echo "scripts/test.sh: cargo not found; install a Rust toolchain (https://rustup.rs) first" >&2
    exit 1
fi
# gcc for crates that build C and for the test profiler plugins; iproute2 for the network-namespace
# test; python3 with venv for HolisticTraceAnalysis (below); clippy and rustfmt for the lints.
need=()
command -v cc >/dev/null 2>&1 || need+=(gcc)
command -v ip >/dev/null 2>&1 || need+=(iproute2)
command -v python3 >/dev/null 2>&1 || need+=(python3)
python3 -c 'import venv, ensurepip' >/dev/null 2>&1 || need+=(python3-venv)
if [ ${#need[@]} -gt 0 ] && [ "$(id -u)" = 0 ]; then
    apt-get update -qq && apt-get install -y -qq "${need[@]}" >/dev/null
fi
for comp in clippy rustfmt; do
    if ! cargo "${comp/rustfmt/fmt}" --version >/dev/null 2>&1; then
        rustup component add "$comp"
    fi
done

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

echo "== rustfmt"
cargo fmt --all -- --check
echo "== clippy"
cargo clippy --workspace --all-targets --release -- -D warnings
echo "== tests"
# Release build: the integration tests move hundreds of MiB through real processes.
cargo test --workspace --release -- --test-threads 2
