#include "daemon/config/config_keys.h"

#include <algorithm>
#include <array>

namespace kvpool::daemon {

namespace {

// A restart key of the top level or a section: the running value back.
#define KEEP(member) [](Config& n, const Config& r) { n.member = r.member; }
// A restart key of every pool, item by item while the pools are the same in number; a different
// number of pools is pools[].name's change (the running pools stay whole).
#define KEEP_POOL(member)                         \
  [](Config& n, const Config& r) {                \
    if (n.pools.size() != r.pools.size()) return; \
    for (size_t i = 0; i < n.pools.size(); ++i)   \
      n.pools[i].member = r.pools[i].member;      \
  }
// A hybrid model's group keys: its member pools' names, geometries and group lists (the whole
// list when the number of pools changed, as pools[].name does).
#define KEEP_GROUPS                                      \
  [](Config& n, const Config& r) {                       \
    if (n.pools.size() != r.pools.size()) {              \
      n.pools = r.pools;                                 \
      return;                                            \
    }                                                    \
    for (size_t i = 0; i < n.pools.size(); ++i) {        \
      n.pools[i].name = r.pools[i].name;                 \
      n.pools[i].geometry = r.pools[i].geometry;         \
      n.pools[i].model = r.pools[i].model;               \
      n.pools[i].group = r.pools[i].group;               \
      n.pools[i].model_groups = r.pools[i].model_groups; \
    }                                                    \
  }
#define LIVE(path)                  \
  ConfigKey {                       \
    path, Reload::live, "", nullptr \
  }
#define RESTART(path, name, keep)     \
  ConfigKey {                         \
    path, Reload::restart, name, keep \
  }

constexpr std::array kTable = {
    RESTART("socket.path", "socket.path", KEEP(socket_path)),
    RESTART("socket.mode", "socket.mode", KEEP(socket_mode)),
    RESTART("socket.group", "socket.group", KEEP(socket_group)),
    RESTART("backend", "backend", KEEP(backend)),
    RESTART("device", "device", KEEP(device)),
    RESTART("max_segment_bytes", "max_segment_bytes", KEEP(max_segment_bytes)),
    RESTART("memory_budget", "memory_budget", KEEP(memory_budget)),
    LIVE("limits.max_sessions"),
    LIVE("limits.max_sessions_per_uid"),
    LIVE("limits.hello_timeout_ms"),
    LIVE("limits.max_buffered_bytes"),
    LIVE("limits.max_pages_per_session"),
    LIVE("limits.max_pages_per_tenant"),
    LIVE("limits.max_pin_ttl_ms"),
    LIVE("limits.max_pinned_pages_per_tenant"),
    LIVE("limits.max_pinned_pool_percent"),
    // Pools stay as they are under running sessions, but for a permission checked at attach
    // (share_between_tenants), the eviction policy (PagePool::set_policy hands the cached pages
    // over) and whether an elastic pool grows ahead of need (read at each call).
    RESTART("pools[].name", "pools",
            [](Config& n, const Config& r) {
              if (n.pools.size() != r.pools.size()) {
                n.pools = r.pools;
                return;
              }
              for (size_t i = 0; i < n.pools.size(); ++i)
                n.pools[i].name = r.pools[i].name;
            }),
    LIVE("pools[].policy"),
    // Workers attached under the old scheme would publish keys the new one never looks up.
    RESTART("pools[].hash_scheme", "pools", KEEP_POOL(hash_scheme)),
    // A hybrid model's capacity is its groups' budget (model_budget).
    RESTART("pools[].capacity", "pools",
            [](Config& n, const Config& r) {
              if (n.pools.size() != r.pools.size()) return;
              for (size_t i = 0; i < n.pools.size(); ++i) {
                n.pools[i].capacity = r.pools[i].capacity;
                n.pools[i].model_budget = r.pools[i].model_budget;
              }
            }),
    LIVE("pools[].share_between_tenants"),
    RESTART("pools[].geometry.layers", "pools", KEEP_POOL(geometry.layers)),
    RESTART("pools[].geometry.kv_heads", "pools", KEEP_POOL(geometry.kv_heads)),
    RESTART("pools[].geometry.head_dim", "pools", KEEP_POOL(geometry.head_dim)),
    RESTART("pools[].geometry.tokens_per_page", "pools", KEEP_POOL(geometry.tokens_per_page)),
    RESTART("pools[].geometry.dtype", "pools", KEEP_POOL(geometry.dtype)),
    RESTART("pools[].geometry.kind", "pools", KEEP_POOL(geometry.kind)),
    RESTART("pools[].geometry.window", "pools", KEEP_POOL(geometry.window)),
    RESTART("pools[].layout", "pools", KEEP_POOL(layout)),
    RESTART("pools[].host_tier", "pools", KEEP_POOL(host_tier)),
    RESTART("pools[].convert_evictions_to", "pools", KEEP_POOL(convert_evictions_to)),
    RESTART("pools[].remote_tier.cluster", "pools", KEEP_POOL(remote_tier)),
    RESTART("pools[].remote_tier.namespace", "pools", KEEP_POOL(remote_tier)),
    RESTART("pools[].remote_tier.ttl_s", "pools", KEEP_POOL(remote_tier)),
    RESTART("pools[].remote_tier.write", "pools", KEEP_POOL(remote_tier)),
    RESTART("pools[].remote_tier.admit", "pools", KEEP_POOL(remote_tier)),
    RESTART("pools[].remote_tier.timeout_ms", "pools", KEEP_POOL(remote_tier)),
    RESTART("pools[].remote_tier.batch_pages", "pools", KEEP_POOL(remote_tier)),
    RESTART("pools[].remote_tier.staging_pages", "pools", KEEP_POOL(remote_tier)),
    RESTART("pools[].max_capacity", "pools", KEEP_POOL(max_capacity)),
    RESTART("pools[].min_capacity", "pools", KEEP_POOL(min_capacity)),
    RESTART("pools[].segment_size", "pools", KEEP_POOL(segment_size)),
    LIVE("pools[].grow_ahead"),
    RESTART("pools[].groups[].name", "pools", KEEP_GROUPS),
    RESTART("pools[].groups[].layers", "pools", KEEP_GROUPS),
    RESTART("pools[].groups[].kv_heads", "pools", KEEP_GROUPS),
    RESTART("pools[].groups[].head_dim", "pools", KEEP_GROUPS),
    RESTART("pools[].groups[].kind", "pools", KEEP_GROUPS),
    RESTART("pools[].groups[].window", "pools", KEEP_GROUPS),
    LIVE("tenants[].name"),
    LIVE("tenants[].uids"),
    LIVE("tenants[].gids"),
    LIVE("tenants[].pools"),
    LIVE("default_tenant"),
    LIVE("admin_group"),
    LIVE("logging.level"),
    // The endpoint, the segment and the event ring are set up at start.
    RESTART("metrics.listen", "metrics", KEEP(metrics.listen)),
    RESTART("metrics.allow_non_loopback", "metrics", KEEP(metrics.allow_non_loopback)),
    RESTART("metrics.latency_histograms", "metrics", KEEP(metrics.latency_histograms)),
    RESTART("metrics.stats_segment", "metrics", KEEP(metrics.stats_segment)),
    RESTART("events.ring_events", "events", KEEP(events.ring_events)),
    RESTART("events.zmq_endpoint", "events", KEEP(events.zmq_endpoint)),
    RESTART("events.zmq_topic", "events", KEEP(events.zmq_topic)),
    RESTART("events.zmq_block_hash", "events", KEEP(events.zmq_block_hash)),
    RESTART("events.zmq_send_hwm", "events", KEEP(events.zmq_send_hwm)),
    RESTART("events.zmq_replay_endpoint", "events", KEEP(events.zmq_replay_endpoint)),
    RESTART("events.zmq_replay_batches", "events", KEEP(events.zmq_replay_batches)),
    RESTART("events.data_parallel_rank", "events", KEEP(events.data_parallel_rank)),
    RESTART("events.zmq_payload", "events", KEEP(events.zmq_payload)),
    RESTART("events.zmq_queue_bytes", "events", KEEP(events.zmq_queue_bytes)),
    RESTART("events.zmq_max_connections", "events", KEEP(events.zmq_max_connections)),
    RESTART("events.zmq_mode", "events", KEEP(events.zmq_mode)),
    RESTART("events.zmq_token_ids", "events", KEEP(events.zmq_token_ids)),
};

#undef KEEP
#undef KEEP_POOL
#undef KEEP_GROUPS
#undef LIVE
#undef RESTART

}  // namespace

std::span<const ConfigKey> config_key_table() {
  return kTable;
}

std::vector<std::string_view> keys_under(std::string_view prefix) {
  std::vector<std::string_view> out;
  for (const ConfigKey& k : kTable) {
    if (!k.path.starts_with(prefix)) continue;
    std::string_view rest = k.path.substr(prefix.size());
    rest = rest.substr(0, std::min(rest.find('.'), rest.find('[')));
    if (std::find(out.begin(), out.end(), rest) == out.end()) out.push_back(rest);
  }
  return out;
}

std::vector<std::string> keep_restart_keys(Config& next, const Config& running) {
  std::vector<std::string> changed;
  for (const ConfigKey& k : kTable) {
    if (k.reload != Reload::restart) continue;
    const Config before = next;
    k.keep(next, running);
    if (!(next == before) &&
        std::find(changed.begin(), changed.end(), k.restart_name) == changed.end()) {
      changed.emplace_back(k.restart_name);
    }
  }
  return changed;
}

}  // namespace kvpool::daemon
