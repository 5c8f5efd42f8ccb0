#!/usr/bin/env bash
# Configures and builds one kvpool build tree.
#   scripts/build.sh release   build/release: optimised, warnings are errors
#   scripts/build.sh asan      build/asan: Debug + AddressSanitizer + UndefinedBehaviorSanitizer
set -euo pipefail
cd "$(dirname "$0")/.."

kind=${1:-release}
jobs=${KVPOOL_JOBS:-$(nproc)}
case "$kind" in
  release) flags=(-DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVPOOL_WERROR=ON) ;;
  # The sanitizer tree skips CUDA: nvcc code is not instrumented, and the release tree compiles it.
  asan) flags=(-DCMAKE_BUILD_TYPE=Debug -DKVPOOL_SANITIZE=ON -DKVPOOL_WERROR=ON -DKVPOOL_CUDA=OFF) ;;
  *) echo "usage: scripts/build.sh [release|asan]" >&2; exit 2 ;;
esac

cmake -S . -B "build/$kind" -G Ninja "${flags[@]}" >/dev/null
cmake --build "build/$kind" -j "$jobs"
