#include "daemon/service/service.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <new>
#include <random>

#include "common/stats_counters.h"
#include "common/vllm_block_hash.h"
#include "daemon/config/config_keys.h"
#include "daemon/core/check.h"
#include "daemon/telemetry/log.h"

namespace kvpool::daemon {

namespace {

uint64_t random_id() {
  std::random_device rd;
  return (uint64_t{rd()} << 32) ^ rd();
}

}  // namespace

Service::Service(const Config& config, std::unique_ptr<MemoryBackend> backend)
    : config_(config), backend_(std::move(backend)) {}

wire::Result<std::unique_ptr<Service>> Service::create(const Config& config,
                                                       std::unique_ptr<MemoryBackend> backend) {
  // PoolSet::create names the pool whose bookkeeping did not fit; anything else that runs out
  // here (the event ring, the tenants) names them all, rather than ending the daemon.
  try {
    return create_unguarded(config, std::move(backend));
  } catch (const std::bad_alloc&) {
    return PoolSet::bookkeeping_error(config, nullptr);
  }
}

wire::Result<std::unique_ptr<Service>> Service::create_unguarded(
    const Config& config, std::unique_ptr<MemoryBackend> backend) {
  std::unique_ptr<Service> svc(new Service(config, std::move(backend)));
  svc->start_unix_ms_ =
      static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                std::chrono::system_clock::now().time_since_epoch())
                                .count());
  svc->service_latency_ = LatencyRecorder(config.metrics.latency_histograms);
  svc->request_latency_ = LatencyRecorder(config.metrics.latency_histograms);
  svc->events_ = std::make_unique<EventLog>(config.events.ring_events, random_id());
  auto pools = PoolSet::create(svc->config_, *svc->backend_, *svc->events_);
  if (!pools.ok()) return pools.error();
  svc->pools_ = std::move(pools.value());
  svc->access_.apply(*svc->pools_);
  return svc;
}

std::vector<std::string> Service::apply_live(const Config& next) {
  // What can change live does; what cannot keeps its running value until a restart, named.
  Config applied = next;
  std::vector<std::string> restart = keep_restart_keys(applied, config_);
  config_ = std::move(applied);
  pools_->apply_config(config_.pools);
  access_.apply(*pools_);
  return restart;
}

wire::Result<std::unique_ptr<SessionState>> Service::open_session(const PeerCredentials& peer) {
  return access_.open_session(peer);
}

void Service::close_session(SessionState& s) {
  if (s.attached) {
    const Status st = s.pool->pages().close_owner(s.owner);
    if (!st.ok()) {
      log_event(LogLevel::error, "session_close_failed",
                {kv("session", s.id), kv("error", st.message())});
    }
    if (s.subscription) --subscribers_;
#ifndef NDEBUG
    // Debug and sanitizer builds verify DESIGN §3 whenever a session's references go back, so
    // the integration tests (kill -9 of workers included) check the invariants too.
    const std::string broken = s.pool->pages().check_invariants();
    if (!broken.empty()) {
      log_event(LogLevel::error, "invariant_broken",
                {kv("pool", s.pool->name()), kv("detail", broken)});
      std::abort();
    }
#endif
  }
  if (s.model) s.model->by_group[s.pool->config().group] = nullptr;
  s.model.reset();
  s.reservations.clear();  // their references went with the owner
  s.reserved_refs.clear();
  s.reserved_pages = 0;
  access_.close_session(s);
  s.attached = false;
}

