#!/usr/bin/env bash
# The remote tier's figures (bench/RESULTS.md, "Remote tier"), measured in one run:
#   1. a Redis Cluster on loopback: scripts/redis-cluster.sh, 3 masters + 3 replicas;
#   2. per value size, redis-benchmark SET then GET on that cluster (--cluster, 3 connections,
#      pipeline 16, 64 keys overwritten) beside kvpool-remote-bench client (kvpoold's
#      ClusterClient on kvpoold's values, batches of 32 as the daemon's default batch_pages, 64
#      keys overwritten), alternating, twice: the better MB/s of each and the
#      ratio (on a small machine the replicas' catching up after the other tool's burst moves
#      single runs by 2x);
#   3. two kvpoold sharing the cluster (host backend, 256 KiB pages): kvpool-remote-bench promote,
#      the lookup latency on one daemon of blocks the other published (chains of 1 and 16)
#      against its lookup of blocks it holds.
#
#   bench/remote/remote_figures.sh [BUILD_DIR]     (default build/release)
# Environment: PORT (7400: the cluster's first port), SIZES (65536 524288 2097152).
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build/release}
port=${PORT:-7400}
sizes=${SIZES:-65536 524288 2097152}
bench=$build/bench/kvpool-remote-bench
kvpoold=$build/daemon/kvpoold
source bench/remote/common.sh
remote_bench_begin remote-figures "$port" "$bench" "$kvpoold"

echo "== ClusterClient against redis-benchmark, same cluster, same value sizes (best of 2, alternating)"
echo "| value | op | redis-benchmark MB/s | kvpool MB/s | kvpool / redis-benchmark |"
echo "|---|---|---|---|---|"
best() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.0f", (a > b ? a : b) }'; }
for size in $sizes; do
  n=$((size > 65536 ? 1024 : 4096))
  declare -A rb_best=([SET]=0 [GET]=0) k_best=([SET]=0 [GET]=0)
  for _ in 1 2; do
    rb=$(redis-benchmark --cluster -h 127.0.0.1 -p "$port" -t set,get -d "$size" -n "$n" -r 64 \
      -P 16 -c 3 --csv -q 2>/dev/null | grep -E '^"(SET|GET)"')
    ours=$("$bench" client --cluster "127.0.0.1:$port" --sizes "$size" --pages 512 --batch 32)
    for op in SET GET; do
      rps=$(grep "^\"$op\"" <<<"$rb" | cut -d, -f2 | tr -d '"')
      rb_mbs=$(awk -v r="$rps" -v s="$size" 'BEGIN { printf "%.0f", r * s / 1e6 }')
      k_mbs=$(grep "| $op |" <<<"$ours" | awk -F'|' '{ gsub(/ /, "", $5); print $5 }')
      rb_best[$op]=$(best "${rb_best[$op]}" "$rb_mbs")
      k_best[$op]=$(best "${k_best[$op]}" "$k_mbs")
    done
  done
  for op in SET GET; do
    ratio=$(awk -v a="${k_best[$op]}" -v b="${rb_best[$op]}" \
      'BEGIN { printf "%.2f", (b > 0 ? a / b : 0) }')
    echo "| $size | $op | ${rb_best[$op]} | ${k_best[$op]} | $ratio |"
  done
done
echo
echo "== kvpool-remote-bench client, batches of 16, in full"
"$bench" client --cluster "127.0.0.1:$port" --sizes "${sizes// /,}" --pages 512 --batch 16

echo
echo "== promote: a lookup on daemon B of blocks daemon A published (256 KiB pages)"
for d in a b; do
  mkdir -p "$work/$d"
  cat >"$work/$d/k.yaml" <<EOF
backend: host
socket: {path: $work/$d/s.sock}
metrics: {stats_segment: false}
pools:
  - name: chat
    geometry: {layers: 8, kv_heads: 4, head_dim: 128, tokens_per_page: 16, dtype: bf16}
    capacity: 1024 pages
    remote_tier: {cluster: ["127.0.0.1:$port"], namespace: figures}
EOF
  start_daemon "$work/$d"
done
wait_sockets "$work/a/s.sock" "$work/b/s.sock"
"$bench" promote --socket-a "$work/a/s.sock" --socket-b "$work/b/s.sock" --batch 16 --rounds 100
