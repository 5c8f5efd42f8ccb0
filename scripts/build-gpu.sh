#!/usr/bin/env bash
# Builds the binaries tests/gpu/run.sh runs on a GPU machine, into build/gpu: kvpoold, the pool
# check, the kernel check and the kernel benchmark, linked so that they need only glibc and the
# NVIDIA driver there (KVPOOL_PORTABLE: static libstdc++, OpenSSL, yaml-cpp; static CUDA runtime).
# Carry build/gpu to the GPU machine and run tests/gpu/run.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=${KVPOOL_JOBS:-$(nproc)}
# No ZeroMQ endpoint and no Python module: the GPU machine has neither libzmq nor Python's
# development files.
cmake -S . -B build/gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVPOOL_PORTABLE=ON \
  -DKVPOOL_WERROR=ON -DKVPOOL_ZMQ=OFF -DKVPOOL_PYTHON=OFF >/dev/null
cmake --build build/gpu -j "$jobs" --target kvpoold kvpool_gpu_pool_check kvpool_gpu_check \
  kvpool_gpu_tier_check kvpool-kernel-bench
for b in daemon/kvpoold tests/gpu/kvpool_gpu_pool_check tests/gpu/kvpool_gpu_check \
  tests/gpu/kvpool_gpu_tier_check; do
  if ldd "build/gpu/$b" | grep -E 'libstdc\+\+|libyaml|libcrypto|libcuda|libcudart|libzmq'; then
    echo "build/gpu/$b is not portable: it links the libraries above dynamically" >&2
    exit 1
  fi
done
du -sh build/gpu/daemon/kvpoold build/gpu/tests/gpu/kvpool_gpu_pool_check \
  build/gpu/tests/gpu/kvpool_gpu_check build/gpu/tests/gpu/kvpool_gpu_tier_check