void Service::handle(SessionState& s, uint32_t request_id, const wire::Request& request,
                     std::vector<std::byte>& out, std::span<const int>* fds_to_pass,
                     std::unique_ptr<CopyJob>* deferred) {
  *fds_to_pass = {};
  const uint64_t started = service_latency_.enabled() ? LatencyRecorder::now_ns() : 0;
  pools_->tick();
  const wire::Opcode op = wire::opcode_of(request);
  Call call{request_id, fds_to_pass, started, deferred};
  wire::Result<wire::Reply> reply = wire::Error::of(Errc::internal, "unhandled request");
  if (!s.attached && wire::opcode_needs_attach(op)) {
    reply = wire::Error::of(Errc::not_attached, "send hello before any other request");
  } else if (auto admin =
                 wire::opcode_admin_only(op)
                     ? access_.check_admin(s.peer, wire::opcode_name(static_cast<uint16_t>(op)))
                     : wire::Result<bool>(true);
             !admin.ok()) {
    reply = admin.error();
  } else {
    reply = dispatch(s, request, call);
  }
  // Pages the call evicted go down to the host tier before any reply tells a worker it may
  // write them; a lookup's promoted pages come up before it answers.
  // A call that made a job of its own (a remote fetch) keeps its one job: its tier copies, if
  // any, run here.
  if (s.attached && (deferred == nullptr || !*deferred) &&
      run_tier_copies(s, request_id, op, started, reply, call_job_ ? nullptr : deferred)) {
    return;  // finish_copy answers and times it
  }
  if (call_job_) {
    // The call left its slow part to run off the loop (or here, when the caller cannot).
    std::unique_ptr<CopyJob> job = take_call_job(s, request_id, op, started);
    if (deferred != nullptr) {
      *deferred = std::move(job);
      return;
    }
    job->run();
    reply = job->finish();
    // A remote fetch's promotion: its copies, here too.
    if (job->remote_fetch()) (void)run_tier_copies(s, request_id, op, started, reply, nullptr);
  }
  if (deferred != nullptr && *deferred) return;  // finish_copy answers and times it
  encode_answer(s, request_id, op, reply, out);
  if (!reply.ok()) *fds_to_pass = {};
  if (started != 0) {
    service_latency_.record(static_cast<uint16_t>(op), LatencyRecorder::now_ns() - started);
  }
  if (s.attached && s.pool->elastic()) pools_->grow_ahead(*s.pool);
  pools_->drop_group_evictions();
}

std::unique_ptr<CopyJob> Service::take_call_job(SessionState& s, uint32_t request_id,
                                                wire::Opcode op, uint64_t started_ns) {
  std::unique_ptr<CopyJob> job = std::move(call_job_);
  job->session = &s;
  job->request_id = request_id;
  job->op = op;
  job->started_ns = started_ns;
  return job;
}

wire::Result<wire::Reply> Service::dispatch(SessionState& s, const wire::Request& request,
                                            Call& call) {
  switch (wire::opcode_of(request)) {
#define KVPOOL_DISPATCH(name, number, Req, Rep, ...) \
  case wire::Opcode::name:                           \
    return name(s, *std::get_if<wire::Req>(&request), call);
    KVPOOL_WIRE_OPCODES(KVPOOL_DISPATCH)
#undef KVPOOL_DISPATCH
    default:
      return wire::Error::of(Errc::internal, "unhandled request");
  }
}

bool Service::run_tier_copies(SessionState& s, uint32_t request_id, wire::Opcode op,
                              uint64_t started_ns, wire::Result<wire::Reply>& reply,
                              std::unique_ptr<CopyJob>* deferred) {
  PoolRuntime& pool = *s.pool;
  if (!pool.has_lower_tier()) return false;
  pool.plan_demotions(call_tier_);
  if (call_tier_.empty()) return false;
  auto finish = [&pool, reply = std::move(reply),
                 then = std::move(call_finish_)](TierCopy& c) mutable -> wire::Result<wire::Reply> {
    if (then) return then(c);
    pool.finish_demotions(c);
    return std::move(reply);
  };
  call_finish_ = nullptr;
  if (deferred != nullptr &&
      (call_tier_.bytes() > inline_copy_bytes_ || pool.copies_in_flight() > 0)) {
    auto job = std::make_unique<CopyJob>();
    job->pool = &pool;
    job->session = &s;
    job->request_id = request_id;
    job->op = op;
    job->started_ns = started_ns;
    job->tier = std::make_unique<TierCopy>(std::exchange(call_tier_, {}));
    job->finish = [tier = job->tier.get(), finish = std::move(finish)]() mutable {
      return finish(*tier);
    };
    pool.begin_job();
    *deferred = std::move(job);
    KVPOOL_CHECK(!call_job_);  // one job per call
    return true;
  }
  pool.run_tier(call_tier_);
  reply = finish(call_tier_);
  call_tier_ = {};
  return false;
}

void Service::encode_answer(SessionState& s, uint32_t request_id, wire::Opcode op,
                            const wire::Result<wire::Reply>& reply, std::vector<std::byte>& out) {
  // A session learns of a new segment list before any reply that could hand it a page there.
  if (s.attached && s.known_epoch != s.pool->info().epoch && op != wire::Opcode::segments) {
    s.known_epoch = s.pool->info().epoch;
    wire::encode_pool_changed(s.known_epoch, out);
  }
  if (reply.ok()) {
    wire::encode_reply(request_id, reply.value(), out);
  } else {
    wire::encode_error(request_id, static_cast<uint16_t>(op), reply.error(), out);
  }
}

