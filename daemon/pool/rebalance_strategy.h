// RebalanceStrategy: which elastic pools give memory back when another must grow past a full
// budget. It only chooses; PoolSet moves the segments (CacheLib splits its PoolResizer and
// RebalanceStrategy the same way).
//
// The choice: donors are the other elastic pools above their min and running no job, lowest
// hits per mapped byte since their last resize first. A growth on demand takes only from pools
// that earn less per byte than the taker, unless the taker is under pressure (its free and
// unpinned cached pages cannot serve what it asks): so under a full budget a pool evicts its
// own cache before taking memory from a pool whose cache earns more, and an idle pool's memory
// goes to a busy one. An operator's resize may take from any donor.
//
// Thread-safety: event loop only (it reads the pools' counters). No errors: an empty list is
// the answer when no pool may give.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

namespace kvpool::daemon {

class PoolRuntime;

class RebalanceStrategy {
 public:
  // How a taker may take: from donors earning less than `below` hits per byte (< 0: any).
  struct Taker {
    double below = -1.0;
  };

  // A growth on demand of `taker`, which wants `free_wanted` free pages.
  Taker on_demand(const PoolRuntime& taker, uint64_t free_wanted) const;
  // An operator's resize.
  Taker operator_resize() const { return Taker{}; }
  // The pools that may give to `taker`, in the order to shrink them.
  std::vector<PoolRuntime*> donors(const std::vector<std::unique_ptr<PoolRuntime>>& pools,
                                   const PoolRuntime& taker, const Taker& how) const;
};

}  // namespace kvpool::daemon
