// kvpoold configuration: the YAML schema, its defaults and its validation.
//
// A config file is YAML (yaml-cpp). Every key is known: an unknown key or an invalid value is
// rejected with "FILE:LINE: KEY: what is wrong", KEY being the full dotted path
// (e.g. "pools[1].geometry.head_dim"). With no file, default_config() runs: auto backend (host
// where there is no GPU), one pool named "default" of a small model geometry.
//
// Schema (config/kvpoold.yaml documents every key with its default):
//   socket:   { path: STR, mode: "0660", group: STR }
//   backend:  auto | host | cuda-vmm | cuda-ipc | fake-device   (fake-device: tests only)
//   device:   INT                                   (CUDA device ordinal, default 0)
//   max_segment_bytes: SIZE    (largest memory segment of a pool; default: one per pool)
//   memory_budget: SIZE | "60%"   (what the elastic pools may map together; default: none)
//   limits:   { max_sessions: INT, max_sessions_per_uid: INT, hello_timeout_ms: INT,
//               max_buffered_bytes: SIZE, max_pages_per_session: INT, max_pages_per_tenant: INT,
//               max_pin_ttl_ms: INT, max_pinned_pages_per_tenant: INT,
//               max_pinned_pool_percent: 1-100 }
//   pools:    [ { name: STR, policy: prefix | lru | s3fifo,
//                 capacity: "1GiB" | "4096 pages" | "40%",
//                 share_between_tenants: BOOL, layout: page_major | layer_major,
//                 hash_scheme: kvpool-sha256/1 | vllm-sha256-cbor/1,
//                 geometry: { layers, kv_heads, head_dim, tokens_per_page: INT,
//                             dtype: fp16 | bf16 | fp8_e4m3 | int8,
//                             kind: full | sliding | chunked | latent, window: INT },
//                 host_tier: "8000 pages" | SIZE | "10%", convert_evictions_to: POOL,
//                 remote_tier: { cluster: ["HOST:PORT"], namespace: STR, ttl_s: INT,
//                                write: on_publish | on_demote | off, admit: all | reused,
//                                timeout_ms, batch_pages, staging_pages: INT },
//                 max_capacity: "4096 pages" | SIZE, min_capacity: "512 pages" | SIZE,
//                 segment_size: SIZE, grow_ahead: BOOL,     (the last four: elastic pools)
//                 groups: [ { name: STR, layers, kv_heads, head_dim: INT,
//                             kind: full | sliding | chunked | latent, window: INT } ] } ]
//             (groups: a hybrid model, one pool per KV group named POOL/GROUP; each group's
//              keys override the pool's geometry; capacity is then the model's budget)
//   tenants:  [ { name: STR, uids: [INT], gids: [INT], pools: [STR] } ]
//
// Pools and tenants: a tenant entry may use exactly the pools it lists (none when the list is
// empty); the implicit default tenant (default_tenant: "default" with no entry of that name) may
// use the pools no tenant entry lists. Every worker of a pool can read and write all of its
// memory, so two tenant entries may list the same pool only when that pool says
// share_between_tenants: true (trusted tenants share bytes); otherwise the config is refused.
//   default_tenant: STR        (tenant of peers no tenant entry matches; "" = refuse them)
//   admin_group: STR           (group whose members may evict, flush, reload; "" = root only)
//   logging:  { level: debug | info | warn | error }
//   metrics:  { listen: "HOST:PORT" | "", allow_non_loopback: BOOL, latency_histograms: BOOL,
//               stats_segment: BOOL }
//   events:   { ring_events: INT, zmq_endpoint: "tcp://HOST:PORT" | "ipc://PATH" | "",
//               zmq_topic: STR, zmq_block_hash: bytes | uint64, zmq_payload: array | map,
//               zmq_send_hwm: INT, zmq_queue_bytes: SIZE, zmq_max_connections: INT,
//               zmq_replay_endpoint: STR, zmq_replay_batches: INT,
//               data_parallel_rank: INT | none, zmq_mode: bind | connect | auto,
//               zmq_token_ids: BOOL }
//
// The key table (config_keys.h) is the one list of these keys: the parser takes each mapping's
// keys from it, a reload classifies each by it (live, or kept until a restart), and
// config_keys() lists it for a test that holds this comment and config/kvpoold.yaml to it.
//
// Thread-safety: plain values. Error policy: parse/load return an Error, never throw.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/geometry.h"
#include "common/paths.h"
#include "common/wire/protocol.h"