wire::Result<wire::Reply> Service::hello(SessionState& s, const wire::HelloRequest& r, Call& call) {
  if (s.attached) {
    return wire::Error::of(Errc::already_attached, "this connection already said hello");
  }
  PoolRuntime* pool = nullptr;
  if (r.pool_name.empty()) {
    if (pools().empty()) return wire::Error::of(Errc::no_such_pool, "the daemon has no pools");
    pool = pools().front().get();
  } else {
    pool = pools_->find(r.pool_name);
    // A hybrid model's name attaches to its first group.
    for (size_t i = 0; pool == nullptr && i < pools().size(); ++i) {
      if (pools()[i]->config().model == r.pool_name) pool = pools()[i].get();
    }
  }
  if (pool == nullptr) return wire::Error::of(Errc::no_such_pool, "no pool named " + r.pool_name);
  const HashScheme& ours = pool->config().hash_scheme == VllmBlockHasher::scheme().name
                               ? VllmBlockHasher::scheme()
                               : default_hash_scheme();
  if (!r.hash_scheme.name.empty() && r.hash_scheme != ours) {
    // Its blocks would never match the other workers': refuse rather than miss silently.
    const bool same_name = r.hash_scheme.name == ours.name;
    return wire::Error::of(
        Errc::invalid_argument,
        "this worker hashes blocks with " + r.hash_scheme.name + " (check " +
            to_hex(r.hash_scheme.check) + "), pool " + pool->name() + "'s scheme is " + ours.name +
            " (check " + to_hex(ours.check) + ", pools[].hash_scheme, " + "docs/BLOCK_HASH.md)" +
            (same_name ? ": the worker's implementation of it differs from the specification"
                       : ": its block hashes would never match another worker's"));
  }
  // Operators (root, admin_group) inspect every pool (kvpoolctl --pool); they are trusted with
  // its bytes as they are with the daemon.
  const std::string& tenant = access_.tenant_name(s.tenant);
  if (!access_.tenant_may_use(s.tenant, *pool) && !access_.is_admin(s)) {
    return wire::Error::of(Errc::permission_denied,
                           "tenant " + tenant + " may not use pool " + pool->name());
  }
  if (r.link_session != 0 || !pool->config().model.empty()) {
    if (auto joined = join_model(s, *pool, r.link_session); !joined.ok()) return joined.error();
  }
  s.pool = pool;
  s.owner = pool->pages().open_owner();
  s.attached = true;
  s.known_epoch = pool->info().epoch;
  s.worker_name = r.worker_name;
  *call.fds = pool->memory().fds();
  wire::HelloReply h;
  h.session_id = s.id;
  h.pool = pool->info();
  h.pool.tenant = tenant;
  log_event(LogLevel::info, "session_attach",
            {kv("session", s.id), kv("worker", r.worker_name), kv("pid", s.peer.pid),
             kv("uid", s.peer.uid), kv("tenant", tenant), kv("pool", pool->name())});
  return wire::Reply(std::move(h));
}

wire::Result<wire::Reply> Service::alloc(SessionState& s, const wire::AllocRequest& r, Call&) {
  const uint64_t n = r.count;
  if (n > access_.new_pages_allowed(s)) return access_.quota_error(s, n);
  auto hints = access_.call_hints(s, r.hints);
  if (!hints.ok()) return hints.error();
  wire::AllocReply a;
  a.pages.resize(n);
  uint64_t growable = 0;
  bool admitted = false;
  const Status st = s.pool->alloc(s.owner, a.pages, hints.value(), &growable, &admitted);
  if (!st.ok()) {
    if (!admitted) {
      if (auto e = s.pool->capacity_error(st, growable)) return *e;
    }
    return access_.hint_error(s, st);
  }
  access_.refresh_held(s);
  return wire::Reply(std::move(a));
}

wire::Result<wire::Reply> Service::retain(SessionState& s, const wire::RetainRequest& r, Call&) {
  auto hints = access_.call_hints(s, r.hints);
  if (!hints.ok()) return hints.error();
  const Status st = s.pool->pages().retain(s.owner, r.pages, hints.value());
  if (!st.ok()) return access_.hint_error(s, st);
  return wire::Reply(wire::RetainReply{});
}

