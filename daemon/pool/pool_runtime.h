// PoolRuntime: one pool of kvpoold. It owns the pool's memory (PoolMemory), its pages
// (core::PagePool), its host tier, its elastic layout, and what the daemon observes of it
// (prefix stats, index events, the KV events for routers).
//
// The Service asks it for the operations that involve more than the page core (the rest, retain,
// release, publish and the page states, it asks of pages() directly):
//   - alloc() grows an elastic pool (through its PoolSet, which holds the memory budget) before
//     it evicts, and refuses before anything changes;
//   - a lookup that misses on the device plans the promotion of the run that follows from the
//     host tier (plan_promotion()), finished by finish_promotion();
//   - after any call, plan_demotions() gathers the pages the call evicted, so that their bytes
//     go down (to the host tier, or converted into the pool's 8-bit pool: EvictionConverter)
//     before a reply lets a worker overwrite them; evict() does so for an operator.
// A TierCopy planned here runs where the caller decides (run_tier(), on the loop or off it) and
// is finished here (finish_demotions(), finish_promotion()).
//
// Elastic pools (pool_runtime_elastic.cpp): the layout, and so the segment size, is derived once
// at create(); the pool grows by one segment at the end of its pages region and shrinks by its
// last one, all or nothing (shrink_last()); every resize goes through resized(), which bumps the
// epoch sessions compare against.
//
// Invariants: info().num_pages == pages().num_pages(); info().segments is the memory's list as
// of the last resize; copies_in_flight() counts the jobs of this pool handed out and not yet
// finished, and while it is not 0 the pool gives back no segment and runs no tier copy inline.
//
// Thread-safety: the event loop owns it. Of a job handed out, run_tier() and memory().copy_pages
// may run on one other thread (the CopyWorker), one job of the pool at a time.
// Error policy: create() returns an error naming the pool and the cause; operations return the
// core's Status, which the Service turns into replies; capacity_error() words the refusals that
// are the pool's own.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "common/stats_layout.h"
#include "common/wire/protocol.h"
#include "daemon/config/config.h"
#include "daemon/core/page_pool.h"
#include "daemon/memory/host_tier_store.h"
#include "daemon/memory/memory_backend.h"
#include "daemon/pool/eviction_converter.h"
#include "daemon/remote/remote_tier.h"
#include "daemon/telemetry/events.h"
#include "daemon/telemetry/index_events.h"
#include "daemon/telemetry/kv_event_encoder.h"
#include "daemon/telemetry/prefix_stats.h"

namespace kvpool::daemon {

class PoolSet;

// What a full-attention group of a hybrid model may have lost, in order, for PoolSet to drop
// from its other groups (the same blocks there serve no hit without this one): its device
// tier's evictions and drops, and the blocks that left its host tier other than by promotion.
// A device eviction that the host tier took in is still the group's: PoolSet keeps only the
// keys the group holds in neither tier once the call is done. Forwards every call.
class GroupEvictions final : public core::IndexObserver {
 public:
  explicit GroupEvictions(core::IndexObserver* next) : next_(next) {}
  void stored(Namespace ns, const BlockHash& hash, PageId page) override {
    next_->stored(ns, hash, page);
  }
  void removed(Namespace ns, const BlockHash& hash, PageId page, Removal why) override {
    if (why != Removal::flushed) keys_.emplace_back(ns, hash);
    next_->removed(ns, hash, page, why);
  }
  void host_stored(Namespace ns, const BlockHash& hash) override { next_->host_stored(ns, hash); }
  void host_removed(Namespace ns, const BlockHash& hash, bool promoting) override {
    if (!promoting) keys_.emplace_back(ns, hash);
    next_->host_removed(ns, hash, promoting);
  }
  std::vector<std::pair<Namespace, BlockHash>> take() { return std::exchange(keys_, {}); }

 private:
  core::IndexObserver* next_;
  std::vector<std::pair<Namespace, BlockHash>> keys_;
};

// What an elastic pool keeps besides its memory (min_pages is 0 for a fixed pool).
struct ElasticState {
  uint32_t min_pages = 0;
  uint64_t segment_bytes = 0;   // a full segment, derived once from the config
  uint64_t hits_at_resize = 0;  // counters.hit_blocks at the last resize: the donor choice
  uint64_t grows = 0;
  uint64_t shrinks = 0;
  uint64_t growing_ahead = 0;       // bytes of the segment being made ahead of need (0: none)
  uint64_t resizing_bytes = 0;      // bytes an admin resize is making (0: none)
  uint32_t grow_ahead_retry_s = 0;  // no growth ahead before this second after a failure
  // The last resizes, oldest first once full: (Unix ms, pages after), for kvpoolctl status.
  static constexpr size_t kHistory = 8;
  std::array<std::pair<uint64_t, uint32_t>, kHistory> history{};
  uint64_t resize_count = 0;
};

class PoolRuntime {
 public:
  // What the daemon keeps per page besides the pool memory, an upper bound: the core's page word
  // and key (24 bytes), free stack (4), batch mark (8), prefix index (at most 4 slots of 8) and
  // LRU links (8), and the prefix hit counters (16).
  static constexpr uint64_t kBookkeepingBytesPerPage = 96;

