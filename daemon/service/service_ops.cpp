// Service: the operations, metrics and events block (opcodes 20+), kept apart from the pool
// operations in service.cpp. See service.h for what each operation may do and for whom.
#include <unistd.h>

#include <chrono>
#include <random>

#include "daemon/service/service.h"
#include "daemon/telemetry/log.h"

namespace kvpool::daemon {

namespace {

wire::Error error(Errc code, std::string message, uint64_t value = 0) {
  return wire::Error{Status(code, kNoItem, value), std::move(message)};
}

uint64_t random_id() {
  std::random_device rd;
  return (uint64_t{rd()} << 32) ^ rd();
}

}  // namespace

void Service::init_operations() {
  start_mono_ns_ = LatencyRecorder::now_ns();
  start_unix_ms_ = static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                             std::chrono::system_clock::now().time_since_epoch())
                                             .count());
  service_latency_ = LatencyRecorder(config_.metrics.latency_histograms);
  request_latency_ = LatencyRecorder(config_.metrics.latency_histograms);
  events_ = std::make_unique<EventLog>(config_.events.ring_events, random_id());
  const EventsConfig& ev = config_.events;
  for (const auto& pool : pools_) {
    pool->prefix_stats = std::make_unique<PrefixStats>(pool->pages->num_pages());
    if (!ev.zmq_endpoint.empty()) {
      pool->kv_events = std::make_unique<KvEventBatcher>();
      pool->kv_format.hash_format =
          ev.zmq_block_hash == "uint64" ? KvHashFormat::uint64 : KvHashFormat::bytes;
      pool->kv_format.layout =
          ev.zmq_payload == "map" ? KvPayloadLayout::map : KvPayloadLayout::array;
      pool->kv_format.block_size = pool->config.geometry.tokens_per_page;
      // vLLM's medium names where a block lives: the host backend keeps pages in CPU memory,
      // every other backend (cuda-*, fake-device) stands for device memory.
      pool->kv_format.medium = backend_->name() == std::string_view("host") ? "CPU" : "GPU";
      pool->kv_format.data_parallel_rank = ev.data_parallel_rank;
    }
    pool->index_events = std::make_unique<PoolIndexEvents>(
        pool->index, *events_, *pool->prefix_stats, now_s_, pool->kv_events.get());
    pool->pages->set_observer(pool->index_events.get());
  }
}

uint32_t Service::seconds_now() const {
  timespec t{};
  ::clock_gettime(CLOCK_MONOTONIC_COARSE, &t);
  const uint64_t now_ns =
      static_cast<uint64_t>(t.tv_sec) * 1000000000u + static_cast<uint64_t>(t.tv_nsec);
  const uint64_t s = now_ns > start_mono_ns_ ? (now_ns - start_mono_ns_) / 1000000000u : 0;
  return static_cast<uint32_t>(std::min<uint64_t>(s + 1, UINT32_MAX));
}

void Service::note_reload(bool applied) {
  operator_change_ = true;
  ++reloads_;
  if (!applied) ++reload_failures_;
}

wire::Result<wire::Reply> Service::prefixes(SessionState& s, const wire::PrefixesRequest& r) {
  const Namespace own = s.tenant + 1;
  const bool admin = is_admin(s);
  const core::PagePool& pool = *s.pool->pages;
  wire::PrefixesReply reply;
  const std::vector<PageId> top = s.pool->prefix_stats->top(
      pool, r.limit, [&](Namespace ns) { return admin || ns == own; }, reply.indexed);
  reply.entries.reserve(top.size());
  for (const PageId p : top) {
    const PrefixStats::Counters& c = s.pool->prefix_stats->of(p);
    wire::PrefixEntry e;
    Namespace ns = 0;
    pool.indexed_key(p, ns, e.hash);
    e.page = p;
    e.depth = c.depth;
    e.hits = c.hits;
    e.age_s = now_s_ - std::min(c.published, now_s_);
    e.idle_s = c.last_hit == 0 ? wire::PrefixEntry::kNever : now_s_ - std::min(c.last_hit, now_s_);
    e.state = pool.state(p) == core::PageState::cached ? wire::PagesReply::kCached
                                                       : wire::PagesReply::kInUse;
    e.tenant = ns >= 1 && ns <= tenant_names_.size() ? tenant_names_[ns - 1] : std::string();
    reply.entries.push_back(std::move(e));
  }
  return wire::Reply(std::move(reply));
}

wire::Result<wire::Reply> Service::reload(SessionState& s) {
  if (auto ok = check_admin(s.peer, "reload"); !ok.ok()) return ok.error();
  if (!reload_handler_) return error(Errc::internal, "this daemon has no reload handler");
  log_event(LogLevel::info, "admin_reload", {kv("session", s.id), kv("uid", s.peer.uid)});
  return wire::Reply(reload_handler_());
}

wire::Result<wire::Reply> Service::subscribe(SessionState& s, uint32_t request_id,
                                             const wire::SubscribeRequest& r) {
  if (s.subscription)
    return error(Errc::invalid_argument, "this connection already follows events");
  const uint64_t next = events_->next_seq();
  if (r.from_seq > next) {
    return error(Errc::invalid_argument,
                 "from_seq " + std::to_string(r.from_seq) + " is beyond the next sequence " +
                     std::to_string(next) +
                     " (sequences restart at 1 when the daemon starts; subscribe from 0 or 1)",
                 r.from_seq);
  }
  Subscription sub;
  sub.cursor = r.from_seq == 0 ? next : r.from_seq;
  sub.pool = s.pool->index;
  sub.ns = is_admin(s) ? 0 : s.tenant + 1;
  sub.request_id = request_id;
  s.subscription = sub;
  ++subscribers_;
  log_event(LogLevel::info, "subscribe",
            {kv("session", s.id), kv("pool", s.pool->config.name), kv("from_seq", sub.cursor),
             kv("tenants", sub.ns == 0 ? std::string("all") : tenant_names_[s.tenant])});
  return wire::Reply(wire::SubscribeReply{events_->stream_id(), next, events_->oldest_seq()});
}

