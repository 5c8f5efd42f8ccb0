# Sourced by the remote tier's bench scripts, from the repository root: a work directory, a Redis
# Cluster on loopback (scripts/redis-cluster.sh) and every daemon a script starts, all stopped and
# removed at exit.

# remote_bench_begin NAME PORT BINARY...: checks that the binaries are built, makes $work and
# starts the cluster's first node at PORT.
remote_bench_begin() {
  local name=$1 port=$2 b
  shift 2
  for b in "$@"; do
    [[ -x $b ]] || {
      echo "$name: $b not built (cmake --build ${build:-build/release})" >&2
      exit 1
    }
  done
  work=$(mktemp -d "/tmp/kvpool-$name.XXXXXX")
  pids=()
  trap remote_bench_end EXIT
  bash scripts/redis-cluster.sh start "$work/cluster" "$port" | tail -1
}

remote_bench_end() {
  local p
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  bash scripts/redis-cluster.sh stop "$work/cluster" >/dev/null 2>&1 || true
  rm -rf "$work"
}

# start_daemon DIR: kvpoold ($kvpoold) on DIR/k.yaml, its log DIR/log; its pid joins pids (and
# the caller's run_pids, when it has one).
start_daemon() {
  "$kvpoold" --config "$1/k.yaml" 2>"$1/log" &
  pids+=($!)
  run_pids+=($!)
}

# wait_sockets SOCKET...: until each exists, at most 5 s each.
wait_sockets() {
  local s
  for s in "$@"; do
    for _ in $(seq 100); do
      [[ -S $s ]] && break
      sleep 0.05
    done
  done
}
