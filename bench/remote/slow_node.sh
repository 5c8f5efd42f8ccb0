#!/usr/bin/env bash
# The remote tier with one slow node (bench/RESULTS.md, "Remote tier"): a Redis Cluster on
# loopback (scripts/redis-cluster.sh), one kvpoold whose pool writes every published block to it
# and asks it on every local miss (timeout_ms 100), and kvpool-remote-bench slow: --clients
# workers alloc, publish and release pages while one more looks up chains nobody holds; 5 s
# quiet, then 5 s while one master answers nothing (CLIENT PAUSE: it stays in the cluster, so no
# failover, every command to it waits). The workers' alloc p50/p99 in both phases and the ratio
# (the goal: within 2x of quiet), and the daemon's remote counters after.
#
#   bench/remote/slow_node.sh [BUILD_DIR]     (default build/release)
# Environment: PORT (7500: the cluster's first port), CLIENTS (2), SECONDS_EACH (5).
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build/release}
port=${PORT:-7500}
clients=${CLIENTS:-2}
seconds=${SECONDS_EACH:-5}
bench=$build/bench/kvpool-remote-bench
kvpoold=$build/daemon/kvpoold
kvpoolctl=$build/client/kvpoolctl
source bench/remote/common.sh
remote_bench_begin slow-node "$port" "$bench" "$kvpoold" "$kvpoolctl"
# The first master the cluster lists: the node made slow.
slow_port=$(redis-cli -p "$port" cluster nodes | awk '/master/ && !/fail/ { split($2, a, "[:@]"); print a[2]; exit }')
mkdir -p "$work/d"
cat >"$work/d/k.yaml" <<EOF
backend: host
socket: {path: $work/d/s.sock}
metrics: {stats_segment: false}
pools:
  - name: chat
    geometry: {layers: 8, kv_heads: 4, head_dim: 128, tokens_per_page: 16, dtype: bf16}
    capacity: 1024 pages
    remote_tier: {cluster: ["127.0.0.1:$port"], namespace: slow, timeout_ms: 100}
EOF
start_daemon "$work/d"
wait_sockets "$work/d/s.sock"
pause_ms=$(awk -v s="$seconds" 'BEGIN { printf "%d", (s + 2) * 1000 }')
echo "== $clients workers alloc/publish/release, one looks up misses; ${seconds} s quiet, then ${seconds} s with master :$slow_port paused (256 KiB pages)"
"$bench" slow --socket "$work/d/s.sock" --clients "$clients" --seconds "$seconds" \
  --make-slow "redis-cli -p $slow_port CLIENT PAUSE $pause_ms ALL >/dev/null"
echo
"$kvpoolctl" --socket "$work/d/s.sock" status | grep -E '^  remote'
