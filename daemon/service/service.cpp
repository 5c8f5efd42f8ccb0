#include "daemon/service/service.h"

#include <grp.h>

#include <algorithm>
#include <fstream>
#include <new>
#include <random>
#include <sstream>
#include <unordered_map>

#include "common/byte_units.h"
#include "common/system_memory.h"
#include "daemon/telemetry/log.h"

namespace kvpool::daemon {

namespace {

// What the daemon keeps per page besides the pool memory, an upper bound: the core's page word
// and key (24 bytes), free stack (4), batch mark (8), prefix index (at most 4 slots of 8) and LRU
// links (8), and the prefix hit counters (16).
constexpr uint64_t kBookkeepingBytesPerPage = 96;

// The message without the leading "name: ": every client says the error's name itself (Python's
// kvpool.Error, kvpoolctl, the C API's kvpool_last_error), so a message that repeats it would
// print it twice.
wire::Error from_status(const Status& s) {
  std::string message = s.message();
  const std::string_view name = errc_name(s.code());
  if (message.size() > name.size() + 2 && message.compare(0, name.size(), name) == 0 &&
      message.compare(name.size(), 2, ": ") == 0) {
    message.erase(0, name.size() + 2);
  }
  return wire::Error{s, std::move(message)};
}

wire::Error error(Errc code, std::string message, uint64_t value = 0) {
  return wire::Error{Status(code, kNoItem, value), std::move(message)};
}

}  // namespace

Service::Service(const Config& config, std::unique_ptr<MemoryBackend> backend)
    : config_(config), backend_(std::move(backend)) {}

wire::Result<std::unique_ptr<Service>> Service::create(const Config& config,
                                                       std::unique_ptr<MemoryBackend> backend) {
  // The checks in create_unguarded keep a pool's bookkeeping within memory; should an allocation
  // still fail, the start fails naming the pool being set up instead of ending in an uncaught
  // std::bad_alloc.
  const PoolConfig* current = nullptr;
  try {
    return create_unguarded(config, std::move(backend), current);
  } catch (const std::bad_alloc&) {
    std::string who;
    if (current != nullptr) {
      who = "pool " + current->name;
    } else {
      for (const PoolConfig& pc : config.pools)
        who += (who.empty() ? "pools " : ", ") + pc.name;
    }
    return error(Errc::invalid_argument,
                 who + ": not enough memory for the daemon's bookkeeping of the pages (about " +
                     std::to_string(kBookkeepingBytesPerPage) +
                     " bytes a page besides the pool memory; std::bad_alloc); use a smaller "
                     "capacity or larger pages");
  }
}

wire::Result<std::unique_ptr<Service>> Service::create_unguarded(
    const Config& config, std::unique_ptr<MemoryBackend> backend, const PoolConfig*& current) {
  std::unique_ptr<Service> svc(new Service(config, std::move(backend)));
  if (config.memory_budget) {
    const Capacity& b = *config.memory_budget;
    svc->budget_bytes_ =
        b.unit == Capacity::Unit::fraction
            ? static_cast<uint64_t>(static_cast<double>(svc->backend_->available_bytes()) *
                                    b.fraction)
            : b.value;
  }
  for (const PoolConfig& pc : config.pools) {
    current = &pc;
    const Geometry& g = pc.geometry;
    const uint64_t per_page = page_data_bytes(g) + page_scale_bytes(g);
    uint64_t pages = 0;
    switch (pc.capacity.unit) {
      case Capacity::Unit::pages:
        pages = pc.capacity.value;
        break;
      case Capacity::Unit::bytes:
        pages = pc.capacity.value / per_page;
        break;
      case Capacity::Unit::fraction:
        pages = static_cast<uint64_t>(static_cast<double>(svc->backend_->available_bytes()) *
                                      pc.capacity.fraction) /
                per_page;
        break;
    }
    if (pages == 0) {
      return error(Errc::invalid_argument,
                   "pool " + pc.name + ": its capacity holds no page of " + human_bytes(per_page));
    }
    if (pages > core::kMaxPages) {
      return error(Errc::invalid_argument,
                   "pool " + pc.name + ": " + std::to_string(pages) + " pages exceed the limit");
    }
    if (pages > UINT64_MAX / per_page) {
      return error(Errc::invalid_argument, "pool " + pc.name + ": " + std::to_string(pages) +
                                               " pages of " + human_bytes(per_page) +
                                               " exceed 2^64 bytes");
    }
    // Before any pool memory is reserved: the daemon's own per-page bookkeeping must fit too.
    const uint64_t bookkeeping = pages * kBookkeepingBytesPerPage;
    if (const auto avail = mem_available_bytes(); avail && bookkeeping > *avail) {
      return error(Errc::invalid_argument,
                   "pool " + pc.name + ": its " + std::to_string(pages) + " pages need about " +
                       human_bytes(bookkeeping) + " of daemon memory for their bookkeeping (" +
                       std::to_string(kBookkeepingBytesPerPage) + " bytes a page), more than the " +
                       human_bytes(*avail) +
                       " available (MemAvailable, /proc/meminfo); use a smaller capacity or "
                       "larger pages");
    }
    auto pool = std::make_unique<Pool>();
    pool->config = pc;
    if (pc.max_capacity) {
      auto n = svc->create_elastic(*pool, static_cast<uint32_t>(pages));
      if (!n.ok()) return n.error();
      pages = n.value();
    } else {
      auto memory = svc->backend_->create(pages * per_page, config.max_segment_bytes, pc.name);
      if (!memory.ok()) return memory.error();
      pool->memory = std::move(memory.value());
      pool->info.reserved_bytes = pool->memory->reserved_bytes();
      pool->info.scales_offset = pages * page_data_bytes(g);
      pool->info.max_pages = static_cast<uint32_t>(pages);
    }
    core::PoolOptions opts;
    opts.num_pages = static_cast<uint32_t>(pages);
    opts.policy = core::make_policy(pc.policy);
    if (!opts.policy) return error(Errc::invalid_argument, "pool " + pc.name + ": unknown policy");
    pool->pages = std::make_unique<core::PagePool>(std::move(opts));
    pool->info.geometry = g;
    pool->info.layout = pc.layout;
    pool->info.num_pages = static_cast<uint32_t>(pages);
    pool->info.page_stride = page_data_bytes(g);
    pool->info.segment_bytes = pool->memory->bytes();
    pool->info.pool_name = pc.name;
    pool->info.backend = std::string(svc->backend_->name());
    pool->info.device = svc->backend_->device();
    pool->info.device_uuid = svc->backend_->device_uuid();
    pool->info.segments = pool->memory->segments();
    pool->index = static_cast<uint16_t>(svc->pools_.size());
    log_event(LogLevel::info, "pool_ready",
              {kv("pool", pc.name), kv("pages", pages), kv("page_bytes", per_page),
               kv("bytes", pool->info.segment_bytes), kv("size", human_bytes(pages * per_page)),
               kv("backend", pool->info.backend), kv("segments", pool->info.segments.size()),
               kv("policy", pc.policy), kv("layout", std::string(layout_name(pc.layout)))});
    svc->pools_.push_back(std::move(pool));
  }
  current = nullptr;
  if (svc->elastic_bytes() > svc->budget_bytes_) {
    return error(Errc::invalid_argument,
                 "the elastic pools start with " + human_bytes(svc->elastic_bytes()) +
                     " mapped, above memory_budget (" + human_bytes(svc->budget_bytes_) +
                     "); lower their capacity or raise the budget");
  }
  for (const TenantConfig& t : config.tenants)
    svc->tenant_index(t.name);
  if (!config.default_tenant.empty()) svc->tenant_index(config.default_tenant);
  svc->log_shared_pools();
  svc->init_operations();
  for (auto& pool : svc->pools_) {
    current = &pool->config;
    if (auto err = svc->attach_host_tier(*pool); !err.ok()) return err.error();
  }
  current = nullptr;
  return svc;
}

wire::Result<bool> Service::attach_host_tier(Pool& pool) {
  const PoolConfig& pc = pool.config;
  if (!pc.host_tier) return true;
  const uint64_t per_page = page_data_bytes(pc.geometry) + page_scale_bytes(pc.geometry);
  uint64_t slots = pc.host_tier->value;
  if (pc.host_tier->unit == Capacity::Unit::bytes) slots = pc.host_tier->value / per_page;
  if (pc.host_tier->unit == Capacity::Unit::fraction) {
    uint64_t avail = mem_available_bytes().value_or(0);
    if (const auto cgroup = cgroup_memory_free_bytes()) avail = std::min(avail, *cgroup);
    slots = static_cast<uint64_t>(static_cast<double>(avail) * pc.host_tier->fraction) / per_page;
  }
  if (slots == 0 || slots > core::kMaxPages) {
    return error(Errc::invalid_argument, "pool " + pc.name + ": host_tier holds " +
                                             std::to_string(slots) + " pages of " +
                                             human_bytes(per_page) + "; it must hold 1 to " +
                                             std::to_string(core::kMaxPages));
  }
  auto tier = PoolHostTier::create(*pool.pages, pool.index_events.get(), pc.geometry,
                                   static_cast<uint32_t>(slots), backend_->device(), pc.name);
  if (!tier.ok()) return tier.error();
  pool.host_tier = std::move(tier.value());
  log_event(
      LogLevel::info, "host_tier_ready",
      {kv("pool", pc.name), kv("pages", slots), kv("bytes", pool.host_tier->bytes()),
       kv("size", human_bytes(pool.host_tier->bytes())), kv("pinned", backend_->device() >= 0)});
  return true;
}

uint32_t Service::tenant_index(const std::string& name) {
  const auto it = std::find(tenant_names_.begin(), tenant_names_.end(), name);
  if (it != tenant_names_.end()) return static_cast<uint32_t>(it - tenant_names_.begin());
  tenant_names_.push_back(name);
  tenant_held_.push_back(0);
  return static_cast<uint32_t>(tenant_names_.size() - 1);
}

std::vector<std::string> Service::apply_live(const Config& next) {
  std::vector<std::string> restart;
  if (next.socket_path != config_.socket_path) restart.emplace_back("socket.path");
  if (next.socket_mode != config_.socket_mode) restart.emplace_back("socket.mode");
  if (next.socket_group != config_.socket_group) restart.emplace_back("socket.group");
  if (next.backend != config_.backend) restart.emplace_back("backend");
  if (next.device != config_.device) restart.emplace_back("device");
  if (next.max_segment_bytes != config_.max_segment_bytes) {
    restart.emplace_back("max_segment_bytes");
  }
  if (next.memory_budget != config_.memory_budget) restart.emplace_back("memory_budget");
  // Whether tenants may share a pool is a permission, checked at attach: it applies live (and
  // the config that sets it was validated with it), the rest of a pool waits for a restart.
  // The eviction policy too: PagePool::set_policy hands the cached pages over. And whether an
  // elastic pool grows ahead of need, which each call reads afresh.
  std::vector<PoolConfig> running_pools = config_.pools;
  if (next.pools.size() == running_pools.size()) {
    for (size_t i = 0; i < running_pools.size(); ++i) {
      running_pools[i].share_between_tenants = next.pools[i].share_between_tenants;
      running_pools[i].policy = next.pools[i].policy;
      running_pools[i].grow_ahead = next.pools[i].grow_ahead;
    }
  }
  if (next.pools != running_pools) restart.emplace_back("pools");
  // Operations, metrics and events: the endpoint, the segment and the ring are set up at start.
  if (next.metrics != config_.metrics) restart.emplace_back("metrics");
  if (next.events != config_.events) restart.emplace_back("events");
  // What can change live does; what cannot keeps its running value until a restart.
  Config applied = next;
  applied.socket_path = config_.socket_path;
  applied.socket_mode = config_.socket_mode;
  applied.socket_group = config_.socket_group;
  applied.backend = config_.backend;
  applied.device = config_.device;
  applied.max_segment_bytes = config_.max_segment_bytes;
  applied.memory_budget = config_.memory_budget;
  applied.pools = std::move(running_pools);
  applied.metrics = config_.metrics;
  applied.events = config_.events;
  config_ = std::move(applied);
  for (size_t i = 0; i < pools_.size(); ++i) {
    Pool& pool = *pools_[i];
    if (pool.config.policy != config_.pools[i].policy) {
      log_event(
          LogLevel::info, "policy_changed",
          {kv("pool", pool.config.name), kv("from", pool.config.policy),
           kv("to", config_.pools[i].policy), kv("cached_pages", pool.pages->stats().cached)});
      pool.pages->set_policy(core::make_policy(config_.pools[i].policy));
    }
    pool.config = config_.pools[i];
  }
  for (const TenantConfig& t : config_.tenants)
    tenant_index(t.name);
  if (!config_.default_tenant.empty()) tenant_index(config_.default_tenant);
  log_shared_pools();
  return restart;
}

int Service::tenant_of(const PeerCredentials& peer) {
  for (const TenantConfig& t : config_.tenants) {
    if (std::find(t.uids.begin(), t.uids.end(), peer.uid) != t.uids.end() ||
        std::find(t.gids.begin(), t.gids.end(), peer.gid) != t.gids.end()) {
      return static_cast<int>(tenant_index(t.name));
    }
  }
  if (config_.default_tenant.empty()) return -1;
  return static_cast<int>(tenant_index(config_.default_tenant));
}

bool Service::tenant_may_use(uint32_t tenant, const Pool& pool) const {
  const auto lists = [&](const TenantConfig& t) {
    return std::find(t.pools.begin(), t.pools.end(), pool.config.name) != t.pools.end();
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

void Service::log_shared_pools() const {
  for (const auto& pool : pools_) {
    std::string users;
    size_t n = 0;
    for (const TenantConfig& t : config_.tenants) {
      if (std::find(t.pools.begin(), t.pools.end(), pool->config.name) == t.pools.end()) continue;
      users += (n++ == 0 ? "" : ",") + t.name;
    }
    if (n < 2) continue;
    log_event(LogLevel::warn, "pool_shared",
              {kv("pool", pool->config.name), kv("tenants", users),
               kv("detail",
                  "trusted tenants share bytes: each can read and overwrite the others' pages "
                  "(share_between_tenants: true)")});
  }
}

wire::Result<std::unique_ptr<SessionState>> Service::open_session(const PeerCredentials& peer) {
  const auto held = uid_sessions_.find(peer.uid);
  const uint32_t of_uid = held == uid_sessions_.end() ? 0 : held->second;
  const bool over_total = sessions_ >= config_.max_sessions;
  const bool over_uid = config_.max_sessions_per_uid != 0 && of_uid >= config_.max_sessions_per_uid;
  // An operator is never locked out by others' connections: admins may go past both limits, by
  // up to kAdminReservedSessions sessions in all.
  if ((over_total || over_uid) &&
      (sessions_ >= config_.max_sessions + kAdminReservedSessions || !check_admin(peer, "").ok())) {
    if (over_total) {
      return error(Errc::too_many_sessions, "the daemon serves its maximum of " +
                                                std::to_string(config_.max_sessions) +
                                                " sessions (limits.max_sessions)");
    }
    return error(Errc::too_many_sessions,
                 "uid " + std::to_string(peer.uid) + " already has " + std::to_string(of_uid) +
                     " sessions, the most one uid may open (limits.max_sessions_per_uid)");
  }
  const int tenant = tenant_of(peer);
  if (tenant < 0) {
    return error(Errc::permission_denied, "uid " + std::to_string(peer.uid) + " gid " +
                                              std::to_string(peer.gid) +
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

void Service::close_session(SessionState& s) {
  if (s.attached) {
    const Status st = s.pool->pages->close_owner(s.owner);
    if (!st.ok()) {
      log_event(LogLevel::error, "session_close_failed",
                {kv("session", s.id), kv("error", st.message())});
    }
    tenant_held_[s.tenant] -= s.held_pages;
    s.held_pages = 0;
    s.attached = false;
    if (s.subscription) --subscribers_;
#ifndef NDEBUG
    // Debug and sanitizer builds verify DESIGN §3 whenever a session's references go back, so
    // the integration tests (kill -9 of workers included) check the invariants too.
    const std::string broken = s.pool->pages->check_invariants();
    if (!broken.empty()) {
      log_event(LogLevel::error, "invariant_broken",
                {kv("pool", s.pool->config.name), kv("detail", broken)});
      std::abort();
    }
#endif
  }
  --sessions_;
  if (--uid_sessions_[s.peer.uid] == 0) uid_sessions_.erase(s.peer.uid);
  live_.erase(&s);
}

void Service::refresh_held(SessionState& s) {
  const uint64_t now = s.pool->pages->owner_pages(s.owner);
  tenant_held_[s.tenant] = tenant_held_[s.tenant] - s.held_pages + now;
  s.held_pages = now;
}

void Service::handle(SessionState& s, uint32_t request_id, const wire::Request& request,
                     std::vector<std::byte>& out, std::span<const int>* fds_to_pass,
                     std::unique_ptr<CopyJob>* deferred) {
  *fds_to_pass = {};
  const uint64_t started = service_latency_.enabled() ? LatencyRecorder::now_ns() : 0;
  now_s_ = seconds_now();
  const wire::Opcode op = wire::opcode_of(request);
  wire::Result<wire::Reply> reply = error(Errc::internal, "unhandled request");
  if (!s.attached && op != wire::Opcode::hello) {
    reply = error(Errc::not_attached, "send hello before any other request");
  } else {
    reply = std::visit(
        [&](const auto& r) -> wire::Result<wire::Reply> {
          using T = std::decay_t<decltype(r)>;
          if constexpr (std::is_same_v<T, wire::HelloRequest>) return hello(s, r, fds_to_pass);
          if constexpr (std::is_same_v<T, wire::AllocRequest>) return alloc(s, r);
          if constexpr (std::is_same_v<T, wire::RetainRequest>) return retain(s, r);
          if constexpr (std::is_same_v<T, wire::ReleaseRequest>) return release(s, r);
          if constexpr (std::is_same_v<T, wire::LookupRequest>) return lookup(s, r);
          if constexpr (std::is_same_v<T, wire::PublishRequest>) return publish(s, r);
          if constexpr (std::is_same_v<T, wire::StatsRequest>) return stats(s);
          if constexpr (std::is_same_v<T, wire::EvictRequest>) return evict(s, r);
          if constexpr (std::is_same_v<T, wire::FlushRequest>) return flush(s);
          if constexpr (std::is_same_v<T, wire::SessionsRequest>) return sessions(s);
          if constexpr (std::is_same_v<T, wire::PagesRequest>) return pages(s);
          if constexpr (std::is_same_v<T, wire::CopyRequest>) {
            return copy(s, request_id, r, started, deferred);
          }
          // Operations, metrics and events.
          if constexpr (std::is_same_v<T, wire::PrefixesRequest>) return prefixes(s, r);
          if constexpr (std::is_same_v<T, wire::ReloadRequest>) return reload(s);
          if constexpr (std::is_same_v<T, wire::SubscribeRequest>) {
            return subscribe(s, request_id, r);
          }
          if constexpr (std::is_same_v<T, wire::SnapshotRequest>) return snapshot(s);
          // Elastic pools (service_resize.cpp).
          if constexpr (std::is_same_v<T, wire::SegmentsRequest>) return segments(s, fds_to_pass);
          if constexpr (std::is_same_v<T, wire::ResizeRequest>) return resize(s, r);
        },
        request);
  }
  // Pages the call evicted go down to the host tier before any reply tells a worker it may
  // write them; a lookup's promoted pages come up before it answers.
  if (s.attached && s.pool->host_tier && (deferred == nullptr || !*deferred)) {
    Pool& pool = *s.pool;
    pool.host_tier->plan_demote(paged_kv(pool), call_tier_);
    if (!call_tier_.empty()) {
      auto finish = [&pool, reply = std::move(reply), then = std::move(call_finish_)](
                        TierCopy& c) mutable -> wire::Result<wire::Reply> {
        if (then) return then(c);
        pool.host_tier->finish_demote(c);
        return std::move(reply);
      };
      call_finish_ = nullptr;
      if (deferred != nullptr &&
          (call_tier_.bytes() > inline_copy_bytes_ || pool.copies_in_flight > 0)) {
        auto job = std::make_unique<CopyJob>();
        job->pool = &pool;
        job->session = &s;
        job->request_id = request_id;
        job->op = op;
        job->started_ns = started;
        job->tier = std::make_unique<TierCopy>(std::exchange(call_tier_, {}));
        job->finish = [tier = job->tier.get(), finish = std::move(finish)]() mutable {
          return finish(*tier);
        };
        ++pool.copies_in_flight;
        *deferred = std::move(job);
        KVPOOL_CHECK(!call_job_);  // one job per call
        return;                    // finish_copy answers and times it
      }
      pool.host_tier->run(call_tier_);
      reply = finish(call_tier_);
      call_tier_ = {};
    }
  }
  if (call_job_) {
    // The call left its slow part to run off the loop (or here, when the caller cannot).
    std::unique_ptr<CopyJob> job = std::move(call_job_);
    job->session = &s;
    job->request_id = request_id;
    job->op = op;
    job->started_ns = started;
    if (deferred != nullptr) {
      *deferred = std::move(job);
      return;
    }
    job->run();
    reply = job->finish();
  }
  if (deferred != nullptr && *deferred) return;  // finish_copy answers and times it
  encode_answer(s, request_id, op, reply, out);
  if (!reply.ok()) *fds_to_pass = {};
  if (started != 0) {
    service_latency_.record(static_cast<uint16_t>(op), LatencyRecorder::now_ns() - started);
  }
  if (s.attached && s.pool->elastic()) grow_ahead(*s.pool);
}

void Service::encode_answer(SessionState& s, uint32_t request_id, wire::Opcode op,
                            const wire::Result<wire::Reply>& reply, std::vector<std::byte>& out) {
  // A session learns of a new segment list before any reply that could hand it a page there.
  if (s.attached && s.known_epoch != s.pool->info.epoch && op != wire::Opcode::segments) {
    s.known_epoch = s.pool->info.epoch;
    wire::encode_pool_changed(s.known_epoch, out);
  }
  if (reply.ok()) {
    wire::encode_reply(request_id, reply.value(), out);
  } else {
    wire::encode_error(request_id, static_cast<uint16_t>(op), reply.error(), out);
  }
}

wire::Result<wire::Reply> Service::hello(SessionState& s, const wire::HelloRequest& r,
                                         std::span<const int>* fds) {
  if (s.attached) return error(Errc::already_attached, "this connection already said hello");
  Pool* pool = nullptr;
  if (r.pool_name.empty()) {
    if (pools_.empty()) return error(Errc::no_such_pool, "the daemon has no pools");
    pool = pools_.front().get();
  } else {
    for (const auto& p : pools_) {
      if (p->config.name == r.pool_name) pool = p.get();
    }
  }
  if (pool == nullptr) return error(Errc::no_such_pool, "no pool named " + r.pool_name);
  // Operators (root, admin_group) inspect every pool (kvpoolctl --pool); they are trusted with
  // its bytes as they are with the daemon.
  if (!tenant_may_use(s.tenant, *pool) && !check_admin(s.peer, "").ok()) {
    return error(Errc::permission_denied,
                 "tenant " + tenant_names_[s.tenant] + " may not use pool " + pool->config.name);
  }
  s.pool = pool;
  s.owner = pool->pages->open_owner();
  s.attached = true;
  s.known_epoch = pool->info.epoch;
  s.worker_name = r.worker_name;
  *fds = pool->memory->fds();
  wire::HelloReply h;
  h.session_id = s.id;
  h.pool = pool->info;
  h.pool.tenant = tenant_names_[s.tenant];
  log_event(LogLevel::info, "session_attach",
            {kv("session", s.id), kv("worker", r.worker_name), kv("pid", s.peer.pid),
             kv("uid", s.peer.uid), kv("tenant", tenant_names_[s.tenant]),
             kv("pool", pool->config.name)});
  return wire::Reply(std::move(h));
}

uint32_t Service::new_pages_allowed(const SessionState& s) const {
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

wire::Error Service::quota_error(const SessionState& s, uint64_t wanted) const {
  if (config_.max_pages_per_session != 0 && s.held_pages + wanted > config_.max_pages_per_session) {
    return error(Errc::quota_exceeded,
                 "session holds " + std::to_string(s.held_pages) + " pages; " +
                     std::to_string(wanted) + " more would pass limits.max_pages_per_session = " +
                     std::to_string(config_.max_pages_per_session),
                 wanted);
  }
  return error(Errc::quota_exceeded,
               "tenant " + tenant_names_[s.tenant] + " holds " +
                   std::to_string(tenant_held_[s.tenant]) + " pages; " + std::to_string(wanted) +
                   " more would pass limits.max_pages_per_tenant = " +
                   std::to_string(config_.max_pages_per_tenant),
               wanted);
}

uint32_t Service::pin_limit(const Pool& pool) const {
  return config_.max_pinned_pages_per_tenant != 0 ? config_.max_pinned_pages_per_tenant
                                                  : pool.pages->num_pages() / 4;
}

wire::Result<core::CallHints> Service::call_hints(const SessionState& s,
                                                  const PageHints& hints) const {
  const uint64_t pool_cap =
      uint64_t{s.pool->pages->num_pages()} * config_.max_pinned_pool_percent / 100;
  core::CallHints h{hints, s.tenant, pin_limit(*s.pool), static_cast<uint32_t>(pool_cap)};
  if (hints.pin_ttl_ms > config_.max_pin_ttl_ms) {
    return error(Errc::invalid_argument,
                 "hints.pin_ttl_ms " + std::to_string(hints.pin_ttl_ms) +
                     " is above limits.max_pin_ttl_ms = " + std::to_string(config_.max_pin_ttl_ms) +
                     (config_.max_pin_ttl_ms == 0 ? " (pins are off)" : ""),
                 hints.pin_ttl_ms);
  }
  return h;
}

wire::Error Service::hint_error(const SessionState& s, const Status& st) const {
  if (st.code() != Errc::pin_limit_exceeded) return from_status(st);
  if (st.item() == core::PagePool::kPoolPinItem) {
    return error(Errc::pin_limit_exceeded,
                 "pool " + s.pool->config.name + " would have " + std::to_string(st.value()) +
                     " pages pinned, every tenant together, above its cap of " +
                     std::to_string(uint64_t{s.pool->pages->num_pages()} *
                                    config_.max_pinned_pool_percent / 100) +
                     " (limits.max_pinned_pool_percent = " +
                     std::to_string(config_.max_pinned_pool_percent) + ")",
                 st.value());
  }
  return error(Errc::pin_limit_exceeded,
               "tenant " + tenant_names_[s.tenant] + " would have " + std::to_string(st.value()) +
                   " pages of pool " + s.pool->config.name + " pinned, above its limit of " +
                   std::to_string(pin_limit(*s.pool)) +
                   (config_.max_pinned_pages_per_tenant != 0
                        ? " (limits.max_pinned_pages_per_tenant)"
                        : " (a quarter of the pool; limits.max_pinned_pages_per_tenant)"),
               st.value());
}

wire::Error Service::alloc_error(const SessionState& s, const Status& st, uint64_t growable) const {
  const Pool& pool = *s.pool;
  const std::string what =
      "alloc of " + std::to_string(st.value()) + " pages: pool " + pool.config.name;
  if (st.code() == Errc::exceeds_capacity) {
    return error(
        Errc::exceeds_capacity,
        what + " holds at most " +
            std::to_string(pool.elastic() ? pool.info.max_pages : pool.pages->num_pages()) +
            (pool.elastic() ? " pages (max_capacity)" : " pages (capacity)"),
        st.value());
  }
  if (st.code() == Errc::out_of_pages) {
    const core::PoolStats ps = pool.pages->stats();
    return error(Errc::out_of_pages,
                 what + " has " + std::to_string(ps.free) + " free and " +
                     std::to_string(ps.cached - ps.pinned_cached) + " evictable pages" +
                     (pool.elastic() ? " and can grow by at most " + std::to_string(growable)
                                     : std::string()) +
                     "; the rest are in use or pinned",
                 st.value());
  }
  return hint_error(s, st);
}

wire::Result<wire::Reply> Service::alloc(SessionState& s, const wire::AllocRequest& r) {
  const uint64_t n = r.count;
  if (n > new_pages_allowed(s)) return quota_error(s, n);
  auto hints = call_hints(s, r.hints);
  if (!hints.ok()) return hints.error();
  // Every refusal comes first: an alloc that fails must not grow its pool, shrink another or
  // evict anything on its way to failing.
  // What the pool could grow by (a walk over every elastic pool's segments) is asked only when
  // its own free and evictable pages fall short: most allocs never pay for it.
  const uint32_t max_pages =
      s.pool->elastic() ? s.pool->info.max_pages : s.pool->pages->num_pages();
  uint64_t growable = 0;
  Status admitted = s.pool->pages->admit_alloc(n, hints.value(), max_pages, 0);
  if (admitted.code() == Errc::out_of_pages && s.pool->elastic()) {
    growable = growable_pages(*s.pool);
    admitted = s.pool->pages->admit_alloc(n, hints.value(), max_pages, growable);
  }
  if (!admitted.ok()) return alloc_error(s, admitted, growable);
  // An elastic pool grows before it evicts, as far as its max and the budget allow.
  if (s.pool->elastic() && s.pool->pages->stats().free < n) grow_for(*s.pool, n);
  wire::AllocReply a;
  a.pages.resize(n);
  const Status st = s.pool->pages->alloc(s.owner, a.pages, hints.value());
  if (!st.ok()) return hint_error(s, st);
  refresh_held(s);
  return wire::Reply(std::move(a));
}

wire::Result<wire::Reply> Service::retain(SessionState& s, const wire::RetainRequest& r) {
  auto hints = call_hints(s, r.hints);
  if (!hints.ok()) return hints.error();
  const Status st = s.pool->pages->retain(s.owner, r.pages, hints.value());
  if (!st.ok()) return hint_error(s, st);
  return wire::Reply(wire::RetainReply{});
}

wire::Result<wire::Reply> Service::release(SessionState& s, const wire::ReleaseRequest& r) {
  const Status st = s.pool->pages->release(s.owner, r.pages);
  if (!st.ok()) return from_status(st);
  refresh_held(s);
  return wire::Reply(wire::ReleaseReply{});
}

wire::Result<wire::Reply> Service::lookup(SessionState& s, const wire::LookupRequest& r) {
  auto hints = call_hints(s, r.hints);
  if (!hints.ok()) return hints.error();
  wire::LookupReply l;
  l.pages.resize(r.chain.size());
  uint32_t hits = 0;
  const Namespace ns = s.tenant + 1;
  const Status st = s.pool->pages->lookup(s.owner, ns, r.chain, l.pages, hits, new_pages_allowed(s),
                                          hints.value());
  if (!st.ok()) return hint_error(s, st);
  refresh_held(s);
  l.tiers.assign(hits, wire::kTierDevice);
  if (s.pool->host_tier && hits < r.chain.size()) {
    // The device tier missed at `hits`: the host tier may hold the run that follows. The reply
    // waits for the promotion's copies (handle() runs them, here or off the loop).
    const auto rest = std::span(r.chain).subspan(hits);
    if (s.pool->host_tier->plan_promote(paged_kv(*s.pool), s.owner, ns, rest, new_pages_allowed(s),
                                        hints.value(), call_tier_)) {
      refresh_held(s);  // the promoted pages count against the quotas from now on
      call_finish_ = [this, &s, ns, hits, l = std::move(l),
                      chain = std::vector<BlockHash>(rest.begin(), rest.end())](
                         TierCopy& c) mutable -> wire::Result<wire::Reply> {
        const uint32_t promoted = s.pool->host_tier->finish_promote(
            c, s.owner, ns, chain, std::span(l.pages).subspan(hits));
        l.tiers.resize(hits + promoted, wire::kTierHost);
        if (promoted != 0) refresh_held(s);
        return lookup_reply(s, std::move(l), hits + promoted);
      };
      return wire::Reply(wire::LookupReply{});  // call_finish_'s takes its place
    }
  }
  return lookup_reply(s, std::move(l), hits);
}

wire::Result<wire::Reply> Service::lookup_reply(SessionState& s, wire::LookupReply l,
                                                uint32_t hits) {
  l.pages.resize(hits);
  s.pool->prefix_stats->hit(l.pages, now_s_);
  return wire::Reply(std::move(l));
}

wire::Result<wire::Reply> Service::publish(SessionState& s, const wire::PublishRequest& r) {
  auto hints = call_hints(s, r.hints);
  if (!hints.ok()) return hints.error();
  wire::PublishReply p;
  p.results.resize(r.items.size());
  const Namespace ns = s.tenant + 1;
  const Status st =
      s.pool->pages->publish(s.owner, ns, r.items, p.results, new_pages_allowed(s), hints.value());
  if (st.code() == Errc::quota_exceeded) {
    // A duplicate would hand the session the page that already carries the hash.
    wire::Error e = quota_error(s, uint64_t{new_pages_allowed(s)} + 1);
    e.status = st;
    e.message = "publish item " + std::to_string(st.item()) + ": its hash is already on page " +
                std::to_string(st.value()) + ", which this session would then hold: " + e.message;
    return e;
  }
  if (!st.ok()) return hint_error(s, st);
  refresh_held(s);
  return wire::Reply(std::move(p));
}

wire::Result<wire::Reply> Service::stats(SessionState& s) {
  const core::PoolStats ps = s.pool->pages->stats();
  wire::StatsReply r;
  r.total = ps.total;
  r.free = ps.free;
  r.in_use = ps.in_use;
  r.cached = ps.cached;
  r.sessions = sessions_;
  r.lookups = ps.counters.lookups;
  r.lookup_blocks = ps.counters.lookup_blocks;
  r.hit_blocks = ps.counters.hit_blocks;
  r.allocated = ps.counters.allocated;
  r.released = ps.counters.released;
  r.published = ps.counters.published;
  r.duplicates = ps.counters.duplicates;
  r.evicted = ps.counters.evicted;
  r.flushed = ps.counters.flushed;
  r.session_held_pages = static_cast<uint32_t>(s.held_pages);
  return wire::Reply(r);
}

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

wire::Result<bool> Service::check_admin(const PeerCredentials& peer, std::string_view what) const {
  if (peer.uid == 0) return true;
  if (!config_.admin_group.empty()) {
    if (const struct group* g = ::getgrnam(config_.admin_group.c_str()); g != nullptr) {
      if (peer.gid == g->gr_gid) return true;
      const auto groups = groups_of(peer.pid);
      if (std::find(groups.begin(), groups.end(), g->gr_gid) != groups.end()) return true;
    }
  }
  return error(Errc::permission_denied,
               std::string(what) + " needs root or membership of the admin group" +
                   (config_.admin_group.empty() ? " (admin_group is not set: root only)"
                                                : " " + config_.admin_group) +
                   "; uid " + std::to_string(peer.uid) + " is neither");
}

wire::Result<wire::Reply> Service::evict(SessionState& s, const wire::EvictRequest& r) {
  if (auto ok = check_admin(s.peer, "evict"); !ok.ok()) return ok.error();
  // With a host tier the pages go down first, held until their bytes are there (handle()).
  const uint32_t n = s.pool->host_tier
                         ? s.pool->host_tier->plan_evict(paged_kv(*s.pool), r.count, call_tier_)
                         : s.pool->pages->evict(r.count);
  operator_change_ = true;
  log_event(LogLevel::info, "admin_evict",
            {kv("session", s.id), kv("uid", s.peer.uid), kv("pool", s.pool->config.name),
             kv("asked", r.count), kv("evicted", n)});
  return wire::Reply(wire::EvictReply{n});
}

wire::Result<wire::Reply> Service::flush(SessionState& s) {
  if (auto ok = check_admin(s.peer, "flush"); !ok.ok()) return ok.error();
  s.pool->index_events->begin_flush();
  const uint32_t n = s.pool->pages->flush();
  s.pool->index_events->end_flush(s.pool->pages->indexed() == 0);
  // A flush empties the pool's cache, the blocks kept in its host tier included.
  const uint32_t host = s.pool->host_tier ? s.pool->host_tier->flush() : 0;
  operator_change_ = true;
  log_event(LogLevel::info, "admin_flush",
            {kv("session", s.id), kv("uid", s.peer.uid), kv("pool", s.pool->config.name),
             kv("flushed", n), kv("host_tier_flushed", host)});
  return wire::Reply(wire::FlushReply{n});
}

wire::Result<wire::Reply> Service::sessions(SessionState& s) {
  wire::SessionsReply r;
  const bool admin = is_admin(s);
  for (const SessionState* other : live_) {
    if (!other->attached || other->pool != s.pool) continue;
    if (!admin && other->tenant != s.tenant) continue;
    r.sessions.push_back(
        wire::SessionInfo{other->id, static_cast<uint32_t>(other->peer.pid), other->peer.uid,
                          static_cast<uint32_t>(other->held_pages), other->worker_name,
                          tenant_names_[other->tenant], other->pool->config.name});
  }
  std::sort(r.sessions.begin(), r.sessions.end(),
            [](const wire::SessionInfo& a, const wire::SessionInfo& b) { return a.id < b.id; });
  return wire::Reply(std::move(r));
}

wire::Result<wire::Reply> Service::pages(SessionState& s) {
  const core::PagePool& pool = *s.pool->pages;
  if (pool.num_pages() > wire::kMaxPayloadBytes - 64) {
    return error(Errc::invalid_argument, "pool " + s.pool->config.name + " has " +
                                             std::to_string(pool.num_pages()) +
                                             " pages, more than one frame can map");
  }
  wire::PagesReply r;
  r.states.resize(pool.num_pages());
  for (PageId p = 0; p < pool.num_pages(); ++p) {
    switch (pool.state(p)) {
      case core::PageState::free:
        r.states[p] = wire::PagesReply::kFree;
        break;
      case core::PageState::in_use:
        r.states[p] = wire::PagesReply::kInUse;
        break;
      case core::PageState::cached:
        r.states[p] = wire::PagesReply::kCached;
        break;
    }
  }
  return wire::Reply(std::move(r));
}

}  // namespace kvpool::daemon
