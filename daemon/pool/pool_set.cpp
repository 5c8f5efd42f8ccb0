#include "daemon/pool/pool_set.h"

#include <time.h>

#include <algorithm>
#include <new>

#include "common/byte_units.h"
#include "daemon/telemetry/latency.h"
#include "daemon/telemetry/log.h"

namespace kvpool::daemon {

namespace {

wire::Error error(Errc code, std::string message, uint64_t value = 0) {
  return wire::Error{Status(code, kNoItem, value), std::move(message)};
}

}  // namespace

void ResizePlan::make() {
  donors.clear();  // the reclaimed memory goes back before the new is taken
  for (Growth& g : growths) {
    pool->memory().make_growth(g);
    if (!g.error.empty()) break;
  }
}

PoolSet::PoolSet(EventLog& events) : events_(events), start_mono_ns_(LatencyRecorder::now_ns()) {}

wire::Result<std::unique_ptr<PoolSet>> PoolSet::create(const Config& config, MemoryBackend& backend,
                                                       EventLog& events) {
  std::unique_ptr<PoolSet> set(new PoolSet(events));
  if (config.memory_budget) {
    const Capacity& b = *config.memory_budget;
    set->budget_ =
        b.unit == Capacity::Unit::fraction
            ? static_cast<uint64_t>(static_cast<double>(backend.available_bytes()) * b.fraction)
            : b.value;
  }
  // The checks in PoolRuntime::create keep a pool's bookkeeping within memory; should an
  // allocation still fail, the start fails naming the pool being set up instead of ending in an
  // uncaught std::bad_alloc.
  const PoolConfig* current = nullptr;
  try {
    for (const PoolConfig& pc : config.pools) {
      current = &pc;
      const PoolConfig member = set->group_config(pc, backend);
      auto pool = PoolRuntime::create(
          pc.model.empty() ? pc : member, backend, config.max_segment_bytes,
          static_cast<uint16_t>(set->pools_.size()), *set, events, config.events);
      if (!pool.ok()) return pool.error();
      set->pools_.push_back(std::move(pool.value()));
    }
    current = nullptr;
    for (const auto& [model, budget] : set->model_budgets_) {
      if (set->model_bytes(model) > budget) {
        return error(Errc::invalid_argument, "pool " + model + ": its groups start with " +
                                                 human_bytes(set->model_bytes(model)) +
                                                 " (a segment each), above its "
                                                 "capacity (" +
                                                 human_bytes(budget) +
                                                 "); lower segment_size or raise capacity");
      }
    }
    if (set->elastic_bytes() > set->budget_) {
      return error(Errc::invalid_argument,
                   "the elastic pools start with " + human_bytes(set->elastic_bytes()) +
                       " mapped, above memory_budget (" + human_bytes(set->budget_) +
                       "); lower their capacity or raise the budget");
    }
    for (auto& pool : set->pools_) {
      current = &pool->config();
      if (auto err = pool->attach_host_tier(); !err.ok()) return err.error();
    }
    for (auto& pool : set->pools_) {
      current = &pool->config();
      if (auto err = pool->attach_converter(); !err.ok()) return err.error();
      if (auto err = pool->attach_remote_tier(); !err.ok()) return err.error();
    }
  } catch (const std::bad_alloc&) {
    return bookkeeping_error(config, current);
  }
  return set;
}

PoolConfig PoolSet::group_config(const PoolConfig& pc, const MemoryBackend& backend) {
  if (pc.model.empty()) return pc;
  // Once per model: a fraction is of the memory free before its first group took any.
  const Capacity& b = pc.model_budget;
  const auto known = model_budgets_.find(pc.model);
  const uint64_t budget =
      known != model_budgets_.end() ? known->second
      : b.unit == Capacity::Unit::fraction
          ? static_cast<uint64_t>(static_cast<double>(backend.available_bytes()) * b.fraction)
          : b.value;
  model_budgets_[pc.model] = budget;
  // Each group may grow into the whole budget; the budget, not a split, keeps them within it.
  PoolConfig member = pc;
  member.max_capacity = Capacity{Capacity::Unit::bytes, budget, 0.0};
  return member;
}

uint64_t PoolSet::model_budget(const PoolRuntime& pool) const {
  if (pool.config().model.empty()) return UINT64_MAX;
  const auto it = model_budgets_.find(pool.config().model);
  return it == model_budgets_.end() ? UINT64_MAX : it->second;
}

uint64_t PoolSet::model_bytes(const std::string& model) const {
  uint64_t n = 0;
  for (const auto& p : pools_) {
    if (p->config().model == model) n += p->memory().bytes();
  }
  return n;
}

bool PoolSet::siblings(const PoolRuntime& a, const PoolRuntime& b) {
  return !a.config().model.empty() && a.config().model == b.config().model;
}

std::vector<PoolRuntime*> PoolSet::group_pools(const PoolRuntime& pool) const {
  std::vector<PoolRuntime*> out;
  for (const auto& p : pools_) {
    if (p.get() == &pool || siblings(*p, pool)) out.push_back(p.get());
  }
  return out;
}

PoolSet::Shortfall PoolSet::shortfall(const PoolRuntime& pool, uint64_t bytes) const {
  // Segments in the making hold their room, but for the pool's own (it lands at its new end).
  const ElasticState& own = pool.elastic_state();
  const uint64_t own_ahead = own.growing_ahead + own.resizing_bytes;
  uint64_t model_ahead = 0;
  for (const auto& p : pools_) {
    if (p.get() != &pool && siblings(*p, pool)) {
      model_ahead += p->elastic_state().growing_ahead + p->elastic_state().resizing_bytes;
    }
  }
  const auto over = [](uint64_t used, uint64_t limit) { return used > limit ? used - limit : 0; };
  Shortfall s;
  s.daemon = over(elastic_bytes() + ahead_bytes() - own_ahead + bytes, budget_);
  if (!pool.config().model.empty()) {
    s.model = over(model_bytes(pool.config().model) + model_ahead + bytes, model_budget(pool));
  }
  return s;
}

wire::Error PoolSet::bookkeeping_error(const Config& config, const PoolConfig* current) {
  std::string who;
  if (current != nullptr) {
    who = "pool " + current->name;
  } else {
    for (const PoolConfig& pc : config.pools)
      who += (who.empty() ? "pools " : ", ") + pc.name;
  }
  return error(Errc::invalid_argument,
               who + ": not enough memory for the daemon's bookkeeping of the pages (about " +
                   std::to_string(PoolRuntime::kBookkeepingBytesPerPage) +
                   " bytes a page besides the pool memory; std::bad_alloc); use a smaller "
                   "capacity or larger pages");
}

PoolRuntime* PoolSet::find(const std::string& name) const {
  for (const auto& p : pools_) {
    if (p->name() == name) return p.get();
  }
  return nullptr;
}

void PoolSet::apply_config(const std::vector<PoolConfig>& next) {
  for (size_t i = 0; i < pools_.size() && i < next.size(); ++i)
    pools_[i]->apply_config(next[i]);
}

uint32_t PoolSet::tick() {
  timespec t{};
  ::clock_gettime(CLOCK_MONOTONIC_COARSE, &t);
  const uint64_t now_ns =
      static_cast<uint64_t>(t.tv_sec) * 1000000000u + static_cast<uint64_t>(t.tv_nsec);
  const uint64_t s = now_ns > start_mono_ns_ ? (now_ns - start_mono_ns_) / 1000000000u : 0;
  now_s_ = static_cast<uint32_t>(std::min<uint64_t>(s + 1, UINT32_MAX));
  return now_s_;
}

uint64_t PoolSet::elastic_bytes() const {
  uint64_t n = 0;
  for (const auto& p : pools_) {
    if (p->elastic()) n += p->memory().bytes();
  }
  return n;
}

uint64_t PoolSet::ahead_bytes() const {
  uint64_t n = 0;
  for (const auto& p : pools_)
    n += p->elastic_state().growing_ahead + p->elastic_state().resizing_bytes;
  return n;
}

void PoolSet::release_later(LooseSegment segment) {
  if (!segment.empty()) released_.push_back(std::move(segment));
}

wire::Result<bool> PoolSet::shrink_one(PoolRuntime& pool) {
  // The memory goes back off the loop (take_background), as long as it took to make.
  LooseSegment loose;
  auto r = pool.shrink_last(&loose);
  if (r.ok()) release_later(std::move(loose));
  return r;
}

bool PoolSet::reclaim(const PoolRuntime& taker, uint64_t bytes,
                      const RebalanceStrategy::Taker& how) {
  std::vector<PoolRuntime*> donors = strategy_.donors(pools_, taker, how);
  // A hybrid model over its own budget takes from its other groups first: only they free it.
  std::stable_partition(donors.begin(), donors.end(),
                        [&](const PoolRuntime* d) { return siblings(*d, taker); });
  Shortfall need = shortfall(taker, bytes);
  uint64_t can_give = 0;
  uint64_t siblings_give = 0;
  for (const PoolRuntime* d : donors) {
    can_give += d->bytes_above_min();
    if (siblings(*d, taker)) siblings_give += d->bytes_above_min();
  }
  // Nothing is shrunk for a reclaim that cannot succeed (a held page may still stop one).
  if (need.daemon > can_give || need.model > siblings_give) return false;
  for (PoolRuntime* d : donors) {
    const bool sibling = siblings(*d, taker);
    // Past the siblings nothing frees the model's budget: shrink no other pool for nothing.
    if (!sibling && need.model > 0) return false;
    while ((need.daemon > 0 || (sibling && need.model > 0)) && shrink_one(*d).ok())
      need = shortfall(taker, bytes);
    if (!need.any()) return true;
  }
  return false;
}

uint64_t PoolSet::growable_pages(const PoolRuntime& pool) const {
  if (!pool.elastic()) return 0;
  // What the budget could fund: its room now, plus each donor's whole segments, newest first,
  // as long as it stays at or above its min (shrinks give back whole segments only).
  const uint64_t mapped_now = elastic_bytes();
  uint64_t room = budget_ > mapped_now ? budget_ - mapped_now : 0;
  // A group of a hybrid model: its model's budget bounds it too, and only its other groups'
  // segments go back into that.
  const bool group = !pool.config().model.empty();
  const uint64_t model_now = group ? model_bytes(pool.config().model) : 0;
  uint64_t model_room = !group                           ? UINT64_MAX
                        : model_budget(pool) > model_now ? model_budget(pool) - model_now
                                                         : 0;
  for (const PoolRuntime* p : strategy_.donors(pools_, pool, strategy_.operator_resize())) {
    std::vector<wire::SegmentInfo> segs = p->memory().segments();  // newest (highest) first
    std::sort(segs.begin(), segs.end(),
              [](const auto& a, const auto& b) { return a.offset > b.offset; });
    uint64_t mapped = p->memory().pages_bytes_mapped();
    for (const wire::SegmentInfo& seg : segs) {
      if (seg.offset >= p->info().scales_offset || seg.bytes > mapped) continue;
      if (p->pages_in(mapped - seg.bytes) < p->elastic_state().min_pages) break;
      mapped -= seg.bytes;
      room = room > UINT64_MAX - seg.bytes ? UINT64_MAX : room + seg.bytes;
      if (group && siblings(*p, pool)) model_room += seg.bytes;
    }
  }
  room = std::min(room, model_room);
  // This pool grows by whole segments (the region's last one may be shorter): count those the
  // room pays for.
  uint64_t mapped = pool.memory().pages_bytes_mapped();
  const uint64_t region = pool.info().scales_offset;
  while (mapped < region) {
    const uint64_t next = std::min(pool.elastic_state().segment_bytes, region - mapped);
    if (room < next) break;
    room -= next;
    mapped += next;
  }
  const uint64_t reachable = std::min<uint64_t>(pool.pages_in(mapped), pool.info().max_pages);
  return reachable - std::min<uint64_t>(reachable, pool.pages().num_pages());
}

wire::Result<bool> PoolSet::grow_one(PoolRuntime& pool) {
  if (pool.pages().num_pages() >= pool.info().max_pages) {
    return error(Errc::exceeds_capacity, "pool " + pool.name() + " is at its max_capacity (" +
                                             std::to_string(pool.info().max_pages) + " pages)");
  }
  const uint64_t before = pool.memory().bytes();
  // Memory a shrink let go of (a reclaim for this growth, say) goes back first: this path
  // already waits on the loop for the new segment.
  released_.clear();
  auto g = pool.memory().grow_segment();
  if (!g.ok()) return g.error();
  if (elastic_bytes() > budget_ ||
      (!pool.config().model.empty() && model_bytes(pool.config().model) > model_budget(pool))) {
    // The segment came out larger than the caller planned for; give it back.
    const uint64_t added = pool.memory().bytes() - before;
    (void)pool.memory().shrink_segment();
    return error(Errc::out_of_pages, "pool " + pool.name() + ": a segment of " +
                                         human_bytes(added) + " would pass " + budget_name(pool));
  }
  pool.grown();
  return true;
}

bool PoolSet::grow_for(PoolRuntime& pool, uint64_t free_wanted) {
  bool grew = false;
  while (pool.pages().stats().free < free_wanted &&
         pool.pages().num_pages() < pool.info().max_pages) {
    // Other pools' segments in the making hold their room (this pool's own is placed at its
    // new end when it is ready, or released): shortfall() counts them.
    const uint64_t next = pool.next_segment_bytes();
    if (shortfall(pool, next).any() &&
        !reclaim(pool, next, strategy_.on_demand(pool, free_wanted))) {
      break;
    }
    if (!grow_one(pool).ok()) break;
    grew = true;
  }
  return grew;
}

wire::Result<std::shared_ptr<ResizePlan>> PoolSet::plan_resize_up(PoolRuntime& pool,
                                                                  uint32_t target) {
  // The planned bytes count as the pool's own growth in flight (ahead_bytes) until
  // commit_resize, so no other growth takes the room. A growth or shrink that runs meanwhile
  // moves the end: segments still commit there while their size fits (commit_growth).
  auto plan = std::make_shared<ResizePlan>();
  plan->pool = &pool;
  uint64_t planned = 0;
  while (std::min<uint64_t>(pool.pages_in(pool.memory().pages_bytes_mapped() + planned),
                            pool.info().max_pages) < target) {
    // The memory check waits for make(): a donor's memory goes back only there.
    auto g = pool.memory().plan_growth(planned, false);
    if (!g.ok()) {
      if (plan->growths.empty()) return g.error();
      break;
    }
    const uint64_t wanted = planned + g.value().bytes;
    if (shortfall(pool, wanted).any() && !reclaim(pool, wanted, strategy_.operator_resize())) {
      if (plan->growths.empty()) {
        return error(Errc::out_of_pages, "pool " + pool.name() + ": no segment fits " +
                                             budget_name(pool) +
                                             " and no other pool can give one back");
      }
      break;
    }
    planned += g.value().bytes;
    plan->growths.push_back(std::move(g.value()));
  }
  pool.elastic_state().resizing_bytes = planned;
  plan->donors = std::exchange(released_, {});
  return plan;
}

std::string PoolSet::commit_resize(ResizePlan& plan) {
  plan.pool->elastic_state().resizing_bytes = 0;
  std::string first;
  for (Growth& g : plan.growths) {
    if (std::string why = commit_growth(*plan.pool, g); !why.empty() && first.empty()) first = why;
  }
  return first;
}

std::string PoolSet::commit_growth(PoolRuntime& pool, Growth& g) {
  std::string why;
  if (!g.error.empty()) {
    why = g.error;
  } else if (g.memory.empty()) {
    why = "pool " + pool.name() + ": a segment before this one could not be made";
  } else if (pool.pages().num_pages() >= pool.info().max_pages) {
    why = "pool " + pool.name() + " reached its max_capacity meanwhile";
  } else if (Shortfall s = shortfall(pool, g.bytes); s.any()) {
    why = "pool " + pool.name() + ": " + budget_name(pool) + " has no room left for a segment of " +
          human_bytes(g.bytes) + " (another pool grew meanwhile)";
  } else if (auto c = pool.memory().commit_growth(g); !c.ok()) {
    why = c.error().message;
  }
  if (!why.empty()) {
    // Made for nothing: its memory goes back off the loop, as a shrunk segment's does.
    release_later(std::move(g.memory));
    return why;
  }
  pool.grown();
  return {};
}

void PoolSet::grow_ahead(PoolRuntime& pool) {
  ElasticState& e = pool.elastic_state();
  if (!pool.config().grow_ahead || e.growing_ahead != 0 || e.resizing_bytes != 0 ||
      pool.pages().num_pages() >= pool.info().max_pages || now_s_ < e.grow_ahead_retry_s) {
    return;
  }
  const uint64_t next = pool.next_segment_bytes();
  // The low-water mark: half a segment's pages (at least one) free.
  const uint64_t low_water = std::max<uint64_t>(1, pool.pages_in(next) / 2);
  if (next == 0 || pool.pages().stats().free >= low_water) return;
  if (shortfall(pool, next).any()) return;  // never shrinks others
  auto g = pool.memory().plan_growth();
  if (!g.ok()) {
    e.grow_ahead_retry_s = now_s_ + 1;  // the memory is short: not again on every call
    return;
  }
  auto growth = std::make_shared<Growth>(std::move(g.value()));
  e.growing_ahead = growth->bytes;
  MemoryWork w;
  w.pool = &pool;
  w.run = [memory = &pool.memory(), growth] { memory->make_growth(*growth); };
  w.done = [this, &pool, growth] {
    pool.elastic_state().growing_ahead = 0;
    if (const std::string why = commit_growth(pool, *growth); !why.empty()) {
      pool.elastic_state().grow_ahead_retry_s = now_s_ + 1;
      log_event(LogLevel::info, "grow_ahead_dropped", {kv("pool", pool.name()), kv("why", why)});
    }
  };
  background_.push_back(std::move(w));
}

void PoolSet::drop_group_evictions() {
  for (bool again = true; again;) {
    again = false;
    for (const auto& p : pools_) {
      const auto keys = p->take_group_evictions();
      if (keys.empty()) continue;
      again = true;  // a dropped block of another full group is that group's loss
      for (const auto& [ns, hash] : keys) {
        // Demoted to the host tier, or published again since: still the group's.
        if (p->holds_block(ns, hash)) continue;
        for (PoolRuntime* other : group_pools(*p)) {
          if (other != p.get()) other->drop_block(ns, hash);
        }
      }
    }
  }
}

std::string PoolSet::budget_name(const PoolRuntime& pool) const {
  std::string s =
      "memory_budget (" + human_bytes(budget_) + ", " + human_bytes(elastic_bytes()) + " mapped)";
  if (pool.config().model.empty()) return s;
  return s + " or the capacity of pool " + pool.config().model + " (" +
         human_bytes(model_budget(pool)) + ", " + human_bytes(model_bytes(pool.config().model)) +
         " mapped by its groups)";
}

std::optional<MemoryWork> PoolSet::take_background() {
  if (!released_.empty()) {
    auto segments = std::make_shared<std::vector<LooseSegment>>(std::move(released_));
    released_.clear();
    MemoryWork w;
    w.run = [segments] { segments->clear(); };  // each gives its memory back
    return w;
  }
  if (background_.empty()) return std::nullopt;
  MemoryWork w = std::move(background_.front());
  background_.erase(background_.begin());
  return w;
}

}  // namespace kvpool::daemon
