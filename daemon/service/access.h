// Access: who may open a session, use a pool, take pages, pin them and run an operator's call.
//
// Tenants: a tenant's index (and so its namespace, index + 1) is given the first time its name is
// seen and never changes while the daemon runs, across reloads too: a session keeps the namespace
// it attached with, and a tenant that leaves the config and comes back finds its cache again.
// A peer's tenant comes from its credentials (SO_PEERCRED) and the config, never from the client.
//
// Sessions: open_session refuses a peer (too_many_sessions) when limits.max_sessions sessions or
// limits.max_sessions_per_uid sessions of its uid are open, unless the peer is an admin (root or
// admin_group), who may open kAdminReservedSessions more, so no flood locks an operator out.
//
// Pools: a tenant may attach to the pools its entry lists; the implicit default tenant to the
// pools no entry lists (config.h); an admin to every pool.
//
// Quotas: every call that can hand a session a page it does not hold counts against
// max_pages_per_session and max_pages_per_tenant (distinct pages held); new_pages_allowed() is
// what is left, quota_error() names the limit that refuses.
//
// Pins: a pin's TTL must not pass limits.max_pin_ttl_ms; pins are charged to the session's
// tenant, at most limits.max_pinned_pages_per_tenant pages per pool (default a quarter of it),
// and all tenants together at most limits.max_pinned_pool_percent of it.
//
// Admin: root, or a member (primary or supplementary group) of the config's admin_group.
//
// Invariants: tenant_held(t) is the sum of held_pages over t's attached sessions; every open
// session is in live(). Thread-safety: event loop only. Error policy: refusals are wire::Errors
// naming the limit or permission and the values involved; nothing here changes state on refusal.
#pragma once

#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/wire/protocol.h"
#include "daemon/config/config.h"
#include "daemon/core/page_pool.h"
#include "daemon/pool/pool_set.h"
#include "daemon/service/session.h"

namespace kvpool::daemon {

class Access {
 public:
  // `config` is the Service's running config, read at each call (a reload changes it).
  explicit Access(const Config& config) : config_(config) {}

  // Registers the config's tenants (at start and after a reload) and logs the pools they share.
  void apply(const PoolSet& pools);
  const std::vector<std::string>& tenants() const { return tenant_names_; }
  const std::string& tenant_name(uint32_t tenant) const { return tenant_names_[tenant]; }

  // A new connection (too_many_sessions, permission_denied when refused), and its end (the
  // caller has released what it holds).
  wire::Result<std::unique_ptr<SessionState>> open_session(const PeerCredentials& peer);
  void close_session(SessionState& s);
  uint32_t session_count() const { return sessions_; }
  const std::set<SessionState*>& live() const { return live_; }
  bool tenant_may_use(uint32_t tenant, const PoolRuntime& pool) const;

  // Quotas: the session's held pages after a call; pages it may still take that it does not
  // hold (PagePool::kUnlimited: no quota); the quota_exceeded error for `wanted` more.
  void refresh_held(SessionState& s);
  uint32_t new_pages_allowed(const SessionState& s) const;
  wire::Error quota_error(const SessionState& s, uint64_t wanted) const;

  // Pins: the pool's CallHints for a request's hints, or the error naming the limit they pass;
  // the error for a failed hinted call (pin_limit_exceeded names the limit; others as they are).
  wire::Result<core::CallHints> call_hints(const SessionState& s, const PageHints& hints) const;
  wire::Error hint_error(const SessionState& s, const Status& st) const;

  // Root, or a member of admin_group; else the permission_denied error naming `what`.
  wire::Result<bool> check_admin(const PeerCredentials& peer, std::string_view what) const;
  bool is_admin(const SessionState& s) const { return check_admin(s.peer, "").ok(); }

 private:
  uint32_t tenant_index(const std::string& name);
  // Index into tenant_names_ for a peer, or -1 to refuse it.
  int tenant_of(const PeerCredentials& peer);
  uint32_t pin_limit(const PoolRuntime& pool) const;

  const Config& config_;
  std::vector<std::string> tenant_names_;  // every tenant seen; index = namespace − 1, stable
  std::vector<uint64_t> tenant_held_;      // distinct pages held by the tenant's sessions
  uint32_t sessions_ = 0;
  std::unordered_map<uid_t, uint32_t> uid_sessions_;  // open sessions per peer uid
  std::set<SessionState*> live_;                      // every open session
  uint64_t next_session_id_ = 1;
};

// The message without the leading "name: ": every client says the error's name itself (Python's
// kvpool.Error, kvpoolctl, the C API's kvpool_last_error), so a message that repeats it would
// print it twice.
wire::Error from_status(const Status& s);

}  // namespace kvpool::daemon
