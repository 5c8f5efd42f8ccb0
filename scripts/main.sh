#!/usr/bin/env bash
# The main job: install the packages, build, start kvpoold with its built-in default config and
# run the demo (worker processes sharing a system prompt through the pool, every reused page
# checked byte for byte), then stop the daemon. Exits non-zero if any check failed.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/install-deps.sh
bash scripts/build.sh release

run_dir=$(mktemp -d /tmp/kvpool-main.XXXXXX)
socket="$run_dir/kvpoold.sock"
./build/release/daemon/kvpoold --socket "$socket" 2>"$run_dir/kvpoold.log" &
daemon=$!
cleanup() {
  kill -TERM "$daemon" 2>/dev/null && wait "$daemon" 2>/dev/null || true
  echo "--- kvpoold log"
  cat "$run_dir/kvpoold.log"
  rm -rf "$run_dir"
}
trap cleanup EXIT
for _ in $(seq 100); do [[ -S "$socket" ]] && break; sleep 0.1; done

./build/release/bench/kvpool-demo --socket "$socket" --workers 4 --requests 6
