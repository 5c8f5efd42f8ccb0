#include "daemon/config/config.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

namespace kvpool::daemon {
namespace {

constexpr std::string_view kSource = "test.yaml";

// Sets (or, with nullopt, unsets) XDG_RUNTIME_DIR for one scope.
class ScopedXdg {
 public:
  explicit ScopedXdg(std::optional<std::string> value) {
    if (const char* old = std::getenv("XDG_RUNTIME_DIR")) old_ = old;
    if (value) {
      setenv("XDG_RUNTIME_DIR", value->c_str(), 1);
    } else {
      unsetenv("XDG_RUNTIME_DIR");
    }
  }
  ~ScopedXdg() {
    if (old_) {
      setenv("XDG_RUNTIME_DIR", old_->c_str(), 1);
    } else {
      unsetenv("XDG_RUNTIME_DIR");
    }
  }
  ScopedXdg(const ScopedXdg&) = delete;
  ScopedXdg& operator=(const ScopedXdg&) = delete;

 private:
  std::optional<std::string> old_;
};

Config parse_ok(std::string_view yaml) {
  auto r = parse_config(yaml, kSource);
  EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().message);
  return r.ok() ? r.value() : Config{};
}

std::string parse_error(std::string_view yaml) {
  auto r = parse_config(yaml, kSource);
  EXPECT_FALSE(r.ok()) << "parsed:\n" << yaml;
  if (r.ok()) return {};
  EXPECT_EQ(r.error().status, Status{Errc::invalid_argument});
  return r.error().message;
}

// The error must read "test.yaml:LINE: KEY: ..." and contain `what`.
void expect_error(std::string_view yaml, int line, const std::string& key,
                  const std::string& what) {
  const std::string msg = parse_error(yaml);
  const std::string prefix =
      std::string(kSource) + ":" + std::to_string(line) + ": " + (key.empty() ? "" : key + ": ");
  EXPECT_TRUE(msg.starts_with(prefix)) << "message: " << msg << "\nexpected prefix: " << prefix;
  EXPECT_NE(msg.find(what), std::string::npos) << "message: " << msg << "\nexpected: " << what;
}

// A valid pool list, lines 1-8; tests append to it.
constexpr std::string_view kPools = R"(pools:
  - name: a
    capacity: 64MiB
    geometry:
      layers: 2
      kv_heads: 2
      head_dim: 64
      tokens_per_page: 16
)";

std::string with_pools(std::string_view rest) {
  return std::string(kPools) + "      dtype: fp16\n" + std::string(rest);
}

std::string example_path() {
  return (std::filesystem::path(__FILE__).parent_path() / ".." / ".." / "config" / "kvpoold.yaml")
      .lexically_normal()
      .string();
}

// Every key the parser knows is in the schema comment of daemon/config/config.h and documented in
// config/kvpoold.yaml (set, or as a commented example "# key: ...").
TEST(ConfigTest, EveryKeyIsInTheSchemaCommentAndTheExampleFile) {
  const auto read = [](const std::filesystem::path& p) {
    std::ifstream in(p);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  };
  const std::filesystem::path root = std::filesystem::path(__FILE__).parent_path() / ".." / "..";
  const std::string header = read(root / "daemon" / "config" / "config.h");
  const std::string schema = header.substr(0, header.find("#pragma once"));
  const std::string example = read(example_path());
  ASSERT_FALSE(schema.empty());
  ASSERT_FALSE(example.empty());
  const std::vector<std::string> keys = config_keys();
  EXPECT_GT(keys.size(), 50u);
  for (const std::string& key : keys) {
    const std::string leaf = key.substr(key.rfind('.') + 1);
    const std::regex word("\\b" + leaf + "\\b");
    EXPECT_TRUE(std::regex_search(schema, word))
        << key << " is missing from daemon/config/config.h";
    const std::regex line("(^|\\n)[ #-]*" + leaf + ":");
    EXPECT_TRUE(std::regex_search(example, line)) << key << " is missing from config/kvpoold.yaml";
  }
}

// Default config and socket path ------------------------------------------------------------

TEST(ConfigTest, DefaultConfig) {
  ScopedXdg xdg(std::nullopt);
  const Config c = default_config();
  EXPECT_EQ(c.source, "<built-in>");
  EXPECT_EQ(c.socket_path, "/run/kvpool/kvpoold.sock");
  EXPECT_EQ(c.socket_mode, 0660u);
  EXPECT_EQ(c.socket_group, "");
  EXPECT_EQ(c.backend, "auto");
  EXPECT_EQ(c.device, 0);
  EXPECT_EQ(c.max_sessions, 1024u);
  EXPECT_EQ(c.max_pages_per_session, 0u);
  EXPECT_EQ(c.max_pages_per_tenant, 0u);
  EXPECT_EQ(c.max_pin_ttl_ms, 600000u);
  EXPECT_EQ(c.max_pinned_pages_per_tenant, 0u);
  ASSERT_EQ(c.pools.size(), 1u);
  const PoolConfig& p = c.pools[0];
  EXPECT_EQ(p.name, "default");
  EXPECT_EQ(p.policy, "prefix");
  EXPECT_EQ(p.layout, KvLayout::page_major);
  EXPECT_EQ(p.geometry, (Geometry{32, 8, 128, 16, KvDtype::bf16}));
  EXPECT_EQ(page_data_bytes(p.geometry), 2u << 20);
  EXPECT_EQ(p.capacity, (Capacity{Capacity::Unit::bytes, 256u << 20, 0.0}));
  EXPECT_TRUE(validate(p.geometry).empty());
  EXPECT_TRUE(c.tenants.empty());
  EXPECT_EQ(c.default_tenant, "default");
  EXPECT_EQ(c.log_level, "info");
}

TEST(ConfigTest, DefaultSocketPathFollowsXdgRuntimeDir) {
  {
    ScopedXdg xdg("/run/user/1000");
    EXPECT_EQ(default_socket_path(), "/run/user/1000/kvpool/kvpoold.sock");
    EXPECT_EQ(default_config().socket_path, "/run/user/1000/kvpool/kvpoold.sock");
  }
  {
    ScopedXdg xdg(std::nullopt);
    EXPECT_EQ(default_socket_path(), "/run/kvpool/kvpoold.sock");
  }
  {
    ScopedXdg xdg("");  // set but empty: ignored
    EXPECT_EQ(default_socket_path(), "/run/kvpool/kvpoold.sock");
  }
  {
    ScopedXdg xdg("relative/dir");  // the XDG spec says to ignore relative paths
    EXPECT_EQ(default_socket_path(), "/run/kvpool/kvpoold.sock");
  }
}

// Valid files -------------------------------------------------------------------------------

TEST(ConfigTest, EmptyFileIsTheDefaultConfig) {
  for (std::string_view text : {"", "\n\n", "# only a comment\n", "---\n", "~\n"}) {
    SCOPED_TRACE(std::string(text));
    Config c = parse_ok(text);
    EXPECT_EQ(c.source, "test.yaml");
    c.source = "<built-in>";
    EXPECT_EQ(c, default_config());
  }
}

