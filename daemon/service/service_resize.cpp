// Elastic pools in the Service: creation, growth on demand, reclaiming segments from other pools
// under the daemon's memory budget, admin resizes, and telling sessions of new segment lists.
//
// Mechanism (the memory backends and the pool core move pages, daemon/memory/memory_backend.h and
// PagePool::grow/shrink): a pool grows by one segment at the end of its pages region and shrinks
// by its last one. A shrink is all or nothing: the core refuses it while a page past the new end
// is held (pages_in_use, naming how many and the first); cached pages there move to free pages
// below (copied here, before anything else runs) or are evicted, and evicted ones go down to the
// pool's host tier while their segment is still mapped. Only then is the segment unmapped.
//
// Policy (grow_for): an alloc that finds fewer free pages than it asks for grows its pool,
// segment by segment, while the pool is below its max and
//   1. the budget has room, or
//   2. reclaim() can free a segment's worth: it shrinks other elastic pools above their min and
//      running no daemon-side copy, lowest hits per byte since their last resize first, taking
//      only from pools that earn less per byte than this one unless this one is under pressure
//      (its free and unpinned cached pages cannot serve the alloc); it shrinks nothing when the
//      donors together cannot give enough.
// So under a full budget a pool evicts its own cache before taking memory from a pool whose
// cache earns more, and an idle pool's memory goes to a busy one.
//
// Sessions learn of a new segment list by a pool_changed notice (common/wire/protocol.h): handle()
// puts one before the reply of the session whose call resized the pool, the Server pushes one to
// the pool's other sessions; each client then asks for the segments and maps them.
#include <algorithm>
#include <chrono>

#include "common/byte_units.h"
#include "daemon/service/service.h"
#include "daemon/telemetry/log.h"

namespace kvpool::daemon {

namespace {

wire::Error resize_error(Errc code, std::string message, uint64_t value = 0) {
  return wire::Error{Status(code, kNoItem, value), std::move(message)};
}

uint64_t pages_of(const Capacity& c, uint64_t per_page) {
  return c.unit == Capacity::Unit::pages ? c.value : c.value / per_page;
}

uint64_t unix_ms() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                   std::chrono::system_clock::now().time_since_epoch())
                                   .count());
}

}  // namespace

wire::Result<uint32_t> Service::create_elastic(Pool& pool, uint32_t initial_pages) {
  const PoolConfig& pc = pool.config;
  const Geometry& g = pc.geometry;
  const uint64_t stride = page_data_bytes(g);
  const uint64_t scale = page_scale_bytes(g);
  const uint64_t per_page = stride + scale;
  const uint64_t gran = backend_->granularity();
  const uint64_t max_pages =
      std::min<uint64_t>(pages_of(*pc.max_capacity, per_page), core::kMaxPages);
  const std::string where = "pool " + pc.name + ": ";
  if (max_pages < initial_pages) {
    return resize_error(Errc::invalid_argument, where + "max_capacity (" +
                                                    std::to_string(max_pages) +
                                                    " pages) is below capacity (" +
                                                    std::to_string(initial_pages) + " pages)");
  }
  ElasticLayout l;
  l.segment_bytes = round_up(std::max(pc.segment_size, stride), gran);
  l.pages_region_bytes = round_up(max_pages * stride, gran);
  l.scales_offset = l.pages_region_bytes;
  l.scales_bytes = scale == 0 ? 0 : round_up(max_pages * scale, gran);
  l.reserve_bytes = l.scales_offset + l.scales_bytes;
  l.initial_pages_bytes =
      std::min(round_up(uint64_t{initial_pages} * stride, l.segment_bytes), l.pages_region_bytes);
  auto memory = backend_->create_elastic(l, pc.name);
  if (!memory.ok()) return memory.error();
  pool.memory = std::move(memory.value());
  const uint64_t pages_per_segment = std::max<uint64_t>(1, l.segment_bytes / stride);
  const uint64_t min_pages =
      pc.min_capacity ? pages_of(*pc.min_capacity, per_page) : pages_per_segment;
  pool.min_pages = static_cast<uint32_t>(std::clamp<uint64_t>(min_pages, 1, max_pages));
  pool.info.reserved_bytes = pool.memory->reserved_bytes();
  pool.info.scales_offset = l.scales_offset;
  pool.info.max_pages = static_cast<uint32_t>(max_pages);
  const uint64_t pages = std::min(pool.memory->pages_bytes_mapped() / stride, max_pages);
  log_event(LogLevel::info, "pool_elastic",
            {kv("pool", pc.name), kv("pages", pages), kv("min_pages", pool.min_pages),
             kv("max_pages", max_pages), kv("segment_bytes", l.segment_bytes),
             kv("reserved", human_bytes(l.reserve_bytes))});
  return static_cast<uint32_t>(pages);
}

