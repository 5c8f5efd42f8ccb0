#!/usr/bin/env bash
# Fails when an include runs upward: a wing may include only wings at or below its own rank
# (docs/ARCHITECTURE.md, "Folders"; client/README.md). The orders, lowest first:
#   daemon/: core < config < telemetry < memory < remote < pool < service < server < daemon/
#            (the wiring)
#   client/: connection < worker, capi < ctl, python
set -euo pipefail
cd "$(dirname "$0")/.."
daemon_rank() {
  case "$1" in
    core) echo 0 ;; config) echo 1 ;; telemetry) echo 2 ;; memory) echo 3 ;; remote) echo 4 ;;
    pool) echo 5 ;; service) echo 6 ;; server) echo 7 ;; *) echo 8 ;;
  esac
}
client_rank() {
  case "$1" in
    connection) echo 0 ;; worker | capi) echo 1 ;; *) echo 2 ;;
  esac
}
bad=0
# check TREE RANK_FUNCTION: every tracked C++ file of TREE/ against its includes of TREE/.
check() {
  local tree=$1 rank=$2 file rel wing mine inc target twing
  while IFS= read -r file; do
    rel=${file#"$tree"/}
    wing=${rel%%/*}
    [[ "$rel" == */* ]] || wing=root
    mine=$("$rank" "$wing")
    while IFS= read -r inc; do
      target=${inc#"$tree"/}
      twing=${target%%/*}
      [[ "$target" == */* ]] || twing=root
      if (($("$rank" "$twing") > mine)); then
        echo "check-layers: $file includes $inc: $wing may not include $twing" >&2
        bad=1
      fi
    done < <(grep -o "#include \"$tree/[^\"]*\"" "$file" | sed 's/#include "//; s/"$//')
  done < <(git ls-files "$tree/*.h" "$tree/*.cpp" "$tree/*.c")
}
check daemon daemon_rank
check client client_rank
if ((bad)); then exit 1; fi
echo "check-layers: no include in daemon/ or client/ runs upward"