TEST(ConfigTest, FullFileWithEveryKey) {
  const Config c = parse_ok(R"(# every key, none at its default
socket:
  path: /tmp/kvpool-test/kvpoold.sock
  mode: "0600"
  group: kvpool
backend: host
device: 3
limits:
  max_sessions: 16
  max_pages_per_session: 1000
  max_pages_per_tenant: 5000
  max_pin_ttl_ms: 30000
  max_pinned_pages_per_tenant: 64
pools:
  - name: llama
    policy: lru
    capacity: 1GiB
    geometry:
      layers: 32
      kv_heads: 8
      head_dim: 128
      tokens_per_page: 16
      dtype: bf16
  - name: small
    policy: s3fifo
    capacity: "4096 pages"
    geometry: {layers: 4, kv_heads: 2, head_dim: 64, tokens_per_page: 32, dtype: fp8}
  - name: frac
    capacity: 40%
    geometry: {layers: 1, kv_heads: 1, head_dim: 8, tokens_per_page: 8, dtype: int8}
tenants:
  - name: team-a
    uids: [1000, 1001]
    gids: [2000]
    pools: [llama, small]
  - name: team-b
    uids:
      - 1002
    gids: []
    pools: []
  - name: bare
default_tenant: team-a
logging:
  level: debug
)");
  EXPECT_EQ(c.source, "test.yaml");
  EXPECT_EQ(c.socket_path, "/tmp/kvpool-test/kvpoold.sock");
  EXPECT_EQ(c.socket_mode, 0600u);
  EXPECT_EQ(c.socket_group, "kvpool");
  EXPECT_EQ(c.backend, "host");
  EXPECT_EQ(c.device, 3);
  EXPECT_EQ(c.max_sessions, 16u);
  EXPECT_EQ(c.max_pages_per_session, 1000u);
  EXPECT_EQ(c.max_pages_per_tenant, 5000u);
  EXPECT_EQ(c.max_pin_ttl_ms, 30000u);
  EXPECT_EQ(c.max_pinned_pages_per_tenant, 64u);
  ASSERT_EQ(c.pools.size(), 3u);
  EXPECT_EQ(c.pools[0], (PoolConfig{"llama", Geometry{32, 8, 128, 16, KvDtype::bf16},
                                    Capacity{Capacity::Unit::bytes, 1u << 30, 0.0}, "lru"}));
  EXPECT_EQ(c.pools[1], (PoolConfig{"small", Geometry{4, 2, 64, 32, KvDtype::fp8_e4m3},
                                    Capacity{Capacity::Unit::pages, 4096, 0.0}, "s3fifo"}));
  EXPECT_EQ(c.pools[2].name, "frac");
  EXPECT_EQ(c.pools[2].policy, "prefix");
  EXPECT_EQ(c.pools[2].geometry.dtype, KvDtype::int8);
  EXPECT_EQ(c.pools[2].capacity.unit, Capacity::Unit::fraction);
  EXPECT_DOUBLE_EQ(c.pools[2].capacity.fraction, 0.4);
  ASSERT_EQ(c.tenants.size(), 3u);
  EXPECT_EQ(c.tenants[0], (TenantConfig{"team-a", {1000, 1001}, {2000}, {"llama", "small"}}));
  EXPECT_EQ(c.tenants[1], (TenantConfig{"team-b", {1002}, {}, {}}));
  EXPECT_EQ(c.tenants[2], (TenantConfig{"bare", {}, {}, {}}));
  EXPECT_EQ(c.default_tenant, "team-a");
  EXPECT_EQ(c.log_level, "debug");
}

TEST(ConfigTest, AbsentKeysKeepTheirDefaults) {
  Config c = parse_ok("backend: host\nlimits:\n  max_sessions: 7\n");
  Config expected = default_config();
  expected.source = "test.yaml";
  expected.backend = "host";
  expected.max_sessions = 7;
  EXPECT_EQ(c, expected);

  // Sections whose entries are all commented out are empty, not errors.
  c = parse_ok("socket:\n  # path: /x\nlimits:\nlogging:\ntenants:\n");
  expected = default_config();
  expected.source = "test.yaml";
  EXPECT_EQ(c, expected);
}

TEST(ConfigTest, PoolDefaultsAndPoolsReplaceTheDefaultPool) {
  const Config c = parse_ok(R"(pools:
  - name: only
    geometry: {layers: 2, kv_heads: 2, head_dim: 64, tokens_per_page: 16, dtype: fp16}
)");
  ASSERT_EQ(c.pools.size(), 1u);
  EXPECT_EQ(c.pools[0].name, "only");
  EXPECT_EQ(c.pools[0].policy, "prefix");
  EXPECT_EQ(c.pools[0].capacity, default_config().pools[0].capacity);
}

TEST(ConfigTest, SocketModeForms) {
  const std::pair<std::string_view, uint32_t> cases[] = {
      {"\"0660\"", 0660}, {"\"660\"", 0660}, {"\"0o600\"", 0600}, {"'0777'", 0777},
      {"0660", 0660},     {"0o640", 0640},   {"432", 0660},       {"0", 0},
      {"511", 0777},      {"\"0\"", 0},
  };
  for (const auto& [text, mode] : cases) {
    SCOPED_TRACE(std::string(text));
    EXPECT_EQ(parse_ok("socket:\n  mode: " + std::string(text) + "\n").socket_mode, mode);
  }
}

TEST(ConfigTest, DefaultTenantSpecialNames) {
  EXPECT_EQ(parse_ok("default_tenant: default\n").default_tenant, "default");
  EXPECT_EQ(parse_ok("default_tenant: \"\"\n").default_tenant, "");
  EXPECT_EQ(parse_ok("tenants:\n  - name: t\ndefault_tenant: t\n").default_tenant, "t");
  // A tenant entry named "default" configures the implicit tenant.
  const Config c = parse_ok("tenants:\n  - name: default\n    pools: [default]\n");
  ASSERT_EQ(c.tenants.size(), 1u);
  EXPECT_EQ(c.tenants[0].pools, std::vector<std::string>{"default"});
}

TEST(ConfigTest, MetricsAndEventsKeys) {
  Config c = parse_ok("");
  EXPECT_EQ(c.metrics, MetricsConfig{});
  EXPECT_EQ(c.metrics.listen, "");
  EXPECT_TRUE(c.metrics.latency_histograms);
  EXPECT_TRUE(c.metrics.stats_segment);
  EXPECT_EQ(c.events.ring_events, 65536u);
  c = parse_ok(
      "metrics:\n  listen: \"127.0.0.1:9464\"\n  latency_histograms: false\n"
      "  stats_segment: false\nevents:\n  ring_events: 16\n");
  EXPECT_EQ(c.metrics.listen, "127.0.0.1:9464");
  EXPECT_FALSE(c.metrics.latency_histograms);
  EXPECT_FALSE(c.metrics.stats_segment);
  EXPECT_EQ(c.events.ring_events, 16u);
  c = parse_ok("metrics: {listen: \"[::1]:0\"}\n");
  EXPECT_EQ(c.metrics.listen, "[::1]:0");
  // Beyond loopback only when asked for, in either order.
  c = parse_ok("metrics:\n  listen: \"0.0.0.0:9464\"\n  allow_non_loopback: true\n");
  EXPECT_TRUE(c.metrics.allow_non_loopback);
  EXPECT_EQ(parse_ok("metrics:\n  listen: \"\"\n").metrics.listen, "");
}

TEST(ConfigTest, ZmqEventKeys) {
  Config c = parse_ok("");
  EXPECT_EQ(c.events.zmq_endpoint, "");  // off by default
  EXPECT_EQ(c.events.zmq_block_hash, "bytes");
  EXPECT_EQ(c.events.zmq_payload, "array");
  EXPECT_EQ(parse_ok("events: {zmq_payload: map}\n").events.zmq_payload, "map");
  EXPECT_EQ(c.events.data_parallel_rank, std::optional<uint32_t>(0));  // as vLLM sends it
  EXPECT_FALSE(parse_ok("events: {data_parallel_rank: none}\n").events.data_parallel_rank);
  EXPECT_EQ(c.events.zmq_mode, "bind");
  EXPECT_TRUE(c.events.zmq_token_ids);
  EXPECT_EQ(parse_ok("events: {zmq_mode: auto, zmq_token_ids: false}\n").events.zmq_mode, "auto");
  expect_error("events: {zmq_mode: dial}\n", 1, "events.zmq_mode", "dial");
  expect_error("events: {zmq_endpoint: \"tcp://*:5557\", zmq_mode: connect}\n", 1,
               "events.zmq_mode", "not the wildcard");
  c = parse_ok(
      "events:\n  zmq_endpoint: \"tcp://*:5557\"\n  zmq_topic: \"kv@\"\n"
      "  zmq_block_hash: uint64\n  zmq_send_hwm: 100\n  zmq_replay_endpoint: \"ipc:///tmp/r\"\n"
      "  zmq_replay_batches: 7\n  data_parallel_rank: 3\n");
  EXPECT_EQ(c.events.zmq_endpoint, "tcp://*:5557");
  EXPECT_EQ(c.events.zmq_topic, "kv@");
  EXPECT_EQ(c.events.zmq_block_hash, "uint64");
  EXPECT_EQ(c.events.zmq_send_hwm, 100u);
  EXPECT_EQ(c.events.zmq_replay_endpoint, "ipc:///tmp/r");
  EXPECT_EQ(c.events.zmq_replay_batches, 7u);
  EXPECT_EQ(c.events.data_parallel_rank, std::optional<uint32_t>(3));
  // The endpoint's memory and connection bounds.
  EXPECT_EQ(parse_ok("").events.zmq_queue_bytes, uint64_t{64} << 20);
  EXPECT_EQ(parse_ok("").events.zmq_max_connections, 64u);
  c = parse_ok("events: {zmq_queue_bytes: 8MiB, zmq_max_connections: 4}\n");
  EXPECT_EQ(c.events.zmq_queue_bytes, uint64_t{8} << 20);
  EXPECT_EQ(c.events.zmq_max_connections, 4u);
}

