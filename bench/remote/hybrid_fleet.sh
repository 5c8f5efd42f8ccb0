#!/usr/bin/env bash
# A fleet serving a hybrid model shares a remote tier: the Mooncake trace replayed round-robin
# over 2 kvpoold (kvpool-replay --model S1,S2: one lookup_groups per request, every group's
# pages), for a gpt-oss-shaped model (sliding window 128 and full layers, half each; layers,
# KV heads and head dim scaled down alike so that the cluster holds the run) and for the same
# model with every layer full, each with no remote tier and with one shared Redis Cluster
# (scripts/redis-cluster.sh). Every daemon gets the same budget. Columns: the hit rate, the
# bytes the hits fetched from the cluster, and those bytes per block served remotely: a sliding
# group fetches only its window, so a hybrid hit costs the cluster less than an all-full one.
#
#   bench/remote/hybrid_fleet.sh [BUILD_DIR]        (default build/release)
# The replay waits PACE µs per page a request computed (its prefill), as an engine would before
# its next request: the daemons' writes run meanwhile (unpaced, a replay offers blocks far
# faster than any tier writes them, and most are skipped).
# Environment: BLOCKS (each daemon's budget, in all-full 512-token blocks: 1000), LIMIT (the
# trace's first requests: 1000), PACE (50), PAGE_TOKENS (16), DAEMONS (2), PORT (7600: the
# cluster's first port), TRACE, SHOW_STATUS (print each remote run's tier counters).
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build/release}
kvpoold=$build/daemon/kvpoold
replay=$build/bench/kvpool-replay
blocks=${BLOCKS:-1000}
limit=${LIMIT:-1000}
pace=${PACE:-50}
daemons=${DAEMONS:-2}
port=${PORT:-7600}
trace_flag=()
[ -n "${TRACE:-}" ] && trace_flag=(--trace "$TRACE")
source bench/remote/common.sh
remote_bench_begin hybrid-fleet "$port" "$kvpoold" "$replay"

layers=4                                    # all-full; the hybrid: 2 sliding + 2 full
tpp=${PAGE_TOKENS:-16}
block=$((layers * 2 * 8 * 512 * 2))         # one all-full 512-token block, in bytes
budget=$((blocks * block))
segment=$(((budget / 64 + 65535) / 65536 * 65536))

# model (hybrid/all-full), remote (0/1). Prints kvpool-replay's JSON line.
run() {
  local model=$1 remote=$2 sockets="" d
  local run_pids=()
  for ((d = 0; d < daemons; ++d)); do
    local dir=$work/run-$model-$remote-$d
    mkdir -p "$dir"
    {
      echo "backend: host"
      echo "socket: {path: $dir/s.sock}"
      echo "metrics: {stats_segment: false}"
      echo "pools:"
      echo "  - name: m"
      echo "    capacity: ${budget}B"
      echo "    geometry: {layers: $layers, kv_heads: 1, head_dim: 8, tokens_per_page: $tpp, dtype: bf16}"
      if ((remote)); then
        # A lookup may fetch a whole prompt's pages (32 per trace block).
        echo "    remote_tier: {cluster: [\"127.0.0.1:$port\"], namespace: $model, batch_pages: 2048, staging_pages: 4096}"
      fi
      if [ "$model" = hybrid ]; then
        echo "    segment_size: ${segment}B"
        echo "    groups:"
        echo "      - {name: local, layers: $((layers / 2)), kind: sliding, window: 128}"
        echo "      - {name: global, layers: $((layers / 2))}"
      fi
    } >"$dir/k.yaml"
    start_daemon "$dir"
    sockets+=${sockets:+,}$dir/s.sock
  done
  wait_sockets ${sockets//,/ }
  "$replay" "${trace_flag[@]}" --model "$sockets" --page-tokens "$tpp" \
    --pace-us-per-page "$pace" --limit "$limit" --json ||
    tail -3 "$work/run-$model-$remote-0/log" >&2
  if [ -n "${SHOW_STATUS:-}" ] && ((remote)); then
    for pool in m m/local m/global; do
      "$build/client/kvpoolctl" --socket "$work/run-$model-$remote-0/s.sock" --pool "$pool" \
        status 2>/dev/null | grep -E "^  (pool|remote) " >&2 || true
    done
  fi
  for p in "${run_pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait "${run_pids[@]}" 2>/dev/null || true
  # The next run starts from an empty cluster (and the machine keeps its memory).
  redis-cli --cluster call "127.0.0.1:$port" FLUSHALL >/dev/null 2>&1 || true
}

field() { echo "$1" | sed "s/.*\"$2\":\([0-9.]*\).*/\1/"; }

echo "trace: first $limit requests over $daemons daemons; each daemon $blocks all-full blocks ($budget bytes); $tpp-token pages; $pace us per page computed"
echo "| model | hit rate, no remote tier | with the shared remote tier | remote / none | MB fetched from the cluster | bytes fetched per block served remotely | seconds (none / remote) |"
echo "|---|---|---|---|---|---|---|"
for model in all-full hybrid; do
  none=$(run "$model" 0)
  shared=$(run "$model" 1)
  h0=$(field "$none" hit_rate)
  h1=$(field "$shared" hit_rate)
  ratio=$(awk -v a="$h1" -v b="$h0" 'BEGIN { printf "%.2f", (b > 0 ? a / b : 0) }')
  bytes=$(field "$shared" remote_bytes)
  pages=$(field "$shared" remote_blocks)
  per_hit=$(awk -v b="$bytes" -v p="$pages" 'BEGIN { printf "%.0f", (p > 0 ? b / p : 0) }')
  mb=$(awk -v b="$bytes" 'BEGIN { printf "%.1f", b / 1e6 }')
  echo "| $model | $h0 | $h1 | $ratio | $mb | $per_hit | $(field "$none" seconds) / $(field "$shared" seconds) |"
done
