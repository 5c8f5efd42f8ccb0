#!/usr/bin/env bash
# Every test: install the packages, build the release tree (warnings are errors) and the
# sanitizer tree (ASan + UBSan, debug assertions on) and run the whole ctest suite in both; then
# the fuzz tree (libFuzzer over the committed corpus, then a bounded fuzzing run: ctest -L fuzz)
# and the ThreadSanitizer tree (the daemon and its integration tests: ctest -L integration).
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

echo "== fuzz build"
bash scripts/build.sh fuzz
echo "== fuzz tests"
ctest --test-dir build/fuzz -L fuzz --output-on-failure

echo "== tsan build"
bash scripts/build.sh tsan
echo "== tsan tests"
# A report ends its process (halt_on_error) and goes to a file under build/tsan rather than to
# stderr: kvpoold's stderr is a log in a test's scratch directory, removed with it, so a race in
# the daemon would otherwise be lost. Every report found fails the run, printed here.
tsan_reports=$PWD/build/tsan/tsan-report
rm -f "$tsan_reports".*
tsan_options=halt_on_error=1:second_deadlock_stack=1:log_path=$tsan_reports
export TSAN_OPTIONS=${TSAN_OPTIONS:-$tsan_options:suppressions=$PWD/tests/tsan.supp}
# Without address-space randomisation where allowed: TSan's fixed shadow layout clashes with
# kernels that randomise mmap with more bits (vm.mmap_rnd_bits = 32).
no_aslr=()
if setarch "$(uname -m)" -R true 2>/dev/null; then no_aslr=(setarch "$(uname -m)" -R); fi
status=0
"${no_aslr[@]}" ctest --test-dir build/tsan -L integration --output-on-failure -j "$(nproc)" ||
  status=$?
for report in "$tsan_reports".*; do
  [[ -f $report ]] || continue
  echo "== ThreadSanitizer report $report"
  cat "$report"
  status=1
done
exit "$status"