// Errors: "FILE:LINE: KEY: what is wrong" ----------------------------------------------------

TEST(ConfigErrorTest, MetricsAndEvents) {
  expect_error("metrics:\n  listen: \"0.0.0.0:9464\"\n", 2, "metrics.listen",
               "not a loopback address");
  expect_error("metrics:\n  listen: \"10.1.2.3:9464\"\n", 2, "metrics.listen",
               "metrics.allow_non_loopback: true");
  expect_error("metrics:\n  listen: \"127.0.0.1\"\n", 2, "metrics.listen", "has no port");
  expect_error("metrics:\n  listen: \"127.0.0.1:70000\"\n", 2, "metrics.listen", "0..65535");
  expect_error("metrics:\n  listen: \"example.com:80\"\n", 2, "metrics.listen",
               "not an IPv4 address");
  expect_error("metrics:\n  listen: [1]\n", 2, "metrics.listen", "must be a string");
  expect_error("metrics:\n  port: 9464\n", 2, "metrics.port", "unknown key");
  expect_error("metrics:\n  latency_histograms: yes\n", 2, "metrics.latency_histograms",
               "true or false");
  expect_error("metrics:\n  stats_segment: \"true\"\n", 2, "metrics.stats_segment",
               "true or false");
  expect_error("events:\n  ring_events: 8\n", 2, "events.ring_events", "at least 16");
  expect_error("events:\n  ring_events: 99999999999\n", 2, "events.ring_events", "at most");
  expect_error("events:\n  ring: 64\n", 2, "events.ring", "unknown key");
  expect_error("events:\n  zmq_endpoint: \"http://x:1\"\n", 2, "events.zmq_endpoint",
               "not a ZeroMQ endpoint");
  expect_error("events:\n  zmq_endpoint: \"tcp://\"\n", 2, "events.zmq_endpoint",
               "\"tcp://HOST:PORT\"");
  expect_error("events:\n  zmq_block_hash: int\n", 2, "events.zmq_block_hash", "uint64");
  expect_error("events:\n  zmq_payload: json\n", 2, "events.zmq_payload", "map");
  expect_error("events:\n  zmq_send_hwm: 0\n", 2, "events.zmq_send_hwm", "at least 1");
  expect_error("events:\n  zmq_queue_bytes: 4KiB\n", 2, "events.zmq_queue_bytes",
               "at least 1.0 MiB");
  expect_error("events:\n  zmq_queue_bytes: 100 pages\n", 2, "events.zmq_queue_bytes",
               "expected bytes");
  expect_error("events:\n  zmq_max_connections: 0\n", 2, "events.zmq_max_connections",
               "at least 1");
  expect_error("events:\n  zmq_replay_endpoint: \"tcp://*:5558\"\n", 2,
               "events.zmq_replay_endpoint",
               "replays what events.zmq_endpoint publishes, which is not set");
  expect_error(
      "events:\n  zmq_endpoint: \"tcp://*:5557\"\n  zmq_replay_endpoint: \"tcp://*:5557\"\n", 3,
      "events.zmq_replay_endpoint", "must differ");
  expect_error("events:\n  data_parallel_rank: -1\n", 2, "events.data_parallel_rank", "");
  expect_error("metric:\n  listen: \"\"\n", 1, "metric", "unknown key");
}

TEST(ConfigErrorTest, UnknownKeys) {
  expect_error("backend: host\nsockets:\n  path: /x\n", 2, "sockets", "unknown key");
  expect_error("socket:\n  path: /x\n  owner: root\n", 3, "socket.owner", "unknown key");
  expect_error("limits:\n  max_session: 3\n", 2, "limits.max_session", "max_sessions");
  expect_error("logging:\n  format: json\n", 2, "logging.format", "unknown key");
  expect_error(with_pools("    colour: red\n"), 10, "pools[0].colour", "unknown key");
  expect_error(with_pools("      head_dims: 64\n"), 10, "pools[0].geometry.head_dims",
               "unknown key");
  expect_error("tenants:\n  - name: t\n    uid: [1]\n", 3, "tenants[0].uid", "unknown key");
}

TEST(ConfigErrorTest, DottedPathNamesTheListItem) {
  const std::string yaml = with_pools(R"(  - name: b
    geometry:
      layers: 2
      kv_heads: 2
      head_dim: 0
      tokens_per_page: 16
      dtype: fp16
)");
  expect_error(yaml, 14, "pools[1].geometry.head_dim", "at least 1");
}

TEST(ConfigErrorTest, WrongTypes) {
  expect_error(with_pools("").replace(with_pools("").find("layers: 2"), 9, "layers: abc"), 5,
               "pools[0].geometry.layers", "must be an integer");
  expect_error("device: \"1\"\n", 1, "device", "not the string");
  expect_error("device: 1.5\n", 1, "device", "must be an integer");
  expect_error("device: -1\n", 1, "device", "must not be negative");
  expect_error("device: 0x10\n", 1, "device", "must be an integer");
  expect_error("device: 010\n", 1, "device", "leading zeros");
  expect_error("device: 99999999999\n", 1, "device", "at most");
  expect_error("limits:\n  max_pages_per_session: -5\n", 2, "limits.max_pages_per_session",
               "negative");
  expect_error("limits:\n  max_pages_per_tenant: 18446744073709551616\n", 2,
               "limits.max_pages_per_tenant", "at most");
  expect_error("socket: [a, b]\n", 1, "socket", "must be a mapping, not a list");
  expect_error("limits: 5\n", 1, "limits", "must be a mapping");
  expect_error("backend: {a: 1}\n", 1, "backend", "must be a string, not a mapping");
  expect_error("socket:\n  group: [wheel]\n", 2, "socket.group", "must be a string");
  expect_error("pools: {name: a}\n", 1, "pools", "must be a list");
  expect_error("tenants:\n  - name: t\n    uids: 1000\n", 3, "tenants[0].uids", "must be a list");
  expect_error("tenants:\n  - name: t\n    uids: [abc]\n", 3, "tenants[0].uids[0]",
               "must be an integer");
  expect_error("tenants:\n  - name: t\n    gids: [-1]\n", 3, "tenants[0].gids[0]", "negative");
  expect_error("tenants:\n  - name: t\n    uids: [4294967295]\n", 3, "tenants[0].uids[0]",
               "at most");
  expect_error("tenants:\n  - just-a-string\n", 2, "tenants[0]", "must be a mapping");
}

TEST(ConfigErrorTest, NullValues) {
  expect_error("backend:\ndevice: 1\n", 1, "backend", "has no value");
  expect_error("device: ~\n", 1, "device", "has no value");
  expect_error("socket:\n  path:\n  mode: \"0660\"\n", 2, "socket.path", "has no value");
  expect_error("pools:\n  -\n", 2, "pools[0]", "must be a mapping");
}

TEST(ConfigErrorTest, DuplicateKeys) {
  expect_error("backend: host\ndevice: 1\nbackend: auto\n", 3, "backend", "duplicate key");
  expect_error("socket:\n  mode: \"0600\"\n  mode: \"0660\"\n", 3, "socket.mode", "line 2");
}

