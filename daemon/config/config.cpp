// kvpoold configuration (see config.h): the schema (the known keys of each section, each
// section's values and cross-checks), the built-in defaults, and parsing and loading a config
// file. Reading the YAML tree (lines, paths, checked scalars) is in config_yaml.cpp, capacity
// strings ("1GiB", "4096 pages", "40%") in config_capacity.cpp.
#include "daemon/config/config.h"

#include <fcntl.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <set>
#include <span>
#include <utility>

#include <yaml-cpp/yaml.h>

#include "common/byte_units.h"
#include "common/paths.h"
#include "daemon/config/config_keys.h"
#include "daemon/config/config_yaml.h"
#include "daemon/config/listen_address.h"
#include "daemon/config/node_address.h"
#include "daemon/core/eviction_policy.h"
#include "daemon/core/types.h"
#include "kernels/paged_kv.h"

namespace kvpool::daemon {

namespace {

using config_yaml::kind_of;
using config_yaml::line_of;
using config_yaml::NodeReader;
using config_yaml::ParseFailure;
using config_yaml::quoted;
using config_yaml::Value;

constexpr size_t kMaxConfigBytes = size_t{4} << 20;
constexpr size_t kMaxSocketPathBytes = sizeof(sockaddr_un::sun_path) - 1;

// Each mapping's keys, from the key table (config_keys.h).
const std::vector<std::string_view> kRootKeys = keys_under("");
const std::vector<std::string_view> kSocketKeys = keys_under("socket.");
const std::vector<std::string_view> kLimitKeys = keys_under("limits.");
const std::vector<std::string_view> kPoolKeys = keys_under("pools[].");
const std::vector<std::string_view> kGeometryKeys = keys_under("pools[].geometry.");
const std::vector<std::string_view> kGroupKeys = keys_under("pools[].groups[].");
const std::vector<std::string_view> kRemoteTierKeys = keys_under("pools[].remote_tier.");
const std::vector<std::string_view> kTenantKeys = keys_under("tenants[].");
const std::vector<std::string_view> kLoggingKeys = keys_under("logging.");
const std::vector<std::string_view> kMetricsKeys = keys_under("metrics.");
const std::vector<std::string_view> kEventsKeys = keys_under("events.");
// KV groups one hybrid model may have (Gemma-3, gpt-oss and Llama-4 have two).
constexpr size_t kMaxGroups = 8;
constexpr std::string_view kLayouts[] = {"page_major", "layer_major"};
// HashScheme names: BlockHasher's (SHA-256) and VllmBlockHasher's.
constexpr std::string_view kHashSchemes[] = {"kvpool-sha256/1", "vllm-sha256-cbor/1"};
constexpr uint64_t kMinBufferedBytes = uint64_t{16} << 20;
constexpr uint64_t kMaxHelloTimeoutMs = uint64_t{3600} * 1000;
constexpr uint64_t kMaxPinTtlMs = uint64_t{24} * 3600 * 1000;
constexpr std::string_view kZmqPayloads[] = {"array", "map"};
constexpr std::string_view kZmqBlockHashes[] = {"bytes", "uint64"};
constexpr std::string_view kZmqModes[] = {"bind", "connect", "auto"};
constexpr uint64_t kMaxZmqBatches = 1000000;
constexpr uint64_t kMinZmqQueueBytes = uint64_t{1} << 20;
constexpr uint64_t kMaxZmqConnections = 65536;
constexpr uint64_t kMaxRingEvents = uint64_t{1} << 24;

constexpr std::string_view kBackends[] = {"auto", "host", "cuda-vmm", "cuda-ipc", "fake-device"};
constexpr std::string_view kLogLevels[] = {"debug", "info", "warn", "error"};

wire::Error make_error(std::string message) {
  return wire::Error{Status{Errc::invalid_argument}, std::move(message)};
}

class Parser : private NodeReader {
 public:
  using NodeReader::NodeReader;

  Config parse(const YAML::Node& root) {
    Config config = default_config();
    const Value top{root, "", line_of(root, 1)};
    if (!root.IsMap()) fail(top, "the config must be a mapping of keys, not " + kind_of(root));
    auto f = fields(top, kRootKeys);
    if (auto* v = find(f, "socket")) parse_socket(*v, config);
    if (auto* v = find(f, "backend")) config.backend = get_choice(*v, kBackends);
    if (auto* v = find(f, "device")) {
      config.device = static_cast<int>(get_uint(*v, 0, std::numeric_limits<int>::max()));
    }
    if (auto* v = find(f, "max_segment_bytes")) config.max_segment_bytes = parse_byte_size(*v);
    if (auto* v = find(f, "memory_budget")) {
      require_scalar(*v, "a size in bytes or a percentage");
      Capacity c;
      if (std::string err = parse_capacity(v->node.Scalar(), c); !err.empty()) fail(*v, err);
      if (c.unit == Capacity::Unit::pages) fail(*v, "expected bytes or a percentage, not pages");
      config.memory_budget = c;
      config.memory_budget_at.text = location(*v);
    }
    if (auto* v = find(f, "limits")) parse_limits(*v, config);
    if (auto* v = find(f, "logging")) {
      auto lf = fields(*v, kLoggingKeys);
      if (auto* level = find(lf, "level")) config.log_level = get_choice(*level, kLogLevels);
    }
    // (pool index, its convert_evictions_to key), checked once pools and tenants are known.
    std::vector<std::pair<size_t, Value>> conversions;
    if (auto* v = find(f, "pools")) parse_pools(*v, config, conversions);
    if (auto* v = find(f, "memory_budget")) check_budget(*v, config);
    if (auto* v = find(f, "tenants")) parse_tenants(*v, config);
    if (auto* v = find(f, "default_tenant")) {
      config.default_tenant = get_string(*v);
      check_default_tenant(*v, config);
    }
    for (const auto& [index, key] : conversions)
      check_conversion(key, config, config.pools[index]);
    if (auto* v = find(f, "admin_group")) config.admin_group = get_string(*v);
    if (auto* v = find(f, "metrics")) parse_metrics(*v, config);
    if (auto* v = find(f, "events")) parse_events(*v, config);
    return config;
  }

