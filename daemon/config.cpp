#include "daemon/config.h"

#include <fcntl.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <span>
#include <utility>

#include <yaml-cpp/yaml.h>

#include "common/paths.h"
#include "daemon/core/types.h"
#include "daemon/listen_address.h"

namespace kvpool::daemon {

namespace {

constexpr uint64_t kMaxCapacity = uint64_t{1} << 63;
constexpr size_t kMaxConfigBytes = size_t{4} << 20;
constexpr size_t kMaxSocketPathBytes = sizeof(sockaddr_un::sun_path) - 1;
constexpr uint32_t kMaxSocketMode = 0777;

constexpr std::string_view kRootKeys[] = {"socket",      "backend", "device",  "max_segment_bytes",
                                          "limits",      "pools",   "tenants", "default_tenant",
                                          "admin_group", "logging", "metrics", "events"};
constexpr std::string_view kSocketKeys[] = {"path", "mode", "group"};
constexpr std::string_view kLimitKeys[] = {"max_sessions", "max_pages_per_session",
                                           "max_pages_per_tenant"};
constexpr std::string_view kPoolKeys[] = {"name", "policy", "capacity", "geometry"};
constexpr std::string_view kGeometryKeys[] = {"layers", "kv_heads", "head_dim", "tokens_per_page",
                                              "dtype"};
constexpr std::string_view kTenantKeys[] = {"name", "uids", "gids", "pools"};
constexpr std::string_view kLoggingKeys[] = {"level"};
constexpr std::string_view kMetricsKeys[] = {"listen", "allow_non_loopback", "latency_histograms",
                                             "stats_segment"};
constexpr std::string_view kEventsKeys[] = {"ring_events"};
constexpr uint64_t kMaxRingEvents = uint64_t{1} << 24;

constexpr std::string_view kBackends[] = {"auto", "host", "cuda-vmm", "cuda-ipc", "fake-device"};
constexpr std::string_view kPolicies[] = {"lru"};
constexpr std::string_view kLogLevels[] = {"debug", "info", "warn", "error"};

wire::Error make_error(std::string message) {
  return wire::Error{Status{Errc::invalid_argument}, std::move(message)};
}

std::string join(std::span<const std::string_view> words) {
  std::string out;
  for (std::string_view w : words) {
    if (!out.empty()) out += ", ";
    out += w;
  }
  return out;
}

bool contains(std::span<const std::string_view> words, std::string_view w) {
  return std::find(words.begin(), words.end(), w) != words.end();
}

std::string quoted(std::string_view s) {
  return "\"" + std::string(s) + "\"";
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t'))
    s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t'))
    s.remove_suffix(1);
  return s;
}

bool all_digits(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// Thrown inside the parser only; parse_config turns it into an Error.
struct ParseFailure {
  std::string message;
};

// A node with the dotted path that names it and the 1-based line to report it at.
struct Value {
  YAML::Node node;
  std::string path;
  int line = 1;
};

// The line of `node`, or `fallback` where yaml-cpp has no useful mark (null values are marked at
// the next token, which can be lines further down).
int line_of(const YAML::Node& node, int fallback) {
  if (!node.IsDefined() || node.IsNull() || node.Mark().is_null()) return fallback;
  return node.Mark().line + 1;
}

std::string kind_of(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Map:
      return "a mapping";
    case YAML::NodeType::Sequence:
      return "a list";
    case YAML::NodeType::Scalar:
      return "the scalar \"" + node.Scalar() + "\"";
    case YAML::NodeType::Null:
    case YAML::NodeType::Undefined:
      break;
  }
  return "empty";
}

// A scalar the YAML text quoted (or tagged !!str): a string even when it reads like a number.
bool is_quoted(const YAML::Node& node) {
  return node.Tag() == "!" || node.Tag() == "tag:yaml.org,2002:str";
}

class Parser {
 public:
  explicit Parser(std::string_view source) : source_(source) {}

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
    if (auto* v = find(f, "limits")) parse_limits(*v, config);
    if (auto* v = find(f, "logging")) {
      auto lf = fields(*v, kLoggingKeys);
      if (auto* level = find(lf, "level")) config.log_level = get_choice(*level, kLogLevels);
    }
    if (auto* v = find(f, "pools")) parse_pools(*v, config);
    if (auto* v = find(f, "tenants")) parse_tenants(*v, config);
    if (auto* v = find(f, "default_tenant")) {
      config.default_tenant = get_string(*v);
      check_default_tenant(*v, config);
    }
    if (auto* v = find(f, "admin_group")) config.admin_group = get_string(*v);
    if (auto* v = find(f, "metrics")) parse_metrics(*v, config);
    if (auto* v = find(f, "events")) parse_events(*v, config);
    return config;
  }

