// PoolSet: the daemon's pools and the memory budget their elastic pools share.
//
// Mechanism (here and PoolRuntime's elastic half): an elastic pool grows by one segment at the
// end of its pages region and shrinks by its last one. Segments are made off the event loop
// where a caller can wait for them (growth ahead of need, an admin's resize: plan on the loop,
// make on the CopyWorker, commit on the loop) and on it where the caller cannot (an alloc short
// of free pages). Memory a shrink let go of is released off the loop too (take_background()).
//
// Policy (RebalanceStrategy, rebalance_strategy.h) only chooses: when a growth would pass the
// budget, which other pools give segments back, in which order, and whether this growth may take
// from them at all. The budget itself is never passed: a segment that would pass it is not
// mapped, and segments in the making hold their room (ahead_bytes()).
//
// Hybrid models (pools[].groups): every group is an elastic pool, and the model's capacity is a
// second budget over its groups alone (model_bytes ≤ model_budget), so a group takes what its
// sequences need and gives segments back to its other groups first; no split between groups.
//
// Invariants: elastic_bytes() ≤ budget() and each model's bytes ≤ its budget after every call; at
// most one growth ahead of a pool in flight (ElasticState::growing_ahead; an admin resize's bytes
// are in resizing_bytes); a pool running a job gives nothing back.
//
// Thread-safety: the event loop owns it; MemoryWork::run and ResizePlan::make run on one other
// thread. Error policy: create() and plan_resize_up() return errors naming the pool and cause.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "daemon/pool/pool_runtime.h"
#include "daemon/pool/rebalance_strategy.h"

namespace kvpool::daemon {

// Memory work of the daemon's own, off the loop: run() on any thread, then done() on the loop.
struct MemoryWork {
  PoolRuntime* pool = nullptr;  // null: no pool's (memory going back)
  std::function<void()> run;
  std::function<void()> done;
};

// An admin resize upwards: segments planned on the loop, made by make() off it, mapped by
// PoolSet::commit_resize() on it.
struct ResizePlan {
  PoolRuntime* pool = nullptr;
  std::vector<Growth> growths;
  std::vector<LooseSegment> donors;  // reclaimed memory, released before the new is made
  void make();
};

class PoolSet {
 public:
  // Every pool of `config` on `backend`. Errors name the pool and the cause (its bookkeeping
  // not fitting in memory included).
  static wire::Result<std::unique_ptr<PoolSet>> create(const Config& config, MemoryBackend& backend,
                                                       EventLog& events);

  // The error for a std::bad_alloc while the pools are set up: names `current`, or every pool.
  static wire::Error bookkeeping_error(const Config& config, const PoolConfig* current);

  const std::vector<std::unique_ptr<PoolRuntime>>& pools() const { return pools_; }
  PoolRuntime* find(const std::string& name) const;
  // The pools of `pool`'s hybrid model in group order (pool itself for a plain pool).
  std::vector<PoolRuntime*> group_pools(const PoolRuntime& pool) const;
  // Whether a and b are groups of one hybrid model.
  static bool siblings(const PoolRuntime& a, const PoolRuntime& b);
  // A hybrid model's budget (its capacity: every group's mapped bytes together), UINT64_MAX for
  // a plain pool; the bytes its groups map now.
  uint64_t model_budget(const PoolRuntime& pool) const;
  uint64_t model_bytes(const std::string& model) const;
  // A reload: each pool's live keys (PoolRuntime::apply_config); `next` has the running pools.
  void apply_config(const std::vector<PoolConfig>& next);

  // Seconds since start + 1, as PrefixStats counts time: tick() takes it anew (once per call),
  // now_s() is the value of the current call.
  uint32_t tick();
  uint32_t now_s() const { return now_s_; }
  // When the pools were set up (LatencyRecorder::now_ns): the daemon's start.
  uint64_t start_mono_ns() const { return start_mono_ns_; }
  const uint32_t& now_ref() const { return now_s_; }

  // True once after a resize (the Server then tells the pools' other sessions), and,
  // separately, once for the stats publisher.
  bool take_pool_change() { return std::exchange(pool_changed_, false); }
  bool take_stats_change() { return std::exchange(stats_changed_, false); }