  // Makes the pool of `pc` on `backend`, numbered `index` among the daemon's pools, under `set`
  // (its budget and clock), its index events logged to `events`. No host tier yet:
  // attach_host_tier() adds it once every pool's memory is counted against the budget.
  static wire::Result<std::unique_ptr<PoolRuntime>> create(
      const PoolConfig& pc, MemoryBackend& backend, uint64_t max_segment_bytes, uint16_t index,
      PoolSet& set, EventLog& events, const EventsConfig& events_config);
  wire::Result<bool> attach_host_tier();
  // Precision before eviction: once every pool exists, the pool named by convert_evictions_to
  // gets this pool's evictions (EvictionConverter). Refused when the two cannot convert.
  wire::Result<bool> attach_converter();
  // The remote tier on Redis Cluster (pools[].remote_tier), once the other tiers exist.
  wire::Result<bool> attach_remote_tier();

  const PoolConfig& config() const { return config_; }
  const std::string& name() const { return config_.name; }
  const wire::PoolInfo& info() const { return info_; }
  uint16_t index() const { return index_; }
  core::PagePool& pages() { return *pages_; }
  const core::PagePool& pages() const { return *pages_; }
  PoolMemory& memory() { return *memory_; }
  const PoolMemory& memory() const { return *memory_; }
  PrefixStats& prefix_stats() { return *prefix_stats_; }
  const PrefixStats& prefix_stats() const { return *prefix_stats_; }
  bool has_host_tier() const { return host_tier_ != nullptr; }
  // Whether the Service plans tier copies after calls: evicted pages go somewhere (host tier or
  // conversion), or a lookup may promote from the remote tier.
  bool has_lower_tier() const {
    return host_tier_ != nullptr || converter_ != nullptr || remote_ != nullptr;
  }
  RemoteTier* remote() { return remote_.get(); }
  const RemoteTier* remote() const { return remote_.get(); }
  const EvictionConverter* converter() const { return converter_.get(); }
  // Whether the pool holds (ns, hash) in its device index or its host tier.
  bool holds_block(Namespace ns, const BlockHash& hash) const;
  // Whether the host tier holds (ns, hash) and a promotion could read it now (no job of the
  // pool in flight: a queued demotion may still be writing the slot).
  bool host_can_promote(Namespace ns, const BlockHash& hash) const;
  // Drops (ns, hash) from both tiers where nothing holds it (a hybrid model's other group lost
  // it: PoolSet::drop_group_evictions).
  void drop_block(Namespace ns, const BlockHash& hash);
  // The pool's KV events since the Server last took them (null: events.zmq_endpoint is off).
  KvEventBatcher* kv_events() { return kv_events_.get(); }
  PoolIndexEvents& index_events() { return *index_events_; }
  // The turn's KV events for the publisher (none when they are off); ends the turn for them.
  std::vector<KvEvent> take_kv_events() {
    index_events_->end_turn();
    return kv_events_ ? kv_events_->take() : std::vector<KvEvent>{};
  }
  const KvEventFormat& kv_format() const { return kv_format_; }
  // The pool's memory as the kernels and the daemon's copies see it.
  kernels::PagedKv paged_kv() const;

  // A reload: the running config's keys that apply live (policy, share_between_tenants,
  // grow_ahead); a new policy takes the cached pages over.
  void apply_config(const PoolConfig& next);