 private:
  using Fields = std::map<std::string, Value, std::less<>>;

  [[noreturn]] void fail(const Value& v, const std::string& what) const {
    std::string msg = std::string(source_) + ":" + std::to_string(v.line) + ": ";
    if (!v.path.empty()) msg += v.path + ": ";
    throw ParseFailure{msg + what};
  }

  // The entry `key` of `parent`. A mapping or list is reported at its key's line (yaml-cpp marks
  // a block mapping at its first key), anything else at its own line.
  static Value child(const Value& parent, const YAML::Node& node, std::string_view key,
                     int key_line) {
    std::string path =
        parent.path.empty() ? std::string(key) : parent.path + "." + std::string(key);
    const int line = node.IsMap() || node.IsSequence() ? key_line : line_of(node, key_line);
    return Value{node, std::move(path), line};
  }

  static const Value* find(const Fields& f, std::string_view key) {
    auto it = f.find(key);
    return it == f.end() ? nullptr : &it->second;
  }

  // The entries of a mapping, every key checked against `known`. A null value (a section whose
  // entries are all commented out) is an empty mapping when `null_ok`.
  Fields fields(const Value& v, std::span<const std::string_view> known,
                bool null_ok = true) const {
    Fields out;
    if (v.node.IsNull() && null_ok) return out;
    if (!v.node.IsMap()) fail(v, "must be a mapping, not " + kind_of(v.node));
    for (auto it = v.node.begin(); it != v.node.end(); ++it) {
      // The iterator yields a temporary pair: copy the nodes (they are handles).
      const YAML::Node key = it->first;
      const YAML::Node value = it->second;
      const int key_line = line_of(key, v.line);
      if (!key.IsScalar()) {
        fail(Value{key, v.path, key_line}, "a key must be a plain string, not " + kind_of(key));
      }
      const std::string& name = key.Scalar();
      const Value entry = child(v, value, name, key_line);
      if (!contains(known, name)) {
        fail(Value{key, entry.path, key_line}, "unknown key (known keys: " + join(known) + ")");
      }
      if (out.count(name) != 0) {
        fail(Value{key, entry.path, key_line},
             "duplicate key (first set on line " + std::to_string(out.at(name).line) + ")");
      }
      out.emplace(name, entry);
    }
    return out;
  }

  // A mapping's required entry; its absence is reported at the mapping.
  const Value& required(const Fields& f, const Value& parent, std::string_view key) const {
    if (const Value* v = find(f, key)) return *v;
    fail(parent, "missing required key \"" + std::string(key) + "\"");
  }

  // The items of a list; a null value is an empty list.
  std::vector<Value> items(const Value& v) const {
    std::vector<Value> out;
    if (v.node.IsNull()) return out;
    if (!v.node.IsSequence()) fail(v, "must be a list, not " + kind_of(v.node));
    size_t i = 0;
    for (auto it = v.node.begin(); it != v.node.end(); ++it) {
      const YAML::Node item = *it;
      // yaml-cpp marks an empty item at the next token; the list's own mark is its first item.
      int line = line_of(item, v.line);
      if (item.IsNull()) {
        line = i == 0 || item.Mark().is_null() ? line_of(v.node, v.line) : item.Mark().line + 1;
      }
      out.push_back(Value{item, v.path + "[" + std::to_string(i) + "]", line});
      ++i;
    }
    return out;
  }

  void require_scalar(const Value& v, std::string_view type) const {
    if (v.node.IsScalar()) return;
    if (v.node.IsNull()) fail(v, "has no value (expected " + std::string(type) + ")");
    fail(v, "must be " + std::string(type) + ", not " + kind_of(v.node));
  }

  // A scalar's text; `expected` says what belongs there when the value is missing.
  std::string get_string(
      const Value& v, std::string_view expected = "a string; write \"\" for an empty one") const {
    if (v.node.IsNull()) fail(v, "has no value (expected " + std::string(expected) + ")");
    require_scalar(v, "a string");
    return v.node.Scalar();
  }

  std::string get_choice(const Value& v, std::span<const std::string_view> choices) const {
    std::string s = get_string(v, "one of " + join(choices));
    if (!contains(choices, s)) fail(v, quoted(s) + " is not one of " + join(choices));
    return s;
  }

