#!/usr/bin/env bash
# The main job: install the packages, build, and replay the Mooncake trace through the pool core
# at four capacities under LRU and Belady's offline optimum.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/install-deps.sh
bash scripts/build.sh release
trace=${KVPOOL_TRACE:-../shared/data/mooncake_synthetic_trace.jsonl}
./build/release/bench/kvpool-replay --trace "$trace" --capacities 1000,4000,8000,16000 \
  --policy lru,belady