uint64_t Service::elastic_bytes() const {
  uint64_t n = 0;
  for (const auto& p : pools_) {
    if (p->elastic()) n += p->memory->bytes();
  }
  return n;
}

void Service::resized(Pool& pool, bool grew) {
  const uint32_t pages = pool.pages->num_pages();
  pool.prefix_stats->resize(pages);
  pool.info.num_pages = pages;
  pool.info.segments = pool.memory->segments();
  pool.info.segment_bytes = pool.memory->bytes();
  ++pool.info.epoch;
  pool.hits_at_resize = pool.pages->stats().counters.hit_blocks;
  ++(grew ? pool.grows : pool.shrinks);
  pool.resize_history[pool.resize_count % Pool::kResizeHistory] = {unix_ms(), pages};
  ++pool.resize_count;
  pool_changed_ = true;
  operator_change_ = true;
  events_->append(LoggedEvent{{},
                              pages,
                              kNoPage,
                              0,
                              pool.index,
                              wire::Event::kResized,
                              grew ? wire::Event::kGrown : wire::Event::kShrunk});
  log_event(LogLevel::info, grew ? "pool_grown" : "pool_shrunk",
            {kv("pool", pool.config.name), kv("pages", pages), kv("bytes", pool.memory->bytes()),
             kv("segments", pool.info.segments.size()), kv("epoch", pool.info.epoch)});
}

wire::Result<bool> Service::grow_one(Pool& pool) {
  const uint64_t stride = pool.info.page_stride;
  if (pool.pages->num_pages() >= pool.info.max_pages) {
    return resize_error(Errc::exceeds_capacity,
                        "pool " + pool.config.name + " is at its max_capacity (" +
                            std::to_string(pool.info.max_pages) + " pages)");
  }
  const uint64_t before = pool.memory->bytes();
  // Memory a shrink let go of (a reclaim for this growth, say) goes back first: this path
  // already waits on the loop for the new segment.
  released_.clear();
  auto g = pool.memory->grow_segment();
  if (!g.ok()) return g.error();
  if (elastic_bytes() > budget_bytes_) {
    // The segment came out larger than the caller planned for; give it back.
    const uint64_t added = pool.memory->bytes() - before;
    (void)pool.memory->shrink_segment();
    return resize_error(Errc::out_of_pages, "pool " + pool.config.name + ": a segment of " +
                                                human_bytes(added) + " would pass memory_budget (" +
                                                human_bytes(budget_bytes_) + ")");
  }
  const uint64_t pages =
      std::min<uint64_t>(pool.memory->pages_bytes_mapped() / stride, pool.info.max_pages);
  KVPOOL_CHECK(pool.pages->grow(static_cast<uint32_t>(pages)).ok());
  resized(pool, true);
  return true;
}

// The page count an elastic pool would have without its last pages segment.
uint32_t Service::pages_after_shrink(const Pool& pool) const {
  uint64_t last_bytes = 0;
  uint64_t last_offset = 0;
  for (const wire::SegmentInfo& seg : pool.memory->segments()) {
    if (seg.offset < pool.info.scales_offset && seg.offset >= last_offset) {
      last_offset = seg.offset;
      last_bytes = seg.bytes;
    }
  }
  const uint64_t mapped = pool.memory->pages_bytes_mapped();
  return static_cast<uint32_t>(std::min<uint64_t>(
      (mapped - std::min(mapped, last_bytes)) / pool.info.page_stride, pool.pages->num_pages()));
}