TEST(ConfigErrorTest, SocketValues) {
  expect_error("socket:\n  mode: 999\n", 2, "socket.mode", "0660");
  expect_error("socket:\n  mode: 660\n", 2, "socket.mode", "<= 0777");
  expect_error("socket:\n  mode: \"0999\"\n", 2, "socket.mode", "octal");
  expect_error("socket:\n  mode: \"01000\"\n", 2, "socket.mode", "octal");
  expect_error("socket:\n  mode: \"rw-rw----\"\n", 2, "socket.mode", "octal");
  expect_error("socket:\n  mode: \"\"\n", 2, "socket.mode", "octal");
  expect_error("socket:\n  mode: -1\n", 2, "socket.mode", "octal");
  expect_error("socket:\n  mode: [1]\n", 2, "socket.mode", "must be a mode");
  expect_error("socket:\n  path: \"\"\n", 2, "socket.path", "must not be empty");
  expect_error("socket:\n  path: run/kvpool.sock\n", 2, "socket.path", "absolute");
  expect_error("socket:\n  path: /" + std::string(200, 'x') + "\n", 2, "socket.path",
               "at most 107");
}

TEST(ConfigErrorTest, OutOfRangeChoices) {
  expect_error("limits:\n  max_sessions: 0\n", 2, "limits.max_sessions", "at least 1");
  expect_error("backend: cuda\n", 1, "backend", "auto, host, cuda-vmm, cuda-ipc");
  expect_error("logging:\n  level: verbose\n", 2, "logging.level", "debug, info, warn, error");
  expect_error(with_pools("    policy: fifo\n"), 10, "pools[0].policy",
               "\"fifo\" is not one of prefix, lru, s3fifo");
  expect_error("limits:\n  max_pin_ttl_ms: 86400001\n", 2, "limits.max_pin_ttl_ms", "86400000");
}

TEST(ConfigTest, PoolLayout) {
  auto absent = parse_config(with_pools(""), "t.yaml");
  ASSERT_TRUE(absent.ok()) << absent.error().message;
  EXPECT_EQ(absent.value().pools[0].layout, KvLayout::page_major);
  for (auto [text, layout] : {std::pair{"page_major", KvLayout::page_major},
                              std::pair{"layer_major", KvLayout::layer_major}}) {
    auto c = parse_config(with_pools("    layout: " + std::string(text) + "\n"), "t.yaml");
    ASSERT_TRUE(c.ok()) << c.error().message;
    EXPECT_EQ(c.value().pools[0].layout, layout) << text;
  }
  // The layout is part of what a pool is: a reload that changes it changes the pools (which
  // Service::apply_live names as waiting for a restart), the geometry staying equal.
  auto a = parse_config(with_pools("    layout: layer_major\n"), "t.yaml");
  ASSERT_TRUE(a.ok());
  EXPECT_NE(a.value().pools, absent.value().pools);
  EXPECT_EQ(a.value().pools[0].geometry, absent.value().pools[0].geometry);
}

TEST(ConfigErrorTest, PoolLayout) {
  expect_error(with_pools("    layout: vllm\n"), 10, "pools[0].layout",
               "\"vllm\" is not one of page_major, layer_major");
  expect_error(with_pools("    layout: [page_major]\n"), 10, "pools[0].layout", "must be a string");
  expect_error(with_pools("    layout: \n"), 10, "pools[0].layout", "");
}

TEST(ConfigTest, PoolHashScheme) {
  auto absent = parse_config(with_pools(""), "t.yaml");
  ASSERT_TRUE(absent.ok()) << absent.error().message;
  EXPECT_EQ(absent.value().pools[0].hash_scheme, "kvpool-sha256/1");
  auto vllm = parse_config(with_pools("    hash_scheme: vllm-sha256-cbor/1\n"), "t.yaml");
  ASSERT_TRUE(vllm.ok()) << vllm.error().message;
  EXPECT_EQ(vllm.value().pools[0].hash_scheme, "vllm-sha256-cbor/1");
  EXPECT_NE(vllm.value().pools, absent.value().pools);  // a reload names it for a restart
}

TEST(ConfigErrorTest, PoolHashScheme) {
  expect_error(with_pools("    hash_scheme: sha256_cbor\n"), 10, "pools[0].hash_scheme",
               "\"sha256_cbor\" is not one of kvpool-sha256/1, vllm-sha256-cbor/1");
}

TEST(ConfigErrorTest, Geometry) {
  std::string yaml = with_pools("");
  yaml.replace(yaml.find("dtype: fp16"), 11, "dtype: fp32");
  expect_error(yaml, 9, "pools[0].geometry.dtype", "\"fp32\" is not one of");

  yaml = std::string(kPools);  // no dtype
  expect_error(yaml, 4, "pools[0].geometry", "missing required key \"dtype\"");

  yaml = with_pools("");
  yaml.replace(yaml.find("tokens_per_page: 16"), 19, "tokens_per_page: 0");
  expect_error(yaml, 8, "pools[0].geometry.tokens_per_page", "at least 1");

  // validate(): a page above 1 TiB, reported at the geometry.
  expect_error(R"(pools:
  - name: huge
    geometry:
      layers: 4096
      kv_heads: 4096
      head_dim: 4096
      tokens_per_page: 4096
      dtype: fp16
)",
               3, "pools[0].geometry", "exceeds 1 TiB");

  expect_error("pools:\n  - name: a\n    capacity: 1GiB\n", 2, "pools[0]",
               "missing required key \"geometry\"");
  expect_error("pools:\n  - name: a\n    geometry: [1, 2]\n", 3, "pools[0].geometry",
               "must be a mapping");
  expect_error("pools:\n  - name: a\n    geometry:\n", 3, "pools[0].geometry", "must be a mapping");
}

TEST(ConfigErrorTest, Capacity) {
  std::string yaml = with_pools("");
  const size_t at = yaml.find("64MiB");
  auto with_capacity = [&](std::string_view cap) {
    std::string y = yaml;
    y.replace(at, 5, cap);
    return y;
  };
  expect_error(with_capacity("lots"), 3, "pools[0].capacity", "\"lots\"");
  expect_error(with_capacity("0"), 3, "pools[0].capacity", "zero");
  expect_error(with_capacity("0 pages"), 3, "pools[0].capacity", "zero");
  expect_error(with_capacity("0%"), 3, "pools[0].capacity", "(0%, 100%]");
  expect_error(with_capacity("150%"), 3, "pools[0].capacity", "(0%, 100%]");
  expect_error(with_capacity("16 EiB"), 3, "pools[0].capacity", "unknown unit");
  expect_error(with_capacity("99999999999999999999"), 3, "pools[0].capacity", "2^63");
  expect_error(with_capacity("[1GiB]"), 3, "pools[0].capacity", "must be a capacity");
  // 2·2·2·16·64·2 = 16 KiB pages: 1000 bytes hold none.
  expect_error(with_capacity("1000"), 3, "pools[0].capacity", "no whole page of 16384 bytes");
  expect_error(with_capacity("3000000000 pages"), 3, "pools[0].capacity", "a pool can hold");
  // A geometry whose page exceeds the default 256 MiB capacity needs an explicit capacity.
  expect_error(R"(pools:
  - name: big
    geometry: {layers: 256, kv_heads: 64, head_dim: 128, tokens_per_page: 64, dtype: fp16}
)",
               2, "pools[0].capacity (default 256MiB)", "no whole page");
}

TEST(ConfigErrorTest, PoolsList) {
  expect_error("backend: host\npools: []\n", 2, "pools", "at least one pool");
  expect_error("backend: host\npools:\n", 2, "pools", "at least one pool");
  expect_error(
      "pools:\n  - geometry: {layers: 1, kv_heads: 1, head_dim: 8, tokens_per_page: 8, "
      "dtype: fp16}\n",
      2, "pools[0]", "missing required key \"name\"");
  expect_error("pools:\n  - policy: lru\n    name: \"\"\n", 3, "pools[0].name",
               "must not be empty");
  const std::string dup = with_pools(R"(  - name: a
    geometry: {layers: 1, kv_heads: 1, head_dim: 8, tokens_per_page: 8, dtype: fp16}
)");
  expect_error(dup, 10, "pools[1].name", "duplicate pool name \"a\"");
  expect_error("pools:\n  - name: " + std::string(300, 'p') + "\n", 2, "pools[0].name",
               "longer than 256");
}

