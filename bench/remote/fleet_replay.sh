#!/usr/bin/env bash
# A fleet sharing a remote tier: the Mooncake trace replayed round-robin over 2 and 3 kvpoold
# (each its own "node" with a small pool), with no remote tier and then with one shared Redis
# Cluster (scripts/redis-cluster.sh), beside one daemon holding all their capacity (the in-process
# replay at the sum of the pools: the bound a shared tier aims at). kvpool-replay --daemon
# S1,S2,..., one worker per daemon, in trace order: a block one node published is written to
# the cluster in the background and found there by the next node that misses it.
#
#   bench/remote/fleet_replay.sh [BUILD_DIR]        (default build/release)
# Environment: PAGES (each daemon's pool, in 512-token blocks: 1000), LIMIT (the trace's first
# requests: 4000), FLEETS ("2 3"), PORT (7500: the cluster's first port), TRACE, WRITE (the
# tier's write mode: on_publish, or on_demote to write only what a node's pool evicts).
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build/release}
kvpoold=$build/daemon/kvpoold
replay=$build/bench/kvpool-replay
pages=${PAGES:-1000}
limit=${LIMIT:-4000}
port=${PORT:-7500}
write=${WRITE:-on_publish}
trace_flag=()
[ -n "${TRACE:-}" ] && trace_flag=(--trace "$TRACE")
source bench/remote/common.sh
remote_bench_begin fleet "$port" "$kvpoold" "$replay"

# n daemons; remote: 0 or 1. Prints kvpool-replay's JSON line.
run() {
  local n=$1 remote=$2 sockets="" d
  local run_pids=()
  for ((d = 0; d < n; ++d)); do
    local dir=$work/run-$n-$remote-$d
    mkdir -p "$dir"
    {
      echo "backend: host"
      echo "socket: {path: $dir/s.sock}"
      echo "metrics: {stats_segment: false}"
      echo "pools:"
      echo "  - name: chat"
      echo "    capacity: $pages pages"
      echo "    geometry: {layers: 1, kv_heads: 1, head_dim: 64, tokens_per_page: 16, dtype: bf16}"
      if ((remote)); then
        echo "    remote_tier: {cluster: [\"127.0.0.1:$port\"], namespace: fleet-$n, write: $write}"
      fi
    } >"$dir/k.yaml"
    start_daemon "$dir"
    sockets+=${sockets:+,}$dir/s.sock
  done
  wait_sockets ${sockets//,/ }
  "$replay" "${trace_flag[@]}" --daemon "$sockets" --workers "$n" --limit "$limit" --json
  for p in "${run_pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait "${run_pids[@]}" 2>/dev/null || true
}

field() { echo "$1" | sed "s/.*\"$2\":\([0-9.]*\).*/\1/"; }

echo "trace: first $limit requests; each daemon $pages pages (512-token blocks); write: $write"
echo "| daemons | hit rate, no remote tier | with the shared remote tier | one daemon holding all (in process) | remote / none | pages written | pages served remotely | seconds (none / remote) |"
echo "|---|---|---|---|---|---|---|---|"
for n in ${FLEETS:-2 3}; do
  none=$(run "$n" 0)
  shared=$(run "$n" 1)
  h0=$(field "$none" hit_rate)
  h1=$(field "$shared" hit_rate)
  whole=$(field "$shared" one_daemon_all_capacity_hit_rate)
  ratio=$(awk -v a="$h1" -v b="$h0" 'BEGIN { printf "%.2f", (b > 0 ? a / b : 0) }')
  echo "| $n | $h0 | $h1 | $whole | $ratio | $(field "$shared" remote_stored_pages) |" \
    "$(field "$shared" remote_hit_pages) | $(field "$none" seconds) / $(field "$shared" seconds) |"
done