wire::Result<bool> Service::shrink_one(Pool& pool) {
  if (pool.copies_in_flight > 0) {
    // A deferred copy runs on the pool's copier off the loop; a shrink's moves would share it.
    return resize_error(Errc::out_of_pages, "pool " + pool.config.name +
                                                " is running a daemon-side copy; it gives back "
                                                "no segment until the copy is done");
  }
  const uint32_t old_total = pool.pages->num_pages();
  const uint32_t new_total = pages_after_shrink(pool);
  if (pool.memory->segments().size() <= 1 || new_total < pool.min_pages || new_total == 0) {
    return resize_error(Errc::invalid_argument,
                        "pool " + pool.config.name + " cannot shrink below its min_capacity (" +
                            std::to_string(pool.min_pages) + " pages) or its first segment");
  }
  std::vector<core::PageMove> moves;
  const Status st = pool.pages->shrink(new_total, moves);
  if (!st.ok()) {
    return resize_error(st.code(),
                        "pool " + pool.config.name + ": shrinking to " + std::to_string(new_total) +
                            " pages: " + st.message(),
                        st.value());
  }
  // Copies and demotions read the tail, which is still mapped: describe it at its old size.
  kernels::PagedKv tail = paged_kv(pool);
  tail.num_pages = old_total;
  if (!moves.empty()) {
    std::vector<PageId> src, dst;
    for (const core::PageMove& m : moves) {
      src.push_back(m.from);
      dst.push_back(m.to);
      pool.prefix_stats->move(m.from, m.to);
    }
    kernels::CopyPagesArgs args;
    args.kv = tail;
    args.num_pairs = static_cast<uint32_t>(moves.size());
    args.src = src.data();
    args.dst = dst.data();
    if (std::string err = pool.memory->copy_pages(args, old_total); !err.empty()) {
      // The moved pages' bytes are not where the index says: drop them rather than serve them.
      log_event(LogLevel::error, "shrink_copy_failed",
                {kv("pool", pool.config.name), kv("error", err)});
      pool.index_events->begin_flush();
      pool.pages->flush();
      pool.index_events->end_flush(pool.pages->indexed() == 0);
    }
  }
  if (pool.host_tier) pool.host_tier->demote(tail);
  // The memory goes back off the loop (take_background_job), as long as it took to make.
  LooseSegment loose;
  auto r = pool.memory->shrink_segment(&loose);
  KVPOOL_CHECK(r.ok());  // the core refused nothing, and more than one pages segment is mapped
  released_.push_back(std::move(loose));
  resized(pool, false);
  return true;
}

uint64_t Service::next_segment_bytes(const Pool& pool) const {
  const uint64_t region = pool.info.scales_offset;
  return std::min(
      round_up(std::max(pool.config.segment_size, pool.info.page_stride), backend_->granularity()),
      region - std::min(region, pool.memory->pages_bytes_mapped()));
}

double Service::hits_per_byte(const Pool& pool) const {
  const uint64_t hits = pool.pages->stats().counters.hit_blocks - pool.hits_at_resize;
  return static_cast<double>(hits) /
         static_cast<double>(std::max<uint64_t>(1, pool.memory->bytes()));
}

bool Service::reclaim(const Pool& taker, uint64_t bytes, double below) {
  std::vector<Pool*> donors;
  uint64_t can_give = 0;
  for (const auto& p : pools_) {
    if (p.get() != &taker && p->elastic() && p->pages->num_pages() > p->min_pages &&
        p->copies_in_flight == 0 && (below < 0 || hits_per_byte(*p) < below)) {
      donors.push_back(p.get());
      const uint64_t floor = uint64_t{p->min_pages} * p->info.page_stride;
      can_give +=
          p->memory->pages_bytes_mapped() - std::min(floor, p->memory->pages_bytes_mapped());
    }
  }
  // Nothing is shrunk for a reclaim that cannot succeed (a held page may still stop one).
  if (elastic_bytes() + bytes > budget_bytes_ + can_give) return false;
  std::sort(donors.begin(), donors.end(),
            [&](const Pool* a, const Pool* b) { return hits_per_byte(*a) < hits_per_byte(*b); });
  for (Pool* d : donors) {
    while (elastic_bytes() + bytes > budget_bytes_ && shrink_one(*d).ok()) {
    }
    if (elastic_bytes() + bytes <= budget_bytes_) return true;
  }
  return false;
}

