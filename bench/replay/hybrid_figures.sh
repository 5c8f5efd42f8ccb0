#!/usr/bin/env bash
# Hybrid models against the same model with every layer full, through a real kvpoold:
# kvpool-replay --model on a gpt-oss-shaped and a Gemma-3-shaped model (../shared/data/models.yaml:
# the layer counts, windows and kinds; KV heads and head dim scaled down alike in every group so
# that the pools fit host memory, which keeps every ratio), each at two budgets given in blocks of
# the all-full model (512 tokens), on the shared trace and on --synthetic.
#   bench/replay/hybrid_figures.sh [BUILD_DIR]      (default build/release)
# Environment: TRACES (default "shared synthetic"), BUDGETS (blocks, default "1000 4000"),
# HOST_TIER (a host tier of this many times the budget's bytes under every pool, 0 = none, the
# default; a hybrid model's is split so that every group keeps as many blocks).
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build/release}
kvpoold=$build/daemon/kvpoold
replay=$build/bench/kvpool-replay

# name, all-full layers, hybrid groups
declare -A layers=([gpt-oss-20b]=24 [Gemma-3-27B]=62)
declare -A groups=(
  [gpt-oss-20b]='      - {name: local, layers: 12, kind: sliding, window: 128}
      - {name: global, layers: 12}'
  [Gemma-3-27B]='      - {name: local, layers: 52, kind: sliding, window: 1024}
      - {name: global, layers: 10}')

run() {  # model, budget bytes, with groups (1/0), extra replay flags
  local dir
  dir=$(mktemp -d)
  local seg=$(( ($2 / 200 + 2097151) / 2097152 * 2097152 ))
  {
    echo "backend: host"
    echo "socket: {path: $dir/s.sock}"
    echo "pools:"
    echo "  - name: m"
    echo "    capacity: $2B"
    echo "    geometry: {layers: ${layers[$1]}, kv_heads: 1, head_dim: 8, tokens_per_page: 16, dtype: bf16}"
    if [ "${HOST_TIER:-0}" != 0 ]; then echo "    host_tier: $(($2 * HOST_TIER))B"; fi
    if [ "$3" = 1 ]; then
      echo "    segment_size: ${seg}B"
      echo "    groups:"
      echo "${groups[$1]}"
    fi
  } >"$dir/k.yaml"
  "$kvpoold" --config "$dir/k.yaml" 2>"$dir/log" &
  local pid=$!
  for _ in $(seq 100); do [ -S "$dir/s.sock" ] && break; sleep 0.1; done
  "$replay" --model "$dir/s.sock" --page-tokens 16 --json $4 || tail -3 "$dir/log" >&2
  kill "$pid"
  wait "$pid" 2>/dev/null || true
  rm -rf "$dir"
}

printf '%-12s %-10s %7s %-8s %9s %12s %11s %9s\n' model trace budget pool hit_rate \
  bytes/seq held_ratio fit
for trace in ${TRACES:-shared synthetic}; do
  flags=""
  [ "$trace" = synthetic ] && flags="--synthetic"
  for model in gpt-oss-20b Gemma-3-27B; do
    block=$(( ${layers[$model]} * 2 * 8 * 16 * 2 * 32 ))  # one all-full 512-token block
    for blocks in ${BUDGETS:-1000 4000}; do
      budget=$(( blocks * block ))
      for hybrid in 0 1; do
        line=$(run "$model" "$budget" "$hybrid" "$flags")
        hit=$(echo "$line" | sed 's/.*"hit_rate":\([0-9.]*\).*/\1/')
        held=$(echo "$line" | sed 's/.*"held_bytes_per_sequence":\([0-9]*\).*/\1/')
        ratio=$(echo "$line" | sed 's/.*"held_ratio":\([0-9.]*\).*/\1/')
        printf '%-12s %-10s %7s %-8s %9s %12s %11s %9d\n' "$model" "$trace" "$blocks" \
          "$([ $hybrid = 1 ] && echo hybrid || echo all-full)" "$hit" "$held" "$ratio" \
          $(( budget / held ))
      done
    done
  done
done
