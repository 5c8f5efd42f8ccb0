#!/usr/bin/env bash
# A Redis Cluster on loopback for kvpool's remote tier (daemon/remote/): its tests, benchmarks
# and anyone trying it. Debian's redis-server and redis-cli (scripts/install-deps.sh).
#
#   scripts/redis-cluster.sh start [DIR] [PORT]   3 masters + 3 replicas on PORT..PORT+5
#                                                 (default DIR: a new temporary directory,
#                                                 PORT 7100); prints the seeds on its last line:
#                                                 cluster: 127.0.0.1:PORT,...
#   scripts/redis-cluster.sh stop DIR             stops every node started in DIR, removes DIR
#   scripts/redis-cluster.sh nodes DIR            the running nodes, one "PID PORT ROLE" a line
#
# Environment: REDIS_MASTERS (3), REDIS_REPLICAS (1 per master), REDIS_NODE_TIMEOUT_MS (1000:
# a killed master's replica takes over within about two seconds), REDIS_EXTRA (more
# redis-server arguments for every node, e.g. "--maxmemory 64mb --maxmemory-policy allkeys-lru").
# Nothing is persisted (no RDB, no AOF): the cluster is a cache, and a replica may take over
# however long it was cut off (cluster-replica-validity-factor 0). start returns once every node
# reports cluster_state:ok and every replica is in sync.
set -euo pipefail

usage() {
  sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
}

cmd=${1:-}
case $cmd in
  start)
    dir=${2:-$(mktemp -d /tmp/kvpool-redis.XXXXXX)}
    port=${3:-7100}
    masters=${REDIS_MASTERS:-3}
    replicas=${REDIS_REPLICAS:-1}
    timeout=${REDIS_NODE_TIMEOUT_MS:-1000}
    n=$((masters * (1 + replicas)))
    mkdir -p "$dir"
    # A start that fails stops the nodes it started, so none is left holding its ports.
    trap 'status=$?; if ((status != 0)); then "$0" stop "$dir"; fi' EXIT
    command -v redis-server >/dev/null || {
      echo "redis-cluster: redis-server not found (run scripts/install-deps.sh)" >&2
      exit 1
    }
    addrs=()
    for ((i = 0; i < n; ++i)); do
      p=$((port + i))
      mkdir -p "$dir/$p"
      # shellcheck disable=SC2086  # REDIS_EXTRA is a list of arguments
      redis-server --port "$p" --bind 127.0.0.1 --cluster-enabled yes \
        --cluster-config-file "$dir/$p/nodes.conf" --cluster-node-timeout "$timeout" \
        --cluster-replica-validity-factor 0 --repl-diskless-sync-delay 0 \
        --dir "$dir/$p" --save "" --appendonly no --daemonize yes \
        --pidfile "$dir/$p/redis.pid" --logfile "$dir/$p/redis.log" ${REDIS_EXTRA:-}
      addrs+=("127.0.0.1:$p")
    done
    for a in "${addrs[@]}"; do
      for _ in $(seq 100); do
        redis-cli -h 127.0.0.1 -p "${a##*:}" ping >/dev/null 2>&1 && break
        sleep 0.05
      done
    done
    redis-cli --cluster create "${addrs[@]}" --cluster-replicas "$replicas" --cluster-yes \
      >"$dir/create.log" 2>&1 || {
      cat "$dir/create.log" >&2
      exit 1
    }
    # Every node agrees before anyone uses it.
    for a in "${addrs[@]}"; do
      ok=0
      for _ in $(seq 200); do
        if redis-cli -h 127.0.0.1 -p "${a##*:}" cluster info 2>/dev/null |
          grep -q 'cluster_state:ok'; then
          ok=1
          break
        fi
        sleep 0.05
      done
      ((ok)) || {
        echo "redis-cluster: node $a never reached cluster_state:ok" >&2
        exit 1
      }
    done
    # ... and every replica has its master's data, so that it can take over at once.
    for a in "${addrs[@]}"; do
      info=$(redis-cli -h 127.0.0.1 -p "${a##*:}" info replication)
      grep -q 'role:slave' <<<"$info" || continue
      for _ in $(seq 200); do
        grep -q 'master_link_status:up' <<<"$info" && break
        sleep 0.05
        info=$(redis-cli -h 127.0.0.1 -p "${a##*:}" info replication)
      done
    done
    echo "redis-cluster: $masters masters, $((masters * replicas)) replicas in $dir"
    (
      IFS=,
      echo "cluster: ${addrs[*]}"
    )
    ;;
  stop)
    dir=${2:?usage: redis-cluster.sh stop DIR}
    pids=()
    for pidfile in "$dir"/*/redis.pid; do
      [[ -f $pidfile ]] && pids+=("$(cat "$pidfile")")
    done
    for pid in "${pids[@]}"; do
      kill "$pid" 2>/dev/null || true
    done
    for pid in "${pids[@]}"; do
      for _ in $(seq 100); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.05
      done
    done
    rm -rf "$dir"
    ;;
  nodes)
    dir=${2:?usage: redis-cluster.sh nodes DIR}
    for pidfile in "$dir"/*/redis.pid; do
      [[ -f $pidfile ]] || continue
      p=$(basename "$(dirname "$pidfile")")
      role=$(redis-cli -h 127.0.0.1 -p "$p" role 2>/dev/null | head -1 || echo down)
      echo "$(cat "$pidfile") $p ${role:-down}"
    done
    ;;
  *) usage ;;
esac