uint64_t Service::growable_pages(const Pool& pool) const {
  if (!pool.elastic()) return 0;
  // What the budget could fund: its room now, plus each other elastic pool's whole segments,
  // newest first, as long as it stays at or above its min (shrink_one gives back whole
  // segments only; reclaim asks a pool running a copy for nothing).
  const uint64_t mapped_now = elastic_bytes();
  uint64_t room = budget_bytes_ > mapped_now ? budget_bytes_ - mapped_now : 0;
  for (const auto& p : pools_) {
    if (p.get() == &pool || !p->elastic() || p->copies_in_flight != 0) continue;
    std::vector<wire::SegmentInfo> segs = p->memory->segments();  // newest (highest) first
    std::sort(segs.begin(), segs.end(),
              [](const auto& a, const auto& b) { return a.offset > b.offset; });
    uint64_t mapped = p->memory->pages_bytes_mapped();
    for (const wire::SegmentInfo& seg : segs) {
      if (seg.offset >= p->info.scales_offset || seg.bytes > mapped) continue;
      if ((mapped - seg.bytes) / p->info.page_stride < p->min_pages) break;
      mapped -= seg.bytes;
      room = room > UINT64_MAX - seg.bytes ? UINT64_MAX : room + seg.bytes;
    }
  }
  // This pool grows by whole segments (the region's last one may be shorter): count those the
  // room pays for.
  const uint64_t stride = pool.info.page_stride;
  const uint64_t segment =
      round_up(std::max(pool.config.segment_size, stride), backend_->granularity());
  uint64_t mapped = pool.memory->pages_bytes_mapped();
  const uint64_t region = pool.info.scales_offset;
  while (mapped < region) {
    const uint64_t next = std::min(segment, region - mapped);
    if (room < next) break;
    room -= next;
    mapped += next;
  }
  const uint64_t reachable = std::min<uint64_t>(mapped / stride, pool.info.max_pages);
  return reachable - std::min<uint64_t>(reachable, pool.pages->num_pages());
}

bool Service::grow_for(Pool& pool, uint64_t free_wanted) {
  bool grew = false;
  while (pool.pages->stats().free < free_wanted && pool.pages->num_pages() < pool.info.max_pages) {
    // Other pools' segments in the making hold their room (this pool's own is placed at its
    // new end when it is ready, or released).
    const uint64_t next =
        next_segment_bytes(pool) + ahead_bytes() - pool.growing_ahead - pool.resizing_bytes;
    if (elastic_bytes() + next > budget_bytes_) {
      // A full budget: the pool's own cache first, unless its hits per byte beat a donor's;
      // under pressure (nothing of its own left to evict) any donor will do.
      const core::PoolStats st = pool.pages->stats();
      const bool pressure = uint64_t{st.free} + st.cached - st.pinned_cached < free_wanted;
      if (!reclaim(pool, next, pressure ? -1.0 : hits_per_byte(pool))) break;
    }
    if (!grow_one(pool).ok()) break;
    grew = true;
  }
  return grew;
}

