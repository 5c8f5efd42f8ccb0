#include "daemon/pool/pool_runtime.h"

#include <algorithm>
#include <string_view>

#include "common/byte_units.h"
#include "common/stats_counters.h"
#include "common/system_memory.h"
#include "daemon/core/check.h"
#include "daemon/pool/pool_set.h"
#include "daemon/telemetry/log.h"
#include "kernels/cpu/kernels_cpu.h"
#include "kernels/pool_view.h"

namespace kvpool::daemon {

namespace {

wire::Error error(Errc code, std::string message, uint64_t value = 0) {
  return wire::Error{Status(code, kNoItem, value), std::move(message)};
}

}  // namespace

PoolRuntime::PoolRuntime(const PoolConfig& pc, uint16_t index, PoolSet& set)
    : config_(pc), index_(index), set_(set) {}

wire::Result<std::unique_ptr<PoolRuntime>> PoolRuntime::create(
    const PoolConfig& pc, MemoryBackend& backend, uint64_t max_segment_bytes, uint16_t index,
    PoolSet& set, EventLog& events, const EventsConfig& events_config) {
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
      pages = static_cast<uint64_t>(static_cast<double>(backend.available_bytes()) *
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
  std::unique_ptr<PoolRuntime> pool(new PoolRuntime(pc, index, set));
  wire::PoolInfo& info = pool->info_;
  info.page_stride = page_data_bytes(g);  // create_elastic counts pages by it
  if (pc.max_capacity) {
    auto n = pool->create_elastic(backend, static_cast<uint32_t>(pages));
    if (!n.ok()) return n.error();
    pages = n.value();
  } else {
    auto memory = backend.create(pages * per_page, max_segment_bytes, pc.name);
    if (!memory.ok()) return memory.error();
    pool->memory_ = std::move(memory.value());
    info.reserved_bytes = pool->memory_->reserved_bytes();
    info.scales_offset = pages * page_data_bytes(g);
    info.max_pages = static_cast<uint32_t>(pages);
  }
  core::PoolOptions opts;
  opts.num_pages = static_cast<uint32_t>(pages);
  opts.policy = core::make_policy(pc.policy);
  if (!opts.policy) return error(Errc::invalid_argument, "pool " + pc.name + ": unknown policy");
  pool->pages_ = std::make_unique<core::PagePool>(std::move(opts));
  info.geometry = g;
  info.layout = pc.layout;
  info.num_pages = static_cast<uint32_t>(pages);
  info.segment_bytes = pool->memory_->bytes();
  info.pool_name = pc.name;
  info.backend = std::string(backend.name());
  info.device = backend.device();
  info.device_uuid = backend.device_uuid();
  info.segments = pool->memory_->segments();
  info.model = pc.model;
  info.group = pc.group;
  info.groups = pc.model_groups;
  log_event(LogLevel::info, "pool_ready",
            {kv("pool", pc.name), kv("pages", pages), kv("page_bytes", per_page),
             kv("bytes", info.segment_bytes), kv("size", human_bytes(pages * per_page)),
             kv("backend", info.backend), kv("segments", info.segments.size()),
             kv("policy", pc.policy), kv("layout", std::string(layout_name(pc.layout)))});
  pool->init_telemetry(events, events_config, backend.name());
  return pool;
}

void PoolRuntime::init_telemetry(EventLog& events, const EventsConfig& ev,
                                 std::string_view backend_name) {
  events_ = &events;
  prefix_stats_ = std::make_unique<PrefixStats>(pages_->num_pages());
  if (!ev.zmq_endpoint.empty()) {
    kv_events_ = std::make_unique<KvEventBatcher>();
    kv_format_.hash_format =
        ev.zmq_block_hash == "uint64" ? KvHashFormat::uint64 : KvHashFormat::bytes;
    kv_format_.layout = ev.zmq_payload == "map" ? KvPayloadLayout::map : KvPayloadLayout::array;
    kv_format_.block_size = config_.geometry.tokens_per_page;
    // vLLM's medium names where a block lives: the host backend keeps pages in CPU memory,
    // every other backend (cuda-*, fake-device) stands for device memory.
    kv_format_.medium = backend_name == std::string_view("host") ? "CPU" : "GPU";
    kv_format_.data_parallel_rank = ev.data_parallel_rank;
    kv_format_.token_ids = ev.zmq_token_ids;
    if (!config_.model.empty()) kv_format_.group_idx = config_.group;
  }
  index_events_ = std::make_unique<PoolIndexEvents>(index_, events, *prefix_stats_, set_.now_ref(),
                                                    kv_events_.get());
  index_events_->set_keep_token_ids(kv_format_.token_ids);
  pages_->set_observer(index_events_.get());
  // A full-attention group's losses go to its model's other groups; a host tier, attached
  // later, puts its mover in front of this and reports its own removals here too.
  if (!config_.model.empty() && config_.geometry.window == 0) {
    group_evictions_ = std::make_unique<GroupEvictions>(index_events_.get());
    pages_->set_observer(group_evictions_.get());
  }
}

wire::Result<bool> PoolRuntime::attach_remote_tier() {
  if (!config_.remote_tier) return true;
  auto tier = RemoteTier::create(*pages_, config_, info_.device, index_events_.get());
  if (!tier.ok()) return tier.error();
  remote_ = std::move(tier.value());
  const RemoteTierConfig& rc = *config_.remote_tier;
  // A cluster that does not answer yet is no reason not to start: the tier is a cache, asked
  // again as lookups come.
  const bool answered = remote_->refresh_now();
  const remote::ClusterView v = remote_->view();
  log_event(answered ? LogLevel::info : LogLevel::warn, "remote_tier_ready",
            {kv("pool", name()), kv("cluster", rc.cluster.front()), kv("seeds", rc.cluster.size()),
             kv("masters", v.nodes), kv("slots", v.slots_covered),
             kv("error", answered ? std::string() : v.last_error),
             kv("namespace", rc.key_namespace), kv("write", remote_write_name(rc.write)),
             kv("admit", rc.admit == RemoteTierConfig::Admit::all ? "all" : "reused"),
             kv("staging_bytes", 2 * uint64_t{rc.staging_pages} * remote_->slot_bytes())});
  return true;
}

wire::Result<bool> PoolRuntime::attach_host_tier() {
  const PoolConfig& pc = config_;
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
  core::IndexObserver* next = group_evictions_
                                  ? static_cast<core::IndexObserver*>(group_evictions_.get())
                                  : index_events_.get();
  auto tier = PoolHostTier::create(*pages_, next, pc.geometry, static_cast<uint32_t>(slots),
                                   info_.device, pc.name);
  if (!tier.ok()) return tier.error();
  // Its moves' KV events carry what the blocks were published with.
  index_events_->set_keep_chains(true);
  host_tier_ = std::move(tier.value());
  log_event(LogLevel::info, "host_tier_ready",
            {kv("pool", pc.name), kv("pages", slots), kv("bytes", host_tier_->bytes()),
             kv("size", human_bytes(host_tier_->bytes())), kv("pinned", info_.device >= 0)});
  return true;
}

wire::Result<bool> PoolRuntime::attach_converter() {
  const PoolConfig& pc = config_;
  if (pc.convert_evictions_to.empty()) return true;
  PoolRuntime* to = set_.find(pc.convert_evictions_to);
  const auto refuse = [&](const std::string& why) {
    return error(Errc::invalid_argument, "pool " + pc.name + ": convert_evictions_to " +
                                             pc.convert_evictions_to + ": " + why);
  };
  // The parser refuses these; a config made in code is held to them here.
  if (to == nullptr || to == this) return refuse("no other pool has that name");
  if (host_tier_ != nullptr) return refuse("this pool has a host tier");
  if (to->converter_ != nullptr) return refuse("that pool converts its own evictions");
  if (!dtype_is_quantized(to->info().geometry.dtype)) return refuse("that pool is not 8-bit");
  if (to->info().device != info_.device) {
    return refuse("the pools lie in different memory (device " + std::to_string(info_.device) +
                  " and " + std::to_string(to->info().device) + ")");
  }
  kernels::ConvertPagesArgs probe;
  probe.src = paged_kv();
  probe.dst = to->paged_kv();
  if (std::string why =
          kernels::cpu::check_convert_pages(probe, pages_->num_pages(), to->pages().num_pages());
      !why.empty()) {
    return refuse(why);
  }
  core::IndexObserver* next = group_evictions_
                                  ? static_cast<core::IndexObserver*>(group_evictions_.get())
                                  : index_events_.get();
  converter_ = std::make_unique<EvictionConverter>(*this, *to, next);
  // Converted blocks' KV events carry what they were published with, both ways.
  index_events_->set_keep_chains(true);
  to->index_events().set_keep_chains(true);
  log_event(LogLevel::info, "eviction_converter_ready",
            {kv("pool", pc.name), kv("into", to->name()),
             kv("dtype", std::string(dtype_name(to->info().geometry.dtype)))});
  // Every block of the 8-bit pool arrives as an eviction, so it is a victim tier: recency of
  // arrival is what to keep. The prefix policy's evidence of reuse does not carry over, and on
  // the Mooncake trace it gave 0.68-0.88x plain eviction's hit rate where lru gave 1.21-1.45x
  // (bench/RESULTS.md, "Precision before eviction").
  if (to->config().policy != "lru") {
    log_event(LogLevel::warn, "eviction_converter_policy",
              {kv("pool", to->name()), kv("policy", to->config().policy),
               kv("advice", "give the pool evictions are converted into policy: lru")});
  }
  return true;
}

bool PoolRuntime::holds_block(Namespace ns, const BlockHash& hash) const {
  return pages_->find(ns, hash) != kNoPage ||
         (host_tier_ && host_tier_->tier().find(ns, hash) != core::kNoSlot);
}

bool PoolRuntime::host_can_promote(Namespace ns, const BlockHash& hash) const {
  return host_tier_ && copies_in_flight_ == 0 && host_tier_->tier().find(ns, hash) != core::kNoSlot;
}

void PoolRuntime::drop_block(Namespace ns, const BlockHash& hash) {
  (void)pages_->drop_cached(ns, hash);
  if (host_tier_) (void)host_tier_->drop(ns, hash);
}

kernels::PagedKv PoolRuntime::paged_kv() const {
  return kernels::paged_kv_of(info_, memory_->base());
}

void PoolRuntime::apply_config(const PoolConfig& next) {
  if (config_.policy != next.policy) {
    log_event(LogLevel::info, "policy_changed",
              {kv("pool", config_.name), kv("from", config_.policy), kv("to", next.policy),
               kv("cached_pages", pages_->stats().cached)});
    pages_->set_policy(core::make_policy(next.policy));
  }
  config_ = next;
}

Status PoolRuntime::alloc(core::OwnerId owner, std::span<PageId> out, const core::CallHints& hints,
                          uint64_t* growable, bool* admitted) {
  const uint64_t n = out.size();
  // Every refusal comes first: an alloc that fails must not grow its pool, shrink another or
  // evict anything on its way to failing. What the pool could grow by (a walk over every
  // elastic pool's segments) is asked only when its own free and evictable pages fall short:
  // most allocs never pay for it.
  const uint32_t max_pages = elastic() ? info_.max_pages : pages_->num_pages();
  *growable = 0;
  Status admission = pages_->admit_alloc(n, hints, max_pages, 0);
  if (admission.code() == Errc::out_of_pages && elastic()) {
    *growable = set_.growable_pages(*this);
    admission = pages_->admit_alloc(n, hints, max_pages, *growable);
  }
  *admitted = admission.ok();
  if (!admission.ok()) return admission;
  // An elastic pool grows before it evicts, as far as its max and the budget allow.
  if (elastic() && pages_->stats().free < n) set_.grow_for(*this, n);
  return pages_->alloc(owner, out, hints);
}

bool PoolRuntime::plan_promotion(core::OwnerId owner, Namespace ns,
                                 std::span<const BlockHash> missing, uint32_t max_new_pages,
                                 const core::CallHints& hints, TierCopy& tier) {
  if (converter_) {
    return !missing.empty() &&
           converter_->plan_back(owner, ns, missing, max_new_pages, hints, tier);
  }
  return host_tier_ && !missing.empty() &&
         host_tier_->plan_promote(paged_kv(), owner, ns, missing, max_new_pages, hints, tier);
}

uint32_t PoolRuntime::finish_promotion(TierCopy& tier, core::OwnerId owner, Namespace ns,
                                       std::span<const BlockHash> chain, std::span<PageId> out) {
  if (remote_) remote_->finish_demote(tier);
  if (converter_) return converter_->finish_back(tier, owner, ns, chain, out);
  return host_tier_->finish_promote(tier, owner, ns, chain, out);
}

uint32_t PoolRuntime::promote_now(core::OwnerId owner, Namespace ns,
                                  std::span<const BlockHash> chain, std::span<PageId> out) {
  if (!host_tier_ || copies_in_flight_ != 0 || chain.empty()) return 0;
  const uint64_t page_bytes =
      page_data_bytes(config_.geometry) + page_scale_bytes(config_.geometry);
  const auto max = static_cast<uint32_t>(
      std::min<uint64_t>({chain.size(), out.size(), kMaxPromoteNowBytes / page_bytes}));
  TierCopy c;
  const bool promoting = plan_promotion(owner, ns, chain.first(max), max, core::CallHints{}, c);
  if (c.empty()) return 0;
  run_tier(c);
  if (!promoting) {
    finish_demotions(c);
    return 0;
  }
  return finish_promotion(c, owner, ns, chain.first(max), out.first(max));
}

void PoolRuntime::plan_demotions(TierCopy& tier) {
  if (remote_) remote_->plan_demote(paged_kv(), tier);
  if (host_tier_) host_tier_->plan_demote(paged_kv(), tier);
  if (converter_) converter_->plan(tier);
}

void PoolRuntime::demote_now() {
  KVPOOL_CHECK(copies_in_flight_ == 0 || host_tier_ == nullptr);
  KVPOOL_CHECK(converter_ == nullptr);  // only a 16-bit pool converts: this is its 8-bit pool
  // The three steps of every tier copy, here at once: the victims (CACHED pages no job reads or
  // writes) go down to the host tier and, write: on_demote, into the remote tier's staging
  // memory, before the converter writes its blocks into them.
  TierCopy c;
  plan_demotions(c);
  if (c.empty()) return;
  run_tier(c);
  finish_demotions(c);
}

void PoolRuntime::drop_pending_demotions() {
  if (host_tier_) host_tier_->drop_pending();
  if (converter_) converter_->drop_pending();
  if (remote_) remote_->drop_pending_demotions();
}

void PoolRuntime::run_tier(TierCopy& tier) {
  // First: the evicted pages' bytes, before anything of the batch is promoted into them.
  if (!tier.remote_down_runs.empty()) {
    tier.remote_down_error = remote_->copy_down(tier.remote_down_runs);
  }
  if (host_tier_) host_tier_->run(tier);
  if (converter_) converter_->run(tier);
  // Last: a page a remote value lands in may be one this batch demoted first.
  if (!tier.remote_runs.empty()) tier.remote_error = remote_->copy_up(tier.remote_runs);
}

void PoolRuntime::finish_demotions(TierCopy& tier) {
  if (remote_) remote_->finish_demote(tier);
  if (host_tier_) host_tier_->finish_demote(tier);
  if (converter_) converter_->finish(tier);
}

uint32_t PoolRuntime::evict(uint32_t count, TierCopy& tier) {
  // With a host tier or a converter the pages go down first, held until their bytes are there.
  if (host_tier_) return host_tier_->plan_evict(paged_kv(), count, tier);
  if (converter_) return converter_->plan_evict(count, tier);
  if (remote_ && remote_->holds_evictions()) {
    return pages_->evict_into(remote_->owner(), count, tier.remote_held);
  }
  return pages_->evict(count);
}

std::pair<uint32_t, uint32_t> PoolRuntime::flush() {
  // A flush empties the pool's cache, the blocks kept in its host tier included.
  index_events_->begin_flush();
  const uint32_t n = pages_->flush();
  const uint32_t host = host_tier_ ? host_tier_->flush() : 0;
  index_events_->end_flush(tiers_empty());
  // A flush drops this group's cache only, as its device flush does not cascade either: what
  // its host tier reported dropping is not a loss for the other groups.
  if (group_evictions_) (void)group_evictions_->take();
  if (converter_) {
    // The 8-bit pool is this pool's lower tier, as a host tier is: it goes too (with any other
    // pool's conversions into it), and conversions under way publish nothing.
    converter_->flushed();
    const auto [n8, host8] = converter_->target().flush();
    return {n + n8, host + host8};
  }
  return {n, host};
}

std::optional<wire::Error> PoolRuntime::capacity_error(const Status& st, uint64_t growable) const {
  const std::string what = "alloc of " + std::to_string(st.value()) + " pages: pool " + name();
  if (st.code() == Errc::exceeds_capacity) {
    return error(Errc::exceeds_capacity,
                 what + " holds at most " +
                     std::to_string(elastic() ? info_.max_pages : pages_->num_pages()) +
                     (elastic() ? " pages (max_capacity)" : " pages (capacity)"),
                 st.value());
  }
  if (st.code() == Errc::out_of_pages) {
    const core::PoolStats ps = pages_->stats();
    return error(
        Errc::out_of_pages,
        what + " has " + std::to_string(ps.free) + " free and " +
            std::to_string(ps.cached - ps.pinned_cached) + " evictable pages" +
            (elastic() ? " and can grow by at most " + std::to_string(growable) : std::string()) +
            "; the rest are in use or pinned",
        st.value());
  }
  return std::nullopt;
}

void PoolRuntime::fill_stats(stats::PoolStats& p) const {
  stats::set_name(p.name, config_.name, /*terminated=*/false);
  p.name_len = static_cast<uint32_t>(std::min<size_t>(config_.name.size(), stats::kNameBytes));
  stats::set_name(p.backend, info_.backend);
  const Geometry& g = info_.geometry;
  p.dtype = static_cast<uint32_t>(g.dtype);
  p.layout = static_cast<uint32_t>(info_.layout);
  p.kind = static_cast<uint32_t>(info_.geometry.kind);
  p.window = info_.geometry.window;
  p.layers = g.layers;
  p.kv_heads = g.kv_heads;
  p.head_dim = g.head_dim;
  p.tokens_per_page = g.tokens_per_page;
  pages_->expire_pins();
  const core::PoolStats ps = pages_->stats();
  stats::set_name(p.policy, pages_->policy().name());
  p.pinned = ps.pinned;
  p.pinned_cached = ps.pinned_cached;
  p.max_pages = info_.max_pages;
  p.epoch = info_.epoch;
  if (elastic()) {
    const ElasticState& e = elastic_;
    p.min_pages = e.min_pages;
    p.grows = e.grows;
    p.shrinks = e.shrinks;
    const uint64_t n = std::min<uint64_t>(e.resize_count, ElasticState::kHistory);
    p.history_len = static_cast<uint32_t>(n);
    for (uint64_t k = 0; k < n; ++k) {
      const auto& [ms, pages] = e.history[(e.resize_count - n + k) % ElasticState::kHistory];
      p.history[k] = stats::PoolStats::Resize{ms, pages, 0};
    }
  }
  if (host_tier_) {
    const core::HostTier& t = host_tier_->tier();
    const HostTierCopyStats& c = host_tier_->copy_stats();
    p.host_slots = t.capacity();
    p.host_held = t.held();
    p.host_bytes = host_tier_->bytes();
    p.host_demoted = t.counters().demoted;
    p.host_promoted = t.counters().promoted;
    p.host_dropped = t.counters().dropped;
    p.host_demote_ns = c.demote_ns;
    p.host_promote_ns = c.promote_ns;
    p.host_copy_failures = c.copy_failures;
  }
  if (converter_) {
    const ConvertStats& c = converter_->stats();
    p.convert_into = converter_->target().index() + 1u;
    p.converted = c.converted;
    p.convert_duplicates = c.duplicates;
    p.convert_skipped = c.skipped;
    p.convert_failures = c.failures;
    p.convert_ns = c.ns;
    p.converted_back = c.back;
  }
  if (remote_) {
    const RemoteTierStats& r = remote_->stats();
    const remote::ClusterView v = remote_->view();
    p.remote_tier = static_cast<uint32_t>(remote_->config().write);
    p.remote_nodes = v.nodes;
    p.remote_reachable = v.reachable;
    p.remote_slots = v.slots_covered;
    p.remote_lookups = r.lookups;
    p.remote_hits = r.hit_blocks;
    p.remote_misses = r.miss_lookups;
    p.remote_skipped = r.skipped_down;
    p.remote_rejected = r.rejected;
    p.remote_stored = r.stored;
    p.remote_store_skipped = r.store_skipped;
    p.remote_store_failed = r.store_failed;
    p.remote_fetch_failed = r.fetch_failed;
    p.remote_fetch_ns = r.fetch_ns;
    p.remote_store_ns = r.store_ns;
    p.remote_fetch_batches = r.fetch_batches;
    p.remote_store_batches = r.store_batches;
  }
  p.total = ps.total;
  p.free = ps.free;
  p.in_use = ps.in_use;
  p.cached = ps.cached;
  p.indexed = pages_->indexed();
  p.device = info_.device;
  p.segments = static_cast<uint32_t>(info_.segments.size());
  p.page_stride = info_.page_stride;
  p.segment_bytes = info_.segment_bytes;
  // The core's counters, the rows of the counter table whose source is the core.
#define KVPOOL_COPY_FROM_core(field) p.field = ps.counters.field;
#define KVPOOL_COPY_FROM_pool(field)
#define KVPOOL_COPY_COUNTER(field, kind, source, ...) KVPOOL_COPY_FROM_##source(field)
  KVPOOL_POOL_COUNTERS(KVPOOL_COPY_COUNTER)
#undef KVPOOL_COPY_COUNTER
#undef KVPOOL_COPY_FROM_pool
#undef KVPOOL_COPY_FROM_core
}

void PoolRuntime::end_job() {
  KVPOOL_CHECK(copies_in_flight_ > 0);
  --copies_in_flight_;
}

}  // namespace kvpool::daemon