  // Calls. alloc: the pages, growing an elastic pool first when its free pages fall short.
  // Refused before anything changes (*admitted false), *growable then being what the pool could
  // have grown by; or, rarely, refused after a growth fell short of what admission counted on.
  Status alloc(core::OwnerId owner, std::span<PageId> out, const core::CallHints& hints,
               uint64_t* growable, bool* admitted);
  // After a lookup's device hits: when the host tier (or the 8-bit pool this pool converts its
  // evictions into) holds the run at the start of `missing` (the chain past the hits), that
  // run's promotion is planned into `tier` (its pages allocated, at most `max_new_pages` the
  // caller does not hold yet) and true returned; the caller runs the copies and then calls
  // finish_promotion with `missing` and the reply's pages past the hits. promotion_tier() is
  // what the reply calls such hits.
  bool plan_promotion(core::OwnerId owner, Namespace ns, std::span<const BlockHash> missing,
                      uint32_t max_new_pages, const core::CallHints& hints, TierCopy& tier);
  uint8_t promotion_tier() const { return converter_ ? wire::kTierConverted : wire::kTierHost; }
  // The promoted pages, published now (0 when the copy failed).
  uint32_t finish_promotion(TierCopy& tier, core::OwnerId owner, Namespace ns,
                            std::span<const BlockHash> chain, std::span<PageId> out);
  // The pages this pool evicted since the last call, to copy down before the reply (nothing
  // without a host tier).
  void plan_demotions(TierCopy& tier);
  // The run at the start of `chain` that this pool's host tier holds, promoted now, on the loop,
  // into pages `owner` holds (written to out; at most kMaxPromoteNowBytes): how many. 0 without a
  // host tier or with a job of this pool in flight. The 8-bit pool of a conversion, for a lookup
  // of its 16-bit pool that goes on in this pool's host tier.
  static constexpr uint64_t kMaxPromoteNowBytes = uint64_t{64} << 20;
  uint32_t promote_now(core::OwnerId owner, Namespace ns, std::span<const BlockHash> chain,
                       std::span<PageId> out);
  // This pool's evictions go down to its host tier (and, write: on_demote, its remote tier's
  // staging memory) now, on the loop (a converter into this pool evicted them; it writes the
  // pages next). Precondition: no job of this pool in flight.
  void demote_now();
  // The call's evictions are lost instead of going down: it handed their pages back FREE (a
  // rolled-back reservation), so nothing may read them after the reply.
  void drop_pending_demotions();
  // The copies of a plan (any thread, one job of the pool at a time) and their end (the loop).
  void run_tier(TierCopy& tier);
  void finish_demotions(TierCopy& tier);
  // An operator's evict of `count` cached pages; with a host tier they go down first (into
  // `tier`, held until their copy is done). The pages evicted.
  uint32_t evict(uint32_t count, TierCopy& tier);
  // No block is indexed in the pool or its host tier (a flush's end: one AllBlocksCleared).
  bool tiers_empty() const {
    return pages_->indexed() == 0 && (host_tier_ == nullptr || host_tier_->tier().held() == 0);
  }
  // Empties the cache, the host tier's blocks included: (device pages, host blocks) flushed.
  std::pair<uint32_t, uint32_t> flush();
  // The error for a refusal that is the pool's own (its capacity, or no page to be had), or
  // nothing for the others (pins: the caller words those).
  std::optional<wire::Error> capacity_error(const Status& st, uint64_t growable) const;
  // This pool's part of the stats snapshot (sessions are the caller's).
  void fill_stats(stats::PoolStats& out) const;

  // The blocks this pool evicted since the last call that its hybrid model's other groups must
  // drop (empty but for a full-attention group of a hybrid model).
  std::vector<std::pair<Namespace, BlockHash>> take_group_evictions() {
    return group_evictions_ ? group_evictions_->take()
                            : std::vector<std::pair<Namespace, BlockHash>>{};
  }

  // Jobs of this pool handed out and not finished (see above).
  uint32_t copies_in_flight() const { return copies_in_flight_; }
  void begin_job() { ++copies_in_flight_; }
  void end_job();

  // Elastic pools (pool_runtime_elastic.cpp).
  bool elastic() const { return elastic_.min_pages != 0; }
  ElasticState& elastic_state() { return elastic_; }
  const ElasticState& elastic_state() const { return elastic_; }
  // The page count without the last pages segment; the bytes of the next segment (the region's
  // last one may be short); hits per mapped byte since the last resize.
  uint32_t pages_after_shrink() const;
  uint64_t next_segment_bytes() const;
  double hits_per_byte() const;
  // Bytes of pages segments that shrinks could give back above min_pages.
  uint64_t bytes_above_min() const;
  // The pages that `bytes` of pages region, mapped from offset 0, hold: whole pages of
  // page_stride, or in a segmented layer_major pool whole segments of segment_pages pages.
  uint64_t pages_in(uint64_t bytes) const;
  // Gives back the last segment: the error names the cause (a copy running, min_capacity, pages
  // held past the new end); on success its memory is in *loose, to release off the loop.
  wire::Result<bool> shrink_last(LooseSegment* loose);
  // After the memory mapped one segment more: the pages grow over it.
  void grown();

 private:
  PoolRuntime(const PoolConfig& pc, uint16_t index, PoolSet& set);
  // Makes an elastic pool's memory and its layout; the pool's starting page count.
  wire::Result<uint32_t> create_elastic(MemoryBackend& backend, uint32_t initial_pages);
  void init_telemetry(EventLog& events, const EventsConfig& ev, std::string_view backend_name);
  // After a resize: page count, info, epoch, history, log and event.
  void resized(bool grew);

  PoolConfig config_;
  uint16_t index_;
  PoolSet& set_;
  wire::PoolInfo info_;
  std::unique_ptr<PoolMemory> memory_;
  std::unique_ptr<core::PagePool> pages_;
  EventLog* events_ = nullptr;
  std::unique_ptr<PrefixStats> prefix_stats_;
  std::unique_ptr<KvEventBatcher> kv_events_;
  KvEventFormat kv_format_;
  std::unique_ptr<PoolIndexEvents> index_events_;
  std::unique_ptr<GroupEvictions> group_evictions_;  // full groups of hybrid models only
  std::unique_ptr<PoolHostTier> host_tier_;
  std::unique_ptr<EvictionConverter> converter_;  // after pages_: gone before them
  std::unique_ptr<RemoteTier> remote_;            // likewise
  uint32_t copies_in_flight_ = 0;
  ElasticState elastic_;
};

}  // namespace kvpool::daemon
