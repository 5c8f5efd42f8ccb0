// The C API (client/capi/kvpool.h) over client::Connection.

#include <algorithm>
#include <cstring>
#include <string>

#include "client/capi/capi_conn.h"
#include "client/capi/kvpool.h"
#include "client/connection/connection.h"
#include "common/stats_counters.h"
#include "common/vllm_block_hash.h"

namespace {

using kvpool::capi::fail;
using kvpool::capi::too_many;

static_assert(sizeof(kvpool_hash) == sizeof(kvpool::BlockHash));
static_assert(KVPOOL_NO_PAGE == kvpool::kNoPage);
static_assert(KVPOOL_TIER_DEVICE == kvpool::wire::kTierDevice &&
              KVPOOL_TIER_HOST == kvpool::wire::kTierHost &&
              KVPOOL_TIER_CONVERTED == kvpool::wire::kTierConverted &&
              KVPOOL_TIER_REMOTE == kvpool::wire::kTierRemote &&
              KVPOOL_TIER_NONE == kvpool::wire::kTierNone);

// The i-th name of a counter table, NULL past its end (the names are string literals).
template <class Row, size_t N>
const char* row_name(const Row (&table)[N], size_t i) {
  return i < N ? table[i].name.data() : nullptr;
}

// Asks the daemon for its stats and writes up to n of the values `pick` chooses.
template <class Pick>
int get_values(kvpool_conn* c, const char* what, uint64_t* values, size_t n, size_t* written,
               Pick pick) {
  if (written != nullptr) *written = 0;
  if (values == nullptr && n != 0) {
    c->last_error = std::string(what) + ": values is NULL but n is " + std::to_string(n);
    return static_cast<int>(kvpool::Errc::invalid_argument);
  }
  auto r = c->conn->stats();
  if (!r.ok()) return fail(c, r);
  const std::vector<uint64_t>& got = pick(r.value());
  const size_t k = std::min(n, got.size());
  std::copy_n(got.begin(), k, values);
  if (written != nullptr) *written = k;
  return KVPOOL_OK;
}

}  // namespace

