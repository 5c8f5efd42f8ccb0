// The key table (daemon/config/config_keys.h) against the parser and the reload: for every key
// of the table a sample changes that key alone; a live key must then take its new value and a
// restart key keep its running one, named under its restart name. A key added to the table
// without a sample here fails, as does a key whose reload does not do what the table says.
#include "daemon/config/config_keys.h"

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

namespace kvpool::daemon {
namespace {

// Every optional key set, so that each sample changes one value of a config that parses.
const std::string kBase = R"(socket: {path: /tmp/kvpool-keys.sock, mode: "0660", group: ""}
backend: host
device: 0
max_segment_bytes: 64MiB
memory_budget: 1GiB
limits:
  max_sessions: 1024
  max_sessions_per_uid: 256
  hello_timeout_ms: 5000
  max_buffered_bytes: 512MiB
  max_pages_per_session: 0
  max_pages_per_tenant: 0
  max_pin_ttl_ms: 600000
  max_pinned_pages_per_tenant: 0
  max_pinned_pool_percent: 50
pools:
  - name: a
    policy: prefix
    hash_scheme: kvpool-sha256/1
    capacity: 64 pages
    share_between_tenants: false
    geometry: {layers: 1, kv_heads: 1, head_dim: 8, tokens_per_page: 16, dtype: fp16,
               kind: sliding, window: 64}
    layout: page_major
    host_tier: 32 pages
    max_capacity: 128 pages
    min_capacity: 32 pages
    segment_size: 4KiB
    grow_ahead: true
  - name: h
    capacity: 8MiB
    segment_size: 64KiB
    geometry: {layers: 3, kv_heads: 2, head_dim: 8, tokens_per_page: 16, dtype: fp16}
    groups:
      - {name: local, layers: 5, kv_heads: 3, head_dim: 24, kind: sliding, window: 48}
      - {name: global}
  - name: c
    convert_evictions_to: d
    capacity: 4 pages
    geometry: {layers: 1, kv_heads: 1, head_dim: 8, tokens_per_page: 16, dtype: bf16}
  - name: d
    capacity: 8 pages
    geometry: {layers: 1, kv_heads: 1, head_dim: 8, tokens_per_page: 16, dtype: fp8_e4m3}
  - name: e
    capacity: 8 pages
    geometry: {layers: 1, kv_heads: 1, head_dim: 8, tokens_per_page: 16, dtype: int8}
    remote_tier:
      cluster: ["127.0.0.1:7000"]
      namespace: kvpool
      ttl_s: 86400
      write: on_publish
      admit: all
      timeout_ms: 100
      batch_pages: 32
      staging_pages: 128
tenants:
  - {name: t, uids: [1000], gids: [1000], pools: []}
default_tenant: default
admin_group: ""
logging: {level: info}
metrics: {listen: "", allow_non_loopback: false, latency_histograms: true, stats_segment: true}
events:
  ring_events: 65536
  zmq_endpoint: "tcp://127.0.0.1:5557"
  zmq_topic: ""
  zmq_block_hash: bytes
  zmq_payload: array
  zmq_send_hwm: 10000
  zmq_queue_bytes: 64MiB
  zmq_max_connections: 64
  zmq_replay_endpoint: ""
  zmq_replay_batches: 10000
  data_parallel_rank: 0
  zmq_mode: bind
  zmq_token_ids: true
)";

// key → (text in kBase, its replacement).
const std::map<std::string, std::pair<std::string, std::string>> kSamples = {
    {"socket.path", {"/tmp/kvpool-keys.sock", "/tmp/kvpool-other.sock"}},
    {"socket.mode", {"\"0660\"", "\"0600\""}},
    {"socket.group", {"group: \"\"}", "group: root}"}},
    {"backend", {"backend: host", "backend: auto"}},
    {"device", {"device: 0", "device: 1"}},
    {"max_segment_bytes", {"max_segment_bytes: 64MiB", "max_segment_bytes: 1MiB"}},
    {"memory_budget", {"memory_budget: 1GiB", "memory_budget: 2GiB"}},
    {"limits.max_sessions", {"max_sessions: 1024", "max_sessions: 10"}},
    {"limits.max_sessions_per_uid", {"max_sessions_per_uid: 256", "max_sessions_per_uid: 2"}},
    {"limits.hello_timeout_ms", {"hello_timeout_ms: 5000", "hello_timeout_ms: 100"}},
    {"limits.max_buffered_bytes", {"max_buffered_bytes: 512MiB", "max_buffered_bytes: 64MiB"}},
    {"limits.max_pages_per_session", {"max_pages_per_session: 0", "max_pages_per_session: 5"}},
    {"limits.max_pages_per_tenant", {"max_pages_per_tenant: 0", "max_pages_per_tenant: 5"}},
    {"limits.max_pin_ttl_ms", {"max_pin_ttl_ms: 600000", "max_pin_ttl_ms: 10"}},
    {"limits.max_pinned_pages_per_tenant",
     {"max_pinned_pages_per_tenant: 0", "max_pinned_pages_per_tenant: 3"}},
    {"limits.max_pinned_pool_percent",
     {"max_pinned_pool_percent: 50", "max_pinned_pool_percent: 10"}},
    {"pools[].name", {"name: a\n", "name: b\n"}},
    {"pools[].policy", {"policy: prefix", "policy: lru"}},
    {"pools[].hash_scheme", {"hash_scheme: kvpool-sha256/1", "hash_scheme: vllm-sha256-cbor/1"}},
    {"pools[].capacity", {"capacity: 64 pages", "capacity: 96 pages"}},
    {"pools[].share_between_tenants",
     {"share_between_tenants: false", "share_between_tenants: true"}},
    {"pools[].geometry.layers", {"layers: 1,", "layers: 2,"}},
    {"pools[].geometry.kv_heads", {"kv_heads: 1,", "kv_heads: 2,"}},
    {"pools[].geometry.head_dim", {"head_dim: 8,", "head_dim: 16,"}},
    {"pools[].geometry.tokens_per_page", {"tokens_per_page: 16,", "tokens_per_page: 32,"}},
    {"pools[].geometry.dtype", {"dtype: fp16,", "dtype: bf16,"}},
    {"pools[].geometry.kind", {"kind: sliding,", "kind: chunked,"}},
    {"pools[].geometry.window", {"window: 64}", "window: 32}"}},
    {"pools[].layout", {"layout: page_major", "layout: page_major\n    # layout"}},
    {"pools[].host_tier", {"host_tier: 32 pages", "host_tier: 16 pages"}},
    {"pools[].convert_evictions_to", {"convert_evictions_to: d", "convert_evictions_to: e"}},
    {"pools[].remote_tier.cluster", {"[\"127.0.0.1:7000\"]", "[\"127.0.0.1:7001\", \"r:7002\"]"}},
    {"pools[].remote_tier.namespace", {"namespace: kvpool", "namespace: fleet-a"}},
    {"pools[].remote_tier.ttl_s", {"ttl_s: 86400", "ttl_s: 0"}},
    {"pools[].remote_tier.write", {"write: on_publish", "write: on_demote"}},
    {"pools[].remote_tier.admit", {"admit: all", "admit: reused"}},
    {"pools[].remote_tier.timeout_ms", {"timeout_ms: 100", "timeout_ms: 5"}},
    {"pools[].remote_tier.batch_pages", {"batch_pages: 32", "batch_pages: 16"}},
    {"pools[].remote_tier.staging_pages", {"staging_pages: 128", "staging_pages: 64"}},
    {"pools[].max_capacity", {"max_capacity: 128 pages", "max_capacity: 256 pages"}},
    {"pools[].min_capacity", {"min_capacity: 32 pages", "min_capacity: 48 pages"}},
    {"pools[].segment_size", {"segment_size: 4KiB", "segment_size: 8KiB"}},
    {"pools[].grow_ahead", {"grow_ahead: true", "grow_ahead: false"}},
    {"pools[].groups[].name", {"name: local,", "name: near,"}},
    {"pools[].groups[].layers", {"layers: 5,", "layers: 6,"}},
    {"pools[].groups[].kv_heads", {"kv_heads: 3,", "kv_heads: 4,"}},
    {"pools[].groups[].head_dim", {"head_dim: 24,", "head_dim: 32,"}},
    {"pools[].groups[].kind", {"kind: sliding, window: 48", "kind: chunked, window: 48"}},
    {"pools[].groups[].window", {"window: 48}", "window: 96}"}},
    {"tenants[].name", {"name: t,", "name: u,"}},
    {"tenants[].uids", {"uids: [1000]", "uids: [1001]"}},
    {"tenants[].gids", {"gids: [1000]", "gids: [1001]"}},
    {"tenants[].pools", {"pools: []}", "pools: [a]}"}},
    {"default_tenant", {"default_tenant: default", "default_tenant: t"}},
    {"admin_group", {"admin_group: \"\"", "admin_group: root"}},
    {"logging.level", {"level: info", "level: debug"}},
    {"metrics.listen", {"listen: \"\"", "listen: \"127.0.0.1:9400\""}},
    {"metrics.allow_non_loopback", {"allow_non_loopback: false", "allow_non_loopback: true"}},
    {"metrics.latency_histograms", {"latency_histograms: true", "latency_histograms: false"}},
    {"metrics.stats_segment", {"stats_segment: true", "stats_segment: false"}},
    {"events.ring_events", {"ring_events: 65536", "ring_events: 1024"}},
    {"events.zmq_endpoint", {"tcp://127.0.0.1:5557", "tcp://127.0.0.1:5558"}},
    {"events.zmq_topic", {"zmq_topic: \"\"", "zmq_topic: kv"}},
    {"events.zmq_block_hash", {"zmq_block_hash: bytes", "zmq_block_hash: uint64"}},
    {"events.zmq_payload", {"zmq_payload: array", "zmq_payload: map"}},
    {"events.zmq_send_hwm", {"zmq_send_hwm: 10000", "zmq_send_hwm: 100"}},
    {"events.zmq_queue_bytes", {"zmq_queue_bytes: 64MiB", "zmq_queue_bytes: 32MiB"}},
    {"events.zmq_max_connections", {"zmq_max_connections: 64", "zmq_max_connections: 8"}},
    {"events.zmq_replay_endpoint",
     {"zmq_replay_endpoint: \"\"", "zmq_replay_endpoint: \"tcp://127.0.0.1:5559\""}},
    {"events.zmq_replay_batches", {"zmq_replay_batches: 10000", "zmq_replay_batches: 10"}},
    {"events.data_parallel_rank", {"data_parallel_rank: 0", "data_parallel_rank: 1"}},
    {"events.zmq_mode", {"zmq_mode: bind", "zmq_mode: connect"}},
    {"events.zmq_token_ids", {"zmq_token_ids: true", "zmq_token_ids: false"}},
};

Config parse_ok(const std::string& yaml, const std::string& what) {
  auto c = parse_config(yaml, "kvpoold.yaml");  // one source: Config's == compares it
  EXPECT_TRUE(c.ok()) << what << ": " << (c.ok() ? "" : c.error().message);
  return c.ok() ? c.value() : Config{};
}

TEST(ConfigKeys, EveryKeyReloadsAsTheTableSays) {
  const Config running = parse_ok(kBase, "base");
  for (const ConfigKey& key : config_key_table()) {
    const std::string path(key.path);
    const auto sample = kSamples.find(path);
    ASSERT_NE(sample, kSamples.end()) << "no sample value for " << path << " in this test";
    std::string yaml = kBase;
    const auto at = yaml.find(sample->second.first);
    ASSERT_NE(at, std::string::npos) << path << ": " << sample->second.first << " not in kBase";
    yaml.replace(at, sample->second.first.size(), sample->second.second);
    const Config next = parse_ok(yaml, path);
    if (path == "pools[].layout") continue;  // one value an elastic pool may have (below)
    ASSERT_FALSE(next == running) << path << ": the sample changes nothing";
    Config applied = next;
    const std::vector<std::string> named = keep_restart_keys(applied, running);
    if (key.reload == Reload::live) {
      EXPECT_TRUE(named.empty()) << path;
      EXPECT_TRUE(applied == next) << path << " is live but kept its running value";
    } else {
      EXPECT_EQ(named, std::vector<std::string>{std::string(key.restart_name)}) << path;
      EXPECT_TRUE(applied == running) << path << " needs a restart but took its new value";
    }
  }
}

// layout: only page_major pools are elastic (and have groups), so the base cannot change it; a
// fixed pool can.
TEST(ConfigKeys, LayoutWaitsForARestart) {
  const std::string fixed =
      "pools:\n  - name: a\n    geometry: {layers: 1, kv_heads: 1, head_dim: 8, "
      "tokens_per_page: 16, dtype: fp16}\n    layout: page_major\n";
  std::string other = fixed;
  other.replace(other.find("page_major"), 10, "layer_major");
  const Config running = parse_ok(fixed, "fixed");
  Config applied = parse_ok(other, "layer_major");
  EXPECT_EQ(keep_restart_keys(applied, running), std::vector<std::string>{"pools"});
  EXPECT_TRUE(applied == running);
}

TEST(ConfigKeys, APoolMoreOrLessKeepsTheRunningPools) {
  const Config running = parse_ok(kBase, "base");
  Config applied = running;
  applied.pools.push_back(applied.pools.front());
  applied.pools.back().name = "b";
  applied.max_sessions = 7;  // a live key beside it still applies
  EXPECT_EQ(keep_restart_keys(applied, running), std::vector<std::string>{"pools"});
  EXPECT_EQ(applied.pools, running.pools);
  EXPECT_EQ(applied.max_sessions, 7u);
}

TEST(ConfigKeys, EachMappingListsItsKeysInTableOrder) {
  EXPECT_EQ(keys_under("socket."), (std::vector<std::string_view>{"path", "mode", "group"}));
  EXPECT_EQ(keys_under("pools[].geometry."),
            (std::vector<std::string_view>{"layers", "kv_heads", "head_dim", "tokens_per_page",
                                           "dtype", "kind", "window"}));
  const std::vector<std::string_view> top = keys_under("");
  EXPECT_EQ(top.front(), "socket");
  EXPECT_EQ(top.back(), "events");
  EXPECT_EQ(top.size(), 13u);
}

}  // namespace
}  // namespace kvpool::daemon
