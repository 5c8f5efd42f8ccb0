#!/usr/bin/env bash
# Precision before eviction through a real kvpoold: the replay hit rate of a bf16 pool alone
# against the same bytes split between a bf16 pool and the fp8 pool its evictions are converted
# into (pools[].convert_evictions_to), at budgets given in bf16 pages (one 512-token block each).
# kvpool-replay --daemon, one worker in trace order, on the bf16 pool: a lookup that misses there
# continues its chain in the fp8 pool, whose blocks come back converted (tier "converted").
#   bench/replay/precision_figures.sh [BUILD_DIR]      (default build/release)
# Environment: BUDGETS (bf16 pages, default "1000 4000"), SPLITS (percent of the budget's bytes
# kept in bf16, default "50 25"), TRACE (default: the replay's, ../shared/data/mooncake_...),
# POLICY16 / POLICY8 (the pools' eviction policies, default prefix / lru: the 8-bit pool is a
# victim tier, whose blocks all arrive as evictions, so LRU order is demotion order).
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build/release}
kvpoold=$build/daemon/kvpoold
replay=$build/bench/kvpool-replay
trace_flag=()
[ -n "${TRACE:-}" ] && trace_flag=(--trace "$TRACE")

# One layer, one KV head, head dim 64, 16 tokens a page: the hit rate does not depend on the page's
# size, only on how many pages each pool holds; bf16 4,096 bytes, fp8 2,048 + 8 of scales.
geometry='{layers: 1, kv_heads: 1, head_dim: 64, tokens_per_page: 16, dtype:'
bf16_bytes=4096
fp8_bytes=2056

run() {  # bf16 pages, fp8 pages (0: none)
  local dir
  dir=$(mktemp -d)
  {
    echo "backend: host"
    echo "socket: {path: $dir/s.sock}"
    echo "pools:"
    echo "  - name: recent"
    echo "    capacity: $1 pages"
    echo "    policy: ${POLICY16:-prefix}"
    echo "    geometry: $geometry bf16}"
    if [ "$2" != 0 ]; then
      echo "    convert_evictions_to: older"
      echo "  - name: older"
      echo "    capacity: $2 pages"
      echo "    policy: ${POLICY8:-lru}"
      echo "    geometry: $geometry fp8_e4m3}"
    fi
  } >"$dir/k.yaml"
  "$kvpoold" --config "$dir/k.yaml" 2>"$dir/log" &
  local pid=$!
  for _ in $(seq 100); do [ -S "$dir/s.sock" ] && break; sleep 0.1; done
  "$replay" "${trace_flag[@]}" --daemon "$dir/s.sock" --workers 1 --json || tail -3 "$dir/log" >&2
  kill "$pid"
  wait "$pid" 2>/dev/null || true
  rm -rf "$dir"
}

field() { echo "$1" | sed "s/.*\"$2\":\([0-9.]*\).*/\1/"; }

printf '%8s %-22s %10s %10s %9s %10s %10s %8s\n' budget pools bf16_pages fp8_pages hit_rate \
  converted back ratio
for budget in ${BUDGETS:-1000 4000}; do
  line=$(run "$budget" 0)
  base=$(field "$line" hit_rate)
  printf '%8s %-22s %10s %10s %9s %10s %10s %8s\n' "$budget" "bf16 only" "$budget" 0 "$base" 0 0 \
    1.00
  for split in ${SPLITS:-50 25}; do
    recent=$((budget * split / 100))
    older=$((budget * (100 - split) / 100 * bf16_bytes / fp8_bytes))
    line=$(run "$recent" "$older")
    hit=$(field "$line" hit_rate)
    printf '%8s %-22s %10s %10s %9s %10s %10s %8.2f\n' "$budget" "bf16 ${split}% + fp8" \
      "$recent" "$older" "$hit" "$(field "$line" converted_pages)" \
      "$(field "$line" converted_back_pages)" "$(awk -v h="$hit" -v b="$base" 'BEGIN { print h / b }')"
  done
done
