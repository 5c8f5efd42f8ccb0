#include "daemon/service/access.h"

#include <grp.h>

#include <algorithm>
#include <fstream>
#include <sstream>

#include "daemon/telemetry/log.h"

namespace kvpool::daemon {

namespace {

// Supplementary groups of a process, from /proc/PID/status ("Groups: 4 24 27").
std::vector<gid_t> groups_of(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  std::vector<gid_t> out;
  while (std::getline(in, line)) {
    if (line.rfind("Groups:", 0) != 0) continue;
    std::istringstream g(line.substr(7));
    unsigned long v = 0;
    while (g >> v)
      out.push_back(static_cast<gid_t>(v));
  }
  return out;
}

}  // namespace

wire::Error from_status(const Status& s) {
  std::string message = s.message();
  const std::string_view name = errc_name(s.code());
  if (message.size() > name.size() + 2 && message.compare(0, name.size(), name) == 0 &&
      message.compare(name.size(), 2, ": ") == 0) {
    message.erase(0, name.size() + 2);
  }
  return wire::Error{s, std::move(message)};
}

void Access::apply(const PoolSet& pools) {
  for (const TenantConfig& t : config_.tenants)
    tenant_index(t.name);
  if (!config_.default_tenant.empty()) tenant_index(config_.default_tenant);
  // Tenants share a pool only where it says share_between_tenants (the config refuses the rest).
  for (const auto& pool : pools.pools()) {
    std::string users;
    size_t n = 0;
    for (const TenantConfig& t : config_.tenants) {
      const std::string& name = pool->config().tenancy_name();
      if (std::find(t.pools.begin(), t.pools.end(), name) == t.pools.end()) continue;
      users += (n++ == 0 ? "" : ",") + t.name;
    }
    if (n < 2) continue;
    log_event(LogLevel::warn, "pool_shared",
              {kv("pool", pool->name()), kv("tenants", users),
               kv("detail",
                  "trusted tenants share bytes: each can read and overwrite the others' pages "
                  "(share_between_tenants: true)")});
  }
}

uint32_t Access::tenant_index(const std::string& name) {
  const auto it = std::find(tenant_names_.begin(), tenant_names_.end(), name);
  if (it != tenant_names_.end()) return static_cast<uint32_t>(it - tenant_names_.begin());
  tenant_names_.push_back(name);
  tenant_held_.push_back(0);
  return static_cast<uint32_t>(tenant_names_.size() - 1);
}

int Access::tenant_of(const PeerCredentials& peer) {
  for (const TenantConfig& t : config_.tenants) {
    if (std::find(t.uids.begin(), t.uids.end(), peer.uid) != t.uids.end() ||
        std::find(t.gids.begin(), t.gids.end(), peer.gid) != t.gids.end()) {
      return static_cast<int>(tenant_index(t.name));
    }
  }
  if (config_.default_tenant.empty()) return -1;
  return static_cast<int>(tenant_index(config_.default_tenant));
}

bool Access::tenant_may_use(uint32_t tenant, const PoolRuntime& pool) const {
  const auto lists = [&](const TenantConfig& t) {
    return std::find(t.pools.begin(), t.pools.end(), pool.config().tenancy_name()) != t.pools.end();
  };
  for (const TenantConfig& t : config_.tenants) {
    if (t.name == tenant_names_[tenant]) return lists(t);
  }
  // A tenant without an entry is the implicit default tenant, which may use the pools no tenant
  // entry claims (so it never shares one by accident); a tenant a reload removed may use none
  // until it is configured again.
  if (tenant_names_[tenant] != config_.default_tenant) return false;
  return std::none_of(config_.tenants.begin(), config_.tenants.end(), lists);
}

wire::Result<std::unique_ptr<SessionState>> Access::open_session(const PeerCredentials& peer) {
  const auto held = uid_sessions_.find(peer.uid);
  const uint32_t of_uid = held == uid_sessions_.end() ? 0 : held->second;
  const bool over_total = sessions_ >= config_.max_sessions;
  const bool over_uid = config_.max_sessions_per_uid != 0 && of_uid >= config_.max_sessions_per_uid;
  // An operator is never locked out by others' connections: admins may go past both limits, by
  // up to kAdminReservedSessions sessions in all.
  if ((over_total || over_uid) &&
      (sessions_ >= config_.max_sessions + kAdminReservedSessions || !check_admin(peer, "").ok())) {
    if (over_total) {
      return wire::Error::of(Errc::too_many_sessions, "the daemon serves its maximum of " +
                                                          std::to_string(config_.max_sessions) +
                                                          " sessions (limits.max_sessions)");
    }
    return wire::Error::of(
        Errc::too_many_sessions,
        "uid " + std::to_string(peer.uid) + " already has " + std::to_string(of_uid) +
            " sessions, the most one uid may open (limits.max_sessions_per_uid)");
  }
  const int tenant = tenant_of(peer);
  if (tenant < 0) {
    return wire::Error::of(Errc::permission_denied,
                           "uid " + std::to_string(peer.uid) + " gid " + std::to_string(peer.gid) +
                               " matches no tenant and there is no default tenant");
  }
  auto s = std::make_unique<SessionState>();
  s->id = next_session_id_++;
  s->peer = peer;
  s->tenant = static_cast<uint32_t>(tenant);
  ++sessions_;
  ++uid_sessions_[peer.uid];
  live_.insert(s.get());
  return s;
}

void Access::refresh_held(SessionState& s) {
  const uint64_t now = s.pool->pages().owner_pages(s.owner);
  tenant_held_[s.tenant] = tenant_held_[s.tenant] - s.held_pages + now;
  s.held_pages = now;
}

uint32_t Access::new_pages_allowed(const SessionState& s) const {
  uint64_t allowed = core::PagePool::kUnlimited;
  if (config_.max_pages_per_session != 0) {
    allowed = std::min(allowed, config_.max_pages_per_session -
                                    std::min(s.held_pages, config_.max_pages_per_session));
  }
  if (config_.max_pages_per_tenant != 0) {
    const uint64_t held = tenant_held_[s.tenant];
    allowed = std::min(allowed,
                       config_.max_pages_per_tenant - std::min(held, config_.max_pages_per_tenant));
  }
  return static_cast<uint32_t>(allowed);
}

wire::Error Access::quota_error(const SessionState& s, uint64_t wanted) const {
  if (config_.max_pages_per_session != 0 && s.held_pages + wanted > config_.max_pages_per_session) {
    return wire::Error::of(Errc::quota_exceeded,
                           "session holds " + std::to_string(s.held_pages) + " pages; " +
                               std::to_string(wanted) +
                               " more would pass limits.max_pages_per_session = " +
                               std::to_string(config_.max_pages_per_session),
                           wanted);
  }
  return wire::Error::of(
      Errc::quota_exceeded,
      "tenant " + tenant_names_[s.tenant] + " holds " + std::to_string(tenant_held_[s.tenant]) +
          " pages; " + std::to_string(wanted) + " more would pass limits.max_pages_per_tenant = " +
          std::to_string(config_.max_pages_per_tenant),
      wanted);
}

uint32_t Access::pin_limit(const PoolRuntime& pool) const {
  return config_.max_pinned_pages_per_tenant != 0 ? config_.max_pinned_pages_per_tenant
                                                  : pool.pages().num_pages() / 4;
}

wire::Result<core::CallHints> Access::call_hints(const SessionState& s,
                                                 const PageHints& hints) const {
  const uint64_t pool_cap =
      uint64_t{s.pool->pages().num_pages()} * config_.max_pinned_pool_percent / 100;
  core::CallHints h{hints, s.tenant, pin_limit(*s.pool), static_cast<uint32_t>(pool_cap)};
  if (hints.pin_ttl_ms > config_.max_pin_ttl_ms) {
    return wire::Error::of(
        Errc::invalid_argument,
        "hints.pin_ttl_ms " + std::to_string(hints.pin_ttl_ms) +
            " is above limits.max_pin_ttl_ms = " + std::to_string(config_.max_pin_ttl_ms) +
            (config_.max_pin_ttl_ms == 0 ? " (pins are off)" : ""),
        hints.pin_ttl_ms);
  }
  return h;
}

wire::Error Access::hint_error(const SessionState& s, const Status& st) const {
  if (st.code() != Errc::pin_limit_exceeded) return from_status(st);
  if (st.item() == core::PagePool::kPoolPinItem) {
    return wire::Error::of(Errc::pin_limit_exceeded,
                           "pool " + s.pool->name() + " would have " + std::to_string(st.value()) +
                               " pages pinned, every tenant together, above its cap of " +
                               std::to_string(uint64_t{s.pool->pages().num_pages()} *
                                              config_.max_pinned_pool_percent / 100) +
                               " (limits.max_pinned_pool_percent = " +
                               std::to_string(config_.max_pinned_pool_percent) + ")",
                           st.value());
  }
  return wire::Error::of(Errc::pin_limit_exceeded,
                         "tenant " + tenant_names_[s.tenant] + " would have " +
                             std::to_string(st.value()) + " pages of pool " + s.pool->name() +
                             " pinned, above its limit of " + std::to_string(pin_limit(*s.pool)) +
                             (config_.max_pinned_pages_per_tenant != 0
                                  ? " (limits.max_pinned_pages_per_tenant)"
                                  : " (a quarter of the pool; limits.max_pinned_pages_per_tenant)"),
                         st.value());
}

wire::Result<bool> Access::check_admin(const PeerCredentials& peer, std::string_view what) const {
  if (peer.uid == 0) return true;
  if (!config_.admin_group.empty()) {
    if (const struct group* g = ::getgrnam(config_.admin_group.c_str()); g != nullptr) {
      if (peer.gid == g->gr_gid) return true;
      const auto groups = groups_of(peer.pid);
      if (std::find(groups.begin(), groups.end(), g->gr_gid) != groups.end()) return true;
    }
  }
  return wire::Error::of(Errc::permission_denied,
                         std::string(what) + " needs root or membership of the admin group" +
                             (config_.admin_group.empty() ? " (admin_group is not set: root only)"
                                                          : " " + config_.admin_group) +
                             "; uid " + std::to_string(peer.uid) + " is neither");
}

void Access::close_session(SessionState& s) {
  if (s.attached) {
    tenant_held_[s.tenant] -= s.held_pages;
    s.held_pages = 0;
  }
  --sessions_;
  if (--uid_sessions_[s.peer.uid] == 0) uid_sessions_.erase(s.peer.uid);
  live_.erase(&s);
}

}  // namespace kvpool::daemon
