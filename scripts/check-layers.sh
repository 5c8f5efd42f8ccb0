#!/usr/bin/env bash
# Fails when an include in daemon/ runs upward: a wing may include only wings below it
# (docs/ARCHITECTURE.md, "Folders"). The order, lowest first:
#   core < config < telemetry < memory < pool < service < server < daemon/ (the wiring)
set -euo pipefail
cd "$(dirname "$0")/.."
rank() {
  case "$1" in
    core) echo 0 ;; config) echo 1 ;; telemetry) echo 2 ;; memory) echo 3 ;; pool) echo 4 ;;
    service) echo 5 ;; server) echo 6 ;; *) echo 7 ;;
  esac
}
bad=0
while IFS= read -r file; do
  rel=${file#daemon/}
  wing=${rel%%/*}
  [[ "$rel" == */* ]] || wing=root
  mine=$(rank "$wing")
  while IFS= read -r inc; do
    target=${inc#daemon/}
    twing=${target%%/*}
    [[ "$target" == */* ]] || twing=root
    if (( $(rank "$twing") > mine )); then
      echo "check-layers: $file includes $inc: $wing may not include $twing" >&2
      bad=1
    fi
  done < <(grep -o '#include "daemon/[^"]*"' "$file" | sed 's/#include "//; s/"$//')
done < <(git ls-files 'daemon/*.h' 'daemon/*.cpp')
if ((bad)); then exit 1; fi
echo "check-layers: no include in daemon/ runs upward"