void Service::collect_events(SessionState& s, size_t max, wire::EventBatch& batch) {
  if (!s.subscription) return;
  events_->drain(
      *s.subscription, max,
      [&](uint64_t seq, const LoggedEvent& e) {
        wire::Event w{seq, e.kind, e.cause, e.page, e.count, e.hash, {}};
        if (e.ns >= 1 && e.ns <= tenant_names_.size()) w.tenant = tenant_names_[e.ns - 1];
        batch.events.push_back(std::move(w));
      },
      [&](uint64_t lost, uint64_t resume) {
        batch.events.push_back(
            wire::Event{resume, wire::Event::kGap, wire::Event::kNone, kNoPage, lost, {}, {}});
      });
}

wire::Result<wire::Reply> Service::snapshot(SessionState&) {
  stats::Snapshot snap;
  fill_snapshot(snap);
  wire::SnapshotReply r;
  r.layout_version = stats::kLayoutVersion;
  stats::encode(snap, r.bytes);
  return wire::Reply(std::move(r));
}

void Service::fill_snapshot(stats::Snapshot& out) const {
  const uint64_t now = LatencyRecorder::now_ns();
  stats::DaemonStats& d = out.daemon;
  d = stats::DaemonStats{};
  d.pid = static_cast<uint64_t>(::getpid());
  d.start_unix_ms = start_unix_ms_;
  d.published_mono_ns = now;
  d.uptime_ms = (now - std::min(now, start_mono_ns_)) / 1000000u;
  d.sessions = sessions_;
  d.num_pools = static_cast<uint32_t>(pools_.size());
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
  std::copy(std::begin(service_latency_.ops()), std::end(service_latency_.ops()), out.service);
  std::copy(std::begin(request_latency_.ops()), std::end(request_latency_.ops()), out.request);
  out.pools.assign(pools_.size(), stats::PoolStats{});
  for (size_t i = 0; i < pools_.size(); ++i) {
    const Pool& pool = *pools_[i];
    stats::PoolStats& p = out.pools[i];
    stats::set_name(p.name, pool.config.name, /*terminated=*/false);
    p.name_len =
        static_cast<uint32_t>(std::min<size_t>(pool.config.name.size(), stats::kNameBytes));
    stats::set_name(p.backend, pool.info.backend);
    const Geometry& g = pool.info.geometry;
    p.dtype = static_cast<uint32_t>(g.dtype);
    p.layout = static_cast<uint32_t>(pool.info.layout);
    p.layers = g.layers;
    p.kv_heads = g.kv_heads;
    p.head_dim = g.head_dim;
    p.tokens_per_page = g.tokens_per_page;
    pool.pages->expire_pins();
    const core::PoolStats ps = pool.pages->stats();
    stats::set_name(p.policy, pool.pages->policy().name());
    p.pinned = ps.pinned;
    p.pinned_cached = ps.pinned_cached;
    p.pins = ps.counters.pins;
    p.pins_expired = ps.counters.pins_expired;
    p.max_pages = pool.info.max_pages;
    p.epoch = pool.info.epoch;
    if (pool.elastic()) {
      p.min_pages = pool.min_pages;
      p.grows = pool.grows;
      p.shrinks = pool.shrinks;
      const uint64_t n = std::min<uint64_t>(pool.resize_count, Pool::kResizeHistory);
      p.history_len = static_cast<uint32_t>(n);
      for (uint64_t k = 0; k < n; ++k) {
        const auto& [ms, pages] =
            pool.resize_history[(pool.resize_count - n + k) % Pool::kResizeHistory];
        p.history[k] = stats::PoolStats::Resize{ms, pages, 0};
      }
    }
    if (pool.host_tier) {
      const core::HostTier& t = pool.host_tier->tier();
      const HostTierCopyStats& c = pool.host_tier->copy_stats();
      p.host_slots = t.capacity();
      p.host_held = t.held();
      p.host_bytes = pool.host_tier->bytes();
      p.host_demoted = t.counters().demoted;
      p.host_promoted = t.counters().promoted;
      p.host_dropped = t.counters().dropped;
      p.host_demote_ns = c.demote_ns;
      p.host_promote_ns = c.promote_ns;
      p.host_copy_failures = c.copy_failures;
    }
    p.total = ps.total;
    p.free = ps.free;
    p.in_use = ps.in_use;
    p.cached = ps.cached;
    p.indexed = pool.pages->indexed();
    p.device = pool.info.device;
    p.segments = static_cast<uint32_t>(pool.info.segments.size());
    p.page_stride = pool.info.page_stride;
    p.segment_bytes = pool.info.segment_bytes;
    p.lookups = ps.counters.lookups;
    p.lookup_blocks = ps.counters.lookup_blocks;
    p.hit_blocks = ps.counters.hit_blocks;
    p.allocated = ps.counters.allocated;
    p.released = ps.counters.released;
    p.published = ps.counters.published;
    p.duplicates = ps.counters.duplicates;
    p.evicted = ps.counters.evicted;
    p.flushed = ps.counters.flushed;
  }
  for (const SessionState* s : live_) {
    if (s->attached) ++out.pools[s->pool->index].sessions;
  }
}

}  // namespace kvpool::daemon