  // A non-negative decimal integer in [min, max], written unquoted.
  uint64_t get_uint(const Value& v, uint64_t min, uint64_t max) const {
    require_scalar(v, "an integer");
    const std::string& s = v.node.Scalar();
    if (is_quoted(v.node)) fail(v, "must be an integer, not the string " + quoted(s));
    std::string_view digits = s;
    if (!digits.empty() && digits.front() == '+') digits.remove_prefix(1);
    if (!digits.empty() && digits.front() == '-' && all_digits(digits.substr(1))) {
      fail(v, "must not be negative (got " + s + ")");
    }
    if (!all_digits(digits)) fail(v, "must be an integer, not " + quoted(s));
    if (digits.size() > 1 && digits.front() == '0') {
      fail(v, "must be a decimal integer without leading zeros (got " + s + ")");
    }
    uint64_t n = 0;
    const auto [ptr, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), n);
    if (ec == std::errc::result_out_of_range || n > max) {
      fail(v, "must be at most " + std::to_string(max) + " (got " + s + ")");
    }
    if (ec != std::errc() || ptr != digits.data() + digits.size()) {
      fail(v, "must be an integer, not " + quoted(s));
    }
    if (n < min) fail(v, "must be at least " + std::to_string(min) + " (got " + s + ")");
    return n;
  }

  // An octal string ("0660", "660", "0o660") or an integer ≤ 0777; an unquoted number with a
  // leading 0 is octal as well, as in YAML 1.1.
  uint32_t get_mode(const Value& v) const {
    const std::string what = "must be an octal string like \"0660\" or an integer <= 0777";
    require_scalar(v, "a mode");
    std::string_view s = v.node.Scalar();
    int base = is_quoted(v.node) ? 8 : 10;
    if (s.starts_with("0o") || s.starts_with("0O")) {
      s.remove_prefix(2);
      base = 8;
    } else if (s.size() > 1 && s.front() == '0') {
      base = 8;
    }
    if (!all_digits(s)) fail(v, what + " (got " + quoted(v.node.Scalar()) + ")");
    uint64_t n = 0;
    const auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), n, base);
    if (ec != std::errc() || ptr != s.data() + s.size() || n > kMaxSocketMode) {
      fail(v, what + " (got " + quoted(v.node.Scalar()) + ")");
    }
    return static_cast<uint32_t>(n);
  }

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
    if (auto* m = find(f, "max_pages_per_session")) {
      config.max_pages_per_session = get_uint(*m, 0, kMax64);
    }
    if (auto* m = find(f, "max_pages_per_tenant")) {
      config.max_pages_per_tenant = get_uint(*m, 0, kMax64);
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
  }

  void parse_pools(const Value& v, Config& config) const {
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
        if (other.name == pool.name) fail(name, "duplicate pool name " + quoted(pool.name));
      }
      if (auto* p = find(f, "policy")) pool.policy = get_choice(*p, kPolicies);
      pool.geometry = parse_geometry(required(f, item, "geometry"));
      pool.capacity = defaults.capacity;
      if (auto* c = find(f, "capacity")) {
        pool.capacity = parse_pool_capacity(*c, pool.geometry);
      } else {
        check_pages(Value{item.node, item.path + ".capacity (default 256MiB)", item.line},
                    pool.capacity, pool.geometry);
      }
      config.pools.push_back(std::move(pool));
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
          const bool known = std::any_of(config.pools.begin(), config.pools.end(),
                                         [&](const PoolConfig& pc) { return pc.name == pool; });
          if (!known) fail(pool_item, "no pool is named " + quoted(pool));
          if (std::find(tenant.pools.begin(), tenant.pools.end(), pool) != tenant.pools.end()) {
            fail(pool_item, "pool " + quoted(pool) + " is listed twice");
          }
          tenant.pools.push_back(std::move(pool));
        }
      }
      config.tenants.push_back(std::move(tenant));
    }
  }

  // Operations, metrics and events ----------------------------------------------------------

  bool get_bool(const Value& v) const {
    require_scalar(v, "true or false");
    const std::string& s = v.node.Scalar();
    if (!is_quoted(v.node) && s == "true") return true;
    if (!is_quoted(v.node) && s == "false") return false;
    fail(v, "must be true or false, not " + quoted(s));
  }

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

  std::string_view source_;
};

}  // namespace