wire::Result<wire::Reply> Service::resize_up(SessionState& s, Pool& pool, uint32_t target) {
  // Planned here (the budget, other pools shrunk for it), made off the loop (call_job_) after
  // the donors' memory has gone back, then mapped and answered on the loop. The planned bytes
  // count as the pool's own growth in flight (ahead_bytes) until then, so no other growth takes
  // the room. A growth or shrink that ran meanwhile moves the end: segments still commit there
  // while their size fits (commit_growth), and the reply gives the size reached.
  const uint32_t before = pool.pages->num_pages();
  const uint64_t stride = pool.info.page_stride;
  auto plan = std::make_shared<std::vector<Growth>>();
  uint64_t planned = 0;
  while (std::min<uint64_t>((pool.memory->pages_bytes_mapped() + planned) / stride,
                            pool.info.max_pages) < target) {
    // The memory check waits for make_growth: a donor's memory goes back only in the job.
    auto g = pool.memory->plan_growth(planned, false);
    if (!g.ok()) {
      if (plan->empty()) return g.error();
      break;
    }
    // An operator's resize may take from any donor above its min.
    const uint64_t wanted = ahead_bytes() + planned + g.value().bytes;
    if (elastic_bytes() + wanted > budget_bytes_ && !reclaim(pool, wanted, -1.0)) {
      if (plan->empty()) {
        return resize_error(Errc::out_of_pages,
                            "pool " + pool.config.name + ": no segment fits memory_budget (" +
                                human_bytes(budget_bytes_) + ", " + human_bytes(elastic_bytes()) +
                                " mapped) and no other pool can give one back");
      }
      break;
    }
    planned += g.value().bytes;
    plan->push_back(std::move(g.value()));
  }
  pool.resizing_bytes = planned;
  call_job_ = std::make_unique<CopyJob>();
  call_job_->pool = &pool;
  call_job_->work =
      [memory = pool.memory.get(), plan,
       donors = std::make_shared<std::vector<LooseSegment>>(std::exchange(released_, {}))] {
        donors->clear();  // the reclaimed memory goes back before the new is taken
        for (Growth& g : *plan) {
          memory->make_growth(g);
          if (!g.error.empty()) break;
        }
      };
  call_job_->finish = [this, &s, &pool, plan, before, target]() -> wire::Result<wire::Reply> {
    pool.resizing_bytes = 0;
    std::string first;
    for (Growth& g : *plan) {
      if (std::string why = commit_growth(pool, g); !why.empty() && first.empty()) first = why;
    }
    log_event(LogLevel::info, "admin_resize",
              {kv("session", s.id), kv("uid", s.peer.uid), kv("pool", pool.config.name),
               kv("asked", target), kv("from", before), kv("pages", pool.pages->num_pages())});
    if (pool.pages->num_pages() == before && !first.empty()) {
      return resize_error(Errc::out_of_pages, first);
    }
    return wire::Reply(wire::ResizeReply{pool.pages->num_pages()});
  };
  return wire::Reply(wire::ResizeReply{});  // call_job_'s takes its place
}

uint64_t Service::ahead_bytes() const {
  uint64_t n = 0;
  for (const auto& p : pools_)
    n += p->growing_ahead + p->resizing_bytes;
  return n;
}

std::string Service::commit_growth(Pool& pool, Growth& g) {
  std::string why;
  if (!g.error.empty()) {
    why = g.error;
  } else if (g.memory.empty()) {
    why = "pool " + pool.config.name + ": a segment before this one could not be made";
  } else if (pool.pages->num_pages() >= pool.info.max_pages) {
    why = "pool " + pool.config.name + " reached its max_capacity meanwhile";
  } else if (elastic_bytes() + g.bytes > budget_bytes_) {
    why = "pool " + pool.config.name + ": memory_budget (" + human_bytes(budget_bytes_) +
          ") has no room left for a segment of " + human_bytes(g.bytes) +
          " (another pool grew meanwhile)";
  } else if (auto c = pool.memory->commit_growth(g); !c.ok()) {
    why = c.error().message;
  }
  if (!why.empty()) {
    // Made for nothing: its memory goes back off the loop, as a shrunk segment's does.
    if (!g.memory.empty()) released_.push_back(std::move(g.memory));
    return why;
  }
  const uint64_t pages = std::min<uint64_t>(
      pool.memory->pages_bytes_mapped() / pool.info.page_stride, pool.info.max_pages);
  KVPOOL_CHECK(pool.pages->grow(static_cast<uint32_t>(pages)).ok());
  resized(pool, true);
  return {};
}

