#!/usr/bin/env bash
# Configures and builds one kvpool build tree.
#   scripts/build.sh release   build/release: optimised, warnings are errors
#   scripts/build.sh asan      build/asan: Debug + AddressSanitizer + UndefinedBehaviorSanitizer
#   scripts/build.sh fuzz      build/fuzz: clang, -O1, ASan + UBSan + libFuzzer; only the fuzz
#                              target (ctest -L fuzz)
#   scripts/build.sh tsan      build/tsan: Debug + ThreadSanitizer; only the daemon, its tools and
#                              the integration tests (ctest -L integration)
# KVPOOL_JOBS sets the parallel jobs (default: every core).
set -euo pipefail
cd "$(dirname "$0")/.."

kind=${1:-release}
jobs=${KVPOOL_JOBS:-$(nproc)}
targets=()
case "$kind" in
  release) flags=(-DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVPOOL_WERROR=ON) ;;
  # The sanitizer trees skip CUDA: nvcc code is not instrumented, and the release tree compiles it.
  # Nor the benchmark programs, which no test runs (kvpool-replay, which tests start, stays).
  asan)
    flags=(-DCMAKE_BUILD_TYPE=Debug -DKVPOOL_SANITIZE=ON -DKVPOOL_WERROR=ON -DKVPOOL_CUDA=OFF
      -DKVPOOL_BENCH_PROGRAMS=OFF)
    ;;
  # clang's warnings differ from GCC's, which is what the other trees hold to -Werror; here they
  # stay warnings. -O1 with assertions (no NDEBUG): fast enough to fuzz, every KVPOOL_DCHECK on.
  fuzz)
    flags=(-DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=Debug
      "-DCMAKE_C_FLAGS_DEBUG=-O1 -g" "-DCMAKE_CXX_FLAGS_DEBUG=-O1 -g" -DKVPOOL_FUZZ=ON
      -DKVPOOL_CUDA=OFF)
    targets=(kvpool_frame_fuzz)
    ;;
  # What ctest -L integration runs: the daemon tests and what they start (kvpoold, kvpoolctl,
  # kvpool-replay, the C worker), the replay tests and the fake-device pool check.
  tsan)
    flags=(-DCMAKE_BUILD_TYPE=Debug -DKVPOOL_TSAN=ON -DKVPOOL_WERROR=ON -DKVPOOL_CUDA=OFF)
    targets=(kvpoold kvpoolctl kvpool-replay kvpool_c_api_worker kvpool_daemon_tests
      kvpool_replay_tests kvpool_kv_events_tests kvpool_kv_events_chain_tests
      kvpool_kv_events_limits_tests kvpool_gpu_pool_check
      kvpool_gpu_tier_check)
    ;;
  *) echo "usage: scripts/build.sh [release|asan|fuzz|tsan]" >&2; exit 2 ;;
esac

cmake -S . -B "build/$kind" -G Ninja "${flags[@]}" >/dev/null
if ((${#targets[@]} > 0)); then
  cmake --build "build/$kind" -j "$jobs" --target "${targets[@]}"
else
  cmake --build "build/$kind" -j "$jobs"
fi
