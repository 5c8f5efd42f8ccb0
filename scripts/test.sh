#!/usr/bin/env bash
# Every test: install the packages, build the release tree (warnings are errors) and the
# sanitizer tree (ASan + UBSan, debug assertions on), and run the whole ctest suite in both.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/install-deps.sh
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
for kind in release asan; do
  echo "== $kind build"
  bash scripts/build.sh "$kind"
  echo "== $kind tests"
  ctest --test-dir "build/$kind" --output-on-failure -j "$(nproc)"
done