  // The budget: bytes the elastic pools map now, and what memory_budget allows (UINT64_MAX:
  // none).
  uint64_t elastic_bytes() const;
  uint64_t budget() const { return budget_; }
  // At most how many pages `pool` could grow by now: whole segments up to its max, as far as the
  // budget's room and every other pool's whole segments above its min would fund (an upper bound:
  // a donor whose tail pages are held gives less). 0 for a fixed pool.
  uint64_t growable_pages(const PoolRuntime& pool) const;
  // Grows `pool` by segments, on the loop, until it has `free_wanted` free pages, its max, or no
  // memory the budget and the strategy allow. Whether it grew.
  bool grow_for(PoolRuntime& pool, uint64_t free_wanted);
  // Gives back `pool`'s last segment (its memory released off the loop).
  wire::Result<bool> shrink_one(PoolRuntime& pool);
  // Plans an admin resize of `pool` up to `target` pages: segments planned and other pools
  // shrunk for them now (any donor above its min); the plan's bytes hold their room until
  // commit_resize(), which maps what was made and returns "" or why the first one was not.
  wire::Result<std::shared_ptr<ResizePlan>> plan_resize_up(PoolRuntime& pool, uint32_t target);
  std::string commit_resize(ResizePlan& plan);
  // After a call on an elastic pool: starts its next segment off the loop when its free pages
  // run low and the budget has room (nobody is shrunk for it).
  void grow_ahead(PoolRuntime& pool);
  // Drops from each hybrid model's groups the blocks one of its full-attention groups evicted
  // (and so on, until no group evicts more): a hit needs every full group's block, so the others'
  // copies would only take room. Call after every call and job.
  void drop_group_evictions();
  // The daemon's own memory work, one at a time until empty.
  std::optional<MemoryWork> take_background();
  // Memory to go back off the loop (a shrunk or unused segment).
  void release_later(LooseSegment segment);

 private:
  explicit PoolSet(EventLog& events);
  // How far `bytes` more for `pool` would pass the daemon's budget and its model's, counting
  // the segments other pools have in the making.
  struct Shortfall {
    uint64_t daemon = 0;
    uint64_t model = 0;
    bool any() const { return daemon != 0 || model != 0; }
  };
  Shortfall shortfall(const PoolRuntime& pool, uint64_t bytes) const;
  // The budgets that bound `pool`, for errors.
  std::string budget_name(const PoolRuntime& pool) const;
  // `pc` as its pool is made: a hybrid model's group elastic up to the model's budget (which it
  // records).
  PoolConfig group_config(const PoolConfig& pc, const MemoryBackend& backend);
  // Bytes of segments being made, in all pools.
  uint64_t ahead_bytes() const;
  // Frees at least `bytes` of the budget by shrinking the donors the strategy names for
  // `taker`; shrinks nothing when they cannot give enough.
  bool reclaim(const PoolRuntime& taker, uint64_t bytes, const RebalanceStrategy::Taker& how);
  // One segment more, mapped here on the loop; the error names the cause.
  wire::Result<bool> grow_one(PoolRuntime& pool);
  // Maps a segment made off the loop; "" or why not (its memory then goes back off the loop).
  std::string commit_growth(PoolRuntime& pool, Growth& g);

  std::vector<std::unique_ptr<PoolRuntime>> pools_;
  std::map<std::string, uint64_t> model_budgets_;  // hybrid model → its capacity in bytes
  EventLog& events_;
  RebalanceStrategy strategy_;
  uint64_t budget_ = UINT64_MAX;
  uint64_t start_mono_ns_ = 0;
  uint32_t now_s_ = 1;
  bool pool_changed_ = false;
  bool stats_changed_ = false;
  std::vector<MemoryWork> background_;
  std::vector<LooseSegment> released_;

  friend class PoolRuntime;  // resized() and shrinks report here
  void note_resized() { pool_changed_ = stats_changed_ = true; }
  EventLog& events() { return events_; }
};

}  // namespace kvpool::daemon
