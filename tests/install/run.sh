#!/usr/bin/env bash
# Installs a build tree into a scratch prefix and builds tests/install/consumer.c against it,
# once with find_package(kvpool) and once with pkg-config; both run against a real kvpoold, and
# so does the installed Python package (where the build has one).
#   run.sh BUILD_DIR SCRATCH_DIR KVPOOLD
set -euo pipefail
build=$1 scratch=$2 kvpoold=$3
here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$scratch"
mkdir -p "$scratch"
# As a package build would: prefix /usr, staged under DESTDIR (the config goes to
# DESTDIR/etc/kvpool, never to this machine's /etc).
DESTDIR=$scratch/root cmake --install "$build" --prefix /usr >/dev/null
prefix=$scratch/root/usr
test -f "$scratch/root/etc/kvpool/kvpoold.yaml"
# A reinstall keeps an edited config and puts the shipped one beside it.
echo "# edited by the operator" >>"$scratch/root/etc/kvpool/kvpoold.yaml"
DESTDIR=$scratch/root cmake --install "$build" --prefix /usr >/dev/null
grep -q "edited by the operator" "$scratch/root/etc/kvpool/kvpoold.yaml"
cmp -s "$scratch/root/etc/kvpool/kvpoold.yaml.dist" "$here/../../config/kvpoold.yaml"
# Any other prefix holds its own config: nothing is written outside it.
cmake --install "$build" --prefix "$scratch/opt" >/dev/null
test -f "$scratch/opt/etc/kvpool/kvpoold.yaml"
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
# The installed Python package, where the build has one: it attaches and finds what was published.
site=$prefix/lib/python3/dist-packages
if [[ -d $site/kvpool ]]; then
  PYTHONPATH=$site /usr/bin/python3 - "$scratch/kvpoold.sock" <<'PY'
import sys
import kvpool
conn = kvpool.attach(sys.argv[1], worker="installed")
hasher = kvpool.BlockHasher()
root = hasher.root("model", kvpool.Geometry(2, 2, 64, 16, "fp16"))
found = conn.lookup(hasher.chain(root, list(range(32)), 16))
assert len(found) == 2, found
print("installed python package: found", len(found), "blocks")
PY
fi