namespace kvpool::daemon {

struct Capacity {
  enum class Unit : uint8_t { bytes, pages, fraction };
  Unit unit = Unit::bytes;
  uint64_t value = 0;     // bytes or pages
  double fraction = 0.0;  // of the backend's free memory, in (0, 1]
  friend bool operator==(const Capacity&, const Capacity&) = default;
};

// Where a key was written, "FILE:LINE: pools[0].capacity", for what is said about it after
// parsing (kvpoold --check-config's warnings). Not part of what a config means: any two compare
// equal, so a pool that only moved to other lines of the file is the same pool to a reload.
struct KeyLocation {
  std::string text;  // empty for the built-in config
  friend bool operator==(const KeyLocation&, const KeyLocation&) { return true; }
};

// A remote tier on Redis Cluster under the pool (daemon/remote/remote_tier.h; docs/ARCHITECTURE.md,
// "Remote tier"): shared by every kvpoold that names the same cluster and namespace.
struct RemoteTierConfig {
  // The values are the stats' remote_tier codes (common/stats_layout.h).
  enum class Write : uint8_t { on_publish = 1, off = 2, on_demote = 3 };
  enum class Admit : uint8_t { all, reused };
  std::vector<std::string> cluster;      // seed nodes, "HOST:PORT"; the rest come from the map
  std::string key_namespace = "kvpool";  // YAML `namespace`: the first part of every key
  uint32_t ttl_s = 86400;                // the values' expiry; 0: none (maxmemory evicts)
  Write write = Write::on_publish;       // on_demote: as the device evicts; off: only reads
  Admit admit = Admit::all;              // reused: written at its first hit, not at publish
  uint32_t timeout_ms = 100;             // a connect, and a node's replies to one batch
  uint32_t batch_pages = 32;             // the most blocks one lookup fetches, or one write sends
  uint32_t staging_pages = 128;          // pages of host memory for values on their way, each way
  friend bool operator==(const RemoteTierConfig&, const RemoteTierConfig&) = default;
};

// The config's word for a write mode ("on_publish", "on_demote", "off").
inline const char* remote_write_name(RemoteTierConfig::Write w) {
  return w == RemoteTierConfig::Write::off         ? "off"
         : w == RemoteTierConfig::Write::on_demote ? "on_demote"
                                                   : "on_publish";
}

struct PoolConfig {
  std::string name;
  Geometry geometry;
  Capacity capacity;
  std::string policy = "prefix";  // core::kDefaultPolicy; reloadable (PagePool::set_policy)
  // How the pool's workers name blocks (docs/BLOCK_HASH.md): hello refuses another scheme.
  std::string hash_scheme = "kvpool-sha256/1";
  // Several tenant entries may list this pool: they then read and write each other's pages.
  bool share_between_tenants = false;
  // How the pool's memory orders KV (common/geometry.h); like the geometry, fixed until a restart.
  KvLayout layout = KvLayout::page_major;
  // A host-memory tier under the pool (daemon/memory/host_tier_store.h): the pages the pool evicts
  // are demoted into it and lookups promote them back. Pages or bytes (whole pages of the pool's
  // geometry), or a fraction of MemAvailable; none = no tier. Fixed until a restart.
  std::optional<Capacity> host_tier{};
  // Precision before eviction (docs/ARCHITECTURE.md, "Mixed precision"): the pool's cached pages
  // that it evicts are converted into this 8-bit pool of the same shape under the same hashes
  // instead of being lost. Empty: none. Checked by the parser (the pool exists, 16 → 8 bits,
  // same shape, no chain, no host_tier here, its tenants among this pool's). Fixed until a
  // restart.
  std::string convert_evictions_to{};
  // The remote tier (above); none = no tier. Restart-only.
  std::optional<RemoteTierConfig> remote_tier{};
  // Elastic pools (docs/ARCHITECTURE.md, "Elastic pools"): with max_capacity the pool starts at
  // `capacity` and grows by segments of segment_size when it runs out of free pages, while the
  // daemon's memory_budget has room or another pool can give a segment back, down to its own
  // min_capacity (default one segment). Pages or bytes; either layout (a layer_major one is
  // segmented, kernels/paged_kv.h). Restart-only.
  std::optional<Capacity> max_capacity{};
  std::optional<Capacity> min_capacity{};
  uint64_t segment_size = uint64_t{64} << 20;
  // Whether the next segment is made in the background once fewer than half a segment's pages
  // are free (and the budget has room without shrinking another pool), so that allocs find it
  // mapped instead of waiting for it. False: segments are made only when an alloc needs them.
  // Applies on reload.
  bool grow_ahead = true;
  // A KV group of a hybrid model (pools[].groups; docs/ARCHITECTURE.md, "Hybrid models"): the
  // config entry MODEL expands into one pool per group, named MODEL/GROUP, each with the entry's
  // keys and its group's geometry. Every group is an elastic pool that starts at one segment and
  // grows into the model's capacity (model_budget, shared by all its groups: no split between
  // them). Empty model: a plain pool.
  std::string model{};
  uint16_t group = 0;                       // this pool's index in model_groups
  std::vector<std::string> model_groups{};  // the model's group names, in config order
  Capacity model_budget{};                  // the model's capacity: bytes or a fraction
  // The name tenants list: the model's for a group, else the pool's.
  const std::string& tenancy_name() const { return model.empty() ? name : model; }
  KeyLocation capacity_at{};      // the capacity key, or the pool's entry when it has none
  KeyLocation host_tier_at{};     // the host_tier key, when given
  KeyLocation convert_at{};       // the convert_evictions_to key, when given
  KeyLocation remote_tier_at{};   // the remote_tier key, when given
  KeyLocation max_capacity_at{};  // the max_capacity key, when given
  KeyLocation segment_size_at{};  // the segment_size key, when given
  friend bool operator==(const PoolConfig&, const PoolConfig&) = default;
};

struct TenantConfig {
  std::string name;
  std::vector<uint32_t> uids;
  std::vector<uint32_t> gids;
  std::vector<std::string> pools;  // pools this tenant may attach to; empty = none
  friend bool operator==(const TenantConfig&, const TenantConfig&) = default;
};

// Operations, metrics and events.
struct MetricsConfig {
  std::string listen;               // HTTP endpoint "HOST:PORT"; "" = none
  bool allow_non_loopback = false;  // without it, listen must be a loopback address
  bool latency_histograms = true;   // time every operation
  bool stats_segment = true;        // publish <socket>.stats for readers
  friend bool operator==(const MetricsConfig&, const MetricsConfig&) = default;
};
struct EventsConfig {
  uint32_t ring_events = 65536;  // events kept for subscribers that fall behind or resume
  // KV events for routers in vLLM's ZeroMQ format (daemon/telemetry/kv_event_publisher.h); "" =
  // off.
  std::string zmq_endpoint;
  std::string zmq_topic;                 // prefix of every topic; the pool's name follows
  std::string zmq_block_hash = "bytes";  // bytes (16-byte bin) | uint64 (the low word)
  std::string zmq_payload = "array";     // array (vLLM releases' array_like) | map (vLLM main)
  uint32_t zmq_send_hwm = 10000;         // messages queued per subscriber before libzmq drops
  uint64_t zmq_queue_bytes = uint64_t{64} << 20;   // payload bytes libzmq holds, all subscribers
  uint32_t zmq_max_connections = 64;               // connections the endpoint keeps at once
  std::string zmq_replay_endpoint;                 // vLLM's replay ROUTER socket; "" = off
  uint32_t zmq_replay_batches = 10000;             // recent batches kept for replay
  std::optional<uint32_t> data_parallel_rank = 0;  // sent with every batch unless "none"
  std::string zmq_mode = "bind";  // bind | connect | auto (bind wildcard and ipc, else connect)
  bool zmq_token_ids = true;      // BlockStored carries the token ids workers publish
  friend bool operator==(const EventsConfig&, const EventsConfig&) = default;
};

// Sessions root and admin_group members may open beyond limits.max_sessions.
inline constexpr uint32_t kAdminReservedSessions = 16;

struct Config {
  std::string source = "<built-in>";  // file the config came from

