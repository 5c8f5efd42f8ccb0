#!/usr/bin/env bash
# Installs a build tree into a scratch prefix and builds tests/install/consumer.c against it,
# once with find_package(kvpool) and once with pkg-config; both run against a real kvpoold.
#   run.sh BUILD_DIR SCRATCH_DIR KVPOOLD
set -euo pipefail
build=$1 scratch=$2 kvpoold=$3
here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$scratch"
mkdir -p "$scratch"
prefix=$scratch/prefix
cmake --install "$build" --prefix "$prefix" >/dev/null
test -f "$prefix/include/kvpool/kvpool.h"
libdir=$(dirname "$(find "$prefix" -name 'libkvpool.so' | head -n1)")

cmake -S "$here" -B "$scratch/cmake" -G Ninja -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build "$scratch/cmake" >/dev/null
PKG_CONFIG_PATH=$libdir/pkgconfig
export PKG_CONFIG_PATH
# shellcheck disable=SC2046 # pkg-config prints several flags
cc -o "$scratch/consumer-pc" "$here/consumer.c" $(pkg-config --cflags --libs kvpool)

printf 'backend: host\npools:\n  - name: default\n    geometry: {layers: 2, kv_heads: 2, head_dim: 64, tokens_per_page: 16, dtype: fp16}\n    capacity: 8 pages\n' >"$scratch/kvpoold.yaml"
"$kvpoold" --config "$scratch/kvpoold.yaml" --socket "$scratch/kvpoold.sock" 2>"$scratch/kvpoold.log" &
daemon=$!
trap 'kill $daemon 2>/dev/null; wait $daemon 2>/dev/null || true' EXIT
for _ in $(seq 200); do
  grep -q event=ready "$scratch/kvpoold.log" && break
  sleep 0.05
done
LD_LIBRARY_PATH=$libdir "$scratch/cmake/consumer" "$scratch/kvpoold.sock"
LD_LIBRARY_PATH=$libdir "$scratch/consumer-pc" "$scratch/kvpoold.sock"