wire::Result<wire::Reply> Service::release(SessionState& s, const wire::ReleaseRequest& r, Call&) {
  if (auto e = reserved_error(s, r.pages)) return *e;
  const Status st = s.pool->pages().release(s.owner, r.pages);
  if (!st.ok()) return from_status(st);
  access_.refresh_held(s);
  return wire::Reply(wire::ReleaseReply{});
}

wire::Result<wire::Reply> Service::lookup(SessionState& s, const wire::LookupRequest& r, Call&) {
  auto hints = access_.call_hints(s, r.hints);
  if (!hints.ok()) return hints.error();
  wire::LookupReply l;
  l.pages.resize(r.chain.size());
  uint32_t hits = 0;
  const Namespace ns = s.tenant + 1;
  // On a sliding or chunked pool a hit may skip blocks no resumed query reads (kNoPage).
  const Status st =
      s.pool->pages().lookup_window(s.owner, ns, r.chain, s.pool->config().geometry, l.pages, hits,
                                    access_.new_pages_allowed(s), hints.value());
  if (!st.ok()) return access_.hint_error(s, st);
  access_.refresh_held(s);
  l.tiers.resize(hits);
  for (uint32_t i = 0; i < hits; ++i)
    l.tiers[i] = l.pages[i] == kNoPage ? wire::kTierNone : wire::kTierDevice;
  // The device tier missed at `hits`: the host tier may hold the run that follows. The reply
  // waits for the promotion's copies (handle() runs them, here or off the loop).
  const auto rest = std::span(r.chain).subspan(hits);
  if (s.pool->plan_promotion(s.owner, ns, rest, access_.new_pages_allowed(s), hints.value(),
                             call_tier_)) {
    access_.refresh_held(s);  // the promoted pages count against the quotas from now on
    call_finish_ = [this, &s, ns, hits, hints = hints.value(), l = std::move(l),
                    chain = std::vector<BlockHash>(rest.begin(), rest.end())](
                       TierCopy& c) mutable -> wire::Result<wire::Reply> {
      const uint32_t promoted =
          s.pool->finish_promotion(c, s.owner, ns, chain, std::span(l.pages).subspan(hits));
      l.tiers.resize(hits + promoted, s.pool->promotion_tier());
      if (promoted != 0) access_.refresh_held(s);
      offer_remote_hits(s, chain, std::span(l.pages).subspan(hits, promoted));
      // The chain goes on past the promoted run (its copies are done; the run is published):
      // the remote tier may hold what follows. The fetch's job takes the reply's place.
      if (promoted != 0 && promoted < chain.size() && !s.closing &&
          plan_remote_fetch(s, ns, hints, l, hits + promoted, std::span(chain).subspan(promoted))) {
        return wire::Reply(wire::LookupReply{});
      }
      return lookup_reply(s, std::move(l), hits + promoted);
    };
    return wire::Reply(wire::LookupReply{});  // call_finish_'s takes its place
  }
  offer_remote_hits(s, r.chain, std::span(l.pages).first(hits));
  // Nothing here holds the run that follows: the remote tier may (the reply waits for its fetch,
  // off the loop, then for the copies into new pages).
  if (plan_remote_fetch(s, ns, hints.value(), l, hits, rest)) {
    return wire::Reply(wire::LookupReply{});  // call_job_'s takes its place
  }
  return lookup_reply(s, std::move(l), hits);
}

wire::Result<wire::Reply> Service::lookup_reply(SessionState& s, wire::LookupReply l,
                                                uint32_t hits) {
  l.pages.resize(hits);
  s.pool->prefix_stats().hit(l.pages, pools_->now_s());
  return wire::Reply(std::move(l));
}