  std::string socket_path;  // default: kvpool::default_socket_path() (common/paths.h)
  uint32_t socket_mode = 0660;
  std::string socket_group;  // empty = the daemon's own group

  std::string backend = "auto";  // auto | host | cuda-vmm | cuda-ipc | fake-device
  int device = 0;
  uint64_t max_segment_bytes = 0;  // 0 = one segment per pool
  // Device memory all elastic pools may map together (bytes, or a fraction of the backend's
  // free memory at start); none = only each pool's max_capacity bounds it.
  std::optional<Capacity> memory_budget{};
  KeyLocation memory_budget_at{};

  // Connections (sessions) served at once; root and admin_group members may exceed it by
  // kAdminReservedSessions, so a flood of connections never locks an operator out.
  uint32_t max_sessions = 1024;
  uint32_t max_sessions_per_uid = 256;  // 0 = no limit; admins are exempt
  // A connection that has not completed hello within this is closed.
  uint32_t hello_timeout_ms = 5000;
  // All connections' input and output buffers together; past it the largest holder is closed.
  uint64_t max_buffered_bytes = uint64_t{512} << 20;
  uint64_t max_pages_per_session = 0;  // 0 = no limit
  uint64_t max_pages_per_tenant = 0;   // 0 = no limit
  // Client pins (PageHints::pin_ttl_ms): the longest TTL a call may ask for (0 = pins refused),
  // and the pages one tenant may keep pinned in one pool at once (0 = a quarter of the pool).
  uint32_t max_pin_ttl_ms = 600000;
  uint32_t max_pinned_pages_per_tenant = 0;
  // Pages pinned in one pool at once, every tenant together, in percent of its pages: tenants at
  // their own limits still leave the rest evictable for unpinned work.
  uint32_t max_pinned_pool_percent = 50;