extern "C" {

int kvpool_attach(const char* socket_path, const char* worker_name, const char* pool_name,
                  kvpool_conn** out, char* err, size_t err_len) {
  return kvpool_attach_ex(socket_path, worker_name, pool_name, nullptr, out, err, err_len);
}

int kvpool_attach_ex(const char* socket_path, const char* worker_name, const char* pool_name,
                     const kvpool_attach_options* options, kvpool_conn** out, char* err,
                     size_t err_len) {
  *out = nullptr;
  const kvpool::HashScheme* scheme = &kvpool::default_hash_scheme();
  if (options != nullptr && options->hash_scheme == KVPOOL_HASH_SCHEME_VLLM) {
    scheme = &kvpool::VllmBlockHasher::scheme();
  } else if (options != nullptr && options->hash_scheme != KVPOOL_HASH_SCHEME_KVPOOL) {
    if (err != nullptr && err_len > 0) {
      std::snprintf(err, err_len,
                    "kvpool_attach_ex: hash_scheme %u is not KVPOOL_HASH_SCHEME_KVPOOL (0) or "
                    "KVPOOL_HASH_SCHEME_VLLM (1)",
                    unsigned{options->hash_scheme});
    }
    return static_cast<int>(kvpool::Errc::invalid_argument);
  }
  const uint64_t link =
      options != nullptr && options->link != nullptr ? options->link->conn->session_id() : 0;
  const std::string path = socket_path != nullptr && *socket_path != '\0'
                               ? socket_path
                               : kvpool::client::default_socket_path();
  auto r = kvpool::client::Connection::attach(
      path, worker_name != nullptr ? worker_name : "", pool_name != nullptr ? pool_name : "",
      kvpool::client::Connection::Memory::map, link, *scheme);
  if (!r.ok()) {
    if (err != nullptr && err_len > 0) {
      std::snprintf(err, err_len, "%s", r.error().message.c_str());
    }
    return static_cast<int>(r.error().status.code());
  }
  const kvpool::wire::PoolInfo& info = r.value()->pool();
  *out = new kvpool_conn{std::move(r.value()), {}, {}, info.model, info.groups};
  return KVPOOL_OK;
}

void kvpool_detach(kvpool_conn* c) {
  delete c;
}

const char* kvpool_last_error(const kvpool_conn* c) {
  return c->last_error.c_str();
}

void* kvpool_base(const kvpool_conn* c) {
  return c->conn->base();
}

void kvpool_get_pool_attention(const kvpool_conn* c, uint8_t* kind, uint32_t* window) {
  const kvpool::Geometry& g = c->conn->pool().geometry;
  if (kind != nullptr) *kind = static_cast<uint8_t>(g.kind);
  if (window != nullptr) *window = g.window;
}

void kvpool_get_pool_info(const kvpool_conn* c, kvpool_pool_info* out) {
  const auto& p = c->conn->pool();
  *out = kvpool_pool_info{p.geometry.layers,
                          p.geometry.kv_heads,
                          p.geometry.head_dim,
                          p.geometry.tokens_per_page,
                          static_cast<uint8_t>(p.geometry.dtype),
                          p.num_pages,
                          p.page_stride,
                          p.segment_bytes,
                          c->conn->device(),
                          static_cast<uint8_t>(c->conn->layout()),
                          c->conn->layer_stride(),
                          p.max_pages,
                          p.epoch,
                          p.reserved_bytes,
                          p.segment_pages,
                          p.segment_stride};
}

uint64_t kvpool_block_index(const kvpool_conn* c, kvpool_page_id page) {
  return kvpool::kernels::block_index(kvpool::kernels::paged_kv_of(c->conn->pool(), nullptr), page);
}

int kvpool_set_hints(kvpool_conn* c, const kvpool_hints* hints) {
  if (hints == nullptr) {
    c->hints = {};
    return KVPOOL_OK;
  }
  if (hints->priority > kvpool::kMaxPriority) {
    c->last_error = "kvpool_set_hints: priority " + std::to_string(hints->priority) +
                    " is not a priority class (KVPOOL_PRIORITY_NONE .. KVPOOL_PRIORITY_SYSTEM)";
    return static_cast<int>(kvpool::Errc::invalid_argument);
  }
  c->hints = kvpool::PageHints{static_cast<kvpool::Priority>(hints->priority), hints->pin_ttl_ms};
  return KVPOOL_OK;
}

int kvpool_alloc(kvpool_conn* c, uint32_t n, kvpool_page_id* out) {
  auto r = c->conn->alloc(n, c->hints);
  if (!r.ok()) return fail(c, r);
  std::memcpy(out, r.value().data(), r.value().size() * sizeof(kvpool_page_id));
  return KVPOOL_OK;
}

int kvpool_retain(kvpool_conn* c, const kvpool_page_id* pages, size_t n) {
  auto r = c->conn->retain(std::span(pages, n), c->hints);
  return r.ok() ? KVPOOL_OK : fail(c, r);
}

int kvpool_release(kvpool_conn* c, const kvpool_page_id* pages, size_t n) {
  auto r = c->conn->release(std::span(pages, n));
  return r.ok() ? KVPOOL_OK : fail(c, r);
}

int kvpool_lookup(kvpool_conn* c, const kvpool_hash* chain, size_t n, kvpool_page_id* out,
                  uint32_t* hits) {
  return kvpool_lookup_with_tiers(c, chain, n, out, nullptr, hits);
}

int kvpool_lookup_with_tiers(kvpool_conn* c, const kvpool_hash* chain, size_t n,
                             kvpool_page_id* out, uint8_t* tiers, uint32_t* hits) {
  *hits = 0;
  if (n > kvpool::wire::kMaxBatch) return too_many(c, n);
  std::vector<kvpool::BlockHash> hashes(n);
  for (size_t i = 0; i < n; ++i)
    hashes[i] = kvpool::BlockHash{chain[i].lo, chain[i].hi};
  auto r = c->conn->lookup_with_tiers(hashes, c->hints);
  if (!r.ok()) return fail(c, r);
  const auto& reply = r.value();
  std::memcpy(out, reply.pages.data(), reply.pages.size() * sizeof(kvpool_page_id));
  if (tiers != nullptr) std::memcpy(tiers, reply.tiers.data(), reply.tiers.size());
  *hits = static_cast<uint32_t>(reply.pages.size());
  return KVPOOL_OK;
}

int kvpool_publish(kvpool_conn* c, const kvpool_publish_item* items, size_t n,
                   kvpool_publish_result* out) {
  return kvpool_publish_chain(c, items, n, nullptr, out);
}

int kvpool_publish_chain(kvpool_conn* c, const kvpool_publish_item* items, size_t n,
                         const kvpool_block_chain* chain, kvpool_publish_result* out) {
  if (n > kvpool::wire::kMaxBatch) return too_many(c, n);
  std::vector<kvpool::PublishItem> in(n);
  for (size_t i = 0; i < n; ++i) {
    in[i] =
        kvpool::PublishItem{items[i].page, kvpool::BlockHash{items[i].hash.lo, items[i].hash.hi}};
  }
  kvpool::client::PublishChain described;
  if (chain != nullptr) {
    if (chain->token_ids == nullptr && chain->n_token_ids != 0) {
      return kvpool::capi::refuse(c, "kvpool_publish_chain: token_ids is NULL but n_token_ids is " +
                                         std::to_string(chain->n_token_ids));
    }
    if (chain->parent != nullptr) {
      described.parent = kvpool::BlockHash{chain->parent->lo, chain->parent->hi};
    }
    if (chain->n_token_ids != 0) described.token_ids = {chain->token_ids, chain->n_token_ids};
    if (chain->lora_name != nullptr) described.lora_name = chain->lora_name;
  }
  auto r = c->conn->publish(in, c->hints, described);
  if (!r.ok()) return fail(c, r);
  for (size_t i = 0; i < n; ++i) {
    out[i].duplicate = r.value()[i].kind == kvpool::PublishResult::Kind::duplicate ? 1 : 0;
    out[i].page = r.value()[i].page;
  }
  return KVPOOL_OK;
}

int kvpool_copy(kvpool_conn* c, const kvpool_page_id* src, const kvpool_page_id* dst, size_t n) {
  if (n > kvpool::wire::kMaxBatch) return too_many(c, n);
  std::vector<kvpool::wire::PageCopy> pairs(n);
  for (size_t i = 0; i < n; ++i)
    pairs[i] = kvpool::wire::PageCopy{src[i], dst[i]};
  auto r = c->conn->copy(pairs);
  return r.ok() ? KVPOOL_OK : fail(c, r);
}

int kvpool_get_stats(kvpool_conn* c, kvpool_stats* out) {
  auto r = c->conn->stats();
  if (!r.ok()) return fail(c, r);
  const auto& s = r.value();
  *out = kvpool_stats{s.total,
                      s.free,
                      s.in_use,
                      s.cached,
                      s.sessions,
                      s.counter("lookups"),
                      s.counter("lookup_blocks"),
                      s.counter("hit_blocks"),
                      s.counter("allocated"),
                      s.counter("released"),
                      s.counter("published"),
                      s.counter("duplicates"),
                      s.counter("evicted"),
                      s.counter("flushed"),
                      s.session_held_pages};
  return KVPOOL_OK;
}

size_t kvpool_counter_count(void) {
  return kvpool::stats::kNumPoolCounters;
}

const char* kvpool_counter_name(size_t i) {
  return row_name(kvpool::stats::kPoolCounters, i);
}

int kvpool_get_counters(kvpool_conn* c, uint64_t* values, size_t n, size_t* written) {
  return get_values(
      c, "kvpool_get_counters", values, n, written,
      [](const kvpool::wire::StatsReply& s) -> const auto& { return s.counters; });
}

size_t kvpool_daemon_counter_count(void) {
  return kvpool::stats::kNumDaemonCounters;
}

const char* kvpool_daemon_counter_name(size_t i) {
  return row_name(kvpool::stats::kDaemonCounters, i);
}

int kvpool_get_daemon_counters(kvpool_conn* c, uint64_t* values, size_t n, size_t* written) {
  return get_values(
      c, "kvpool_get_daemon_counters", values, n, written,
      [](const kvpool::wire::StatsReply& s) -> const auto& { return s.daemon_counters; });
}

int kvpool_poll_notices(kvpool_conn* c, int* changed) {
  return kvpool::capi::report_changed(c, c->conn->poll_notices(), changed);
}

int kvpool_resize(kvpool_conn* c, uint32_t pages, uint32_t* now) {
  auto r = c->conn->resize(pages);
  if (!r.ok()) return fail(c, r);
  if (now != nullptr) *now = r.value();
  return KVPOOL_OK;
}

}  // extern "C"
