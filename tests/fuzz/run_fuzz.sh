#!/usr/bin/env bash
# ctest fuzz.frames: runs a libFuzzer binary over the committed corpus (every file once), then
# fuzzes for SECONDS from a scratch copy of it so that the committed corpus is never written.
#   run_fuzz.sh FUZZER CORPUS_DIR DICT WORK_DIR SECONDS
# A crash, a leak, a timeout (10 s for one input) or more than 2 GiB of memory fails the test;
# the input that caused it is left in WORK_DIR/artifacts and printed in hex.
set -euo pipefail

fuzzer=$1
corpus=$2
dict=$3
work=$4
seconds=$5

rm -rf "$work"
mkdir -p "$work/corpus" "$work/artifacts"
cp "$corpus"/* "$work/corpus/"
common=(-timeout=10 -rss_limit_mb=2048 -artifact_prefix="$work/artifacts/" -print_final_stats=1)

report() {
  local rc=$?
  for f in "$work"/artifacts/*; do
    [[ -f $f ]] || continue
    echo "== fuzz artifact $f ($(stat -c %s "$f") bytes):"
    od -A d -t x1 "$f" | head -n 64
  done
  exit "$rc"
}
trap report ERR

echo "== the committed corpus ($(find "$corpus" -type f | wc -l) inputs)"
"$fuzzer" "${common[@]}" -runs=0 "$work/corpus"

echo "== fuzzing for ${seconds}s"
"$fuzzer" "${common[@]}" -dict="$dict" -max_total_time="$seconds" "$work/corpus"
echo "== fuzz.frames: no crash in ${seconds}s ($(find "$work/corpus" -type f | wc -l) inputs in the corpus now)"
