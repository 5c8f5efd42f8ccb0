// Service: the operations, metrics and events block (opcodes 20+) and elastic pools' segments
// and resizes, kept apart from the pool operations in service.cpp. See service.h for what each
// operation may do and for whom; the pools' mechanism and policy are in daemon/pool/.
#include <unistd.h>

#include <algorithm>

#include "daemon/service/service.h"
#include "daemon/telemetry/log.h"

namespace kvpool::daemon {

void Service::note_reload(bool applied) {
  operator_change_ = true;
  ++reloads_;
  if (!applied) ++reload_failures_;
}

wire::Result<wire::Reply> Service::prefixes(SessionState& s, const wire::PrefixesRequest& r,
                                            Call&) {
  const Namespace own = s.tenant + 1;
  const bool admin = access_.is_admin(s);
  const core::PagePool& pool = s.pool->pages();
  const uint32_t now_s = pools_->now_s();
  const std::vector<std::string>& tenant_names = access_.tenants();
  wire::PrefixesReply reply;
  const std::vector<PageId> top = s.pool->prefix_stats().top(
      pool, r.limit, [&](Namespace ns) { return admin || ns == own; }, reply.indexed);
  reply.entries.reserve(top.size());
  for (const PageId p : top) {
    const PrefixStats::Counters& c = s.pool->prefix_stats().of(p);
    wire::PrefixEntry e;
    Namespace ns = 0;
    pool.indexed_key(p, ns, e.hash);
    e.page = p;
    e.depth = c.depth;
    e.hits = c.hits;
    e.age_s = now_s - std::min(c.published, now_s);
    e.idle_s = c.last_hit == 0 ? wire::PrefixEntry::kNever : now_s - std::min(c.last_hit, now_s);
    e.state = pool.state(p) == core::PageState::cached ? wire::PagesReply::kCached
                                                       : wire::PagesReply::kInUse;
    e.tenant = ns >= 1 && ns <= tenant_names.size() ? tenant_names[ns - 1] : std::string();
    reply.entries.push_back(std::move(e));
  }
  return wire::Reply(std::move(reply));
}

wire::Result<wire::Reply> Service::reload(SessionState& s, const wire::ReloadRequest&, Call&) {
  if (!reload_handler_) return wire::Error::of(Errc::internal, "this daemon has no reload handler");
  log_event(LogLevel::info, "admin_reload", {kv("session", s.id), kv("uid", s.peer.uid)});
  return wire::Reply(reload_handler_());
}

wire::Result<wire::Reply> Service::subscribe(SessionState& s, const wire::SubscribeRequest& r,
                                             Call& call) {
  if (s.subscription)
    return wire::Error::of(Errc::invalid_argument, "this connection already follows events");
  const uint64_t next = events_->next_seq();
  if (r.from_seq > next) {
    return wire::Error::of(
        Errc::invalid_argument,
        "from_seq " + std::to_string(r.from_seq) + " is beyond the next sequence " +
            std::to_string(next) +
            " (sequences restart at 1 when the daemon starts; subscribe from 0 or 1)",
        r.from_seq);
  }
  Subscription sub;
  sub.cursor = r.from_seq == 0 ? next : r.from_seq;
  sub.pool = s.pool->index();
  sub.ns = access_.is_admin(s) ? 0 : s.tenant + 1;
  sub.request_id = call.request_id;
  s.subscription = sub;
  ++subscribers_;
  log_event(LogLevel::info, "subscribe",
            {kv("session", s.id), kv("pool", s.pool->name()), kv("from_seq", sub.cursor),
             kv("tenants", sub.ns == 0 ? std::string("all") : access_.tenant_name(s.tenant))});
  return wire::Reply(wire::SubscribeReply{events_->stream_id(), next, events_->oldest_seq()});
}

void Service::collect_events(SessionState& s, size_t max, wire::EventBatch& batch) {
  if (!s.subscription) return;
  const std::vector<std::string>& tenant_names = access_.tenants();
  events_->drain(
      *s.subscription, max,
      [&](uint64_t seq, const LoggedEvent& e) {
        wire::Event w{seq, e.kind, e.cause, e.page, e.count, e.hash, {}};
        if (e.ns >= 1 && e.ns <= tenant_names.size()) w.tenant = tenant_names[e.ns - 1];
        batch.events.push_back(std::move(w));
      },
      [&](uint64_t lost, uint64_t resume) {
        batch.events.push_back(
            wire::Event{resume, wire::Event::kGap, wire::Event::kNone, kNoPage, lost, {}, {}});
      });
}

wire::Result<wire::Reply> Service::snapshot(SessionState&, const wire::SnapshotRequest&, Call&) {
  stats::Snapshot snap;
  fill_snapshot(snap);
  wire::SnapshotReply r;
  r.layout_version = stats::kLayoutVersion;
  stats::encode(snap, r.bytes);
  return wire::Reply(std::move(r));
}

void Service::fill_daemon(stats::DaemonStats& d) const {
  const uint64_t now = LatencyRecorder::now_ns();
  d = stats::DaemonStats{};
  d.pid = static_cast<uint64_t>(::getpid());
  d.start_unix_ms = start_unix_ms_;
  d.published_mono_ns = now;
  d.uptime_ms = (now - std::min(now, pools_->start_mono_ns())) / 1000000u;
  d.sessions = access_.session_count();
  d.num_pools = static_cast<uint32_t>(pools().size());
  d.subscribers = subscribers_;
  d.latency_enabled = service_latency_.enabled() ? 1 : 0;
  d.stream_id = events_->stream_id();
  d.event_next_seq = events_->next_seq();
  d.event_oldest_seq = events_->oldest_seq();
  d.event_capacity = events_->capacity();
  d.events_lost = events_->lost();
  d.reloads = reloads_;
  d.reload_failures = reload_failures_;
  d.buffered_bytes = connection_stats_.buffered_bytes;
  d.sessions_refused = connection_stats_.sessions_refused;
  d.closed_by_limits = connection_stats_.closed_by_limits;
  if (kv_counters_ != nullptr) {
    d.kv_batches_published = kv_counters_->batches_published;
    d.kv_batches_dropped = kv_counters_->batches_dropped;
  }
}

void Service::fill_snapshot(stats::Snapshot& out) const {
  fill_daemon(out.daemon);
  std::copy(std::begin(service_latency_.ops()), std::end(service_latency_.ops()), out.service);
  std::copy(std::begin(request_latency_.ops()), std::end(request_latency_.ops()), out.request);
  out.pools.assign(pools().size(), stats::PoolStats{});
  for (size_t i = 0; i < pools().size(); ++i) {
    pools()[i]->fill_stats(out.pools[i]);
    add_session_figures(*pools()[i], out.pools[i]);
  }
}

void Service::add_session_figures(const PoolRuntime& pool, stats::PoolStats& p) const {
  for (const SessionState* s : access_.live()) {
    if (!s->attached || s->pool != &pool) continue;
    ++p.sessions;
    p.reserved += s->reserved_pages;
  }
}

wire::Result<wire::Reply> Service::segments(SessionState& s, const wire::SegmentsRequest&,
                                            Call& call) {
  *call.fds = s.pool->memory().fds();
  wire::PoolInfo info = s.pool->info();
  info.tenant = access_.tenant_name(s.tenant);
  s.known_epoch = info.epoch;
  return wire::Reply(wire::SegmentsReply{std::move(info)});
}

wire::Result<wire::Reply> Service::resize(SessionState& s, const wire::ResizeRequest& r, Call&) {
  PoolRuntime& pool = *s.pool;
  if (!pool.elastic()) {
    return wire::Error::of(
        Errc::invalid_argument,
        "pool " + pool.name() + " is not elastic (give it max_capacity in the config)");
  }
  const uint32_t before = pool.pages().num_pages();
  if (r.pages > before && before < pool.info().max_pages) return resize_up(s, pool, r.pages);
  // Down only when the pool was above the target, and only while it stays at or above it.
  const uint32_t min_pages = pool.elastic_state().min_pages;
  while (before > r.pages && pool.pages_after_shrink() >= std::max(r.pages, min_pages) &&
         pool.pages().num_pages() > min_pages) {
    auto sh = pools_->shrink_one(pool);
    if (!sh.ok()) {
      // Refused before anything changed: the error; part of the way: the size reached.
      if (pool.pages().num_pages() == before) return sh.error();
      break;
    }
  }
  log_event(LogLevel::info, "admin_resize",
            {kv("session", s.id), kv("uid", s.peer.uid), kv("pool", pool.name()),
             kv("asked", r.pages), kv("from", before), kv("pages", pool.pages().num_pages())});
  return wire::Reply(wire::ResizeReply{pool.pages().num_pages()});
}

wire::Result<wire::Reply> Service::resize_up(SessionState& s, PoolRuntime& pool, uint32_t target) {
  // Planned here (the budget, other pools shrunk for it), made off the loop (call_job_) after
  // the donors' memory has gone back, then mapped and answered on the loop; the reply gives the
  // size reached.
  const uint32_t before = pool.pages().num_pages();
  auto plan = pools_->plan_resize_up(pool, target);
  if (!plan.ok()) return plan.error();
  call_job_ = std::make_unique<CopyJob>();
  call_job_->pool = &pool;
  call_job_->work = [plan = plan.value()] { plan->make(); };
  call_job_->finish = [this, &s, &pool, plan = plan.value(), before,
                       target]() -> wire::Result<wire::Reply> {
    const std::string first = pools_->commit_resize(*plan);
    log_event(LogLevel::info, "admin_resize",
              {kv("session", s.id), kv("uid", s.peer.uid), kv("pool", pool.name()),
               kv("asked", target), kv("from", before), kv("pages", pool.pages().num_pages())});
    if (pool.pages().num_pages() == before && !first.empty()) {
      return wire::Error::of(Errc::out_of_pages, first);
    }
    return wire::Reply(wire::ResizeReply{pool.pages().num_pages()});
  };
  return wire::Reply(wire::ResizeReply{});  // call_job_'s takes its place
}

std::unique_ptr<CopyJob> Service::take_background_job() {
  std::optional<MemoryWork> w = pools_->take_background();
  if (!w) return take_remote_store();
  auto job = std::make_unique<CopyJob>();
  job->pool = w->pool;
  job->work = std::move(w->run);
  job->done = std::move(w->done);
  return job;
}

void Service::finish_background(CopyJob& job) {
  if (job.done) job.done();
  pools_->drop_group_evictions();
}

}  // namespace kvpool::daemon
