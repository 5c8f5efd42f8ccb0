#!/usr/bin/env bash
# Builds the binaries tests/gpu/run.sh runs on a GPU machine and puts them, alone, in
# build/gpu-bin (about 25 MiB: what a device call carries beside the tree, within its 64 MiB):
#   kvpoold, kvpool_gpu_check (kernel check and bench), kvpool_gpu_pool_check,
#   kvpool_gpu_tier_check
# The build tree is build/gpu (KVPOOL_PORTABLE: static libstdc++, OpenSSL, yaml-cpp, hiredis,
# xxHash; static CUDA runtime; no ZeroMQ, no Python module, as the GPU machine has neither), so
# the binaries need only glibc ≥ 2.36 and the NVIDIA driver there. Then, as the device call:
#   run  command="bash tests/gpu/run.sh"  carry=["build/gpu-bin"]  timeout_s=600
# (tests/gpu/README.md).
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=${KVPOOL_JOBS:-$(nproc)}
cmake -S . -B build/gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVPOOL_PORTABLE=ON \
  -DKVPOOL_WERROR=ON -DKVPOOL_ZMQ=OFF -DKVPOOL_PYTHON=OFF >/dev/null
cmake --build build/gpu -j "$jobs" --target kvpoold kvpool_gpu_pool_check kvpool_gpu_check \
  kvpool_gpu_tier_check
rm -rf build/gpu-bin
mkdir -p build/gpu-bin
for b in daemon/kvpoold tests/gpu/kvpool_gpu_pool_check tests/gpu/kvpool_gpu_check \
  tests/gpu/kvpool_gpu_tier_check; do
  if ldd "build/gpu/$b" | grep -E 'libstdc\+\+|libyaml|libcrypto|libcuda|libcudart|libzmq|libhiredis|libxxhash'; then
    echo "build/gpu/$b is not portable: it links the libraries above dynamically" >&2
    exit 1
  fi
  objcopy --strip-debug "build/gpu/$b" "build/gpu-bin/$(basename "$b")"
done
du -sh build/gpu-bin/*
total_kib=$(du -sk build/gpu-bin | cut -f1)
echo "build/gpu-bin: $((total_kib / 1024)) MiB; carry it: run command=\"bash tests/gpu/run.sh\"" \
  "carry=[\"build/gpu-bin\"] timeout_s=600"
if ((total_kib > 48 * 1024)); then
  echo "build/gpu-bin is over 48 MiB: with the tree it may not fit a device call's 64 MiB" >&2
  exit 1
fi
