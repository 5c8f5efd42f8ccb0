#!/usr/bin/env bash
# The GPU check in one call, for a machine with an NVIDIA GPU and the CUDA toolkit (no Boost,
# yaml-cpp or CMake needed): runs the CUDA kernels against the CPU kernels, then prints the
# decode bandwidth table next to the device copy bandwidth. Uses a prebuilt binary when one is
# there (build/release/tests/gpu/kvpool_gpu_check, carried from the build machine), else builds
# one with nvcc from the project's sources, one translation unit per process. Finishes in a few
# minutes on one H200.
set -euo pipefail
cd "$(dirname "$0")/../.."

bin=build/release/tests/gpu/kvpool_gpu_check
if [[ ! -x "$bin" ]]; then
  out=${TMPDIR:-/tmp}/kvpool_gpu_check.build
  bin=$out/kvpool_gpu_check
  echo "building $bin with $(command -v nvcc)"
  mkdir -p "$out"
  flags=(-std=c++20 -O3 --expt-relaxed-constexpr -I.
    -gencode arch=compute_90a,code=sm_90a -gencode arch=compute_90,code=compute_90)
  srcs=(tests/gpu/gpu_check.cu kernels/cuda/decode.cu kernels/cuda/extend.cu
    kernels/cuda/append_kv.cu kernels/cuda/copy_pages.cu kernels/cpu/*.cpp
    common/geometry.cpp common/status.cpp)
  objs=()
  pids=()
  for src in "${srcs[@]}"; do
    obj=$out/$(echo "$src" | tr / _).o
    nvcc "${flags[@]}" -c "$src" -o "$obj" &
    pids+=($!)
    objs+=("$obj")
  done
  for pid in "${pids[@]}"; do
    wait "$pid"
  done
  nvcc "${flags[@]}" "${objs[@]}" -o "$bin" -lpthread
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
"$bin"
