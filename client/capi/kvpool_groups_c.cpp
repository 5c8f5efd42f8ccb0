// The C API's hybrid models and static reservations (client/capi/kvpool.h) over
// client::Connection: a model's names and groups from the hello's PoolInfo, lookup_groups and
// reserve / unreserve.

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "client/capi/capi_conn.h"
#include "client/capi/kvpool.h"

using kvpool::capi::fail;
using kvpool::capi::refuse;
using kvpool::capi::too_many;

extern "C" {

const char* kvpool_model_name(const kvpool_conn* c) {
  return c->model.c_str();
}

uint32_t kvpool_num_groups(const kvpool_conn* c) {
  return static_cast<uint32_t>(c->groups.size());
}

uint32_t kvpool_group(const kvpool_conn* c) {
  return c->conn->pool().group;
}

const char* kvpool_group_name(const kvpool_conn* c, uint32_t g) {
  return g < c->groups.size() ? c->groups[g].c_str() : nullptr;
}

int kvpool_sync_pool(kvpool_conn* c, int* changed) {
  return kvpool::capi::report_changed(c, c->conn->sync_segments(), changed);
}

uint64_t kvpool_session_id(const kvpool_conn* c) {
  return c->conn->session_id();
}

int kvpool_lookup_groups(kvpool_conn* c, const kvpool_hash* chain, size_t n, kvpool_page_id* out,
                         uint32_t* hits) {
  *hits = 0;
  if (n > kvpool::wire::kMaxBatch) return too_many(c, n);
  std::vector<kvpool::BlockHash> hashes(n);
  for (size_t i = 0; i < n; ++i)
    hashes[i] = kvpool::BlockHash{chain[i].lo, chain[i].hi};
  auto r = c->conn->lookup_groups(hashes, c->hints);
  if (!r.ok()) return fail(c, r);
  const kvpool::wire::GroupLookupReply& reply = r.value();
  // The daemon answers every group of the model, each with hits() entries (≤ n).
  for (size_t g = 0; g < reply.groups.size(); ++g) {
    const std::vector<kvpool::PageId>& pages = reply.groups[g].pages;
    if (!pages.empty()) {
      std::memcpy(out + g * n, pages.data(), pages.size() * sizeof(kvpool_page_id));
    }
  }
  *hits = reply.hits();
  return KVPOOL_OK;
}

int kvpool_reserve(kvpool_conn* c, uint32_t max_tokens, const kvpool_page_id* seeds, size_t n_seeds,
                   uint64_t* reservation, kvpool_page_id* table, size_t table_len,
                   size_t* written) {
  if (written != nullptr) *written = 0;
  if (seeds == nullptr && n_seeds != 0) {
    return refuse(c, "kvpool_reserve: seeds is NULL but n_seeds is " + std::to_string(n_seeds));
  }
  if (n_seeds > kvpool::wire::kMaxBatch) return too_many(c, n_seeds);
  const uint32_t tpp = std::max(1u, c->conn->pool().geometry.tokens_per_page);
  const uint64_t pages = (uint64_t{max_tokens} + tpp - 1) / tpp;
  if (table == nullptr || table_len < pages) {
    return refuse(c, "kvpool_reserve: the table has room for " + std::to_string(table_len) +
                         " pages, a reservation of " + std::to_string(max_tokens) + " tokens has " +
                         std::to_string(pages));
  }
  auto r = c->conn->reserve(max_tokens, std::span(seeds, n_seeds), c->hints);
  if (!r.ok()) return fail(c, r);
  const kvpool::wire::ReserveReply& reply = r.value();
  if (!reply.pages.empty()) {
    std::memcpy(table, reply.pages.data(), reply.pages.size() * sizeof(kvpool_page_id));
  }
  *reservation = reply.reservation;
  if (written != nullptr) *written = reply.pages.size();
  return KVPOOL_OK;
}

int kvpool_unreserve(kvpool_conn* c, uint64_t reservation) {
  auto r = c->conn->unreserve(reservation);
  return r.ok() ? KVPOOL_OK : fail(c, r);
}

}  // extern "C"
