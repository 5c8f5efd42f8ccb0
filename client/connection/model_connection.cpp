#include "client/connection/model_connection.h"

#include <algorithm>
#include <utility>

namespace kvpool::client {

Result<std::unique_ptr<ModelConnection>> ModelConnection::attach(const std::string& socket_path,
                                                                 const std::string& worker_name,
                                                                 const std::string& model,
                                                                 Connection::Memory memory,
                                                                 const HashScheme& hash_scheme) {
  auto first = Connection::attach(socket_path, worker_name, model, memory, 0, hash_scheme);
  if (!first.ok()) return first.error();
  std::unique_ptr<ModelConnection> m(new ModelConnection);
  const wire::PoolInfo info = first.value()->pool();
  if (info.groups.empty()) {  // a plain pool: a model of one group
    m->model_ = info.pool_name;
    m->names_ = {info.pool_name};
    m->groups_.push_back(std::move(first.value()));
    return m;
  }
  m->model_ = info.model;
  m->names_ = info.groups;
  m->groups_.resize(info.groups.size());
  const uint64_t link = first.value()->session_id();
  m->groups_[info.group] = std::move(first.value());
  for (size_t g = 0; g < info.groups.size(); ++g) {
    if (m->groups_[g]) continue;
    const std::string pool = info.model + "/" + info.groups[g];
    auto c = Connection::attach(socket_path, worker_name, pool, memory, link, hash_scheme);
    if (!c.ok()) {
      Error e = c.error();
      e.message = "group " + info.groups[g] + " (pool " + pool + "): " + e.message;
      return e;
    }
    m->groups_[g] = std::move(c.value());
  }
  return m;
}

Result<wire::GroupLookupReply> ModelConnection::lookup(std::span<const BlockHash> chain,
                                                       const PageHints& hints) {
  if (groups_.size() == 1 && groups_[0]->pool().groups.empty()) {
    auto l = groups_[0]->lookup_with_tiers(chain, hints);
    if (!l.ok()) return l.error();
    wire::GroupLookupReply r;
    r.groups.push_back(std::move(l.value()));
    return r;
  }
  auto r = groups_[0]->lookup_groups(chain, hints);
  if (!r.ok()) return r.error();
  // The reply came on group 0's connection: a group whose pool grew since its session last
  // synced maps its new segments now.
  for (size_t g = 0; g < groups_.size(); ++g) {
    const auto& pages = r.value().groups[g].pages;
    const uint32_t mapped = groups_[g]->num_pages();
    const bool beyond = std::any_of(pages.begin(), pages.end(),
                                    [&](PageId p) { return p != kNoPage && p >= mapped; });
    if (!beyond) continue;
    if (auto s = groups_[g]->sync_segments(); !s.ok()) return s.error();
  }
  return r;
}

}  // namespace kvpool::client