void Service::grow_ahead(Pool& pool) {
  if (!pool.config.grow_ahead || pool.growing_ahead != 0 || pool.resizing_bytes != 0 ||
      pool.pages->num_pages() >= pool.info.max_pages || now_s_ < pool.grow_ahead_retry_s) {
    return;
  }
  const uint64_t next = next_segment_bytes(pool);
  // The low-water mark: half a segment's pages (at least one) free.
  const uint64_t low_water = std::max<uint64_t>(1, next / pool.info.page_stride / 2);
  if (next == 0 || pool.pages->stats().free >= low_water) return;
  if (elastic_bytes() + ahead_bytes() + next > budget_bytes_) return;  // never shrinks others
  auto g = pool.memory->plan_growth();
  if (!g.ok()) {
    pool.grow_ahead_retry_s = now_s_ + 1;  // the memory is short: not again on every call
    return;
  }
  auto growth = std::make_shared<Growth>(std::move(g.value()));
  pool.growing_ahead = growth->bytes;
  auto job = std::make_unique<CopyJob>();
  job->pool = &pool;
  job->work = [memory = pool.memory.get(), growth] { memory->make_growth(*growth); };
  job->done = [this, &pool, growth] {
    pool.growing_ahead = 0;
    if (const std::string why = commit_growth(pool, *growth); !why.empty()) {
      pool.grow_ahead_retry_s = now_s_ + 1;
      log_event(LogLevel::info, "grow_ahead_dropped",
                {kv("pool", pool.config.name), kv("why", why)});
    }
  };
  background_.push_back(std::move(job));
}

std::unique_ptr<CopyJob> Service::take_background_job() {
  if (!released_.empty()) {
    auto job = std::make_unique<CopyJob>();
    auto segments = std::make_shared<std::vector<LooseSegment>>(std::move(released_));
    released_.clear();
    job->work = [segments] { segments->clear(); };  // each gives its memory back
    return job;
  }
  if (background_.empty()) return nullptr;
  auto job = std::move(background_.front());
  background_.erase(background_.begin());
  return job;
}

void Service::finish_background(CopyJob& job) {
  if (job.done) job.done();
}

wire::Result<wire::Reply> Service::segments(SessionState& s, std::span<const int>* fds) {
  *fds = s.pool->memory->fds();
  wire::PoolInfo info = s.pool->info;
  info.tenant = tenant_names_[s.tenant];
  s.known_epoch = info.epoch;
  return wire::Reply(wire::SegmentsReply{std::move(info)});
}

wire::Result<wire::Reply> Service::resize(SessionState& s, const wire::ResizeRequest& r) {
  if (auto ok = check_admin(s.peer, "resize"); !ok.ok()) return ok.error();
  Pool& pool = *s.pool;
  if (!pool.elastic()) {
    return resize_error(
        Errc::invalid_argument,
        "pool " + pool.config.name + " is not elastic (give it max_capacity in the config)");
  }
  const uint32_t before = pool.pages->num_pages();
  if (r.pages > before && before < pool.info.max_pages) return resize_up(s, pool, r.pages);
  // Down only when the pool was above the target, and only while it stays at or above it.
  while (before > r.pages && pages_after_shrink(pool) >= std::max(r.pages, pool.min_pages) &&
         pool.pages->num_pages() > pool.min_pages) {
    auto sh = shrink_one(pool);
    if (!sh.ok()) {
      // Refused before anything changed: the error; part of the way: the size reached.
      if (pool.pages->num_pages() == before) return sh.error();
      break;
    }
  }
  log_event(LogLevel::info, "admin_resize",
            {kv("session", s.id), kv("uid", s.peer.uid), kv("pool", pool.config.name),
             kv("asked", r.pages), kv("from", before), kv("pages", pool.pages->num_pages())});
  return wire::Reply(wire::ResizeReply{pool.pages->num_pages()});
}

}  // namespace kvpool::daemon