TEST(ConfigErrorTest, Tenants) {
  expect_error(with_pools(R"(tenants:
  - name: t1
  - name: t1
)"),
               12, "tenants[1].name", "duplicate tenant name \"t1\"");
  expect_error(with_pools(R"(tenants:
  - name: t1
    uids: [1000, 1001]
  - name: t2
    uids: [1002, 1001]
)"),
               14, "tenants[1].uids[1]", "uid 1001 is already listed in tenant \"t1\"");
  expect_error(with_pools(R"(tenants:
  - name: t1
    gids:
      - 2000
  - name: t2
    gids:
      - 2000
)"),
               16, "tenants[1].gids[0]", "gid 2000 is already listed in tenant \"t1\"");
  expect_error(with_pools("tenants:\n  - name: t1\n    uids: [5, 5]\n"), 12, "tenants[0].uids[1]",
               "already listed in this tenant");
  // A uid in one tenant and the same number as a gid in another is fine.
  parse_ok(with_pools("tenants:\n  - name: t1\n    uids: [5]\n  - name: t2\n    gids: [5]\n"));
  expect_error(with_pools("tenants:\n  - name: t1\n    pools: [a, b]\n"), 12, "tenants[0].pools[1]",
               "no pool is named \"b\"");
  // The default pool is gone once a file lists pools.
  expect_error(with_pools("tenants:\n  - name: t1\n    pools:\n      - default\n"), 13,
               "tenants[0].pools[0]", "no pool is named \"default\"");
  expect_error(with_pools("tenants:\n  - name: t1\n    pools: [a, a]\n"), 12, "tenants[0].pools[1]",
               "listed twice");
  expect_error("tenants:\n  - uids: [1]\n", 2, "tenants[0]", "missing required key \"name\"");
}

TEST(ConfigTest, ConnectionLimits) {
  const Config d = default_config();
  EXPECT_EQ(d.max_sessions_per_uid, 256u);
  EXPECT_EQ(d.hello_timeout_ms, 5000u);
  EXPECT_EQ(d.max_buffered_bytes, uint64_t{512} << 20);
  const Config c = parse_ok(R"(limits:
  max_sessions_per_uid: 0
  hello_timeout_ms: 250
  max_buffered_bytes: 1GiB
)");
  EXPECT_EQ(c.max_sessions_per_uid, 0u);
  EXPECT_EQ(c.hello_timeout_ms, 250u);
  EXPECT_EQ(c.max_buffered_bytes, uint64_t{1} << 30);
}

TEST(ConfigErrorTest, ConnectionLimits) {
  expect_error("limits:\n  hello_timeout_ms: 0\n", 2, "limits.hello_timeout_ms", "at least 1");
  expect_error("limits:\n  hello_timeout_ms: 3600001\n", 2, "limits.hello_timeout_ms", "at most");
  expect_error("limits:\n  max_buffered_bytes: 1MiB\n", 2, "limits.max_buffered_bytes",
               "at least 16MiB");
  expect_error("limits:\n  max_buffered_bytes: 40%\n", 2, "limits.max_buffered_bytes",
               "expected bytes");
  expect_error("limits:\n  max_sessions_per_uid: -1\n", 2, "limits.max_sessions_per_uid",
               "negative");
}

// Two tenants on one pool can read each other's pages: only with the pool's explicit consent.
TEST(ConfigErrorTest, TenantsSharingAPoolNeedThePoolsConsent) {
  expect_error(with_pools(R"(tenants:
  - name: t1
    pools: [a]
  - name: t2
    pools: [a]
)"),
               14, "tenants[1].pools[0]",
               "pool \"a\" is already used by tenant \"t1\"; tenants sharing a pool can read and "
               "overwrite each other's pages, so this needs share_between_tenants: true on pool "
               "\"a\" (pools[0])");
  const Config c = parse_ok(std::string(kPools) + R"(      dtype: fp16
    share_between_tenants: true
tenants:
  - name: t1
    pools: [a]
  - name: t2
    pools: [a]
)");
  EXPECT_TRUE(c.pools[0].share_between_tenants);
  EXPECT_EQ(c.tenants[1].pools, std::vector<std::string>{"a"});
  EXPECT_FALSE(parse_ok(with_pools("")).pools[0].share_between_tenants);
  expect_error(std::string(kPools) + "      dtype: fp16\n    share_between_tenants: maybe\n", 10,
               "pools[0].share_between_tenants", "");
}

TEST(ConfigErrorTest, DefaultTenant) {
  expect_error("tenants:\n  - name: t\ndefault_tenant: nobody\n", 3, "default_tenant",
               "no tenant is named \"nobody\"");
  expect_error("default_tenant: [a]\n", 1, "default_tenant", "must be a string");
}

TEST(ConfigErrorTest, YamlSyntax) {
  expect_error("backend: host\ndevice: [1, 2\nlimits: {}\n", 3, "", "YAML syntax error");
  expect_error("socket:\n  path: /x\n   mode: 1\n", 3, "", "YAML syntax error");
  expect_error("backend: host\n\tdevice: 1\n", 2, "", "YAML syntax error");
  expect_error("backend: host\ndevice: b: c\n", 2, "", "YAML syntax error");
  expect_error("backend: &x host\ndevice: *y\n", 2, "", "anchor");
}

TEST(ConfigErrorTest, DocumentShape) {
  expect_error("- a\n- b\n", 1, "", "must be a mapping");
  expect_error("just text\n", 1, "", "must be a mapping");
  expect_error("backend: host\n---\nbackend: auto\n", 3, "", "one YAML document");
  expect_error("[1]: x\n", 1, "", "a key must be a plain string");
}

TEST(ConfigErrorTest, SourceNameInEveryMessage) {
  auto r = parse_config("device: x\n", "/etc/kvpool/kvpoold.yaml");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().message.rfind("/etc/kvpool/kvpoold.yaml:1: device: ", 0), 0u)
      << r.error().message;
}

// Capacity ----------------------------------------------------------------------------------

TEST(CapacityTest, Valid) {
  using U = Capacity::Unit;
  struct Case {
    std::string_view text;
    U unit;
    uint64_t value;
    double fraction;
  };
  const Case cases[] = {
      {"1GiB", U::bytes, 1ull << 30, 0},
      {"1 GiB", U::bytes, 1ull << 30, 0},
      {"  1   GiB  ", U::bytes, 1ull << 30, 0},
      {"512MiB", U::bytes, 512ull << 20, 0},
      {"512 MiB", U::bytes, 512ull << 20, 0},
      {"4KiB", U::bytes, 4096, 0},
      {"2TiB", U::bytes, 2ull << 40, 0},
      {"1GB", U::bytes, 1000000000, 0},
      {"1MB", U::bytes, 1000000, 0},
      {"1KB", U::bytes, 1000, 0},
      {"1kB", U::bytes, 1000, 0},
      {"3TB", U::bytes, 3000000000000, 0},
      {"1000000000", U::bytes, 1000000000, 0},
      {"1", U::bytes, 1, 0},
      {"1024B", U::bytes, 1024, 0},
      {"1024 B", U::bytes, 1024, 0},
      {"4096 pages", U::pages, 4096, 0},
      {"4096pages", U::pages, 4096, 0},
      {"1 page", U::pages, 1, 0},
      {"40%", U::fraction, 0, 0.40},
      {"40 %", U::fraction, 0, 0.40},
      {"12.5%", U::fraction, 0, 0.125},
      {"100%", U::fraction, 0, 1.0},
      {"0.5%", U::fraction, 0, 0.005},
      {"9223372036854775808", U::bytes, 1ull << 63, 0},  // 2^63: the largest
      {"8388608TiB", U::bytes, 1ull << 63, 0},
      {"9223372036854775808 pages", U::pages, 1ull << 63, 0},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(c.text));
    Capacity out;
    EXPECT_EQ(parse_capacity(c.text, out), "");
    EXPECT_EQ(out.unit, c.unit);
    EXPECT_EQ(out.value, c.value);
    EXPECT_DOUBLE_EQ(out.fraction, c.fraction);
  }
}

