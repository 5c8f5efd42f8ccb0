#!/usr/bin/env bash
# systemd-analyze verify on the units, with ExecStart pointed at the built kvpoold (verify checks
# that the command exists). Exits 77 (skipped) where systemd-analyze is missing.
set -euo pipefail
src=$1
kvpoold=$2
command -v systemd-analyze >/dev/null || { echo "systemd-analyze not found: skipped"; exit 77; }
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
for unit in kvpoold.service kvpoold@.service; do
  sed "s|/usr/bin/kvpoold|$kvpoold|" "$src/systemd/$unit" > "$dir/$unit"
done
# A template is verified through an instance.
ln -s "$dir/kvpoold@.service" "$dir/kvpoold@0.service"
out=$(SYSTEMD_LOG_LEVEL=warning systemd-analyze verify --man=no "$dir/kvpoold.service" \
  "$dir/kvpoold@0.service" 2>&1) || { echo "$out"; exit 1; }
# verify exits 0 on some warnings; treat any line naming our units as a failure.
if grep -E "kvpoold(@0)?\.service" <<<"$out"; then exit 1; fi
echo "systemd-analyze verify: kvpoold.service and kvpoold@0.service are clean"
