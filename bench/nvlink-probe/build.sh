#!/bin/bash
# Builds ./nvlink-probe (CUDA runtime only; sm_90 = H100/H200). NVCC=/path/to/nvcc to override.
set -e
cd "$(dirname "$0")"
"${NVCC:-nvcc}" -O3 -arch=sm_90 -std=c++17 -o nvlink-probe nvlink-probe.cu -lcuda
echo "built $(pwd)/nvlink-probe"