wire::Result<wire::Reply> Service::publish(SessionState& s, const wire::PublishRequest& r, Call&) {
  auto hints = access_.call_hints(s, r.hints);
  if (!hints.ok()) return hints.error();
  wire::PublishReply p;
  p.results.resize(r.items.size());
  const Namespace ns = s.tenant + 1;
  const uint32_t tpp = s.pool->config().geometry.tokens_per_page;
  if (!r.token_ids.empty() && r.token_ids.size() != r.items.size() * uint64_t{tpp}) {
    return wire::Error{Status(Errc::invalid_argument, kNoItem, r.token_ids.size()),
                       "publish: chain.token_ids holds " + std::to_string(r.token_ids.size()) +
                           " ids for " + std::to_string(r.items.size()) + " blocks of " +
                           std::to_string(tpp) + " tokens (tokens_per_page): send " +
                           std::to_string(r.items.size() * uint64_t{tpp}) + " or none"};
  }
  const uint32_t allowed = access_.new_pages_allowed(s);
  Status st;
  {
    const PoolIndexEvents::PublishScope chain(s.pool->index_events(), r, tpp);
    st = s.pool->pages().publish(s.owner, ns, r.items, p.results, allowed, hints.value());
  }
  if (st.code() == Errc::quota_exceeded) {
    // A duplicate would hand the session the page that already carries the hash.
    wire::Error e = access_.quota_error(s, uint64_t{allowed} + 1);
    e.status = st;
    e.message = "publish item " + std::to_string(st.item()) + ": its hash is already on page " +
                std::to_string(st.value()) + ", which this session would then hold: " + e.message;
    return e;
  }
  if (!st.ok()) return access_.hint_error(s, st);
  access_.refresh_held(s);
  offer_remote(s, r.items, p.results);
  return wire::Reply(std::move(p));
}

wire::Result<wire::Reply> Service::stats(SessionState& s, const wire::StatsRequest&, Call&) {
  // One reading of the pool, as the snapshot takes it (pins that ran out are expired first).
  stats::PoolStats p;
  s.pool->fill_stats(p);
  add_session_figures(*s.pool, p);
  wire::StatsReply r;
  r.total = p.total;
  r.free = p.free;
  r.in_use = p.in_use;
  r.cached = p.cached;
  r.sessions = access_.session_count();
  r.session_held_pages = static_cast<uint32_t>(s.held_pages);
  r.counters.reserve(stats::kNumPoolCounters);
  for (const stats::PoolCounter& c : stats::kPoolCounters)
    r.counters.push_back(c.get(p));
  stats::DaemonStats d;
  fill_daemon(d);
  r.daemon_counters.reserve(stats::kNumDaemonCounters);
  for (const stats::DaemonCounter& c : stats::kDaemonCounters)
    r.daemon_counters.push_back(c.get(d));
  return wire::Reply(std::move(r));
}

wire::Result<wire::Reply> Service::evict(SessionState& s, const wire::EvictRequest& r, Call&) {
  // With a host tier the pages go down first, held until their bytes are there (handle()).
  const uint32_t n = s.pool->evict(r.count, call_tier_);
  operator_change_ = true;
  log_event(LogLevel::info, "admin_evict",
            {kv("session", s.id), kv("uid", s.peer.uid), kv("pool", s.pool->name()),
             kv("asked", r.count), kv("evicted", n)});
  return wire::Reply(wire::EvictReply{n});
}

wire::Result<wire::Reply> Service::flush(SessionState& s, const wire::FlushRequest&, Call&) {
  const auto [n, host] = s.pool->flush();
  operator_change_ = true;
  log_event(LogLevel::info, "admin_flush",
            {kv("session", s.id), kv("uid", s.peer.uid), kv("pool", s.pool->name()),
             kv("flushed", n), kv("host_tier_flushed", host)});
  return wire::Reply(wire::FlushReply{n});
}

wire::Result<wire::Reply> Service::sessions(SessionState& s, const wire::SessionsRequest&, Call&) {
  wire::SessionsReply r;
  const bool admin = access_.is_admin(s);
  for (const SessionState* other : access_.live()) {
    if (!other->attached || other->pool != s.pool) continue;
    if (!admin && other->tenant != s.tenant) continue;
    r.sessions.push_back(
        wire::SessionInfo{other->id, static_cast<uint32_t>(other->peer.pid), other->peer.uid,
                          static_cast<uint32_t>(other->held_pages), other->worker_name,
                          access_.tenant_name(other->tenant), other->pool->name()});
  }
  std::sort(r.sessions.begin(), r.sessions.end(),
            [](const wire::SessionInfo& a, const wire::SessionInfo& b) { return a.id < b.id; });
  return wire::Reply(std::move(r));
}

wire::Result<wire::Reply> Service::pages(SessionState& s, const wire::PagesRequest&, Call&) {
  const core::PagePool& pool = s.pool->pages();
  if (pool.num_pages() > wire::kMaxPayloadBytes - 64) {
    return wire::Error::of(Errc::invalid_argument, "pool " + s.pool->name() + " has " +
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