TEST(CapacityTest, Invalid) {
  struct Case {
    std::string_view text;
    std::string_view names;  // the error text must contain this
  };
  const Case cases[] = {
      {"", "empty"},
      {"   ", "empty"},
      {"abc", "does not start with a number"},
      {"GiB", "does not start with a number"},
      {"0", "zero"},
      {"0GiB", "zero"},
      {"0 pages", "zero"},
      {"0%", "(0%, 100%]"},
      {"0.0%", "(0%, 100%]"},
      {"100.5%", "(0%, 100%]"},
      {"101%", "(0%, 100%]"},
      {"-1GiB", "negative"},
      {"-5%", "negative"},
      {"1.5GiB", "fractional"},
      {"1 GiBs", "unknown unit"},
      {"1 gib", "unknown unit"},
      {"1 G", "unknown unit"},
      {"1 2 GiB", "unknown unit"},
      {"0x10", "unknown unit"},
      {"1e3", "unknown unit"},
      {"9223372036854775809", "2^63"},
      {"18446744073709551616", "2^63"},
      {"99999999999999999999999", "2^63"},
      {"8388609TiB", "2^63"},
      {"9223372036854775809 pages", "2^63"},
      {"40%%", "percentage"},
      {"%", "percentage"},
      {"nan%", "percentage"},
      {"inf%", "percentage"},
      {"1e2%", "percentage"},
      {"4.%", "percentage"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(c.text));
    Capacity out{Capacity::Unit::pages, 77, 0.0};
    const std::string err = parse_capacity(c.text, out);
    EXPECT_NE(err.find(c.names), std::string::npos) << err;
    if (c.text.find_first_not_of(' ') != std::string_view::npos) {
      EXPECT_NE(err.find(c.text), std::string::npos) << err;
    }
    EXPECT_EQ(out, (Capacity{Capacity::Unit::pages, 77, 0.0}));  // untouched on error
  }
}

// Files -------------------------------------------------------------------------------------

TEST(ConfigTest, LoadMissingFile) {
  const std::string path = "/nonexistent-kvpool-dir/kvpoold.yaml";
  auto r = load_config(path);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().status, Status{Errc::invalid_argument});
  EXPECT_NE(r.error().message.find(path), std::string::npos) << r.error().message;
  EXPECT_NE(r.error().message.find("No such file or directory"), std::string::npos)
      << r.error().message;
}

TEST(ConfigTest, LoadDirectory) {
  auto r = load_config("/");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("Is a directory"), std::string::npos) << r.error().message;
}

TEST(ConfigTest, LoadFileSetsSource) {
  const std::string path =
      testing::TempDir() + "kvpool_config_test_" + std::to_string(getpid()) + ".yaml";
  {
    std::ofstream f(path);
    f << "backend: host\nlimits:\n  max_sessions: bad\n";
  }
  auto r = load_config(path);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().message.rfind(path + ":3: limits.max_sessions: ", 0), 0u)
      << r.error().message;
  {
    std::ofstream f(path);
    f << "backend: host\n";
  }
  r = load_config(path);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r.value().source, path);
  EXPECT_EQ(r.value().backend, "host");
  {
    std::ofstream f(path);  // empty: the default config, named after the file
  }
  r = load_config(path);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r.value().source, path);
  EXPECT_EQ(r.value().pools, default_config().pools);
  std::filesystem::remove(path);
}

TEST(ConfigTest, ExampleFileParsesAndMatchesItsComments) {
  ScopedXdg xdg(std::nullopt);
  const std::string path = example_path();
  auto r = load_config(path);
  ASSERT_TRUE(r.ok()) << r.error().message;
  Config c = r.value();
  EXPECT_EQ(c.source, path);
  // Keys whose comments state their values.
  EXPECT_EQ(c.socket_path, "/run/kvpool/kvpoold.sock");
  EXPECT_EQ(c.socket_mode, 0660u);
  EXPECT_EQ(c.backend, "auto");
  EXPECT_EQ(c.max_sessions, 1024u);
  ASSERT_EQ(c.pools.size(), 1u);
  EXPECT_EQ(c.pools[0].capacity, (Capacity{Capacity::Unit::bytes, 256u << 20, 0.0}));
  EXPECT_EQ(page_data_bytes(c.pools[0].geometry), 2u << 20);  // "(2 MiB here)"
  EXPECT_EQ(c.default_tenant, "default");
  EXPECT_EQ(c.log_level, "info");
  EXPECT_EQ(c.max_sessions_per_uid, 256u);
  EXPECT_EQ(c.hello_timeout_ms, 5000u);
  EXPECT_EQ(c.max_buffered_bytes, uint64_t{512} << 20);
  EXPECT_FALSE(c.pools[0].share_between_tenants);
  // The example tenant, which matches no peer and claims no pool.
  ASSERT_EQ(c.tenants.size(), 1u);
  EXPECT_EQ(c.tenants[0], (TenantConfig{"example", {}, {}, {}}));
  // Everything else is the built-in default, as the header comment says.
  c.tenants.clear();
  c.source = "<built-in>";
  EXPECT_EQ(c, default_config());
}

}  // namespace
}  // namespace kvpool::daemon

// Host tiers and elastic pools ----------------------------------------------------------------