  std::vector<PoolConfig> pools;
  std::vector<TenantConfig> tenants;
  std::string default_tenant = "default";
  std::string admin_group;  // members (and root) may evict, flush, reload; "" = root only

  std::string log_level = "info";

  MetricsConfig metrics;
  EventsConfig events;

  friend bool operator==(const Config&, const Config&) = default;
};

// The built-in configuration: one pool "default" (32 layers, 8 KV heads, head dim 128, 16 tokens
// per page, bf16: 2 MiB pages), 256 MiB, auto backend, socket at kvpool::default_socket_path().
Config default_config();

// Every key the parser accepts, as dotted paths ("socket.path", "pools[].grow_ahead").
std::vector<std::string> config_keys();

// Parses YAML text; `source` names it in error messages. Keys absent from the text keep their
// default_config() values, except pools: a file that lists pools replaces the default pool.
wire::Result<Config> parse_config(std::string_view yaml, std::string_view source);

// Reads and parses a file; an unreadable file is an Error naming the path and errno text.
wire::Result<Config> load_config(const std::string& path);

// Precision before eviction's tenancy rule (pools[].convert_evictions_to): every tenant that may
// use the 8-bit pool may use the converting pool, or it would read that pool's blocks there.
// "" or why not, for `pool`, or the first pool of `config` that breaks it (naming it). The parser
// holds each file to it; a reload holds the config it would run (its tenants live, the
// conversions kept from the start) to it too.
std::string conversion_tenancy_error(const Config& config, const PoolConfig& pool);
std::string conversion_tenancy_error(const Config& config);

// Parses "1GiB", "512 MiB", "1000000000" (bytes), "4096 pages", "40%" into out. Returns ""
// on success, else the error text (and leaves out untouched).
std::string parse_capacity(std::string_view text, Capacity& out);

}  // namespace kvpool::daemon
