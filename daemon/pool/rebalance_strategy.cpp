#include "daemon/pool/rebalance_strategy.h"

#include <algorithm>

#include "daemon/pool/pool_runtime.h"

namespace kvpool::daemon {

RebalanceStrategy::Taker RebalanceStrategy::on_demand(const PoolRuntime& taker,
                                                      uint64_t free_wanted) const {
  const core::PoolStats st = taker.pages().stats();
  const bool pressure = uint64_t{st.free} + st.cached - st.pinned_cached < free_wanted;
  return Taker{pressure ? -1.0 : taker.hits_per_byte()};
}

std::vector<PoolRuntime*> RebalanceStrategy::donors(
    const std::vector<std::unique_ptr<PoolRuntime>>& pools, const PoolRuntime& taker,
    const Taker& how) const {
  std::vector<PoolRuntime*> out;
  const uint32_t taker_cached = taker.pages().stats().cached;
  for (const auto& p : pools) {
    // Another group of the taker's hybrid model that caches more blocks gives too: a hybrid
    // hit needs its block in every group, so the model's cache is as good as its group that
    // caches the fewest.
    const bool richer_sibling = !taker.config().model.empty() &&
                                p->config().model == taker.config().model &&
                                p->pages().stats().cached > taker_cached;
    if (p.get() != &taker && p->elastic() &&
        p->pages().num_pages() > p->elastic_state().min_pages && p->copies_in_flight() == 0 &&
        (how.below < 0 || p->hits_per_byte() < how.below || richer_sibling)) {
      out.push_back(p.get());
    }
  }
  std::sort(out.begin(), out.end(), [](const PoolRuntime* a, const PoolRuntime* b) {
    return a->hits_per_byte() < b->hits_per_byte();
  });
  return out;
}

}  // namespace kvpool::daemon