namespace kvpool::daemon {
namespace {

constexpr std::string_view kPoolHead =
    "pools:\n  - name: a\n    geometry: {layers: 2, kv_heads: 2, head_dim: 64, tokens_per_page: "
    "16, dtype: fp16}\n    capacity: 64 pages\n";

TEST(ConfigTest, HostTierAndElasticKeys) {
  const Config c = parse_ok(std::string(kPoolHead) +
                            "    host_tier: 1000 pages\n    max_capacity: 1MiB\n"
                            "    min_capacity: 32 pages\n    segment_size: 512KiB\n"
                            "    grow_ahead: false\n"
                            "memory_budget: 40%\n");
  const PoolConfig& p = c.pools.at(0);
  ASSERT_TRUE(p.host_tier && p.max_capacity && p.min_capacity);
  EXPECT_EQ(p.host_tier->unit, Capacity::Unit::pages);
  EXPECT_EQ(p.host_tier->value, 1000u);
  EXPECT_EQ(p.max_capacity->unit, Capacity::Unit::bytes);
  EXPECT_EQ(p.max_capacity->value, uint64_t{1} << 20);
  EXPECT_EQ(p.min_capacity->value, 32u);
  EXPECT_EQ(p.segment_size, uint64_t{512} << 10);
  EXPECT_FALSE(p.grow_ahead);
  ASSERT_TRUE(c.memory_budget);
  EXPECT_DOUBLE_EQ(c.memory_budget->fraction, 0.4);
  // Without the keys: no tier, a fixed pool, no budget.
  const Config plain = parse_ok(kPoolHead);
  EXPECT_FALSE(plain.pools.at(0).host_tier || plain.pools.at(0).max_capacity ||
               plain.memory_budget);
  EXPECT_TRUE(plain.pools.at(0).grow_ahead);
}

TEST(ConfigErrorTest, ElasticKeys) {
  const std::string head(kPoolHead);
  expect_error(head + "    min_capacity: 8 pages\n", 5, "pools[0].min_capacity",
               "needs max_capacity");
  expect_error(head + "    segment_size: 2MiB\n", 5, "pools[0].segment_size", "needs max_capacity");
  expect_error(head + "    grow_ahead: true\n", 5, "pools[0].grow_ahead", "needs max_capacity");
  expect_error(head + "    max_capacity: 128 pages\n    grow_ahead: sometimes\n", 6,
               "pools[0].grow_ahead", "");
  expect_error(head + "    max_capacity: 50%\n", 5, "pools[0].max_capacity", "pages or bytes");
  expect_error(head + "    host_tier: 100B\n", 5, "pools[0].host_tier", "no whole page");
  expect_error("memory_budget: 10 pages\n", 1, "memory_budget", "not pages");
}

// Sizes that cannot mean anything together are refused where --check-config reads them, as the
// daemon's start would (pages of 16 KiB here).
TEST(ConfigErrorTest, ElasticSizesMustFitEachOther) {
  const std::string head(kPoolHead);  // capacity: 64 pages
  expect_error(head + "    max_capacity: 32 pages\n", 5, "pools[0].max_capacity",
               "is 32 pages, below the pool's capacity of 64 pages");
  expect_error(head + "    max_capacity: 512KiB\n", 5, "pools[0].max_capacity",
               "is 32 pages (512.0 KiB), below the pool's capacity of 64 pages");
  expect_error(head + "    max_capacity: 128 pages\n    min_capacity: 256 pages\n", 6,
               "pools[0].min_capacity", "above max_capacity (128 pages)");
  expect_error(head + "    max_capacity: 128 pages\n    min_capacity: 100 pages\n", 6,
               "pools[0].min_capacity", "above the pool's capacity of 64 pages");
  expect_error(head + "    max_capacity: 128 pages\n    segment_size: 4MiB\n", 6,
               "pools[0].segment_size", "more than the pool's whole max_capacity (2.0 MiB)");
  expect_error(head + "    max_capacity: 128 pages\nmemory_budget: 512KiB\n", 6, "memory_budget",
               "less than the 2.0 MiB the elastic pools start with");
  // What fits is fine: min ≤ capacity ≤ max, a segment within the max, a budget that holds it.
  parse_ok(head +
           "    max_capacity: 128 pages\n    min_capacity: 64 pages\n    segment_size: 1MiB\n"
           "memory_budget: 2MiB\n");
}

// A hybrid model (lines 1-6); tests append its groups and keys.
constexpr std::string_view kModelHead =
    "pools:\n  - name: m\n    capacity: 1MiB\n    segment_size: 64KiB\n"
    "    geometry: {layers: 4, kv_heads: 2, head_dim: 64, tokens_per_page: 16, dtype: fp16}\n"
    "    groups:\n";

TEST(ConfigTest, GroupsExpandIntoOnePoolEach) {
  const Config c = parse_ok(std::string(kModelHead) +
                            "      - {name: local, layers: 3, kind: sliding, window: 512}\n"
                            "      - {name: global, layers: 1}\n"
                            "tenants:\n  - {name: t, uids: [7], pools: [m]}\n");
  ASSERT_EQ(c.pools.size(), 2u);
  const PoolConfig& local = c.pools[0];
  const PoolConfig& global = c.pools[1];
  EXPECT_EQ(local.name, "m/local");
  EXPECT_EQ(global.name, "m/global");
  EXPECT_EQ(local.tenancy_name(), "m");
  EXPECT_EQ(local.model, "m");
  EXPECT_EQ(global.group, 1u);
  EXPECT_EQ(local.model_groups, (std::vector<std::string>{"local", "global"}));
  // The model's geometry with each group's keys over it.
  EXPECT_EQ(local.geometry, (Geometry{3, 2, 64, 16, KvDtype::fp16, AttentionKind::sliding, 512}));
  EXPECT_EQ(global.geometry, (Geometry{1, 2, 64, 16, KvDtype::fp16}));
  // The model's capacity is the budget of both; each starts at one segment.
  EXPECT_EQ(local.model_budget, (Capacity{Capacity::Unit::bytes, 1u << 20, 0.0}));
  EXPECT_EQ(local.capacity.value, 64u << 10);
  EXPECT_FALSE(local.max_capacity);
  EXPECT_EQ(c.tenants[0].pools, std::vector<std::string>{"m"});
  // A sliding model's full group names its kind, and drops the window with it.
  const Config mixed = parse_ok(
      "pools:\n  - name: m\n    capacity: 1MiB\n    segment_size: 64KiB\n"
      "    geometry: {layers: 4, kv_heads: 2, head_dim: 64, tokens_per_page: 16, dtype: fp16, "
      "kind: sliding, window: 128}\n    groups:\n      - {name: local}\n"
      "      - {name: global, kind: full}\n");
  EXPECT_EQ(mixed.pools[0].geometry.window, 128u);
  EXPECT_EQ(mixed.pools[1].geometry.kind, AttentionKind::full);
  EXPECT_EQ(mixed.pools[1].geometry.window, 0u);
}

TEST(ConfigTest, AModelsHostTierKeepsAsManyBlocksInEveryGroup) {
  // local: 3 layers × 2 heads × 64 × 16 × fp16 = 24 KiB pages (K and V); global: 1 layer, 8 KiB.
  const std::string groups =
      "      - {name: local, layers: 3, kind: sliding, window: 512}\n"
      "      - {name: global, layers: 1}\n";
  const Config bytes = parse_ok(std::string(kModelHead) + groups + "    host_tier: 1MiB\n");
  for (const PoolConfig& p : bytes.pools) {
    ASSERT_TRUE(p.host_tier) << p.name;
    EXPECT_EQ(*p.host_tier, (Capacity{Capacity::Unit::pages, (1u << 20) / (32u << 10), 0.0}));
  }
  const Config pages = parse_ok(std::string(kModelHead) + groups + "    host_tier: 100 pages\n");
  for (const PoolConfig& p : pages.pools)
    EXPECT_EQ(*p.host_tier, (Capacity{Capacity::Unit::pages, 100, 0.0})) << p.name;
}

TEST(ConfigTest, ElasticAndGroupedPoolsMayBeLayerMajor) {
  const Config c =
      parse_ok(std::string(kModelHead) + "      - {name: a}\n    layout: layer_major\n");
  EXPECT_EQ(c.pools.at(0).layout, KvLayout::layer_major);
  const Config e =
      parse_ok(std::string(kPoolHead) + "    layout: layer_major\n    max_capacity: 128 pages\n");
  EXPECT_EQ(e.pools.at(0).layout, KvLayout::layer_major);
  EXPECT_TRUE(e.pools.at(0).max_capacity);
}

TEST(ConfigErrorTest, GroupsThatDoNotFitThePool) {
  const std::string head(kModelHead);
  const std::string two = "      - {name: a}\n      - {name: b}\n";
  expect_error(head + "      - {name: a, kind: full, window: 64}\n", 7, "pools[0].groups[0].window",
               "a window needs kind: sliding or chunked");
  expect_error(head + "      - {name: a, kind: sliding}\n", 7, "pools[0].groups[0]",
               "needs a window");
  expect_error(head + "      - {name: a}\n      - {name: a}\n", 8, "pools[0].groups[1].name",
               "duplicate group name");
  expect_error(head + "      - {name: a/b}\n", 7, "pools[0].groups[0].name", "'/'");
  expect_error(head + "      - {name: a, colour: red}\n", 7, "pools[0].groups[0].colour", "");
  expect_error(head + "      - {name: a, layers: 0}\n", 7, "pools[0].groups[0].layers", "");
  expect_error(head + "    []\n", 6, "pools[0].groups", "at least one group");
  expect_error(head + two + "    max_capacity: 2MiB\n", 9, "pools[0].max_capacity",
               "sized by its capacity");
  expect_error(head + two + "    host_tier: 10%\n", 9, "pools[0].host_tier", "not a percentage");
  expect_error(head + two + "    host_tier: 40KiB\n", 9, "pools[0].host_tier",
               "less than one block in every group");
  expect_error(
      "pools:\n  - name: m\n    capacity: 64 pages\n    segment_size: 64KiB\n"
      "    geometry: {layers: 4, kv_heads: 2, head_dim: 64, tokens_per_page: 16, dtype: fp16}\n"
      "    groups:\n" +
          two,
      3, "pools[0].capacity", "bytes or a percentage");
  expect_error(
      "pools:\n  - name: m\n    capacity: 1GiB\n    segment_size: 64KiB\n"
      "    geometry: {layers: 4, kv_heads: 2, head_dim: 64, tokens_per_page: 16, dtype: fp16}\n"
      "    groups:\n" +
          two,
      3, "pools[0].capacity", "more than 253 segments");
  expect_error(
      "pools:\n  - name: m\n    capacity: 100KiB\n    segment_size: 64KiB\n"
      "    geometry: {layers: 4, kv_heads: 2, head_dim: 64, tokens_per_page: 16, dtype: fp16}\n"
      "    groups:\n" +
          two,
      3, "pools[0].capacity", "too small for a first segment");
  // Without a capacity key (256 MiB by default) the error names the pool's entry.
  expect_error(
      "pools:\n  - name: m\n    segment_size: 1MiB\n"
      "    geometry: {layers: 4, kv_heads: 2, head_dim: 64, tokens_per_page: 16, dtype: fp16}\n"
      "    groups:\n" +
          two,
      2, "pools[0]", "more than 253 segments");
  // Names: a pool may not take a model's or a group's name.
  expect_error(head + two +
                   "  - name: m/a\n    geometry: {layers: 1, kv_heads: 1, head_dim: 8, "
                   "tokens_per_page: 16, dtype: fp16}\n",
               9, "pools[1].name", "duplicate pool name");
  expect_error(head + two +
                   "  - name: m\n    geometry: {layers: 1, kv_heads: 1, head_dim: 8, "
                   "tokens_per_page: 16, dtype: fp16}\n",
               9, "pools[1].name", "duplicate pool name");
  // Tenants list the model, not its groups.
  expect_error(head + two + "tenants:\n  - {name: t, uids: [7], pools: [m/a]}\n", 10,
               "tenants[0].pools[0]", "no pool is named");
}

TEST(ConfigTest, PoolAttentionKindAndWindow) {
  const Config absent = parse_ok(with_pools(""));
  EXPECT_EQ(absent.pools[0].geometry.kind, AttentionKind::full);
  EXPECT_EQ(absent.pools[0].geometry.window, 0u);
  const std::string sliding =
      std::string(kPools) + "      dtype: fp16\n      kind: sliding\n      window: 4096\n";
  const Config c = parse_ok(sliding);
  EXPECT_EQ(c.pools[0].geometry.kind, AttentionKind::sliding);
  EXPECT_EQ(c.pools[0].geometry.window, 4096u);
  // Same pages, other identity: the pools differ, the sizes do not.
  EXPECT_NE(c.pools, absent.pools);
  EXPECT_EQ(page_data_bytes(c.pools[0].geometry), page_data_bytes(absent.pools[0].geometry));
  const Config chunked = parse_ok(std::string(kPools) +
                                  "      dtype: fp16\n      kind: chunked\n      window: 8192\n");
  EXPECT_EQ(chunked.pools[0].geometry.kind, AttentionKind::chunked);
  // An MLA cache: one vector of head_dim a token and layer, half the bytes of K and V.
  std::string latent(kPools);
  latent.replace(latent.find("kv_heads: 2"), 11, "kv_heads: 1");
  const Config mla = parse_ok(latent + "      dtype: bf16\n      kind: latent\n");
  EXPECT_EQ(mla.pools[0].geometry.kind, AttentionKind::latent);
  EXPECT_EQ(page_data_bytes(mla.pools[0].geometry), 2u * 16 * 64 * 2);
}

TEST(ConfigErrorTest, PoolAttentionKindAndWindow) {
  const std::string base = std::string(kPools) + "      dtype: fp16\n";
  expect_error(base + "      kind: local\n      window: 8\n", 10, "pools[0].geometry.kind",
               "\"local\" is not one of full, sliding, chunked, latent");
  expect_error(base + "      kind: latent\n", 4, "pools[0].geometry",
               "kv_heads 2 on a latent geometry: an MLA cache holds one vector per token");
  expect_error(base + "      kind: latent\n      window: 64\n", 11, "pools[0].geometry.window",
               "this geometry's kind is latent");
  expect_error(base + "      window: 128\n", 10, "pools[0].geometry.window",
               "a window needs kind: sliding");
  expect_error(base + "      kind: sliding\n", 4, "pools[0].geometry",
               "kind sliding needs a window");
  expect_error(base + "      kind: chunked\n      window: 0\n", 11, "pools[0].geometry.window",
               "at least 1");
}

// Two pools of one shape, lines 1-7, for precision before eviction: `recent` (line 2) names its
// evictions' pool on line 4 (`into`) and has `dtype16`; `older` has `dtype8` and `more` after it.
std::string converting(std::string_view into, std::string_view dtype16 = "bf16",
                       std::string_view dtype8 = "fp8_e4m3", std::string_view more = "") {
  return std::string("pools:\n  - name: recent\n    capacity: 8 pages\n") +
         "    convert_evictions_to: " + std::string(into) +
         "\n    geometry: {layers: 2, kv_heads: 2, head_dim: 64, tokens_per_page: 16, dtype: " +
         std::string(dtype16) +
         "}\n  - name: older\n    capacity: 16 pages\n"
         "    geometry: {layers: 2, kv_heads: 2, head_dim: 64, tokens_per_page: 16, dtype: " +
         std::string(dtype8) + "}\n" + std::string(more);
}

TEST(ConfigTest, ConvertEvictionsTo) {
  const Config c = parse_ok(converting("older", "bf16", "fp8_e4m3", "    layout: layer_major\n"));
  EXPECT_EQ(c.pools.at(0).convert_evictions_to, "older");
  EXPECT_EQ(c.pools.at(0).convert_at.text.empty(), false);
  EXPECT_EQ(c.pools.at(1).convert_evictions_to, "");
  // fp16 into int8; the 8-bit pool may keep a host tier.
  const Config i8 = parse_ok(converting("older", "fp16", "int8", "    host_tier: 32 pages\n"));
  EXPECT_EQ(i8.pools.at(0).convert_evictions_to, "older");
}

TEST(ConfigErrorTest, ConvertEvictionsToNamesTheKeyAndTheCause) {
  const std::string key = "pools[0].convert_evictions_to";
  expect_error(converting("nowhere"), 4, key, "no pool is named \"nowhere\"");
  expect_error(converting("recent"), 4, key, "names this pool itself");
  // The precisions: 16 bits down to 8, never the other way.
  expect_error(converting("older", "fp8_e4m3", "fp8_e4m3"), 4, key,
               "this pool's dtype is fp8_e4m3: only a 16-bit pool");
  expect_error(converting("older", "bf16", "fp16"), 4, key,
               "pool \"older\" (pools[1]) has dtype fp16: the target holds 8-bit pages");
  std::string wider = converting("older");
  wider.replace(wider.rfind("head_dim: 64"), 12, "head_dim: 128");
  expect_error(wider, 4, key, "has another shape");
  std::string sliding = converting("older");
  sliding.replace(sliding.rfind("dtype: fp8_e4m3"), 15,
                  "dtype: fp8_e4m3, kind: sliding, window: 64");
  expect_error(sliding, 4, key, "has another shape");
  expect_error(converting("older", "bf16", "fp8_e4m3", "    convert_evictions_to: recent\n"), 4,
               key, "converts its own evictions (to \"recent\"); conversions do not chain");
  std::string both = converting("older");
  both.insert(both.find("    convert_evictions_to"), "    host_tier: 8 pages\n");
  expect_error(both, 5, key, "this pool also has a host_tier");
  expect_error(converting("older", "bf16", "fp8_e4m3", "    hash_scheme: vllm-sha256-cbor/1\n"), 4,
               key, "names blocks with vllm-sha256-cbor/1");
  // A tenant that may read the 8-bit pool but not this one would see this pool's blocks there.
  expect_error(converting("older", "bf16", "fp8_e4m3",
                          "tenants:\n  - name: a\n    pools: [recent]\n"
                          "  - name: b\n    pools: [older]\n"),
               4, key, "tenant \"b\" may use pool \"older\" (pools[1]) but not this pool");
  parse_ok(converting("older", "bf16", "fp8_e4m3",
                      "tenants:\n  - name: a\n    pools: [recent, older]\n"));
  // The rule a reload is held to, on the config it would run: tenants change live, the
  // conversions only at a restart.
  Config running = parse_ok(converting("older", "bf16", "fp8_e4m3",
                                       "tenants:\n  - name: a\n    pools: [recent, older]\n"));
  EXPECT_EQ(conversion_tenancy_error(running), "");
  running.tenants.push_back(TenantConfig{"b", {}, {}, {"older"}});
  EXPECT_EQ(conversion_tenancy_error(running),
            "pools.recent.convert_evictions_to: tenant \"b\" may use pool \"older\" (pools[1]) "
            "but not this pool: converted pages would show it this pool's blocks");
  running.pools[0].convert_evictions_to.clear();
  EXPECT_EQ(conversion_tenancy_error(running), "");
  // A hybrid model's groups evict together.
  expect_error(std::string(kPools) +
                   "      dtype: bf16\n    convert_evictions_to: b\n"
                   "    groups:\n      - {name: g, kind: sliding, window: 64}\n",
               10, "pools[0].convert_evictions_to", "a hybrid model's groups evict together");
}

}  // namespace
}  // namespace kvpool::daemon