std::string default_socket_path() {
  return kvpool::default_socket_path();
}

Config default_config() {
  Config config;
  config.socket_path = default_socket_path();
  PoolConfig pool;
  pool.name = "default";
  pool.geometry = Geometry{
      .layers = 32, .kv_heads = 8, .head_dim = 128, .tokens_per_page = 16, .dtype = KvDtype::bf16};
  pool.capacity = Capacity{.unit = Capacity::Unit::bytes, .value = uint64_t{256} << 20};
  pool.policy = "lru";
  config.pools.push_back(std::move(pool));
  return config;
}

std::string parse_capacity(std::string_view text, Capacity& out) {
  const std::string_view s = trim(text);
  const std::string shown = quoted(text);
  const std::string expected =
      ": expected bytes (a number, optionally with B, KiB, MiB, GiB, TiB, KB, MB, GB or TB), "
      "\"N pages\" or \"P%\"";
  if (s.empty()) return "capacity is empty" + expected;
  if (s.front() == '-') return "capacity " + shown + " is negative";

  if (s.back() == '%') {
    const std::string_view num = trim(s.substr(0, s.size() - 1));
    const size_t dot = num.find('.');
    const bool well_formed = dot == std::string_view::npos ? all_digits(num)
                                                           : all_digits(num.substr(0, dot)) &&
                                                                 all_digits(num.substr(dot + 1));
    if (!well_formed) return "capacity " + shown + " is not a percentage like \"40%\"";
    double pct = 0;
    const auto [ptr, ec] = std::from_chars(num.data(), num.data() + num.size(), pct);
    if (ec != std::errc() || ptr != num.data() + num.size()) {
      return "capacity " + shown + " is not a percentage like \"40%\"";
    }
    if (!(pct > 0.0 && pct <= 100.0)) return "capacity " + shown + " is not in (0%, 100%]";
    out = Capacity{.unit = Capacity::Unit::fraction, .value = 0, .fraction = pct / 100.0};
    return {};
  }

  size_t n_digits = 0;
  while (n_digits < s.size() && s[n_digits] >= '0' && s[n_digits] <= '9')
    ++n_digits;
  if (n_digits == 0) return "capacity " + shown + " does not start with a number" + expected;
  uint64_t n = 0;
  const auto [ptr, ec] = std::from_chars(s.data(), s.data() + n_digits, n);
  if (ec == std::errc::result_out_of_range) return "capacity " + shown + " exceeds 2^63";
  if (ec != std::errc() || ptr != s.data() + n_digits) {
    return "capacity " + shown + " does not start with a number" + expected;
  }
  const std::string_view unit = trim(s.substr(n_digits));
  if (unit.starts_with(".")) {
    return "capacity " + shown + " is fractional; use a whole number of a smaller unit";
  }

  struct UnitDef {
    std::string_view name;
    uint64_t scale;
    Capacity::Unit unit;
  };
  static constexpr UnitDef kUnits[] = {
      {"", 1, Capacity::Unit::bytes},
      {"B", 1, Capacity::Unit::bytes},
      {"KiB", uint64_t{1} << 10, Capacity::Unit::bytes},
      {"MiB", uint64_t{1} << 20, Capacity::Unit::bytes},
      {"GiB", uint64_t{1} << 30, Capacity::Unit::bytes},
      {"TiB", uint64_t{1} << 40, Capacity::Unit::bytes},
      {"KB", 1000, Capacity::Unit::bytes},
      {"kB", 1000, Capacity::Unit::bytes},
      {"MB", uint64_t{1000} * 1000, Capacity::Unit::bytes},
      {"GB", uint64_t{1000} * 1000 * 1000, Capacity::Unit::bytes},
      {"TB", uint64_t{1000} * 1000 * 1000 * 1000, Capacity::Unit::bytes},
      {"page", 1, Capacity::Unit::pages},
      {"pages", 1, Capacity::Unit::pages},
  };
  const auto* def = std::find_if(std::begin(kUnits), std::end(kUnits),
                                 [&](const UnitDef& d) { return d.name == unit; });
  if (def == std::end(kUnits)) {
    return "capacity " + shown + " has an unknown unit " + quoted(unit) + expected;
  }
  if (n == 0) return "capacity " + shown + " is zero";
  if (n > kMaxCapacity / def->scale) return "capacity " + shown + " exceeds 2^63";
  out = Capacity{.unit = def->unit, .value = n * def->scale, .fraction = 0.0};
  return {};
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