 private:
  void parse_socket(const Value& v, Config& config) const {
    auto f = fields(v, kSocketKeys);
    if (auto* p = find(f, "path")) {
      config.socket_path = get_string(*p, "an absolute path");
      if (config.socket_path.empty()) fail(*p, "must not be empty");
      if (config.socket_path.front() != '/') fail(*p, "must be an absolute path");
      if (config.socket_path.size() > kMaxSocketPathBytes) {
        fail(*p, "is " + std::to_string(config.socket_path.size()) +
                     " bytes long; a Unix socket path holds at most " +
                     std::to_string(kMaxSocketPathBytes));
      }
    }
    if (auto* m = find(f, "mode")) config.socket_mode = get_mode(*m);
    if (auto* g = find(f, "group")) config.socket_group = get_string(*g);
  }

  void parse_limits(const Value& v, Config& config) const {
    constexpr uint64_t kMax64 = std::numeric_limits<uint64_t>::max();
    auto f = fields(v, kLimitKeys);
    if (auto* m = find(f, "max_sessions")) {
      config.max_sessions = static_cast<uint32_t>(get_uint(*m, 1, UINT32_MAX));
    }
    if (auto* m = find(f, "max_sessions_per_uid")) {
      config.max_sessions_per_uid = static_cast<uint32_t>(get_uint(*m, 0, UINT32_MAX));
    }
    if (auto* m = find(f, "hello_timeout_ms")) {
      config.hello_timeout_ms = static_cast<uint32_t>(get_uint(*m, 1, kMaxHelloTimeoutMs));
    }
    if (auto* m = find(f, "max_buffered_bytes")) {
      config.max_buffered_bytes = parse_byte_size(*m);
      if (config.max_buffered_bytes < kMinBufferedBytes) {
        fail(*m, "must be at least 16MiB (two full frames and their replies)");
      }
    }
    if (auto* m = find(f, "max_pages_per_session")) {
      config.max_pages_per_session = get_uint(*m, 0, kMax64);
    }
    if (auto* m = find(f, "max_pages_per_tenant")) {
      config.max_pages_per_tenant = get_uint(*m, 0, kMax64);
    }
    if (auto* m = find(f, "max_pin_ttl_ms")) {
      config.max_pin_ttl_ms = static_cast<uint32_t>(get_uint(*m, 0, kMaxPinTtlMs));
    }
    if (auto* m = find(f, "max_pinned_pages_per_tenant")) {
      config.max_pinned_pages_per_tenant = static_cast<uint32_t>(get_uint(*m, 0, UINT32_MAX));
    }
    if (auto* m = find(f, "max_pinned_pool_percent")) {
      config.max_pinned_pool_percent = static_cast<uint32_t>(get_uint(*m, 1, 100));
    }
  }

  std::string get_name(const Value& v) const {
    std::string name = get_string(v, "a name");
    if (name.empty()) fail(v, "must not be empty");
    if (name.size() > wire::kMaxNameBytes) {
      fail(v, "is longer than " + std::to_string(wire::kMaxNameBytes) + " bytes");
    }
    return name;
  }

  Geometry parse_geometry(const Value& v) const {
    auto f = fields(v, kGeometryKeys, /*null_ok=*/false);
    Geometry g;
    g.layers = static_cast<uint32_t>(get_uint(required(f, v, "layers"), 1, UINT32_MAX));
    g.kv_heads = static_cast<uint32_t>(get_uint(required(f, v, "kv_heads"), 1, UINT32_MAX));
    g.head_dim = static_cast<uint32_t>(get_uint(required(f, v, "head_dim"), 1, UINT32_MAX));
    g.tokens_per_page =
        static_cast<uint32_t>(get_uint(required(f, v, "tokens_per_page"), 1, UINT32_MAX));
    const Value& dtype = required(f, v, "dtype");
    const std::string name = get_string(dtype, "one of fp16, bf16, fp8_e4m3 (fp8), int8");
    const auto d = parse_dtype(name);
    if (!d) fail(dtype, quoted(name) + " is not one of fp16, bf16, fp8_e4m3 (fp8), int8");
    g.dtype = *d;
    if (const Value* kind = find(f, "kind")) {
      const std::string k = get_string(*kind, "one of full, sliding, chunked, latent");
      const auto parsed = parse_attention_kind(k);
      if (!parsed) fail(*kind, quoted(k) + " is not one of full, sliding, chunked, latent");
      g.kind = *parsed;
    }
    if (const Value* window = find(f, "window")) {
      g.window = static_cast<uint32_t>(get_uint(*window, 1, UINT32_MAX));
      if (g.kind == AttentionKind::full || g.kind == AttentionKind::latent) {
        fail(*window,
             "a window needs kind: sliding (the last WINDOW tokens) or chunked (chunks "
             "of WINDOW tokens); this geometry's kind is " +
                 std::string(attention_kind_name(g.kind)));
      }
    } else if (g.kind == AttentionKind::sliding || g.kind == AttentionKind::chunked) {
      fail(v, "kind " + std::string(attention_kind_name(g.kind)) +
                  " needs a window: the tokens a layer's queries see");
    }
    if (std::string err = validate(g); !err.empty()) fail(v, err);
    return g;
  }

  uint64_t parse_byte_size(const Value& v) const {
    require_scalar(v, "a size in bytes");
    Capacity c;
    if (std::string err = parse_capacity(v.node.Scalar(), c); !err.empty()) fail(v, err);
    if (c.unit != Capacity::Unit::bytes) fail(v, "expected bytes, like \"2GiB\"");
    return c.value;
  }

  Capacity parse_pool_capacity(const Value& v, const Geometry& g) const {
    require_scalar(v, "a capacity");
    Capacity c;
    if (std::string err = parse_capacity(v.node.Scalar(), c); !err.empty()) fail(v, err);
    check_pages(v, c, g);
    return c;
  }

