#!/usr/bin/env bash
# The GPU check in one call, for a machine with an NVIDIA GPU and driver (no Boost, yaml-cpp or
# CMake needed there):
#   1. the kernel check: CUDA kernels against the CPU kernels, then the decode bandwidth table
#      next to the device copy bandwidth (kvpool_gpu_check);
#   2. the pool check on cuda-vmm and on cuda-ipc: kvpoold owns the pool in HBM, two worker
#      processes attach, A publishes a prompt's K/V, B decodes over A's pages and matches its own
#      recomputation, kill -9 of a worker and of the daemon, attach and alloc timings
#      (kvpool_gpu_pool_check);
#   3. the tier check on cuda-vmm: an elastic pool with a host tier in pinned memory; B's
#      lookup promotes A's demoted prompt and decodes over it, the pool grows and shrinks by a
#      segment under held pages; grow/shrink latency per segment, promote and demote cost per
#      page (kvpool_gpu_tier_check).
# Binaries: build/gpu/ from scripts/build-gpu.sh (carried from the build machine; they need only
# glibc and the driver), else build/release/. Without them the kernel check is built here with
# nvcc from the project's sources; the pool check needs kvpoold and is then skipped, saying so.
# Finishes in a few minutes on one H200. Exit status: 0 when every check passed or was skipped
# (77 from a check: no usable GPU for it).
set -uo pipefail
cd "$(dirname "$0")/../.."

pick() {  # the first executable among the arguments
  for f in "$@"; do [[ -x "$f" ]] && { echo "$f"; return; }; done
}

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
status=0

kernel_check=$(pick build/gpu/tests/gpu/kvpool_gpu_check build/release/tests/gpu/kvpool_gpu_check)
if [[ -z "$kernel_check" ]]; then
  # One translation unit per process, so the machine's cores compile in parallel.
  out=${TMPDIR:-/tmp}/kvpool_gpu_check.build
  kernel_check=$out/kvpool_gpu_check
  echo "building $kernel_check with $(command -v nvcc)"
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
    wait "$pid" || exit 1
  done
  nvcc "${flags[@]}" "${objs[@]}" -o "$kernel_check" -lpthread || exit 1
fi
echo "== kernel check: $kernel_check"
"$kernel_check"
rc=$?
if [[ $rc -eq 77 ]]; then echo "(no usable GPU here)"; elif [[ $rc -ne 0 ]]; then status=1; fi

kvpoold=$(pick build/gpu/daemon/kvpoold build/release/daemon/kvpoold)
pool_check=$(pick build/gpu/tests/gpu/kvpool_gpu_pool_check \
  build/release/tests/gpu/kvpool_gpu_pool_check)
if [[ -z "$kvpoold" || -z "$pool_check" ]]; then
  echo "== pool check skipped: no prebuilt kvpoold and kvpool_gpu_pool_check (run" \
    "scripts/build-gpu.sh on the build machine and carry build/gpu)"
  exit "$status"
fi
for backend in cuda-vmm cuda-ipc; do
  for dtype in bf16 fp8_e4m3; do
    echo "== pool check: $backend $dtype"
    timeout 120 "$pool_check" --kvpoold "$kvpoold" --backend "$backend" --dtype "$dtype"
    rc=$?
    if [[ $rc -eq 77 ]]; then echo "($backend is not usable here)"; elif [[ $rc -ne 0 ]]; then status=1; fi
  done
done
tier_check=$(pick build/gpu/tests/gpu/kvpool_gpu_tier_check \
  build/release/tests/gpu/kvpool_gpu_tier_check)
if [[ -n "$tier_check" ]]; then
  for dtype in bf16 fp8_e4m3; do
    echo "== tier check: cuda-vmm $dtype"
    timeout 120 "$tier_check" --kvpoold "$kvpoold" --backend cuda-vmm --dtype "$dtype"
    rc=$?
    if [[ $rc -eq 77 ]]; then echo "(cuda-vmm is not usable here)"; elif [[ $rc -ne 0 ]]; then status=1; fi
  done
fi
exit "$status"