  // A capacity in bytes or pages must hold at least one page and no more than a pool can.
  void check_pages(const Value& v, const Capacity& c, const Geometry& g) const {
    const uint64_t per_page = page_data_bytes(g) + page_scale_bytes(g);
    uint64_t pages = c.value;
    if (c.unit == Capacity::Unit::bytes) {
      pages = c.value / per_page;
      if (pages == 0) {
        fail(v, std::to_string(c.value) + " bytes hold no whole page of " +
                    std::to_string(per_page) + " bytes");
      }
    }
    if (c.unit != Capacity::Unit::fraction && pages > core::kMaxPages) {
      fail(v, std::to_string(pages) + " pages exceed the " + std::to_string(core::kMaxPages) +
                  " a pool can hold");
    }
    if (c.unit == Capacity::Unit::pages && pages > (uint64_t{1} << 63) / per_page) {
      fail(v, std::to_string(pages) + " pages of " + std::to_string(per_page) +
                  " bytes exceed 2^63 bytes");
    }
  }

  RemoteTierConfig parse_remote_tier(const Value& v) const {
    auto f = fields(v, kRemoteTierKeys, /*null_ok=*/false);
    RemoteTierConfig r;
    const Value& cluster = required(f, v, "cluster");
    for (const Value& node : items(cluster)) {
      const std::string text = get_string(node, "a node, \"HOST:PORT\"");
      if (!parse_node_address(text)) {
        fail(node, quoted(text) + " is not HOST:PORT (a port from 1 to 65535)");
      }
      r.cluster.push_back(text);
    }
    if (r.cluster.empty()) fail(cluster, "must list at least one node of the cluster");
    if (auto* n = find(f, "namespace")) {
      r.key_namespace = get_string(*n);
      if (r.key_namespace.empty() || r.key_namespace.size() > 64 ||
          r.key_namespace.find_first_of(" :{}\t\n") != std::string::npos) {
        fail(*n, "must be 1 to 64 characters without spaces, ':', '{' or '}'");
      }
    }
    if (auto* t = find(f, "ttl_s")) r.ttl_s = static_cast<uint32_t>(get_uint(*t, 0, INT32_MAX));
    static constexpr std::array<std::string_view, 3> kWrites = {"on_publish", "on_demote", "off"};
    if (auto* w = find(f, "write")) {
      const std::string choice = get_choice(*w, kWrites);
      for (const auto mode : {RemoteTierConfig::Write::on_publish,
                              RemoteTierConfig::Write::on_demote, RemoteTierConfig::Write::off}) {
        if (choice == remote_write_name(mode)) r.write = mode;
      }
    }
    static constexpr std::array<std::string_view, 2> kAdmits = {"all", "reused"};
    if (auto* a = find(f, "admit")) {
      r.admit = get_choice(*a, kAdmits) == "reused" ? RemoteTierConfig::Admit::reused
                                                    : RemoteTierConfig::Admit::all;
    }
    if (auto* t = find(f, "timeout_ms")) {
      r.timeout_ms = static_cast<uint32_t>(get_uint(*t, 1, 60'000));
    }
    if (auto* b = find(f, "batch_pages")) {
      r.batch_pages = static_cast<uint32_t>(get_uint(*b, 1, 4096));
    }
    if (auto* s = find(f, "staging_pages")) {
      r.staging_pages = static_cast<uint32_t>(get_uint(*s, 1, 1u << 20));
    }
    if (r.batch_pages > r.staging_pages) {
      fail(v, "batch_pages (" + std::to_string(r.batch_pages) + ") exceeds staging_pages (" +
                  std::to_string(r.staging_pages) + "): a batch must fit in the staging memory");
    }
    return r;
  }

  void parse_pools(const Value& v, Config& config,
                   std::vector<std::pair<size_t, Value>>& conversions) const {
    const std::vector<Value> list = items(v);
    if (list.empty()) fail(v, "must list at least one pool");
    config.pools.clear();
    const PoolConfig defaults = default_config().pools.front();
    for (const Value& item : list) {
      auto f = fields(item, kPoolKeys, /*null_ok=*/false);
      PoolConfig pool;
      const Value& name = required(f, item, "name");
      pool.name = get_name(name);
      for (const PoolConfig& other : config.pools) {
        if (other.name == pool.name || other.model == pool.name) {
          fail(name, "duplicate pool name " + quoted(pool.name));
        }
      }
      if (auto* p = find(f, "policy")) pool.policy = get_choice(*p, core::policy_names());
      if (auto* h = find(f, "hash_scheme")) pool.hash_scheme = get_choice(*h, kHashSchemes);
      if (auto* b = find(f, "share_between_tenants")) pool.share_between_tenants = get_bool(*b);
      if (auto* l = find(f, "layout")) pool.layout = *parse_layout(get_choice(*l, kLayouts));
      pool.geometry = parse_geometry(required(f, item, "geometry"));
      pool.capacity = defaults.capacity;
      if (auto* c = find(f, "capacity")) {
        pool.capacity = parse_pool_capacity(*c, pool.geometry);
        pool.capacity_at.text = location(*c);
      } else {
        const Value absent{item.node, item.path + ".capacity (default 256MiB)", item.line};
        check_pages(absent, pool.capacity, pool.geometry);
        pool.capacity_at.text = location(absent);
      }
      if (auto* h = find(f, "host_tier")) {
        pool.host_tier = parse_pool_capacity(*h, pool.geometry);
        pool.host_tier_at.text = location(*h);
      }
      if (auto* c = find(f, "convert_evictions_to")) {
        pool.convert_evictions_to = get_name(*c);
        pool.convert_at.text = location(*c);
        conversions.emplace_back(config.pools.size(), *c);
      }
      if (auto* r = find(f, "remote_tier")) {
        pool.remote_tier = parse_remote_tier(*r);
        pool.remote_tier_at.text = location(*r);
        if (!pool.convert_evictions_to.empty()) {
          fail(*r,
               "this pool also converts its evictions (convert_evictions_to); give the remote "
               "tier to the 8-bit pool, or drop one");
        }
      }
      if (auto* m = find(f, "max_capacity")) {
        pool.max_capacity = parse_pool_capacity(*m, pool.geometry);
        pool.max_capacity_at.text = location(*m);
        if (pool.max_capacity->unit == Capacity::Unit::fraction) {
          fail(*m, "expected pages or bytes (an elastic pool's limits are absolute)");
        }
      }
      if (auto* m = find(f, "min_capacity")) {
        if (!pool.max_capacity) fail(*m, "min_capacity needs max_capacity (an elastic pool)");
        pool.min_capacity = parse_pool_capacity(*m, pool.geometry);
        if (pool.min_capacity->unit == Capacity::Unit::fraction) {
          fail(*m, "expected pages or bytes (an elastic pool's limits are absolute)");
        }
      }
      if (auto* m = find(f, "segment_size")) {
        if (!pool.max_capacity && find(f, "groups") == nullptr) {
          fail(*m, "segment_size needs max_capacity (an elastic pool) or groups");
        }
        pool.segment_size = parse_byte_size(*m);
        pool.segment_size_at.text = location(*m);
        if (pool.segment_size == 0) fail(*m, "must be at least one byte");
      }
      if (auto* b = find(f, "grow_ahead")) {
        if (!pool.max_capacity && find(f, "groups") == nullptr) {
          fail(*b, "grow_ahead needs max_capacity (an elastic pool) or groups");
        }
        pool.grow_ahead = get_bool(*b);
      }
      if (pool.max_capacity) check_elastic(pool, f);
      if (auto* g = find(f, "groups")) {
        for (PoolConfig& member : expand_groups(*g, item, f, pool)) {
          for (const PoolConfig& other : config.pools) {
            if (other.name == member.name || other.name == pool.name) {
              fail(name, "pool " + quoted(other.name) + " is named twice (a group of model " +
                             quoted(pool.name) + " is pool " + quoted(member.name) + ")");
            }
          }
          config.pools.push_back(std::move(member));
        }
        continue;
      }
      config.pools.push_back(std::move(pool));
    }
  }

  // A hybrid model (pools[].groups): one pool per KV group, named MODEL/GROUP, with the model's
  // keys and the group's geometry (the model's geometry with the group's keys over it). Each is
  // elastic from one segment up to the model's capacity, which all of them share (PoolSet).
  std::vector<PoolConfig> expand_groups(const Value& v, const Value& entry, const Fields& f,
                                        const PoolConfig& model) const {
    // The capacity key, or the pool's entry when it keeps the default.
    const Value* capacity_key = find(f, "capacity");
    const Value& capacity_at = capacity_key != nullptr ? *capacity_key : entry;
    const auto refuse = [&](std::string_view key, const std::string& why) {
      if (const Value* k = find(f, key)) fail(*k, why);
    };
    if (model.remote_tier && model.remote_tier->write == RemoteTierConfig::Write::on_demote) {
      refuse("remote_tier",
             "write: on_demote does not suit a hybrid model: when a full-attention group evicts "
             "a block, the other groups drop theirs uncopied, so the cluster would hold blocks "
             "no group set can use; use write: on_publish (every group's blocks are written "
             "when published)");
    }
    refuse("convert_evictions_to",
           "a hybrid model's groups evict together (a block serves no hit without every "
           "group's page); converting one group's evictions is not supported");
    refuse("max_capacity",
           "a pool with groups is sized by its capacity, which its groups share (each grows "
           "into it by segments); drop max_capacity");
    refuse("min_capacity",
           "a pool with groups keeps at least one segment per group; drop "
           "min_capacity");
    if (model.capacity.unit == Capacity::Unit::pages) {
      fail(*find(f, "capacity"),
           "a pool with groups takes its capacity in bytes or a percentage: its groups' pages "
           "differ in size");
    }
    const std::vector<Value> list = items(v);
    if (list.empty()) fail(v, "must list at least one group");
    if (list.size() > kMaxGroups) {
      fail(v, "lists " + std::to_string(list.size()) + " groups; at most " +
                  std::to_string(kMaxGroups));
    }
    std::vector<PoolConfig> members;
    std::vector<std::string> names;
    uint64_t start = 0;  // the groups' first segments
    for (const Value& item : list) {
      auto gf = fields(item, kGroupKeys, /*null_ok=*/false);
      const Value& name_at = required(gf, item, "name");
      std::string name = get_name(name_at);
      if (name.find('/') != std::string::npos) fail(name_at, "must not contain '/'");
      if (std::find(names.begin(), names.end(), name) != names.end()) {
        fail(name_at, "duplicate group name " + quoted(name));
      }
      PoolConfig m = model;
      m.name = model.name + "/" + name;
      if (m.name.size() > wire::kMaxNameBytes) {
        fail(name_at, "makes the pool name " + quoted(m.name) + ", longer than " +
                          std::to_string(wire::kMaxNameBytes) + " bytes");
      }
      m.geometry = group_geometry(item, gf, model.geometry);
      const uint64_t per_page = page_data_bytes(m.geometry) + page_scale_bytes(m.geometry);
      const uint64_t segment = std::max(m.segment_size, per_page);
      start += segment;
      if (model.capacity.unit == Capacity::Unit::bytes && model.capacity.value < start) {
        fail(capacity_at, "is " + human_bytes(model.capacity.value) +
                              ": too small for a first segment of each group (" +
                              human_bytes(start) +
                              " so far; lower segment_size or raise capacity)");
      }
      if (model.capacity.unit == Capacity::Unit::bytes &&
          (model.capacity.value + segment - 1) / segment > wire::kMaxSegments) {
        fail(capacity_at, "is " + human_bytes(model.capacity.value) +
                              ": a group may grow into all of it, " + "which takes more than " +
                              std::to_string(wire::kMaxSegments) + " segments of " +
                              human_bytes(segment) + " (raise segment_size)");
      }
      m.model = model.name;
      m.group = static_cast<uint16_t>(members.size());
      m.model_budget = model.capacity;
      m.capacity = Capacity{Capacity::Unit::bytes, std::max(m.segment_size, per_page), 0.0};
      names.push_back(std::move(name));
      members.push_back(std::move(m));
    }
    for (PoolConfig& m : members)
      m.model_groups = names;
    if (model.host_tier) split_host_tier(*find(f, "host_tier"), members);
    if (model.remote_tier) fit_remote_batches(*find(f, "remote_tier"), members);
    return members;
  }

  // A hybrid model's remote tier: a lookup fetches a sliding or chunked group's blocks in one
  // batch. batch_pages must hold the blocks one window spans (window / tokens_per_page + 1);
  // left at its default it is raised to two windows' (a block the cluster lost in the last
  // window then shortens the hit instead of ending it), and staging_pages with it.
  void fit_remote_batches(const Value& at, std::vector<PoolConfig>& members) const {
    uint32_t window_blocks = 0;
    std::string group;
    for (const PoolConfig& m : members) {
      if (m.geometry.window == 0) continue;
      const uint32_t blocks = m.geometry.window / m.geometry.tokens_per_page + 1;
      if (blocks > window_blocks) {
        window_blocks = blocks;
        group = m.model_groups[m.group];
      }
    }
    RemoteTierConfig& r = *members.front().remote_tier;
    const auto rf = fields(at, kRemoteTierKeys, /*null_ok=*/false);
    const std::string why = "group " + quoted(group) + "'s window spans " +
                            std::to_string(window_blocks) +
                            " blocks, which one lookup fetches together";
    if (const Value* b = find(rf, "batch_pages")) {
      if (r.batch_pages < window_blocks) {
        fail(*b, "is " + std::to_string(r.batch_pages) + ": " + why + "; raise it to at least " +
                     std::to_string(window_blocks));
      }
      return;
    }
    const uint32_t want = 2 * window_blocks;
    if (want <= r.batch_pages) return;
    if (const Value* st = find(rf, "staging_pages"); st != nullptr && r.staging_pages < want) {
      fail(*st, "is " + std::to_string(r.staging_pages) + ": " + why +
                    " (two windows by default: batch_pages rises to " + std::to_string(want) +
                    "); raise it to " + std::to_string(want) + " or give batch_pages");
    }
    for (PoolConfig& m : members) {
      m.remote_tier->batch_pages = want;
      m.remote_tier->staging_pages = std::max(m.remote_tier->staging_pages, want);
    }
  }

  // A hybrid model's host tier: one per group, each keeping as many blocks (a hybrid hit needs
  // a block in every group, so equal counts waste no group's slots on blocks another group has
  // lost). In pages: that many blocks per group; in bytes: the blocks all groups' pages fit.
  void split_host_tier(const Value& at, std::vector<PoolConfig>& members) const {
    const Capacity& h = *members.front().host_tier;
    if (h.unit == Capacity::Unit::fraction) {
      fail(at,
           "a pool with groups takes its host_tier in pages (blocks kept in every group) or "
           "bytes, not a percentage");
    }
    uint64_t slots = h.value;
    if (h.unit == Capacity::Unit::bytes) {
      uint64_t block = 0;  // one block in every group
      for (const PoolConfig& m : members)
        block += page_data_bytes(m.geometry) + page_scale_bytes(m.geometry);
      slots = h.value / block;
      if (slots == 0) {
        fail(at, "is " + human_bytes(h.value) + ", less than one block in every group (" +
                     human_bytes(block) + ")");
      }
    }
    for (PoolConfig& m : members)
      m.host_tier = Capacity{Capacity::Unit::pages, slots, 0.0};
  }

  // A group's geometry: the model's, with the group's keys over it. A group that names its kind
  // names its window with it (a full group has none).
  Geometry group_geometry(const Value& item, const Fields& gf, const Geometry& base) const {
    Geometry g = base;
    const auto dim = [&](std::string_view key, uint32_t& out) {
      if (const Value* k = find(gf, key)) out = static_cast<uint32_t>(get_uint(*k, 1, UINT32_MAX));
    };
    dim("layers", g.layers);
    dim("kv_heads", g.kv_heads);
    dim("head_dim", g.head_dim);
    if (const Value* kind = find(gf, "kind")) {
      const std::string k = get_string(*kind, "one of full, sliding, chunked, latent");
      const auto parsed = parse_attention_kind(k);
      if (!parsed) fail(*kind, quoted(k) + " is not one of full, sliding, chunked, latent");
      g.kind = *parsed;
      g.window = 0;
    }
    if (const Value* window = find(gf, "window")) {
      if (g.kind == AttentionKind::full || g.kind == AttentionKind::latent) {
        fail(*window, "a window needs kind: sliding or chunked; this group's kind is " +
                          std::string(attention_kind_name(g.kind)));
      }
      g.window = static_cast<uint32_t>(get_uint(*window, 1, UINT32_MAX));
    } else if (g.window == 0 &&
               (g.kind == AttentionKind::sliding || g.kind == AttentionKind::chunked)) {
      fail(item, "kind " + std::string(attention_kind_name(g.kind)) +
                     " needs a window: the tokens a layer's queries see");
    }
    if (std::string err = validate(g); !err.empty()) fail(item, err);
    return g;
  }

  // A memory_budget in bytes must hold what the elastic pools start with: their capacity in
  // whole segments of segment_size (the backend's granularity may round a segment up further,
  // which only the start can tell; it names that case).
  void check_budget(const Value& v, const Config& config) const {
    const Capacity& budget = *config.memory_budget;
    if (budget.unit != Capacity::Unit::bytes) return;
    uint64_t start = 0;
    for (const PoolConfig& pool : config.pools) {
      const bool group = !pool.model.empty();  // a hybrid model's group starts at one segment
      if ((!pool.max_capacity && !group) || pool.capacity.unit == Capacity::Unit::fraction) {
        continue;
      }
      const uint64_t stride = page_data_bytes(pool.geometry);
      const uint64_t per_page = stride + page_scale_bytes(pool.geometry);
      const uint64_t pages = pool.capacity.unit == Capacity::Unit::pages
                                 ? pool.capacity.value
                                 : pool.capacity.value / per_page;
      // The start maps whole segments (at least segment_size each; more where the backend's
      // granularity rounds them up), never more than the pool's whole pages region.
      const uint64_t max_pages = group ? UINT64_MAX / stride
                                 : pool.max_capacity->unit == Capacity::Unit::pages
                                     ? pool.max_capacity->value
                                     : pool.max_capacity->value / per_page;
      const uint64_t segment = std::max(pool.segment_size, stride);
      start += std::min((pages * stride + segment - 1) / segment * segment, max_pages * stride);
    }
    if (start > budget.value) {
      fail(v, "is " + human_bytes(budget.value) + ", less than the " + human_bytes(start) +
                  " the elastic pools start with (their capacity); raise it or start them "
                  "smaller");
    }
  }

  // An elastic pool's sizes must fit each other, as kvpoold would find at start: capacity ≤
  // max_capacity, min_capacity ≤ both, a segment no larger than the pool's max. Sizes in bytes
  // count whole pages, as the daemon does.
  void check_elastic(const PoolConfig& pool, const Fields& f) const {
    const uint64_t per_page = page_data_bytes(pool.geometry) + page_scale_bytes(pool.geometry);
    auto pages = [&](const Capacity& c) {
      return c.unit == Capacity::Unit::pages ? c.value : c.value / per_page;
    };
    auto said = [&](const Capacity& c) {
      return std::to_string(pages(c)) + " pages" +
             (c.unit == Capacity::Unit::bytes ? " (" + human_bytes(c.value) + ")" : "");
    };
    const uint64_t max_pages = pages(*pool.max_capacity);
    const Value& max_at = *find(f, "max_capacity");
    if (pool.capacity.unit != Capacity::Unit::fraction && pages(pool.capacity) > max_pages) {
      fail(max_at, "is " + said(*pool.max_capacity) + ", below the pool's capacity of " +
                       said(pool.capacity) +
                       "; an elastic pool starts at capacity and grows up "
                       "to max_capacity");
    }
    if (pool.min_capacity) {
      const Value& min_at = *find(f, "min_capacity");
      const uint64_t min_pages = pages(*pool.min_capacity);
      if (min_pages > max_pages) {
        fail(min_at, "is " + said(*pool.min_capacity) + ", above max_capacity (" +
                         said(*pool.max_capacity) + ")");
      }
      if (pool.capacity.unit != Capacity::Unit::fraction && min_pages > pages(pool.capacity)) {
        fail(min_at, "is " + said(*pool.min_capacity) + ", above the pool's capacity of " +
                         said(pool.capacity) +
                         "; a pool never shrinks below min_capacity, so "
                         "it must start at or above it");
      }
    }
    if (const Value* seg = find(f, "segment_size"); seg != nullptr) {
      if (pool.segment_size > max_pages * per_page) {
        fail(*seg, "is " + human_bytes(pool.segment_size) + ", more than the pool's whole " +
                       "max_capacity (" + human_bytes(max_pages * per_page) + ")");
      }
    }
  }

  // A list of uids or gids; `owner` maps each id already claimed to its tenant.
  std::vector<uint32_t> get_ids(const Value& v, std::string_view kind,
                                std::map<uint32_t, std::string>& owner,
                                const std::string& tenant) const {
    std::vector<uint32_t> ids;
    for (const Value& item : items(v)) {
      // (uid_t)-1 means "no id" to the kernel; no peer has it.
      const auto id = static_cast<uint32_t>(get_uint(item, 0, UINT32_MAX - 1));
      auto [it, inserted] = owner.emplace(id, tenant);
      if (!inserted) {
        fail(item,
             std::string(kind) + " " + std::to_string(id) + " is already listed " +
                 (it->second == tenant ? "in this tenant" : "in tenant " + quoted(it->second)));
      }
      ids.push_back(id);
    }
    return ids;
  }

  void parse_tenants(const Value& v, Config& config) const {
    std::map<uint32_t, std::string> uid_owner;
    std::map<uint32_t, std::string> gid_owner;
    std::map<std::string, std::string> pool_user;  // pool → the first tenant listing it
    config.tenants.clear();
    for (const Value& item : items(v)) {
      auto f = fields(item, kTenantKeys, /*null_ok=*/false);
      TenantConfig tenant;
      const Value& name = required(f, item, "name");
      tenant.name = get_name(name);
      for (const TenantConfig& other : config.tenants) {
        if (other.name == tenant.name) fail(name, "duplicate tenant name " + quoted(tenant.name));
      }
      if (auto* u = find(f, "uids")) tenant.uids = get_ids(*u, "uid", uid_owner, tenant.name);
      if (auto* g = find(f, "gids")) tenant.gids = get_ids(*g, "gid", gid_owner, tenant.name);
      if (auto* p = find(f, "pools")) {
        for (const Value& pool_item : items(*p)) {
          std::string pool = get_string(pool_item, "a pool name");
          const bool known =
              std::any_of(config.pools.begin(), config.pools.end(),
                          [&](const PoolConfig& pc) { return pc.tenancy_name() == pool; });
          if (!known) fail(pool_item, "no pool is named " + quoted(pool));
          if (std::find(tenant.pools.begin(), tenant.pools.end(), pool) != tenant.pools.end()) {
            fail(pool_item, "pool " + quoted(pool) + " is listed twice");
          }
          check_sharing(pool_item, config, pool, tenant.name, pool_user);
          tenant.pools.push_back(std::move(pool));
        }
      }
      config.tenants.push_back(std::move(tenant));
    }
  }

  // Every worker of a pool maps all of its memory, so a pool listed by two tenants lets each
  // read and overwrite the other's pages: allowed only where the pool says so.
  void check_sharing(const Value& v, const Config& config, const std::string& pool,
                     const std::string& tenant, std::map<std::string, std::string>& user) const {
    const auto [it, first] = user.emplace(pool, tenant);
    if (first) return;
    const auto pc = std::find_if(config.pools.begin(), config.pools.end(),
                                 [&](const PoolConfig& p) { return p.tenancy_name() == pool; });
    if (pc->share_between_tenants) return;
    fail(v, "pool " + quoted(pool) + " is already used by tenant " + quoted(it->second) +
                "; tenants sharing a pool can read and overwrite each other's pages, so this "
                "needs share_between_tenants: true on pool " +
                quoted(pool) + " (pools[" + std::to_string(pc - config.pools.begin()) + "])");
  }

  // Precision before eviction: `pool`'s evictions become pages of the named 8-bit pool, which
  // must hold the same blocks (same shape, 16 → 8 bits), keep them itself (no chain, no conversion
  // of a model group) and show them to no tenant that cannot read `pool` already.
  void check_conversion(const Value& v, const Config& config, const PoolConfig& pool) const {
    const std::string& target = pool.convert_evictions_to;
    const auto it = std::find_if(config.pools.begin(), config.pools.end(),
                                 [&](const PoolConfig& p) { return p.name == target; });
    if (it == config.pools.end()) fail(v, "no pool is named " + quoted(target));
    const PoolConfig& to = *it;
    const std::string to_at =
        "pool " + quoted(target) + " (pools[" + std::to_string(it - config.pools.begin()) + "])";
    if (to.name == pool.name) fail(v, "names this pool itself");
    if (dtype_is_quantized(pool.geometry.dtype)) {
      fail(v, "this pool's dtype is " + std::string(dtype_name(pool.geometry.dtype)) +
                  ": only a 16-bit pool (fp16, bf16) converts its evictions to 8 bits");
    }
    if (!dtype_is_quantized(to.geometry.dtype)) {
      fail(v, to_at + " has dtype " + std::string(dtype_name(to.geometry.dtype)) +
                  ": the target holds 8-bit pages (fp8_e4m3 or int8)");
    }
    if (!to.model.empty()) fail(v, to_at + " is a group of hybrid model " + quoted(to.model));
    if (!kernels::same_shape(pool.geometry, to.geometry)) {
      fail(v, to_at +
                  " has another shape: layers, kv_heads, head_dim, tokens_per_page, kind "
                  "and window must match this pool's (only dtype and layout may differ)");
    }
    if (!to.convert_evictions_to.empty()) {
      fail(v, to_at + " converts its own evictions (to " + quoted(to.convert_evictions_to) +
                  "); conversions do not chain");
    }
    if (pool.host_tier) {
      fail(v,
           "this pool also has a host_tier; its evictions go to one place: give the host "
           "tier to " +
               to_at + " (16-bit pool → 8-bit pool → host)");
    }
    if (to.hash_scheme != pool.hash_scheme) {
      fail(v,
           to_at + " names blocks with " + to.hash_scheme + ", this pool with " + pool.hash_scheme);
    }
    if (std::string why = conversion_tenancy_error(config, pool); !why.empty()) fail(v, why);
  }

  // Operations, metrics and events ----------------------------------------------------------

  void parse_metrics(const Value& v, Config& config) const {
    auto f = fields(v, kMetricsKeys);
    if (auto* b = find(f, "allow_non_loopback")) config.metrics.allow_non_loopback = get_bool(*b);
    if (auto* b = find(f, "latency_histograms")) config.metrics.latency_histograms = get_bool(*b);
    if (auto* b = find(f, "stats_segment")) config.metrics.stats_segment = get_bool(*b);
    if (auto* l = find(f, "listen")) {
      config.metrics.listen = get_string(*l, "\"HOST:PORT\", or \"\" for no endpoint");
      if (config.metrics.listen.empty()) return;
      ListenAddress address;
      if (std::string err = parse_listen_address(config.metrics.listen, address); !err.empty()) {
        fail(*l, err);
      }
      if (!address.loopback && !config.metrics.allow_non_loopback) {
        fail(*l, quoted(config.metrics.listen) +
                     " is not a loopback address; the metrics endpoint has no authentication, "
                     "so serving it beyond this machine needs metrics.allow_non_loopback: true");
      }
    }
  }

  void parse_events(const Value& v, Config& config) const {
    auto f = fields(v, kEventsKeys);
    if (auto* r = find(f, "ring_events")) {
      config.events.ring_events = static_cast<uint32_t>(get_uint(*r, 16, kMaxRingEvents));
    }
    EventsConfig& e = config.events;
    if (auto* z = find(f, "zmq_endpoint")) {
      e.zmq_endpoint = get_zmq_endpoint(*z);
    }
    if (auto* t = find(f, "zmq_topic")) e.zmq_topic = get_string(*t);
    if (auto* h = find(f, "zmq_block_hash")) e.zmq_block_hash = get_choice(*h, kZmqBlockHashes);
    if (auto* p = find(f, "zmq_payload")) e.zmq_payload = get_choice(*p, kZmqPayloads);
    if (auto* h = find(f, "zmq_send_hwm")) {
      e.zmq_send_hwm = static_cast<uint32_t>(get_uint(*h, 1, kMaxZmqBatches));
    }
    if (auto* q = find(f, "zmq_queue_bytes")) {
      e.zmq_queue_bytes = parse_byte_size(*q);
      if (e.zmq_queue_bytes < kMinZmqQueueBytes) {
        fail(*q, "is " + human_bytes(e.zmq_queue_bytes) + "; at least " +
                     human_bytes(kMinZmqQueueBytes) + " (one full message of 4,096 block hashes)");
      }
    }
    if (auto* m = find(f, "zmq_max_connections")) {
      e.zmq_max_connections = static_cast<uint32_t>(get_uint(*m, 1, kMaxZmqConnections));
    }
    if (auto* b = find(f, "zmq_replay_batches")) {
      e.zmq_replay_batches = static_cast<uint32_t>(get_uint(*b, 1, kMaxZmqBatches));
    }
    if (auto* r = find(f, "data_parallel_rank")) {
      if (r->node.IsScalar() && r->node.Scalar() == "none") {
        e.data_parallel_rank.reset();
      } else {
        e.data_parallel_rank = static_cast<uint32_t>(get_uint(*r, 0, UINT32_MAX));
      }
    }
    if (auto* m = find(f, "zmq_mode")) {
      e.zmq_mode = get_choice(*m, kZmqModes);
      if (e.zmq_mode == "connect" && e.zmq_endpoint.find('*') != std::string::npos) {
        fail(*m,
             "connect needs the subscriber's address in events.zmq_endpoint, not the "
             "wildcard " +
                 quoted(e.zmq_endpoint));
      }
    }
    if (auto* t = find(f, "zmq_token_ids")) e.zmq_token_ids = get_bool(*t);
    if (auto* z = find(f, "zmq_replay_endpoint")) {
      e.zmq_replay_endpoint = get_zmq_endpoint(*z);
      if (!e.zmq_replay_endpoint.empty() && e.zmq_endpoint.empty()) {
        fail(*z, "replays what events.zmq_endpoint publishes, which is not set");
      }
      if (!e.zmq_replay_endpoint.empty() && e.zmq_replay_endpoint == e.zmq_endpoint) {
        fail(*z, "must differ from events.zmq_endpoint");
      }
    }
  }

  // A ZeroMQ endpoint kvpoold binds (or connects to): "tcp://HOST:PORT" or "ipc://PATH", or ""
  // for none. libzmq checks the rest at start.
  std::string get_zmq_endpoint(const Value& v) const {
    std::string endpoint = get_string(v, "\"tcp://HOST:PORT\", \"ipc://PATH\" or \"\"");
    if (endpoint.empty()) return endpoint;
    const bool tcp = endpoint.starts_with("tcp://") && endpoint.size() > 6;
    const bool ipc = endpoint.starts_with("ipc://") && endpoint.size() > 6;
    if (!tcp && !ipc) {
      fail(v, quoted(endpoint) +
                  " is not a ZeroMQ endpoint: use \"tcp://HOST:PORT\" (e.g. "
                  "\"tcp://*:5557\") or \"ipc://PATH\", or \"\" for none");
    }
    return endpoint;
  }

  void check_default_tenant(const Value& v, const Config& config) const {
    const std::string& name = config.default_tenant;
    if (name.empty() || name == "default") return;
    const bool known = std::any_of(config.tenants.begin(), config.tenants.end(),
                                   [&](const TenantConfig& t) { return t.name == name; });
    if (!known) {
      fail(v, "no tenant is named " + quoted(name) +
                  " (list it under tenants, or use \"default\", or \"\" to refuse unknown peers)");
    }
  }
};

// The tenants that may attach to the pool named `name`: the entries listing it, else the implicit
// default tenant (a default_tenant no entry is named after), if any.
std::set<std::string> pool_tenants(const Config& config, const std::string& name) {
  std::set<std::string> out;
  bool default_is_entry = false;
  for (const TenantConfig& t : config.tenants) {
    if (std::find(t.pools.begin(), t.pools.end(), name) != t.pools.end()) out.insert(t.name);
    default_is_entry = default_is_entry || t.name == config.default_tenant;
  }
  if (out.empty() && !default_is_entry && !config.default_tenant.empty()) {
    out.insert(config.default_tenant);
  }
  return out;
}

}  // namespace

std::string conversion_tenancy_error(const Config& config, const PoolConfig& pool) {
  const auto to = std::find_if(config.pools.begin(), config.pools.end(), [&](const PoolConfig& p) {
    return p.name == pool.convert_evictions_to;
  });
  if (pool.convert_evictions_to.empty() || to == config.pools.end()) return {};
  const std::set<std::string> readers = pool_tenants(config, pool.name);
  for (const std::string& t : pool_tenants(config, to->name)) {
    if (readers.count(t) == 0) {
      return "tenant \"" + t + "\" may use pool \"" + to->name + "\" (pools[" +
             std::to_string(to - config.pools.begin()) +
             "]) but not this pool: converted pages would show it this pool's blocks";
    }
  }
  return {};
}

std::string conversion_tenancy_error(const Config& config) {
  for (const PoolConfig& pool : config.pools) {
    if (std::string why = conversion_tenancy_error(config, pool); !why.empty()) {
      return "pools." + pool.name + ".convert_evictions_to: " + why;
    }
  }
  return {};
}

std::vector<std::string> config_keys() {
  // Every key and every mapping above one ("socket", "pools", "pools[].geometry").
  std::vector<std::string> keys;
  const auto add = [&](std::string_view key) {
    if (key.ends_with("[]")) key.remove_suffix(2);
    if (std::find(keys.begin(), keys.end(), key) == keys.end()) keys.emplace_back(key);
  };
  for (const ConfigKey& k : config_key_table()) {
    for (size_t dot = k.path.find('.'); dot != std::string_view::npos;
         dot = k.path.find('.', dot + 1)) {
      add(k.path.substr(0, dot));
    }
    add(k.path);
  }
  return keys;
}

Config default_config() {
  Config config;
  config.socket_path = default_socket_path();
  PoolConfig pool;
  pool.name = "default";
  pool.geometry = Geometry{
      .layers = 32, .kv_heads = 8, .head_dim = 128, .tokens_per_page = 16, .dtype = KvDtype::bf16};
  pool.capacity = Capacity{.unit = Capacity::Unit::bytes, .value = uint64_t{256} << 20};
  pool.policy = std::string(core::kDefaultPolicy);
  config.pools.push_back(std::move(pool));
  return config;
}

wire::Result<Config> parse_config(std::string_view yaml, std::string_view source) {
  const std::string src(source);
  try {
    const std::vector<YAML::Node> docs = YAML::LoadAll(std::string(yaml));
    if (docs.size() > 1) {
      return make_error(src + ":" + std::to_string(line_of(docs[1], 1)) +
                        ": a config file holds one YAML document, not " +
                        std::to_string(docs.size()));
    }
    Config config;
    if (docs.empty() || docs[0].IsNull()) {
      config = default_config();
    } else {
      config = Parser(source).parse(docs[0]);
    }
    config.source = src;
    return config;
  } catch (const ParseFailure& e) {
    return make_error(e.message);
  } catch (const YAML::Exception& e) {
    const int line = e.mark.is_null() ? 1 : e.mark.line + 1;
    return make_error(src + ":" + std::to_string(line) + ": YAML syntax error: " + e.msg);
  } catch (const std::exception& e) {
    return make_error(src + ": " + e.what());
  }
}

wire::Result<Config> load_config(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return make_error(path + ": cannot open: " + std::strerror(errno));
  std::string text;
  char buf[16384];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      ::close(fd);
      return make_error(path + ": cannot read: " + std::strerror(err));
    }
    if (n == 0) break;
    text.append(buf, static_cast<size_t>(n));
    if (text.size() > kMaxConfigBytes) {
      ::close(fd);
      return make_error(path + ": larger than " + std::to_string(kMaxConfigBytes >> 20) +
                        " MiB; not a config file");
    }
  }
  ::close(fd);
  return parse_config(text, path);
}

}  // namespace kvpool::daemon
